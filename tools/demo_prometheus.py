"""The demo fleet's output in a real Prometheus, at the demo's own (simulated) times.

The demo (collector-config/demo.yaml: a simulated fleet with an MoE job whose MFU is
inflated, a 2.5x regression, a checkpointing job, a power-capped job, mixed precision, a GPU
a profiler holds, an idle reservation) runs with time acceleration through the
``prometheus`` exporter, with its points' timestamps (``send_timestamps: true``). After every
batch the exporter's exposition is recorded, so no window is lost to scrape timing on a busy
machine; ``promtool tsdb create-blocks-from openmetrics`` turns it into TSDB blocks and a real
Prometheus serves them, at the fleet's times: ``avg_over_time(...[5m])`` means five minutes of
fleet time, as on a real fleet. Then the recording rules are backfilled over the same span
(``promtool tsdb create-blocks-from rules``; Prometheus evaluates rules only at "now").
Live scraping of the exporter is covered by tests/test_prometheus_e2e.py.

Labels a real deployment adds outside otel-ofu are added here the same way: ``cluster`` as the
exporter's const label (or a scrape / remote-write external label), ``k8s_namespace_name`` as a
metric relabeling in place of the kubelet attribution a real cluster has.

The file exporter records the same run, so ``otel-ofu report`` can be compared with what
Prometheus answers. Used by the dashboard tests and ``python -m tools.render_dashboards``; the
same run also feeds the other roads into a backend (``run_demo(exporters=...)``,
tools/backends.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tools.ports import free_ports

ROOT = Path(__file__).resolve().parent.parent
DEMO_CONFIG = ROOT / "collector-config" / "demo.yaml"
CLUSTER = "demo"  # the target label standing in for the cluster label remote write / federation adds
RULES = ROOT / "deploy" / "prometheus" / "otel-ofu.rules.yml"
# The demo's jobs by Kubernetes namespace: a metric relabeling stands in for the kubelet
# attribution a real cluster has (k8s.namespace.name on every GPU and job series).
NAMESPACES = {"pretraining": ("llama-70b-pretrain", "moe-236b", "gpt-mixed-precision"),
              "finetuning": ("sft-debug-flag", "capped-finetune"),
              "research": ("vit-ckpt", "idle-reservation")}
# Backfilled blocks carry no staleness markers: a series a live Prometheus would mark stale (a
# rule's group that stopped, a GPU's previous precision) would stay visible for the default 5m
# lookback. 90s covers the sparsest series (one sample a minute: rules, job metrics) and lets the
# ended ones go about as quickly as staleness would.
LOOKBACK = "90s"
OUTAGE_S = 2.0  # wall seconds the OTLP backend is down at the start: retries, a full queue, drops

log = logging.getLogger("tools.demo_prometheus")


class PrometheusError(RuntimeError):
    """Prometheus refused a query or could not be started."""


def promtool_binary(prometheus: str | None = None) -> str | None:
    """$PROMTOOL, promtool beside the prometheus binary, or on PATH (Debian's prometheus package has it)."""
    if os.environ.get("PROMTOOL"):
        return os.environ["PROMTOOL"]
    if prometheus:
        beside = Path(prometheus).with_name("promtool")
        if os.access(beside, os.X_OK):
            return str(beside)
    return shutil.which("promtool")


def prometheus_binary() -> str | None:
    """$PROMETHEUS, else prometheus on PATH (collector/install-prometheus.sh installs it)."""
    found = os.environ.get("PROMETHEUS") or shutil.which("prometheus")
    if not found and os.access("/usr/bin/prometheus", os.X_OK):
        found = "/usr/bin/prometheus"
    return found


@dataclass
class Prometheus:
    """A running Prometheus's HTTP API."""

    url: str

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        url = f"{self.url}{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType')}: {body.get('error')} (query {params})")
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """An instant query: [{"metric": labels, "value": [t, "v"]}, ...] (vectors and scalars)."""
        data = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self._get("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{step:g}"})
        return data["result"]

    def label_values(self, label: str, match: str, start: float, end: float) -> list[str]:
        return self._get(f"/api/v1/label/{label}/values", {"match[]": match, "start": f"{start:.3f}",
                                                             "end": f"{end:.3f}"})

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False


@dataclass
class DemoData:
    prometheus: Prometheus
    start: float  # data time of the fleet's first window end (unix seconds)
    end: float  # data time of its last window end
    recording: Path  # the file exporter's OTLP JSON lines of the same run
    self_start: float  # wall time span of the self-telemetry (stamped when it is taken)
    self_end: float


