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

The join rule in time is :mod:`.windows`'s. TPA and clock of one window must arrive in the
same request (a Collector sends each scrape as one request unless a batch processor splits
it with ``send_batch_max_size``). Input points of no GPU pass through untouched: nothing a
sender sent disappears (docs/otlp-receiver.md).

This module walks a request (the message path, and ResourceMetrics recognized by their
shape). Invariant of its byte-level paths: ``split_wire(body)`` and ``split(request, wire=body)``
equal ``split(ExportMetricsServiceRequest.FromString(body))`` (the message path): the same samples
field by field and in order, the same decoded points, and a pass-through whose bytes parse to
exactly the message path's remaining messages, with the same point counts; a layout a byte reader
does not expect goes the message path, whole. tests/test_otlp_join_wire.py (``test_wire_path_equals_message_path``,
``test_string_attributes_read_as_protobuf_does``), tests/test_otlp_scrape_shapes.py and
tests/test_corpus.py (every corpus page as the Collector forwards it, both ways) check it. One
concern per module beside it:

- :mod:`.inputs`: which metrics are read, what each feeds, in which unit;
- :mod:`.point_bytes`: a serialized data point's layout and its attributes as label pairs;
- :mod:`.series`: which GPU a point belongs to (resource and series identity, cached);
- :mod:`.points`: input points -> each GPU's readings;
- :mod:`.windows`: a GPU's readings -> its windows (GPU samples), pure;
- :mod:`.passthrough`: the forwarded ResourceMetrics cut from the received bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics

from otel_ofu.core.model import GpuSample, MetricPoint
from otel_ofu.otlp import codec
from otel_ofu.otlp.codec import WireResourceMetrics, _len_field
from otel_ofu.otlp.join.inputs import (
    DCGMRECEIVER_INPUTS,
    DCGMRECEIVER_KEPT,
    INPUT_METRICS,
    KEPT_INPUTS,
    NOT_BY_SHAPE,
    NOTICED_METRICS,
    PROMETHEUS_INPUTS,
)
from otel_ofu.otlp.join.passthrough import Edits, request_ranges, trimmed_wire, wire_passthrough
from otel_ofu.otlp.join.point_bytes import label_text
from otel_ofu.otlp.join.points import Joiner, dcgmreceiver_points
from otel_ofu.otlp.join.scrapes import ScrapeShapes, scrape_samples
from otel_ofu.otlp.join.series import ResourceView, resource_of
from otel_ofu.otlp.join.windows import samples_of
from otel_ofu.otlp.wire import Shape, ShapeStore, WireError, fields
from otel_ofu.pipeline.caches import on_release


def _keep_only(points: Any, indices: list[int]) -> None:
    """Delete every data point but those at ``indices`` (a repeated field, in place)."""
    keep = set(indices)
    for p_index in range(len(points) - 1, -1, -1):
        if p_index not in keep:
            del points[p_index]


def _take_inputs(rm: ResourceMetrics, joiner: Joiner, keep_rest: bool, edits: Edits | None = None,
                 decode: _Decoded | None = None) -> bool:
    """Feed rm's input points to the joiner; with keep_rest, delete them from rm in place.

    Returns whether anything is left in rm to pass through. ``edits``, when given, records
    what was deleted or changed, by the original indices, for :func:`trimmed_wire`, and
    counts the data points left (while the metrics are at hand). ``decode``: metrics to turn
    into points (they are deleted like the inputs: each is forwarded once, as points).
    Metrics are read in the order they came (the wire path's order), then deleted.
    """
    resource: ResourceView | None = None
    count = edits is not None
    deleted: list[tuple[int, int]] = []  # (scope, metric) indices, in reading order
    for s_index, scope_metrics in enumerate(rm.scope_metrics):
        for m_index, metric in enumerate(scope_metrics.metrics):
            name = metric.name
            if decode is not None and name in decode.names and decode.take(rm, metric):
                deleted.append((s_index, m_index))
                continue
            if name not in INPUT_METRICS:
                kept = name in KEPT_INPUTS or name in DCGMRECEIVER_KEPT
                kind_of_data = metric.WhichOneof("data") if count or kept else None
                if kind_of_data:
                    data = getattr(metric, kind_of_data)
                    if count:
                        edits.points += len(data.data_points)  # type: ignore[union-attr]
                    if kept and kind_of_data in ("gauge", "sum"):  # read, and left as it came
                        if resource is None:
                            resource = resource_of(rm.resource.SerializeToString())
                        if name in KEPT_INPUTS:
                            data_bytes = data.SerializeToString()
                            joiner.prometheus_points(resource, data_bytes, 0, len(data_bytes),
                                                     lambda p=data.data_points: p, KEPT_INPUTS[name], metric.unit)
                        else:
                            dcgmreceiver_points(joiner, resource, data.data_points, DCGMRECEIVER_KEPT[name],
                                                metric.unit)
                noticed = NOTICED_METRICS.get(name)
                if noticed is not None:  # a GPU source that gives no OFU: the receiver says so
                    if resource is None:
                        resource = resource_of(rm.resource.SerializeToString())
                    instance = label_text(resource.attributes.get("service.instance.id") or "")
                    joiner.noticed.setdefault((resource.fallback_host, instance), noticed)
                    if edits is not None:
                        edits.noticed = True
                continue
            kind_of_data = metric.WhichOneof("data")
            if kind_of_data not in ("gauge", "sum"):
                if count and kind_of_data:
                    edits.points += len(getattr(metric, kind_of_data).data_points)  # type: ignore[union-attr]
                continue
            if resource is None:
                resource = resource_of(rm.resource.SerializeToString())
            if edits is not None:
                edits.inputs = True
            data = getattr(metric, kind_of_data)
            points = data.data_points
            if name in PROMETHEUS_INPUTS:
                data_bytes = data.SerializeToString()
                left = joiner.prometheus_points(resource, data_bytes, 0, len(data_bytes), lambda p=points: p,
                                                PROMETHEUS_INPUTS[name], metric.unit)
            else:
                left = dcgmreceiver_points(joiner, resource, points, DCGMRECEIVER_INPUTS[name], metric.unit)
            if not left:  # every point joined: the metric goes
                deleted.append((s_index, m_index))
            elif keep_rest:  # points of no GPU, or pipes not ours: they stay, the joined ones go
                _keep_only(points, left)
                if edits is not None:
                    edits.metrics.setdefault(s_index, {})[m_index] = metric.SerializeToString()
                    edits.points += len(points)
    if not keep_rest:
        return False
    for s_index, m_index in reversed(deleted):
        del rm.scope_metrics[s_index].metrics[m_index]
        if edits is not None:
            edits.metrics.setdefault(s_index, {})[m_index] = None
    for s_index in range(len(rm.scope_metrics) - 1, -1, -1):
        if not rm.scope_metrics[s_index].metrics:  # left empty (or empty as it came): not forwarded
            del rm.scope_metrics[s_index]
            if edits is not None:
                edits.scopes.add(s_index)
    return len(rm.scope_metrics) > 0


