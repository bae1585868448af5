"""A dcgm-exporter scrape's ResourceMetrics read by its node's learned shape, without protobuf objects.

Why: behind a Collector, otel-ofu receives every node's scrape every interval: one
ResourceMetrics per node, a dozen gauges with one point per GPU, of which it reads two (TPA
and the SM clock) and forwards the rest. Read through protobuf objects, that cost about a
microsecond per metric and per field read, most of a processing stage's time (BENCHMARKS.md,
section 11). But a node's scrape looks the same every interval: the same resource and scope,
the same metrics with the same names, descriptions and labels; only the points' times and
values differ. What differs too is the *order* of the metrics: the Collector's Prometheus
receiver appends them by ranging over a Go map (receiver/prometheusreceiver/internal/
transaction.go), so no two scrapes need list them alike. And the Collector writes every
message's fields in reverse number order (pdata's generated MarshalProto: a metric's name
last, a point's value before its time, a ResourceMetrics' resource after its scopes), where
protobuf's own serializer writes them in order: neither layout is assumed. So the shape is
learned per node and per metric:

- the node (:class:`NodeShape`) is known by the bytes of its ResourceMetrics around its one
  ScopeMetrics (the resource) and of that ScopeMetrics before its first metric: the key;
- each metric (:class:`MetricShape`), found by its size, by its *skeleton*: every byte of it
  but the 8-byte times and values of its data points, checked in one struct call. An input
  metric's shape also knows where each point's time and value lie and which GPU each point
  is (its labels are in the skeleton); another metric's, how many data points it holds.

A ResourceMetrics whose key is a known node's and whose every metric matches one of that
node's metric shapes, in whatever order, is then read from its bytes alone: the inputs'
readings to the join (:class:`otel_ofu.otlp.join.points.Joiner`, in the order they lie, as
the message path feeds it), the rest cut out of the bytes as the message path cuts it.
Identical skeletons mean byte-identical messages but for those fixed64 fields, so such a
ResourceMetrics is as valid as the one the shape was learned from (which protobuf parsed):
a request whose ResourceMetrics all match needs no protobuf parse at all.

A shape is learned only from what this reader reads exactly as the message path does
(:func:`learn`): one ScopeMetrics, no field twice, input points with a time, a value and
labels of a GPU and nothing else; anything else (a staleness marker, a point of no GPU, a
metric decoded into points, a second scope) leaves that node to the message path.

Invariant (what this fast path must equal): a request read by its nodes' shapes gives what
:func:`otel_ofu.otlp.join.split` gives for the same bytes parsed by protobuf, request after
request: the same GPU samples, every field, in the same order (so the same windows, holders and
OFU downstream: a shared GPU's per-pod copies arrive as the same samples either way); a
pass-through whose bytes parse to the same messages, with the same point counts; the same decoded
points. Where a
ResourceMetrics does not match, the whole request goes the message path (never part of it by
shape). Checked by tests/test_otlp_scrape_shapes.py on random scrapes around the Collector's
layout (hypothesis, both field orders), on the kept and the remade Collector capture of every
dcgm-exporter page of the corpus, and on benchmarks/stage.py's workload.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import KeysView
from itertools import repeat
from typing import Any

from opentelemetry.proto.metrics.v1.metrics_pb2 import NumberDataPoint
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_ofu.core.model import GpuSample
from otel_ofu.otlp.codec import varint, varint_at
from otel_ofu.otlp.join.inputs import (
    CLOCK,
    CLOCK_BASE_UNIT,
    COUNTER_KINDS,
    DCGMRECEIVER_READ,
    DRAM,
    GR,
    KEPT_INPUTS,
    NOTICED_METRICS,
    PROMETHEUS_INPUTS,
    SM,
    TPA,
    scale,
    scales,
)
from otel_ofu.otlp.join.point_bytes import ATTRIBUTES_TAG, VALUE_TAGS
from otel_ofu.otlp.join.points import Joiner, point_series
from otel_ofu.otlp.join.series import Entity, ResourceView, resource_of
from otel_ofu.otlp.join.windows import put_counters, scrape_sample
from otel_ofu.otlp.wire import WireError, fields
from otel_ofu.pipeline.caches import Cache

_METRIC, _SCOPE_METRICS = 0x12, 0x12  # ScopeMetrics.metrics, ResourceMetrics.scope_metrics
_NAME, _DESCRIPTION, _UNIT, _METADATA = 0x0A, 0x12, 0x1A, 0x62  # Metric fields
_GAUGE, _SUM = 0x2A, 0x3A
_DATA = frozenset({_GAUGE, _SUM, 0x4A, 0x52, 0x5A})  # ... histogram, exponential histogram, summary
_POINT = 0x0A  # data_points, field 1 of every data message
_CODES = {0x11: "Q", 0x19: "Q", 0x21: "d", 0x31: "q"}  # a NumberDataPoint's fixed64 fields

_CLOCKS = frozenset({CLOCK, CLOCK_BASE_UNIT})

Series = tuple[tuple, Entity]


class MetricShape:
    """One metric of a node's scrape: its skeleton, and what it is (an input, or passed through)."""

    __slots__ = ("size", "check", "expected", "points", "kind", "kept", "unit", "scaled", "values", "time_first",
                 "series", "keys", "index", "orders")

    def __init__(self, size: int, check: struct.Struct, expected: tuple, points: int, kind: str | None, unit: str,
                 values: struct.Struct | None, time_first: bool, series: tuple[Series, ...], kept: bool = False):
        self.size = size  # the Metric message's size
        self.check = check  # unpacks its skeleton
        self.expected = expected  # the skeleton learned
        self.points = points  # its data points (counted in the pass-through)
        self.kind = kind  # the reading it feeds (inputs.TPA, ...), None: it passes through
        self.kept = kept  # read, and passed through as it came (the loss account's ratios: inputs.KEPT_INPUTS)
        self.unit = unit
        self.scaled = kind is not None and scales(unit, kind)  # whether inputs.scale changes its values
        self.values = values  # unpacks each point's time and value, in the order they lie, for an input
        self.time_first = time_first  # a point's time lies before its value (protobuf's order; the Collector's: after)
        self.series = series  # each point's GPU series, for an input
        # For an input: a GPU's point by its entity key, the keys (None: a GPU twice), and where
        # another input of the node holds each of this one's GPUs (_order).
        self.index: dict[tuple, int] = {}
        self.keys: KeysView[tuple] | None = None
        self.orders: dict[MetricShape, tuple[int, ...]] | None = None
        if kind is not None:
            self.index = {key: k for k, (key, _) in enumerate(series)}
            self.keys = self.index.keys() if len(self.index) == len(series) else None
            self.orders = {}

    def readings(self, wire: bytes, start: int) -> list[tuple[int, object]]:
        """Each point's (time, value in the sample's units), for the metric whose payload starts at ``wire[start]``."""
        return list(zip(*self.times_values(wire, start)))

    def times_values(self, wire: bytes, start: int) -> tuple[tuple[int, ...], tuple[object, ...]]:
        """Its points' times and their values in the sample's units (two tuples, in the order the points lie)."""
        values = self.values.unpack_from(wire, start)  # type: ignore[union-attr]
        times, readings = (values[0::2], values[1::2]) if self.time_first else (values[1::2], values[0::2])
        if self.scaled:
            readings = tuple([scale(value, self.unit, self.kind) for value in readings])  # type: ignore[arg-type]
        return times, readings


