"""otel-ofu with a real OpenTelemetry Collector (otelcol-ofu, built by collector/build.sh).

Skipped, with a message saying how to enable them, when the Collector cannot be built (no
Go); failing instead when CI is set. Configs come from collector-config/ with ports set
through their environment variables, so the shipped configs are what is tested.
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from pathlib import Path

import grpc
import pytest
import yaml

from tests.e2e_util import (
    ROOT,
    PageServer,
    Process,
    free_ports,
    otel_ofu_command,
    port_open,
    read_points,
    require_alive,
    wait_for,
)
from tests.otlp_shapes import H100_FREF_MHZ, Gpu, dcgm_exporter_request

CONFIGS = ROOT / "collector-config"
EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


def diagnostics(processes: list[Process]):
    return lambda: "\n".join(p.tail() for p in processes)


def start_collector(otelcol: str, config: Path, env: dict[str, str], tmp_path: Path, processes: list[Process],
                    ports: list[int]) -> Process:
    proc = Process("otelcol", [otelcol, f"--config=file:{config}"], tmp_path / "otelcol.log", env)
    processes.append(proc)
    wait_for(f"the Collector to listen on {ports}",
             lambda: require_alive(*processes) or all(port_open(p) for p in ports),
             timeout=120, diagnostics=diagnostics(processes))
    return proc


def start_processor_stage(otelcol: str, tmp_path: Path, processes: list[Process], sink: Path,
                          dcgm_exporter_port: int) -> int:
    """otel-ofu (processor-stage.yaml) behind otelcol-ofu-processor.yaml; returns the Collector's OTLP port."""
    c_grpc, c_http, c_return, o_grpc, o_http = free_ports(5)
    ofu = Process("otel-ofu", otel_ofu_command(CONFIGS / "processor-stage.yaml"), tmp_path / "otel-ofu.log",
                  {"OFU_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{o_grpc}", "OFU_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{o_http}",
                   "OFU_RETURN_ENDPOINT": f"127.0.0.1:{c_return}"})
    processes.append(ofu)
    wait_for("otel-ofu's otlp receiver", lambda: require_alive(*processes) or port_open(o_grpc),
             diagnostics=diagnostics(processes))
    start_collector(otelcol, CONFIGS / "otelcol-ofu-processor.yaml",
                    {"OFU_COLLECTOR_GRPC_ENDPOINT": f"127.0.0.1:{c_grpc}",
                     "OFU_COLLECTOR_HTTP_ENDPOINT": f"127.0.0.1:{c_http}",
                     "OFU_COLLECTOR_RETURN_ENDPOINT": f"127.0.0.1:{c_return}",
                     "OFU_OTLP_ENDPOINT": f"127.0.0.1:{o_grpc}",
                     "OFU_DCGM_EXPORTER_TARGET": f"127.0.0.1:{dcgm_exporter_port}", "DCGM_EXPORTER_INTERVAL": "1000",
                     "OFU_COLLECTOR_FILE_PATH": str(sink)}, tmp_path, processes, [c_grpc, c_return])
    return c_grpc


