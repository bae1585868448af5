"""OTLP metrics in -> GPU samples: find TPA and SM clock points, join them per GPU and window.

Two shapes of DCGM data arrive over OTLP (REFERENCE.md sections 6 and 7):

- a Collector's Prometheus receiver scraping dcgm-exporter: gauges named after the DCGM
  fields (``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``, ``DCGM_FI_DEV_SM_CLOCK`` in MHz, ...) with the
  dcgm-exporter labels as data point attributes and the scrape target in the resource;
- Google's dcgmreceiver: ``gpu.dcgm.pipe.utilization`` (attribute ``gpu.pipe=tensor``) and
  ``gpu.dcgm.clock.frequency`` in Hz, with ``gpu.model``/``gpu.number``/``gpu.uuid`` on the
  resource.

:func:`split_request` is pure (no I/O) and is what the ``otlp`` receiver and the throughput
benchmark call. Its hot path touches only the TPA and clock data points in Python, read from
their serialized bytes; every other metric is passed through without per-point work, as the
bytes it arrived in when the caller hands those over (``wire``).

Join rule: a GPU entity (host, index, UUID, MIG instance, pod) gives one sample per TPA data
point, at the TPA point's time. The clock points of the same entity whose timestamps lie
within ``tolerance_s`` of it (nearest TPA wins) are averaged into the sample's SM clock.
A scrape stamps all its points with one time, so that is an exact match; dcgmreceiver's
per-field timestamps differ by milliseconds. TPA and clock of one window must arrive in the
same request (a Collector sends each scrape as one request unless a batch processor splits
it with ``send_batch_max_size``). A TPA point without a clock, and a clock point with no TPA
near it, still make a sample; the ``ofu`` processor then reports it as a dropped window
(``missing``), never as 0, and re-emits the clock. Duplicate points of one entity and time are
one reading. Input points of no GPU pass through untouched: nothing a sender sent disappears
(docs/otlp-receiver.md).
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics

from otel_ofu.core import dcgm_fields
from otel_ofu.core.model import HOST_NAME, GpuSample, MetricPoint
from otel_ofu.core.values import clean_clock, rescale
from otel_ofu.otlp import codec
from otel_ofu.otlp.codec import WireResourceMetrics, from_any_value, varint

SOURCE = "otlp"

# Google dcgmreceiver names (REFERENCE.md section 7).
DCGMRECEIVER_PIPE = "gpu.dcgm.pipe.utilization"
DCGMRECEIVER_CLOCK = "gpu.dcgm.clock.frequency"
DCGMRECEIVER_PIPE_ATTR = "gpu.pipe"
DCGMRECEIVER_RESOURCE = ("gpu.model", "gpu.number", "gpu.uuid")

# Which input each metric name feeds. Only these metrics are read point by point.
TPA, CLOCK, MAX_CLOCK = "tpa", "clock", "max_clock"
_PROMETHEUS_INPUTS: dict[str, str] = {
    **{name: TPA for name in dcgm_fields.FIELD_NAMES[dcgm_fields.PIPE_TENSOR_ACTIVE]},
    **{name: CLOCK for name in dcgm_fields.FIELD_NAMES[dcgm_fields.SM_CLOCK]},
    **{name: MAX_CLOCK for name in dcgm_fields.FIELD_NAMES[dcgm_fields.MAX_SM_CLOCK]},
}
_DCGMRECEIVER_INPUTS = {DCGMRECEIVER_PIPE: TPA, DCGMRECEIVER_CLOCK: CLOCK}
INPUT_METRICS: frozenset[str] = frozenset(_PROMETHEUS_INPUTS) | frozenset(_DCGMRECEIVER_INPUTS)

# Resource attributes a Prometheus receiver sets to describe the scrape target: they say
# where dcgm-exporter ran, not which GPU this is, so they are not copied onto OFU points.
SCRAPE_TARGET_ATTRIBUTES = frozenset({
    "service.name", "service.instance.id", "service.namespace", "server.address", "server.port", "url.scheme",
    "net.host.name", "net.host.port", "http.scheme",
})

_FLAG_NO_RECORDED_VALUE = 1  # DataPointFlags: a Prometheus staleness marker, not a reading


@dataclass(slots=True)
class _Entity:
    """One GPU entity's readings found in a request: (time, raw value) lists."""

    host: str
    gpu_index: int | str
    uuid: str
    model: str
    job_id: str | None
    resource: dict[str, Any]
    tpa: list[tuple[int, object]] = field(default_factory=list)
    clock: list[tuple[int, object]] = field(default_factory=list)
    max_clock: list[tuple[int, object]] = field(default_factory=list)