class NodeShape:
    """A node's scrape: the bytes around its metrics (learned; the head, tail and scope head are its key)
    and each metric's shape, by size (two metrics of one size: each is tried)."""

    __slots__ = ("size", "head", "tail", "scope_head", "scope_tail", "metrics")

    def __init__(self, size: int, head: bytes, tail: bytes, scope_head: bytes, scope_tail: bytes,
                 metrics: dict[int, tuple[MetricShape, ...]]):
        self.size = size  # the ResourceMetrics payload's size
        self.head = head  # its bytes before its scope_metrics field (protobuf's order: the resource)
        self.tail = tail  # its bytes after it (the Collector's order: the resource)
        self.scope_head = scope_head  # the ScopeMetrics' bytes before its first metric (protobuf's: the scope)
        self.scope_tail = scope_tail  # its bytes after its last metric (the Collector's: the scope)
        self.metrics = metrics


class Read:
    """A ResourceMetrics read through its node's shape: where its input points lie, and the pass-through."""

    __slots__ = ("inputs", "forward", "points")

    def __init__(self, inputs: list[tuple[MetricShape, int]], forward: bytes | None, points: int):
        self.inputs = inputs  # (input metric's shape, where its Metric payload starts)
        self.forward = forward  # the forwarded ResourceMetrics as a request field; None: nothing is left
        self.points = points  # data points in it

    def feed(self, wire: bytes, joiner: Joiner) -> None:
        """Every input point's reading to its GPU entity, in the order they lie (as the message path feeds them)."""
        for shape, start in self.inputs:
            kind = shape.kind
            for series, (t, value) in zip(shape.series, shape.readings(wire, start)):
                joiner.add(series, kind, t, value)  # type: ignore[arg-type]


