"""Input data points -> GPU entities: each TPA, SM clock and max clock point to its GPU's readings.

A dcgm-exporter scrape's points are read from their serialized bytes (time and value at
fixed offsets, the GPU known by its attributes' bytes: :mod:`otel_ofu.otlp.join.point_bytes`,
:mod:`otel_ofu.otlp.join.series`); anything laid out otherwise, and dcgmreceiver's points,
through protobuf objects. Staleness markers are taken and dropped; points of no GPU are
handed back so that they pass through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otel_ofu.core.model import HOST_NAME
from otel_ofu.otlp.codec import varint_at
from otel_ofu.otlp.join.inputs import (
    DCGMRECEIVER_PIPE_ATTR,
    DCGMRECEIVER_RESOURCE,
    FLAG_NO_RECORDED_VALUE,
    TPA,
    point_value,
    scale,
)
from otel_ofu.otlp.join.point_bytes import (
    ATTRIBUTES_TAG,
    TIME_DOUBLE,
    TIME_INT,
    VALUE_TAGS,
    any_text,
    attributes_part,
    label_text,
    string_attributes,
)
from otel_ofu.otlp.join.series import NEW, Entity, ResourceView, int_or_str, remember, series_of


class Joiner:
    """Collects input points by GPU entity while walking a request."""

    def __init__(self) -> None:
        self.entities: dict[tuple, Entity | None] = {}
        self.noticed: dict[tuple[str, str], str] = {}  # (host, scrape target) -> a source that gives no OFU

    def _entity(self, series: tuple[tuple, Entity]) -> Entity:
        """This request's entity of a series: its readings start empty in every request."""
        key, identity = series
        entity = self.entities.get(key)
        if entity is None:
            entity = self.entities[key] = Entity(identity.host, identity.gpu_index, identity.uuid, identity.model,
                                                  identity.job_id, dict(identity.resource))
        return entity

    def add(self, series: tuple[tuple, Entity], kind: str, t: int, value: object) -> None:
        """One reading (time, value in the sample's units) of a GPU series."""
        getattr(self._entity(series), kind).append((t, value))

    def prometheus_points(self, resource: ResourceView, wire: bytes, start: int, end: int,
                          data_points: Callable[[], Any], kind: str, unit: str) -> list[int]:
        """One input metric's data points, each to its GPU entity.

        ``wire[start:end]``: the metric's serialized Gauge or Sum; ``data_points()``: its points
        as protobuf objects, for the points the byte reader leaves to protobuf. Returns the
        indices of the points that are no GPU's (no ``gpu`` or ``UUID`` label): nothing joins
        them, so they must pass through as they came.

        Why from bytes: protobuf objects cost about a microsecond per field read and per
        label. Each point is read from the bytes: time, value and the bytes of its
        attributes, which identify its GPU (the TPA and clock points of one GPU carry
        identical attributes); labels are decoded once per distinct attribute set and
        resource, and kept across requests. A point not laid out as protobuf writes a plain
        one (start time, exemplars, no time or value) is read through protobuf instead.
        """
        seen = resource.by_attribute_bytes
        left: list[int] = []
        i, index = start, 0
        while i < end and wire[i] == 0x0A:  # data_points come first; a Sum's settings follow
            size = wire[i + 1]
            p_start = i + 2
            if size >= 0x80:  # a point of 128 bytes to 16 KiB (most): two bytes
                second = wire[i + 2]
                size, p_start = (size & 0x7F) | (second << 7), i + 3
                if second >= 0x80:
                    size, p_start = varint_at(wire, i + 1)
            p_end = p_start + size
            i, index = p_end, index + 1
            if p_end - p_start < 18 or wire[p_start] != 0x19 or wire[p_start + 9] not in VALUE_TAGS or (
                    p_end > p_start + 18 and wire[p_start + 18] != ATTRIBUTES_TAG):
                if not self._prometheus_point(resource, data_points()[index - 1], kind, unit):
                    left.append(index - 1)
                continue
            _, t, value_tag, value = (TIME_DOUBLE if wire[p_start + 9] == 0x21 else TIME_INT).unpack_from(
                wire, p_start)
            attribute_bytes = wire[p_start + 18:p_end]
            series = seen.get(attribute_bytes, NEW)
            if series is NEW:
                pairs = string_attributes(attribute_bytes)
                if pairs is None:  # other shapes (or a flags field): the protobuf path decides
                    if not self._prometheus_point(resource, data_points()[index - 1], kind, unit):
                        left.append(index - 1)
                    continue
                series = series_of(resource, pairs)
                remember(resource, attribute_bytes, series)
            if series is not None:
                getattr(self._entity(series), kind).append((t, scale(value, unit, kind)))
            else:  # not a GPU series (e.g. a per-host field): nothing to join, it passes through
                left.append(index - 1)
        if i < end:  # anything the loop above did not reach (other fields first)
            points = data_points()
            for rest_index in range(index, len(points)):
                if not self._prometheus_point(resource, points[rest_index], kind, unit):
                    left.append(rest_index)
        return left

    def _prometheus_point(self, resource: ResourceView, dp: Any, kind: str, unit: str) -> bool:
        """One data point read through protobuf; False when it is no GPU's (it passes through).

        A staleness marker (the series went away; no reading) is taken and dropped: the
        metric it ends is re-emitted by the ``ofu`` processor under its own name.
        """
        if dp.flags & FLAG_NO_RECORDED_VALUE:
            return True
        series = point_series(resource, dp)
        if series is None:
            return False
        getattr(self._entity(series), kind).append((dp.time_unix_nano, scale(point_value(dp), unit, kind)))
        return True

    def dcgmreceiver_point(self, context: ResourceView, dp: Any, kind: str, unit: str) -> None:
        resource = context.attributes
        uuid = label_text(resource.get("gpu.uuid"))
        index = label_text(resource.get("gpu.number"))
        host = label_text(resource.get(HOST_NAME))
        key = (host, index, uuid, ())
        entity = self.entities.get(key)
        if entity is None:
            extra = {k: v for k, v in resource.items() if k not in DCGMRECEIVER_RESOURCE and k != HOST_NAME}
            entity = self.entities[key] = Entity(host, int_or_str(index), uuid, label_text(resource.get("gpu.model")),
                                                  None, extra)
        getattr(entity, kind).append((dp.time_unix_nano, scale(point_value(dp), unit, kind)))


