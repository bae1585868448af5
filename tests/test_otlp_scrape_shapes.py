"""A dcgm-exporter scrape read by its node's learned shape (otel_ofu.otlp.join.scrapes) against the message path.

The otlp receiver learns a node's shape the first time it reads the node's scrape through
protobuf objects, and reads its later scrapes from their bytes alone, whatever the order of
their metrics. The result must be the message path's, request after request: the same GPU
samples (every field, in the same order), the same pass-through (the same bytes and point
counts), the same decoded points. Checked on random requests around the shape a Collector's
Prometheus receiver makes (hypothesis), on the workload of benchmarks/stage.py, and on what
the real Collector makes of every dcgm-exporter page of the corpus (tests/data/real/).
"""

from __future__ import annotations

import contextlib
import math
import random
import re
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE, ResourceMetrics

from otel_ofu.otlp import join as otlp_join
from otel_ofu.otlp.join.scrapes import ScrapeShapes
from otel_ofu.otlp.wire import ShapeStore
from otel_ofu.receivers.otlp import DEFAULT_DECODE
from tests.e2e_util import PageServer, Process, require_alive, wait_for
from tests.otlp_shapes import _kv
from tools.collector_layout import as_collector_writes

DECODE = frozenset(DEFAULT_DECODE)
T0 = 1_767_225_600_000_000_000
SCOPE = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver"
BLANKS = (0x7FFFFFF0, 0x7FFFFFF0 + 2, 9223372036854775794, 140737488355328.0)  # DCGM blank sentinels

# Metric names a scrape may carry: the join's inputs in every spelling (old, 4.6 renamed, base-unit,
# 1.x compatibility), metrics that pass through, one the receiver decodes, one of dcgmreceiver's.
INPUTS = ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MAX_SM_CLOCK",
          "DCGM_FI_PROF_TENSOR_UTIL_RATIO", "DCGM_FI_DEV_SM_CLOCK_HERTZ", "DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ",
          "dcgm_sm_clock", "dcgm_fi_prof_pipe_tensor_active")
PASSED = ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED",
          # the loss account's ratios, read and passed on, by their names up to DCGM 4.5 and since 4.6
          "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE",
          "DCGM_FI_PROF_DRAM_UTIL_RATIO", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", "DCGM_FI_PROF_SM_UTIL_RATIO",
          # the ledger's counters (issue 34), read and passed on: energy in mJ and J, traffic, clock event time
          "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", "DCGM_FI_PROF_PCIE_TX_BYTES",
          "dcgm_fi_prof_pcie_rx_bytes", "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES",
          "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS", "DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS")
# ... and dcgmreceiver's (an input, a ratio it keeps), a metric by which the join notices a source that gives no OFU.
OTHERS = ("gpu.ofu", "gpu.dcgm.clock.frequency", "gpu.dcgm.sm.utilization", "nvidia_smi_gpu_info")


# --- the comparison ---------------------------------------------------------------------------------


def _split(body: bytes, receiver: bool) -> otlp_join.Split:
    """As the otlp receiver splits a request (``split_wire``: parsed only when it must be), or parsed first."""
    if receiver:
        return otlp_join.split_wire(body, window_s=30.0, tolerance_s=5.0, passthrough=True, decode=DECODE)
    return otlp_join.split(ExportMetricsServiceRequest.FromString(body), window_s=30.0, tolerance_s=5.0,
                           passthrough=True, wire=body, decode=DECODE)


def _outcome(found: otlp_join.Split) -> tuple:
    """Everything a split hands the pipeline, comparable (repr: a NaN reading equals itself)."""
    return ([repr(s) for s in found.samples], [repr(p) for p in found.points],
            [(r.field, r.points) for r in found.passthrough], sorted(found.undecodable), sorted(found.noticed.items()))


