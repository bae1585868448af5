"""The Helm chart (deploy/helm/otel-ofu) with the real Helm, its example values and the plain manifests.

Every rendered object is validated strictly (unknown fields rejected) against the Kubernetes
schemas kubernetes-validate ships; every otel-ofu config inside passes ``otel-ofu validate`` with
the env and mounts its container gets, every Collector config ``otelcol validate`` with the real
Collector.
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy_util import (
    CHART,
    EXAMPLES,
    KUBE_VERSION,
    NAMESPACE,
    OLDEST_K8S,
    PLAIN_MANIFEST_SETS,
    RENDERED,
    assert_otel_ofu_config_valid,
    by_kind,
    container_env,
    helm,
    one,
    pod_spec,
    template,
    template_text,
)
from tests.e2e_util import collector_binary

EXAMPLE_IDS = [p.stem for p in EXAMPLES]
# Prometheus Operator kinds: no schema in kubernetes-validate; checked against the Service/pods below.
CRD_KINDS = {"ServiceMonitor", "PodMonitor"}
WORKLOADS = {"DaemonSet", "Deployment", "StatefulSet"}


def k8s_versions() -> list[str]:
    return [OLDEST_K8S, kubernetes_validate.latest_version()]


@pytest.fixture(scope="module", params=[None, *EXAMPLES], ids=["default", *EXAMPLE_IDS])
def example(request: pytest.FixtureRequest) -> tuple[Path, list[dict[str, Any]]]:
    """The chart's default rendering (what `helm install` without values makes) and each example's."""
    if request.param is None:
        return Path("default"), template()
    return request.param, template(request.param)


def test_examples_exist_for_each_source_and_the_fleet() -> None:
    assert {"dcgm-exporter", "dcgm", "nvml", "fleet"} <= set(EXAMPLE_IDS)
    assert GATEWAY_EXAMPLES
    # The chart claims the oldest version the objects are validated against.
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"] == f">= {OLDEST_K8S}-0"


@pytest.mark.parametrize("values", [None, *EXAMPLES], ids=["defaults", *EXAMPLE_IDS])
def test_helm_lint_strict(values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART), *KUBE_VERSION] + (["-f", str(values)] if values else [])
    done = helm(*args, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


def test_every_object_validates_strictly(example: tuple[Path, list[dict[str, Any]]]) -> None:
    _, objects = example
    assert objects
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            continue
        for version in k8s_versions():
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} against {version}: {path}: {exc.message}")


def test_otel_ofu_configs_pass_validate(example: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    _, objects = example
    checked = 0
    for workload in objects:
        if workload["kind"] not in WORKLOADS:
            continue
        spec = pod_spec(workload)
        container = spec["containers"][0]
        if container["name"] != "otel-ofu":
            continue
        config = configmap_of(objects, spec, "config.yaml")
        workdir = tmp_path / workload["metadata"]["name"]
        workdir.mkdir()
        assert_otel_ofu_config_valid(config, spec, container, workdir)
        checked += 1
    assert checked >= 1


GATEWAY_EXAMPLES = [p for p in EXAMPLES if (yaml.safe_load(p.read_text()).get("gateway") or {}).get("enabled")]


@pytest.mark.parametrize("resolver", ["k8s", "dns"])
@pytest.mark.parametrize("values", GATEWAY_EXAMPLES, ids=[p.stem for p in GATEWAY_EXAMPLES])
def test_collector_configs_pass_otelcol_validate(values: Path, resolver: str, tmp_path: Path) -> None:
    objects = template(values, sets=(f"gateway.resolver={resolver}",))
    gateway = one(objects, "Deployment", "gateway")
    spec = pod_spec(gateway)
    (container,) = spec["containers"]
    path = tmp_path / "relay.yaml"
    path.write_text(configmap_of(objects, spec, "relay.yaml"))
    env = {"PATH": "/usr/bin:/bin", **container_env(container)}
    done = subprocess.run([collector_binary(), "validate", f"--config=file:{path}"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def configmap_of(objects: list[dict[str, Any]], spec: dict[str, Any], key: str) -> str:
    names = [v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v]
    maps = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"] in names and key in o["data"]]
    assert len(maps) == 1, f"expected one ConfigMap with {key} among {names}"
    return maps[0]["data"][key]


def test_every_container_is_locked_down(example: tuple[Path, list[dict[str, Any]]]) -> None:
    path, objects = example
    for workload in objects:
        if workload["kind"] not in WORKLOADS:
            continue
        for container in pod_spec(workload)["containers"]:
            sc = container["securityContext"]
            where = f"{path.stem}: {workload['kind']}/{container['name']}"
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc.get("privileged", False) is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert set(sc["capabilities"].get("add", [])) <= {"SYS_ADMIN", "SYS_PTRACE"}, where
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"], where


def test_rbac_is_read_only_and_never_touches_secrets(example: tuple[Path, list[dict[str, Any]]]) -> None:
    _, objects = example
    for role in by_kind(objects, "ClusterRole") + by_kind(objects, "Role"):
        for rule in role["rules"]:
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
            assert "secrets" not in rule["resources"] and "*" not in rule["resources"], rule
            assert "*" not in rule["apiGroups"], rule


def test_monitors_select_a_metrics_port(example: tuple[Path, list[dict[str, Any]]]) -> None:
    _, objects = example
    for monitor in by_kind(objects, "ServiceMonitor"):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        wanted = monitor["spec"]["selector"]["matchLabels"]
        services = [s for s in by_kind(objects, "Service")
                    if wanted.items() <= s["metadata"]["labels"].items()]
        assert len(services) == 1, f"ServiceMonitor {monitor['metadata']['name']} selects {len(services)} Services"
        ports = {p["name"] for p in services[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    for monitor in by_kind(objects, "PodMonitor"):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        wanted = monitor["spec"]["selector"]["matchLabels"]
        pods = [w for w in objects if w["kind"] in WORKLOADS
                and wanted.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(pods) == 1
        ports = {p["name"] for c in pod_spec(pods[0])["containers"] for p in c.get("ports", [])}
        assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= ports


@pytest.mark.parametrize("values", [None, *EXAMPLES], ids=["default", *EXAMPLE_IDS])
def test_plain_manifests_are_in_sync_with_the_chart(values: Path | None) -> None:
    rendered = RENDERED / f"{values.stem if values else 'default'}.yaml"
    assert rendered.is_file(), f"{rendered} missing: run deploy/kubernetes/render.sh"
    text = rendered.read_text()
    header, _, body = text.partition("\n---\n")
    assert body, f"{rendered}: no header"
    expected = template_text(*([values] if values else []), sets=PLAIN_MANIFEST_SETS)
    assert "---\n" + body == expected, f"{rendered} is stale: run deploy/kubernetes/render.sh"
    # No token in a file everybody has: the header says how to make the Secret the manifests name.
    assert "kind: Secret" not in body and "create secret generic otel-ofu-otlp-token" in header


def test_no_extra_plain_manifests() -> None:
    stems = {p.stem for p in RENDERED.glob("*.yaml")}
    assert stems == {"default", *EXAMPLE_IDS}, "deploy/kubernetes/ has the defaults and one file per example"


# --- what each value does ---------------------------------------------------------------------


def agent_of(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = pod_spec(one(objects, "DaemonSet", "agent"))
    return spec, spec["containers"][0]


def agent_config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(one(objects, "ConfigMap", "agent")["data"]["config.yaml"])


def config_of_dra(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return agent_config(objects)["processors"]["attribution"]["dra"]


def test_default_agent_scrapes_dcgm_exporter_as_non_root_without_host_access() -> None:
    objects = template()
    spec, container = agent_of(objects)
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["runAsUser"] != 0
    assert "add" not in container["securityContext"]["capabilities"]
    assert not spec.get("hostPID") and not spec.get("hostNetwork")
    assert not any("hostPath" in v for v in spec["volumes"])
    # The Kubernetes API source (on by default) needs the token and read-only access to pods, and
    # for DRA (on by default) to the node's ResourceSlices and its pods' ResourceClaims (get only).
    assert spec["automountServiceAccountToken"] is True
    [role] = by_kind(objects, "ClusterRole")
    assert [(r["apiGroups"], r["resources"], sorted(r["verbs"])) for r in role["rules"]] == [
        ([""], ["pods"], ["get", "list", "watch"]), (["resource.k8s.io"], ["resourceslices"], ["get", "list", "watch"]),
        (["resource.k8s.io"], ["resourceclaims"], ["get"])]
    assert config_of_dra(objects) == {"drivers": ["gpu.nvidia.com"], "resource_claims": True}
    off = template(sets=("attribution.dra.enabled=false",))
    [role] = by_kind(off, "ClusterRole")
    assert [r["resources"] for r in role["rules"]] == [["pods"]] and config_of_dra(off)["drivers"] == []
    config = agent_config(objects)
    assert config["service"]["pipelines"]["metrics"]["receivers"] == ["dcgm_exporter", "otlp"]
    assert config["processors"]["attribution"]["kubelet"]["enabled"] is False
    # The node-local Service in the GPU Operator's namespace, and the agent scraping it.
    local = one(objects, "Service", "dcgm-exporter")
    assert local["metadata"]["namespace"] == "gpu-operator"
    assert local["spec"]["internalTrafficPolicy"] == "Local"
    assert local["spec"]["selector"] == {"app": "nvidia-dcgm-exporter"}
    assert config["receivers"]["dcgm_exporter"]["endpoint"] == (
        f"http://{local['metadata']['name']}.gpu-operator.svc:9400/metrics")
    # GPU nodes only, including tainted ones.
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_dcgm_source_mounts_the_kubelet_socket_read_only_and_runs_as_root_without_capabilities() -> None:
    objects = template(sets=("source=dcgm", "dcgm.address=nv-hostengine.example:5555"))
    spec, container = agent_of(objects)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet/pod-resources")
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert container["securityContext"]["runAsUser"] == 0
    assert "add" not in container["securityContext"]["capabilities"]
    assert not spec.get("hostPID")
    assert not any(e["name"] == "NVIDIA_VISIBLE_DEVICES" for e in container["env"])
    config = agent_config(objects)
    assert config["receivers"]["dcgm"]["address"] == "nv-hostengine.example:5555"
    assert config["processors"]["attribution"]["kubelet"]["enabled"] is True
    assert not any(o["metadata"]["name"].endswith("dcgm-exporter") for o in by_kind(objects, "Service"))


def test_kubelet_source_can_be_switched_off() -> None:
    spec, container = agent_of(template(sets=("source=dcgm", "attribution.kubelet=false")))
    assert not any("hostPath" in v for v in spec["volumes"])
    assert container["securityContext"]["runAsNonRoot"] is True


def test_nvml_source_adds_only_the_profiling_capability_and_sees_the_gpus() -> None:
    spec, container = agent_of(template(sets=("source=nvml",)))
    assert container["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]
    assert not spec.get("hostPID")
    spec, container = agent_of(template(sets=("source=nvml", "nvml.profilingCapability=false")))
    assert "add" not in container["securityContext"]["capabilities"]


def test_host_pid_only_with_process_attribution() -> None:
    for source in ("dcgm_exporter", "dcgm", "nvml"):
        spec, _ = agent_of(template(sets=(f"source={source}",)))
        assert "hostPID" not in spec, source
        objects = template(sets=(f"source={source}", "attribution.processes.enabled=true"))
        spec, container = agent_of(objects)
        assert spec["hostPID"] is True, source
        processes = agent_config(objects)["processors"]["attribution"]["processes"]
        assert processes["enabled"] is True
        assert processes["pid_sources"] == (["samples"] if source == "nvml" else ["nvml"])


def test_kubernetes_api_adds_the_pod_watch_and_its_rbac() -> None:
    objects = template(sets=(
        "attribution.kubernetesApi.enabled=true",
        "attribution.kubernetesApi.ownerLookups[0].kind=RayCluster",
        "attribution.kubernetesApi.ownerLookups[0].group=ray.io",
        "attribution.kubernetesApi.ownerLookups[0].resource=rayclusters",
    ))
    spec, container = agent_of(objects)
    assert spec["automountServiceAccountToken"] is True
    api = agent_config(objects)["processors"]["attribution"]["kubernetes_api"]
    assert api == {"enabled": True, "node_name": "${env:K8S_NODE_NAME}", "owner_lookups": ["RayCluster.ray.io"]}
    assert container_env(container)["K8S_NODE_NAME"]
    (role,) = by_kind(objects, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get"]},
    ]
    (binding,) = by_kind(objects, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == spec["serviceAccountName"]

    # Switched off: no token mounted, no ClusterRole, no kubernetes_api block.
    objects = template(sets=("attribution.kubernetesApi.enabled=false",))
    spec, _ = agent_of(objects)
    assert spec["automountServiceAccountToken"] is False and not by_kind(objects, "ClusterRole")
    assert not agent_config(objects)["processors"]["attribution"].get("kubernetes_api", {}).get("enabled")


def test_config_value_merges_over_the_defaults(tmp_path: Path) -> None:
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump({"agent": {"config": {
        "processors": {"ofu": {"tile_correction": {"enabled": False}}},
        "exporters": {"file": {"path": "/tmp/ofu.jsonl"}},
        "service": {"pipelines": {"metrics": {"exporters": ["prometheus", "file"]}}},
    }}}))
    config = agent_config(template(override))
    assert config["processors"]["ofu"]["tile_correction"]["enabled"] is False
    assert config["processors"]["attribution"]["precision_key"] == "ofu.dev/precision"  # default kept
    assert set(config["exporters"]) == {"prometheus", "otlp/jobs", "file"}
    metrics = config["service"]["pipelines"]["metrics"]
    assert metrics["exporters"] == ["prometheus", "file"]  # lists are replaced
    assert metrics["receivers"] == ["dcgm_exporter", "otlp"]  # siblings kept
    assert "metrics/self" in config["service"]["pipelines"]


def test_config_change_rolls_the_pods() -> None:
    first = one(template(), "DaemonSet", "agent")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    second = one(template(sets=("agent.config.processors.ofu.tile_correction.enabled=false",)), "DaemonSet",
                 "agent")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert first != second


def test_otlp_headers_from_secrets_stay_out_of_the_configmap() -> None:
    objects = template(sets=(
        "otlp.endpoint=otlp.example.com:4317",
        "otlp.headersFromSecrets[0].header=authorization",
        "otlp.headersFromSecrets[0].secretName=otlp-auth",
        "otlp.headersFromSecrets[0].secretKey=authorization",
        "otlp.tls.secretName=otlp-ca",
    ))
    spec, container = agent_of(objects)
    otlp = agent_config(objects)["exporters"]["otlp"]
    assert otlp["headers"] == {"authorization": "${env:OFU_HEADER_0}"}
    assert otlp["tls"] == {"insecure": False, "ca_file": "/etc/otel-ofu/otlp-tls/ca.crt"}
    env = next(e for e in container["env"] if e["name"] == "OFU_HEADER_0")
    assert env["valueFrom"]["secretKeyRef"] == {"name": "otlp-auth", "key": "authorization"}
    assert {"name": "otlp-tls", "secret": {"secretName": "otlp-ca"}} in spec["volumes"]


def test_a_metrics_only_backend_gets_no_events_when_told() -> None:
    """otlp.logsEndpoint: none (Prometheus 3, VictoriaMetrics: docs/backends.md) reaches every OTLP exporter."""
    objects = template(sets=("otlp.protocol=http", "otlp.endpoint=http://prometheus.monitoring:9090/api/v1/otlp",
                             "otlp.logsEndpoint=none"))
    jobs_config = yaml.safe_load(one(objects, "ConfigMap", "jobs")["data"]["config.yaml"])
    for config in (agent_config(objects), jobs_config):
        assert config["exporters"]["otlphttp"]["logs_endpoint"] == "none"
    assert "logs_endpoint" not in agent_config(template(sets=("otlp.protocol=http",
                                                              "otlp.endpoint=http://c:4318")))["exporters"]["otlphttp"]


def test_fleet_wires_agents_to_the_gateway_and_the_gateway_to_the_jobs_tier() -> None:
    objects = template(next(p for p in EXAMPLES if p.stem == "fleet"))
    gateway_service = one(objects, "Service", "gateway")
    exporters = agent_config(objects)["exporters"]
    assert exporters["otlp/gateway"]["endpoint"] == f"{gateway_service['metadata']['name']}.{NAMESPACE}.svc:4317"
    headless = one(objects, "Service", "jobs")
    assert headless["spec"]["clusterIP"] == "None"
    jobs = one(objects, "StatefulSet", "jobs")
    assert jobs["spec"]["serviceName"] == headless["metadata"]["name"]
    relay = yaml.safe_load(one(objects, "ConfigMap", "gateway")["data"]["relay.yaml"])
    lb = relay["exporters"]["load_balancing/jobs"]
    assert lb["routing_key"] == "attributes" and lb["routing_attributes"] == ["ofu.job.id"]
    assert lb["resolver"]["k8s"]["service"] == f"{headless['metadata']['name']}.{NAMESPACE}"
    assert set(relay["exporters"]) == {"load_balancing/jobs"}  # GPUs without a job stop at the gateway
    role = one(objects, "Role", "gateway")
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["get", "list", "watch"]}]
    jobs_config = yaml.safe_load(one(objects, "ConfigMap", "jobs")["data"]["config.yaml"])
    assert jobs_config["service"]["pipelines"]["metrics"]["processors"] == ["jobs"]
    assert jobs_config["receivers"]["otlp"]["auth"]["bearer_token_file"] == "/etc/otel-ofu/jobs-auth/token"
    assert jobs["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"


def test_dns_resolver_needs_no_rbac() -> None:
    fleet = next(p for p in EXAMPLES if p.stem == "fleet")
    objects = template(fleet, sets=("gateway.resolver=dns",))
    assert not by_kind(objects, "Role")
    relay = yaml.safe_load(one(objects, "ConfigMap", "gateway")["data"]["relay.yaml"])
    assert set(relay["exporters"]["load_balancing/jobs"]["resolver"]) == {"dns"}
    assert pod_spec(one(objects, "Deployment", "gateway"))["automountServiceAccountToken"] is False


@pytest.mark.parametrize(("sets", "message"), [
    (("gateway.enabled=true", "jobs.enabled=false"), "gateway.enabled needs jobs.enabled"),
    (("prometheus.enabled=false", "jobs.enabled=false"), "the agent has nowhere to send its GPUs' OFU"),
    (("prometheus.enabled=false",), "has nowhere to send"),
    (("jobs.replicas=3",), "jobs.replicas is 3: more than one jobs instance needs gateway.enabled"),
    (("agent.otlpReceiver.grpcPort=0", "agent.otlpReceiver.httpPort=0"),
     "agent.otlpReceiver.enabled needs grpcPort or httpPort"),
    (("source=dcgmexporter",), "at '/source': value must be one of"),
    (("attribution.kubelet=yes",), "at '/attribution/kubelet': value must be one of 'auto'"),
    (("otlp.endpoint=x:4317", "otlp.tls.certKey=tls.crt", "otlp.tls.secretName=s"),
     "otlp.tls.keyKey goes with otlp.tls.certKey"),
    (("sorce=nvml",), "additional properties 'sorce' not allowed"),
    (("otlp.endpoint=x:4317", "otlp.logsEndpoint=none"), "otlp.logsEndpoint needs otlp.protocol http"),
    (("otlp.protocol=http", "otlp.endpoint=http://x", "otlp.logsEndpoint=off"), "at '/otlp/logsEndpoint'"),
])
def test_bad_values_fail_with_a_clear_message(sets: tuple[str, ...], message: str) -> None:
    args = ["template", "x", str(CHART), *KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    done = helm(*args, check=False)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


# --- the default install computes per-job metrics; training jobs report to the node's agent ----------


def test_by_default_one_jobs_instance_gets_every_agents_ofu_and_reports() -> None:
    """Per-job metrics on a plain `helm install`: agents -> the one jobs instance, no gateway, no volume claim."""
    objects = template()
    assert not by_kind(objects, "Deployment")  # no gateway
    jobs = one(objects, "StatefulSet", "jobs")
    assert jobs["spec"]["replicas"] == 1
    assert "volumeClaimTemplates" not in jobs["spec"]  # needs no StorageClass
    headless = one(objects, "Service", "jobs")
    assert headless["spec"]["selector"].items() <= jobs["spec"]["template"]["metadata"]["labels"].items()
    agent = agent_config(objects)
    to_jobs = agent["exporters"]["otlp/jobs"]
    assert to_jobs["endpoint"] == f"{headless['metadata']['name']}.{NAMESPACE}.svc:4317"
    assert "otlp/jobs" in agent["service"]["pipelines"]["metrics"]["exporters"]
    assert "otlp/jobs" not in agent["service"]["pipelines"]["metrics/self"]["exporters"]
    jobs_config = yaml.safe_load(one(objects, "ConfigMap", "jobs")["data"]["config.yaml"])
    assert jobs_config["service"]["pipelines"]["metrics"]["processors"] == ["jobs"]
    # The agents serve their GPUs' series: the jobs instance takes only what it reads and serves only jobs.
    assert jobs_config["receivers"]["otlp"]["passthrough"] is False
    assert jobs_config["processors"]["jobs"]["passthrough"] is False
    assert jobs_config["processors"]["jobs"]["default_interval"] == "30s"  # dcgm-exporter's interval


def test_the_gateway_still_routes_a_fleet_to_several_jobs_instances() -> None:
    """With the gateway as without: the agents serve and send their GPUs' series, the jobs tier its jobs'."""
    objects = template(next(p for p in EXAMPLES if p.stem == "fleet"))
    agent = agent_config(objects)
    assert "otlp/jobs" not in agent["exporters"] and "otlp/gateway" in agent["exporters"]
    assert agent["service"]["pipelines"]["metrics"]["exporters"] == ["prometheus", "otlp", "otlp/gateway"]
    assert agent["service"]["pipelines"]["metrics/self"]["exporters"] == ["prometheus", "otlp"]
    jobs_config = yaml.safe_load(one(objects, "ConfigMap", "jobs")["data"]["config.yaml"])
    assert jobs_config["receivers"]["otlp"]["passthrough"] is False
    assert jobs_config["processors"]["jobs"]["passthrough"] is False


def test_jobs_auth_token_reaches_the_agents_when_they_send_to_the_jobs_instance() -> None:
    objects = template(sets=("jobs.authSecretName=ofu-jobs-token",))
    _, container = agent_of(objects)
    env = next(e for e in container["env"] if e["name"] == "OFU_JOBS_TOKEN")
    assert env["valueFrom"]["secretKeyRef"] == {"name": "ofu-jobs-token", "key": "token"}
    assert agent_config(objects)["exporters"]["otlp/jobs"]["headers"] == {
        "authorization": "Bearer ${env:OFU_JOBS_TOKEN}"}


def test_training_jobs_report_to_the_agent_on_their_node() -> None:
    """agent.otlpReceiver: a node-local Service by default, no host ports (issue 31, item 9: a Collector
    agent DaemonSet holding host ports 4317/4318 would keep the agents Pending)."""
    from otel_ofu.training.report import AGENT_GRPC_PORT, AGENT_HTTP_PORT

    objects = template()
    spec, container = agent_of(objects)
    ports = {p["name"]: p for p in container["ports"]}
    assert not any("hostPort" in p for p in container["ports"]) and not spec.get("hostNetwork")
    assert (ports["otlp-grpc"]["containerPort"], ports["otlp-http"]["containerPort"]) == (AGENT_GRPC_PORT,
                                                                                          AGENT_HTTP_PORT)
    local = one(objects, "Service", "agent-otlp")
    assert local["spec"]["internalTrafficPolicy"] == "Local"  # a pod's report reaches its own node's agent only
    assert local["spec"]["selector"].items() <= one(objects, "DaemonSet", "agent")["spec"]["template"]["metadata"][
        "labels"].items()
    assert {(p["port"], p["targetPort"]) for p in local["spec"]["ports"]} == {(4317, "otlp-grpc"), (4318, "otlp-http")}
    receiver = agent_config(objects)["receivers"]["otlp"]
    assert receiver["protocols"] == {"grpc": {"endpoint": "${env:K8S_POD_IP}:4317"},
                                     "http": {"endpoint": "${env:K8S_POD_IP}:4318"}}
    assert container_env(container)["K8S_POD_IP"]
    # Reports only: nothing else a pod sends is forwarded.
    assert receiver["passthrough"] is False
    assert set(receiver["decode"]) == {"training.mfu", "training.tflops_per_gpu", "megatron.training.throughput_tflops"}

    # The node's IP as well, where host ports are free and allowed.
    objects = template(sets=("agent.otlpReceiver.hostPort=true",))
    ports = {p["name"]: p for p in agent_of(objects)[1]["ports"]}
    assert (ports["otlp-grpc"]["hostPort"], ports["otlp-http"]["hostPort"]) == (AGENT_GRPC_PORT, AGENT_HTTP_PORT)

    objects = template(sets=("agent.otlpReceiver.enabled=false",))
    assert "otlp" not in agent_config(objects)["receivers"]
    assert {p["name"] for p in agent_of(objects)[1]["ports"]} == {"metrics"}
    assert not any(o["metadata"]["name"].endswith("agent-otlp") for o in by_kind(objects, "Service"))
    assert not by_kind(objects, "Secret")


def test_reports_need_the_token_of_a_secret_the_chart_makes_or_is_given() -> None:
    """agent.otlpReceiver.auth (issue 31, item 7): the agent requires Authorization: Bearer <the Secret's
    token>, read from the mounted Secret; the chart makes one (random) in every namespace jobs run in."""
    objects = template(sets=("agent.otlpReceiver.auth.jobNamespaces={llm,research}",))
    secrets = by_kind(objects, "Secret")
    assert {s["metadata"]["namespace"] for s in secrets} == {NAMESPACE, "llm", "research"}
    assert len({s["metadata"]["name"] for s in secrets}) == 1 and len({s["data"]["token"] for s in secrets}) == 1
    token = base64.b64decode(secrets[0]["data"]["token"]).decode()
    assert len(token) >= 32 and token.isalnum()
    spec, container = agent_of(objects)
    auth = agent_config(objects)["receivers"]["otlp"]["auth"]
    mount = next(m for m in container["volumeMounts"] if auth["bearer_token_file"].startswith(m["mountPath"] + "/"))
    assert mount["readOnly"] is True and auth["bearer_token_file"] == mount["mountPath"] + "/token"
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == secrets[0]["metadata"]["name"]
    assert base64.b64decode(one(template(), "Secret", "otlp-token")["data"]["token"]).decode() != token  # random

    # A Secret of one's own: nothing made, that one mounted.
    objects = template(sets=("agent.otlpReceiver.auth.existingSecret=ofu-reports",))
    assert not by_kind(objects, "Secret")
    spec, _ = agent_of(objects)
    assert {"name": "otlp-token", "secret": {"secretName": "ofu-reports"}} in spec["volumes"]
    # Off: no token asked for (the agent warns at start that it listens without one).
    objects = template(sets=("agent.otlpReceiver.auth.enabled=false",))
    assert "auth" not in agent_config(objects)["receivers"]["otlp"] and not by_kind(objects, "Secret")


def test_the_agent_takes_a_report_only_from_the_pod_it_names() -> None:
    attribution = agent_config(template())["processors"]["attribution"]
    assert attribution["report_sender"] == {"verify": True}
    assert attribution["kubernetes_api"]["enabled"] is True  # what knows the pods' addresses
    attribution = agent_config(template(sets=("agent.otlpReceiver.trustedSenders={10.0.5.0/24}",
                                              "agent.otlpReceiver.verifySender=false")))["processors"]["attribution"]
    assert attribution["report_sender"] == {"verify": False, "trusted": ["10.0.5.0/24"]}


def rule_for(policy: dict[str, Any], port: int) -> list[dict[str, Any]]:
    """The peers a NetworkPolicy admits to ``port`` (TCP)."""
    return [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]
            if {"port": port, "protocol": "TCP"} in rule["ports"]]


def test_network_policies_admit_only_who_needs_each_port(tmp_path: Path) -> None:
    """The agents' OTLP ports from pods (not from outside the cluster), every metrics port from
    Prometheus' namespace, the jobs tier and the gateway from their senders only."""
    objects = template()
    agent = one(objects, "NetworkPolicy", "agent")
    agent_labels = one(objects, "DaemonSet", "agent")["spec"]["template"]["metadata"]["labels"]
    assert agent["spec"]["podSelector"]["matchLabels"].items() <= agent_labels.items()
    assert agent["spec"]["policyTypes"] == ["Ingress"]
    assert rule_for(agent, 4317) == rule_for(agent, 4318) == [{"namespaceSelector": {}}]
    prometheus = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert rule_for(agent, 9464) == prometheus
    assert sorted(p["port"] for r in agent["spec"]["ingress"] for p in r["ports"]) == [4317, 4318, 9464]
    jobs = one(objects, "NetworkPolicy", "jobs")
    assert rule_for(jobs, 4317) == [{"podSelector": {"matchLabels": one(objects, "NetworkPolicy", "agent")["spec"][
        "podSelector"]["matchLabels"]}}]
    assert rule_for(jobs, 9464) == prometheus

    fleet = template(next(p for p in EXAMPLES if p.stem == "fleet"))
    gateway, jobs = one(fleet, "NetworkPolicy", "gateway"), one(fleet, "NetworkPolicy", "jobs")
    gateway_labels = one(fleet, "Deployment", "gateway")["spec"]["template"]["metadata"]["labels"]
    (sender,) = rule_for(jobs, 4317)
    assert sender["podSelector"]["matchLabels"].items() <= gateway_labels.items()  # behind the gateway: it alone
    (sender,) = rule_for(gateway, 4317)
    assert sender["podSelector"]["matchLabels"].items() <= agent_labels.items()
    assert rule_for(gateway, 8888) == prometheus

    values = tmp_path / "narrowed.yaml"
    values.write_text(yaml.safe_dump({"networkPolicy": {
        "otlpFrom": [{"namespaceSelector": {"matchLabels": {"ofu.dev/reports": "true"}}}],
        "metricsFrom": [{"namespaceSelector": {"matchLabels": {"team": "observability"}}}]}}))
    narrowed = template(values)
    agent = one(narrowed, "NetworkPolicy", "agent")
    assert rule_for(agent, 4317) == [{"namespaceSelector": {"matchLabels": {"ofu.dev/reports": "true"}}}]
    assert rule_for(agent, 9464) == [{"namespaceSelector": {"matchLabels": {"team": "observability"}}}]
    assert not by_kind(template(sets=("networkPolicy.enabled=false",)), "NetworkPolicy")


