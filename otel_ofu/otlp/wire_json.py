"""Serialized OTLP -> OTLP JSON, straight from the protobuf bytes (no ``json_format``).

Why: ``json_format`` walks protobuf objects in pure Python, several Python calls per field;
writing a 1,000-GPU fleet's JSON lines through it was about half of the whole pipeline's CPU
(issue 33). OTLP JSON is a fixed mapping of the protobuf (docs/file-exporter.md): the fields
of each message in field-number order under their lowerCamelCase names, 64-bit integers as
strings, enums as integers, NaN and the infinities as strings. This module reads the wire
format once, with a table per message built from the protobuf descriptors, and writes the
text as it goes; what repeats (a resource, an attribute) is looked up by its bytes, and a
ResourceMetrics that is last time's but for its points' times and values (a GPU's, every
interval) is written from a template with them put in.

The output is byte for byte what ``json.dumps(json_format.MessageToDict(request,
use_integers_for_enums=True), separators=(",", ":"))`` writes for the same request (the file
exporter's lines before this module; tests/test_wire_json.py checks it on the corpus and on
random requests), with one correction: trace and span ids are lowercase hex, as the OTLP JSON
encoding requires and the Collector reads (``json_format`` writes base64, which the
Collector refuses). Bytes that are not the canonical encoding (fields out of order, a field
repeated, a message split in two) read as protobuf reads them: a message whose fields come
out of order is ordered, and what only a merge could resolve goes through ``json_format``.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor, json_format, message_factory
from google.protobuf.internal import type_checkers
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_ofu.otlp.codec import varint_at as _varint
from otel_ofu.pipeline.caches import Cache

_quoted = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]  # json.dumps' own (C) string writer
_F64 = struct.Struct("<d")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_ZERO8 = bytes(8)
_ZERO4 = bytes(4)
_HEX_IDS = frozenset({"trace_id", "span_id", "parent_span_id"})  # bytes fields OTLP JSON writes as hex

# What a field is, for the reader below: the wire type it comes in and how its value is written.
_VARINT, _I64_WIRE, _LEN, _I32_WIRE = 0, 1, 2, 5
(_K_INT64, _K_UINT64, _K_INT32, _K_UINT32, _K_BOOL, _K_ENUM, _K_SINT32, _K_SINT64, _K_FIXED64, _K_SFIXED64,
 _K_DOUBLE, _K_FIXED32, _K_SFIXED32, _K_FLOAT, _K_STRING, _K_BYTES, _K_HEX, _K_MESSAGE) = range(18)
_T = descriptor.FieldDescriptor
_KINDS = {
    _T.TYPE_INT64: (_K_INT64, _VARINT), _T.TYPE_UINT64: (_K_UINT64, _VARINT), _T.TYPE_INT32: (_K_INT32, _VARINT),
    _T.TYPE_UINT32: (_K_UINT32, _VARINT), _T.TYPE_BOOL: (_K_BOOL, _VARINT), _T.TYPE_ENUM: (_K_ENUM, _VARINT),
    _T.TYPE_SINT32: (_K_SINT32, _VARINT), _T.TYPE_SINT64: (_K_SINT64, _VARINT),
    _T.TYPE_FIXED64: (_K_FIXED64, _I64_WIRE), _T.TYPE_SFIXED64: (_K_SFIXED64, _I64_WIRE),
    _T.TYPE_DOUBLE: (_K_DOUBLE, _I64_WIRE), _T.TYPE_FIXED32: (_K_FIXED32, _I32_WIRE),
    _T.TYPE_SFIXED32: (_K_SFIXED32, _I32_WIRE), _T.TYPE_FLOAT: (_K_FLOAT, _I32_WIRE),
    _T.TYPE_STRING: (_K_STRING, _LEN), _T.TYPE_BYTES: (_K_BYTES, _LEN), _T.TYPE_MESSAGE: (_K_MESSAGE, _LEN),
}
# Messages whose bytes repeat from request to request (a GPU's resource, an attribute, the
# scope): their JSON is kept by their bytes. About 1 KB each at most.
_CACHED_MESSAGES = frozenset({"opentelemetry.proto.resource.v1.Resource", "opentelemetry.proto.common.v1.KeyValue",
                              "opentelemetry.proto.common.v1.InstrumentationScope"})
_CACHE_SIZE = 1 << 17  # a 100,000-GPU instance's resources, and the attribute pairs


class _Irregular(Exception):
    """Bytes that only protobuf's own merge reads right (a message field given twice, a group)."""


