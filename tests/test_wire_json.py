"""otel_ofu.otlp.wire_json: OTLP JSON from the protobuf bytes, byte for byte json_format's line.

The reference is what the file exporter wrote before (``codec.to_json_line``: ``json.dumps`` of
``json_format.MessageToDict(..., use_integers_for_enums=True)``, compact), with trace and span
ids in hex (``wire_json.json_format_line``), as OTLP JSON has them and the Collector reads them.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import pytest
from google.protobuf import descriptor, json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_ofu.core.model import Event, MetricPoint, attrs
from otel_ofu.otlp import codec, wire_json

DATA = Path(__file__).parent / "data"
# OTLP captures of the corpus (tests/data/real/README.md names their sources) and otel-ofu's own recording.
JSON_CAPTURES = [DATA / "real" / "otlp" / "collector-prometheus-receiver.json",
                 DATA / "real" / "otlp" / "dcgmreceiver-v1_h100.json",
                 DATA / "real" / "otlp" / "dcgmreceiver-v2_h100.json",
                 DATA / "replay" / "sim-ofu.jsonl"]
SDK_CAPTURE = DATA / "real" / "otlp" / "sdk-training-reporter.http-protobuf.bin"
T = descriptor.FieldDescriptor


def reference(message) -> str:
    return wire_json.json_format_line(message)


def check(message) -> None:
    logs = isinstance(message, ExportLogsServiceRequest)
    assert wire_json.request_json(message.SerializeToString(), logs=logs) == reference(message)


@pytest.mark.parametrize("capture", JSON_CAPTURES, ids=lambda p: p.name)
def test_the_corpus_captures_are_written_as_json_format_writes_them(capture):
    lines = [line for line in capture.read_text().splitlines() if line.strip()]
    assert lines
    for line in lines:
        request = codec.from_json_line(line)
        check(request)
        # What json_format writes for these is the line as the exporter wrote it before.
        assert reference(request) == codec.to_json_line(request)


def test_the_sdk_capture_is_written_as_json_format_writes_it():
    """The OpenTelemetry SDK's own request body (histograms, sums, its resource), as it arrived."""
    body = SDK_CAPTURE.read_bytes()
    assert wire_json.request_json(body) == reference(ExportMetricsServiceRequest.FromString(body))


def test_what_the_file_exporter_writes_is_what_to_json_line_wrote():
    """Points and events as the exporter encodes them: the old line, byte for byte (no ids in them)."""
    resource = attrs({"host.name": "n-1", "hw.id": "GPU-1", "gpu.index": "0", "ñ": "π ≈ 3.14 \u2028 \x00"})
    points = [MetricPoint("gpu.ofu", value, 1_767_225_600_000_000_000 + k, resource, attrs(a), monotonic=mono,
                          start_time_unix_nano=start)
              for k, (value, a, mono, start) in enumerate([
                  (0.5, {}, False, 0), (float("nan"), {"ofu.loss": "a"}, False, 0),
                  (float("inf"), {"b": True, "i": -3, "f": 2.5}, False, 0), (-0.0, {"b": False, "i": 0}, True, 5),
                  (float("-inf"), {"s": ""}, True, 1), (1e300, {"k": "v"}, False, 0)])]
    points.append(MetricPoint("otel_ofu.exporter.dropped", 3.0, 0, (), (), "{item}"))
    request = codec.to_request(points)
    assert wire_json.request_json(codec.encode_request(points)) == codec.to_json_line(request)
    events = [Event("ofu.job.start", 1_767_225_600_000_000_000, resource, attrs({"ofu.job.id": "j"}), "started"),
              Event("ofu.finding", 5, (), (), "ü\n\t\"quoted\"", "WARN")]
    logs = codec.events_to_request(events)
    assert wire_json.request_json(logs.SerializeToString(), logs=True) == codec.to_json_line(logs)