def _demo_document(recording: Path, start_time: float, acceleration: float, sink_port: int,
                   exporters: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """demo.yaml, accelerated, into the prometheus exporter (with timestamps), a file and an OTLP backend.

    ``exporters`` (name -> config) also get the fleet's and the self-telemetry's metrics: the
    other roads into a backend, fed by the same run.
    """
    from otel_ofu.pipeline.config import load_document

    doc = load_document(DEMO_CONFIG)
    sim = doc["receivers"]["sim"]
    sim["time_acceleration"] = acceleration
    sim["start_time"] = datetime.fromtimestamp(start_time, UTC).isoformat()
    doc["receivers"]["selftelemetry"] = {"collection_interval": "250ms"}
    doc["exporters"] = {
        "prometheus": {"endpoint": "127.0.0.1:0", "send_timestamps": True, "metric_expiration": "1h",
                       "const_labels": {"cluster": CLUSTER}},
        "file": {"path": str(recording)},
        # An OTLP backend that is down for the first OUTAGE_S: the self-telemetry shows retries,
        # a full (small) queue and drops, then recovery.
        "otlphttp": {"endpoint": f"http://127.0.0.1:{sink_port}", "timeout": "2s",
                     "retry_on_failure": {"initial_interval": "100ms", "max_interval": "500ms",
                                          "max_elapsed_time": "1s"},
                     "sending_queue": {"queue_size": 10, "num_consumers": 2}},
    }
    pipelines = doc["service"]["pipelines"]
    pipelines["metrics"]["exporters"] = ["prometheus", "file"]
    # Per-GPU OFU only (no job events: the backend, otel-ofu's otlp receiver, takes metrics only).
    pipelines["metrics/backend"] = {"receivers": ["sim"], "processors": ["ofu"], "exporters": ["otlphttp"]}
    pipelines["metrics/self"] = {"receivers": ["selftelemetry"], "exporters": ["prometheus"]}
    for name, config in (exporters or {}).items():
        doc["exporters"][name] = config
        pipelines["metrics"]["exporters"].append(name)
        pipelines["metrics/self"]["exporters"].append(name)
    return doc


def _sink_service(port: int, workdir: Path):
    """The OTLP backend: another otel-ofu with an otlp receiver, writing what it gets to a file."""
    from otel_ofu.pipeline import registry
    from otel_ofu.pipeline.config import parse_service_config
    from otel_ofu.pipeline.service import Service

    doc = {"receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{port}"}}}},
           "exporters": {"file": {"path": str(workdir / "otlp-backend.jsonl")}},
           "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["file"]}}}}
    return Service(parse_service_config(doc, "otlp-backend", registry.factories()))


def namespace_of(job_id: str) -> str | None:
    for namespace, jobs in NAMESPACES.items():
        if job_id in jobs:
            return namespace
    return None


class GpuNamespaces:
    """The namespace of each series, as attribution would set it: its job's, else its GPU's last job's."""

    def __init__(self) -> None:
        self.of_gpu: dict[str, str] = {}  # hw_id -> namespace of the job seen on it

    def namespace(self, job_id: str | None, hw_id: str | None) -> str | None:
        namespace = namespace_of(job_id or "")
        if namespace and hw_id:
            self.of_gpu[hw_id] = namespace
        if namespace is None and job_id is None:
            namespace = self.of_gpu.get(hw_id or "")
        return namespace


class DemoResources:
    """The labels a real deployment adds outside otel-ofu, on the OTLP roads: ``k8s.namespace.name``
    (as attribution would) and ``cluster`` on every resource, as :class:`ExpositionRecorder` adds
    them to the scraped road's series."""

    def __init__(self) -> None:
        self.namespaces = GpuNamespaces()
        self._done: dict[int, tuple[Any, Any]] = {}  # id(resource) -> (resource, labelled): resources are reused

    def label(self, batch: Any) -> Any:
        from otel_ofu.core.model import Batch

        points = []
        for point in batch.points:
            found = self._done.get(id(point.resource))
            if found is None or found[0] is not point.resource:
                resource = dict(point.resource)
                extra = {"cluster": CLUSTER}
                job = resource.get("ofu.job.id")
                namespace = self.namespaces.namespace(None if job is None else str(job), resource.get("hw.id"))
                if namespace and "k8s.namespace.name" not in resource:
                    extra["k8s.namespace.name"] = namespace
                found = (point.resource, tuple(sorted({**resource, **extra}.items())))
                if job is not None:  # a job-less series takes its GPU's latest namespace: not kept
                    self._done[id(point.resource)] = found
            points.append(replace(point, resource=found[1]))
        return Batch(samples=batch.samples, points=points, passthrough=batch.passthrough, events=batch.events)