def _value(dp: Any) -> object:
    # as_int keeps int64 DCGM blank sentinels exact (a float cannot tell +1 from +2).
    return dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int


def _scale(value: object, unit: str, kind: str) -> object:
    """Bring a reading to the sample's units: TPA as a 0..1 ratio, clocks in MHz."""
    if not isinstance(value, (int, float)):
        return value
    if kind == TPA:  # a blank in percent stays a blank, not 1/100 of one (then "out of range")
        return rescale(value, 0.01) if unit == "%" else value
    # dcgmreceiver reports Hz. A clock in Hz may exceed the INT32 blank sentinel (2.2 GHz),
    # so it is converted here and never judged as a possible DCGM blank.
    if unit == "Hz":
        return value / 1e6
    if unit == "kHz":
        return value / 1e3
    if unit == "GHz":
        return value * 1e3
    return value


def label_text(value: Any) -> str:
    """An attribute value as the label text a Prometheus scrape would have carried.

    Why: a Collector processor (transform, k8sattributes) or a non-Prometheus sender may put
    ``gpu`` as an int or ``UUID`` as bytes; read as strings only, they became "" and the GPU
    lost its index or identity. Whole doubles print as ints (``0.0`` -> ``"0"``).
    """
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _any_text(value: Any) -> str:
    """An OTLP AnyValue as label text (see :func:`label_text`)."""
    return label_text(from_any_value(value))


def _int_or_str(index: object) -> int | str:
    text = str(index)
    return int(text) if text.isdecimal() else text


_KEY_LABELS = dcgm_fields.EXPORTER_LABELS
_NEW: Any = object()


class _Resource:
    """One ResourceMetrics' attributes, and what every point under it shares, computed once."""

    __slots__ = ("attributes", "labels", "fallback_host", "extra", "key", "by_attribute_bytes")

    def __init__(self, rm: ResourceMetrics):
        self.attributes = {kv.key: from_any_value(kv.value) for kv in rm.resource.attributes}
        # dcgm-exporter labels a Collector may have promoted to resource attributes.
        self.labels = {k: label_text(v) for k, v in self.attributes.items() if k in dcgm_fields.EXPORTER_LABELS}
        self.fallback_host = label_text(self.attributes.get(HOST_NAME) or self.attributes.get("server.address") or "")
        self.extra = {k: v for k, v in self.attributes.items()
                      if k not in SCRAPE_TARGET_ATTRIBUTES and k not in dcgm_fields.EXPORTER_LABELS and k != HOST_NAME}
        self.key = (frozenset(self.labels.items()), self.fallback_host)
        # A data point's serialized attributes -> its entity (see _Joiner.prometheus_points).
        self.by_attribute_bytes: dict[bytes, _Entity | None] = {}


_FIXED64_TAGS = frozenset({0x11, 0x19, 0x21, 0x31})  # NumberDataPoint start time, time, as_double, as_int
_VALUE_TAGS = frozenset({0x21, 0x31})  # NumberDataPoint as_double, as_int
_ATTRIBUTES_TAG = 0x3A  # NumberDataPoint.attributes, field 7
_TIME_DOUBLE = struct.Struct("<BQBd")  # time_unix_nano then as_double, with their tags
_TIME_INT = struct.Struct("<BQBq")  # time_unix_nano then as_int


_KEY_VALUE_CACHE_SIZE = 32768  # distinct serialized label KeyValues kept decoded (bounded memory)
_key_values: dict[bytes, tuple[str, str]] = {}