def test_trace_and_span_ids_are_hex_as_otlp_json_has_them():
    point = metrics_pb2.NumberDataPoint(time_unix_nano=1, as_double=1.0, exemplars=[metrics_pb2.Exemplar(
        trace_id=bytes(range(16)), span_id=bytes(range(8)), as_int=7)])
    request = ExportMetricsServiceRequest()
    request.resource_metrics.add().scope_metrics.add().metrics.add(name="m", gauge=metrics_pb2.Gauge(
        data_points=[point]))
    line = wire_json.request_json(request.SerializeToString())
    exemplar = json.loads(line)["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["gauge"]["dataPoints"][0][
        "exemplars"][0]
    assert exemplar == {"traceId": "000102030405060708090a0b0c0d0e0f", "spanId": "0001020304050607", "asInt": "7"}
    # json_format's own (base64) otherwise: the rest is its line.
    assert json.loads(codec.to_json_line(request))["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0][
        "gauge"]["dataPoints"][0]["exemplars"][0]["traceId"] == base64.b64encode(bytes(range(16))).decode()


def test_bytes_that_only_a_merge_reads_right_are_read_as_protobuf_reads_them():
    """A KeyValue's value given twice: protobuf merges the two AnyValues (the last oneof member wins)."""
    first = KeyValue(key="k", value=AnyValue(string_value="s")).SerializeToString()
    second = KeyValue(value=AnyValue(int_value=5)).SerializeToString()
    point = metrics_pb2.NumberDataPoint(time_unix_nano=9, as_double=2.0).SerializeToString()
    point += b"\x3a" + bytes([len(first + second)]) + first + second  # one attribute, its value split in two
    gauge = b"\x0a" + bytes([len(point)]) + point
    metric = b"\x0a\x01m" + b"\x2a" + bytes([len(gauge)]) + gauge
    scope = b"\x12" + bytes([len(metric)]) + metric
    resource_metrics = b"\x12" + bytes([len(scope)]) + scope
    body = b"\x0a" + bytes([len(resource_metrics)]) + resource_metrics
    parsed = ExportMetricsServiceRequest.FromString(body)
    point = parsed.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0]
    assert point.attributes[0].value.int_value == 5
    assert wire_json.request_json(body) == reference(parsed)


def test_bytes_that_are_not_a_request_raise_protobufs_error():
    from google.protobuf.message import DecodeError

    with pytest.raises(DecodeError):
        wire_json.request_json(b"\x0a\x05\x12\x09ab")


# --- random requests: every field of the OTLP metrics and logs messages ------------------------

def _scalar(field: descriptor.FieldDescriptor) -> st.SearchStrategy:
    kind = field.type
    if kind == T.TYPE_DOUBLE:
        return st.floats(allow_nan=True, allow_infinity=True)
    if kind == T.TYPE_FLOAT:
        return st.floats(width=32, allow_nan=True, allow_infinity=True)
    if kind in (T.TYPE_INT64, T.TYPE_SFIXED64, T.TYPE_SINT64):
        return st.integers(-(1 << 63), (1 << 63) - 1)
    if kind in (T.TYPE_UINT64, T.TYPE_FIXED64):
        return st.one_of(st.integers(0, 3), st.integers(0, (1 << 64) - 1))
    if kind in (T.TYPE_INT32, T.TYPE_SFIXED32, T.TYPE_SINT32):
        return st.integers(-(1 << 31), (1 << 31) - 1)
    if kind in (T.TYPE_UINT32, T.TYPE_FIXED32):
        return st.integers(0, (1 << 32) - 1)
    if kind == T.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-5, 5))
    if kind == T.TYPE_BOOL:
        return st.booleans()
    if kind == T.TYPE_STRING:
        return st.text(max_size=12)
    if kind == T.TYPE_BYTES:
        return st.binary(max_size=17)
    raise AssertionError(kind)


@st.composite
def messages(draw, message: descriptor.Descriptor, depth: int = 0):
    """A message of ``message``'s type with a random selection of its fields (each oneof at most one)."""
    values: dict = {}
    oneofs_done: set[str] = set()
    for field in message.fields:
        if field.containing_oneof is not None:
            if field.containing_oneof.name in oneofs_done:
                continue
            if not draw(st.booleans()):
                continue
            choice = draw(st.sampled_from(list(field.containing_oneof.fields)))
            oneofs_done.add(field.containing_oneof.name)
            field = choice  # noqa: PLW2901
        elif not draw(st.booleans()):
            continue
        if field.type == T.TYPE_MESSAGE:
            if depth >= 5:
                continue
            element = messages(field.message_type, depth + 1)
            values[field.name] = draw(st.lists(element, max_size=3 if depth < 3 else 1)) if field.is_repeated \
                else draw(element)
        else:
            values[field.name] = draw(st.lists(_scalar(field), max_size=4)) if field.is_repeated \
                else draw(_scalar(field))
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(message)(**values)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(messages(ExportMetricsServiceRequest.DESCRIPTOR))
def test_random_metrics_requests_are_written_as_json_format_writes_them(request):
    check(request)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(messages(ExportLogsServiceRequest.DESCRIPTOR))