def _skip(wire: bytes, i: int, end: int) -> int:
    """Where the field at ``wire[i]`` ends."""
    tag, j = wire[i], i + 1
    if tag >= 0x80:
        tag, j = varint_at(wire, i)
    wire_type = tag & 7
    if wire_type == 2:
        size, j = varint_at(wire, j)
        j += size
    elif wire_type == 0:
        j = varint_at(wire, j)[1]
    elif wire_type == 1:
        j += 8
    elif wire_type == 5:
        j += 4
    else:
        raise WireError(f"wire type {wire_type}")
    if j > end:
        raise WireError("field runs past its message")
    return j


def _layout(wire: bytes, start: int, end: int) -> tuple[int, int, int, int]:
    """Where, in the ResourceMetrics payload ``wire[start:end]``, its first scope_metrics field starts,
    that field's payload starts, where it ends, and where its first metric starts."""
    i = start
    while wire[i] != _SCOPE_METRICS:
        i = _skip(wire, i, end)
    size, scope = varint_at(wire, i + 1)
    scope_end = scope + size
    if scope_end > end:
        raise WireError("scope_metrics runs past its ResourceMetrics")
    first = scope
    while wire[first] != _METRIC:
        first = _skip(wire, first, scope_end)
    return i, scope, scope_end, first


