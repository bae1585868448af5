"""Metric points <-> OTLP protobuf messages and OTLP JSON.

One ``ExportMetricsServiceRequest`` per batch; points are grouped by resource (one
ResourceMetrics per distinct resource: a GPU, a job, otel-ofu itself) and by metric name
within the ``otel-ofu`` scope. Grouping by resource once, here, avoids the SDK encoder's
trap where equal resources replace each other (REFERENCE.md section 8).

The JSON form is the OTLP/JSON mapping the Collector's file exporter writes: one request
per line, lowerCamelCase keys, 64-bit integers as strings, enums as integers.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Iterable, Iterator
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_ofu import __version__
from otel_ofu.core.metrics import METRICS, MetricInfo
from otel_ofu.core.model import Attributes, Event, MetricPoint, PointRow
from otel_ofu.pipeline.caches import Cache, on_release

SCOPE_NAME = "otel-ofu"
CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE


def _any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def _key_values(attributes: Attributes) -> list[KeyValue]:
    return [KeyValue(key=k, value=_any_value(v)) for k, v in attributes]


def from_any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value"):
        return json_format.MessageToJson(getattr(value, kind), indent=None)
    return getattr(value, kind)


def attributes_of(key_values: Iterable[KeyValue]) -> Attributes:
    """Sorted (key, value) pairs; a key repeated (which OTLP forbids) keeps its last value.

    Sorted by key only: values of different types do not compare (found by benchmarks/fuzz.py).
    """
    return tuple(sorted({kv.key: from_any_value(kv.value) for kv in key_values}.items(), key=lambda kv: kv[0]))


# --- Points -> serialized OTLP, written straight to the wire format ---------------------------
#
# Why bytes and not protobuf objects: building a KeyValue per attribute per point costs more
# than the rest of the pipeline (benchmarks/throughput.py). A resource or attribute set
# repeats across a GPU's points, a job's GPUs and every interval, so each (key, value) pair
# is encoded once (bounded cache) and the messages around it are concatenated. Fields are
# written in field-number order, as protobuf's own serializer does; tests compare the result
# with the message-built request.

_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_TIME_VALUE = struct.Struct("<BQBd")  # NumberDataPoint time_unix_nano and as_double, with their tags
_TIME_TAGGED = struct.Struct("<QB")  # a time and the next field's tag (as_double's)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_PAIR_CACHE_SIZE = 16384  # distinct (key, value) attribute pairs kept encoded


def varint(n: int) -> bytes:
    """Protobuf base-128 varint encoding of a non-negative int (lengths, tags, uint64)."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SHORT = 1 << 12
_VARINTS = tuple(varint(n) for n in range(_SHORT))  # every length below 4 KiB (a GPU's metrics), encoded