@pytest.mark.parametrize(("sets", "probe"), [
    ((), {"httpGet": {"path": "/metrics", "port": "metrics"}}),
    (("prometheus.enabled=false", "otlp.endpoint=backend:4317"), {"tcpSocket": {"port": "otlp-grpc"}}),
    (("prometheus.enabled=false", "otlp.endpoint=backend:4317", "agent.otlpReceiver.grpcPort=0"),
     {"tcpSocket": {"port": "otlp-http"}}),
], ids=["prometheus", "otlp-grpc", "otlp-http"])
def test_the_agent_has_probes_whatever_is_enabled(sets: tuple[str, ...], probe: dict[str, Any]) -> None:
    """Without the Prometheus endpoint the agent's probes connect to its OTLP receiver (issue 31, trial)."""
    _, container = agent_of(template(sets=sets))
    ports = {p["name"] for p in container["ports"]}
    for kind in ("livenessProbe", "readinessProbe"):
        assert probe.items() <= container[kind].items(), container[kind]
        assert next(iter(probe.values()))["port"] in ports


def test_a_helm_that_assumes_kubernetes_1_20_is_told_what_to_do() -> None:
    """A Helm built with a plain `go install` assumes Kubernetes 1.20 for template and lint (no cluster
    to ask): the chart refuses it, and Chart.yaml and the docs say why and what to pass."""
    done = helm("template", "x", str(CHART), "--kube-version", "1.20.0", check=False)
    assert done.returncode != 0 and "incompatible with Kubernetes v1.20.0" in done.stderr, done.stderr
    chart_yaml = (CHART / "Chart.yaml").read_text()
    section = doc_section("### Before you start")
    for text in (chart_yaml, section):
        assert "go install" in text and "1.20" in text and "--kube-version" in text