def _string_key_value(data: bytes) -> tuple[str, str] | None:
    """(key, string value) of one serialized KeyValue field, if it is exactly that and short."""
    # 0x3a size | 0x0a key_size key | 0x12 value_size | 0x0a string_size string, every size < 128
    n = len(data)
    if n < 8 or data[1] != n - 2 or data[2] != 0x0A or not 0 < data[3] < 0x80:
        return None
    key_end = 4 + data[3]
    if key_end + 4 > n or data[key_end] != 0x12 or data[key_end + 1] != n - key_end - 2:
        return None  # the value (an AnyValue) must run to the end
    if data[key_end + 2] != 0x0A or data[key_end + 3] != n - key_end - 4:
        return None  # and hold nothing but its string_value
    return data[4:key_end].decode(), data[key_end + 4:].decode()


def _string_attributes(data: bytes) -> list[tuple[str, str]] | None:
    """Each attribute's (key, string value) from a point's serialized attributes, or None.

    Why: reading labels through protobuf objects costs about 1 us each, and most label
    values (model, host, pod, driver, index) repeat across GPUs and requests; each distinct
    serialized KeyValue is decoded once. Anything but plain short string attributes (other
    value types, long values, trailing fields) gives None: the caller reads protobuf instead.
    """
    out = []
    cache = _key_values
    i, n = 0, len(data)
    while i < n:
        size = data[i + 1] if i + 1 < n else 0x80
        if data[i] != _ATTRIBUTES_TAG or size >= 0x80:
            return None
        end = i + 2 + size
        chunk = data[i:end]
        pair = cache.get(chunk)
        if pair is None:
            pair = _string_key_value(chunk)
            if pair is None:
                return None
            if len(cache) >= _KEY_VALUE_CACHE_SIZE:
                cache.clear()
            cache[chunk] = pair
        out.append(pair)
        i = end
    return out


def _attribute_bytes(point: bytes) -> bytes:
    """The part of a serialized NumberDataPoint from its first attribute on (the whole point if unusual).

    Protobuf writes fields in number order, so that part holds every attribute and, after
    them, only the flags: two points with the same bytes there have the same attributes.
    """
    i, n = 0, len(point)
    while i < n:
        tag = point[i]
        if tag in _FIXED64_TAGS:
            i += 9
        elif tag == _ATTRIBUTES_TAG:
            return point[i:]
        else:
            break
    return point


def _prometheus_entity(labels: dict[str, str], resource: _Resource) -> _Entity | None:
    ident = dcgm_fields.identity_from_labels(labels)
    if ident["gpu_index"] == "" and not ident["uuid"]:
        return None
    extra = {**resource.extra, **ident["resource"]}
    return _Entity(ident["host"] or resource.fallback_host, _int_or_str(ident["gpu_index"]), ident["uuid"],
                   ident["model"], ident["job_id"], extra)