@contextlib.contextmanager
def _fresh_split(shapes: bool) -> Iterator[list[int]]:
    """No scrape shapes learned yet (or none used: the message path); yields [requests parsed with protobuf]."""
    parsed = [0]

    class Counted:
        @staticmethod
        def FromString(body: bytes) -> ExportMetricsServiceRequest:  # noqa: N802 (protobuf's name)
            parsed[0] += 1
            return ExportMetricsServiceRequest.FromString(body)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(otlp_join, "_scrape_stores", {})
        patch.setattr(otlp_join, "_shape_stores", {})  # the pass-through shapes (otel_ofu.otlp.wire.Shape) too
        patch.setattr(otlp_join, "ExportMetricsServiceRequest", Counted)
        if not shapes:
            patch.setattr(ScrapeShapes, "read", lambda self, *args: None)
            patch.setattr(ShapeStore, "find", lambda self, *args: None)
        yield parsed


def run(bodies: list[bytes], shapes: bool) -> tuple[list[tuple], int]:
    """Each request's outcome, in order: as the receiver splits it with scrape shapes learned as it goes (or
    with none: the message path); and how many of the requests the receiver had to parse."""
    with _fresh_split(shapes) as parsed:
        return [_outcome(_split(body, receiver=shapes)) for body in bodies], parsed[0]


def assert_same(bodies: list[bytes]) -> int:
    """The shape path's outcome is the message path's for every request; returns how many requests the shape
    path parsed (the others were read from their bytes alone)."""
    expected, _ = run(bodies, shapes=False)
    got, parsed = run(bodies, shapes=True)
    for number, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a == b, f"request {number}"
    for outcome in got:  # the pass-through bytes are what they say: whole ResourceMetrics with that many points
        for field, points in outcome[2]:
            (rm,) = ExportMetricsServiceRequest.FromString(field).resource_metrics
            assert sum(len(getattr(m, m.WhichOneof("data")).data_points) for sm in rm.scope_metrics
                       for m in sm.metrics if m.WhichOneof("data")) == points
    return parsed


# --- random requests around a Collector's scrape of dcgm-exporter -------------------------------------


PLAIN_LABELS = st.fixed_dictionaries({
    "gpu": st.sampled_from(["0", "1", "7"]),
    "UUID": st.sampled_from(["GPU-aa", "GPU-bb", "GPU-3b1c5e2a-8f0d-4c61-9a7e-1d2f3a4b5c60"]),
    "Hostname": st.sampled_from(["node-1", "gpu-node-0001"]),
    "device": st.sampled_from(["nvidia0", "nvidia1"]),
    "modelName": st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA A30"]),
}, optional={
    "pci_bus_id": st.just("00000000:18:00.0"), "DCGM_FI_DRIVER_VERSION": st.just("570.124.06"),
    "pod": st.sampled_from(["train-0", ""]), "namespace": st.just("ml"), "GPU_I_ID": st.sampled_from(["1", "2"]),
    "GPU_I_PROFILE": st.just("1g.10gb")})
ODD_LABELS = st.fixed_dictionaries({
    "gpu": st.sampled_from(["0", "1", "7", None, 3]),
    "UUID": st.sampled_from(["GPU-aa", "GPU-bb", "", None]),
    "uuid": st.sampled_from([None, None, "GPU-cc"]),
    "Hostname": st.sampled_from(["node-1", "n" * 200, None]),
    "hostname": st.sampled_from([None, None, "node-2"]),
    "device": st.sampled_from(["nvidia0", None]),
    "modelName": st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA A30", None]),
    "pci_bus_id": st.sampled_from(["00000000:18:00.0", None]),
    "GPU_I_ID": st.sampled_from([None, None, "1"]),
    "pod": st.sampled_from([None, "train-0", ""]),
})