class ScrapeShapes:
    """The nodes seen so far, by key: bounded (a fleet's nodes), emptied when memory is short."""

    def __init__(self, max_nodes: int = 1 << 15, max_metrics_per_node: int = 256):
        self.max_metrics_per_node = max_metrics_per_node
        self.nodes: Cache = Cache("otlp scrape shapes", max_nodes)  # (head, tail, scope head) -> NodeShape
        self._lock = threading.Lock()

    def read(self, wire: bytes, field_start: int, start: int, end: int) -> Read | None:
        """The ResourceMetrics whose payload is ``wire[start:end]`` (its field from ``field_start``),
        read through its node's shape; None when it does not match one."""
        try:
            scope_at, scope, scope_end, first = _layout(wire, start, end)
        except (WireError, IndexError):
            return None
        node = self.nodes.get((wire[start:scope_at], wire[scope_end:end], wire[scope:first]))
        if node is None or node.size != end - start:
            return None
        shapes = node.metrics
        inputs: list[tuple[MetricShape, int]] = []
        cut: list[int] = []  # the start and end of each input metric's field, in order
        points = kept = 0
        i = first
        try:
            while i < scope_end and wire[i] == _METRIC:
                size = wire[i + 1]
                a = i + 2
                if size >= 0x80:  # a metric of 128 bytes to 16 KiB (a node's 8 GPUs): two bytes
                    second = wire[a]
                    size, a = (size & 0x7F) | (second << 7), a + 1
                    if second >= 0x80:
                        size, a = varint_at(wire, i + 1)
                for shape in shapes.get(size, ()):
                    if shape.check.unpack_from(wire, a) == shape.expected:
                        break
                else:
                    return None
                if shape.kind is None:
                    points += shape.points
                    kept += 1
                else:
                    inputs.append((shape, a))
                    if shape.kept:
                        points += shape.points
                        kept += 1
                    else:
                        cut += (i, a + size)
                i = a + size
        except (IndexError, struct.error):
            return None
        if wire[i:scope_end] != node.scope_tail:
            return None
        if not cut:
            return Read(inputs, wire[field_start:end], points)
        if not kept:  # every metric was an input: the scope goes, and with it the ResourceMetrics
            return Read(inputs, None, 0)
        # The ResourceMetrics without its inputs, copied once: the bytes around the metrics are the
        # node's (the ones learned, as the key and tail matched), the metrics kept are the wire's.
        view = memoryview(wire)
        metrics = [view[first:cut[0]]]
        metrics += [view[cut[k]:cut[k + 1]] for k in range(1, len(cut) - 1, 2)]
        metrics.append(view[cut[-1]:i])
        kept_bytes = i - first - sum([cut[k + 1] - cut[k] for k in range(0, len(cut), 2)])
        scope_size = len(node.scope_head) + kept_bytes + len(node.scope_tail)
        scope_size_bytes = varint(scope_size)
        size = len(node.head) + 1 + len(scope_size_bytes) + scope_size + len(node.tail)
        forward = b"".join([b"\x0a", varint(size), node.head, b"\x12", scope_size_bytes, node.scope_head, *metrics,
                            node.scope_tail, node.tail])
        return Read(inputs, forward, points)

    def learn(self, wire: bytes, start: int, end: int, decode: frozenset[str]) -> bool:
        """Learn the node shape of the ResourceMetrics ``wire[start:end]``, which protobuf parsed (so valid);
        False when it is not a scrape this reader reads (:func:`learn`)."""
        learned = learn(wire, start, end, decode)
        if learned is None:
            return False
        key, node = learned
        with self._lock:
            known = self.nodes.get(key)
            if known is not None and (known.size, known.scope_tail) == (node.size, node.scope_tail):
                # A metric the node sends only sometimes, or in another layout: the shapes learned before stay.
                merged = {size: list(shapes) for size, shapes in node.metrics.items()}
                count = sum(len(shapes) for shapes in merged.values())
                for size, shapes in known.metrics.items():
                    for shape in shapes:
                        if count < self.max_metrics_per_node and all(
                                shape.expected != other.expected for other in merged.get(size, ())):
                            merged.setdefault(size, []).append(shape)
                            count += 1
                node.metrics = {size: tuple(shapes) for size, shapes in merged.items()}
            self.nodes.put(key, node)
        return True

    def clear(self) -> None:
        self.nodes.clear()

    def __len__(self) -> int:
        return len(self.nodes)


# --- learning -------------------------------------------------------------------------------------

_parts: Cache = Cache("otlp scrape shape parts", 1 << 17)  # skeleton pieces, one object for equal ones
_structs: Cache = Cache("otlp scrape shape structs", 1 << 14)  # format -> struct.Struct


def _struct(fmt: str) -> struct.Struct:
    """One struct.Struct per format (kept, shared: the metrics of a fleet's nodes have few layouts)."""
    found = _structs.get(fmt)
    return found if found is not None else _structs.put(fmt, struct.Struct(fmt))


def learn(wire: bytes, start: int, end: int, decode: frozenset[str]) -> tuple[tuple, NodeShape] | None:
    """The key and node shape of the ResourceMetrics ``wire[start:end]``; None when this reader would not
    read it exactly as the message path does (see the module docstring)."""
    try:
        scope_at, scope, scope_end, first = _layout(wire, start, end)
        around = fields(wire, start, scope_at) + fields(wire, scope_end, end)
        if any(tag == _SCOPE_METRICS for tag, *_ in around):
            return None  # a second ScopeMetrics
        resources = [(p_start, f_end) for tag, _, p_start, f_end in around if tag == 0x0A]
        if len(resources) > 1:
            return None  # two resources: protobuf merges them
        resource = _resource_view(wire[resources[0][0]:resources[0][1]] if resources else b"")
        metrics: dict[int, list[MetricShape]] = {}
        labels: dict[bytes, Series | None] = {}
        inputs = False
        i = first
        for tag, _, p_start, f_end in fields(wire, first, scope_end):
            if tag != _METRIC:
                break
            shape = _learn_metric(wire, p_start, f_end, decode, resource, labels)
            if shape is None:
                return None
            if all(shape.expected != other.expected for other in metrics.get(shape.size, ())):
                metrics.setdefault(shape.size, []).append(shape)
            inputs = inputs or shape.kind is not None
            i = f_end
        if not inputs:
            return None  # no join input: not a dcgm-exporter scrape (wire.Shape reads what only passes through)
        if any(tag == _METRIC for tag, *_ in fields(wire, i, scope_end)):
            return None  # metrics apart from each other
    except (WireError, IndexError, UnicodeDecodeError):
        return None
    key = (wire[start:scope_at], wire[scope_end:end], wire[scope:first])
    return key, NodeShape(end - start, key[0], key[1], key[2], wire[i:scope_end],
                          {size: tuple(shapes) for size, shapes in metrics.items()})