def test_the_default_image_is_what_deploy_image_sh_builds() -> None:
    """`deploy/image.sh` tags otel-ofu:<version> (and <version>-dcgm); the chart's defaults name those."""
    from otel_ofu import __version__

    def image(*sets: str) -> str:
        return agent_of(template(sets=sets))[1]["image"]

    assert image() == f"otel-ofu:{__version__}"
    assert image("image.registry=registry.example.com/gpu") == f"registry.example.com/gpu/otel-ofu:{__version__}"
    assert image("source=dcgm", "image.registry=registry.example.com/gpu/") == (
        f"registry.example.com/gpu/otel-ofu:{__version__}-dcgm")
    assert image("image.tag=custom") == "otel-ofu:custom"


# --- what docs/deploy.md says about the default install ---------------------------------------------

DEPLOY_DOC = CHART.parent.parent.parent / "docs" / "deploy.md"


def doc_section(heading: str) -> str:
    text = DEPLOY_DOC.read_text()
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[start:end]


def test_the_docs_name_every_namespace_the_default_install_writes_to() -> None:
    """The installer needs rights there: "Before you start" must say so (the gpu-operator Service)."""
    elsewhere = {(o["metadata"]["namespace"], o["kind"]) for o in template()
                 if o["metadata"].get("namespace") not in (None, NAMESPACE)}
    assert elsewhere == {("gpu-operator", "Service")}
    section = doc_section("### Before you start")
    for namespace, kind in elsewhere:
        assert f"**`{namespace}`**" in section and f"**{kind}**" in section, (namespace, kind)


