"""``helm install`` with the chart's default values, as far as it runs here: per-job metrics and the MFU audit.

What runs for real:
- the chart rendered by Helm (defaults; only the clock is scaled, below) and every object created
  in a real kube-apiserver (tests/kube_apiserver.py) with strict field validation, as
  ``helm install`` creates them; the namespace of dcgm-exporter (the GPU Operator's) exists first;
- the node agent: ``otel-ofu run`` with the config of the agent ConfigMap and the environment of
  the DaemonSet's container, both read back from the API server; its Kubernetes API source logs
  in with a token the API server issued for the chart's ServiceAccount, so the chart's RBAC is
  what lets it read its node's pods (tests/pod_process.py puts the token where a pod has it);
- the jobs instance the same way, from the jobs ConfigMap and StatefulSet;
- dcgm-exporter's page over HTTP; two training jobs' ranks reporting MFU with
  ``otel_ofu.training`` (the OpenTelemetry SDK, OTLP/gRPC) to the agent's node-local Service, with
  the environment docs/audit.md's pod spec gives a training container (the token of the Secret the
  chart made, the Service's name); and a rank of one job naming a pod of the other (refused).

What stands in: the scheduler, kubelet and network. Pods are created bound to the node; the
downward API values come from the node's and pod's stand-ins below; every pod's ports are on
127.0.0.1 at a free port each (a Service's DNS name leads to the port of the pod behind it, after
the test checked the Service selects that pod). Each training pod has an address of its own,
127.0.0.N, written into its status as the kubelet would, and its connections leave from it
(tests/pod_network.py).

Time is scaled, nothing else: dcgm-exporter collects every second instead of 30 s, and the jobs
processor's windows are seconds instead of minutes, so the audit's 5 minutes + 5 minutes fit in a
test. Everything else is the chart's default.

The job ``llama`` (PyTorchJob, 2 pods) reports twice its OFU: an ``mfu_gap`` finding. The Job
``bert`` reports its OFU: audited, no finding.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from otel_ofu.training.report import AGENT_GRPC_PORT
from tests.deploy_util import CHART, FIELD_PLACEHOLDERS, KUBE_VERSION, doc_blocks, helm_binary, pod_spec, resolve_env
from tests.e2e_util import ROOT, PageServer, Process, free_ports, require_alive, wait_for
from tests.kube_apiserver import ADMIN_TOKEN, KubeApiServer
from tests.pod_network import PodAddress
from tests.test_mfu_audit_e2e import dcgm_page, page_ofu, pod_labels

# The release docs/deploy.md and docs/audit.md install (their names: ofu-otel-ofu-...).
RELEASE, NAMESPACE, NODE = "ofu", "gpu-monitoring", "gpu-node-1"
GPU_OPERATOR = "gpu-operator"  # where the GPU Operator runs dcgm-exporter (the chart's default)
NODE_IP = "127.0.0.1"
SCALED_TIME = {
    "dcgmExporter": {"collectionInterval": "1s"},
    "jobs": {"config": {"processors": {"jobs": {
        "resolution": "1s", "windows": ["5s"], "job_timeout": "60s",
        "audit": {"window": "5s", "sustain": "3s", "clear_after": "3s"}}}}},
}
PAGE = dcgm_page(NODE, [
    ("GPU-33333333-0000-4000-8000-000000000000", pod_labels("llama-worker-0")),
    ("GPU-33333333-0000-4000-8000-000000000001", pod_labels("llama-worker-0")),
    ("GPU-33333333-0000-4000-8000-000000000002", pod_labels("llama-worker-1")),
    ("GPU-33333333-0000-4000-8000-000000000003", pod_labels("llama-worker-1")),
    ("GPU-33333333-0000-4000-8000-000000000004", pod_labels("bert-0-x7k2p")),
    ("GPU-33333333-0000-4000-8000-000000000005", pod_labels("bert-0-x7k2p")),
])
LLAMA, BERT = "k8s:llm/PyTorchJob/llama", "k8s:llm/Job/bert"
# Each training pod's own address, as its status says and its connections come from.
POD_IPS = {"llama-worker-0": "127.0.0.2", "llama-worker-1": "127.0.0.3", "bert-0-x7k2p": "127.0.0.4"}
AUDIT_DOC = ROOT / "docs" / "audit.md"


# --- helm install: render, create every object ------------------------------------------------


def render(tmp_path: Path) -> list[dict[str, Any]]:
    values = tmp_path / "scaled-time.yaml"
    values.write_text(yaml.safe_dump(SCALED_TIME))
    done = subprocess.run([helm_binary(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *KUBE_VERSION,
                           "-f", str(values)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def api_path(obj: dict[str, Any], name: str | None = None) -> str:
    group_version = obj["apiVersion"]
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    kind = obj["kind"].lower()
    plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"  # networkpolicies
    namespace = obj["metadata"].get("namespace")
    if obj["kind"].startswith("Cluster"):
        assert namespace is None, f"{obj['kind']} is cluster-scoped"
        base = f"{prefix}/{plural}"
    else:
        assert namespace, f"{obj['kind']}/{obj['metadata']['name']} has no namespace: it would land in the caller's"
        base = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{base}/{name}" if name else base


def install(server: KubeApiServer, objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Create every object as `helm install` does; unknown fields are refused (fieldValidation=Strict)."""
    stored = {}
    for obj in objects:
        created = server.api("POST", api_path(obj) + "?fieldValidation=Strict", obj)
        stored[(obj["kind"], obj["metadata"]["name"])] = created
    return stored