class _Joiner:
    """Collects input points by GPU entity while walking a request."""

    def __init__(self) -> None:
        self.entities: dict[tuple, _Entity | None] = {}

    def prometheus_points(self, resource: _Resource, data: Any, kind: str, unit: str) -> list[int]:
        """One input metric's data points (``data``: its Gauge or Sum), each to its GPU entity.

        Returns the indices of the points that are no GPU's (no ``gpu`` or ``UUID`` label):
        nothing joins them, so they must pass through as they came.

        Why from bytes: protobuf objects cost about a microsecond per field read and per
        label. The Gauge/Sum is serialized once (C) and each point read from the bytes:
        time, value and the bytes of its attributes, which identify its GPU (the TPA and
        clock points of one GPU carry identical attributes); labels are decoded once per
        distinct attribute set and resource. A point not laid out as protobuf writes a plain
        one (start time, exemplars, no time or value) is read through protobuf instead.
        """
        seen = resource.by_attribute_bytes
        points = data.data_points
        left: list[int] = []
        wire = data.SerializeToString()
        end_of_data = len(wire)
        i = index = 0
        while i < end_of_data and wire[i] == 0x0A:  # data_points come first; a Sum's settings follow
            size = wire[i + 1]
            start = i + 2
            if size >= 0x80:  # a point of 128 bytes to 16 KiB (most): two bytes
                second = wire[i + 2]
                size, start = (size & 0x7F) | (second << 7), i + 3
                if second >= 0x80:
                    size, start = _varint_at(wire, i + 1)
            end = start + size
            i, index = end, index + 1
            if end - start < 18 or wire[start] != 0x19 or wire[start + 9] not in _VALUE_TAGS or (
                    end > start + 18 and wire[start + 18] != _ATTRIBUTES_TAG):
                if not self._prometheus_point(resource, points[index - 1], kind, unit):
                    left.append(index - 1)
                continue
            _, t, value_tag, value = (_TIME_DOUBLE if wire[start + 9] == 0x21 else _TIME_INT).unpack_from(wire, start)
            attribute_bytes = wire[start + 18:end]
            entity = seen.get(attribute_bytes, _NEW)
            if entity is _NEW:
                pairs = _string_attributes(attribute_bytes)
                if pairs is None:  # other shapes (or a flags field): the protobuf path decides
                    if not self._prometheus_point(resource, points[index - 1], kind, unit):
                        left.append(index - 1)
                    continue
                entity = seen[attribute_bytes] = self._prometheus_entity_of(resource, pairs)
            if entity is not None:
                getattr(entity, kind).append((t, _scale(value, unit, kind)))
            else:  # not a GPU series (e.g. a per-host field): nothing to join, it passes through
                left.append(index - 1)
        for rest_index in range(index, len(points)):  # anything the loop above did not reach (other fields first)
            if not self._prometheus_point(resource, points[rest_index], kind, unit):
                left.append(rest_index)
        return left

    def _prometheus_point(self, resource: _Resource, dp: Any, kind: str, unit: str) -> bool:
        """One data point read through protobuf; False when it is no GPU's (it passes through).

        A staleness marker (the series went away; no reading) is taken and dropped: the
        metric it ends is re-emitted by the ``ofu`` processor under its own name.
        """
        if dp.flags & _FLAG_NO_RECORDED_VALUE:
            return True
        attribute_bytes = _attribute_bytes(dp.SerializeToString())
        entity = resource.by_attribute_bytes.get(attribute_bytes, _NEW)
        if entity is _NEW:
            pairs = _string_attributes(attribute_bytes)
            if pairs is None:
                pairs = [(kv.key, _any_text(kv.value)) for kv in dp.attributes]
            entity = resource.by_attribute_bytes[attribute_bytes] = self._prometheus_entity_of(resource, pairs)
        if entity is None:
            return False
        getattr(entity, kind).append((dp.time_unix_nano, _scale(_value(dp), unit, kind)))
        return True

    def _prometheus_entity_of(self, resource: _Resource, pairs: list[tuple[str, str]]) -> _Entity | None:
        # The entity key is the point's dcgm-exporter labels (the same on every metric of one
        # GPU); the identity is worked out once per entity.
        key = (frozenset([pair for pair in pairs if pair[0] in _KEY_LABELS]), resource.key)
        entity = self.entities.get(key, _NEW)
        if entity is _NEW:
            entity = self.entities[key] = _prometheus_entity({**resource.labels, **dict(key[0])}, resource)
        return entity

    def dcgmreceiver_point(self, context: _Resource, dp: Any, kind: str, unit: str) -> None:
        resource = context.attributes
        uuid = label_text(resource.get("gpu.uuid"))
        index = label_text(resource.get("gpu.number"))
        host = label_text(resource.get(HOST_NAME))
        key = (host, index, uuid, ())
        entity = self.entities.get(key)
        if entity is None:
            extra = {k: v for k, v in resource.items() if k not in DCGMRECEIVER_RESOURCE and k != HOST_NAME}
            entity = self.entities[key] = _Entity(host, _int_or_str(index), uuid, label_text(resource.get("gpu.model")),
                                                  None, extra)
        getattr(entity, kind).append((dp.time_unix_nano, _scale(_value(dp), unit, kind)))