def _len_field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte(s), the payload length, the payload."""
    n = len(payload)
    return tag + (_VARINTS[n] if n < _SHORT else varint(n)) + payload


def _any_value_bytes(value: Any) -> bytes:
    """An AnyValue, as :func:`_any_value` builds it (a oneof: its default value is still written)."""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"Value out of range: {value}")
        return b"\x18" + varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _F64.pack(value)
    return _len_field(b"\x0a", str(value).encode())


def _key_value_field(tag: bytes, key: str, value: Any) -> bytes:
    """One KeyValue as a field under ``tag`` (1 in a Resource, 7 in a NumberDataPoint)."""
    encoded_key = key.encode()
    head = _len_field(b"\x0a", encoded_key) if encoded_key else b""
    return _len_field(tag, head + _len_field(b"\x12", _any_value_bytes(value)))


# ``typed``: True, 1 and 1.0 are equal keys but encode differently. Floats are not cached
# (0.0 and -0.0 are equal keys too); attribute values are nearly always strings.
_cached_key_value_field = functools.lru_cache(maxsize=_PAIR_CACHE_SIZE, typed=True)(_key_value_field)
on_release(_cached_key_value_field.cache_clear)


def _attributes_bytes(attributes: Attributes, tag: bytes) -> bytes:
    """Repeated KeyValue fields under ``tag``: what ``attributes.extend(_key_values(...))`` writes."""
    try:
        return b"".join([_key_value_field(tag, k, v) if isinstance(v, float) else _cached_key_value_field(tag, k, v)
                         for k, v in attributes])
    except TypeError:  # an unhashable value: encoded, just not cached
        return b"".join([_key_value_field(tag, k, v) for k, v in attributes])


# Each resource object encoded once: a GPU's resource is the same tuple interval after interval
# (the decoder and the ofu processor keep them), and its pairs (host, UUID, pod) are too many
# for the pair cache in a large fleet. By identity, not equality: (("k", 1),) and (("k", True),)
# are equal tuples that encode differently. Holding the tuple keeps its id from being reused.
# About 1 KB each: 131,072 resources (a 100,000-GPU instance) is about 130 MB at most.
_RESOURCE_CACHE_SIZE = 1 << 17
_resource_fields: Cache = Cache("otlp encoded resources", _RESOURCE_CACHE_SIZE)  # id -> (resource, bytes)


def _resource_field(resource: Attributes) -> bytes:
    """ResourceMetrics.resource as a field: the Resource message with the attributes (kept, bounded)."""
    found = _resource_fields.get(id(resource))
    if found is not None and found[0] is resource:
        return found[1]
    encoded = _len_field(b"\x0a", _attributes_bytes(resource, b"\x0a"))
    _resource_fields.put(id(resource), (resource, encoded))
    return encoded


_METRIC_HEADS: Cache = Cache("otlp metric heads", 4096)  # (name, unit) -> (definition, bytes); names are few


def _metric_head(name: str, unit: str) -> bytes:
    """A Metric's name, description and unit fields (everything before its data), built once per metric."""
    info = METRICS.get(name)
    cached = _METRIC_HEADS.get((name, unit))
    if cached is not None and cached[0] is info:
        return cached[1]
    head = _len_field(b"\x0a", name.encode())
    description = info.description if info else ""
    if description:
        head += _len_field(b"\x12", description.encode())
    unit_text = info.unit if info else unit
    if unit_text:
        head += _len_field(b"\x1a", unit_text.encode())
    _METRIC_HEADS.put((name, unit), (info, head))
    return head


@functools.lru_cache(maxsize=1)
def _scope_bytes(version: str) -> bytes:
    """ScopeMetrics.scope: the otel-ofu instrumentation scope."""
    return _len_field(b"\x0a", _len_field(b"\x0a", SCOPE_NAME.encode()) + _len_field(b"\x12", version.encode()))


_SUM_TAIL = b"\x10" + bytes((CUMULATIVE,)) + b"\x18\x01"  # aggregation_temporality, is_monotonic


def _data_point(point: MetricPoint, attributes: bytes) -> bytes:
    """One NumberDataPoint: start time (when set), time, as_double, attributes."""
    start, t = point.start_time_unix_nano, point.time_unix_nano
    if t and not start:  # the common case, in one pack
        return _TIME_VALUE.pack(0x19, t, 0x21, float(point.value)) + attributes
    body = (b"\x11" + _U64.pack(start)) if start else b""
    if t:
        body += b"\x19" + _U64.pack(t)
    return body + b"\x21" + _F64.pack(float(point.value)) + attributes


_GAUGE_PREFIXES: Cache = Cache("otlp gauge prefixes", 4096)  # (name, unit, attributes size) -> (definition, bytes)


def _gauge_prefix(name: str, unit: str, attributes_size: int) -> bytes:
    """Everything of a one-point gauge Metric field before its point's time, value and attributes.

    It depends only on the metric and the size of the point's attributes, so each GPU's
    points reuse it: one lookup instead of three length-prefixed wrappers per point.
    """
    info = METRICS.get(name)
    cached = _GAUGE_PREFIXES.get((name, unit, attributes_size))
    if cached is not None and cached[0] is info:
        return cached[1]
    head = _metric_head(name, unit)
    point_size = _TIME_VALUE.size + attributes_size
    point_field = b"\x0a" + varint(point_size)
    gauge_field = b"\x2a" + varint(len(point_field) + point_size)
    metric_size = len(head) + len(gauge_field) + len(point_field) + point_size
    prefix = b"\x12" + varint(metric_size) + head + gauge_field + point_field
    _GAUGE_PREFIXES.put((name, unit, attributes_size), (info, prefix))
    return prefix


