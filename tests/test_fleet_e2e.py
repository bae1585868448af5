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
import re
import signal
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
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
    prometheus3_binary,
    read_points,
    require_alive,
    wait_for,
)
from tests.otlp_backends import GrpcBackend
from tools.demo_prometheus import Prometheus
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
    """Per job: its windowed OFU per bin, last totals of its bins, its final totals (once it ended), findings and
    end summary, from what the backends got."""
    ofu: dict = {}
    totals: dict = {}
    finals: dict = {}
    for sink in sinks:
        for p in sink.collect():
            if p.name == "job.ofu":
                ofu[(dict(p.resource)[JOB_ID], dict(p.attributes)["ofu.window"], p.time_unix_nano)] = p.value
            elif p.name in ("job.gpu_seconds", "job.wasted_gpu_hours", "job.flops"):
                key = (dict(p.resource)[JOB_ID], p.name)
                # a bin's snapshot is stamped at the bin's end; the job's final values at its end, never there
                which = totals if p.time_unix_nano % BIN_NS == 0 else finals
                if p.time_unix_nano >= which.get(key, (0, 0))[0]:
                    which[key] = (p.time_unix_nano, p.value)
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
    # Each job that ended has its final totals, its end event's (ofu.job.gpu_hours), and only those.
    assert {job for job, _ in finals} == set(ends)
    for job, (_, gpu_hours, *_) in ends.items():
        assert math.isclose(finals[(job, "job.gpu_seconds")][1] / 3600, gpu_hours, rel_tol=1e-12), job
    return {"ofu": ofu, "totals": totals, "finals": finals, "findings": findings, "ends": ends}


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
        assert_close({k: v for k, v in three["finals"].items() if k[0] in both},
                     {k: v for k, v in one["finals"].items() if k[0] in both}, "final totals")
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
        assert_close(again["finals"], one["finals"], "final totals")
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


# --- the documented fleet end to end: outages, a killed jobs instance, Prometheus 3 and the alerts ------

SIM_ACCELERATION = 30  # simulated seconds per wall second: a 10 s window every third of a second
SIM_WINDOW_S = 10  # fleet-node.yaml's collection_interval, fleet-jobs.yaml's default_interval
RULES = [ROOT / "deploy" / "prometheus" / f"otel-ofu.{kind}.yml" for kind in ("rules", "alerts")]
# What gives data up: otel-ofu at ERROR (dropping items, a refusal), the Collectors' queue ("Exporting failed.
# Dropping data.", after a permanent error such as Prometheus' 400 "out of order sample"). (The remote write
# exporter also logs a retried 503 at error level: Prometheus starting.)
DROP_LINE = re.compile(r" ERROR |Dropping data|Permanent error")


def fleet_node_config(tmp_path: Path, record: Path, start: datetime, reference_port: int) -> Path:
    """collector-config/fleet-node.yaml with the sim for its receiver (two nodes of four GPUs, a job on six of
    them and a short one on one, time running SIM_ACCELERATION times faster from ``start``), its own metrics
    every 2 s instead of 30 s, and beside its two OTLP exporters a file exporter (the record of what it made) and
    a third OTLP one, as the gateway's, to a reference jobs instance that nothing interrupts."""
    config = yaml.safe_load((CONFIGS / "fleet-node.yaml").read_text())
    assert config["receivers"]["dcgm_exporter"]["collection_interval"] == f"{SIM_WINDOW_S}s"
    config["receivers"] = {
        "sim": {"nodes": 2, "gpus_per_node": 4, "time_acceleration": SIM_ACCELERATION,
                "collection_interval": f"{SIM_WINDOW_S}s", "start_time": start.isoformat(),
                "jobs": [{"id": "llm-pretrain", "scenario": "steady", "gpus": 6, "precision": "bf16"},
                         {"id": "short-eval", "scenario": "steady", "gpus": 1, "duration": "8m"}]},
        "selftelemetry": {"collection_interval": "2s"}}
    config["exporters"]["file/record"] = {"path": str(record)}
    config["exporters"]["otlp/reference"] = {**config["exporters"]["otlp/gateway"],
                                             "endpoint": f"127.0.0.1:{reference_port}"}
    metrics = config["service"]["pipelines"]["metrics"]
    metrics["receivers"] = ["sim"]
    metrics["exporters"] += ["file/record", "otlp/reference"]
    path = tmp_path / "fleet-node.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def fleet_jobs_config(tmp_path: Path) -> Path:
    """collector-config/fleet-jobs.yaml with its own metrics every 2 s, and a file exporter (${env:OFU_RECORD})
    beside the backend's: the record of what each run of the instance made."""
    config = yaml.safe_load((CONFIGS / "fleet-jobs.yaml").read_text())
    assert config["processors"]["jobs"]["default_interval"] == f"{SIM_WINDOW_S}s"
    config["receivers"]["selftelemetry"]["collection_interval"] = "2s"
    config["exporters"]["file/record"] = {"path": "${env:OFU_RECORD}"}
    config["service"]["pipelines"]["metrics"]["exporters"].append("file/record")
    path = tmp_path / "fleet-jobs.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def recorded(paths: list[Path], name: str, key) -> dict[tuple, set[float]]:
    """The values each key of ``name``'s points took in the records (two values for one key: a re-sent
    window that changed)."""
    out: dict[tuple, set[float]] = defaultdict(set)
    for path in paths:
        for p in read_points(path):
            if p.name == name:
                out[key(p)].add(p.value)
    return out


