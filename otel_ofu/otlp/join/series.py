"""Which GPU a point belongs to: a resource's shared labels, a GPU series' key and identity.

A scrape target sends the same resource every interval, and its GPUs the same label sets,
so both are worked out once and kept across requests (bounded caches, emptied by the
memory limiter): a GPU's labels are decoded and its identity found once, not per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_ofu.core import dcgm_fields
from otel_ofu.core.model import HOST_NAME
from otel_ofu.otlp.codec import from_any_value
from otel_ofu.otlp.join.inputs import COUNTER_KINDS
from otel_ofu.otlp.join.point_bytes import label_text
from otel_ofu.pipeline.caches import Cache, on_release

# Resource attributes a Prometheus receiver sets to describe the scrape target: they say
# where dcgm-exporter ran, not which GPU this is, so they are not copied onto OFU points.
SCRAPE_TARGET_ATTRIBUTES = frozenset({
    "service.name", "service.instance.id", "service.namespace", "server.address", "server.port", "url.scheme",
    "net.host.name", "net.host.port", "http.scheme",
})


@dataclass(slots=True)
class Entity:
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
    # Readings of the base-unit fields (DCGM 4.6.1), already in MHz; used instead of the above when present.
    clock_base_unit: list[tuple[int, object]] = field(default_factory=list)
    max_clock_base_unit: list[tuple[int, object]] = field(default_factory=list)
    # The loss account's ratios (GR, SM, DRAM activity), read but left to pass through.
    gr: list[tuple[int, object]] = field(default_factory=list)
    sm: list[tuple[int, object]] = field(default_factory=list)
    dram: list[tuple[int, object]] = field(default_factory=list)
    # The ledger's counters (inputs.COUNTER_KINDS), each a list like the above, made when a reading
    # comes (most requests have none): kind -> readings, reached as attributes by their kind.
    counters: dict[str, list[tuple[int, object]]] | None = None


def _counter_readings(kind: str) -> property:
    def readings(self: Entity) -> list[tuple[int, object]]:
        counters = self.counters
        if counters is None:
            counters = self.counters = {}
        found = counters.get(kind)
        if found is None:
            found = counters[kind] = []
        return found
    return property(readings, doc=f"The entity's {kind} readings (made on first use).")


for _kind in COUNTER_KINDS:
    setattr(Entity, _kind, _counter_readings(_kind))


def int_or_str(index: object) -> int | str:
    """A GPU index label as an int when it is one (``"3"`` -> 3), else the text as it came."""
    text = str(index)
    return int(text) if text.isdecimal() else text


_KEY_LABELS = dcgm_fields.EXPORTER_LABELS
NEW: Any = object()  # not looked up yet (None is a known answer: no GPU's series)


class ResourceView:
    """A ResourceMetrics' resource, and what every point under it shares, computed once.

    Kept across requests (:func:`resource_of`, keyed by the resource's bytes): a scrape
    target sends the same resource every interval, and so do its GPUs' label sets, so each
    GPU's labels are decoded and its identity worked out once, not once per request.
    """

    __slots__ = ("attributes", "labels", "fallback_host", "extra", "key", "by_attribute_bytes")

    def __init__(self, attributes: dict[str, Any]):
        self.attributes = attributes
        # dcgm-exporter labels a Collector may have promoted to resource attributes.
        self.labels = {k: label_text(v) for k, v in self.attributes.items() if k in dcgm_fields.EXPORTER_LABELS}
        self.fallback_host = label_text(self.attributes.get(HOST_NAME) or self.attributes.get("server.address") or "")
        self.extra = {k: v for k, v in self.attributes.items()
                      if k not in SCRAPE_TARGET_ATTRIBUTES and k not in dcgm_fields.EXPORTER_LABELS and k != HOST_NAME}
        self.key = (frozenset(self.labels.items()), self.fallback_host)
        # A data point's serialized attributes -> its entity's key and identity, None when the
        # point is no GPU's (see _Joiner.prometheus_points).
        self.by_attribute_bytes: dict[bytes, tuple[tuple, Entity] | None] = {}


# Bounds of what resource_of keeps: resources, and label sets (GPU series) over all of them.
# About 1 KB per GPU series: 131,072 series (a 100,000-GPU processing stage) is about 130 MB.
_RESOURCE_CACHE_SIZE = 16384
_SERIES_CACHE_SIZE = 1 << 17
resources: Cache = Cache("otlp join resources", _RESOURCE_CACHE_SIZE)  # serialized Resource -> ResourceView
_series_cached = 0


@on_release
def _release_resources() -> None:
    global _series_cached
    _series_cached = 0  # resources itself is emptied as a Cache


def resource_of(resource_bytes: bytes) -> ResourceView:
    """The :class:`ResourceView` of a serialized Resource message (kept, bounded: see above)."""
    global _series_cached
    found = resources.get(resource_bytes)
    if found is None:
        if _series_cached >= _SERIES_CACHE_SIZE:
            resources.clear()  # start over rather than grow: the working set comes back within one interval
            _series_cached = 0
        attributes = {kv.key: from_any_value(kv.value) for kv in Resource.FromString(resource_bytes).attributes}
        found = resources.put(resource_bytes, ResourceView(attributes))
    return found


def prometheus_entity(labels: dict[str, str], resource: ResourceView) -> Entity | None:
    ident = dcgm_fields.identity_from_labels(labels)
    if ident["gpu_index"] == "" and not ident["uuid"]:
        return None
    extra = {**resource.extra, **ident["resource"]}
    return Entity(ident["host"] or resource.fallback_host, int_or_str(ident["gpu_index"]), ident["uuid"],
                   ident["model"], ident["job_id"], extra)


def series_of(resource: ResourceView, pairs: list[tuple[str, str]]) -> tuple[tuple, Entity] | None:
    """A GPU series' entity key and identity (an Entity without readings), None for no GPU's series.

    The key is the point's dcgm-exporter labels (the same on every metric of one GPU) and
    the resource's: points of one key join, whichever metric or ResourceMetrics they are in.
    """
    key = (frozenset([pair for pair in pairs if pair[0] in _KEY_LABELS]), resource.key)
    identity = prometheus_entity({**resource.labels, **dict(key[0])}, resource)
    return None if identity is None else (key, identity)


def remember(resource: ResourceView, attribute_bytes: bytes, series: tuple[tuple, Entity] | None) -> None:
    global _series_cached
    resource.by_attribute_bytes[attribute_bytes] = series
    _series_cached += 1