class _Field:
    __slots__ = ("number", "key", "kind", "wire", "repeated", "presence", "schema", "oneof")

    def __init__(self, field: descriptor.FieldDescriptor, schema: _Schema | None):
        self.number = field.number
        self.key = _quoted(field.json_name) + ":"
        kind, self.wire = _KINDS[field.type]
        if kind == _K_BYTES and field.name in _HEX_IDS:
            kind = _K_HEX
        self.kind = kind
        self.repeated = field.is_repeated
        self.presence = field.has_presence  # written even when zero: oneof members, optional, messages
        self.schema = schema
        self.oneof = field.containing_oneof.name if field.containing_oneof is not None else None


class _Schema:
    """A message's fields by number, read from its descriptor once."""

    __slots__ = ("name", "fields", "cache")

    def __init__(self, message: descriptor.Descriptor):
        self.name = message.full_name
        # The JSON of messages of this type by their bytes (one cache per type: equal bytes of two types differ)
        self.cache: Cache | None = Cache(f"otlp json {message.name}", _CACHE_SIZE) \
            if message.full_name in _CACHED_MESSAGES else None
        self.fields: dict[int, _Field] = {}


_schemas: dict[str, _Schema] = {}


def _schema(message: descriptor.Descriptor) -> _Schema:
    found = _schemas.get(message.full_name)
    if found is not None:
        return found
    schema = _schemas[message.full_name] = _Schema(message)  # before its fields: messages nest recursively
    for field in message.fields:
        sub = _schema(field.message_type) if field.type == _T.TYPE_MESSAGE else None
        schema.fields[field.number] = _Field(field, sub)
    return schema


METRICS_REQUEST = _schema(ExportMetricsServiceRequest.DESCRIPTOR)
LOGS_REQUEST = _schema(ExportLogsServiceRequest.DESCRIPTOR)


def _double(raw: bytes, i: int) -> str:
    value = _F64.unpack_from(raw, i)[0]
    if value != value:
        return '"NaN"'
    if value in (float("inf"), float("-inf")):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    return repr(value)


def _float(raw: bytes, i: int) -> str:
    value = _F32.unpack_from(raw, i)[0]
    if value != value:
        return '"NaN"'
    if value in (float("inf"), float("-inf")):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    return repr(type_checkers.ToShortestFloat(value))


def _varint_value(kind: int, value: int) -> str | None:
    """A varint field's JSON; None for its zero value (not written unless the field has presence)."""
    if kind == _K_UINT64:
        return f'"{value}"' if value else None
    if kind == _K_INT64:
        if value >= 1 << 63:
            value -= 1 << 64
        return f'"{value}"' if value else None
    if kind == _K_BOOL:
        return "true" if value else None
    if kind == _K_SINT64:
        value = (value >> 1) ^ -(value & 1)
        return f'"{value}"' if value else None
    value &= 0xFFFFFFFF
    if kind == _K_UINT32:
        return str(value) if value else None
    if kind == _K_SINT32:
        value = (value >> 1) ^ -(value & 1)
    elif value >= 1 << 31:  # int32, enum
        value -= 1 << 32
    return str(value) if value else None


_ZERO_TEXT = {_K_INT64: '"0"', _K_UINT64: '"0"', _K_SINT64: '"0"', _K_FIXED64: '"0"', _K_SFIXED64: '"0"',
              _K_BOOL: "false", _K_STRING: '""', _K_BYTES: '""', _K_HEX: '""', _K_DOUBLE: "0.0", _K_FLOAT: "0.0"}


def _zero(kind: int) -> str:
    """A field with presence set to its zero value (a oneof member, an optional field)."""
    return _ZERO_TEXT.get(kind, "0")