def test_the_docs_size_the_jobs_instance_as_fleet_md_measured() -> None:
    """The switch to the gateway is given with the measured sizing (docs/fleet.md, Sizing), not a guess."""
    import re

    fleet = (DEPLOY_DOC.parent / "fleet.md").read_text()
    row = next(line for line in fleet.splitlines() if line.startswith("| jobs instance fed by the agents directly"))
    planned = re.findall(r"([\d,]+) GPUs per instance", row)[0]
    section = doc_section("### Per-job metrics: one jobs instance, or the gateway")
    assert f"**{planned} GPUs per jobs instance**" in section
    assert f"about {planned} GPUs" in (CHART / "values.yaml").read_text()


def test_otlp_events_false_sends_no_events_on_either_protocol() -> None:
    """otlp.events: false (a backend Collector without a logs pipeline) reaches every OTLP exporter, gRPC
    included, where logsEndpoint cannot be used; beside a logsEndpoint it is refused."""
    for protocol, endpoint in (("grpc", "backend:4317"), ("http", "http://backend:4318")):
        objects = template(sets=(f"otlp.protocol={protocol}", f"otlp.endpoint={endpoint}", "otlp.events=false"))
        jobs_config = yaml.safe_load(one(objects, "ConfigMap", "jobs")["data"]["config.yaml"])
        name = "otlp" if protocol == "grpc" else "otlphttp"
        for config in (agent_config(objects), jobs_config):
            assert config["exporters"][name]["events"] is False
    assert "events" not in agent_config(template(sets=("otlp.endpoint=backend:4317",)))["exporters"]["otlp"]
    done = helm("template", "x", str(CHART), *KUBE_VERSION, "--set", "otlp.protocol=http", "--set",
                "otlp.endpoint=http://x", "--set", "otlp.events=false", "--set", "otlp.logsEndpoint=http://l/x",
                check=False)
    assert done.returncode != 0 and "otlp.events false sends no events" in done.stderr, done.stderr