class ExpositionRecorder:
    """Every sample the exporter served, by family and series, as one OpenMetrics document.

    Called after each export: what a scrape at that moment would have returned (with the
    points' timestamps), so nothing depends on when a scraper happened to come by.
    """

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str, dict[tuple, dict[float, float]]]] = {}
        self.namespaces = GpuNamespaces()
        # A served timestamp (seconds, a float) -> the point's own nanoseconds: the float cannot say
        # which millisecond a point in a millisecond's last half microsecond falls in; OTLP's can.
        self.nanos: dict[float, int] = {}

    def record(self, exporter: Any, batch: Any) -> None:
        """What ``exporter`` serves after exporting ``batch`` (whose points give the exact times)."""
        self.nanos.update((p.time_unix_nano / 1e9, p.time_unix_nano) for p in batch.points if p.time_unix_nano)
        for metric in exporter.collect():
            if metric.type == "info":
                continue
            _, _, series = self.families.setdefault(metric.name, (metric.type, metric.documentation, {}))
            for sample in metric.samples:
                labels = dict(sample.labels)
                # As attribution would: the namespace of the job on the GPU, on every series of the GPU.
                namespace = self.namespaces.namespace(labels.get("ofu_job_id"), labels.get("hw_id"))
                if namespace and "k8s_namespace_name" not in labels:
                    labels["k8s_namespace_name"] = namespace
                if sample.timestamp is None:
                    continue
                key = (sample.name, tuple(sorted(labels.items())))
                series.setdefault(key, {})[float(sample.timestamp)] = sample.value

    def write(self, path: Path) -> int:
        def escape(value: str) -> str:
            return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

        count = 0
        with open(path, "w", encoding="utf-8") as out:
            for name, (kind, help_text, series) in sorted(self.families.items()):
                out.write(f"# TYPE {name} {kind}\n# HELP {name} {escape(help_text)}\n")
                for (sample_name, labels), points in sorted(series.items()):
                    text = ",".join(f'{k}="{escape(str(v))}"' for k, v in labels)
                    for t in sorted(points):
                        # Whole milliseconds, cut as a scrape of the exposition and OTLP's nanoseconds are.
                        nanos = self.nanos.get(t)
                        millis = nanos // 1_000_000 if nanos else math.floor(round(t * 1e6) / 1000)
                        out.write(f"{sample_name}{{{text}}} {points[t]!r} {millis // 1000}.{millis % 1000:03d}\n")
                        count += 1
            out.write("# EOF\n")
        return count


class PrometheusServer:
    """A Prometheus process on its own port, data folder and config, that can be restarted.

    ``config`` is the prometheus.yml text; ``flags`` are added to the command line (e.g.
    ``--web.enable-otlp-receiver``). The query lookback is :data:`LOOKBACK` (see there).
    """

    def __init__(self, binary: str, workdir: Path, *, config: str = "global:\n  evaluation_interval: 1m\n",
                 flags: tuple[str, ...] = (), data: Path | None = None) -> None:
        self.binary, self.workdir, self.flags = binary, workdir, flags
        self.data = data or workdir / "tsdb"
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(config)
        (self.port,) = free_ports(1)
        self.api = Prometheus(f"http://127.0.0.1:{self.port}")
        self.process: subprocess.Popen | None = None

    def start(self) -> PrometheusServer:
        log_file = self.workdir / "prometheus.log"
        with open(log_file, "ab") as out:
            self.process = subprocess.Popen(
                [self.binary, f"--config.file={self.workdir / 'prometheus.yml'}", f"--storage.tsdb.path={self.data}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=3650d",
                 f"--query.lookback-delta={LOOKBACK}", *self.flags],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir)
        _wait("prometheus to be ready", self.api.ready, 60, self.process, log_file)
        return self

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)
            self.process = None