def _resource_view(resource: bytes) -> ResourceView:
    """The join's view of a serialized Resource (what its GPU series depend on), as the message path gets it."""
    return resource_of(Resource.FromString(resource).SerializeToString())  # keyed by protobuf's serialization


def _learn_metric(wire: bytes, start: int, end: int, decode: frozenset[str], resource: ResourceView,
                  labels: dict[bytes, Series | None]) -> MetricShape | None:
    """One Metric's shape; None when it is not to be read so. ``labels``: see :func:`_input_point`."""
    name = unit = ""
    seen: set[int] = set()
    data: tuple[int, int, int] | None = None
    for tag, _, p_start, f_end in fields(wire, start, end):
        if tag == _NAME or tag == _UNIT or tag == _DESCRIPTION:
            if tag in seen:
                return None  # a field twice (protobuf keeps the last): not read here
            seen.add(tag)
            if tag == _NAME:
                name = wire[p_start:f_end].decode()
            elif tag == _UNIT:
                unit = wire[p_start:f_end].decode()
        elif tag in _DATA:
            if data is not None:
                return None  # two data fields (protobuf keeps the last, or merges two)
            data = (tag, p_start, f_end)
        elif tag != _METADATA:
            return None  # another field, or a known one with another wire type
    if name in decode or name in DCGMRECEIVER_READ or name in NOTICED_METRICS:
        return None  # decoded into points, dcgmreceiver's, or a source the message path notices
    kind = (PROMETHEUS_INPUTS.get(name) or KEPT_INPUTS.get(name)) if data is not None and data[0] in (_GAUGE, _SUM) \
        else None
    points = 0
    series: list[Series] = []
    slots: list[int] = []  # where each fixed64 payload of a point lies: every other byte is the skeleton
    last_point_end = start
    layouts = set()
    if data is not None:
        tag, d_start, d_end = data
        numbers = tag in (_GAUGE, _SUM)  # NumberDataPoints: their fixed64 fields are read, not checked
        for d_tag, p_start, f_end in _data_fields(wire, d_start, d_end):
            if d_tag != _POINT:
                if kind is not None and (tag != _SUM or d_tag not in (0x10, 0x18)):
                    return None  # an input's Gauge or Sum holds its points and a Sum's settings, nothing else
                continue
            points += 1
            last_point_end = f_end
            if not numbers:
                continue
            first, second = wire[p_start], wire[p_start + 9] if f_end - p_start >= 18 else 0
            if first == 0x19 and second in VALUE_TAGS or first in VALUE_TAGS and second == 0x19:
                slots += (p_start + 1, p_start + 10)  # time and value, in protobuf's order or the Collector's
                layouts.add(first == 0x19)
            else:
                slots += [q_start for q_tag, _, q_start, _ in fields(wire, p_start, f_end) if q_tag in _CODES]
                layouts.add(None)
            if kind is not None:
                found = _input_point(wire, p_start, f_end, resource, labels)
                if found is None:
                    return None
                series.append(found)
    # The skeleton: the pieces between the slots. A piece runs from one point's value to the next
    # one's time: a GPU's labels and the point framing, the same in every metric of the node (one
    # shared object); the last point's labels are a piece apart from what follows them (the name
    # and description, in the Collector's order: the same in every node).
    cuts = [(slot, 8) for slot in slots]
    if slots and slots[-1] + 8 < last_point_end < end:
        cuts.append((last_point_end, 0))
    starts = [start, *[at + gap for at, gap in cuts]]
    ends = [*[at for at, _ in cuts], end]
    gaps = [f"{gap}x" if gap else "" for _, gap in cuts] + [""]
    check = _struct("<" + "".join([f"{b - a}s{gap}" for a, b, gap in zip(starts, ends, gaps)]))
    kept = _parts.get
    expected = tuple([kept(piece) or _parts.put(piece, piece) for piece in [wire[a:b] for a, b in zip(starts, ends)]])
    values = None
    time_first = True
    if kind is not None:  # each point's time and value, adjacent, in one layout (_input_point)
        if len(layouts) > 1:
            return None
        time_first = layouts != {False}
        fmt = ["<"]
        at = start
        for k in range(0, len(slots), 2):
            first_code = "Q" if time_first else _CODES[wire[slots[k] - 1]]
            second_code = _CODES[wire[slots[k + 1] - 1]] if time_first else "Q"
            fmt.append(f"{slots[k] - at}x{first_code}x{second_code}")
            at = slots[k + 1] + 8
        values = _struct("".join(fmt))
    return MetricShape(end - start, check, expected, points, kind, unit, values, time_first, tuple(series),
                       name in KEPT_INPUTS)