def _samples(entity: _Entity, window_s: float, tolerance_ns: int) -> list[GpuSample]:
    """The entity's windows: one per TPA reading, and one per clock reading near no TPA reading.

    Duplicate points of one GPU and time (the same scrape twice in a request, a batch sent
    again) are one reading, the last one received. A clock with no TPA near it (profiling
    off, the field not exported, Nsight holding the counters) is still a window: the ``ofu``
    processor reports it as "no value" (``missing``) and re-emits its clock.
    """
    max_clock = entity.max_clock[-1][1] if entity.max_clock else None
    if len(entity.tpa) == 1 and len(entity.clock) == 1:  # a scrape: one TPA, one clock
        (t, tpa_value), (clock_t, raw) = entity.tpa[0], entity.clock[0]
        if abs(clock_t - t) <= tolerance_ns:
            valid = clean_clock(raw)[0]
            clock, count = (raw, 0) if valid is None else (valid, 1)
            return [GpuSample(t, window_s, entity.host, entity.gpu_index, entity.uuid, entity.model, tpa_value, clock,
                              count, max_clock, source=SOURCE, job_id=entity.job_id, resource=entity.resource)]
    tpa = sorted(dict(entity.tpa).items())  # by time; a later duplicate replaces an earlier one
    times = [t for t, _ in tpa]
    windows: list[tuple[int, object, list[object]]] = [(t, value, []) for t, value in tpa]
    lone: list[tuple[int, object, list[object]]] = []  # clock readings near no TPA reading
    for t, value in sorted(dict(entity.clock).items()):
        if times:
            i = bisect.bisect_left(times, t)
            best = min((j for j in (i - 1, i) if 0 <= j < len(times)), key=lambda j: abs(times[j] - t))
            if abs(times[best] - t) <= tolerance_ns:
                windows[best][2].append(value)
                continue
        if lone and t - lone[-1][0] <= tolerance_ns:
            lone[-1][2].append(value)
        else:
            lone.append((t, None, [value]))
    windows += lone
    if not windows and entity.max_clock:  # only the max clock: a window with neither reading
        windows.append((entity.max_clock[-1][0], None, []))
    out = []
    for t, tpa_value, raw_clocks in windows:
        valid = [v for v in (clean_clock(c)[0] for c in raw_clocks) if v is not None]
        if valid:
            clock, count = sum(valid) / len(valid), len(valid)
        else:  # keep the raw reading (blank, 0, NaN) so the ofu processor names the reason
            clock, count = (raw_clocks[0] if raw_clocks else None), 0
        # Each sample gets its own resource dict (the entity's own when it makes only one).
        resource = entity.resource if len(windows) == 1 else dict(entity.resource)
        out.append(GpuSample(t, window_s, entity.host, entity.gpu_index, entity.uuid, entity.model, tpa_value, clock,
                             count, max_clock, source=SOURCE, job_id=entity.job_id, resource=resource))
    return out


def _keep_only(points: Any, indices: list[int]) -> None:
    """Delete every data point but those at ``indices`` (a repeated field, in place)."""
    keep = set(indices)
    for p_index in range(len(points) - 1, -1, -1):
        if p_index not in keep:
            del points[p_index]


