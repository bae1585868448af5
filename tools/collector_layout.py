"""OTLP protobuf bytes laid out as the OpenTelemetry Collector writes them, for tests and benchmarks.

Why: a message's fields may come in any order on the wire. Python's protobuf writes them by
field number; the Collector (pdata's generated ``MarshalProto``, v1.67) writes each message
backwards from its end, so they come in reverse *declaration* order: a Metric's metadata, data,
unit, description, then its name; a NumberDataPoint's value, then its time, then its labels; a
ResourceMetrics' scopes, then its resource; a KeyValue's value before its key. Repeated fields
keep their order. What otel-ofu receives behind a Collector is laid out so, and its byte readers
must read both layouts alike. tests/test_otlp_scrape_shapes.py checks this function against
the real Collector's output, byte for byte.

    from tools.collector_layout import as_collector_writes
    body = as_collector_writes(request.SerializeToString())
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu.otlp.codec import varint
from otel_ofu.otlp.wire import fields


def as_collector_writes(data: bytes, descriptor: Descriptor = ExportMetricsServiceRequest.DESCRIPTOR) -> bytes:
    """The serialized message ``data`` (of ``descriptor``'s type) with every message's fields in reverse
    declaration order, as the Collector writes them; the repeated ones in their order."""
    order = {field.number: index for index, field in enumerate(descriptor.fields)}
    parts: list[tuple[int, int, bytes]] = []
    for seq, (tag, f_start, p_start, f_end) in enumerate(fields(data, 0, len(data))):
        number = tag >> 3
        field = descriptor.fields_by_number.get(number)
        if field is not None and field.type == FieldDescriptor.TYPE_MESSAGE and tag & 7 == 2:
            payload = as_collector_writes(data[p_start:f_end], field.message_type)
            encoded = varint(tag) + varint(len(payload)) + payload
        else:
            encoded = data[f_start:f_end]
        parts.append((-order.get(number, -1), seq, encoded))
    return b"".join(encoded for _, _, encoded in sorted(parts))