def backfill_rules(server: PrometheusServer, promtool: str, start: float, end: float, rules: Path = RULES) -> None:
    """Evaluate the recording rules over [start, end] at 1m (``promtool tsdb create-blocks-from rules``
    against the server's API) and restart the server with the rules' blocks: Prometheus itself
    evaluates rules only at "now"."""
    rule_blocks = server.workdir / "rule-blocks"
    # From a whole minute, as vmalert (evaluation aligned to the group's interval) evaluates them too.
    first = (int(start) // 60) * 60
    _promtool(promtool, "tsdb", "create-blocks-from", "rules", f"--start={first}", f"--end={int(end) + 60}",
              f"--url={server.api.url}", "--eval-interval=1m", f"--output-dir={rule_blocks}", str(rules))
    server.stop()
    server.data.mkdir(parents=True, exist_ok=True)
    for block in rule_blocks.iterdir():
        shutil.move(str(block), server.data / block.name)
    server.start()


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _promtool(promtool: str, *args: str) -> None:
    done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise PrometheusError(f"promtool {' '.join(args[:3])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def _wait(what: str, check, timeout: float, process: subprocess.Popen | None = None, log_file: Path | None = None):
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if process is not None and process.poll() is not None:
            tail = log_file.read_text(errors="replace")[-3000:] if log_file else ""
            raise PrometheusError(f"prometheus exited (rc {process.returncode}) while waiting for {what}\n{tail}")
        if time.monotonic() > deadline:
            raise PrometheusError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def _wait_advancing(what: str, progress, target: float, stall_s: float = 60.0) -> None:
    """Wait until ``progress()`` reaches ``target``; fail only when it stops moving for ``stall_s``.

    How fast the demo simulates depends on the CPU it gets (a busy machine, tests in parallel), so
    no fixed deadline fits every machine; a simulation that stopped is what to report."""
    last, moved = progress(), time.monotonic()
    while last < target:
        time.sleep(0.1)
        now = progress()
        if now > last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall_s:
            raise PrometheusError(f"{what} stopped at {last:.0f} of {target:.0f} for {stall_s:.0f}s")


def run_demo(workdir: Path, *, span_s: float = 3600.0, acceleration: float = 600.0,
             exporters: dict[str, dict[str, Any]] | None = None,
             start_time: float | None = None) -> tuple[Path, float, float, float, float]:
    """Run the demo pipeline; (OpenMetrics file, data start, data end, self-telemetry start, end).

    ``exporters``: more exporters (name -> config) the fleet and self-telemetry metrics go to.
    ``start_time``: the data time the span starts at (default: so that it ends about now); in the past.
    """
    from otel_ofu.pipeline import registry
    from otel_ofu.pipeline.config import parse_service_config
    from otel_ofu.pipeline.service import Service

    workdir.mkdir(parents=True, exist_ok=True)
    (sink_port,) = free_ports(1)
    wall_s = span_s / acceleration
    # Half a second off the whole minute: no point lies on the boundary of a query's or a rule's
    # window (rules run on whole minutes), where engines differ on whether it counts (Prometheus 3
    # takes (t - range, t], VictoriaMetrics also the point at t - range).
    if start_time is None:
        start_time = math.floor(time.time() - span_s - wall_s) + 0.5
    doc = _demo_document(workdir / "demo.jsonl", start_time, acceleration, sink_port, exporters)
    service = Service(parse_service_config(doc, str(DEMO_CONFIG), registry.factories()))
    sink = _sink_service(sink_port, workdir)
    exporter = service.exporters["prometheus"].exporter
    recorder = ExpositionRecorder()
    export = exporter.export

    def export_and_record(batch: Any) -> None:
        export(batch)
        recorder.record(exporter, batch)

    exporter.export = export_and_record  # type: ignore[method-assign]
    resources = DemoResources()
    for name in exporters or {}:
        road = service.exporters[name].exporter
        road.export = (lambda send: lambda batch: send(resources.label(batch)))(road.export)  # type: ignore[method-assign]
    self_start = time.time()
    service.start()
    sim = service.receivers["sim"]
    sink_started = False
    try:
        time.sleep(min(OUTAGE_S, wall_s / 3))
        sink.start()
        sink_started = True
        _wait_advancing("the simulated span", lambda: sim.fleet.t if sim.fleet is not None else 0.0, span_s)
    finally:
        service.shutdown()
        if sink_started:
            sink.shutdown()
    self_end = time.time()
    samples = recorder.write(workdir / "demo.om")
    log.info("recorded %d samples of %d families", samples, len(recorder.families))
    return workdir / "demo.om", start_time + 10.0, start_time + span_s, self_start, self_end


@contextlib.contextmanager
def demo_in_prometheus(workdir: Path, prometheus_bin: str, promtool_bin: str, *, span_s: float = 3600.0,
                       acceleration: float = 600.0) -> Iterator[DemoData]:
    """Run the demo for ``span_s`` of fleet time, load it and the recording rules into a fresh
    Prometheus, and yield it for queries."""
    openmetrics, start, end, self_start, self_end = run_demo(workdir, span_s=span_s, acceleration=acceleration)
    with exposition_in_prometheus(workdir / "prometheus", prometheus_bin, promtool_bin, openmetrics, start,
                                  max(end, self_end)) as server:
        yield DemoData(server.api, start, end, workdir / "demo.jsonl", self_start, self_end)


@contextlib.contextmanager
def exposition_in_prometheus(workdir: Path, prometheus_bin: str, promtool_bin: str, openmetrics: Path, start: float,
                             end: float) -> Iterator[PrometheusServer]:
    """The recorded exposition as TSDB blocks in a fresh Prometheus, with the recording rules backfilled."""
    server = PrometheusServer(prometheus_bin, workdir)
    _promtool(promtool_bin, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(openmetrics), str(server.data))
    try:
        server.start()
        backfill_rules(server, promtool_bin, start, end)
        yield server
    finally:
        server.stop()
