"""The fleet topology for real: the otelcol-ofu gateway routing by job into otel-ofu jobs-tier processes.

The node tier is the real ``ofu`` processor per simulated node (tools/fleet_sim.py), its points
encoded as otel-ofu's OTLP exporter sends them; the gateway is the Collector running
collector-config/otelcol-gateway.yaml; each jobs-tier instance is ``otel-ofu run`` with
collector-config/fleet-jobs.yaml, exporting to an OTLP/gRPC backend of its own. The last test runs
collector-config/fleet-node.yaml itself on a dcgm-exporter page.

The jobs tier sends only what it makes (the node agents send the GPUs' series): a request has been
processed when every job in it has its minute's snapshot at the backends. The simulated windows end
on whole minutes, so each request (one minute) closes its minute's bin of every job in it.
"""

from __future__ import annotations

import math
import signal
import time
from collections import defaultdict
from pathlib import Path

import grpc
import pytest
import yaml

from otel_ofu.core.model import JOB_ID, MetricPoint
from otel_ofu.otlp import codec as otlp
from tests.e2e_util import (
    ROOT,
    PageServer,
    Process,
    free_ports,
    otel_ofu_command,
    port_open,
    require_alive,
    wait_for,
)
from tests.otlp_backends import GrpcBackend
from tools.fleet_sim import NodeTier

CONFIGS = ROOT / "collector-config"
EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
BIN_NS = 60 * 10**9  # fleet-jobs.yaml's jobs resolution (checked below)
# Six 4-GPU nodes: jobs of 6 and 10 GPUs span two and three nodes; 4 GPUs have no job.
JOBS = [{"id": "llm-pretrain", "scenario": "steady", "gpus": 6, "precision": "bf16"},
        {"id": "moe-sft", "scenario": "moe_inflated", "gpus": 10},
        {"id": "debug-flag", "scenario": "regression", "gpus": 2, "regress_at": "12m", "recover_at": "28m"},
        {"id": "short-eval", "scenario": "steady", "gpus": 2, "duration": "12m"}]
MINUTES = 40
WINDOWS_PER_REQUEST = 6  # one minute of 10 s windows from every node per request


