"""``helm install -f examples/fleet.yaml`` run for real: every series comes from one place.

The chart's fleet topology (docs/fleet.md): node agents, the gateway Collector, three jobs-tier
instances. Each GPU's series must be served and sent by exactly one of them, and each job's by
exactly one, or ``sum by (ofu_job_id) (gpu_ofu)`` and the dashboards count them twice.

What runs for real, as tests/test_chart_install.py runs the default install:
- the chart rendered by Helm with examples/fleet.yaml (only the clock scaled) and created in a real
  kube-apiserver with strict field validation; the agents' Kubernetes API source reads their node's
  pods with a token the API server issued for the chart's ServiceAccount;
- two node agents (``otel-ofu run`` with the agent ConfigMap and the DaemonSet's environment on
  gpu-node-1 and gpu-node-2), each scraping its node's dcgm-exporter page over HTTP;
- the gateway: the otelcol-ofu Collector with the gateway ConfigMap, its token from the env;
- the jobs tier: the StatefulSet's three instances with the jobs ConfigMap, each with its own
  volume (a directory) and the token file;
- the OTLP backend the example names: a real gRPC OTLP server.

What stands in: the network (every listen address and Service is 127.0.0.1 at a free port), and
the gateway's resolver: the Kubernetes resolver watches EndpointSlices that no controller fills
here, so the gateway gets the three instances as the static list the resolver would find
(tests/test_fleet_configs.py keeps everything else of the gateway equal to the shipped one).
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_ofu.core.model import JOB_ID
from otel_ofu.otlp import codec as otlp
from otel_ofu.training.report import AGENT_GRPC_PORT, AGENT_HTTP_PORT
from tests.deploy_util import CHART, KUBE_VERSION, helm_binary, pod_spec
from tests.e2e_util import PageServer, Process, collector_binary, free_ports, port_open, require_alive, wait_for
from tests.kube_apiserver import KubeApiServer
from tests.otlp_backends import GrpcBackend
from tests.test_chart_install import (
    GPU_OPERATOR,
    NAMESPACE,
    RELEASE,
    SCALED_TIME,
    container_env,
    install,
    one,
    scrape,
    service_account_mount,
    service_to,
)
from tests.test_mfu_audit_e2e import dcgm_page, pod_labels

FLEET = CHART / "examples" / "fleet.yaml"
BACKEND = "otel-collector.observability.svc:4317"  # examples/fleet.yaml's otlp.endpoint
TOKEN = "fleet-jobs-token-0123456789"
NODES = {
    "gpu-node-1": [("GPU-44444444-0000-4000-8000-000000000000", pod_labels("llama-worker-0")),
                   ("GPU-44444444-0000-4000-8000-000000000001", pod_labels("llama-worker-0")),
                   ("GPU-44444444-0000-4000-8000-000000000002", pod_labels("bert-0-x7k2p")),
                   ("GPU-44444444-0000-4000-8000-000000000003", pod_labels("bert-0-x7k2p"))],
    # llama's second pod, and two GPUs no pod holds (no job: "none").
    "gpu-node-2": [("GPU-55555555-0000-4000-8000-000000000000", pod_labels("llama-worker-1")),
                   ("GPU-55555555-0000-4000-8000-000000000001", pod_labels("llama-worker-1")),
                   ("GPU-55555555-0000-4000-8000-000000000002", {}),
                   ("GPU-55555555-0000-4000-8000-000000000003", {})],
}
LLAMA, BERT = "k8s:llm/PyTorchJob/llama", "k8s:llm/Job/bert"


def render(tmp_path: Path) -> list[dict[str, Any]]:
    import subprocess

    values = tmp_path / "scaled-time.yaml"
    values.write_text(yaml.safe_dump(SCALED_TIME))
    done = subprocess.run([helm_binary(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *KUBE_VERSION,
                           "-f", str(FLEET), "-f", str(values)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def replaced(config: dict[str, Any], path: str, old: Any, new: Any) -> None:
    """Set the key at ``path`` (the Collector's notation: ``receivers::otlp::...``) to ``new`` after
    checking it is ``old`` as rendered."""
    *parents, last = path.split("::")
    node = config
    for key in parents:
        node = node[key]
    assert node[last] == old, f"{path} is {node[last]!r} in the rendered config, not {old!r}"
    node[last] = new


def cluster_pods(server: KubeApiServer) -> None:
    """dcgm-exporter on each node (the GPU Operator's labels); llama's pods on both nodes, bert's on one."""
    bf16 = {"ofu.dev/precision": "bf16"}
    for node in NODES:
        server.create_pod(GPU_OPERATOR, f"nvidia-dcgm-exporter-{node[-1]}", node,
                          labels={"app": "nvidia-dcgm-exporter"})
    for pod, node in (("llama-worker-0", "gpu-node-1"), ("llama-worker-1", "gpu-node-2")):
        server.create_pod("llm", pod, node, labels={"training.kubeflow.org/job-name": "llama"}, annotations=bf16,
                          owners=[{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama",
                                   "uid": "uid-llama", "controller": True}])
    server.create_pod("llm", "bert-0-x7k2p", "gpu-node-1", labels={"batch.kubernetes.io/job-name": "bert"},
                      annotations=bf16, owners=[{"apiVersion": "batch/v1", "kind": "Job", "name": "bert",
                                                 "uid": "uid-bert", "controller": True}])


@pytest.fixture
def cluster(tmp_path):
    server = KubeApiServer(tmp_path / "kube").start()
    yield server
    server.stop()


def test_fleet_install_serves_each_gpu_and_each_job_from_one_place(cluster, tmp_path):
    otelcol = collector_binary()
    for namespace in (NAMESPACE, GPU_OPERATOR, "llm"):
        cluster.namespace(namespace)
    stored = install(cluster, render(tmp_path))
    cluster_pods(cluster)
    agent_set, gateway_set, jobs_set = (one(stored, "DaemonSet", "agent"), one(stored, "Deployment", "gateway"),
                                        one(stored, "StatefulSet", "jobs"))
    instances = jobs_set["spec"]["replicas"]
    assert instances == 3
    exporter_service = service_to(one(stored, "Service", "dcgm-exporter"), {"app": "nvidia-dcgm-exporter"}, 9400)
    gateway_service = service_to(one(stored, "Service", "gateway"),
                                 gateway_set["spec"]["template"]["metadata"]["labels"], 4317)
    agent_config = yaml.safe_load(one(stored, "ConfigMap", "agent")["data"]["config.yaml"])
    jobs_config = yaml.safe_load(one(stored, "ConfigMap", "jobs")["data"]["config.yaml"])
    relay = yaml.safe_load(one(stored, "ConfigMap", "gateway")["data"]["relay.yaml"])
    (token_file := tmp_path / "jobs-token").write_text(TOKEN)
    processes: list[Process] = []
    logs = lambda: "\n".join(p.tail() for p in processes)  # noqa: E731
    backend = GrpcBackend().start()
    pages = {node: PageServer({"/metrics": dcgm_page(node, gpus)}) for node, gpus in NODES.items()}

    def run(name: str, args: list[str], env: dict[str, str]) -> Process:
        processes.append(Process(name, args, tmp_path / f"{name}.log", env=env, inherit=False))
        return processes[-1]

    def config_file(name: str, config: dict[str, Any]) -> Path:
        (tmp_path / name).mkdir(exist_ok=True)
        path = tmp_path / name / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    try:
        # The jobs tier: the StatefulSet's pods, each on its own volume.
        (jobs_container,) = pod_spec(jobs_set)["containers"]
        jobs_ports, jobs_metrics = [], []
        for i in range(instances):
            grpc_port, metrics_port = free_ports(2)
            config = yaml.safe_load(yaml.safe_dump(jobs_config))
            replaced(config, "receivers::otlp::protocols::grpc::endpoint", "0.0.0.0:4317", f"127.0.0.1:{grpc_port}")
            replaced(config, "receivers::otlp::auth::bearer_token_file", "/etc/otel-ofu/jobs-auth/token",
                     str(token_file))
            replaced(config, "exporters::prometheus::endpoint", "0.0.0.0:9464", f"127.0.0.1:{metrics_port}")
            replaced(config, "exporters::otlp::endpoint", BACKEND, f"127.0.0.1:{backend.port}")
            volume = tmp_path / f"jobs-{i}" / "volume"
            replaced(config, "exporters::otlp::sending_queue::storage", "/var/lib/otel-ofu/queue",
                     str(volume / "queue"))
            replaced(config, "processors::jobs::storage", "/var/lib/otel-ofu/jobs", str(volume / "jobs"))
            path = config_file(f"jobs-{i}", config)
            pod_name = f"{jobs_set['metadata']['name']}-{i}"
            run(f"jobs-{i}", [sys.executable, "-m", "otel_ofu", *jobs_container["args"][:-1], str(path)],
                container_env(jobs_container, cluster, pod_name))
            jobs_ports.append(grpc_port)
            jobs_metrics.append(metrics_port)
        # The gateway: its resolver finds the three instances (static here, see the module docstring).
        (gateway_container,) = pod_spec(gateway_set)["containers"]
        gateway_grpc, gateway_http, health, telemetry = free_ports(4)
        relay["receivers"]["otlp"]["protocols"] = {"grpc": {"endpoint": f"127.0.0.1:{gateway_grpc}"},
                                                   "http": {"endpoint": f"127.0.0.1:{gateway_http}"}}
        replaced(relay, "extensions::health_check::endpoint", "0.0.0.0:13133", f"127.0.0.1:{health}")
        reader = relay["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]
        reader.update(host="127.0.0.1", port=telemetry)
        for name, exporter in relay["exporters"].items():
            assert set(exporter["resolver"]) == {"k8s"}, name
            exporter["resolver"] = {"static": {"hostnames": [f"127.0.0.1:{p}" for p in jobs_ports]}}
        env = {item["name"]: item.get("value", "") for item in gateway_container["env"] if "value" in item}
        assert any(item["name"] == "OFU_JOBS_TOKEN" for item in gateway_container["env"])
        run("gateway", [otelcol, f"--config=file:{config_file('gateway', relay)}"], {**env, "OFU_JOBS_TOKEN": TOKEN})
        wait_for("the gateway and the jobs tier to listen",
                 lambda: require_alive(*processes) or all(port_open(p) for p in (gateway_grpc, *jobs_ports)),
                 diagnostics=logs)
        # The node agents: the DaemonSet's pod on each node.
        (agent_container,) = pod_spec(agent_set)["containers"]
        agent_metrics = {}
        for node, page in pages.items():
            grpc_port, http_port, metrics_port = free_ports(3)
            config = yaml.safe_load(yaml.safe_dump(agent_config))
            replaced(config, "receivers::dcgm_exporter::endpoint", f"http://{exporter_service}/metrics",
                     f"{page.url}/metrics")
            replaced(config, "receivers::otlp::protocols::grpc::endpoint", f"${{env:K8S_POD_IP}}:{AGENT_GRPC_PORT}",
                     f"${{env:K8S_POD_IP}}:{grpc_port}")
            replaced(config, "receivers::otlp::protocols::http::endpoint", f"${{env:K8S_POD_IP}}:{AGENT_HTTP_PORT}",
                     f"${{env:K8S_POD_IP}}:{http_port}")
            replaced(config, "receivers::otlp::auth::bearer_token_file", "/etc/otel-ofu/otlp-token/token",
                     str(token_file))  # the reports' token: the chart's Secret, mounted
            replaced(config, "exporters::prometheus::endpoint", "0.0.0.0:9464", f"127.0.0.1:{metrics_port}")
            replaced(config, "exporters::otlp/gateway::endpoint", gateway_service, f"127.0.0.1:{gateway_grpc}")
            if "otlp" in config["exporters"]:  # the GPUs' series straight to the backend
                replaced(config, "exporters::otlp::endpoint", BACKEND, f"127.0.0.1:{backend.port}")
            name = f"agent-{node}"
            path = config_file(name, config)
            mount = service_account_mount(cluster, pod_spec(agent_set)["serviceAccountName"], tmp_path / name / "sa")
            run(name, [sys.executable, "-m", "tests.pod_process", str(mount), *agent_container["args"][:-1],
                       str(path)],
                container_env(agent_container, cluster, f"{agent_set['metadata']['name']}-{node[-1]}", node=node))
            agent_metrics[node] = metrics_port

        targets = {**{f"agent {n}": p for n, p in agent_metrics.items()},
                   **{f"jobs-{i}": p for i, p in enumerate(jobs_metrics)}}
        uuids = {uuid for gpus in NODES.values() for uuid, _ in gpus}

        def served() -> dict[str, dict] | None:
            require_alive(*processes)
            pages_now = {name: scrape(port) for name, port in targets.items()}
            gpus = {s[0]["hw_id"] for m in pages_now.values() for s in m.get("gpu_ofu", [])}
            jobs = {s[0]["ofu_job_id"] for m in pages_now.values() for s in m.get("job_ofu", [])}
            return pages_now if gpus >= uuids and jobs >= {LLAMA, BERT} else None

        wait_for("every GPU's gpu_ofu and both jobs' job_ofu served", served, timeout=180, diagnostics=logs)
        time.sleep(3)  # a few more windows through every tier
        pages_now = served()
        assert pages_now is not None
        gateway_own = scrape(telemetry)
    finally:
        codes = {p.name: p.stop() for p in reversed(processes)}
        for page in pages.values():
            page.close()
        backend.stop()
    assert codes == dict.fromkeys(codes, 0), logs()

    # Prometheus: each GPU's gpu_ofu on exactly one target (its node's agent), each job's job_ofu on one.
    where_gpu, where_job = defaultdict(set), defaultdict(set)
    for target, metrics in pages_now.items():
        for labels, _ in metrics.get("gpu_ofu", []):
            where_gpu[labels["hw_id"]].add(target)
        for labels, _ in metrics.get("job_ofu", []):
            where_job[labels["ofu_job_id"]].add(target)
    assert {uuid: len(t) for uuid, t in where_gpu.items()} == dict.fromkeys(uuids, 1), dict(where_gpu)
    for node, gpus in NODES.items():
        assert all(where_gpu[uuid] == {f"agent {node}"} for uuid, _ in gpus), dict(where_gpu)
    assert {job: len(t) for job, t in where_job.items()} == {LLAMA: 1, BERT: 1}, dict(where_job)
    # OTLP: each GPU window's gpu.ofu reached the backend once, each job bin's job.ofu once.
    points = [p for request in backend.metrics for p in otlp.from_request(request)]
    gpu_windows = defaultdict(int)
    job_bins = defaultdict(int)
    for p in points:
        resource = dict(p.resource)
        if p.name == "gpu.ofu":
            gpu_windows[(resource["hw.id"], p.time_unix_nano)] += 1
        elif p.name == "job.ofu":
            job_bins[(resource[JOB_ID], dict(p.attributes)["ofu.window"], p.time_unix_nano)] += 1
    assert {uuid for uuid, _ in gpu_windows} == uuids
    assert set(gpu_windows.values()) == {1}, sorted(k for k, n in gpu_windows.items() if n > 1)[:5]
    assert {job for job, _, _ in job_bins} == {LLAMA, BERT} and set(job_bins.values()) == {1}
    # The gateway carried to the jobs tier only what it reads: the GPUs' other metrics and the GPUs
    # without a job stopped there (the Collector's own count of what each filter dropped).
    dropped = {labels["filter"]: value for labels, value in
               gateway_own.get("otelcol_processor_filter_datapoints_filtered_total", [])}
    assert dropped.get("filter/jobs_inputs", 0) > 0 and dropped.get("filter/keep_jobs", 0) > 0, dropped