def _data_fields(wire: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """(tag, payload start, field end) of a data message's fields: :func:`fields` with its points' sizes
    read inline (a scrape's points are 128 bytes to 16 KiB: two bytes)."""
    out = []
    i = start
    while i < end:
        if wire[i] != _POINT or wire[i + 1] < 0x80 or wire[i + 2] >= 0x80:
            tag, _, p_start, f_end = fields(wire, i, _skip(wire, i, end))[0]  # anything else, one field
        else:
            tag, p_start = _POINT, i + 3
            f_end = p_start + ((wire[i + 1] & 0x7F) | (wire[i + 2] << 7))
            if f_end > end:
                raise WireError("field runs past its message")
        out.append((tag, p_start, f_end))
        i = f_end
    return out


def _input_point(wire: bytes, start: int, end: int, resource: ResourceView, found: dict[bytes, Series | None]
                 ) -> Series | None:
    """The GPU series of an input point laid out as a time, a value and labels (in either order) and
    nothing else, as the message path finds it; None for any other point (that node is left to it).
    ``found``: the series of the labels seen so far in this ResourceMetrics, by their bytes."""
    if end - start < 18 or {wire[start], wire[start + 9]} not in _TIME_VALUE:
        return None
    labels = wire[start + 18:end]
    series = found.get(labels, _NEW)
    if series is _NEW:
        i = start + 18
        while i < end:  # labels only: a start time, exemplars, flags (a staleness marker) are the message path's
            if wire[i] != ATTRIBUTES_TAG:
                return None
            i = _skip(wire, i, end)
        series = found[labels] = point_series(resource, NumberDataPoint.FromString(wire[start:end]))
    return series  # type: ignore[return-value]


_TIME_VALUE = ({0x19, 0x21}, {0x19, 0x31})


# --- a scrape's samples straight from its readings -----------------------------------------------


def scrape_samples(reads: list[Read], wire: bytes, window_s: float, tolerance_ns: int) -> list[GpuSample] | None:
    """The GPU samples of a request read by shape, made without the joiner, when that is the same thing.

    That is when each ResourceMetrics holds one TPA and one SM clock metric (in either of the
    clock's units) of the same GPUs, each once, no GPU is in two of them, and each GPU's two
    readings lie within the tolerance: then each GPU has exactly one window, made by the join
    rule's scrape case (:func:`otel_ofu.otlp.join.windows.scrape_sample`), in the order the
    joiner would make them (its first reading's). The loss account's ratios and the ledger's
    counters, when the node sends them (at most one metric each, of the same GPUs), go with each
    GPU's window as the join rule puts them. None otherwise: the joiner makes them.
    """
    seen: set[tuple] = set()
    total = 0
    pairs = []
    for read in reads:
        inputs = read.inputs
        if not inputs:
            continue
        tpa = clock = None
        ratios: list[tuple[MetricShape, int]] = []
        counters: dict[str, tuple[MetricShape, int]] = {}
        for item in inputs:
            kind = item[0].kind
            if kind == TPA and tpa is None:
                tpa = item
            elif kind in _CLOCKS and clock is None:
                clock = item
            elif kind in _RATIOS and len(ratios) < 3 and all(r[0].kind != kind for r in ratios):
                ratios.append(item)
            elif kind in _COUNTERS and kind not in counters:
                counters[kind] = item  # type: ignore[index]
            else:
                return None
        if tpa is None or clock is None:
            return None
        first = inputs[0][0]  # the joiner makes the windows in the order of the first reading it gets
        if first.keys is None or any(_order(first, other[0]) is _APART
                                     for other in (tpa, clock, *ratios, *counters.values())):
            return None
        seen.update(first.keys)
        total += len(first.keys)
        pairs.append((first, tpa, clock, ratios, counters))
    if len(seen) != total:
        return None
    out = []
    for first, (tpa, tpa_at), (clock, clock_at), ratios, counters in pairs:
        # each GPU's readings in the first metric's order
        tpa_times, tpa_values = _readings(first, tpa, tpa_at, wire)
        clock_times, clock_values = _readings(first, clock, clock_at, wire)
        gr = sm = dram = _NONE
        for shape, at in ratios:
            kind = shape.kind
            if kind == GR:
                gr = _readings(first, shape, at, wire)
            elif kind == SM:
                sm = _readings(first, shape, at, wire)
            else:
                dram = _readings(first, shape, at, wire)
        forwarded = bool(ratios)
        counter_readings = {kind: _readings(first, shape, at, wire) for kind, (shape, at) in counters.items()}
        for k, ((_, gpu), t, tpa_value, clock_t, clock_value, gr_t, gr_value, sm_t, sm_value, dram_t, dram_value) in \
                enumerate(zip(first.series, tpa_times, tpa_values, clock_times, clock_values, *gr, *sm, *dram)):
            # A ratio goes with the window when it lies within the tolerance of its TPA reading (the join rule).
            sample = scrape_sample(gpu, t, tpa_value, clock_t, clock_value, None, window_s, tolerance_ns,
                                   dict(gpu.resource), gr_value if abs(gr_t - t) <= tolerance_ns else None,
                                   sm_value if abs(sm_t - t) <= tolerance_ns else None,
                                   dram_value if abs(dram_t - t) <= tolerance_ns else None, forwarded)
            if sample is None:
                return None
            if counter_readings:
                put_counters(sample, {kind: value if abs(times[k] - t) <= tolerance_ns else None
                                      for kind, (times, values) in counter_readings.items()
                                      for value in (values[k],)})
            out.append(sample)
    return out


_RATIOS = frozenset({GR, SM, DRAM})
_COUNTERS = frozenset(COUNTER_KINDS)


_NONE = (repeat(0), repeat(None))  # a ratio the node does not send: no reading for any GPU (None at any time)


def _readings(first: MetricShape, shape: MetricShape, at: int, wire: bytes) -> tuple[tuple, tuple]:
    """An input metric's times and values, in the order ``first`` holds its GPUs (which :func:`_order` found)."""
    times, values = shape.times_values(wire, at)
    order = _order(first, shape)
    if order is None:
        return times, values
    return tuple([times[i] for i in order]), tuple([values[i] for i in order])


def _order(first: MetricShape, other: MetricShape) -> tuple[int, ...] | None | object:
    """Where ``other`` holds each of ``first``'s GPUs; None: in the same order; _APART: it holds other GPUs
    (or one twice). Kept: two input metrics of a node pair up the same way every scrape."""
    if other is first:
        return None
    orders = first.orders
    found = orders.get(other, _NEW)  # type: ignore[union-attr]
    if found is _NEW:
        if other.keys is None or other.keys != first.keys:
            found = _APART
        else:
            found = tuple(other.index[key] for key, _ in first.series)
            if found == tuple(range(len(found))):
                found = None
        if len(orders) >= 8:  # type: ignore[arg-type]
            orders.clear()  # type: ignore[union-attr]
        orders[other] = found  # type: ignore[index]
    return found


_NEW: Any = object()
_APART: Any = object()