def _take_inputs(rm: ResourceMetrics, joiner: _Joiner, keep_rest: bool, edits: _Edits | None = None,
                 decode: _Decoded | None = None) -> bool:
    """Feed rm's input points to the joiner; with keep_rest, delete them from rm in place.

    Returns whether anything is left in rm to pass through. ``edits``, when given, records
    what was deleted or changed, by the original indices, for :func:`_trimmed_wire`, and
    counts the data points left (while the metrics are at hand). ``decode``: metrics to turn
    into points (they are deleted like the inputs: each is forwarded once, as points).
    """
    resource: _Resource | None = None
    count = edits is not None
    for s_index in range(len(rm.scope_metrics) - 1, -1, -1):
        metrics = rm.scope_metrics[s_index].metrics
        for m_index in range(len(metrics) - 1, -1, -1):
            metric = metrics[m_index]
            name = metric.name
            if decode is not None and name in decode.names and decode.take(rm, metric):
                if keep_rest:
                    del metrics[m_index]
                    if edits is not None:
                        edits.metrics.setdefault(s_index, {})[m_index] = None
                continue
            if name not in INPUT_METRICS:
                if count:
                    kind_of_data = metric.WhichOneof("data")
                    if kind_of_data:
                        edits.points += len(getattr(metric, kind_of_data).data_points)  # type: ignore[union-attr]
                continue
            kind_of_data = metric.WhichOneof("data")
            if kind_of_data not in ("gauge", "sum"):
                if count and kind_of_data:
                    edits.points += len(getattr(metric, kind_of_data).data_points)  # type: ignore[union-attr]
                continue
            if resource is None:
                resource = _Resource(rm)
            data = getattr(metric, kind_of_data)
            points = data.data_points
            if name in _PROMETHEUS_INPUTS:
                left = joiner.prometheus_points(resource, data, _PROMETHEUS_INPUTS[name], metric.unit)
                if keep_rest:
                    if left:  # points of no GPU: they stay, the joined ones go
                        _keep_only(points, left)
                        if edits is not None:
                            edits.metrics.setdefault(s_index, {})[m_index] = metric.SerializeToString()
                            edits.points += len(points)
                    else:
                        del metrics[m_index]
                        if edits is not None:
                            edits.metrics.setdefault(s_index, {})[m_index] = None
                continue
            kind = _DCGMRECEIVER_INPUTS[name]
            other_pipes = []
            for p_index, dp in enumerate(points):
                if kind == TPA:
                    pipe = next((_any_text(kv.value) for kv in dp.attributes if kv.key == DCGMRECEIVER_PIPE_ATTR), "")
                    if pipe != "tensor":
                        other_pipes.append(p_index)  # fp64/fp32/fp16 pipes are not ours: pass them on
                        continue
                if not dp.flags & _FLAG_NO_RECORDED_VALUE:
                    joiner.dcgmreceiver_point(resource, dp, kind, metric.unit)
            if keep_rest:
                if other_pipes:
                    _keep_only(points, other_pipes)
                    if edits is not None:
                        edits.metrics.setdefault(s_index, {})[m_index] = metric.SerializeToString()
                        edits.points += len(points)
                else:
                    del metrics[m_index]
                    if edits is not None:
                        edits.metrics.setdefault(s_index, {})[m_index] = None
        if keep_rest and not metrics:
            del rm.scope_metrics[s_index]
            if edits is not None:
                edits.scopes.add(s_index)
    return len(rm.scope_metrics) > 0


# --- the pass-through in its wire form -------------------------------------------------------
#
# Re-serializing the metrics that pass through costs about as much as decoding them, for
# nothing: they leave as they came. So the receiver keeps the request's bytes, and each
# forwarded ResourceMetrics is cut from them, with the join's input metrics left out. The
# request was parsed from these bytes just before, so they are well-formed; anything this
# reader does not expect (a group, a count that does not match the parsed message) makes
# it fall back to serializing the message.


@dataclass(slots=True)
class _Edits:
    """What _take_inputs changed in one ResourceMetrics, by original index."""

    scopes: set[int] = field(default_factory=set)  # scope_metrics deleted (left empty)
    metrics: dict[int, dict[int, bytes | None]] = field(default_factory=dict)  # scope -> metric -> new bytes or None
    points: int = 0  # data points left, as otlp.count_data_points counts them

    def changed(self) -> bool:
        return bool(self.scopes or self.metrics)


class _WireError(ValueError):
    """The bytes are not laid out as this reader expects."""


def _varint_at(data: bytes, i: int) -> tuple[int, int]:
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