# --- A resource whose metrics are plain gauge points, written from a template ------------------
#
# Why: that is what the ofu processor makes for a GPU every interval (gpu.ofu, gpu.ofu.raw, the
# reference clock, FLOP/s, the loss account's parts, the inputs), and a jobs tier forwards the
# same. Its bytes are the same every interval but for each point's time and value (fixed64: the
# same sizes), so the whole ResourceMetrics field is kept as a template, per resource object and
# point count, and written with one struct call. A metric's points lie next to each other (the
# loss account's parts: one metric, several points). Checked on every use: the same resource
# object, and per point the same metric name, unit, attribute tuple object and metric definition;
# anything else builds it anew.

_TEMPLATE_CACHE_SIZE = 1 << 17  # resources (a 100,000-GPU instance's GPUs), about 2 KB each
_templates: Cache = Cache("otlp resource templates", _TEMPLATE_CACHE_SIZE)  # (id, points) -> template


class _PlainTemplate:
    __slots__ = ("resource", "signature", "packer", "head", "tails", "revision")

    def __init__(self, resource: Attributes, signature: tuple[tuple[str, str, Attributes, MetricInfo | None], ...],
                 packer: struct.Struct, head: bytes, tails: tuple[bytes, ...]):
        self.resource = resource
        self.revision = METRICS.revision  # the metric definitions it was built from (descriptions, units)
        self.signature = signature  # per point: its metric's name, unit, its attributes, the metric's METRICS entry
        self.packer = packer
        self.head = head  # the bytes before the first point's time
        self.tails = tails  # per point: the bytes after its value, up to the next point's time


def _by_metric(points: list[MetricPoint]) -> dict[str, list[MetricPoint]] | None:
    """A resource's points by metric, in order; None when a metric's points are not next to each other."""
    metrics: dict[str, list[MetricPoint]] = {}
    last = None
    for point in points:
        if point.name != last:
            if point.name in metrics:
                return None
            last = point.name
            metrics[last] = []
        metrics[last].append(point)
    return metrics


def _plain(point: MetricPoint) -> bool:
    """A plain gauge point: a time, no start time."""
    return bool(point.time_unix_nano) and not point.start_time_unix_nano and not point.monotonic


def _plain_resource_metrics(resource: Attributes, points: list[MetricPoint], scope: bytes) -> bytes | None:
    """The ResourceMetrics field for a resource's ``points`` from its template; None: not all plain
    (gauge points with a time and no start time, each metric's points next to each other)."""
    key = (id(resource), len(points))
    template = _templates.get(key)
    if template is not None and template.resource is resource and template.revision == METRICS.revision:
        args: list[Any] = [template.head]
        for (name, unit, attributes, _), point, tail in zip(template.signature, points, template.tails):
            if (point.attributes is not attributes or point.name != name or point.unit != unit
                    or point.start_time_unix_nano or point.monotonic or not point.time_unix_nano):
                break
            args += (point.time_unix_nano, 0x21, float(point.value), tail)
        else:
            return template.packer.pack(*args)
    metrics = _by_metric(points)
    if metrics is None:
        return None  # a metric's points apart: not this template's
    template = _plain_template(resource, metrics, scope)
    if template is None:
        return None
    _templates.put(key, template)
    return _plain_resource_metrics(resource, points, scope)