def one(stored: dict[tuple[str, str], dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    found = [o for (k, _), o in stored.items()
             if k == kind and o["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    assert len(found) == 1, f"{kind} of {component}: {len(found)}"
    return found[0]


# --- a pod as the kubelet would run it -----------------------------------------------------------


def container_env(container: dict[str, Any], server: KubeApiServer, pod_name: str, node: str = NODE) -> dict[str, str]:
    """The container's env with the downward API resolved for a pod on ``node``, and what the kubelet adds."""
    values = {**FIELD_PLACEHOLDERS, "spec.nodeName": node, "status.hostIP": NODE_IP, "status.podIP": "127.0.0.1",
              "metadata.name": pod_name, "metadata.namespace": NAMESPACE}
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.port)}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = values[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def service_account_mount(server: KubeApiServer, account: str, where: Path) -> Path:
    """What the kubelet mounts: a token the API server issues for the ServiceAccount, and its CA."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    token = server.api("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
                       request)["status"]["token"]
    where.mkdir(parents=True)
    (where / "token").write_text(token)
    (where / "ca.crt").write_bytes(Path(server.certs.ca).read_bytes())
    return where


def on_this_machine(config: str, addresses: dict[str, str]) -> str:
    """The pod network here: each address the config names (a listen address, a Service) -> 127.0.0.1:port."""
    for address, local in addresses.items():
        assert address in config, f"the rendered config no longer names {address}"
        config = config.replace(address, local)
    return config


def service_to(service: dict[str, Any], pod_labels_: dict[str, str], port: int) -> str:
    """A Service's DNS name and port, after checking it selects the pod and serves that port."""
    selector = service["spec"]["selector"]
    assert selector.items() <= pod_labels_.items(), f"Service {service['metadata']['name']} selects {selector}"
    assert port in [p["port"] for p in service["spec"]["ports"]]
    return f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port}"


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def series(metrics: dict[str, list], name: str, **labels: str) -> list[float]:
    return [v for found, v in metrics.get(name, []) if labels.items() <= found.items()]


# --- the test ----------------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path):
    server = KubeApiServer(tmp_path / "kube").start()
    yield server
    server.stop()


def test_default_install_computes_job_ofu_findings_and_the_mfu_audit(cluster, tmp_path):
    objects = render(tmp_path)
    for namespace in (NAMESPACE, GPU_OPERATOR, "llm"):
        cluster.namespace(namespace)
    stored = install(cluster, objects)

    # The cluster's side: dcgm-exporter's pod (the GPU Operator's labels) and the training pods.
    exporter_labels = {"app": "nvidia-dcgm-exporter"}
    cluster.create_pod(GPU_OPERATOR, "nvidia-dcgm-exporter-abcde", NODE, labels=exporter_labels)
    bf16 = {"ofu.dev/precision": "bf16"}
    for pod in ("llama-worker-0", "llama-worker-1"):
        cluster.create_pod("llm", pod, NODE, labels={"training.kubeflow.org/job-name": "llama"}, annotations=bf16,
                           owners=[{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama",
                                    "uid": "uid-llama", "controller": True}])
    cluster.create_pod("llm", "bert-0-x7k2p", NODE, labels={"batch.kubernetes.io/job-name": "bert"},
                       annotations=bf16, owners=[{"apiVersion": "batch/v1", "kind": "Job", "name": "bert",
                                                  "uid": "uid-bert", "controller": True}])
    for pod_name, ip in POD_IPS.items():
        cluster.set_pod_ips("llm", pod_name, [ip])

    agent_set, jobs_set = one(stored, "DaemonSet", "agent"), one(stored, "StatefulSet", "jobs")
    assert jobs_set["spec"]["replicas"] == 1 and not jobs_set["spec"].get("volumeClaimTemplates")
    agent_pod, jobs_pod = pod_spec(agent_set), pod_spec(jobs_set)
    (agent_container,), (jobs_container,) = agent_pod["containers"], jobs_pod["containers"]
    # Training jobs reach the agent on their node through the node-local Service (no host port), with
    # the token of the Secret the chart made, which the agent reads from its mount.
    assert not any("hostPort" in p for p in agent_container["ports"])
    agent_labels = agent_set["spec"]["template"]["metadata"]["labels"]
    agent_otlp = one(stored, "Service", "agent-otlp")
    assert agent_otlp["spec"]["internalTrafficPolicy"] == "Local"
    agent_otlp_service = service_to(agent_otlp, agent_labels, AGENT_GRPC_PORT)
    secret = one(stored, "Secret", "otlp-token")
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert any(v.get("secret", {}).get("secretName") == secret["metadata"]["name"] for v in agent_pod["volumes"])
    (tmp_path / "otlp-token").mkdir()
    (tmp_path / "otlp-token" / "token").write_text(token)

    a_grpc, a_metrics, j_grpc, j_metrics = free_ports(4)
    jobs_labels = jobs_set["spec"]["template"]["metadata"]["labels"]
    jobs_service = service_to(one(stored, "Service", "jobs"), jobs_labels, 4317)
    exporter_service = service_to(one(stored, "Service", "dcgm-exporter"), exporter_labels, 9400)
    agent_config = one(stored, "ConfigMap", "agent")["data"]["config.yaml"]
    jobs_config = one(stored, "ConfigMap", "jobs")["data"]["config.yaml"]

    with PageServer({"/metrics": PAGE}) as exporter:
        agent_config = on_this_machine(agent_config, {
            f"http://{exporter_service}/metrics": f"{exporter.url}/metrics",
            f"${{env:K8S_POD_IP}}:{AGENT_GRPC_PORT}": f"${{env:K8S_POD_IP}}:{a_grpc}",
            "0.0.0.0:9464": f"127.0.0.1:{a_metrics}",
            "/etc/otel-ofu/otlp-token": str(tmp_path / "otlp-token"),
            jobs_service: f"127.0.0.1:{j_grpc}"})
        jobs_config = on_this_machine(jobs_config, {"0.0.0.0:4317": f"127.0.0.1:{j_grpc}",
                                                    "0.0.0.0:9464": f"127.0.0.1:{j_metrics}"})
        processes: list[Process] = []
        addresses: list[PodAddress] = []

        def pod(name: str, container: dict, spec: dict, config: str, pod_name: str) -> Process:
            (tmp_path / name).mkdir()
            path = tmp_path / name / "config.yaml"
            path.write_text(config)
            mount = service_account_mount(cluster, spec["serviceAccountName"], tmp_path / name / "serviceaccount")
            args = [sys.executable, "-m", "tests.pod_process", str(mount), *container["args"][:-1], str(path)]
            started = Process(name, args, tmp_path / f"{name}.log", env=container_env(container, cluster, pod_name),
                              inherit=False)
            processes.append(started)
            return started

        pod("jobs", jobs_container, jobs_pod, jobs_config, f"{jobs_set['metadata']['name']}-0")
        pod("agent", agent_container, agent_pod, agent_config, f"{agent_set['metadata']['name']}-x7k2p")
        ofu = page_ofu(PAGE)
        logs = lambda: "\n".join(p.tail() for p in processes)  # noqa: E731

        def named_gpus() -> bool:
            require_alive(*processes)
            metrics = scrape(a_metrics)
            return bool(series(metrics, "gpu_ofu", ofu_job_id=LLAMA)) and bool(series(metrics, "gpu_ofu",
                                                                                      ofu_job_id=BERT))

        try:
            wait_for("the agent to serve its GPUs' OFU under their jobs", named_gpus, timeout=120, diagnostics=logs)
            # The training container's env as docs/audit.md's pod spec gives it: its pod from the downward
            # API, the token from the chart's Secret, the agent's node-local Service.
            (documented,) = doc_blocks(AUDIT_DOC, "### Identity: who is reporting", "yaml")
            documented_env = yaml.safe_load(documented)["env"]
            secrets = {(secret["metadata"]["name"], "token"): token}
            # The forger, from bert's pod, names a pod of llama and reports next to nothing for it.
            ranks = (("llama-rank0", "llama-worker-0", "llama-worker-0", 2.1 * ofu),
                     ("llama-rank1", "llama-worker-1", "llama-worker-1", 1.9 * ofu),
                     ("bert-rank0", "bert-0-x7k2p", "bert-0-x7k2p", ofu),
                     ("forger", "bert-0-x7k2p", "llama-worker-0", 0.01 * ofu))
            for rank, sender, named, mfu in ranks:
                env = resolve_env(documented_env, {"metadata.name": named, "metadata.namespace": "llm"}, secrets)
                assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://{agent_otlp_service}"
                # The Service, on this machine: the agent's port, reached from the sending pod's own address.
                address = PodAddress(POD_IPS[sender], ("127.0.0.1", a_grpc))
                addresses.append(address)
                processes.append(Process(rank, [sys.executable, "-m", "tests.training_job", "--endpoint",
                                                f"http://127.0.0.1:{address.port}", "--mfu", f"{mfu}"],
                                         tmp_path / f"{rank}.log", env={**env, "OTEL_SERVICE_NAME": "train"},
                                         inherit=False))

            def audited() -> tuple[dict, dict] | None:
                require_alive(*processes)
                metrics, agent_metrics = scrape(j_metrics), scrape(a_metrics)
                finding = series(metrics, "job_finding", ofu_job_id=LLAMA, ofu_finding_kind="mfu_gap")
                honest = series(metrics, "job_mfu_reported", ofu_job_id=BERT, ofu_window="5s")
                forged = series(agent_metrics, "otel_ofu_attribution_reports_refused_total", reason="other_address")
                return (metrics, agent_metrics) if finding == [1.0] and honest and forged else None

            metrics, agent_metrics = wait_for("job_ofu, the MFU audit and the mfu_gap finding on the jobs instance",
                                              audited, timeout=180, diagnostics=logs)
        finally:
            codes = {p.name: p.stop() for p in reversed(processes)}
            for address in addresses:
                address.close()
        assert codes == dict.fromkeys(codes, 0), logs()

    # Per job, across both llama pods: the GPUs' OFU, and each job's own report.
    assert series(metrics, "job_ofu", ofu_job_id=LLAMA, ofu_window="5s") == [pytest.approx(ofu, rel=1e-6)]
    assert series(metrics, "job_ofu", ofu_job_id=BERT, ofu_window="5s") == [pytest.approx(ofu, rel=1e-6)]
    assert series(metrics, "job_gpus", ofu_job_id=LLAMA) == [4.0]
    reported = series(metrics, "job_mfu_reported", ofu_job_id=LLAMA, ofu_window="life")
    assert reported == [pytest.approx(2 * ofu, rel=0.05)]  # the mean of its ranks' 2.1x and 1.9x, not the forger's
    agent_log = (tmp_path / "agent.log").read_text()
    assert ("names pod llm/llama-worker-0 (address 127.0.0.2) but came from 127.0.0.4, the address of pod "
            "llm/bert-0-x7k2p") in agent_log
    assert series(metrics, "job_mfu_reported", ofu_job_id=BERT, ofu_window="life") == [pytest.approx(ofu, rel=1e-3)]
    assert not series(metrics, "job_finding", ofu_job_id=BERT)
    # Each series once: the agent serves the GPUs, the jobs instance the jobs.
    assert not series(metrics, "gpu_ofu") and not series(agent_metrics, "job_ofu")
    assert series(agent_metrics, "gpu_ofu", ofu_job_id=LLAMA) == [pytest.approx(ofu, rel=1e-6)] * 4
    jobs_log = (tmp_path / "jobs.log").read_text()
    assert f"finding (mfu_gap): job {LLAMA}" in jobs_log and "match no job" not in jobs_log


def test_helm_install_makes_the_reports_token_once_and_an_upgrade_keeps_it(cluster, tmp_path):
    """agent.otlpReceiver.auth: the chart's Secret gets a random token at install; `helm upgrade` reads it
    back (lookup) and keeps it, so the training pods' copies stay valid. Helm against the real API server."""
    for namespace in (NAMESPACE, GPU_OPERATOR, "llm"):
        cluster.namespace(namespace)
    kubeconfig = cluster.kubeconfig(ADMIN_TOKEN, "admin")
    chart = [str(CHART), "--namespace", NAMESPACE, "--kubeconfig", str(kubeconfig),
             "--set", "agent.otlpReceiver.auth.jobNamespaces={llm}"]

    def tokens() -> dict[str, str]:
        out = {}
        for namespace in (NAMESPACE, "llm"):
            secret = cluster.api("GET", f"/api/v1/namespaces/{namespace}/secrets/{RELEASE}-otel-ofu-otlp-token")
            out[namespace] = base64.b64decode(secret["data"]["token"]).decode()
        return out

    for command in (["install", RELEASE], ["upgrade", RELEASE]):
        done = subprocess.run([helm_binary(), *command, *chart], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HOME": str(tmp_path)})
        assert done.returncode == 0, done.stderr + done.stdout
        if command[0] == "install":
            installed = tokens()
            assert len(set(installed.values())) == 1 and len(installed[NAMESPACE]) >= 32
    assert tokens() == installed