@st.composite
def fleets(draw, plain: bool) -> dict:
    """Nodes with GPUs (label sets) and the metrics their scrapes carry (name, kind, unit). ``plain``: only
    what the shape reader reads (GPU labels, gauges, one scope), else anything around it too."""
    nodes = []
    for n in range(draw(st.integers(1, 3))):
        labels = PLAIN_LABELS if plain else st.one_of(PLAIN_LABELS, ODD_LABELS)
        gpus = [{k: v for k, v in draw(labels).items() if v is not None}
                for _ in range(draw(st.integers(1 if plain else 0, 3)))]
        pool = INPUTS[:2] * 3 + INPUTS + PASSED + (() if plain else OTHERS)
        names = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=6, unique=plain))
        if plain:  # a metric family once per scrape, and an input among them
            names += [name for name in [draw(st.sampled_from(INPUTS))] if name not in names]
        kinds = ["gauge"] if plain else ["gauge"] * 6 + ["sum", "histogram", "none"]
        metrics = [(name, draw(st.sampled_from(kinds)), draw(st.sampled_from(["", "", "%", "Hz", "MHz"])))
                   for name in names]
        resource = [("service.name", "dcgm-exporter"), ("server.address", f"node-{n}"),
                    ("service.instance.id", f"node-{n}:9400")]
        if draw(st.booleans()):
            resource.append(("k8s.node.name", draw(st.sampled_from(["a", "b", 3]))))
        nodes.append({"gpus": gpus, "metrics": metrics, "resource": resource,
                      "schema": draw(st.sampled_from(["", "", "https://opentelemetry.io/schemas/1.9.0"])),
                      "scopes": 1 if plain else draw(st.sampled_from([1, 1, 1, 2])),
                      "ints": not plain})  # values as_int at times (a Prometheus scrape's are doubles)
    return {"nodes": nodes, "seed": draw(st.integers(0, 2**32))}


def scrape(node: dict, t: int, rng: random.Random, odd: float) -> ResourceMetrics:
    """One scrape of a node: the metrics in a new order, new values; with probability ``odd`` per point
    or metric, something the shape reader must leave to the message path."""
    rm = ResourceMetrics(schema_url=node["schema"] if rng.random() >= odd else "")
    rm.resource.attributes.extend(_kv(k, v) for k, v in node["resource"])
    scopes = [rm.scope_metrics.add() for _ in range(node["scopes"])]
    for scope in scopes:
        scope.scope.name = SCOPE
    metrics = list(node["metrics"])
    rng.shuffle(metrics)
    for name, kind, unit in metrics:
        if rng.random() < odd / 3:
            continue  # a metric missing from this scrape
        metric = rng.choice(scopes).metrics.add(name=name, unit=unit, description=f"{name} help")
        metric.metadata.append(_kv("prometheus.type", kind))
        if kind == "none":
            continue
        if kind == "histogram":
            metric.histogram.data_points.add(time_unix_nano=t, count=3, sum=1.5)
            continue
        data = metric.gauge if kind == "gauge" else metric.sum
        if kind == "sum":
            data.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
            data.is_monotonic = True
        for labels in node["gpus"]:
            dp = data.data_points.add(time_unix_nano=t if rng.random() > odd / 4 else 0)
            roll = rng.random() if node["ints"] else rng.random() * 0.8
            if roll < 0.6:
                dp.as_double = round(rng.uniform(0, 2000), 3)
            elif roll < 0.8:
                dp.as_double = rng.choice([math.nan, 0.0, -0.0, *BLANKS[3:]])
            else:
                dp.as_int = rng.choice([0, 1755, *BLANKS[:3]])
            dp.attributes.extend(_kv(k, v) for k, v in labels.items())
            if rng.random() < odd:
                oddity = rng.randrange(4)
                if oddity == 0:
                    dp.flags = 1  # a staleness marker
                elif oddity == 1:
                    dp.start_time_unix_nano = t - 1
                elif oddity == 2:
                    dp.exemplars.add(time_unix_nano=t, as_double=1.0)
                else:
                    dp.attributes.append(_kv("extra", 7))  # a label that is not a string
        if rng.random() < odd:  # a point of no GPU
            data.data_points.add(time_unix_nano=t, as_double=1.0).attributes.append(_kv("Hostname", "node-1"))
    return rm