def _plain_template(resource: Attributes, metrics: dict[str, list[MetricPoint]], scope: bytes
                    ) -> _PlainTemplate | None:
    signature = []
    bodies = []  # per point: its metric's bytes up to its time (the metric head for its first), and after its value
    scope_size = len(scope)
    for name, pts in metrics.items():
        unit = pts[0].unit
        if not all(_plain(p) and p.unit == unit for p in pts):
            return None
        encoded = [_attributes_bytes(p.attributes, b"\x3a") for p in pts]
        if len(pts) == 1:
            prefix = _gauge_prefix(name, unit, len(encoded[0]))
            bodies.append((prefix + b"\x19", encoded[0]))
            scope_size += len(prefix) + 18 + len(encoded[0])
        else:
            point_fields = [b"\x0a" + varint(_TIME_VALUE.size + len(a)) for a in encoded]
            gauge_size = sum(len(f) + _TIME_VALUE.size + len(a) for f, a in zip(point_fields, encoded))
            head = _metric_head(name, unit)
            gauge_field = b"\x2a" + varint(gauge_size)
            metric_prefix = b"\x12" + varint(len(head) + len(gauge_field) + gauge_size) + head + gauge_field
            for k, (field, attributes) in enumerate(zip(point_fields, encoded)):
                bodies.append(((metric_prefix if k == 0 else b"") + field + b"\x19", attributes))
            scope_size += len(metric_prefix) + gauge_size
        info = METRICS.get(name)
        signature += [(name, unit, p.attributes, info) for p in pts]
    # Everything but the points' 17 bytes each (time, the value's tag, value) is known now: the sizes too.
    head = _len_field(b"\x0a", _attributes_bytes(resource, b"\x0a")) + b"\x12" + varint(scope_size)
    first = b"\x0a" + varint(len(head) + scope_size) + head + scope + bodies[0][0]
    # Shared by every GPU whose points look alike: only the first part holds the resource.
    tails = tuple(_shared(tail + (bodies[i + 1][0] if i + 1 < len(bodies) else b""))
                  for i, (_, tail) in enumerate(bodies))
    fmt = "<" + f"{len(first)}s" + "".join(f"QBd{len(tail)}s" for tail in tails)
    return _PlainTemplate(resource, _shared_signature(tuple(signature)), _packer(fmt), first, tails)


_shared_parts: Cache = Cache("otlp template parts", _TEMPLATE_CACHE_SIZE)
_signatures: Cache = Cache("otlp template signatures", _TEMPLATE_CACHE_SIZE)


def _shared_signature(signature: tuple[tuple[str, str, Attributes, MetricInfo | None], ...]) -> tuple:
    """One signature object for GPUs whose metrics carry the same attribute objects (by identity)."""
    key = tuple((name, unit, id(a), id(i)) for name, unit, a, i in signature)
    found = _signatures.get(key)
    return found if found is not None else _signatures.put(key, signature)


_packers: Cache = Cache("otlp template packers", 4096)  # format -> struct.Struct, about 1 KB each


def _shared(part: bytes) -> bytes:
    """One bytes object for equal template parts (bounded like the templates)."""
    return _shared_parts.shared(part)


def _packer(fmt: str) -> struct.Struct:
    """One Struct per format: about 1 KB each, and GPUs with equal sizes share one."""
    found = _packers.get(fmt)
    return found if found is not None else _packers.put(fmt, struct.Struct(fmt))


# --- A PointRow (a GPU's points of one window), written from a template of its layout --------------
#
# The same bytes as its points through _plain_resource_metrics (the template is built from them),
# without making them: kept per resource object and layout object (each held by the template, so
# neither id is reused while it lives); the row's time and values go into a copy of the template's
# argument list by two slice assignments and one struct call.

_row_templates: Cache = Cache("otlp row templates", _TEMPLATE_CACHE_SIZE)  # (id, id) -> _RowTemplate


class _RowTemplate:
    __slots__ = ("resource", "layout", "revision", "packer", "args", "times")

    def __init__(self, resource: Attributes, layout: object, template: _PlainTemplate):
        self.resource = resource
        self.layout = layout
        self.revision = template.revision
        tails = template.tails
        # The plain template's format with each point's time and the value's tag as one 9-byte
        # piece: the row's points share their time, so it is packed once.
        self.packer = _packer("<" + f"{len(template.head)}s" + "".join(f"9sd{len(tail)}s" for tail in tails))
        args: list[Any] = [template.head]
        for tail in tails:
            args += (b"", 0.0, tail)
        self.args = args  # the packer's arguments with each point's time and value left to fill in
        self.times = len(tails)