def bins_closed(points: list[MetricPoint]) -> dict[str, int]:
    """Per job with GPU windows among ``points``: the end of the last bin they close (its snapshot's time)."""
    last: dict[str, int] = {}
    for p in points:
        job = dict(p.resource).get(JOB_ID)
        if p.name == "gpu.ofu" and job not in (None, "none", "unknown"):
            last[job] = max(last.get(job, 0), p.time_unix_nano)
    return {job: t // BIN_NS * BIN_NS for job, t in last.items()}


@pytest.fixture(scope="module")
def requests() -> list[tuple[bytes, dict[str, int]]]:
    """Each minute of the fleet as one OTLP request of the node tier's points, and the bins it closes."""
    jobs_config = yaml.safe_load((CONFIGS / "fleet-jobs.yaml").read_text())["processors"]["jobs"]
    assert jobs_config["resolution"] == "1m"
    tier = NodeTier.of(nodes=6, gpus_per_node=4, jobs=JOBS)
    out = []
    for _ in range(MINUTES):
        points: list[MetricPoint] = [p for _ in range(WINDOWS_PER_REQUEST) for ps in tier.window().values()
                                     for p in ps]
        out.append((otlp.encode_request(points), bins_closed(points)))
    return out


class Sink(GrpcBackend):
    """An OTLP backend that counts the gpu.ofu points it got, reading each request once."""

    def __init__(self) -> None:
        super().__init__()
        self._read = 0
        self.points: list[MetricPoint] = []

    def collect(self) -> list[MetricPoint]:
        with self.lock:
            new, self._read = self.metrics[self._read:], len(self.metrics)
        self.points += [p for r in new for p in otlp.from_request(r)]
        return self.points


def start_jobs_instance(name: str, tmp_path: Path, backend: GrpcBackend, processes: list[Process],
                        state: Path | None = None) -> tuple[int, Process]:
    (port,) = free_ports(1)
    proc = Process(name, otel_ofu_command(CONFIGS / "fleet-jobs.yaml"), tmp_path / f"{name}.log",
                   {"OFU_JOBS_GRPC_ENDPOINT": f"127.0.0.1:{port}", "OFU_BACKEND_ENDPOINT": f"127.0.0.1:{backend.port}",
                    "OFU_STATE_DIR": str(state or tmp_path / name)})
    processes.append(proc)
    wait_for(f"{name} to listen", lambda: require_alive(*processes) or port_open(port),
             diagnostics=lambda: "\n".join(p.tail() for p in processes))
    return port, proc


def start_gateway(otelcol: str, tmp_path: Path, instances: list[int], processes: list[Process]) -> int:
    grpc_port, http_port, health = free_ports(3)
    proc = Process("gateway", [otelcol, f"--config=file:{CONFIGS / 'otelcol-gateway.yaml'}"], tmp_path / "gateway.log",
                   {"OFU_JOBS_ENDPOINTS": "[" + ", ".join(f"127.0.0.1:{p}" for p in instances) + "]",
                    "OFU_GATEWAY_GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
                    "OFU_GATEWAY_HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
                    "OFU_GATEWAY_HEALTH_ENDPOINT": f"127.0.0.1:{health}", "OFU_GATEWAY_BATCH_TIMEOUT": "100ms"})
    processes.append(proc)
    wait_for("the gateway to listen", lambda: require_alive(*processes) or port_open(grpc_port),
             diagnostics=lambda: "\n".join(p.tail() for p in processes))
    return grpc_port


def snapshots(sinks: list[Sink]) -> set[tuple[str, int]]:
    """(job, bin end) of every job.gpus point the backends got: one per job and closed bin."""
    return {(dict(p.resource)[JOB_ID], p.time_unix_nano) for s in sinks for p in s.collect() if p.name == "job.gpus"}


def send_in_steps(port: int, requests: list[tuple[bytes, dict[str, int]]], sinks: list[Sink],
                  processes: list[Process]) -> None:
    """Each request, then wait until every job in it has its minute's snapshot at the backends (the job's
    points of one request reach its instance as one batch, so the snapshot says the batch was processed)."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    export = channel.unary_unary(EXPORT)
    try:
        for body, closed in requests:
            export(body, timeout=30)
            wait_for(f"the snapshots of {sorted(closed)} at the backends",
                     lambda c=closed: require_alive(*processes) or set(c.items()) <= snapshots(sinks),
                     timeout=60, interval=0.05, diagnostics=lambda: "\n".join(p.tail() for p in processes))
    finally:
        channel.close()
    settle(sinks)


def settle(sinks: list[Sink], quiet_s: float = 1.0) -> None:
    """Wait until the backends got nothing new for ``quiet_s`` (the last batch's job outputs are in)."""
    last, since = -1, time.monotonic()
    while time.monotonic() - since < quiet_s:
        count = sum(len(s.metrics) + len(s.logs) for s in sinks)
        if count != last:
            last, since = count, time.monotonic()
        time.sleep(0.05)


def job_view(sinks: list[Sink]) -> dict:
    """Per job: its windowed OFU per bin, last totals, findings and end summary, from what the backends got."""
    ofu: dict = {}
    totals: dict = {}
    for sink in sinks:
        for p in sink.collect():
            if p.name == "job.ofu":
                ofu[(dict(p.resource)[JOB_ID], dict(p.attributes)["ofu.window"], p.time_unix_nano)] = p.value
            elif p.name in ("job.gpu_seconds", "job.wasted_gpu_hours", "job.flops"):
                key = (dict(p.resource)[JOB_ID], p.name)
                if p.time_unix_nano >= totals.get(key, (0, 0))[0]:
                    totals[key] = (p.time_unix_nano, p.value)
    findings, ends = set(), {}
    for sink in sinks:
        for e in sink.events():
            a = dict(e.attributes)
            if e.name in ("ofu.finding.open", "ofu.finding.close"):
                findings.add((e.name, a[JOB_ID], a["ofu.finding.kind"], a["ofu.finding.cause"], e.time_unix_nano,
                              a["ofu.finding.since_unix_nano"]))
            elif e.name == "ofu.job.end":
                ends[a[JOB_ID]] = (e.time_unix_nano, a["ofu.job.gpu_hours"], a["ofu.job.ofu.mean"],
                                   a["ofu.job.wasted_gpu_hours"], a["ofu.job.findings"])
    return {"ofu": ofu, "totals": totals, "findings": findings, "ends": ends}


def assert_close(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), f"{what}: {sorted(set(a) ^ set(b))[:5]}"
    for key in a:
        x, y = a[key], b[key]
        pairs = zip(x, y) if isinstance(x, tuple) else [(x, y)]
        for u, v in pairs:
            assert (u == v) if isinstance(u, (str, int)) and not isinstance(u, float) else math.isclose(
                u, v, rel_tol=0, abs_tol=1e-9), f"{what} {key}: {x} != {y}"


def test_three_instances_behind_the_gateway_give_the_jobs_of_one(otelcol, requests, tmp_path, processes):
    sharded = [Sink().start() for _ in range(3)]
    single = Sink().start()
    try:
        ports = [start_jobs_instance(f"jobs-{i}", tmp_path, sink, processes)[0] for i, sink in enumerate(sharded)]
        single_port, _ = start_jobs_instance("jobs-single", tmp_path, single, processes)
        gateway = start_gateway(otelcol, tmp_path, ports, processes)
        send_in_steps(gateway, requests, sharded, processes)
        send_in_steps(single_port, requests, [single], processes)

        # Every job lives on exactly one instance, and they share the jobs out.
        owners = defaultdict(set)
        for i, sink in enumerate(sharded):
            for p in sink.collect():
                if p.name.startswith("job."):
                    owners[dict(p.resource)[JOB_ID]].add(i)
        assert set(owners) == {j["id"] for j in JOBS}
        assert all(len(where) == 1 for where in owners.values()), owners
        assert len(set().union(*owners.values())) >= 2, owners
        # The jobs tier sends only what it makes: the GPUs' series reach the backend from the node
        # agents (each series has one source), never through here. (fleet.gpu_hours: each instance's
        # GPU-hours by part of the loss account, under its own service.instance.id.)
        made = {p.name.split(".")[0] for s in [*sharded, single] for p in s.collect()}
        assert "job" in made and made <= {"job", "fleet", "otel_ofu"}, made

        one, three = job_view([single]), job_view(sharded)
        assert one["ofu"] and one["findings"] and one["ends"]
        assert {f[2] for f in one["findings"]} == {"mfu_gap", "regression"}
        assert_close(three["ofu"], one["ofu"], "job.ofu")
        assert_close(three["totals"], one["totals"], "totals")
        assert three["findings"] == one["findings"]
        # A job ends when its hosts' data has moved on by job_timeout on its instance; an instance that
        # gets nothing else from those hosts ends it only after silence_timeout (wall time, longer than
        # this test). What ended on both ended alike.
        both = one["ends"].keys() & three["ends"].keys()
        assert three["ends"].keys() <= one["ends"].keys()
        assert_close({j: three["ends"][j] for j in both}, {j: one["ends"][j] for j in both}, "job end")
    finally:
        for sink in [*sharded, single]:
            sink.stop()


def test_a_jobs_instance_killed_and_restarted_resumes_its_jobs(requests, tmp_path, processes):
    """SIGKILL mid-stream, restart on the same state: the jobs' results equal an instance never killed."""
    killed_sink, steady_sink = Sink().start(), Sink().start()
    state = tmp_path / "state"
    try:
        port, proc = start_jobs_instance("jobs-killed", tmp_path, killed_sink, processes, state)
        steady_port, _ = start_jobs_instance("jobs-steady", tmp_path, steady_sink, processes)
        send_in_steps(steady_port, requests, [steady_sink], processes)
        half = len(requests) // 2
        send_in_steps(port, requests[:half], [killed_sink], processes)
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait(10)
        processes.remove(proc)
        port, proc = start_jobs_instance("jobs-restarted", tmp_path, killed_sink, processes, state)
        assert "resumed" in proc.log.read_text()
        send_in_steps(port, requests[half:], [killed_sink], processes)
        one, again = job_view([steady_sink]), job_view([killed_sink])
        assert_close(again["ofu"], one["ofu"], "job.ofu")
        assert_close(again["totals"], one["totals"], "totals")
        assert again["findings"] == one["findings"]
        assert_close(again["ends"], one["ends"], "job end")
        # job.gpu_seconds is one cumulative series across the restart: same start time, no reset.
        starts = {(dict(p.resource)[JOB_ID], p.start_time_unix_nano) for p in killed_sink.collect()
                  if p.name == "job.gpu_seconds"}
        assert len(starts) == len({job for job, _ in starts})
    finally:
        killed_sink.stop()
        steady_sink.stop()



def test_the_backend_collector_keeps_job_identity_as_prometheus_labels(otelcol, tmp_path, processes):
    """node tier and jobs tier -> otelcol-backend-prometheus.yaml (remote write) -> a real Prometheus: PromQL
    by job, the GPUs' series from the nodes and the jobs' from the jobs tier."""
    from tests.e2e_util import prometheus_binary
    from tests.test_prometheus_e2e import promql

    prometheus = prometheus_binary()
    collector_port, prom_port = free_ports(2)
    prom = Process("prometheus", [prometheus, "--web.enable-remote-write-receiver",
                                  f"--config.file={tmp_path / 'prometheus.yml'}",
                                  f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                  f"--web.listen-address=127.0.0.1:{prom_port}"], tmp_path / "prometheus.log")
    (tmp_path / "prometheus.yml").write_text("global: {}\n")
    processes.append(prom)
    wait_for("Prometheus", lambda: require_alive(*processes) or port_open(prom_port))
    backend = Process("backend", [otelcol, f"--config=file:{CONFIGS / 'otelcol-backend-prometheus.yaml'}"],
                      tmp_path / "backend.log",
                      {"OFU_BACKEND_GRPC_ENDPOINT": f"127.0.0.1:{collector_port}",
                       "OFU_PROMETHEUS_WRITE_URL": f"http://127.0.0.1:{prom_port}/api/v1/write"})
    processes.append(backend)
    wait_for("the backend Collector", lambda: require_alive(*processes) or port_open(collector_port))
    (port,) = free_ports(1)
    processes.append(Process("jobs", otel_ofu_command(CONFIGS / "fleet-jobs.yaml"), tmp_path / "jobs.log",
                             {"OFU_JOBS_GRPC_ENDPOINT": f"127.0.0.1:{port}",
                              "OFU_BACKEND_ENDPOINT": f"127.0.0.1:{collector_port}",
                              "OFU_STATE_DIR": str(tmp_path / "state")}))
    wait_for("the jobs instance", lambda: require_alive(*processes) or port_open(port))
    # Fifteen minutes of the fleet ending now (Prometheus takes recent samples only): the node agents'
    # points to the backend (fleet-node.yaml's otlp/backend) and to the jobs tier (through the gateway).
    tier = NodeTier(NodeTier.of(nodes=2, gpus_per_node=4, jobs=JOBS[:1]).sim, start_unix_s=time.time() - 900)
    channels = [grpc.insecure_channel(f"127.0.0.1:{p}") for p in (collector_port, port)]
    exports = [channel.unary_unary(EXPORT) for channel in channels]
    for _ in range(15):
        body = otlp.encode_request([p for _ in range(6) for ps in tier.window().values() for p in ps])
        for export in exports:
            export(body, timeout=30)
    for channel in channels:
        channel.close()
    job = wait_for("job_ofu in Prometheus", lambda: promql(prom_port, 'job_ofu{ofu_job_id="llm-pretrain"}'),
                   timeout=60, interval=0.5, diagnostics=lambda: "\n".join(p.tail() for p in processes))
    assert {s["metric"]["ofu_window"] for s in job} >= {"5m", "life"}
    gpus = promql(prom_port, 'gpu_ofu{ofu_job_id="llm-pretrain", ofu_precision="bf16"}')
    assert len(gpus) == 6 and all(s["metric"]["hw_id"] and s["metric"]["host_name"] for s in gpus)
    # With its unit suffix and _total, as the Job dashboard reads it (and the clock panels gpu_..._hertz).
    assert promql(prom_port, 'job_gpu_seconds_total{ofu_job_id="llm-pretrain"}')


def test_the_shipped_node_tier_sends_each_gpu_window_to_the_backend_once(otelcol, tmp_path, processes):
    """fleet-node.yaml on a dcgm-exporter page -> the backend and the gateway -> fleet-jobs.yaml -> the same
    backend: each GPU window's gpu.ofu arrives once (from the node), the job's events from the jobs tier."""
    from tests.test_mfu_audit_e2e import dcgm_page, pod_labels

    page = dcgm_page("gpu-node-7", [("GPU-77777777-0000-4000-8000-000000000000", pod_labels("llama-worker-0")),
                                    ("GPU-77777777-0000-4000-8000-000000000001", pod_labels("llama-worker-0")),
                                    ("GPU-77777777-0000-4000-8000-000000000002", {})])
    backend = Sink().start()
    try:
        with PageServer({"/metrics": page}) as exporter:
            jobs_port, _ = start_jobs_instance("jobs", tmp_path, backend, processes)
            gateway = start_gateway(otelcol, tmp_path, [jobs_port], processes)
            processes.append(Process("node", otel_ofu_command(CONFIGS / "fleet-node.yaml"), tmp_path / "node.log",
                                     {"OFU_DCGM_EXPORTER_ENDPOINT": f"{exporter.url}/metrics",
                                      "OFU_GATEWAY_ENDPOINT": f"127.0.0.1:{gateway}",
                                      "OFU_BACKEND_ENDPOINT": f"127.0.0.1:{backend.port}",
                                      "OFU_QUEUE_DIR": str(tmp_path / "node-queue")}))

            def windows() -> set[int]:
                return {p.time_unix_nano for p in backend.collect() if p.name == "gpu.ofu"}

            wait_for("two windows of the node's GPUs and the job's start event at the backend", lambda: (
                require_alive(*processes) or (len(windows()) >= 2
                                              and any(e.name == "ofu.job.start" for e in backend.events()))),
                timeout=90, interval=0.2, diagnostics=lambda: "\n".join(p.tail() for p in processes))
            settle([backend])
    finally:
        backend.stop()
    per_window = defaultdict(int)
    for p in backend.collect():
        if p.name == "gpu.ofu":
            per_window[(dict(p.resource)["hw.id"], p.time_unix_nano)] += 1
    assert len({gpu for gpu, _ in per_window}) == 3 and set(per_window.values()) == {1}, dict(per_window)
    (start,) = {dict(e.attributes)[JOB_ID] for e in backend.events() if e.name == "ofu.job.start"}
    job_gpus = {dict(p.resource)[JOB_ID] for p in backend.collect() if p.name == "gpu.ofu"}
    assert start in job_gpus and "none" in job_gpus  # the idle GPU's series too, from the node