def _skip(raw: bytes, i: int, wire: int) -> int:
    """The index after an unknown field's value."""
    if wire == _VARINT:
        while raw[i] & 0x80:
            i += 1
        return i + 1
    if wire == _I64_WIRE:
        return i + 8
    if wire == _I32_WIRE:
        return i + 4
    if wire == _LEN:
        size, i = _varint(raw, i)
        return i + size
    raise _Irregular("group")


def _packed(field: _Field, raw: bytes, i: int, end: int) -> list[str]:
    """A packed repeated scalar's elements."""
    kind = field.kind
    out = []
    if field.wire == _VARINT:
        while i < end:
            value, i = _varint(raw, i)
            out.append(_varint_value(kind, value) or _zero(kind))
    elif field.wire == _I64_WIRE:
        while i < end:
            out.append(_fixed64(kind, raw, i) or _zero(kind))
            i += 8
    else:
        while i < end:
            out.append(_fixed32(kind, raw, i) or _zero(kind))
            i += 4
    if i != end:
        raise IndexError("packed field cut short")
    return out


def _fixed64(kind: int, raw: bytes, i: int) -> str | None:
    if raw[i:i + 8] == _ZERO8:
        return None
    if kind == _K_DOUBLE:
        return _double(raw, i)
    return f'"{(_U64 if kind == _K_FIXED64 else _I64).unpack_from(raw, i)[0]}"'


def _fixed32(kind: int, raw: bytes, i: int) -> str | None:
    if raw[i:i + 4] == _ZERO4:
        return None
    if kind == _K_FLOAT:
        return _float(raw, i)
    return str((_U32 if kind == _K_FIXED32 else _I32).unpack_from(raw, i)[0])


def _message(schema: _Schema, raw: bytes, i: int, end: int) -> str:
    """The JSON object of the message in ``raw[i:end]``."""
    cache = schema.cache
    if cache is not None:
        chunk = raw[i:end]
        found = cache.get(chunk)
        if found is None:
            found = cache.put(chunk, _message_text(schema, raw, i, end))
        return found
    return _message_text(schema, raw, i, end)


def _message_text(schema: _Schema, raw: bytes, i: int, end: int) -> str:
    fast_path = _FAST_PATHS.get(schema)
    if fast_path is not None:
        fast = fast_path(raw, i, end)
        if fast is not None:
            return fast
    return _fields_text(schema, raw, i, end)


def _fields_text(schema: _Schema, raw: bytes, i: int, end: int) -> str:
    """The general loop: any message, its fields in any order."""
    fields = schema.fields
    values: dict[int, Any] = {}  # field number -> its JSON (a list of element JSONs when repeated)
    ordered = True
    last = 0
    while i < end:
        tag = raw[i]
        if tag < 0x80:
            i += 1
        else:
            tag, i = _varint(raw, i)
        number = tag >> 3
        wire = tag & 7
        field = fields.get(number)
        if field is None or (field.wire != wire and not (field.repeated and wire == _LEN and field.wire != _LEN)):
            i = _skip(raw, i, wire)
            continue
        if number < last:
            ordered = False
        elif number > last:
            last = number
        kind = field.kind
        text: str | None
        if wire == _LEN:
            size = raw[i]
            if size < 0x80:
                i += 1
            else:
                size, i = _varint(raw, i)
            stop = i + size
            if stop > end:
                raise IndexError("field runs past its message")
            if kind == _K_MESSAGE:
                if not field.repeated and number in values:
                    raise _Irregular("a message field given twice is merged")
                text = _message(field.schema, raw, i, stop)  # type: ignore[arg-type]
            elif kind == _K_STRING:
                text = _quoted(raw[i:stop].decode()) if size else None
            elif kind == _K_HEX:
                text = f'"{raw[i:stop].hex()}"' if size else None
            elif kind == _K_BYTES:
                text = f'"{base64.b64encode(raw[i:stop]).decode()}"' if size else None
            else:  # a packed repeated scalar
                values.setdefault(number, []).extend(_packed(field, raw, i, stop))
                i = stop
                continue
            i = stop
        elif wire == _I64_WIRE:
            text = _fixed64(kind, raw, i)
            i += 8
        elif wire == _VARINT:
            value = raw[i]
            if value < 0x80:
                i += 1
            else:
                value, i = _varint(raw, i)
            text = _varint_value(kind, value)
        else:
            text = _fixed32(kind, raw, i)
            i += 4
        if field.repeated:
            values.setdefault(number, []).append(_zero(kind) if text is None else text)
            continue
        if field.oneof is not None:
            for other in [n for n in values if n != number and fields[n].oneof == field.oneof]:
                del values[other]  # the last member of a oneof given wins, as protobuf reads it
        if text is None:
            if field.presence:
                values[number] = _zero(kind)
            else:
                values.pop(number, None)  # a zero given after a value clears it
        else:
            values[number] = text
    if i != end:
        raise IndexError("message cut short")
    if not values:
        return "{}"
    parts = []
    for number in (values if ordered else sorted(values)):
        field = fields[number]
        value = values[number]
        if field.repeated:
            parts.append(field.key + "[" + ",".join(value) + "]")
        else:
            parts.append(field.key + value)
    return "{" + ",".join(parts) + "}"