def _row_resource_metrics(row: PointRow, scope: bytes) -> bytes | None:
    """The ResourceMetrics field of a row alone on its resource; None: its points are not plain (no time)."""
    resource, layout = row.resource, row.layout
    key = (id(resource), id(layout))
    template = _row_templates.get(key)
    if template is None or template.resource is not resource or template.layout is not layout \
            or template.revision != METRICS.revision:
        points = row.points()
        metrics = _by_metric(points)
        if metrics is None:
            return None  # a metric's points apart
        plain = _plain_template(resource, metrics, scope)
        if plain is None:
            return None
        template = _row_templates.put(key, _RowTemplate(resource, layout, plain))
    args = template.args.copy()
    args[1::3] = [_TIME_TAGGED.pack(row.time_unix_nano, 0x21)] * template.times
    args[2::3] = row.values
    return template.packer.pack(*args)


def encode_request(points: Iterable[MetricPoint | PointRow]) -> bytes:
    """:func:`to_request`'s message, serialized: one ResourceMetrics per resource, a Metric per name.

    ``points`` may hold :class:`PointRow`s (``Batch.points_and_rows``): each is its points, in place.
    """
    return b"".join(request_fields(points))


def request_fields(points: Iterable[MetricPoint | PointRow]) -> list[bytes]:
    """:func:`encode_request`'s message as its ResourceMetrics fields (tag, length, message), in order:
    joined with other such fields (a pass-through's) they make one request, copied once."""
    by_resource: dict[Attributes, list] = {}
    last_resource: Attributes | None = None
    group: list = []
    rows = False
    for point in points:
        resource = point.resource
        if resource is not last_resource:  # a sample's points are adjacent and share one tuple: hash it once
            group = by_resource.setdefault(resource, [])
            last_resource = resource
        group.append(point)
        if type(point) is PointRow:
            rows = True
    scope = _scope_bytes(__version__)
    point_attributes: dict[int, tuple[Attributes, bytes]] = {}  # id(attributes) -> encoded, for this call
    prefixes: dict[tuple[str, str, int], bytes] = {}  # _gauge_prefix, for this call
    pack = _TIME_VALUE.pack
    out = []
    for resource, resource_points in by_resource.items():
        if rows:
            if len(resource_points) == 1 and type(resource_points[0]) is PointRow:
                plain = _row_resource_metrics(resource_points[0], scope)
                if plain is not None:
                    out.append(plain)
                    continue
            resource_points = _expanded(resource_points)
        plain = _plain_resource_metrics(resource, resource_points, scope)
        if plain is not None:
            out.append(plain)
            continue
        metrics: dict[str, list[MetricPoint]] = {}
        for point in resource_points:
            metrics.setdefault(point.name, []).append(point)
        parts = [scope]
        for name, pts in metrics.items():
            encoded = []
            for p in pts:
                attributes = p.attributes
                cached = point_attributes.get(id(attributes))
                if cached is None or cached[0] is not attributes:
                    cached = point_attributes[id(attributes)] = (attributes, _attributes_bytes(attributes, b"\x3a"))
                encoded.append(cached[1])
            first = pts[0]
            if len(pts) == 1 and first.time_unix_nano and not first.start_time_unix_nano and not first.monotonic:
                # The usual case (one point per GPU and metric in a batch): a cached prefix.
                key = (name, first.unit, len(encoded[0]))
                prefix = prefixes.get(key)
                if prefix is None:
                    prefix = prefixes[key] = _gauge_prefix(*key)
                parts.append(prefix + pack(0x19, first.time_unix_nano, 0x21, float(first.value)) + encoded[0])
                continue
            data = b"".join([_len_field(b"\x0a", _data_point(p, a)) for p, a in zip(pts, encoded)])
            if first.monotonic:
                data = _len_field(b"\x3a", data + _SUM_TAIL)
            else:
                data = _len_field(b"\x2a", data)
            parts.append(_len_field(b"\x12", _metric_head(name, first.unit) + data))
        rm = _resource_field(resource) + _len_field(b"\x12", b"".join(parts))
        out.append(_len_field(b"\x0a", rm))
    return out


def _expanded(items: list[MetricPoint | PointRow]) -> list[MetricPoint]:
    """Points and rows as points, in order."""
    out: list[MetricPoint] = []
    for item in items:
        if type(item) is PointRow:
            out += item.points()
        else:
            out.append(item)  # type: ignore[arg-type]
    return out


