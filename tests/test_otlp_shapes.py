"""ResourceMetrics read through their shape (otel_ofu.otlp.wire) against the message path.

The otlp receiver learns a ResourceMetrics' shape the first time it reads one through
protobuf objects, and reads later ones of that shape from their bytes alone. Whatever the
shape, the result must be the message path's: the same decoded points in the same order,
the same pass-through (as messages, as bytes, its point count), the same undecodable names.
"""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE, AGGREGATION_TEMPORALITY_DELTA

from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp import join as otlp_join
from otel_ofu.otlp import wire
from otel_ofu.otlp.join import passthrough
from otel_ofu.otlp.payload import metrics_payload
from otel_ofu.receivers.otlp import DEFAULT_DECODE
from tests.otlp_shapes import Gpu, dcgm_exporter_request
from tools.fleet_sim import NodeTier

DECODE = frozenset(DEFAULT_DECODE)
T0 = 1_767_225_600_000_000_000
JOBS = [{"id": "train-a", "scenario": "steady", "gpus": 6, "precision": "bf16"},
        {"id": "moe-b", "scenario": "moe_inflated", "gpus": 4}]


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def node_windows(windows: int = 3) -> list[bytes]:
    """What node agents send, window after window: the same shapes, other times and values."""
    tier = NodeTier.of(nodes=3, gpus_per_node=4, jobs=JOBS)
    return [otlp.encode_request([p for points in tier.window().values() for p in points]) for _ in range(windows)]


def odd_request(t: int, value: float) -> ExportMetricsServiceRequest:
    """Decoded metrics in every layout the shapes must handle, or leave to codec.data_points."""
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    rm.resource.attributes.extend([_kv("host.name", "node-1"), _kv("hw.id", "GPU-1"), _kv("gpu.index", "0"),
                                   _kv("ofu.job.id", "job-1"), _kv("replicas", 2), _kv("ratio", 0.5)])
    scope = rm.scope_metrics.add()
    scope.scope.name = "otel-ofu"
    ofu = scope.metrics.add(name="gpu.ofu", unit="1", description="d")
    for k in range(3):  # several points, one with an int value, one with a start time, one with flags 0
        dp = ofu.gauge.data_points.add(time_unix_nano=t + k, as_double=value + k)
        dp.attributes.extend([_kv("ofu.fref.source", "spec"), _kv("k", k)])
    ofu.gauge.data_points[1].ClearField("as_double")
    ofu.gauge.data_points[1].as_int = 7
    ofu.gauge.data_points[2].start_time_unix_nano = t - 10
    stale = scope.metrics.add(name="gpu.flops.achieved", unit="{flop}/s")  # a staleness marker: no point
    stale.gauge.data_points.add(time_unix_nano=t, as_double=1.0, flags=1)
    exemplar = scope.metrics.add(name="gpu.ofu.raw")  # exemplars: not plain, read by codec.data_points
    dp = exemplar.gauge.data_points.add(time_unix_nano=t, as_double=value)
    dp.exemplars.add(time_unix_nano=t, as_double=1.0)
    dropped = scope.metrics.add(name="gpu.ofu.dropped", unit="{window}")  # a cumulative sum: decoded
    dropped.sum.is_monotonic = True
    dropped.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
    dropped.sum.data_points.add(time_unix_nano=t, start_time_unix_nano=t - 100, as_double=value * 10)
    delta = scope.metrics.add(name="gpu.tensor.activity")  # a delta sum under a decoded name: passes through
    delta.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_DELTA
    delta.sum.data_points.add(time_unix_nano=t, as_double=value)
    histogram = scope.metrics.add(name="training.mfu")  # a histogram under a decoded name: passes through
    histogram.histogram.data_points.add(time_unix_nano=t, count=3, sum=value)
    scope.metrics.add(name="gpu.sm.activity")  # no data at all: decoded as nothing, forwarded as nothing
    foreign = scope.metrics.add(name="DCGM_FI_DEV_GPU_TEMP")  # not decoded: passes through
    foreign.gauge.data_points.add(time_unix_nano=t, as_double=41.0).attributes.append(_kv("gpu", "0"))
    only_decoded = rm.scope_metrics.add()  # a scope left empty once its metric is decoded: dropped
    only_decoded.metrics.add(name="gpu.power.usage", unit="W").gauge.data_points.add(time_unix_nano=t, as_double=value)
    rm.scope_metrics.add()  # a scope empty as it came: dropped
    rm.schema_url = "https://opentelemetry.io/schemas/1.26.0"
    all_decoded = request.resource_metrics.add()  # nothing left to forward
    all_decoded.resource.attributes.append(_kv("hw.id", "GPU-2"))
    all_decoded.scope_metrics.add().metrics.add(name="gpu.ofu").gauge.data_points.add(time_unix_nano=t, as_double=value)
    request.resource_metrics.add().scope_metrics.add().metrics.add(name="x").gauge.data_points.add(as_int=1)
    return request


def odd_windows(windows: int = 3) -> list[bytes]:
    return [odd_request(T0 + w * 10**10, 0.25 + 0.125 * w).SerializeToString() for w in range(windows)]


def dcgm_windows(windows: int = 3) -> list[bytes]:
    gpus = [Gpu(0, "GPU-aaaa", 0.5, 1755.0), Gpu(1, "GPU-bbbb", 0.25, 1980.0)]
    return [dcgm_exporter_request(gpus, T0 + w * 10**10).SerializeToString() for w in range(windows)]