# --- the wire path: ResourceMetrics recognized by their shape ---------------------------------
#
# With the received bytes at hand, a ResourceMetrics that holds no join input (what a node
# agent sends a jobs tier, anything passed through) is read through its shape
# (otel_ofu.otlp.wire): learned from the first ResourceMetrics of that shape, after the
# message path has read it, and recognized in every later one by one check of its skeleton.
# One shape store per decode list (what a shape decodes depends on it), kept for the
# process's life (bounded: see ShapeStore).

_shape_stores: dict[frozenset[str], ShapeStore] = {}
# A dcgm-exporter scrape (join inputs among its metrics) is read by its node's shape (.scrapes).
_scrape_stores: dict[frozenset[str], ScrapeShapes] = {}


@on_release
def _release_shapes() -> None:
    for store in list(_shape_stores.values()):
        store.clear()


def _shapes(decode: frozenset[str]) -> ShapeStore:
    store = _shape_stores.get(decode)
    if store is None:
        store = _shape_stores.setdefault(decode, ShapeStore())
    return store


def _scrapes(decode: frozenset[str]) -> ScrapeShapes:
    store = _scrape_stores.get(decode)
    if store is None:
        store = _scrape_stores.setdefault(decode, ScrapeShapes())
    return store


def _split_wire(request: ExportMetricsServiceRequest, wire: bytes, ranges: list[tuple[int, int, int]],
                joiner: Joiner, decoded: _Decoded | None) -> list[Any]:
    """The request's ResourceMetrics (``ranges`` in ``wire``), each by its shape or through protobuf objects."""
    names = decoded.names if decoded is not None else frozenset()
    shapes, scrapes = _shapes(names), _scrapes(names)
    rest: list[Any] = []
    for index, (f_start, p_start, f_end) in enumerate(ranges):
        shape = shapes.find(wire, p_start, f_end)
        if shape is not None:
            taken = shape.take(wire, f_start, p_start, f_end)
            if decoded is not None:
                decoded.points += taken.points
                decoded.skipped.update(taken.skipped)
            if taken.forward is not None:
                rest.append(WireResourceMetrics.of(taken.forward, taken.forward_points))
            continue
        read = scrapes.read(wire, f_start, p_start, f_end)
        if read is None and scrapes.learn(wire, p_start, f_end, names):  # a node's first scrape (or a new one)
            read = scrapes.read(wire, f_start, p_start, f_end)
        if read is not None:
            read.feed(wire, joiner)
            if read.forward is not None:
                rest.append(WireResourceMetrics.of(read.forward, read.points))
            continue
        edits = Edits()
        forwarded = _message_path(request.resource_metrics[index], wire, (f_start, p_start, f_end), joiner, decoded,
                                  edits)
        if forwarded is not None:
            rest.append(forwarded)
        if not edits.inputs and not edits.noticed:  # one with join inputs (a scrape) is left to .scrapes
            # Refused too when it holds a ratio the join reads and keeps (a shape would pass it on unread), or a
            # metric by which a source is noticed (a shape would pass it on unnoticed, to another receiver too).
            learned = Shape.learn(wire, p_start, f_end, names, NOT_BY_SHAPE)
            if learned is not None:
                shapes.add(learned)
    return rest


