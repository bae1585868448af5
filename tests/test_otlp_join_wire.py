"""The join reading points and cutting the pass-through from the received bytes, against the message path.

``split_request(request, wire=body)`` must give the same samples and forward the same
ResourceMetrics (as messages and as bytes) as ``split_request(request)`` on every shape,
including shapes the byte readers do not expect, where they fall back to protobuf.
"""

from __future__ import annotations

import math

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics

from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp import join as otlp_join
from otel_ofu.otlp.join import point_bytes, points
from otel_ofu.otlp.payload import metrics_payload
from otel_ofu.pipeline import caches
from tests.otlp_shapes import Gpu, dcgm_exporter_request, dcgmreceiver_request

T0 = 1_764_000_000_000_000_000
GPUS = [Gpu(0, "GPU-aaaa", 0.5, 1755.0), Gpu(1, "GPU-bbbb", 0.25, 1980.0), Gpu(2, "GPU-cccc", 0.75, 1410.0)]


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=float(value)))


def _field(number: int, payload: bytes) -> bytes:
    return otlp._len_field(bytes([number << 3 | 2]), payload)


def odd_request() -> ExportMetricsServiceRequest:
    """Shapes the byte readers must leave to protobuf, and pass-through edge cases."""
    request = dcgm_exporter_request(GPUS, T0)
    dcgm_exporter_request(GPUS[:2], T0 + 30 * 10**9, host="node-1", request=request)  # a second window
    request.MergeFrom(dcgmreceiver_request(GPUS[:2], T0))
    tpa, clock = (request.resource_metrics[0].scope_metrics[0].metrics[i].gauge.data_points for i in (0, 1))
    tpa[0].as_int = 0x7FFFFFF0 + 2  # a DCGM blank sentinel, as an int
    tpa[1].start_time_unix_nano = T0 - 1  # a start time: not the plain layout
    tpa[2].flags = 1  # a staleness marker
    clock[0].exemplars.add(time_unix_nano=T0, as_double=1.0)  # exemplars: not the plain layout
    clock[1].as_double = math.nan
    clock[2].time_unix_nano = 0  # no time: not the plain layout
    second = request.resource_metrics[1].scope_metrics[0].metrics
    long_label = second[0].gauge.data_points[0]
    long_label.attributes.append(_kv("container", "c" * 300))  # a label longer than 127 bytes
    int_label = second[1].gauge.data_points[1]
    int_label.attributes.append(_kv("gpu_extra", 7))  # a label that is not a string
    host_only = second[0].gauge.data_points.add(time_unix_nano=T0 + 30 * 10**9, as_double=0.5)
    host_only.attributes.append(_kv("Hostname", "node-1"))  # not a GPU series
    no_labels = second[1].gauge.data_points.add(time_unix_nano=T0 + 30 * 10**9, as_double=1500.0)
    del no_labels.attributes[:]
    histogram = request.resource_metrics[1].scope_metrics.add().metrics.add(name="DCGM_FI_DEV_SM_CLOCK")
    histogram.histogram.data_points.add(count=3)  # an input name that is not a gauge: passes through
    request.resource_metrics.add().scope_metrics.add()  # an empty scope
    request.resource_metrics.add()  # an empty resource
    counter = request.resource_metrics[0].scope_metrics[0].metrics.add(name="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    counter.sum.is_monotonic = True
    counter.sum.data_points.add(time_unix_nano=T0, start_time_unix_nano=T0 - 5, as_int=10)
    return request


def unusual_layout() -> bytes:
    """A ResourceMetrics written with its fields out of number order, repeated and unknown fields."""
    request = dcgm_exporter_request(GPUS[:2], T0)
    rm = request.resource_metrics[0]
    scope = rm.scope_metrics[0]
    metrics = b"".join(_field(2, m.SerializeToString()) for m in reversed(scope.metrics))
    scope_bytes = metrics + _field(1, scope.scope.SerializeToString()) + b"\x18\x07"  # unknown varint field 3
    resource = rm.resource.SerializeToString()
    half = len(rm.resource.attributes) // 2
    first = rm.resource.__class__()
    first.attributes.extend(rm.resource.attributes[:half])
    rest = rm.resource.__class__()
    rest.attributes.extend(rm.resource.attributes[half:])
    assert first.SerializeToString() + rest.SerializeToString() == resource
    rm_bytes = (_field(2, scope_bytes) + _field(1, first.SerializeToString()) + b"\x25\x01\x02\x03\x04"
                + _field(1, rest.SerializeToString()) + _field(2, b""))  # an unknown fixed32, an empty scope
    other = request.resource_metrics.add()
    other.CopyFrom(dcgmreceiver_request(GPUS[:1], T0).resource_metrics[0])
    return _field(1, rm_bytes) + _field(1, other.SerializeToString()) + b"\x10\x01"  # unknown top-level field


def bodies() -> list[bytes]:
    return [dcgm_exporter_request(GPUS, T0).SerializeToString(), dcgmreceiver_request(GPUS, T0).SerializeToString(),
            odd_request().SerializeToString(), unusual_layout()]


@pytest.mark.parametrize("index", range(4))
def test_wire_path_equals_message_path(index):
    body = bodies()[index]
    samples, rest = otlp_join.split_request(ExportMetricsServiceRequest.FromString(body))
    wire_samples, wire_rest = otlp_join.split_request(ExportMetricsServiceRequest.FromString(body), wire=body)
    assert [repr(s) for s in wire_samples] == [repr(s) for s in samples]
    assert samples
    assert all(isinstance(r, otlp.WireResourceMetrics) for r in wire_rest)
    assert [r.message for r in wire_rest] == rest
    for forwarded, message in zip(wire_rest, rest):
        request = ExportMetricsServiceRequest.FromString(forwarded.field)
        assert list(request.resource_metrics) == [message]  # the bytes hold exactly that message
        assert forwarded.points == otlp.count_data_points(message)
    # What the exporter sends is the same either way.
    assert metrics_payload([], wire_rest)[1] == metrics_payload([], rest)[1]
    assert ExportMetricsServiceRequest.FromString(metrics_payload([], wire_rest)[0]) == \
           ExportMetricsServiceRequest.FromString(metrics_payload([], rest)[0])


def test_odd_request_exercises_the_fallbacks(monkeypatch):
    caches.release_all()  # label sets and shapes seen by earlier tests are remembered
    through_protobuf = []
    original = points.Joiner._prometheus_point
    monkeypatch.setattr(points.Joiner, "_prometheus_point",
                        lambda self, *args: through_protobuf.append(args[1]) or original(self, *args))
    samples, rest = otlp_join.split_request(odd_request())
    # Clocks without a TPA of the same series are windows without TPA: GPU-cccc's TPA was a
    # staleness marker, and GPU-aaaa's second TPA carries a container label its clock lacks.
    assert {s.uuid for s in samples if s.tensor_active is not None} == {"GPU-aaaa", "GPU-bbbb"}
    assert sorted(s.uuid for s in samples if s.tensor_active is None) == ["GPU-aaaa", "GPU-cccc"]
    # start time, staleness marker, exemplars, no time, a long label, a non-string label, and the energy
    # counter's point (read since issue 34) with its start time
    assert len(through_protobuf) == 7
    # Input points of no GPU (a host-only series, one without labels) pass through; the joined ones do not.
    forwarded = {(m.name, m.WhichOneof("data")): [otlp.attributes_of(dp.attributes) for dp in getattr(
        m, m.WhichOneof("data")).data_points] for r in rest for sm in r.scope_metrics for m in sm.metrics}
    assert forwarded[("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge")] == [(("Hostname", "node-1"),)]
    assert forwarded[("DCGM_FI_DEV_SM_CLOCK", "gauge")] == [()]
    assert ("DCGM_FI_DEV_SM_CLOCK", "histogram") in forwarded
    assert forwarded[("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "sum")] == [()]  # read, and kept as it came


def test_wrong_bytes_fall_back_to_serializing():
    body = dcgm_exporter_request(GPUS, T0).SerializeToString()
    other = dcgmreceiver_request(GPUS, T0).SerializeToString()
    _, rest = otlp_join.split_request(ExportMetricsServiceRequest.FromString(body))
    _, wire_rest = otlp_join.split_request(ExportMetricsServiceRequest.FromString(body), wire=other)
    assert [list(ExportMetricsServiceRequest.FromString(r.field).resource_metrics) for r in wire_rest] == \
           [[m] for m in rest]


def test_passthrough_messages_reach_the_other_exporters():
    body = dcgm_exporter_request(GPUS, T0).SerializeToString()
    _, wire_rest = otlp_join.split_request(ExportMetricsServiceRequest.FromString(body), wire=body)
    plain = ResourceMetrics()
    assert otlp.passthrough_messages([*wire_rest, plain, "not OTLP"]) == [wire_rest[0].message, plain]


@pytest.mark.parametrize("attributes", [
    [("gpu", "0"), ("UUID", "GPU-1"), ("modelName", "NVIDIA H100 80GB HBM3")],
    [("gpu", ""), ("", "no key"), ("pod", "p")],
    [("gpu", 0), ("flag", True), ("ratio", 0.5)],
    [("k" * 100, "v" * 27), ("long", "x" * 200), ("unicode", "nöde ✓")],
    [],
])
def test_string_attributes_read_as_protobuf_does(attributes):
    point = otlp_join.ResourceMetrics().scope_metrics.add().metrics.add().gauge.data_points.add(
        time_unix_nano=T0, as_double=1.0)
    point.attributes.extend([_kv(k, v) for k, v in attributes])
    from_protobuf = [(kv.key, kv.value.string_value) for kv in point.attributes]
    attribute_bytes = point_bytes.attributes_part(point.SerializeToString())
    for _ in range(2):  # the second time from the cache
        pairs = point_bytes.string_attributes(attribute_bytes)
        assert pairs is None or pairs == from_protobuf
    # (No attributes: attributes_part gives the whole point, which is not read as labels.)
    plain = bool(attributes) and all(isinstance(v, str) and k and len(k) + len(v) < 120 for k, v in attributes)
    assert (pairs is not None) == plain


def test_unusual_layout_is_cut_from_the_bytes_not_reserialized():
    body = unusual_layout()
    _, wire_rest = otlp_join.split_request(ExportMetricsServiceRequest.FromString(body), wire=body)
    first = wire_rest[0]
    # Kept as received: the scope before the resource, the unknown fixed32, the resource in two parts.
    assert first.field != _field(1, first.message.SerializeToString())
    assert b"\x25\x01\x02\x03\x04" in first.field
    assert list(ExportMetricsServiceRequest.FromString(first.field).resource_metrics) == [first.message]