# --- The shapes nearly every point has, read without the general loop ---------------------------
#
# A Metric is its name, description and unit (the same bytes every interval: their JSON is kept),
# then a Gauge or Sum of NumberDataPoints, each a time, a value and attributes. Anything else
# (exemplars, flags, a field out of order) returns None: the general loop reads it.

_METRIC = _schema(metrics_pb2.Metric.DESCRIPTOR)
_SCOPE_METRICS = _schema(metrics_pb2.ScopeMetrics.DESCRIPTOR)
_SCOPE = _SCOPE_METRICS.fields[1].schema
_SCOPE_KEY = _SCOPE_METRICS.fields[1].key
_METRICS_KEY = _SCOPE_METRICS.fields[2].key
_NUMBER_POINT = _schema(metrics_pb2.NumberDataPoint.DESCRIPTOR)
_KEY_VALUE = _schema(common_pb2.KeyValue.DESCRIPTOR)
_KEY_VALUES: Cache = _KEY_VALUE.cache  # type: ignore[assignment]
_GAUGE_KEY = _METRIC.fields[5].key + "{" + _METRIC.fields[5].schema.fields[1].key  # type: ignore[union-attr]
_SUM_KEY = _METRIC.fields[7].key + "{" + _METRIC.fields[7].schema.fields[1].key  # type: ignore[union-attr]
_heads: Cache = Cache("otlp json metric heads", 1 << 14)  # a Metric's name, description, unit bytes -> JSON


# --- A resource's metrics, the same but for their points' times and values: one template ------------
#
# A GPU's ResourceMetrics has the same bytes every interval but for each point's time and value
# (fixed64 and double: the same sizes). Kept per resource (the resource field's bytes) is a struct
# format that reads the bytes between them (to check they are unchanged), the times and the
# values in one call, and a %-format of the JSON that writes the times and values in and skips
# the rest (%.0s): one unpack, two tuple comparisons and one format per resource. A time of 0 (not
# written) or a value that is not finite (written as a string) takes the general path.

_RESOURCE_METRICS = _schema(metrics_pb2.ResourceMetrics.DESCRIPTOR)
# About 5 KB each (a GPU's JSON format and bytes): 32,768 resources is about 160 MB at most.
_rm_templates: Cache = Cache("otlp json resource templates", 1 << 15)  # resource field bytes -> template
_MARK_TIME = 1_000_000_000_000_000_000  # probe times and values, found again in the probe's JSON
_MARK_VALUE = float(1 << 50)


class _RmTemplate:
    __slots__ = ("size", "check", "expected", "read", "text", "hits", "misses")

    def __init__(self, size: int, check: struct.Struct, expected: tuple, read: struct.Struct, text: str):
        self.size = size
        self.check = check  # reads the bytes around the times and values (and as_double's tags)
        self.expected = expected  # ... as they must be
        self.read = read  # reads the times and values: (time, value, time, value, ...)
        self.text = text  # the JSON, a %-format of the times (%d) and values (%r)
        self.hits = self.misses = 0


