"""Processing stage: otel-ofu behind a Collector against the Collector's own OTLP pass-through, CPU per point.

Why: otel-ofu's main role is a processing stage in a Collector pipeline (docs/collector.md): a
Collector scrapes dcgm-exporter on every node and forwards OTLP; otel-ofu computes OFU and
forwards everything on. Its cost per point is compared with what the same requests cost the
Collector when it only forwards them. In one run, on the same requests:

- the Collector (``collector/build.sh``): otlp receiver -> otlp exporter, nothing between;
- otel-ofu with ``collector-config/processor-stage.yaml`` (otlp receiver with ``passthrough``
  -> ``ofu`` with ``emit_inputs`` -> otlp exporter),

each exporting to a sink served by this process. ``--protocol grpc`` (the headline) sends
OTLP/gRPC with compression off on both sides (both exporters' ``compression: none``);
``--protocol http`` sends OTLP/HTTP protobuf with gzip on both sides (the requests gzipped,
both exporters OTLP/HTTP with ``compression: gzip``), which is what most Collectors send.
Both run by default, one after the other.

The workload is what a Collector's ``prometheus`` receiver (contrib v0.161.0) makes of a
dcgm-exporter scrape and its otlp exporter sends, built here from that receiver's code
(receiver/prometheusreceiver/internal/transaction.go, metricfamily.go, prom_to_otlp.go): one
ResourceMetrics per node (resource ``service.name``, ``server.address``,
``service.instance.id``, ``server.port``, ``url.scheme``; scope
``github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver``),
12 gauges per node (dcgm-exporter's SM clock, tensor active, memory clock, temperature,
power, GPU util, memory copy util, FB free, FB used, GR engine active, SM active, DRAM
active; HELP text as description, metadata ``prometheus.type=gauge``) with one point per GPU
(8 per node; labels ``Hostname``, ``UUID``, ``device``, ``gpu``, ``modelName``,
``pci_bus_id``, sorted as Prometheus sorts them; the scrape's millisecond time; the value as
a double). The receiver appends a scrape's metrics by ranging over a Go map, so their order
differs from scrape to scrape: ``--order shuffled`` (the default) does that, ``--order
fixed`` keeps dcgm-exporter's order. 40 nodes per request, a fleet of 200 nodes, each node
once per 10 s window, ``--windows`` windows of data time (sent as fast as they are taken).

Windows go to the two processes in turn (which one goes first alternates), each window's
requests 5 at a time, and the next waits until the sink has everything: for the Collector
every point, for otel-ofu every passed-through point and one ``gpu.ofu`` per GPU. CPU is
user + system time of each process from /proc/PID/stat over the same span (idle time while
the other works included). ``ratio_to_collector`` = otel-ofu's points per CPU-second / the
Collector's, points being the points sent: the steady state (every window after the first)
is the headline, the first window (every GPU new to otel-ofu) beside it.

    python benchmarks/stage.py --json                          # both protocols, 30 windows
    python benchmarks/stage.py --protocol grpc --windows 60    # the headline only, longer
    python benchmarks/stage.py --json --pod-labels             # each GPU labelled with its pod (the job named)
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import yaml
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, ResourceMetrics

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fleet import cpu_seconds, wait_port  # noqa: E402
from overload import stop_processes  # noqa: E402
from sidecar import status_kb  # noqa: E402

from otel_ofu.otlp.wire import fields  # noqa: E402
from tools.collector_layout import as_collector_writes  # noqa: E402
from tools.ports import free_ports  # noqa: E402

EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
SCOPE = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver"
COLLECTOR_VERSION = "0.161.0-ofu"  # the scope version: the build's (collector/manifest.yaml)
JOB = "dcgm-exporter"
EXPORTER_PORT = 9400
GPUS_PER_NODE = 8
INTERVAL_S = 10
T0_MS = 1_767_225_600_000
MODEL = "NVIDIA H100 80GB HBM3"
GZIP_LEVEL = 6  # the Collector's gzip level (configcompression.DefaultCompressionLevel: zlib's default)

# dcgm-exporter's default counters in its order (etc/default-counters.csv), with their HELP
# text; a typical value and its spread for the readings (a training job's: its memory traffic
# steady from one window to the next, its tensor, SM and engine activity nested, see scrape()).
FIELDS: tuple[tuple[str, str, float, float], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", 1755.0, 225.0),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", 0.45, 0.4),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", 2619.0, 0.0),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", 58.0, 12.0),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", 540.0, 150.0),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 90.0, 10.0),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", 38.0, 20.0),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", 9000.0, 4000.0),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", 72000.0, 4000.0),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", 0.9, 0.1),
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", 0.85, 0.15),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data.",
     0.4, 0.04),
)
INPUTS = frozenset({"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"})  # what otel-ofu consumes
PASSED = tuple(name for name, *_ in FIELDS if name not in INPUTS)


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


@dataclass
class Node:
    """One node's dcgm-exporter target: its scrape as the Collector writes it, with each point's time
    and value to fill in (the resource, the labels, the names are the same every scrape)."""

    offset_ms: int  # when in each window its scrape happens
    template: bytes  # its ResourceMetrics as a request field, as the Collector serializes it
    head: int  # where its first metric field starts in the template
    metrics: list[tuple[str, int, int]]  # each metric field's name and span in the template, in FIELDS order
    slots: dict[str, list[tuple[int, int]]]  # per metric, each GPU's (time, value) offsets in the template


_T_MARK, _V_MARK = 0x7E57_0000_0000_0000, 1.0e-300  # distinct per point, found again in the bytes


def fleet(nodes: int, seed: int, pod_labels: bool = False) -> list[Node]:
    """The fleet's nodes: each scrape built once with protobuf as the prometheus receiver makes it, then
    laid out as the Collector's pdata writes it (tools/collector_layout.py). ``pod_labels``: each GPU
    also labelled with the pod holding it, as dcgm-exporter in Kubernetes mode labels it (``container``,
    ``namespace``, ``pod``: one training pod per node holding its 8 GPUs), which the stage's
    ``attribution`` processor names the job from."""
    out = []
    rng = random.Random(seed)
    for n in range(nodes):
        host = f"gpu-node-{n:04d}"
        instance = f"{host}:{EXPORTER_PORT}"
        rm = ResourceMetrics()
        rm.resource.attributes.extend([_kv("service.name", JOB), _kv("server.address", host),
                                       _kv("service.instance.id", instance), _kv("server.port", str(EXPORTER_PORT)),
                                       _kv("url.scheme", "http")])
        sm = rm.scope_metrics.add()
        sm.scope.name = SCOPE
        sm.scope.version = COLLECTOR_VERSION
        gpus = []
        for g in range(GPUS_PER_NODE):
            h = f"{rng.getrandbits(128):032x}"
            labels = {"Hostname": host, "UUID": f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}",
                      "device": f"nvidia{g}", "gpu": str(g), "modelName": MODEL,
                      "pci_bus_id": f"00000000:{0x18 + 0x10 * g:02X}:00.0"}
            if pod_labels:
                labels.update({"container": "pytorch", "namespace": "training", "pod": f"llama-worker-{n}"})
            gpus.append([_kv(k, labels[k]) for k in sorted(labels)])  # Prometheus label sets are sorted
        marks = iter(range(len(FIELDS) * GPUS_PER_NODE))
        for name, help_text, _, _ in FIELDS:
            metric = sm.metrics.add(name=name, description=help_text, metadata=[_kv("prometheus.type", "gauge")])
            for labels in gpus:
                mark = next(marks)
                metric.gauge.data_points.add(time_unix_nano=_T_MARK + mark, as_double=_V_MARK * (mark + 2),
                                             attributes=labels)
        template = as_collector_writes(ExportMetricsServiceRequest(resource_metrics=[rm]).SerializeToString())
        marks = iter(range(len(FIELDS) * GPUS_PER_NODE))
        slots = {name: [(template.index(struct.pack("<Q", _T_MARK + mark)),
                         template.index(struct.pack("<d", _V_MARK * (mark + 2))))
                        for mark in (next(marks) for _ in range(GPUS_PER_NODE))] for name, *_ in FIELDS}
        # Each metric's field (tag, length, Metric): adjacent in the scope_metrics field, in FIELDS order.
        ((_, _, rm_start, rm_end),) = fields(template, 0, len(template))
        scope = next(f for f in fields(template, rm_start, rm_end) if f[0] == 0x12)
        spans = {Metric.FromString(template[p_start:f_end]).name: (f_start, f_end)
                 for tag, f_start, p_start, f_end in fields(template, scope[2], scope[3]) if tag == 0x12}
        out.append(Node(rng.randrange(INTERVAL_S * 1000), template, min(a for a, _ in spans.values()),
                        [(name, *spans[name]) for name, *_ in FIELDS], slots))
    return out


def scrape(node: Node, window: int, rng: random.Random, shuffled: bool) -> bytes:
    """One scrape of ``node`` in ``window``, as the Collector sends it: new readings, and the metrics in a
    new order when ``shuffled`` (the prometheus receiver ranges over a Go map)."""
    t_ns = (T0_MS + window * INTERVAL_S * 1000 + node.offset_ms) * 1_000_000
    buf = bytearray(node.template)
    readings = {name: [typical + spread * (2 * rng.random() - 1) for _ in range(GPUS_PER_NODE)]
                for name, _, typical, spread in FIELDS}
    # The activity ratios nest as on a GPU (a tensor cycle is an SM cycle is an engine cycle): each
    # level is the one below plus its own varying share, at most 1.
    for inner, outer in zip(_NESTED, _NESTED[1:]):
        gap = _TYPICAL[outer] - _TYPICAL[inner]
        readings[outer] = [min(1.0, below + gap * (0.5 + rng.random())) for below in readings[inner]]
    for name, _, typical, _ in FIELDS:
        for (t_at, v_at), value in zip(node.slots[name], readings[name]):
            if name == "DCGM_FI_DEV_SM_CLOCK":
                value = float(round(value / 15) * 15)
            elif typical >= 10:
                value = float(round(value))
            else:
                value = round(value, 6)  # dcgm-exporter prints %f
            _TIME.pack_into(buf, t_at, t_ns)
            _VALUE.pack_into(buf, v_at, value)
    spans = [(a, b) for _, a, b in node.metrics]
    if shuffled:
        rng.shuffle(spans)
    end = max(b for _, _, b in node.metrics)
    return bytes(buf[:node.head]) + b"".join(buf[a:b] for a, b in spans) + bytes(buf[end:])


_TIME, _VALUE = struct.Struct("<Q"), struct.Struct("<d")
_TYPICAL = {name: typical for name, _, typical, _ in FIELDS}
_NESTED = ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE")


def window_requests(nodes: list[Node], window: int, per_request: int, seed: int, shuffled: bool) -> list[bytes]:
    """One window of the fleet, ``per_request`` nodes per serialized ExportMetricsServiceRequest."""
    rng = random.Random(seed * 1_000_003 + window)
    return [b"".join(scrape(node, window, rng, shuffled) for node in nodes[first:first + per_request])
            for first in range(0, len(nodes), per_request)]


# --- the sink: counts what arrives, by metric name ------------------------------------------------


class Sink:
    """An OTLP/gRPC or OTLP/HTTP (gzip understood) server counting data points by metric name."""

    def __init__(self, protocol: str) -> None:
        self.points: Counter[str] = Counter()
        self.requests = 0
        self._lock = threading.Lock()
        self._grpc = self._http = None
        if protocol == "grpc":
            self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                                     options=[("grpc.max_receive_message_length", 64 << 20)])
            handler = grpc.method_handlers_generic_handler(
                "opentelemetry.proto.collector.metrics.v1.MetricsService",
                {"Export": grpc.unary_unary_rpc_method_handler(self._grpc_export)})
            self._grpc.add_generic_rpc_handlers((handler,))
            self.port = self._grpc.add_insecure_port("127.0.0.1:0")
            self._grpc.start()
        else:
            sink = self

            class Handler(BaseHTTPRequestHandler):
                protocol_version = "HTTP/1.1"

                def log_message(self, *args: object) -> None:
                    pass

                def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                    body = self.rfile.read(int(self.headers["Content-Length"]))
                    if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                        body = gzip.decompress(body)
                    sink.record(body)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", "0")
                    self.end_headers()

            self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            self._http.daemon_threads = True
            self.port = self._http.server_address[1]
            threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def _grpc_export(self, body: bytes, context: object) -> bytes:
        self.record(body)
        return b""

    def record(self, body: bytes) -> None:
        counts: Counter[str] = Counter()
        for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    if kind:
                        counts[metric.name] += len(getattr(metric, kind).data_points)
        with self._lock:
            self.points.update(counts)
            self.requests += 1

    def count(self, names: tuple[str, ...] | None = None) -> int:
        with self._lock:
            return sum(self.points.values()) if names is None else sum(self.points[n] for n in names)

    def stop(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=None).wait()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()


# --- the two processes ------------------------------------------------------------------------------


def collector_config(protocol: str, grpc_port: int, http_port: int, sink_port: int) -> dict:
    """The Collector's plain pass-through: otlp receiver -> otlp exporter, nothing between."""
    if protocol == "grpc":
        exporter = ("otlp_grpc", {"endpoint": f"127.0.0.1:{sink_port}", "tls": {"insecure": True},
                                  "compression": "none"})
    else:
        exporter = ("otlp_http", {"endpoint": f"http://127.0.0.1:{sink_port}", "compression": "gzip"})
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                                             "http": {"endpoint": f"127.0.0.1:{http_port}"}}}},
        "exporters": {exporter[0]: exporter[1]},
        "service": {"telemetry": {"metrics": {"level": "none"}},
                    "pipelines": {"metrics": {"receivers": ["otlp"], "exporters": [exporter[0]]}}},
    }