def test_random_logs_requests_are_written_as_json_format_writes_them(request):
    check(request)


def _scrambled(message, rnd: random.Random) -> bytes:
    """``message``'s bytes with its fields in a random order at every level (repeated elements keep
    theirs, packed scalars may come unpacked): what protobuf reads as the same message."""
    chunks: list[tuple[float, bytes]] = []
    for field, value in message.ListFields():
        if field.type == T.TYPE_MESSAGE:
            elements = value if field.is_repeated else [value]
            keys = sorted(rnd.random() for _ in elements)
            for key, element in zip(keys, elements):
                body = _scrambled(element, rnd)
                chunks.append((key, codec.varint(field.number << 3 | 2) + codec.varint(len(body)) + body))
            continue
        alone = type(message)()
        if field.is_repeated:
            if rnd.random() < 0.5:  # each element on its own: unpacked for scalars
                keys = sorted(rnd.random() for _ in value)
                for key, element in zip(keys, value):
                    one = type(message)()
                    getattr(one, field.name).append(element)
                    chunks.append((key, _unpacked(one, field)))
                continue
            getattr(alone, field.name).extend(value)
        else:
            setattr(alone, field.name, value)
        chunks.append((rnd.random(), alone.SerializeToString()))
    chunks.sort(key=lambda chunk: chunk[0])
    return b"".join(chunk for _, chunk in chunks)


def _unpacked(one, field: descriptor.FieldDescriptor) -> bytes:
    """A one-element repeated field, unpacked: its element's tag with the scalar's own wire type."""
    packed = one.SerializeToString()
    if field.type in (T.TYPE_STRING, T.TYPE_BYTES):
        return packed
    tag_size = len(codec.varint(field.number << 3 | 2))
    size, start = codec.varint_at(packed, tag_size)
    wire = {T.TYPE_DOUBLE: 1, T.TYPE_FIXED64: 1, T.TYPE_SFIXED64: 1, T.TYPE_FLOAT: 5, T.TYPE_FIXED32: 5,
            T.TYPE_SFIXED32: 5}.get(field.type, 0)
    return codec.varint(field.number << 3 | wire) + packed[start:start + size]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(messages(ExportMetricsServiceRequest.DESCRIPTOR), st.randoms(use_true_random=False))
def test_fields_in_any_order_are_written_in_field_number_order(request, rnd):
    body = _scrambled(request, rnd)
    parsed = ExportMetricsServiceRequest.FromString(body)
    assert parsed == request  # what protobuf reads is the same message
    assert wire_json.request_json(body) == reference(request)


def test_json_format_writes_what_the_reference_writes():
    """The reference is json_format's line, only the ids changed (the random tests' premise)."""
    request = ExportMetricsServiceRequest()
    request.resource_metrics.add().resource.attributes.add(key="k", value=AnyValue(double_value=float("nan")))
    assert reference(request) == codec.to_json_line(request) == json.dumps(
        json_format.MessageToDict(request, use_integers_for_enums=True), separators=(",", ":"))


def test_resources_written_from_their_template_keep_each_time_and_value():
    """The same metrics, resources and attributes request after request (their JSON kept as templates),
    each time with other times and values: NaN, the infinities, -0.0, a time of 0 (not written)."""
    resource = attrs({"host.name": "n-1", "hw.id": "GPU-1", "note": "100% %d %r {}"})  # format characters
    values = [0.25, float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-300, 123456789.0]
    for k, value in enumerate(values):
        points = [MetricPoint(f"metric.{m}", value * m, (1_767_225_600_000_000_000 + k) if k != 5 else 0, resource,
                              attrs({"ofu.job.id": f"job-{m % 2}"}) if m % 3 else ())
                  for m in range(4)]
        body = codec.encode_request(points)
        assert wire_json.request_json(body) == reference(ExportMetricsServiceRequest.FromString(body))
    assert any(key[0].startswith(b"\x0a\x08metric.") for key in wire_json._one_point_gauges)  # the templates' paths
    assert any(b"GPU-1" in key and template.hits for key, template in wire_json._rm_templates.items())