def windows(fleet: dict, count: int, odd: float, layout: str = "protobuf") -> list[bytes]:
    """The fleet's scrapes, window after window, in requests of a random number of nodes (a node twice, at
    times), serialized as protobuf does or as the Collector does (tools/collector_layout.py)."""
    rng = random.Random(fleet["seed"])
    bodies = []
    for w in range(count):
        t = T0 + w * 10 * 10**9
        scrapes = [scrape(node, t, rng, odd) for node in fleet["nodes"]]
        if rng.random() < odd:
            scrapes.append(scrape(rng.choice(fleet["nodes"]), t + rng.choice([0, 10**9]), rng, odd))
        rng.shuffle(scrapes)
        while scrapes:
            take = rng.randint(1, len(scrapes))
            body = ExportMetricsServiceRequest(resource_metrics=scrapes[:take]).SerializeToString()
            bodies.append(as_collector_writes(body) if layout == "collector" else body)
            scrapes = scrapes[take:]
    return bodies


LAYOUTS = st.sampled_from(["protobuf", "collector"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(plain=True), LAYOUTS)
def test_plain_scrapes_are_read_by_shape_as_by_the_message_path(fleet, layout):
    """Scrapes the reader reads, in protobuf's field order or the Collector's: once each node has been seen (a
    parse each time), every request is read from its bytes alone, with the same outcome."""
    bodies = windows(fleet, 4, odd=0.0, layout=layout)
    assert len(bodies) >= 4
    assert assert_same(bodies) <= len(fleet["nodes"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(plain=False), st.sampled_from([0.0, 0.05, 0.3]), LAYOUTS)
def test_random_scrapes_read_by_shape_as_by_the_message_path(fleet, odd, layout):
    """Anything around that shape (odd labels, staleness markers, exemplars, start times, zero times, int
    values, points of no GPU, missing or duplicated metrics and nodes, histograms and sums under input
    names, decoded metrics, two scopes, schema URLs): read by shape or not, the same outcome."""
    assert_same(windows(fleet, 4, odd, layout))


# --- what the real Collector makes of every dcgm-exporter page of the corpus --------------------------


REAL_PAGES = sorted((Path(__file__).parent / "data" / "real" / "dcgm-exporter").glob("*.prom"))
_SAMPLE_LINE = re.compile(rb"^([^#\s][^ ]*(?:\{.*\})?) (-?[0-9.]+)$", re.MULTILINE)


def _varied(page: bytes, scrape: int) -> bytes:
    """The page with its decimal readings moved a little (new values, the same labels: another scrape)."""
    def move(match: re.Match) -> bytes:
        value = match.group(2)
        if b"." not in value:
            return match.group(0)  # ints (counters, DCGM blanks) as they are
        return match.group(1) + b" " + b"%f" % (float(value) * (1 + 0.01 * scrape))

    return _SAMPLE_LINE.sub(move, page)


class _RawSink:
    """An OTLP/gRPC server keeping each request's bytes as the sender serialized them."""

    def __init__(self) -> None:
        import grpc

        self.bodies: list[bytes] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.metrics.v1.MetricsService",
            {"Export": grpc.unary_unary_rpc_method_handler(lambda body, _: self.bodies.append(body) or b"")})
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


def test_the_collectors_scrapes_of_the_corpus_read_by_shape_as_by_the_message_path(otelcol, tmp_path, processes):
    """The real Collector's prometheus receiver scrapes every corpus page (tests/data/real/dcgm-exporter/) once
    a second, the readings moving between scrapes, and sends each scrape over OTLP: request after request,
    the shape path gives the message path's outcome, and reads each page's later scrapes by shape."""
    sink = _RawSink()
    scrape = 0
    with PageServer({f"/{p.stem}": p.read_bytes() for p in REAL_PAGES}) as pages:
        config = {
            "receivers": {"prometheus": {"config": {"scrape_configs": [
                {"job_name": p.stem, "scrape_interval": "1s", "metrics_path": f"/{p.stem}",
                 "static_configs": [{"targets": [f"127.0.0.1:{pages.port}"]}]} for p in REAL_PAGES]}}},
            "exporters": {"otlp_grpc": {"endpoint": f"127.0.0.1:{sink.port}", "tls": {"insecure": True},
                                        "compression": "none"}},
            "service": {"telemetry": {"metrics": {"level": "none"}},
                        "pipelines": {"metrics": {"receivers": ["prometheus"], "exporters": ["otlp_grpc"]}}},
        }
        path = tmp_path / "collector.yaml"
        path.write_text(yaml.safe_dump(config))
        collector = Process("otelcol", [otelcol, f"--config=file:{path}"], tmp_path / "otelcol.log")
        processes.append(collector)

        def enough() -> bool:
            nonlocal scrape
            require_alive(collector)
            scrape += 1
            for p in REAL_PAGES:
                pages.set(f"/{p.stem}", _varied(p.read_bytes(), scrape))
            return len(sink.bodies) >= 4 * len(REAL_PAGES)

        wait_for("four scrapes of every page", enough, timeout=120, interval=0.5, diagnostics=collector.tail)
        collector.stop()
    sink.server.stop(grace=None)
    by_job: dict[str, list[bytes]] = {}
    for body in sink.bodies:  # the layout tools/collector_layout.py makes, which the other tests use
        assert as_collector_writes(ExportMetricsServiceRequest.FromString(body).SerializeToString()) == body
        for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
            job = next(kv.value.string_value for kv in rm.resource.attributes if kv.key == "service.name")
            by_job.setdefault(job, []).append(body)
    assert set(by_job) == {p.stem for p in REAL_PAGES}
    assert_same(sink.bodies)  # all the pages' scrapes together, in the order they came
    for job, bodies in by_job.items():
        assert assert_same(bodies) == 1, job  # the first scrape parsed, every later one read from its bytes


def test_a_ratio_the_join_keeps_is_read_every_request_when_its_resource_metrics_is_not_a_scrape():
    """A node whose GR engine activity comes in a ResourceMetrics of its own that the scrape reader does
    not read (a scope per metric) and with no TPA or clock in it: the message path reads the ratio and
    passes the metric on. Such a ResourceMetrics must not be learned as pass-through only (a
    wire.Shape), or later requests pass the ratio on unread and the GPU's loss account loses it."""
    def request(k: int) -> bytes:
        values = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.9 - k / 100, "DCGM_FI_DEV_POWER_USAGE": 300.0,
                  "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.4 + k / 100, "DCGM_FI_DEV_SM_CLOCK": 1755.0}
        out = ExportMetricsServiceRequest()
        for names in (("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_POWER_USAGE"),
                      ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_SM_CLOCK")):
            rm = out.resource_metrics.add()
            rm.resource.attributes.extend([_kv("service.name", "dcgm-exporter"), _kv("server.address", "node-1")])
            for name in names:
                point = rm.scope_metrics.add().metrics.add(name=name).gauge.data_points.add(
                    time_unix_nano=T0 + k * 10**10, as_double=values[name])
                point.attributes.extend([_kv("gpu", "0"), _kv("UUID", "GPU-x"), _kv("Hostname", "node-1"),
                                         _kv("modelName", "NVIDIA H100 80GB HBM3")])
        return out.SerializeToString()

    bodies = [request(k) for k in range(3)]
    assert_same(bodies)
    with _fresh_split(shapes=True):
        samples = [_split(body, receiver=True).samples for body in bodies]
    assert [[s.gr_active for s in found] for found in samples] == [[0.9], [0.89], [0.88]]


def test_a_request_not_read_by_shape_is_parsed_and_a_malformed_one_refused():
    """Known nodes are read without a parse only when every byte matches a shape protobuf parsed before:
    anything else (a cut, bytes after, an unknown field, a label changed) is parsed, so a malformed
    request is refused as it would be without shapes, and a well-formed one gets the message path's outcome."""
    from google.protobuf.message import DecodeError

    fleet = {"nodes": [{"gpus": [{"gpu": str(g), "UUID": f"GPU-{g}", "Hostname": "node-1", "modelName": "NVIDIA A30"}
                                 for g in range(2)],
                        "metrics": [("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", ""),
                                    ("DCGM_FI_DEV_SM_CLOCK", "gauge", ""), ("DCGM_FI_DEV_GPU_TEMP", "gauge", "")],
                        "resource": [("service.name", "dcgm-exporter")], "schema": "", "scopes": 1, "ints": False}],
             "seed": 1}
    first, second = windows(fleet, 2, odd=0.0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(otlp_join, "_scrape_stores", {})
        _split(first, receiver=True)  # learns the node
        assert assert_same([first, second]) == 1  # the second read from its bytes alone
        for malformed in (second[:-3], second + b"\x0a\x05ab", second[:40] + b"\xff" + second[41:]):
            with pytest.raises(DecodeError):
                ExportMetricsServiceRequest.FromString(malformed)
            with pytest.raises(DecodeError):
                _split(malformed, receiver=True)
        assert_same([first, second + b"\x10\x07"])  # an unknown field after the ResourceMetrics: parsed
        label = second.index(b"GPU-1")
        other_gpu = second[:label] + b"GPU-9" + second[label + 5:]  # the same sizes, another label: not the shape
        assert assert_same([first, other_gpu]) == 2


# --- the kept capture of the real Collector's scrapes (tests/data/real/otlp/) -------------------------


KEPT_CAPTURE = Path(__file__).parent / "data" / "real" / "otlp" / "collector-prometheus-receiver.json"


def _later_scrape(request: ExportMetricsServiceRequest, k: int) -> ExportMetricsServiceRequest:
    """The same scrape ``k`` intervals later: every point 10 s later, its double readings moved a little."""
    later = ExportMetricsServiceRequest()
    later.CopyFrom(request)
    for rm in later.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind not in ("gauge", "sum"):
                    continue
                for dp in getattr(metric, kind).data_points:
                    dp.time_unix_nano += k * 10 * 10**9
                    if dp.WhichOneof("value") == "as_double":
                        dp.as_double *= 1 + 0.01 * k
    return later


@pytest.mark.parametrize("layout", ["collector", "protobuf"])
def test_the_kept_collector_capture_read_by_shape_as_by_the_message_path(layout):
    """Every page of the corpus as the real Collector made it (the kept OTLP capture), scrape after scrape:
    the shape path's outcome is the message path's, and each page's later scrapes are read from their bytes
    alone (in the Collector's field order, and in protobuf's)."""
    from otel_ofu.otlp import codec

    pages = [codec.from_json_line(line) for line in KEPT_CAPTURE.read_text().splitlines() if line.strip()]
    assert len(pages) == len(REAL_PAGES)
    for request in pages:
        bodies = [_later_scrape(request, k).SerializeToString() for k in range(3)]
        if layout == "collector":
            bodies = [as_collector_writes(body) for body in bodies]
        job = request.resource_metrics[0].resource.attributes[0].value.string_value
        assert assert_same(bodies) == 1, job


# --- the whole processing stage: every point out as the protobuf walk gives it -----------------------


STAGE_CONFIG = Path(__file__).parent.parent / "collector-config" / "processor-stage.yaml"


def _ofu_processor():
    """The ofu processor with the processing stage's settings (collector-config/processor-stage.yaml)."""
    from otel_ofu.pipeline.component import Context
    from otel_ofu.pipeline.config import build_config
    from otel_ofu.processors.ofu import FACTORY as OFU

    settings = yaml.safe_load(STAGE_CONFIG.read_text())["processors"]["ofu"]
    return OFU.create(build_config(OFU.config_type, settings), Context("ofu"))


def _stage_requests(bodies: list[bytes], shapes: bool) -> tuple[list[ExportMetricsServiceRequest], int]:
    """Each request through the processing stage, as the request its otlp exporter sends (parsed), and how
    many requests were parsed. ``shapes``: as the stage runs (the receiver's split_wire with scrape shapes
    learned as it goes, the ofu processor, the encoder's templates of its PointRows); else the protobuf walk:
    each request parsed and split through protobuf objects, its points (the rows' made) built message by
    message with protobuf (tests/test_otlp_encode.py's reference encoder), the pass-through appended as
    protobuf parses it."""
    from otel_ofu.core.model import Batch
    from otel_ofu.otlp.codec import passthrough_messages
    from otel_ofu.otlp.payload import metrics_payload
    from tests.test_otlp_encode import reference

    ofu = _ofu_processor()
    out = []
    with _fresh_split(shapes) as parsed:
        for body in bodies:
            found = _split(body, receiver=shapes)
            batch = ofu.process(Batch(samples=found.samples, points=found.points, passthrough=list(found.passthrough)))
            if shapes:  # as the otlp exporter sends it: the ofu processor's rows written from their templates
                payload = metrics_payload(batch.points_and_rows(), batch.passthrough)
                out.append(ExportMetricsServiceRequest.FromString(payload[0]) if payload else None)
            else:
                request = reference(batch.points)
                request.resource_metrics.extend(passthrough_messages(batch.passthrough))
                out.append(request if request.resource_metrics else None)
    return out, parsed[0]


def assert_stage_exact(bodies: list[bytes]) -> int:
    """Every request the stage sends, read by shape and written from templates, equals the protobuf walk's
    (every point: its resource, metric, attributes, time and value; the pass-through); returns how many
    requests the stage parsed."""
    expected, _ = _stage_requests(bodies, shapes=False)
    got, parsed = _stage_requests(bodies, shapes=True)
    for number, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a == b, f"request {number}"
    return parsed


def _stage_workload(nodes: int, windows_: int, per_request: int) -> list[bytes]:
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    try:
        import stage
    finally:
        sys.path.pop(0)
    fleet_ = stage.fleet(nodes, seed=3)
    return [body for w in range(windows_) for body in stage.window_requests(fleet_, w, per_request, 3, True)]


def test_the_stage_sends_what_the_protobuf_walk_gives_on_its_benchmark_workload():
    """benchmarks/stage.py's workload (a Collector's scrapes of dcgm-exporter, the metrics in a new order each
    scrape, a training job's readings): every request the stage sends is the protobuf walk's, gpu.ofu, the
    loss account's parts (several points of one gauge per GPU) and the inputs too; only the first window
    is parsed."""
    bodies = _stage_workload(nodes=12, windows_=4, per_request=5)
    got, _ = _stage_requests(bodies[:3], shapes=True)
    names = {m.name for request in got for rm in request.resource_metrics for sm in rm.scope_metrics
             for m in sm.metrics}
    assert {"gpu.ofu", "gpu.ofu.loss", "gpu.tensor.activity", "DCGM_FI_PROF_DRAM_ACTIVE"} <= names
    assert assert_stage_exact(bodies) == 3  # the first window's three requests


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(plain=True), st.sampled_from([0.0, 0.05]), LAYOUTS)
def test_the_stage_sends_what_the_protobuf_walk_gives_on_random_scrapes(fleet, odd, layout):
    """Random scrapes around a Collector's (odd ones among them at times): the requests the stage sends are
    the protobuf walk's, read by shape or not."""
    assert_stage_exact(windows(fleet, 4, odd, layout))


def test_the_stage_sends_what_the_protobuf_walk_gives_on_the_kept_collector_capture():
    """Every corpus page as the real Collector made it (tests/data/real/otlp/), three scrapes each: the
    requests the stage sends are the protobuf walk's."""
    from otel_ofu.otlp import codec

    pages = [codec.from_json_line(line) for line in KEPT_CAPTURE.read_text().splitlines() if line.strip()]
    for request in pages:
        bodies = [as_collector_writes(_later_scrape(request, k).SerializeToString()) for k in range(3)]
        assert_stage_exact(bodies)
