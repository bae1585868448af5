"""Reading OTLP protobuf bytes without protobuf objects, and recognizing ResourceMetrics by shape.

Why: walking a request through protobuf objects costs about a microsecond per metric and per
field read: most of a jobs-tier instance's time went there (BENCHMARKS.md, section 6). But
what a node agent sends for a GPU has the same *shape* every interval, and every GPU of a
fleet has one of a few shapes: the same metrics in the same order, with the same names,
units and field sizes; only the data (times, values, attribute values of the same length,
the resource) differs. So a :class:`Shape` is learned once from a ResourceMetrics' bytes,
field by field, and later ResourceMetrics are recognized as having it by one check of their
*skeleton* (every field's tag and length, the metric names and units) in a single struct
call. Identical skeletons mean identical layouts: every field at the same offset, so the
shape knows, without reading them, where each metric is, which to decode into points, which
to pass through, their point counts, and how to cut the pass-through.

The request was parsed (so validated) by protobuf before it comes here; these readers only
locate things. A layout they do not expect raises :class:`WireError`, and the caller reads
that ResourceMetrics through protobuf objects instead.

Invariant (what this fast path must equal): for a ResourceMetrics of a learned shape,
:meth:`Shape.read` gives exactly what the message path gives for the same bytes parsed by
protobuf (``ResourceMetrics.FromString`` then the join and ``codec`` decoding): the same decoded
points (name, value, time, start time, resource and point attributes, unit, in order) and a
pass-through whose bytes parse to exactly the message path's remaining messages, with the same
point counts, and make the same request to send.
It may refuse (:class:`WireError`, None): then the message path reads it; it never returns a part
of the answer. A shape never covers a metric the join reads (``READ_METRICS``): those are read
every request. Checked by tests/test_otlp_shapes.py (``test_read_by_shape_equals_the_message_path``
on random requests, ``test_the_join_inputs_are_never_read_by_shape``,
``test_a_different_skeleton_of_the_same_size_is_not_taken_for_the_shape``).
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

from otel_ofu.core.model import Attributes, MetricPoint
from otel_ofu.otlp import codec
from otel_ofu.otlp.codec import varint_at


class WireError(ValueError):
    """The bytes are not laid out as this reader expects."""


def fields(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(tag, field start, payload start, field end) of each field of the message in data[start:end].

    The tag is the field number and wire type (``number << 3 | type``): 0x0A is field 1,
    length-delimited; for other wire types the payload is the value.
    """
    out = []
    i = start
    while i < end:
        tag = data[i]
        j = i + 1
        if tag >= 0x80:
            tag, j = varint_at(data, i)
        wire_type = tag & 7
        if wire_type == 2:
            length = data[j]
            if length < 0x80:
                k = j + 1 + length
                j += 1
            else:
                length, j = varint_at(data, j)
                k = j + length
        elif wire_type == 0:
            k = varint_at(data, j)[1]
        elif wire_type == 1:
            k = j + 8
        elif wire_type == 5:
            k = j + 4
        else:
            raise WireError(f"wire type {wire_type}")
        if k > end:
            raise WireError("field runs past its message")
        out.append((tag, i, j, k))
        i = k
    return out