def stage_config(protocol: str, sink_port: int, loss: bool = True) -> dict:
    """collector-config/processor-stage.yaml with its exporter's compression set (and over HTTP for ``http``);
    ``loss`` False: the ofu processor's loss account off."""
    config = yaml.safe_load((ROOT / "collector-config" / "processor-stage.yaml").read_text())
    if not loss:
        config["processors"]["ofu"]["loss"] = {"enabled": False}
    exporter = config["exporters"].pop("otlp")
    if protocol == "grpc":
        exporter.update(endpoint=f"127.0.0.1:{sink_port}", compression="none")
        name = "otlp"
    else:
        exporter.pop("tls", None)
        exporter.update(endpoint=f"http://127.0.0.1:{sink_port}", compression="gzip")
        name = "otlphttp"
    config["exporters"][name] = exporter
    for pipeline in config["service"]["pipelines"].values():  # the data, and otel-ofu's own metrics
        pipeline["exporters"] = [name if e == "otlp" else e for e in pipeline["exporters"]]
    return config


class Target:
    """One process under test: where to send, what the sink must see, its CPU so far."""

    def __init__(self, name: str, proc: subprocess.Popen, port: int, sink: Sink, protocol: str):
        self.name, self.proc, self.port, self.sink, self.protocol = name, proc, port, sink, protocol
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port}",
                                              options=[("grpc.max_send_message_length", 64 << 20)]) \
            if protocol == "grpc" else None
        self._http: http.client.HTTPConnection | None = None

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def send(self, bodies: list[bytes], in_flight: int = 5) -> None:
        """Every request; a refused one (the receiver busy) is sent again after a pause."""
        if self._channel is not None:
            export = self._channel.unary_unary(EXPORT)
            for start in range(0, len(bodies), in_flight):
                pending = [(export.future(body, timeout=60), body) for body in bodies[start:start + in_flight]]
                for future, body in pending:
                    while True:
                        try:
                            future.result()
                            break
                        except grpc.RpcError as exc:
                            if exc.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                                raise
                            time.sleep(0.05)
                            future = export.future(body, timeout=60)
            return
        for body in bodies:
            while True:
                if self._http is None:
                    self._http = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                self._http.request("POST", "/v1/metrics", body, {"Content-Type": "application/x-protobuf",
                                                                 "Content-Encoding": "gzip"})
                response = self._http.getresponse()
                response.read()
                if response.status == 200:
                    break
                if response.status not in (429, 503):
                    raise RuntimeError(f"{self.name}: HTTP {response.status}")
                time.sleep(0.05)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        if self._http is not None:
            self._http.close()