def _message_path(rm: ResourceMetrics, wire: bytes, span: tuple[int, int, int], joiner: Joiner,
                  decoded: _Decoded | None, edits: Edits) -> WireResourceMetrics | None:
    """One ResourceMetrics through protobuf objects, the pass-through cut from its bytes as far as they fit."""
    if not _take_inputs(rm, joiner, keep_rest=True, edits=edits, decode=decoded):
        return None
    f_start, p_start, f_end = span
    try:
        if not edits.changed():
            field_bytes = wire[f_start:f_end]
        else:
            field_bytes = _len_field(b"\x0a", trimmed_wire(wire, p_start, f_end, edits))
    except (WireError, IndexError):  # unexpected layout: serialize the message instead
        field_bytes = _len_field(b"\x0a", rm.SerializeToString())
    return WireResourceMetrics(rm, field_bytes, edits.points)


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
        self.points += codec.metric_points(metric, self._resource)
        return True


@dataclass(slots=True)
class Split:
    """What a request holds for a pipeline: GPU samples, decoded points, the rest to pass through."""

    samples: list[GpuSample]
    points: list[MetricPoint]
    passthrough: list[Any]
    undecodable: set[str]  # names in ``decode`` that arrived as histograms or delta sums (passed through)
    # (host, scrape target) -> a GPU source found there that gives no OFU (inputs.NOTICED_METRICS:
    # DCGMRECEIVER_V1, ...); the host is "" where the resource names none (a scrape of a loopback target).
    noticed: dict[tuple[str, str], str] = field(default_factory=dict)


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
    joiner = Joiner()
    decoded = _Decoded(decode) if decode else None
    rest: list[Any] = []
    ranges = request_ranges(wire, len(request.resource_metrics)) if wire is not None and passthrough else []
    if ranges:
        rest = _split_wire(request, wire, ranges, joiner, decoded)  # type: ignore[arg-type]
    else:
        kept: list[tuple[int, ResourceMetrics, Edits]] = []
        for index, rm in enumerate(request.resource_metrics):
            if not passthrough:
                _take_inputs(rm, joiner, keep_rest=False, decode=decoded)
            elif wire is None:
                if _take_inputs(rm, joiner, keep_rest=True, decode=decoded):
                    rest.append(rm)
            else:
                edits = Edits()
                if _take_inputs(rm, joiner, keep_rest=True, edits=edits, decode=decoded):
                    kept.append((index, rm, edits))
        if kept:  # the bytes do not fit the request: serialized (see wire_passthrough)
            rest = wire_passthrough(wire, len(request.resource_metrics), kept)  # type: ignore[arg-type]
    samples = _samples(joiner, window_s, tolerance_s)
    if decoded is None:
        return Split(samples, [], rest, set(), joiner.noticed)
    return Split(samples, decoded.points, rest, decoded.skipped, joiner.noticed)


def _samples(joiner: Joiner, window_s: float, tolerance_s: float) -> list[GpuSample]:
    tolerance_ns = int(tolerance_s * 1e9)
    return [s for entity in joiner.entities.values() if entity is not None
            for s in samples_of(entity, window_s, tolerance_ns)]


def split_wire(wire: bytes, *, window_s: float = 30.0, tolerance_s: float = 5.0, passthrough: bool = True,
               decode: frozenset[str] = frozenset()) -> Split:
    """:func:`split` of the serialized request ``wire``, parsed only if it must be.

    A request whose every ResourceMetrics is a known node's scrape (:mod:`.scrapes`) is read
    from its bytes alone: each matches, byte for byte but its points' times and values, one
    that protobuf parsed before, so it is as valid. Any other is parsed (raising protobuf's
    DecodeError when it is not an ExportMetricsServiceRequest) and split as :func:`split` does.
    """
    if passthrough:
        found = _split_scrapes(wire, window_s, tolerance_s, decode)
        if found is not None:
            return found
    return split(ExportMetricsServiceRequest.FromString(wire), window_s=window_s, tolerance_s=tolerance_s,
                 passthrough=passthrough, wire=wire, decode=decode)


def _split_scrapes(wire: bytes, window_s: float, tolerance_s: float, decode: frozenset[str]) -> Split | None:
    """The request read by its nodes' scrape shapes alone; None unless each of its ResourceMetrics matches one."""
    scrapes = _scrapes(decode)
    if not len(scrapes):
        return None
    reads = []
    try:
        for tag, f_start, p_start, f_end in fields(wire, 0, len(wire)):
            read = scrapes.read(wire, f_start, p_start, f_end) if tag == 0x0A else None
            if read is None:
                return None
            reads.append(read)
    except (WireError, IndexError):
        return None
    if not reads:
        return None
    rest = [WireResourceMetrics.of(read.forward, read.points) for read in reads if read.forward is not None]
    samples = scrape_samples(reads, wire, window_s, int(tolerance_s * 1e9))
    if samples is None:
        joiner = Joiner()
        for read in reads:
            read.feed(wire, joiner)
        samples = _samples(joiner, window_s, tolerance_s)
    return Split(samples, [], rest, set())


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