def test_every_collector_config_passes_otelcol_validate(otelcol):
    configs = sorted(CONFIGS.glob("otelcol-*.yaml"))
    assert configs, "collector-config/ has no otelcol-*.yaml"
    done = subprocess.run([str(ROOT / "collector" / "validate-configs.sh")], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OTELCOL": otelcol})
    assert done.returncode == 0, done.stdout + done.stderr
    for config in configs:
        assert f"ok      collector-config/{config.name}" in done.stdout, done.stdout


def test_no_collector_config_uses_what_the_pinned_collector_deprecates(otelcol, tmp_path):
    """Issue 31 item 18: every component is named by its type, not by a deprecated alias the Collector still
    accepts with a warning (``prometheusremotewrite``, ``otlp`` for the exporter, ``loadbalancing``: ``otelcol
    components`` lists only the types), and every config still validates with each feature gate that is off by
    default turned on: those that turn deprecated settings off (``resource_to_telemetry_conversion``, the remote
    write exporter's top-level HTTP settings) are the ones a later release flips."""
    components = yaml.safe_load(subprocess.run([otelcol, "components"], capture_output=True, text=True,
                                               timeout=60, check=True).stdout)
    listed = {kind: {c["name"] for c in components.get(kind) or []}
              for kind in ("receivers", "processors", "exporters", "extensions", "connectors")}
    table = subprocess.run([otelcol, "featuregate"], capture_output=True, text=True, timeout=60, check=True).stdout
    gates = [line.split()[0] for line in table.splitlines()[1:] if line.split()[1:2] == ["false"]]
    assert "exporter.prometheusremotewrite.DisableResourceToTelemetryConversion" in gates
    env = {**os.environ, "OFU_COLLECTOR_FILE_PATH": str(tmp_path / "sink.jsonl"),
           "OFU_JOBS_ENDPOINTS": "[127.0.0.1:14317, 127.0.0.1:14327]"}
    for path in sorted(CONFIGS.glob("otelcol-*.yaml")):
        config = yaml.safe_load(path.read_text())
        for kind, names in listed.items():
            unknown = {name.split("/")[0] for name in config.get(kind) or {}} - names
            assert not unknown, f"{path.name}: {kind} {sorted(unknown)} are not types of this Collector (aliases?)"
        done = subprocess.run([otelcol, "validate", f"--config=file:{path}",
                               "--feature-gates=" + ",".join(f"+{gate}" for gate in gates)],
                              capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, f"{path.name}: {done.stdout}{done.stderr}"


def test_sidecar_exports_ofu_to_the_collector_with_resources(otelcol, tmp_path, processes):
    """(a) otel-ofu (sim -> ofu -> otlp exporter) sends to a Collector that writes a file."""
    grpc_port, http_port = free_ports(2)
    sink = tmp_path / "collector.jsonl"
    start_collector(otelcol, CONFIGS / "otelcol-sidecar-sink.yaml",
                    {"OFU_COLLECTOR_GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
                     "OFU_COLLECTOR_HTTP_ENDPOINT": f"127.0.0.1:{http_port}", "OFU_COLLECTOR_FILE_PATH": str(sink)},
                    tmp_path, processes, [grpc_port, http_port])

    # The shipped sidecar config, plus a file exporter: what otel-ofu sent, to compare with.
    doc = yaml.safe_load((CONFIGS / "sidecar-otlp.yaml").read_text())
    doc["receivers"]["sim"]["time_acceleration"] = 10  # a window per wall second
    local = tmp_path / "otel-ofu.jsonl"
    doc["exporters"]["file"] = {"path": str(local)}
    doc["service"]["pipelines"]["metrics"]["exporters"].append("file")
    config = tmp_path / "sidecar.yaml"
    config.write_text(yaml.safe_dump(doc))
    ofu = Process("otel-ofu", otel_ofu_command(config), tmp_path / "otel-ofu.log",
                  {"OFU_OTLP_ENDPOINT": f"127.0.0.1:{grpc_port}", "OFU_QUEUE_DIR": str(tmp_path / "queue")})
    processes.append(ofu)

    def ofu_points(path: Path):
        return [p for p in read_points(path) if p.name == "gpu.ofu"]

    wait_for("three windows of OFU from otel-ofu",
             lambda: require_alive(*processes) or len(ofu_points(local)) >= 24, timeout=120,
             diagnostics=diagnostics(processes))
    assert ofu.stop() == 0  # SIGTERM: the exporter drains its queue before exiting
    sent = {(dict(p.resource)["hw.id"], p.time_unix_nano): p for p in ofu_points(local)}

    def all_arrived():
        got = {(dict(p.resource)["hw.id"], p.time_unix_nano): p for p in ofu_points(sink)}
        return got if sent.keys() <= got.keys() else None

    arrived = wait_for("every OFU point otel-ofu sent to reach the Collector's file", all_arrived, timeout=120,
                       diagnostics=diagnostics(processes))
    assert len({hw_id for hw_id, _ in sent}) == 8
    for key, point in sent.items():
        got = arrived[key]
        assert got.value == point.value
        assert got.resource == point.resource  # its own resource: host, GPU UUID, model, index
        assert got.attributes == point.attributes
        resource = dict(got.resource)
        assert resource["hw.id"] == key[0] and resource["host.name"] and resource["hw.model"]
        # The GPU's job identity travels on the resource through the real Collector.
        assert resource["ofu.job.id"] and resource["ofu.precision"]
        assert not {"ofu.job.id", "ofu.precision"} & dict(got.attributes).keys()


def test_collector_forwards_dcgm_metrics_to_otel_ofu_and_gets_ofu_back(otelcol, tmp_path, processes):
    """(b) test -> Collector (OTLP in) -> otel-ofu's otlp receiver -> ofu -> otlp -> Collector -> file."""
    sink = tmp_path / "collector.jsonl"
    c_grpc = start_processor_stage(otelcol, tmp_path, processes, sink, dcgm_exporter_port=free_ports(1)[0])

    gpus = [Gpu(0, "GPU-e2e-0", 0.5, 1755.0), Gpu(1, "GPU-e2e-1", 0.3125, 1980.0), Gpu(2, "GPU-e2e-2", 0.8, 1410.0)]
    t_ns = time.time_ns()
    body = dcgm_exporter_request(gpus, t_ns, host="gpu-node-7").SerializeToString()
    with grpc.insecure_channel(f"127.0.0.1:{c_grpc}") as channel:
        channel.unary_unary(EXPORT)(body, timeout=30)

    def back():
        points = read_points(sink)
        ofu_points = {dict(p.resource).get("hw.id"): p for p in points if p.name == "gpu.ofu.raw"}
        power = [p for p in points if p.name == "DCGM_FI_DEV_POWER_USAGE"]
        return (ofu_points, power) if len(ofu_points) == 3 and len(power) == 3 else None

    raw, power = wait_for("OFU and the passed-through metrics back in the Collector's file", back, timeout=120,
                          diagnostics=diagnostics(processes))
    for g in gpus:
        point = raw[g.uuid]
        assert math.isclose(point.value, g.tpa * g.clock_mhz / H100_FREF_MHZ, rel_tol=1e-12), g
        assert point.time_unix_nano == t_ns  # the window's own time, not when it was processed
        resource = dict(point.resource)
        assert resource["host.name"] == "gpu-node-7" and resource["gpu.index"] == str(g.index)
        assert resource["hw.model"] == "NVIDIA H100 80GB HBM3"
        assert resource["gpu.pci_bus_id"] == f"00000000:{g.index:02d}:00.0"
    # Metrics otel-ofu does not use came back unchanged, with the scrape's resource and labels.
    assert {dict(p.attributes)["UUID"]: p.value for p in power} == {g.uuid: g.power_w for g in gpus}
    assert all(dict(p.resource)["service.name"] == "dcgm-exporter" for p in power)
    assert not [p for p in read_points(sink) if p.name in ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_SM_CLOCK")]


def test_collector_prometheus_receiver_scraping_dcgm_exporter_feeds_otel_ofu(otelcol, tmp_path, processes):
    """(c) the Collector's own prometheus receiver scrapes a dcgm-exporter page; OFU comes back."""
    # A recorded dcgm-exporter page on /metrics, as dcgm-exporter serves it on :9400.
    exporter = PageServer({"/metrics": (ROOT / "tests" / "data" / "dcgm-exporter" / "h100.prom").read_bytes()})
    try:
        sink = tmp_path / "collector.jsonl"
        start_processor_stage(otelcol, tmp_path, processes, sink, dcgm_exporter_port=exporter.port)

        def back():
            points = read_points(sink)
            names = {p.name for p in points}
            return points if {"gpu.ofu.raw", "gpu.ofu.loss", "gpu.ofu.dropped", "DCGM_FI_DEV_POWER_USAGE",
                              "DCGM_FI_PROF_GR_ENGINE_ACTIVE"} <= names else None

        points = wait_for("OFU from the scraped page back in the Collector's file", back, timeout=120,
                          diagnostics=diagnostics(processes))
    finally:
        exporter.close()
    # h100.prom: GPU 0 TPA 0.929260 at 1410 MHz; GPU 1's TPA is a leaked DCGM blank sentinel.
    [raw] = {p.value: p for p in points if p.name == "gpu.ofu.raw"}.values()
    assert math.isclose(raw.value, 0.929260 * 1410 / H100_FREF_MHZ, rel_tol=1e-12)
    resource = dict(raw.resource)
    assert resource["hw.id"] == "GPU-3b1c5e2a-8f0d-4c61-9a7e-1d2f3a4b5c60"
    assert resource["host.name"] == "gpu-node-h100-01" and resource["k8s.pod.name"] == "llama-70b-pretrain-0"
    assert "service.name" not in resource  # the scrape target is not the GPU
    dropped = [p for p in points if p.name == "gpu.ofu.dropped"]
    assert {dict(p.resource)["hw.id"] for p in dropped} == {"GPU-3b1c5e2a-8f0d-4c61-9a7e-1d2f3a4b5c61"}
    assert {dict(p.attributes)["ofu.drop.reason"] for p in dropped} <= {"blank", "not_supported"}
    assert not [p for p in points if p.name == "gpu.ofu" and dict(p.resource)["hw.id"].endswith("61")]  # never 0
    power = {dict(p.attributes)["UUID"]: p.value for p in points if p.name == "DCGM_FI_DEV_POWER_USAGE"}
    assert power["GPU-3b1c5e2a-8f0d-4c61-9a7e-1d2f3a4b5c60"] == 612.304
    # The loss account from the page's GR 0.991104, SM 0.972451, TPA 0.929260: the ratios came with the
    # scrape and went on as they came (dashboards keep their DCGM series)
    window = raw.time_unix_nano
    loss = {dict(p.attributes)["ofu.loss.part"]: p.value for p in points
            if p.name == "gpu.ofu.loss" and p.time_unix_nano == window and dict(p.resource)["hw.id"].endswith("60")}
    assert loss["engine_idle"] == pytest.approx(1 - 0.991104) and loss["sm_idle"] == pytest.approx(0.991104 - 0.972451)
    assert loss["non_tensor"] == pytest.approx(0.972451 - 0.929260)
    assert loss["clock"] == pytest.approx(0.929260 - raw.value)
    gr = {dict(p.attributes)["UUID"]: p.value for p in points if p.name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
    assert gr["GPU-3b1c5e2a-8f0d-4c61-9a7e-1d2f3a4b5c60"] == 0.991104
    assert not [p for p in points if p.name == "gpu.graphics_engine.activity"]  # not twice under two names


def test_a_node_scraped_without_profiling_fields_is_said_once_by_the_processing_stage(otelcol, tmp_path, processes):
    """The Collector's prometheus receiver scrapes a dcgm-exporter page without profiling fields (the
    corpus page of an H100 PCIe node on a counters CSV without the DCGM_FI_PROF_* lines): otel-ofu behind it says
    once, at WARNING, which host's GPUs arrive without tensor activity and how to turn it on, while the
    drop counter names the reason."""
    page = ROOT / "tests" / "data" / "real" / "dcgm-exporter" / "4.5.3-4.8.2_h100-pcie_no-profiling.prom"
    exporter = PageServer({"/metrics": page.read_bytes()})
    try:
        sink = tmp_path / "collector.jsonl"
        start_processor_stage(otelcol, tmp_path, processes, sink, dcgm_exporter_port=exporter.port)

        def dropped_windows():
            points = [p for p in read_points(sink) if p.name == "gpu.ofu.dropped"]
            return points if len({p.time_unix_nano for p in points}) >= 3 else None  # three scrapes at least

        dropped = wait_for("three scrapes' drop counters back in the Collector's file", dropped_windows,
                           timeout=120, diagnostics=diagnostics(processes))
    finally:
        exporter.close()
    assert {dict(p.attributes)["ofu.drop.reason"] for p in dropped} == {"missing"}
    log = (tmp_path / "otel-ofu.log").read_text()
    warnings = [line for line in log.splitlines() if "arrive without" in line]
    assert len(warnings) == 1, warnings
    assert "host pcie-node-5 " in warnings[0] and "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in warnings[0]
    assert "WARNING" in warnings[0] and "dcp-metrics-included.csv" in warnings[0]


def test_gpu_sources_that_give_no_ofu_are_each_said_once_by_the_processing_stage(otelcol, tmp_path, processes):
    """Issue 31 items 16 and 17: behind the real Collector, (a) its prometheus receiver scrapes the corpus page of
    utkuozdemir/nvidia_gpu_exporter (nvidia-smi's fields: no tensor activity) every second, and (b) a request in
    the shape of Google's dcgm receiver before 2024-09 (dcgm.gpu.*: no SM clock; the corpus request) reaches its
    OTLP receiver and is sent on as the Collector builds it. Both pass through otel-ofu unchanged, and otel-ofu
    says once for each, at WARNING, why these GPUs get no OFU and what to run instead."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    real = ROOT / "tests" / "data" / "real"
    exporter = PageServer({"/metrics": (real / "nvidia-gpu-exporter" / "v1.14.0_h100-x2.prom").read_bytes()})
    try:
        sink = tmp_path / "collector.jsonl"
        c_grpc = start_processor_stage(otelcol, tmp_path, processes, sink, dcgm_exporter_port=exporter.port)
        v1 = json_format.Parse((real / "otlp" / "dcgmreceiver-v1_h100.json").read_text(), ExportMetricsServiceRequest())
        with grpc.insecure_channel(f"127.0.0.1:{c_grpc}") as channel:
            channel.unary_unary(EXPORT)(v1.SerializeToString(), timeout=30)

        def both_back():
            points = read_points(sink)
            scrapes = {p.time_unix_nano for p in points if p.name == "nvidia_smi_gpu_info"}
            tensor = [p for p in points if p.name == "dcgm.gpu.profiling.pipe_utilization"]
            return (points, tensor) if len(scrapes) >= 3 and tensor else None  # three scrapes at least

        points, tensor = wait_for("three scrapes of the nvidia-smi exporter and the dcgm receiver's request back",
                                  both_back, timeout=120, diagnostics=diagnostics(processes))
    finally:
        exporter.close()
    # Passed through as they came: every pipe of the dcgm receiver's request, the exporter's clock in Hz.
    sent = [({kv.key: kv.value.string_value for kv in dp.attributes}, dp.as_double)
            for m in v1.resource_metrics[0].scope_metrics[0].metrics if m.name == "dcgm.gpu.profiling.pipe_utilization"
            for dp in m.gauge.data_points]
    assert sorted((dict(p.attributes)["uuid"], dict(p.attributes)["pipe"], p.value) for p in tensor) == sorted(
        (attributes["uuid"], attributes["pipe"], value) for attributes, value in sent)
    clocks = {dict(p.attributes)["uuid"]: p.value for p in points if p.name == "nvidia_smi_clocks_current_sm_clock_hz"}
    assert clocks == {"3d9a41c7-52e0-4b8f-9c16-7a2f0e8b5d41": 1.755e9, "3d9a41c7-52e0-4b8f-9c16-7a2f0e8b5d42": 3.45e8}
    assert not [p for p in points if p.name in ("gpu.ofu", "gpu.ofu.raw", "gpu.ofu.dropped")]
    log = (tmp_path / "otel-ofu.log").read_text()
    nvml = [line for line in log.splitlines() if "arrive as nvidia_gpu_exporter's metrics" in line]
    assert len(nvml) == 1, nvml
    assert f"scrape target 127.0.0.1:{exporter.port} " in nvml[0] and "no tensor pipe activity" in nvml[0]
    assert "WARNING" in nvml[0] and "dcp-metrics-included.csv" in nvml[0]
    v1_said = [line for line in log.splitlines() if "dcgm.gpu.profiling" in line]
    assert len(v1_said) == 1, v1_said
    assert "host a3-highgpu-8g-017 " in v1_said[0] and "no SM clock" in v1_said[0]
    assert "receiver_version: 2" in v1_said[0]


def test_the_processing_stage_names_each_gpus_job_from_the_pod_labels_the_collector_forwards(otelcol, tmp_path,
                                                                                           processes):
    """Issue 31 item 3: the Collector's prometheus receiver scrapes a Kubernetes node's dcgm-exporter page (the
    corpus page of dcgm-exporter 4.x with pod, namespace and container labels on the GPUs a pod holds, derived:
    tests/data/real/README.md) and forwards it to processor-stage.yaml: each GPU's OFU names its pod's job from
    those labels, and the GPU no pod holds is "none", where the stage used to say "unknown" for all three."""
    page = ROOT / "tests" / "data" / "real" / "dcgm-exporter" / "4.5.3-4.8.2_h100_kubernetes.prom"
    exporter = PageServer({"/metrics": page.read_bytes()})
    try:
        sink = tmp_path / "collector.jsonl"
        start_processor_stage(otelcol, tmp_path, processes, sink, dcgm_exporter_port=exporter.port)

        def ofu_back():
            points = {dict(p.resource)["hw.id"]: p for p in read_points(sink) if p.name == "gpu.ofu"}
            return points if len(points) == 3 else None

        ofu = wait_for("the three GPUs' OFU back in the Collector's file", ofu_back, timeout=120,
                       diagnostics=diagnostics(processes))
    finally:
        exporter.close()
    pod_job = "k8s:training/Pod/llama3-70b-worker-0"
    resources = {hw_id: dict(p.resource) for hw_id, p in ofu.items()}
    jobs = {hw_id: (r.get("ofu.job.id"), r.get("ofu.job.source")) for hw_id, r in resources.items()}
    assert jobs == {"GPU-1f3c9a52-7d04-4e8b-a1c6-0b5e2d7f9a31": (pod_job, "scrape"),
                    "GPU-1f3c9a52-7d04-4e8b-a1c6-0b5e2d7f9a32": ("none", "scrape"),  # idle: no pod labels
                    "GPU-1f3c9a52-7d04-4e8b-a1c6-0b5e2d7f9a33": (pod_job, "scrape")}
    held = resources["GPU-1f3c9a52-7d04-4e8b-a1c6-0b5e2d7f9a31"]
    assert (held["k8s.namespace.name"], held["k8s.pod.name"], held["k8s.container.name"]) == (
        "training", "llama3-70b-worker-0", "pytorch")