def _fields(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(field number, field start, payload start, field end) of each field of the message in data[start:end]."""
    out = []
    i = start
    while i < end:
        tag = data[i]
        j = i + 1
        if tag >= 0x80:
            tag, j = _varint_at(data, i)
        wire_type = tag & 7
        if wire_type == 2:
            length = data[j]
            if length < 0x80:
                k = j + 1 + length
                j += 1
            else:
                length, j = _varint_at(data, j)
                k = j + length
        elif wire_type == 0:
            k = _varint_at(data, j)[1]
        elif wire_type == 1:
            k = j + 8
        elif wire_type == 5:
            k = j + 4
        else:
            raise _WireError(f"wire type {wire_type}")
        if k > end:
            raise _WireError("field runs past its message")
        out.append((tag >> 3, i, j, k))
        i = k
    return out


def _trimmed_scope(data: bytes, start: int, end: int, changed: dict[int, bytes | None]) -> bytes:
    """A ScopeMetrics' bytes with the metrics in ``changed`` left out (None) or replaced."""
    parts = []
    run = start  # the kept bytes not yet copied begin here
    m_index = -1
    for number, f_start, _p_start, f_end in _fields(data, start, end):
        if number != 2:  # ScopeMetrics.metrics
            continue
        m_index += 1
        if m_index in changed:
            parts.append(data[run:f_start])
            replacement = changed[m_index]
            if replacement is not None:
                parts.append(b"\x12" + varint(len(replacement)) + replacement)
            run = f_end
    parts.append(data[run:end])
    return b"".join(parts)


def _trimmed_wire(data: bytes, start: int, end: int, edits: _Edits) -> bytes:
    """A ResourceMetrics' bytes (data[start:end]) with the changes of ``edits`` applied."""
    parts = []
    s_index = -1
    for number, f_start, p_start, f_end in _fields(data, start, end):
        if number == 2:  # ResourceMetrics.scope_metrics
            s_index += 1
            if s_index in edits.scopes:
                continue
            changed = edits.metrics.get(s_index)
            if changed:
                scope = _trimmed_scope(data, p_start, f_end, changed)
                parts.append(b"\x12" + varint(len(scope)) + scope)
                continue
        parts.append(data[f_start:f_end])
    return b"".join(parts)


def _request_ranges(wire: bytes, total: int) -> list[tuple[int, int, int]]:
    """(field start, payload start, field end) of each ResourceMetrics in a request's bytes; [] if they do not fit."""
    try:
        ranges = [(f_start, p_start, f_end) for number, f_start, p_start, f_end in _fields(wire, 0, len(wire))
                  if number == 1]  # ExportMetricsServiceRequest.resource_metrics
    except (_WireError, IndexError):
        return []
    return ranges if len(ranges) == total else []  # else: not the bytes this request was parsed from


def _wire_passthrough(wire: bytes, total: int, kept: list[tuple[int, ResourceMetrics, _Edits]]) -> list[Any]:
    """The forwarded ResourceMetrics with their bytes cut from the received request (``total`` in it)."""
    ranges = _request_ranges(wire, total)
    out: list[Any] = []
    for index, rm, edits in kept:
        field_bytes = None
        if index < len(ranges):
            f_start, p_start, f_end = ranges[index]
            try:
                if not edits.changed():
                    field_bytes = wire[f_start:f_end]
                else:
                    payload = _trimmed_wire(wire, p_start, f_end, edits)
                    field_bytes = b"\x0a" + varint(len(payload)) + payload
            except (_WireError, IndexError):
                field_bytes = None
        if field_bytes is None:  # unexpected layout: serialize the message instead
            payload = rm.SerializeToString()
            field_bytes = b"\x0a" + varint(len(payload)) + payload
        out.append(WireResourceMetrics(rm, field_bytes, edits.points))
    return out


class _Decoded:
    """The metrics of a request decoded into points (by name), and those that could not be."""

    __slots__ = ("names", "points", "skipped", "_rm", "_resource")

    def __init__(self, names: frozenset[str]):
        self.names = names
        self.points: list[MetricPoint] = []
        self.skipped: set[str] = set()  # names seen in a shape points cannot carry (histogram, delta sum)
        self._rm: ResourceMetrics | None = None
        self._resource: tuple = ()

    def take(self, rm: ResourceMetrics, metric: Any) -> bool:
        """Decode ``metric`` into points; False (it passes through) when it is not a gauge or cumulative sum."""
        if not codec.decodable(metric):
            self.skipped.add(metric.name)
            return False
        if rm is not self._rm:  # the resource's attributes, once per ResourceMetrics
            self._rm, self._resource = rm, codec.resource_attributes(rm)
        points = codec.metric_points(metric, self._resource)
        # Walked backwards (for deletion): each metric's points are prepended in order below.
        self.points[:0] = points
        return True


@dataclass(slots=True)
class Split:
    """What a request holds for a pipeline: GPU samples, decoded points, the rest to pass through."""

    samples: list[GpuSample]
    points: list[MetricPoint]
    passthrough: list[Any]
    undecodable: set[str]  # names in ``decode`` that arrived as histograms or delta sums (passed through)


def split(request: ExportMetricsServiceRequest, *, window_s: float = 30.0, tolerance_s: float = 5.0,
          passthrough: bool = True, wire: bytes | None = None, decode: frozenset[str] = frozenset()) -> Split:
    """GPU samples joined from a request's TPA/clock points, the ``decode`` metrics as points, the rest.

    The request is consumed: its input and decoded metrics are deleted in place and the
    remaining ResourceMetrics are returned as they are (not copied). With
    ``passthrough=False`` the rest is dropped. ``window_s`` is the TPA averaging window the
    source used (dcgm-exporter's collect interval), recorded on each sample. ``wire``: the
    bytes the request was parsed from; the pass-through is then returned as
    :class:`otel_ofu.otlp.WireResourceMetrics`, cut from those bytes (no re-serialization).
    Decoded points keep their resource and point attributes, times and values; they leave
    as points, so each is forwarded once.
    """
    joiner = _Joiner()
    decoded = _Decoded(decode) if decode else None
    rest: list[Any] = []
    kept: list[tuple[int, ResourceMetrics, _Edits]] = []
    for index, rm in enumerate(request.resource_metrics):
        found: list[MetricPoint] = []
        if decoded is not None:
            decoded.points, found = found, decoded.points  # this rm's points, in order, then appended
        if not passthrough:
            _take_inputs(rm, joiner, keep_rest=False, decode=decoded)
        elif wire is None:
            if _take_inputs(rm, joiner, keep_rest=True, decode=decoded):
                rest.append(rm)
        else:
            edits = _Edits()
            if _take_inputs(rm, joiner, keep_rest=True, edits=edits, decode=decoded):
                kept.append((index, rm, edits))
        if decoded is not None:
            found += decoded.points
            decoded.points = found
    if kept:
        rest = _wire_passthrough(wire, len(request.resource_metrics), kept)  # type: ignore[arg-type]
    tolerance_ns = int(tolerance_s * 1e9)
    samples = [s for entity in joiner.entities.values() if entity is not None
               for s in _samples(entity, window_s, tolerance_ns)]
    if decoded is None:
        return Split(samples, [], rest, set())
    return Split(samples, decoded.points, rest, decoded.skipped)


def split_request(request: ExportMetricsServiceRequest, *, window_s: float = 30.0, tolerance_s: float = 5.0,
                  passthrough: bool = True, wire: bytes | None = None) -> tuple[list[GpuSample], list[Any]]:
    """:func:`split` without decoded metrics: the GPU samples and the pass-through."""
    result = split(request, window_s=window_s, tolerance_s=tolerance_s, passthrough=passthrough, wire=wire)
    return result.samples, result.passthrough


def split_bytes(body: bytes, **kwargs: Any) -> tuple[list[GpuSample], list[Any]]:
    """:func:`split_request` on a serialized ExportMetricsServiceRequest (raises DecodeError).

    The pass-through keeps its wire form (:class:`otel_ofu.otlp.WireResourceMetrics`).
    """
    return split_request(ExportMetricsServiceRequest.FromString(body), wire=body, **kwargs)