@dataclass
class Done:
    """What the sink of a target must have seen after some windows."""

    names: tuple[str, ...] | None  # None: every point
    per_window: int


def wait_done(target: Target, done: Done, windows: int, timeout: float = 300) -> None:
    want = done.per_window * windows
    deadline = time.monotonic() + timeout
    while target.sink.count(done.names) < want:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{target.name}: the sink has {target.sink.count(done.names)} of {want} points")
        if target.proc.poll() is not None:
            raise RuntimeError(f"{target.name} exited with {target.proc.returncode}")
        time.sleep(0.002)


@dataclass
class Span:
    """CPU seconds per process over a span of windows."""

    windows: int = 0
    cpu: dict[str, float] = field(default_factory=dict)


def run(protocol: str, otelcol: str, nodes: list[Node], windows: int, per_request: int, seed: int, shuffled: bool,
        work: Path, py_spy: str | None = None, loss: bool = True) -> dict:
    procs: list[subprocess.Popen] = []
    sampler: subprocess.Popen | None = None
    sinks = [Sink(protocol), Sink(protocol)]
    targets: list[Target] = []
    try:
        c_grpc, c_http, o_grpc, o_http = free_ports(4)
        collector_yaml = work / f"collector-{protocol}.yaml"
        collector_yaml.write_text(yaml.safe_dump(collector_config(protocol, c_grpc, c_http, sinks[0].port)))
        stage_yaml = work / f"stage-{protocol}.yaml"
        stage_yaml.write_text(yaml.safe_dump(stage_config(protocol, sinks[1].port, loss), sort_keys=False))
        collector = subprocess.Popen([otelcol, f"--config=file:{collector_yaml}"], cwd=ROOT,
                                     stdout=open(work / f"collector-{protocol}.log", "wb"), stderr=subprocess.STDOUT)
        procs.append(collector)
        stage = subprocess.Popen([sys.executable, "-m", "otel_ofu", "run", "--config", str(stage_yaml)], cwd=ROOT,
                                 env={**os.environ, "OFU_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{o_grpc}",
                                      "OFU_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{o_http}"},
                                 stdout=open(work / f"stage-{protocol}.log", "wb"), stderr=subprocess.STDOUT)
        procs.append(stage)
        for port, proc in ((c_grpc, collector), (c_http, collector), (o_grpc, stage), (o_http, stage)):
            wait_port(port, proc)
        http_mode = protocol == "http"
        targets = [Target("collector", collector, c_http if http_mode else c_grpc, sinks[0], protocol),
                   Target("otel-ofu", stage, o_http if http_mode else o_grpc, sinks[1], protocol)]
        gpus = len(nodes) * GPUS_PER_NODE
        done = {"collector": Done(None, gpus * len(FIELDS)),
                "otel-ofu": Done(PASSED, gpus * len(PASSED))}
        ofu_done = Done(("gpu.ofu",), gpus)
        rss0 = status_kb(stage.pid, "VmRSS")
        if py_spy:  # sampled from outside, the thread holding the GIL; written when otel-ofu exits
            sampler = subprocess.Popen(["py-spy", "record", "--pid", str(stage.pid), "--rate", "250", "--format",
                                        "raw", "--output", f"{py_spy}-{protocol}.txt", "--nonblocking", "--gil"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        generate_s = 0.0
        marks: list[dict[str, float]] = [{t.name: t.cpu() for t in targets}]
        t_start = time.monotonic()
        for w in range(windows):
            t = time.perf_counter()
            bodies = window_requests(nodes, w, per_request, seed, shuffled)
            if http_mode:
                bodies = [gzip.compress(b, compresslevel=GZIP_LEVEL, mtime=0) for b in bodies]
            generate_s += time.perf_counter() - t
            for target in (targets if w % 2 == 0 else targets[::-1]):
                target.send(bodies)
                wait_done(target, done[target.name], w + 1)
                if target.name == "otel-ofu":
                    wait_done(target, ofu_done, w + 1)
            if w == 0:
                marks.append({t.name: t.cpu() for t in targets})
        marks.append({t.name: t.cpu() for t in targets})
        wall = time.monotonic() - t_start
        rss1, hwm = status_kb(stage.pid, "VmRSS"), status_kb(stage.pid, "VmHWM")
        in_per_window = gpus * len(FIELDS)
        tick = 1 / os.sysconf("SC_CLK_TCK")

        def span(a: int, b: int, n: int) -> dict:
            cpu = {name: max(marks[b][name] - marks[a][name], tick) for name in marks[a]}
            points = in_per_window * n
            rates = {name: points / cpu[name] for name in cpu}
            return {"windows": n, "points": points, "cpu_s": cpu, "points_per_cpu_s": rates,
                    "ratio_to_collector": rates["otel-ofu"] / rates["collector"]}

        first = span(0, 1, 1)
        steady = span(1, 2, windows - 1) if windows > 1 else first
        out_points = {t.name: t.sink.count() for t in targets}
        return {
            "protocol": protocol, "compression": "gzip" if http_mode else "none",
            "ratio_to_collector": steady["ratio_to_collector"],
            "first_window_ratio_to_collector": first["ratio_to_collector"],
            "steady": steady, "first_window": first,
            "points_in": in_per_window * windows, "points_out": out_points,
            "complete": out_points["collector"] == in_per_window * windows,
            "otel_ofu_rss_mb": {"start": rss0 / 1024, "end": rss1 / 1024, "peak": hwm / 1024,
                                "growth_kb_per_gpu": (rss1 - rss0) / gpus},
            "wall_s": wall, "generate_s": generate_s,
        }
    finally:
        for target in targets:
            target.close()
        stop_processes(procs, timeout=30)
        if sampler is not None:
            sampler.wait(60)
        for sink in sinks:
            sink.stop()


def stage_in_process(protocol: str) -> tuple[object, list]:
    """The stage's request path in this process, as the service wires it from processor-stage.yaml:
    the otlp receiver's ``accept`` (decode, join, pass-through), the ``attribution`` and ``ofu`` processors, the
    exporter's payload (gzipped for ``http``). Returns (receiver, payloads made)."""
    from otel_ofu.core.model import Batch
    from otel_ofu.otlp.payload import metrics_payload
    from otel_ofu.pipeline.component import Context
    from otel_ofu.pipeline.config import build_config, substitute_env
    from otel_ofu.processors.attribution import FACTORY as ATTRIBUTION
    from otel_ofu.processors.ofu import FACTORY as OFU
    from otel_ofu.receivers.otlp import FACTORY as OTLP

    config = substitute_env(stage_config(protocol, 0), {})
    attribution = ATTRIBUTION.create(build_config(ATTRIBUTION.config_type, config["processors"]["attribution"]),
                                     Context("attribution"))
    ofu = OFU.create(build_config(OFU.config_type, config["processors"]["ofu"]), Context("ofu"))
    payloads: list = []

    def consume(batch: Batch) -> None:
        batch = ofu.process(attribution.process(batch))
        payload = metrics_payload(batch.points_and_rows(), batch.passthrough)  # as the exporter does
        if payload is not None and protocol == "http":
            payload = (gzip.compress(payload[0], compresslevel=GZIP_LEVEL, mtime=0), payload[1])
        payloads.append(payload)

    receiver_config = dict(config["receivers"]["otlp"])
    receiver_config.pop("protocols")
    receiver = OTLP.create(build_config(OTLP.config_type, receiver_config), Context("otlp"), consume)
    return receiver, payloads


def profile(protocol: str, nodes: list[Node], windows: int, per_request: int, seed: int, shuffled: bool,
            top: int = 25) -> str:
    """cProfile of the stage's request path (:func:`stage_in_process`) over the windows after the first."""
    import cProfile
    import io
    import pstats

    from otel_ofu.cli.run import tune_runtime
    from otel_ofu.receivers.otlp import _decompress

    tune_runtime()  # as `otel-ofu run` does
    receiver, _ = stage_in_process(protocol)

    def one(body: bytes) -> None:
        if protocol == "http":
            body = _decompress(body, "gzip", 64 << 20)
        receiver.accept(None, protocol, body)  # type: ignore[attr-defined]

    def bodies(w: int) -> list[bytes]:
        out = window_requests(nodes, w, per_request, seed, shuffled)
        return [gzip.compress(b, compresslevel=GZIP_LEVEL, mtime=0) for b in out] if protocol == "http" else out

    for body in bodies(0):
        one(body)
    prof = cProfile.Profile()
    for w in range(1, max(2, windows)):
        batch = bodies(w)
        prof.enable()
        for body in batch:
            one(body)
        prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def memory(nodes: list[Node], windows: int, per_request: int, seed: int, shuffled: bool) -> dict:
    """What the stage keeps between requests, per GPU: Python memory (tracemalloc) after ``windows``
    windows through :func:`stage_in_process`, and after the memory limiter's release of the caches."""
    import gc
    import tracemalloc

    from otel_ofu.pipeline import caches

    caches.release_all()
    gc.collect()
    tracemalloc.start()
    receiver, payloads = stage_in_process("grpc")
    base = tracemalloc.get_traced_memory()[0]
    for w in range(windows):
        for body in window_requests(nodes, w, per_request, seed, shuffled):
            # Parsed first, as every version of the receiver takes it: the same caches fill either way.
            receiver.accept(ExportMetricsServiceRequest.FromString(body), "grpc", body)  # type: ignore[attr-defined]
            payloads.clear()
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    entries = caches.entries()
    caches.release_all()
    gc.collect()
    released = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    gpus = len(nodes) * GPUS_PER_NODE
    return {"gpus": gpus, "windows": windows, "held_bytes": held, "held_bytes_per_gpu": held / gpus,
            "cache_entries": entries, "after_release_bytes_per_gpu": released / gpus}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=["grpc", "http", "both"], default="both",
                        help="grpc: OTLP/gRPC, compression off; http: OTLP/HTTP, gzip on both sides (default both)")
    parser.add_argument("--nodes", type=int, default=200, help="8-GPU nodes in the fleet (default 200)")
    parser.add_argument("--per-request", type=int, default=40, help="nodes per request (default 40)")
    parser.add_argument("--windows", type=int, default=30, help="10 s windows of data time (default 30)")
    parser.add_argument("--order", choices=["shuffled", "fixed"], default="shuffled",
                        help="metric order per scrape: shuffled as the prometheus receiver's Go map, or fixed")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true",
                        help="instead: cProfile the stage's request path in this process (no Collector)")
    parser.add_argument("--no-loss", action="store_true",
                        help="the ofu processor's loss account off (processors.ofu.loss.enabled: false): its cost")
    parser.add_argument("--py-spy", metavar="PREFIX", default=None,
                        help="also sample otel-ofu with py-spy (pip install py-spy) into PREFIX-<protocol>.txt "
                             "(collapsed stacks); the figures of such a run include py-spy's reading")
    parser.add_argument("--memory", action="store_true",
                        help="instead: the stage's memory per GPU kept between requests, in this process")
    parser.add_argument("--pod-labels", action="store_true",
                        help="label each GPU with its pod (dcgm-exporter in Kubernetes mode: container, namespace, "
                             "pod), so attribution names a job for every GPU")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    nodes = fleet(args.nodes, args.seed, args.pod_labels)
    protocols = ["grpc", "http"] if args.protocol == "both" else [args.protocol]
    if args.memory:
        found = memory(nodes, max(1, args.windows), args.per_request, args.seed, args.order == "shuffled")
        if args.json:
            print(json.dumps(found))
        else:
            print(f"memory kept by the stage: {found['held_bytes_per_gpu']:,.0f} bytes per GPU after "
                  f"{found['windows']} windows of {found['gpus']:,} GPUs ({found['cache_entries']:,} cache entries); "
                  f"{found['after_release_bytes_per_gpu']:,.0f} after the memory limiter's release")
        return 0
    if args.profile:
        for protocol in protocols:
            print(f"--- {protocol}\n" + profile(protocol, nodes, args.windows, args.per_request, args.seed,
                                                  args.order == "shuffled"))
        return 0
    otelcol = os.environ.get("OTELCOL") or subprocess.run(
        [str(ROOT / "collector" / "build.sh")], capture_output=True, text=True,
        check=True).stdout.strip().splitlines()[-1]
    runs = {}
    with tempfile.TemporaryDirectory(prefix="ofu-stage-") as tmp:
        for protocol in protocols:
            runs[protocol] = run(protocol, otelcol, nodes, max(1, args.windows), args.per_request, args.seed,
                                 args.order == "shuffled", Path(tmp), args.py_spy, not args.no_loss)
    headline = runs[protocols[0]]
    out = {
        "ratio_to_collector": headline["ratio_to_collector"],
        "first_window_ratio_to_collector": headline["first_window_ratio_to_collector"],
        "protocol": headline["protocol"],
        "gzip_ratio_to_collector": runs["http"]["ratio_to_collector"] if "http" in runs else None,
        "gzip_first_window_ratio_to_collector": runs["http"]["first_window_ratio_to_collector"]
        if "http" in runs else None,
        "nodes": args.nodes, "gpus": args.nodes * GPUS_PER_NODE, "per_request": args.per_request,
        "windows": args.windows, "order": args.order, "loss_account": not args.no_loss, "pod_labels": args.pod_labels,
        "cores": os.cpu_count(), "complete": all(r["complete"] for r in runs.values()), "runs": runs,
    }
    if args.json:
        json.dump(out, sys.stdout)
        print()
        return 0
    print(f"processing stage: {args.nodes} nodes ({out['gpus']:,} GPUs), {args.per_request} nodes per request, "
          f"{args.windows} windows, metric order {args.order}, {os.cpu_count()} cores")
    for r in runs.values():
        s, f = r["steady"], r["first_window"]
        print(f"\n{r['protocol']} (compression {r['compression']}): {r['points_in']:,} points in")
        print(f"  steady ({s['windows']} windows): Collector {s['points_per_cpu_s']['collector']:12,.0f} points per "
              f"CPU-s ({s['cpu_s']['collector']:.2f} s), otel-ofu {s['points_per_cpu_s']['otel-ofu']:12,.0f} "
              f"({s['cpu_s']['otel-ofu']:.2f} s): ratio_to_collector {s['ratio_to_collector']:.2f}")
        print(f"  first window      : Collector {f['cpu_s']['collector']:.2f} s, otel-ofu {f['cpu_s']['otel-ofu']:.2f} "
              f"s: ratio {f['ratio_to_collector']:.2f}")
        print(f"  otel-ofu RSS {r['otel_ofu_rss_mb']['start']:.0f} -> {r['otel_ofu_rss_mb']['end']:.0f} MB "
              f"(peak {r['otel_ofu_rss_mb']['peak']:.0f}); points out: {r['points_out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