def to_request(points: Iterable[MetricPoint]) -> ExportMetricsServiceRequest:
    """Build one export request; points of one resource and name share a Metric."""
    return ExportMetricsServiceRequest.FromString(encode_request(points))


def count_data_points(resource_metrics: metrics_pb2.ResourceMetrics) -> int:
    """Gauge, sum, histogram and summary data points of one ResourceMetrics."""
    count = 0
    for scope_metrics in resource_metrics.scope_metrics:
        for metric in scope_metrics.metrics:
            kind = metric.WhichOneof("data")
            if kind:
                count += len(getattr(metric, kind).data_points)
    return count


class WireResourceMetrics:
    """A pass-through ResourceMetrics together with its serialized form, as a request field.

    Why: re-serializing what a receiver forwards untouched costs about as much as decoding it.
    The otlp receiver keeps the bytes it received (the join's inputs and decoded metrics cut
    out, see :func:`otel_ofu.otlp.join.split`), so exporters that send protobuf append them
    as they are; the others read ``message``, parsed from ``field`` when first read (:meth:`of`)
    since most pipelines never need it.
    """

    __slots__ = ("field", "points", "_message")

    def __init__(self, message: metrics_pb2.ResourceMetrics | None, field: bytes, points: int):
        self.field = field  # ExportMetricsServiceRequest.resource_metrics: tag, length, the message's bytes
        self.points = points  # data points in it
        self._message = message

    @classmethod
    def of(cls, field: bytes, points: int) -> WireResourceMetrics:
        """From the field's bytes alone: the message is parsed only if someone reads it."""
        return cls(None, field, points)

    @property
    def message(self) -> metrics_pb2.ResourceMetrics:
        if self._message is None:
            self._message = ExportMetricsServiceRequest.FromString(self.field).resource_metrics[0]
        return self._message

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WireResourceMetrics):
            return NotImplemented
        return self.field == other.field and self.points == other.points

    def __hash__(self) -> int:
        return hash((self.field, self.points))

    def __repr__(self) -> str:
        return f"WireResourceMetrics({len(self.field)} bytes, {self.points} points)"


def passthrough_messages(passthrough: Iterable[object]) -> list[metrics_pb2.ResourceMetrics]:
    """The OTLP ResourceMetrics among a batch's pass-through objects (kept in their wire form or not)."""
    out = []
    for item in passthrough:
        if isinstance(item, WireResourceMetrics):
            out.append(item.message)
        elif isinstance(item, metrics_pb2.ResourceMetrics):
            out.append(item)
    return out


def forwarded_resource_metrics(passthrough: Iterable[object]) -> list[tuple[bytes, int]]:
    """Pass-through ResourceMetrics as request fields (tag, length, message) and their point counts.

    Appended to a serialized request they add those ResourceMetrics to it; other pass-through
    objects are not OTLP metrics and are skipped.
    """
    out = []
    for item in passthrough:
        if isinstance(item, WireResourceMetrics):
            out.append((item.field, item.points))
        elif isinstance(item, metrics_pb2.ResourceMetrics):
            out.append((_len_field(b"\x0a", item.SerializeToString()), count_data_points(item)))
    return out