def _resource_metrics(raw: bytes, i: int, end: int) -> str | None:
    if i >= end or raw[i] != 0x0A:
        return None
    size, j = _varint(raw, i + 1)
    key = raw[i:j + size]
    template = _rm_templates.get(key)
    if template is not None:
        if template.size == end - i and template.check.unpack_from(raw, i) == template.expected:
            values = template.read.unpack_from(raw, i)
            if 0 not in values[0::2] and all(map(math.isfinite, values[1::2])):
                template.hits += 1
                return template.text % values
            return None  # this time only: a time of 0, a NaN
        template.misses += 1
        if template.misses > template.hits + 1:
            return None  # its other points change too (a sum's start, a flag): the general path
    template = _rm_template(raw, i, end)
    if template is not None:
        _rm_templates.put(key, template)
        return _resource_metrics(raw, i, end)
    return None


def _rm_template(raw: bytes, i: int, end: int) -> _RmTemplate | None:
    """The template of the ResourceMetrics in ``raw[i:end]``; None when it has no point to put in."""
    holes = _time_value_offsets(raw, i, end)
    if not holes:
        return None
    probe = bytearray(raw[i:end])
    marks = []
    for k, at in enumerate(holes):
        t, value = _MARK_TIME + k, _MARK_VALUE + k
        probe[at - i:at - i + 17] = _TIME_VALUE.pack(t, value)
        probe[at - i + 8] = 0x21
        marks.append(f'"{t}","asDouble":{value!r}')
    try:
        text = _fields_text(_RESOURCE_METRICS, bytes(probe), 0, len(probe))
    except (_Irregular, IndexError, struct.error, UnicodeDecodeError):
        return None
    pieces = []  # the JSON before each point's time (from the previous point's value on)
    rest = text
    for mark in marks:
        if rest.count(mark) != 1:
            return None
        before, rest = rest.split(mark)
        pieces.append(before)
    text_format = "".join([piece.replace("%", "%%") + '"%d","asDouble":%r' for piece in pieces])
    text_format += rest.replace("%", "%%")
    check = read = "<"
    expected = []
    last = i
    for at in holes:
        check += f"{at - last}s8xs8x"
        read += f"{at - last}xQxd"
        expected += [raw[last:at], b"\x21"]
        last = at + 17
    check += f"{end - last}s"
    expected.append(raw[last:end])
    return _RmTemplate(end - i, struct.Struct(check), tuple(expected), struct.Struct(read), text_format)


def _time_value_offsets(raw: bytes, i: int, end: int) -> list[int]:
    """Where the time of each gauge or sum point laid out as time, as_double, then anything is (the
    point's value 9 bytes after), in a ResourceMetrics."""
    out: list[int] = []
    for tag, start, stop in _len_fields(raw, i, end):
        if tag != 0x12:
            continue
        for tag2, start2, stop2 in _len_fields(raw, start, stop):  # a ScopeMetrics
            if tag2 != 0x12:
                continue
            for tag3, start3, stop3 in _len_fields(raw, start2, stop2):  # a Metric
                if tag3 not in (0x2A, 0x3A):
                    continue
                for tag4, p, stop4 in _len_fields(raw, start3, stop3):  # a Gauge or Sum
                    if tag4 != 0x0A:
                        continue
                    if raw[p] == 0x11:
                        p += 9
                    if p + 17 <= stop4 and raw[p] == 0x19 and raw[p + 9] == 0x21:
                        out.append(p + 1)
    return out


def _len_fields(raw: bytes, i: int, end: int) -> list[tuple[int, int, int]]:
    """(tag, value start, value end) of a message's length-delimited fields; [] if it holds others."""
    out = []
    while i < end:
        tag, i = _varint(raw, i)
        wire = tag & 7
        if wire == _LEN:
            size, i = _varint(raw, i)
            out.append((tag, i, i + size))
            i += size
        elif wire == _VARINT:
            _, i = _varint(raw, i)
        elif wire in (_I64_WIRE, _I32_WIRE):
            i += 8 if wire == _I64_WIRE else 4
        else:
            return []
    return out