def len_field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte(s), the payload length, the payload."""
    return codec._len_field(tag, payload)


# --- shapes ---------------------------------------------------------------------------------

_RESOURCE, _SCOPE_METRICS = 0x0A, 0x12  # ResourceMetrics.resource, .scope_metrics
_METRIC = 0x12  # ScopeMetrics.metrics
_NAME, _UNIT = 0x0A, 0x1A  # Metric.name, .unit
_GAUGE, _SUM = 0x2A, 0x3A  # Metric.gauge, .sum
_DATA = frozenset({_GAUGE, _SUM, 0x4A, 0x52, 0x5A})  # ... histogram, exponential_histogram, summary
_CUMULATIVE = 2  # AggregationTemporality
# A plain NumberDataPoint's fixed64 fields, by tag, and how to read them: start time, time, as_double, as_int.
_PLAIN_CODES = {0x11: "Q", 0x19: "Q", 0x21: "d", 0x31: "q"}


@dataclass(frozen=True, slots=True)
class _PlainPoint:
    """A decoded data point laid out as protobuf writes a plain one: where its varying fields are.

    Indices into the values :meth:`Shape.take` unpacks (-1: the field is absent); the
    attributes are part of the skeleton, so they are the same in every match.
    """

    time: int
    value: int
    start_time: int
    as_int: bool
    attributes: Attributes


@dataclass(frozen=True, slots=True)
class _Decoded:
    """A metric of the shape that is decoded into points: where its data lies (relative) and how to read it."""

    name: str
    unit: str
    monotonic: bool
    start: int
    end: int
    points: tuple[_PlainPoint, ...] | None  # None: read by codec.data_points (points not laid out plainly)


@dataclass(slots=True)
class Taken:
    """What one ResourceMetrics holds for a pipeline, read through its shape."""

    points: list[MetricPoint]
    skipped: tuple[str, ...]  # decode names in a shape points cannot carry (they pass through)
    forward: bytes | None  # the pass-through, as a request field; None: nothing is left to forward
    forward_points: int  # data points in it


Piece = bytes | tuple[int, int]  # literal bytes, or a (start, end) range of the payload to copy


class Shape:
    """The layout of a ResourceMetrics holding only metrics to decode and metrics to pass through.

    :meth:`learn` reads one field by field; :meth:`matches` tells whether another has the same
    skeleton; :meth:`take` reads one that matches: its decoded metrics as points, and the rest
    as one request field (the decoded metrics cut out, empty scopes dropped, as the message
    path in :mod:`otel_ofu.otlp.join` does) with its point count. Offsets are relative to the
    ResourceMetrics' payload.
    """

    __slots__ = ("size", "_check", "_expected", "_values", "_resource", "_decoded", "_skipped", "_pieces", "_whole",
                 "_forward_points")

    def __init__(self, wire: bytes, start: int, end: int, regions: list[tuple[int, int]], resource: tuple[int, int],
                 decoded: list[_Decoded], values: list[tuple[int, str]], skipped: tuple[str, ...],
                 pieces: list[Piece] | None, whole: bool, forward_points: int):
        self.size = end - start
        merged: list[tuple[int, int]] = []
        for a, b in sorted(regions):
            if merged and merged[-1][1] >= a:
                merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
            else:
                merged.append((a, b))
        self._check = _struct([(a, f"{b - a}s") for a, b in merged])
        # The decoded plain points' times, values and start times, in one unpack.
        self._values = _struct([(a, code) for a, code in values]) if values else None
        self._expected = self._check.unpack_from(wire, start)
        self._resource = resource
        self._decoded = decoded
        self._skipped = skipped
        self._pieces = pieces  # the forwarded field when something is cut out of it
        self._whole = whole  # nothing is cut: the field is forwarded as it came
        self._forward_points = forward_points

    def matches(self, wire: bytes, start: int) -> bool:
        """Whether the ResourceMetrics whose payload starts at ``wire[start]`` (of this size) has this skeleton."""
        return self._check.unpack_from(wire, start) == self._expected

    def take(self, wire: bytes, field_start: int, start: int, end: int) -> Taken:
        """Read a ResourceMetrics that :meth:`matches` (its field is ``wire[field_start:end]``)."""
        points: list[MetricPoint] = []
        if self._decoded:
            a, b = self._resource
            resource = codec.decoded_attributes(wire[start + a:start + b])
            values = self._values.unpack_from(wire, start) if self._values is not None else ()
            for d in self._decoded:
                if d.points is None:
                    points += codec.data_points(d.name, d.unit, d.monotonic, wire, resource, start + d.start,
                                                start + d.end)
                    continue
                for p in d.points:
                    value = values[p.value]
                    points.append(MetricPoint(d.name, float(value) if p.as_int else value,
                                              values[p.time] if p.time >= 0 else 0, resource, p.attributes, d.unit,
                                              d.monotonic, values[p.start_time] if p.start_time >= 0 else 0))
        if self._whole:
            forward: bytes | None = wire[field_start:end]
        elif self._pieces is None:
            forward = None
        else:
            forward = b"".join([p if type(p) is bytes else wire[start + p[0]:start + p[1]]  # type: ignore[index]
                                for p in self._pieces])
        return Taken(points, self._skipped, forward, self._forward_points)

    @classmethod
    def learn(cls, wire: bytes, start: int, end: int, decode: frozenset[str], refuse: frozenset[str]) -> Shape | None:
        """The shape of the ResourceMetrics whose payload is ``wire[start:end]``.

        ``decode``: the metric names decoded into points. None when it holds a metric named in
        ``refuse`` (the join's inputs, read point by point elsewhere) or anything this reader
        does not expect (a field protobuf would merge, a known field with another wire type, a
        group): such ResourceMetrics are read through protobuf objects.
        """
        try:
            return _Learner(wire, start, decode, refuse).read(end)
        except (WireError, IndexError, UnicodeDecodeError, struct.error):
            return None


def _struct(items: list[tuple[int, str]]) -> struct.Struct:
    """A little-endian struct reading ``code`` at each offset (ascending), skipping the bytes between."""
    fmt, at = ["<"], 0
    for offset, code in items:
        if offset > at:
            fmt.append(f"{offset - at}x")
        fmt.append(code)
        at = offset + struct.calcsize("<" + code)
    return struct.Struct("".join(fmt))


def _size(pieces: list[Piece]) -> int:
    return sum(len(p) if type(p) is bytes else p[1] - p[0] for p in pieces)  # type: ignore[index, operator]


def _merged(pieces: list[Piece]) -> list[Piece]:
    """Adjacent literals joined, adjacent ranges made one."""
    out: list[Piece] = []
    for piece in pieces:
        last = out[-1] if out else None
        if type(piece) is bytes and type(last) is bytes:
            out[-1] = last + piece  # type: ignore[operator]
        elif type(piece) is tuple and type(last) is tuple and last[1] == piece[0]:  # type: ignore[index]
            out[-1] = (last[0], piece[1])  # type: ignore[index]
        else:
            out.append(piece)
    return out


class _Learner:
    """Reads one ResourceMetrics field by field into a :class:`Shape`, collecting its skeleton."""

    def __init__(self, wire: bytes, start: int, decode: frozenset[str], refuse: frozenset[str]):
        self.wire = wire
        self.start = start
        self.decode = decode
        self.refuse = refuse
        self.regions: list[tuple[int, int]] = []  # the skeleton, relative offsets
        self.decoded: list[_Decoded] = []
        self.values: list[tuple[int, str]] = []  # the decoded plain points' varying fields: offset, struct code
        self.skipped: list[str] = []

    def skeleton(self, a: int, b: int) -> None:
        if b > a:
            self.regions.append((a - self.start, b - self.start))

    def header(self, tag: int, f_start: int, p_start: int, f_end: int) -> None:
        """A field's tag and length; a field that is not length-delimited, whole (its size depends on its value)."""
        self.skeleton(f_start, p_start if tag & 7 == 2 else f_end)

    def range(self, a: int, b: int) -> tuple[int, int]:
        return a - self.start, b - self.start

    def read(self, end: int) -> Shape | None:
        wire, start = self.wire, self.start
        resource = (0, 0)
        seen_resource = forwarded = cut = False
        forward_points = 0
        payload: list[Piece] = []  # the forwarded ResourceMetrics' payload
        for tag, f_start, p_start, f_end in fields(wire, start, end):
            self.header(tag, f_start, p_start, f_end)
            number = tag >> 3
            if number == 1:
                if tag != _RESOURCE or seen_resource:  # two resources merge: protobuf objects read them
                    raise WireError("resource")
                seen_resource = True
                resource = self.range(p_start, f_end)
            elif number == 2:
                if tag != _SCOPE_METRICS:
                    raise WireError("scope_metrics")
                scope = self.scope(p_start, f_end)
                if scope is None:
                    return None
                kept, points, scope_payload = scope
                if not kept:  # empty, as it came or once the decoded metrics went: not forwarded
                    cut = True
                    continue
                forwarded = True
                forward_points += points
                if scope_payload is not None:
                    cut = True
                    payload += [_SCOPE_TAG + codec.varint(_size(scope_payload)), *scope_payload]
                    continue
            payload.append(self.range(f_start, f_end))
        pieces = _merged([b"\x0a" + codec.varint(_size(payload)), *payload]) if forwarded and cut else None
        return Shape(wire, start, end, self.regions, resource, self.decoded, self.values, tuple(self.skipped),
                     pieces, forwarded and not cut, forward_points)

    def scope(self, start: int, end: int) -> tuple[int, int, list[Piece] | None] | None:
        """(metrics kept, their points, the scope's new payload or None when unchanged); None: refused."""
        kept = points = 0
        payload: list[Piece] = []
        changed = False
        for tag, f_start, p_start, f_end in fields(self.wire, start, end):
            self.header(tag, f_start, p_start, f_end)
            if tag >> 3 != 2:  # the scope, schema_url, unknown fields: kept as they are
                payload.append(self.range(f_start, f_end))
                continue
            if tag != _METRIC:
                raise WireError("metrics")
            metric = self.metric(p_start, f_end)
            if metric is None:
                return None
            name, unit, data_tag, data, count, cumulative_monotonic = metric
            if name in self.decode:
                if data_tag == _GAUGE or cumulative_monotonic:
                    a, b = data
                    self.decoded.append(_Decoded(name, unit or "1", data_tag == _SUM, a, b,
                                                 self.plain_points(self.start + a, self.start + b)))
                    changed = True
                    continue
                self.skipped.append(name)
            kept += 1
            points += count
            payload.append(self.range(f_start, f_end))
        return kept, points, payload if changed else None

    def metric(self, start: int, end: int) -> tuple[str, str, int, tuple[int, int], int, bool] | None:
        wire = self.wire
        name = unit = None
        data_tag = count = 0
        data = (0, 0)
        cumulative_monotonic = False
        for tag, f_start, p_start, f_end in fields(wire, start, end):
            self.header(tag, f_start, p_start, f_end)
            if tag == _NAME or tag == _UNIT:
                if (name if tag == _NAME else unit) is not None:
                    raise WireError("a metric's name or unit twice")
                self.skeleton(p_start, f_end)
                text = wire[p_start:f_end].decode()
                if tag == _NAME:
                    if text in self.refuse:
                        return None
                    name = text
                else:
                    unit = text
            elif tag in _DATA:
                if data_tag:  # a second data field: protobuf keeps the last (or merges two of a kind)
                    raise WireError("data")
                data_tag, data = tag, self.range(p_start, f_end)
                count, cumulative_monotonic = self.data(tag, p_start, f_end)
            elif tag >> 3 in (1, 3, 5, 7, 9, 10, 11):  # a known field with another wire type
                raise WireError("metric field")
        if (name or "") in self.refuse:
            return None
        return name or "", unit or "", data_tag, data, count, cumulative_monotonic

    def plain_points(self, start: int, end: int) -> tuple[_PlainPoint, ...] | None:
        """A decoded metric's points, when each is laid out plainly: start time, time and value (read
        each time), attributes and flags (in the skeleton). None: codec.data_points reads them.
        """
        wire = self.wire
        out = []
        skeleton: list[tuple[int, int]] = []  # each point's bytes that are not its times or value
        values: list[tuple[int, str]] = []
        for tag, _, p_start, p_end in fields(wire, start, end):
            if tag != 0x0A:  # a Sum's settings: already in the skeleton
                continue
            found: dict[int, int] = {}  # tag -> where its 8 bytes begin
            attributes: tuple[int, int] | None = None
            flags: int | None = None
            for f_tag, f_start, f_p_start, f_end in fields(wire, p_start, p_end):
                if f_tag in _PLAIN_CODES and f_tag not in found:
                    found[f_tag] = f_p_start
                    skeleton.append((f_start, f_p_start))
                elif f_tag == 0x3A and (attributes is None or attributes[1] == f_start):
                    attributes = (attributes[0] if attributes else f_start, f_end)
                elif f_tag == 0x40 and flags is None:
                    flags = varint_at(wire, f_p_start)[0]
                    skeleton.append((f_start, f_end))
                else:  # exemplars, a field twice, attributes apart, unknown fields: not plain
                    return None
            value_tag = 0x21 if 0x21 in found else 0x31
            if (0x21 in found and 0x31 in found) or value_tag not in found or (flags or 0) & 1:
                return None  # no value, two, or a staleness marker: codec.data_points decides
            if attributes is not None:
                skeleton.append(attributes)
            index = {}
            for f_tag in sorted(found, key=found.__getitem__):  # in the order they lie
                index[f_tag] = len(self.values) + len(values)
                values.append((found[f_tag] - self.start, _PLAIN_CODES[f_tag]))
            out.append(_PlainPoint(index.get(0x19, -1), index[value_tag], index.get(0x11, -1), value_tag == 0x31,
                                   codec.decoded_attributes(wire[attributes[0]:attributes[1]]) if attributes else ()))
        for a, b in skeleton:
            self.skeleton(a, b)
        self.values += values
        return tuple(out)

    def data(self, tag: int, start: int, end: int) -> tuple[int, bool]:
        """A data message's point count (its field 1) and, for a Sum, whether it is monotonic and cumulative."""
        wire = self.wire
        count = temporality = monotonic = 0
        for f_tag, f_start, p_start, f_end in fields(wire, start, end):
            self.header(f_tag, f_start, p_start, f_end)
            if f_tag == 0x0A:
                count += 1
            elif f_tag == 0x10:
                temporality = varint_at(wire, p_start)[0]
            elif f_tag == 0x18:
                monotonic = varint_at(wire, p_start)[0]
        return count, tag == _SUM and bool(monotonic) and temporality == _CUMULATIVE


_SCOPE_TAG = b"\x12"


class ShapeStore:
    """The shapes seen so far, by payload size; bounded (a fleet's node agents send a few).

    Shared by the receiver's worker threads: a shape is immutable once built, and the store
    only ever swaps whole lists, so a reader sees a consistent list.
    """

    def __init__(self, max_shapes: int = 4096, per_size: int = 8):
        self.max_shapes = max_shapes
        self.per_size = per_size
        self._by_size: dict[int, list[Shape]] = {}
        self._count = 0
        self._lock = threading.Lock()

    def find(self, wire: bytes, start: int, end: int) -> Shape | None:
        """The shape of the ResourceMetrics whose payload is ``wire[start:end]``, if seen before."""
        for shape in self._by_size.get(end - start, ()):
            if shape.matches(wire, start):
                return shape
        return None

    def add(self, shape: Shape) -> None:
        with self._lock:
            if self._count >= self.max_shapes:
                self._by_size = {}
                self._count = 0
            same_size = self._by_size.get(shape.size, [])
            if len(same_size) >= self.per_size:  # the oldest of this size goes
                same_size = same_size[1:]
                self._count -= 1
            self._by_size[shape.size] = [*same_size, shape]
            self._count += 1

    def clear(self) -> None:
        """Forget every shape (memory is short: they are learned again)."""
        with self._lock:
            self._by_size = {}
            self._count = 0

    def __len__(self) -> int:
        return self._count