def point_series(resource: ResourceView, dp: Any) -> tuple[tuple, Entity] | None:
    """The GPU series of a data point read through protobuf (None: no GPU's), as the byte reader finds it:
    by the bytes of its attributes as protobuf writes them, their labels decoded once per resource."""
    attribute_bytes = attributes_part(dp.SerializeToString())
    series = resource.by_attribute_bytes.get(attribute_bytes, NEW)
    if series is NEW:
        pairs = string_attributes(attribute_bytes)
        if pairs is None:
            pairs = [(kv.key, any_text(kv.value)) for kv in dp.attributes]
        series = series_of(resource, pairs)
        remember(resource, attribute_bytes, series)
    return series


def dcgmreceiver_points(joiner: Joiner, resource: ResourceView, points: Any, kind: str, unit: str) -> list[int]:
    """A dcgmreceiver input metric's points to the joiner; returns the indices of the pipes not ours."""
    other_pipes = []
    for p_index, dp in enumerate(points):
        if kind == TPA:
            pipe = next((any_text(kv.value) for kv in dp.attributes if kv.key == DCGMRECEIVER_PIPE_ATTR), "")
            if pipe != "tensor":
                other_pipes.append(p_index)  # fp64/fp32/fp16 pipes are not ours: pass them on
                continue
        if not dp.flags & FLAG_NO_RECORDED_VALUE:
            joiner.dcgmreceiver_point(resource, dp, kind, unit)
    return other_pipes