def _scope_metrics(raw: bytes, i: int, end: int) -> str | None:
    """A ScopeMetrics: its scope (kept by its bytes), then its metrics, each through :func:`_metric`."""
    parts = []
    if i < end and raw[i] == 0x0A:
        size, j = _varint(raw, i + 1)
        parts.append(_SCOPE_KEY + _message(_SCOPE, raw, j, j + size))
        i = j + size
    metrics = []
    while i < end and raw[i] == 0x12:
        size = raw[i + 1]
        if size < 0x80:
            i += 2
        else:
            size, i = _varint(raw, i + 1)
        metric = _metric(raw, i, i + size)
        metrics.append(metric if metric is not None else _fields_text(_METRIC, raw, i, i + size))
        i += size
    if i != end:
        return None  # a schema URL, or fields out of order: the general loop
    if metrics:
        parts.append(_METRICS_KEY + "[" + ",".join(metrics) + "]")
    return "{" + ",".join(parts) + "}"


def _metric(raw: bytes, i: int, end: int) -> str | None:
    j = i
    while j < end and raw[j] in (0x0A, 0x12, 0x1A):  # name, description, unit
        size = raw[j + 1]
        if size < 0x80:
            j += 2 + size
        else:
            size, j = _varint(raw, j + 1)
            j += size
    if (end - j < 0x80 and raw[j] == 0x2A and raw[j + 2] == 0x0A and raw[j + 4] == 0x19 and raw[j + 13] == 0x21
            and raw[j + 1] == end - j - 2 and raw[j + 3] == end - j - 4):
        # A gauge of one point: its time, its value, then (only) attributes: written from a template.
        key = (raw[i:j], raw[j + 22:end])
        template = _one_point_gauges.get(key)
        if template is None:
            template = _one_point_template(raw, i, j, end)
            if template is not None:
                _one_point_gauges.put(key, template)
        if template:
            t, value = _TIME_VALUE.unpack_from(raw, j + 5)
            if t:
                if value != value or value in _INFINITIES:
                    return template[0] + str(t) + template[1] + _double(raw, j + 14) + template[2]
                return template[0] + str(t) + template[1] + repr(value) + template[2]
    return _metric_general(raw, i, j, end)


def _metric_general(raw: bytes, i: int, j: int, end: int) -> str | None:
    """A Metric whose name, description and unit are ``raw[i:j]``: its head's JSON kept, its points read."""
    head = _heads.get(raw[i:j])
    if head is None:
        head = _heads.put(raw[i:j], _fields_text(_METRIC, raw, i, j)[:-1])
    if j == end:
        return head + "}"
    tag = raw[j]
    if tag != 0x2A and tag != 0x3A:  # a gauge, a sum
        return None
    size, j = _varint(raw, j + 1)
    if j + size != end:
        return None
    points = []
    while j < end and raw[j] == 0x0A:
        size = raw[j + 1]
        if size < 0x80:
            j += 2
        else:
            size, j = _varint(raw, j + 1)
        point = _number_point(raw, j, j + size)
        if point is None:
            return None
        points.append(point)
        j += size
    tail = ""
    if tag == 0x3A and j < end:  # the sum's temporality and monotonic flag
        temporality = monotonic = 0
        if raw[j] == 0x10:
            temporality, j = _varint(raw, j + 1)
        if j < end and raw[j] == 0x18:
            monotonic, j = _varint(raw, j + 1)
        if temporality >= 1 << 31 or monotonic >= 1 << 32:
            return None
        if temporality:
            tail += ',"aggregationTemporality":' + str(temporality)
        if monotonic:
            tail += ',"isMonotonic":true'
    if j != end:
        return None
    if not points:
        return None
    separator = "," if len(head) > 1 else ""
    return head + separator + (_GAUGE_KEY if tag == 0x2A else _SUM_KEY) + "[" + ",".join(points) + "]" + tail + "}}"


_one_point_gauges: Cache = Cache("otlp json one-point gauges", _CACHE_SIZE)  # (head, attributes) -> template
_TIME_VALUE = struct.Struct("<Qxd")  # a point's time, the value's tag, the value
_INFINITIES = (float("inf"), float("-inf"))