def result(found: otlp_join.Split) -> tuple:
    points = [(p.name, p.value, p.time_unix_nano, p.resource, p.attributes, p.unit, p.monotonic,
               p.start_time_unix_nano) for p in found.points]
    messages = [r.message if isinstance(r, otlp.WireResourceMetrics) else r for r in found.passthrough]
    counts = [r.points if isinstance(r, otlp.WireResourceMetrics) else otlp.count_data_points(r)
              for r in found.passthrough]
    return ([repr(s) for s in found.samples], points, messages, counts, found.undecodable)


@pytest.fixture
def shapes(monkeypatch):
    """A shape store of the test's own (the process keeps them otherwise)."""
    monkeypatch.setattr(otlp_join, "_shape_stores", {})
    return otlp_join._shape_stores


@pytest.mark.parametrize("bodies", [node_windows, odd_windows, dcgm_windows])
def test_read_by_shape_equals_the_message_path(bodies, shapes):
    for body in bodies():
        expected = result(otlp_join.split(ExportMetricsServiceRequest.FromString(body), decode=DECODE))
        # The first body teaches the shapes (read through protobuf objects); later ones use them.
        found = otlp_join.split(ExportMetricsServiceRequest.FromString(body), wire=body, decode=DECODE)
        assert result(found) == expected
        for forwarded, message in zip(found.passthrough, expected[2]):
            assert list(ExportMetricsServiceRequest.FromString(forwarded.field).resource_metrics) == [message]
        sent, count = metrics_payload(found.points, found.passthrough)
        assert count == len(found.points) + sum(expected[3])
        assert sum(otlp.count_data_points(r) for r in ExportMetricsServiceRequest.FromString(sent).resource_metrics) \
            == count
    assert (len(shapes[DECODE]) > 0) == (bodies is not dcgm_windows)  # inputs are joined point by point


def test_later_requests_of_a_known_shape_are_read_by_it(shapes, monkeypatch):
    # A GPU's first window has no gpu.energy (nothing to subtract from its counter yet): the shape learned
    # is a later one's, what a node agent sends from its second window on.
    _, first, *later = node_windows(4)
    otlp_join.split(ExportMetricsServiceRequest.FromString(first), wire=first, decode=DECODE)
    assert len(shapes[DECODE]) > 0
    through_protobuf = []
    original = otlp_join._message_path
    monkeypatch.setattr(otlp_join, "_message_path", lambda *a: through_protobuf.append(a) or original(*a))
    for body in later:
        found = otlp_join.split(ExportMetricsServiceRequest.FromString(body), wire=body, decode=DECODE)
        assert found.points
    assert through_protobuf == []
    # The values are this request's, not the ones the shape was learned from.
    times = {p.time_unix_nano for p in otlp_join.split(
        ExportMetricsServiceRequest.FromString(later[-1]), wire=later[-1], decode=DECODE).points}
    assert times == {p.time_unix_nano for p in otlp.from_request(ExportMetricsServiceRequest.FromString(later[-1]))}


def test_the_join_inputs_are_never_read_by_shape(shapes):
    for body in dcgm_windows():
        otlp_join.split(ExportMetricsServiceRequest.FromString(body), wire=body, decode=DECODE)
    assert len(shapes[DECODE]) == 0  # the dcgm-exporter scrape holds TPA and clock: read point by point


def test_a_different_skeleton_of_the_same_size_is_not_taken_for_the_shape(shapes):
    def request(name: str, unit: str) -> bytes:
        r = ExportMetricsServiceRequest()
        metric = r.resource_metrics.add().scope_metrics.add().metrics.add(name=name, unit=unit)
        metric.gauge.data_points.add(time_unix_nano=T0, as_double=0.5)
        return r.SerializeToString()

    decoded, other = request("gpu.ofu", "1"), request("gpu.fou", "1")  # same sizes, one name decoded
    assert len(decoded) == len(other)
    for body in (decoded, other, decoded, other):
        found = otlp_join.split(ExportMetricsServiceRequest.FromString(body), wire=body, decode=DECODE)
        assert [p.name for p in found.points] == (["gpu.ofu"] if body == decoded else [])
        assert len(found.passthrough) == (0 if body == decoded else 1)


def test_a_shape_is_only_what_it_decodes(shapes):
    body = node_windows(1)[0]
    everything = otlp_join.split(ExportMetricsServiceRequest.FromString(body), wire=body, decode=DECODE)
    only_ofu = otlp_join.split(ExportMetricsServiceRequest.FromString(body), wire=body, decode=frozenset({"gpu.ofu"}))
    assert {p.name for p in only_ofu.points} == {"gpu.ofu"}
    assert len(only_ofu.points) < len(everything.points)
    assert set(shapes) == {DECODE, frozenset({"gpu.ofu"})}


def test_shapes_are_bounded():
    store = wire.ShapeStore(max_shapes=4, per_size=2)
    bodies = [ExportMetricsServiceRequest(resource_metrics=[odd_request(T0, 0.5).resource_metrics[0]])]
    body = bodies[0].SerializeToString()
    _, start, end = passthrough.request_ranges(body, 1)[0]
    shape = wire.Shape.learn(body, start, end, DECODE, otlp_join.INPUT_METRICS)
    assert shape is not None and shape.matches(body, start)
    for _ in range(10):
        store.add(shape)
    assert len(store) <= 4 and len(store._by_size[shape.size]) <= 2