def from_request(request: ExportMetricsServiceRequest) -> Iterator[MetricPoint]:
    """Every gauge and sum data point of a request as a MetricPoint (histograms are skipped)."""
    for rm in request.resource_metrics:
        resource = attributes_of(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind not in ("gauge", "sum"):
                    continue
                data = getattr(metric, kind)
                monotonic = kind == "sum" and data.is_monotonic
                for dp in data.data_points:
                    value = dp.as_double if dp.WhichOneof("value") == "as_double" else float(dp.as_int)
                    yield MetricPoint(metric.name, value, dp.time_unix_nano, resource, attributes_of(dp.attributes),
                                      metric.unit or "1", monotonic, dp.start_time_unix_nano)


def from_proto_record(record: bytes) -> ExportMetricsServiceRequest | ExportLogsServiceRequest:
    """One protobuf record of a recording (the Collector file exporter's ``format: proto``) as its
    request: metrics or logs, told by its first item (:func:`otel_ofu.otlp.files.proto_signal`);
    raises ValueError naming what is wrong."""
    from google.protobuf.message import DecodeError

    from otel_ofu.otlp.files import proto_signal

    kind = ExportLogsServiceRequest if proto_signal(record) == "logs" else ExportMetricsServiceRequest
    try:
        return kind.FromString(record)
    except DecodeError as exc:
        raise ValueError(f"not an OTLP protobuf export request: {exc}") from None


# --- Serialized OTLP -> points, for the metrics a receiver decodes (another otel-ofu's output) -------
#
# Why from bytes: reading a data point through protobuf objects costs several microseconds
# (wrapper objects per field); a Gauge or Sum serializes in C at about 0.1 us a point, and its
# points are read from those bytes here. Attribute sets repeat (a GPU's resource every
# interval, the same point attributes on every GPU), so each distinct serialized set is
# decoded once (bounded cache) through protobuf.

_I64 = struct.Struct("<q")
_DECODED_CACHE_SIZE = 1 << 17  # a jobs instance's GPUs (their resources) and the point attribute sets
_decoded_attributes: Cache = Cache("otlp decoded attributes", _DECODED_CACHE_SIZE)  # serialized -> Attributes
_NO_RECORDED_VALUE = 1  # DataPointFlags: a staleness marker, not a reading


def varint_at(data: bytes, i: int) -> tuple[int, int]:
    """The varint starting at ``data[i]`` and the index after it."""
    byte = data[i]
    if byte < 0x80:
        return byte, i + 1
    value, shift = byte & 0x7F, 7
    while True:
        i += 1
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7


def decoded_attributes(chunk: bytes) -> Attributes:
    """Repeated KeyValue fields with tag 0x0a or 0x3a (a Resource's, a data point's) as Attributes."""
    cached = _decoded_attributes.get(chunk)
    if cached is None:
        if chunk[:1] == b"\x3a":
            cached = attributes_of(metrics_pb2.NumberDataPoint.FromString(chunk).attributes)
        else:
            from opentelemetry.proto.resource.v1.resource_pb2 import Resource

            cached = attributes_of(Resource.FromString(chunk).attributes)
        _decoded_attributes.put(chunk, cached)
    return cached


def resource_attributes(resource_metrics: metrics_pb2.ResourceMetrics) -> Attributes:
    """A ResourceMetrics' resource attributes (decoded once per distinct resource)."""
    return decoded_attributes(resource_metrics.resource.SerializeToString())


def decodable(metric: metrics_pb2.Metric) -> bool:
    """Whether :func:`metric_points` keeps the metric's meaning: a gauge or a cumulative sum."""
    kind = metric.WhichOneof("data")
    if kind == "gauge":
        return True
    return kind == "sum" and metric.sum.is_monotonic and metric.sum.aggregation_temporality == CUMULATIVE


def metric_points(metric: metrics_pb2.Metric, resource: Attributes) -> list[MetricPoint]:
    """A gauge's or cumulative sum's data points as MetricPoints (see :func:`decodable`).

    Points flagged "no recorded value" (staleness markers) are left out.
    """
    kind = metric.WhichOneof("data")
    data = metric.gauge if kind == "gauge" else metric.sum
    return data_points(metric.name, metric.unit or "1", kind == "sum", data.SerializeToString(), resource)


def data_points(name: str, unit: str, monotonic: bool, wire: bytes, resource: Attributes, i: int = 0,
                n: int | None = None) -> list[MetricPoint]:
    """The NumberDataPoints of a serialized Gauge or Sum (``wire[i:n]``) as MetricPoints."""
    out: list[MetricPoint] = []
    n = len(wire) if n is None else n
    while i < n:
        tag = wire[i]
        if tag != 0x0A:  # a Sum's temporality and monotonic flag (varints), after its points
            if tag & 7:
                break
            _, i = varint_at(wire, i + 1)
            continue
        size, start = varint_at(wire, i + 1)
        end = start + size
        i = end
        t = start_time = 0
        value: float | None = None
        attributes: Attributes = ()
        flags = 0
        j = start
        while j < end:
            field = wire[j]
            if field == 0x19:
                t = _U64.unpack_from(wire, j + 1)[0]
                j += 9
            elif field == 0x21:
                value = _F64.unpack_from(wire, j + 1)[0]
                j += 9
            elif field == 0x31:
                value = float(_I64.unpack_from(wire, j + 1)[0])
                j += 9
            elif field == 0x11:
                start_time = _U64.unpack_from(wire, j + 1)[0]
                j += 9
            elif field == 0x3A:  # the attributes, contiguous (fields are written in number order)
                k = j
                while k < end and wire[k] == 0x3A:
                    length, k = varint_at(wire, k + 1)
                    k += length
                attributes = decoded_attributes(wire[j:k])
                j = k
            elif field == 0x40:
                flags, j = varint_at(wire, j + 1)
            elif field == 0x2A:  # exemplars: not kept
                length, j = varint_at(wire, j + 1)
                j += length
            else:  # a field this reader does not know: protobuf reads the point
                dp = metrics_pb2.NumberDataPoint.FromString(wire[start:end])
                t, start_time, flags = dp.time_unix_nano, dp.start_time_unix_nano, dp.flags
                kind_of_value = dp.WhichOneof("value")
                value = dp.as_double if kind_of_value == "as_double" else (
                    float(dp.as_int) if kind_of_value == "as_int" else None)
                attributes = attributes_of(dp.attributes)
                break
        if value is None or flags & _NO_RECORDED_VALUE:
            continue
        out.append(MetricPoint(name, value, t, resource, attributes, unit, monotonic, start_time))
    return out


_SEVERITY = {"INFO": logs_pb2.SEVERITY_NUMBER_INFO, "WARN": logs_pb2.SEVERITY_NUMBER_WARN,
             "ERROR": logs_pb2.SEVERITY_NUMBER_ERROR}


def events_to_request(events: Iterable[Event]) -> ExportLogsServiceRequest:
    """Events as OTLP logs: ``event.name`` attribute, body text, one ResourceLogs per resource."""
    by_resource: dict[Attributes, list[Event]] = {}
    for event in events:
        by_resource.setdefault(event.resource, []).append(event)
    request = ExportLogsServiceRequest()
    for resource, items in by_resource.items():
        rl = request.resource_logs.add()
        rl.resource.attributes.extend(_key_values(resource))
        sl = rl.scope_logs.add()
        sl.scope.name = SCOPE_NAME
        sl.scope.version = __version__
        for event in items:
            record = sl.log_records.add(time_unix_nano=event.time_unix_nano,
                                        observed_time_unix_nano=event.time_unix_nano,
                                        severity_number=_SEVERITY.get(event.severity, logs_pb2.SEVERITY_NUMBER_INFO),
                                        severity_text=event.severity)
            record.body.string_value = event.body
            record.attributes.extend(_key_values((("event.name", event.name), *event.attributes)))
    return request


def events_from_request(request: ExportLogsServiceRequest) -> Iterator[Event]:
    for rl in request.resource_logs:
        resource = attributes_of(rl.resource.attributes)
        for sl in rl.scope_logs:
            for record in sl.log_records:
                attributes = dict(attributes_of(record.attributes))
                name = str(attributes.pop("event.name", ""))
                yield Event(name, record.time_unix_nano, resource, tuple(sorted(attributes.items())),
                            record.body.string_value, record.severity_text or "INFO")


def to_json_line(request: ExportMetricsServiceRequest | ExportLogsServiceRequest) -> str:
    """One request as a single line of OTLP JSON (no trailing newline)."""
    return json.dumps(json_format.MessageToDict(request, use_integers_for_enums=True), separators=(",", ":"))


def from_json_line(line: str) -> ExportMetricsServiceRequest | ExportLogsServiceRequest:
    """Parse one line of OTLP JSON (metrics or logs); raises ValueError with the parser's reason."""
    request: ExportMetricsServiceRequest | ExportLogsServiceRequest
    is_logs = line.lstrip().startswith('{"resourceLogs"')
    request = ExportLogsServiceRequest() if is_logs else ExportMetricsServiceRequest()
    try:
        json_format.Parse(line, request, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise ValueError(f"not an OTLP JSON request: {exc}") from None
    return request