def _one_point_template(raw: bytes, i: int, j: int, end: int) -> tuple[str, str, str] | tuple[()]:
    """(before the time, between the time and the value, after the value) of a one-point gauge Metric's
    JSON, from the Metric written with a time of 1 and a value of 0.5 in their place; () when the
    general loop is to write it (its point's attributes are not plain KeyValues)."""
    probe = bytearray(raw[i:end])
    at = j + 5 - i
    probe[at:at + 17] = _TIME_VALUE.pack(1, 0.5)
    probe[at + 8] = 0x21
    text = _metric_general(bytes(probe), 0, j - i, len(probe))
    marked = '"timeUnixNano":"1","asDouble":0.5'
    if text is None or text.count(marked) != 1:
        return ()
    before, after = text.split(marked)
    return before + '"timeUnixNano":"', '","asDouble":', after


def _number_point(raw: bytes, i: int, end: int) -> str | None:
    out = []
    tag = raw[i] if i < end else 0
    if tag == 0x11:
        value = _U64.unpack_from(raw, i + 1)[0]
        if value:
            out.append(f'"startTimeUnixNano":"{value}"')
        i += 9
        tag = raw[i] if i < end else 0
    if tag == 0x19:
        value = _U64.unpack_from(raw, i + 1)[0]
        if value:
            out.append(f'"timeUnixNano":"{value}"')
        i += 9
        tag = raw[i] if i < end else 0
    if tag == 0x21:
        out.append('"asDouble":' + _double(raw, i + 1))
        i += 9
        tag = raw[i] if i < end else 0
    elif tag == 0x31:
        out.append(f'"asInt":"{_I64.unpack_from(raw, i + 1)[0]}"')
        i += 9
        tag = raw[i] if i < end else 0
    if tag == 0x3A:
        attributes = []
        get = _KEY_VALUES.get
        while i < end and raw[i] == 0x3A:
            size = raw[i + 1]
            if size < 0x80:
                i += 2
            else:
                size, i = _varint(raw, i + 1)
            chunk = raw[i:i + size]
            text = get(chunk)
            attributes.append(text if text is not None else _message(_KEY_VALUE, raw, i, i + size))
            i += size
        out.append('"attributes":[' + ",".join(attributes) + "]")
    if i != end:
        return None
    return "{" + ",".join(out) + "}"


_METRICS_CLASS = message_factory.GetMessageClass(ExportMetricsServiceRequest.DESCRIPTOR)
_LOGS_CLASS = message_factory.GetMessageClass(ExportLogsServiceRequest.DESCRIPTOR)


def request_json(request: bytes, logs: bool = False) -> str:
    """A serialized ExportMetricsServiceRequest (``logs``: ExportLogsServiceRequest) as one line of OTLP JSON.

    Raises ``google.protobuf.message.DecodeError`` for bytes that are not such a request.
    """
    schema = LOGS_REQUEST if logs else METRICS_REQUEST
    try:
        return _message_text(schema, request, 0, len(request))
    except (_Irregular, IndexError, struct.error, UnicodeDecodeError):
        message = (_LOGS_CLASS if logs else _METRICS_CLASS).FromString(request)  # a DecodeError if broken
        return json_format_line(message)


def json_format_line(message: Any) -> str:
    """``json_format``'s line for a message, trace and span ids in hex (the slow path, and the reference)."""
    return json.dumps(hex_ids(json_format.MessageToDict(message, use_integers_for_enums=True)), separators=(",", ":"))


_HEX_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})


def hex_ids(value: Any) -> Any:
    """``json_format``'s dict with its base64 trace and span ids in hex, as OTLP JSON writes them."""
    if isinstance(value, dict):
        return {k: (base64.b64decode(v).hex() if k in _HEX_KEYS and isinstance(v, str) else hex_ids(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [hex_ids(v) for v in value]
    return value


# The messages with a fast path of their own (None from it: their bytes are irregular, the general loop writes them).
_FAST_PATHS: dict[_Schema, Callable[[bytes, int, int], str | None]] = {
    _RESOURCE_METRICS: _resource_metrics, _SCOPE_METRICS: _scope_metrics, _METRIC: _metric,
    _NUMBER_POINT: _number_point}