def stored(api: Prometheus, series: str, key, at: float, span_s: float) -> dict[tuple, float]:
    """Every raw sample of ``series`` Prometheus holds in the ``span_s`` seconds up to ``at``, by ``key``."""
    out = {}
    for s in api.query(f"{series}[{int(span_s)}s]", at):
        for t, v in s["values"]:
            out[key(s["metric"], round(float(t) * 1000))] = float(v)
    return out


def test_the_documented_fleet_loses_no_point_through_outages_and_a_killed_jobs_instance(otelcol, tmp_path, processes,
                                                                                      request):
    """Issue 31 (Done when, and item 2): the fleet of docs/fleet.md with its shipped configs, the real Collector
    and a real Prometheus 3 with the shipped rules and alerts evaluated every second: node agent (fleet-node.yaml,
    the sim for its receiver) -> gateway (otelcol-gateway.yaml) -> jobs instance (fleet-jobs.yaml), node and jobs
    -> backend Collector (otelcol-backend-prometheus.yaml) -> Prometheus 3's remote write receiver.

    Prometheus goes down for longer than a remote write request's default deadline (the Collector keeps what it
    accepted); then the backend Collector goes down (otel-ofu keeps its outputs in its queues on disk) and
    meanwhile the jobs instance is killed (SIGKILL) and restarted on its state. When all is back: every gpu.ofu
    and job.ofu point the node and the jobs instance made (their file records) is in Prometheus with the value
    made, the same as a jobs instance fed the node's points directly and never interrupted (so no input was lost
    on the way either), each job's 5m OFU has every minute, nothing was dropped (otel-ofu's self-telemetry, the
    logs), the job events went to the backend's logs pipeline, every rule evaluated without error and no alert
    fired."""
    prometheus = prometheus3_binary()
    prom_port, backend_port, jobs_port, reference_port = free_ports(4)
    api = Prometheus(f"http://127.0.0.1:{prom_port}")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"evaluation_interval": "1s"}, "rule_files": [str(p) for p in RULES]}))
    runs = {"prometheus": 0, "backend": 0, "jobs": 0}

    def start(name: str, args: list[str], env: dict[str, str] | None = None) -> Process:
        runs[name] = runs.get(name, 0) + 1
        proc = Process(name, args, tmp_path / f"{name}-{runs[name]}.log", env)
        processes.append(proc)
        return proc

    def diagnostics() -> str:
        return "\n".join(p.tail() for p in processes)

    def start_prometheus() -> Process:
        proc = start("prometheus", [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={tmp_path / 'tsdb'}", "--web.enable-remote-write-receiver",
                                    f"--web.listen-address=127.0.0.1:{prom_port}"])
        wait_for("Prometheus to be ready", lambda: require_alive(*processes) or api.ready(), diagnostics=diagnostics)
        return proc

    def start_backend() -> Process:
        proc = start("backend", [otelcol, f"--config=file:{CONFIGS / 'otelcol-backend-prometheus.yaml'}"],
                     {"OFU_BACKEND_GRPC_ENDPOINT": f"127.0.0.1:{backend_port}",
                      "OFU_PROMETHEUS_WRITE_URL": f"http://127.0.0.1:{prom_port}/api/v1/write"})
        wait_for("the backend Collector", lambda: require_alive(*processes) or port_open(backend_port),
                 diagnostics=diagnostics)
        return proc

    jobs_config = fleet_jobs_config(tmp_path)
    jobs_records: list[Path] = []

    def start_jobs() -> Process:
        jobs_records.append(tmp_path / f"jobs-record-{len(jobs_records) + 1}.jsonl")
        proc = start("jobs", otel_ofu_command(jobs_config),
                     {"OFU_JOBS_GRPC_ENDPOINT": f"127.0.0.1:{jobs_port}", "OFU_STATE_DIR": str(tmp_path / "jobs-state"),
                      "OFU_BACKEND_ENDPOINT": f"127.0.0.1:{backend_port}", "OFU_RECORD": str(jobs_records[-1])})
        wait_for("the jobs instance", lambda: require_alive(*processes) or port_open(jobs_port),
                 diagnostics=diagnostics)
        return proc

    def stop(proc: Process) -> None:
        assert proc.stop() == 0, proc.tail()
        processes.remove(proc)

    node_record = tmp_path / "node-record.jsonl"
    reference_record = tmp_path / "reference-record.jsonl"
    reference_sink = Sink().start()
    request.addfinalizer(reference_sink.stop)

    seen: dict = {"offset": 0, "windows": set()}

    def node_windows() -> int:
        """How many windows of its first GPU the node has made so far (the record read on from where the last
        call stopped: it grows to megabytes)."""
        if node_record.exists():
            with open(node_record, "rb") as f:
                f.seek(seen["offset"])
                text = f.read()
            whole = text[:text.rfind(b"\n") + 1]
            seen["offset"] += len(whole)
            for line in whole.decode().splitlines():
                if not line.startswith('{"resourceMetrics"'):
                    continue
                seen["windows"] |= {p.time_unix_nano for p in otlp.from_request(otlp.from_json_line(line))
                                    if p.name == "gpu.ofu" and dict(p.resource)["gpu.index"] == "0"
                                    and dict(p.resource)["host.name"].endswith("0")}
        return len(seen["windows"])

    def node_makes(windows: int) -> None:
        """Wait until the node has made ``windows`` more windows (simulated time moving on)."""
        target = node_windows() + windows
        wait_for(f"the node to make {windows} more windows", lambda: require_alive(*processes) or
                 node_windows() >= target, timeout=120, interval=0.5, diagnostics=diagnostics)

    prom = start_prometheus()
    backend = start_backend()
    jobs = start_jobs()
    gateway = start_gateway(otelcol, tmp_path, [jobs_port], processes)
    reference = start("reference", otel_ofu_command(jobs_config),
                      {"OFU_JOBS_GRPC_ENDPOINT": f"127.0.0.1:{reference_port}",
                       "OFU_STATE_DIR": str(tmp_path / "reference-state"),
                       "OFU_BACKEND_ENDPOINT": f"127.0.0.1:{reference_sink.port}", "OFU_RECORD": str(reference_record)})
    wait_for("the reference jobs instance", lambda: require_alive(*processes) or port_open(reference_port),
             diagnostics=diagnostics)
    # Simulated time ends about now: Prometheus keeps what is within an hour of its newest sample.
    sim_start = datetime.now(UTC) - timedelta(minutes=40)
    node = start("node", otel_ofu_command(fleet_node_config(tmp_path, node_record, sim_start, reference_port)),
                 {"OFU_GATEWAY_ENDPOINT": f"127.0.0.1:{gateway}", "OFU_BACKEND_ENDPOINT": f"127.0.0.1:{backend_port}",
                  "OFU_QUEUE_DIR": str(tmp_path / "node-queue")})
    wait_for("the jobs' OFU in Prometheus", lambda: require_alive(*processes) or api.query(
        'job_ofu{ofu_job_id="llm-pretrain", ofu_window="5m"}[1h]', time.time()),
        timeout=120, interval=0.5, diagnostics=diagnostics)

    # Prometheus down for longer than a remote write request's default deadline (5 s): the Collector retries.
    stop(prom)
    node_makes(8 * 60 // SIM_WINDOW_S)  # eight simulated minutes: 16 s
    prom = start_prometheus()
    node_makes(60 // SIM_WINDOW_S)
    # The backend Collector down (it sends what it holds first): the node and the jobs instance queue on disk;
    # meanwhile the jobs instance dies without a word and comes back on its state.
    stop(backend)
    node_makes(2 * 60 // SIM_WINDOW_S)
    jobs.proc.send_signal(signal.SIGKILL)
    jobs.proc.wait(10)
    processes.remove(jobs)
    node_makes(60 // SIM_WINDOW_S)
    jobs = start_jobs()
    node_makes(2 * 60 // SIM_WINDOW_S)
    backend = start_backend()
    node_makes(3 * 60 // SIM_WINDOW_S)
    stop(node)  # its queues drain before it exits

    def gpu_key(p: MetricPoint) -> tuple:
        return dict(p.resource)["hw.id"], p.time_unix_nano // 10**6

    def job_key(p: MetricPoint) -> tuple:
        return dict(p.resource)[JOB_ID], dict(p.attributes)["ofu.window"], p.time_unix_nano // 10**6

    gpus_made = recorded([node_record], "gpu.ofu", gpu_key)
    # Both jobs instances have closed the minute before the node's last window (the gateway's instance may
    # still be working through what waited for it).
    closed = ("llm-pretrain", "5m", max(t for _, t in gpus_made) // 60_000 * 60_000 - 60_000)
    jobs_made, made_there = wait_for("both jobs instances to close the node's last minutes", lambda: (
        lambda made, there: (made, there) if closed in made and closed in there else None)(
        recorded(jobs_records, "job.ofu", job_key), recorded([reference_record], "job.ofu", job_key)),
        timeout=120, interval=1, diagnostics=diagnostics)
    # Queries at the end of simulated time or now, whichever is later (a loaded machine runs the sim ahead).
    end = max(time.time(), max(t for _, t in gpus_made) / 1000) + 1
    span_s = end - sim_start.timestamp() + 600

    def in_prometheus() -> tuple[dict, dict]:
        return (stored(api, "gpu_ofu", lambda m, t: (m["hw_id"], t), end, span_s),
                stored(api, "job_ofu", lambda m, t: (m["ofu_job_id"], m["ofu_window"], t), end, span_s))

    def everything_stored() -> tuple[dict, dict] | None:
        gpus, jobs_ofu = in_prometheus()
        return (gpus, jobs_ofu) if gpus_made.keys() <= gpus.keys() and jobs_made.keys() <= jobs_ofu.keys() else None

    def missing() -> str:
        gpus, jobs_ofu = in_prometheus()
        return (f"gpu_ofu missing {sorted(gpus_made.keys() - gpus.keys())[:10]}; "
                f"job_ofu missing {sorted(jobs_made.keys() - jobs_ofu.keys())[:10]}\n{diagnostics()}")

    gpus, jobs_ofu = wait_for("every point the node and the jobs instance made to be in Prometheus",
                              everything_stored, timeout=120, interval=1, diagnostics=missing)

    # Each point once, with the value made (a window made twice with two values: the restart changed it).
    assert len(gpus_made) == 8 * node_windows() and all(len(v) == 1 for v in gpus_made.values())
    assert {k: next(iter(v)) for k, v in gpus_made.items()} == {k: gpus[k] for k in gpus_made}
    assert {k: v for k, v in jobs_made.items() if len(v) > 1} == {}
    assert {k: next(iter(v)) for k, v in jobs_made.items()} == {k: jobs_ofu[k] for k in jobs_made}
    # What the jobs instance made through the outages and the kill is what the reference made.
    assert made_there.keys() == jobs_made.keys()
    assert_close({k: jobs_ofu[k] for k in made_there}, {k: next(iter(v)) for k, v in made_there.items()}, "job.ofu")
    # Each GPU's windows and each job's minutes without a gap, through the outages and the kill.
    for hw_id in {hw for hw, _ in gpus_made}:
        times = sorted(t for hw, t in gpus if hw == hw_id)
        assert times == list(range(times[0], times[-1] + 1, SIM_WINDOW_S * 1000)), hw_id
    minutes = sorted(t for job, window, t in jobs_ofu if job == "llm-pretrain" and window == "5m")
    assert minutes == list(range(minutes[0], minutes[-1] + 1, 60_000)) and minutes[-1] >= closed[2]
    assert len(minutes) >= 17  # the phases above alone make 17 simulated minutes
    assert {"llm-pretrain", "short-eval"} <= {job for job, _, _ in jobs_ofu}

    # Nothing dropped: otel-ofu's own counters (each run's), and no drop or refusal in any log.
    for counter in ("otel_ofu_exporter_dropped_total", "otel_ofu_pipeline_dropped_total"):
        assert api.query(f"max_over_time({counter}[{int(span_s)}s]) > 0", end) == [], counter
    assert api.query(f"otel_ofu_exporter_sent_total[{int(span_s)}s]", end)  # the counters did arrive
    for log in sorted(tmp_path.glob("*.log")):
        errors = [line for line in log.read_text(errors="replace").splitlines() if DROP_LINE.search(line)]
        assert errors == [], (log.name, errors[:5])
    # The job events reached the backend's logs pipeline (the Collector's log, Prometheus stores none).
    backend_log = "".join(path.read_text(errors="replace") for path in sorted(tmp_path.glob("backend-*.log")))
    assert "ofu.job.start" in backend_log and "ofu.job.end" in backend_log

    # The shipped rules evaluated without error (the recording rules' groups every minute: maybe not yet since
    # Prometheus came back), every alert every second, and no alert fired (OtelOfuDroppingData has no `for`).
    rules = [r for g in api._get("/api/v1/rules", {})["groups"] for r in g["rules"]]
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] == "err"] == []
    alerts = {r["name"]: r["health"] for r in rules if r["type"] == "alerting"}
    assert "OtelOfuDroppingData" in alerts and set(alerts.values()) == {"ok"}, alerts
    fired = api.query(f"ALERTS{{alertstate='firing'}}[{int(span_s)}s]", end)
    assert fired == [], [s["metric"] for s in fired]
    assert api.query(f"ALERTS{{alertname='OtelOfuDroppingData'}}[{int(span_s)}s]", end) == []
    stop(reference)  # before its backend (the sink) stops
