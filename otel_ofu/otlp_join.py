"""OTLP metrics in -> GPU samples: find TPA and SM clock points, join them per GPU and window.

Two shapes of DCGM data arrive over OTLP (REFERENCE.md sections 6 and 7):

- a Collector's Prometheus receiver scraping dcgm-exporter: gauges named after the DCGM
  fields (``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``, ``DCGM_FI_DEV_SM_CLOCK`` in MHz, ...) with the
  dcgm-exporter labels as data point attributes and the scrape target in the resource;
- Google's dcgmreceiver: ``gpu.dcgm.pipe.utilization`` (attribute ``gpu.pipe=tensor``) and
  ``gpu.dcgm.clock.frequency`` in Hz, with ``gpu.model``/``gpu.number``/``gpu.uuid`` on the
  resource.

:func:`split_request` is pure (no I/O) and is what the ``otlp`` receiver and the throughput
benchmark call. Its hot path touches only the TPA and clock data points in Python; every
other metric stays a protobuf object and is passed through without per-point work.

Join rule: a GPU entity (host, index, UUID, MIG instance, pod) gives one sample per TPA data
point, at the TPA point's time. The clock points of the same entity whose timestamps lie
within ``tolerance_s`` of it (nearest TPA wins) are averaged into the sample's SM clock.
A scrape stamps all its points with one time, so that is an exact match; dcgmreceiver's
per-field timestamps differ by milliseconds. TPA and clock of one window must arrive in the
same request (a Collector sends each scrape as one request unless a batch processor splits
it with ``send_batch_max_size``). A TPA point without a clock still makes a sample; the
``ofu`` processor then reports it as a dropped window (``missing``), never as 0.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics

from otel_ofu import dcgm_fields
from otel_ofu.model import HOST_NAME, GpuSample
from otel_ofu.otlp import from_any_value
from otel_ofu.values import clean_clock

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
    if kind == TPA:
        return value / 100.0 if unit == "%" else value
    # dcgmreceiver reports Hz. A clock in Hz may exceed the INT32 blank sentinel (2.2 GHz),
    # so it is converted here and never judged as a possible DCGM blank.
    if unit == "Hz":
        return value / 1e6
    if unit == "kHz":
        return value / 1e3
    if unit == "GHz":
        return value * 1e3
    return value


def _int_or_str(index: object) -> int | str:
    text = str(index)
    return int(text) if text.isdigit() else text


_KEY_LABELS = dcgm_fields.EXPORTER_LABELS
_NEW: Any = object()


class _Resource:
    """One ResourceMetrics' attributes, and what every point under it shares, computed once."""

    __slots__ = ("attributes", "labels", "fallback_host", "extra", "key")

    def __init__(self, rm: ResourceMetrics):
        self.attributes = {kv.key: from_any_value(kv.value) for kv in rm.resource.attributes}
        # dcgm-exporter labels a Collector may have promoted to resource attributes.
        self.labels = {k: str(v) for k, v in self.attributes.items() if k in dcgm_fields.EXPORTER_LABELS}
        self.fallback_host = str(self.attributes.get(HOST_NAME) or self.attributes.get("server.address") or "")
        self.extra = {k: v for k, v in self.attributes.items()
                      if k not in SCRAPE_TARGET_ATTRIBUTES and k not in dcgm_fields.EXPORTER_LABELS and k != HOST_NAME}
        self.key = (frozenset(self.labels.items()), self.fallback_host)


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

    def prometheus_point(self, resource: _Resource, dp: Any, kind: str, unit: str) -> None:
        # The entity key is the point's dcgm-exporter labels (the same on every metric of one
        # GPU), cheap to build; the identity is worked out once per entity.
        key = (frozenset([(kv.key, kv.value.string_value) for kv in dp.attributes if kv.key in _KEY_LABELS]),
               resource.key)
        entity = self.entities.get(key, _NEW)
        if entity is _NEW:
            entity = self.entities[key] = _prometheus_entity({**resource.labels, **dict(key[0])}, resource)
        if entity is not None:  # None: not a GPU series (e.g. a per-host field), nothing to join
            getattr(entity, kind).append((dp.time_unix_nano, _scale(_value(dp), unit, kind)))

    def dcgmreceiver_point(self, context: _Resource, dp: Any, kind: str, unit: str) -> None:
        resource = context.attributes
        uuid = str(resource.get("gpu.uuid") or "")
        index = resource.get("gpu.number")
        index = "" if index is None else str(index)
        host = str(resource.get(HOST_NAME) or "")
        key = (host, index, uuid, ())
        entity = self.entities.get(key)
        if entity is None:
            extra = {k: v for k, v in resource.items() if k not in DCGMRECEIVER_RESOURCE and k != HOST_NAME}
            entity = self.entities[key] = _Entity(host, _int_or_str(index), uuid, str(resource.get("gpu.model") or ""),
                                                  None, extra)
        getattr(entity, kind).append((dp.time_unix_nano, _scale(_value(dp), unit, kind)))


def _samples(entity: _Entity, window_s: float, tolerance_ns: int) -> list[GpuSample]:
    if not entity.tpa:
        return []
    tpa = sorted(entity.tpa, key=lambda p: p[0])
    times = [t for t, _ in tpa]
    clocks: list[list[object]] = [[] for _ in tpa]
    for t, value in entity.clock:
        i = bisect.bisect_left(times, t)
        best = min((j for j in (i - 1, i) if 0 <= j < len(times)), key=lambda j: abs(times[j] - t))
        if abs(times[best] - t) <= tolerance_ns:
            clocks[best].append(value)
    max_clock = entity.max_clock[-1][1] if entity.max_clock else None
    out = []
    for (t, tpa_value), raw_clocks in zip(tpa, clocks):
        valid = [v for v in (clean_clock(c)[0] for c in raw_clocks) if v is not None]
        if valid:
            clock, count = sum(valid) / len(valid), len(valid)
        else:  # keep the raw reading (blank, 0, NaN) so the ofu processor names the reason
            clock, count = (raw_clocks[0] if raw_clocks else None), 0
        fields = {dcgm_fields.PIPE_TENSOR_ACTIVE: tpa_value, dcgm_fields.SM_CLOCK: clock,
                  dcgm_fields.MAX_SM_CLOCK: max_clock}
        out.append(dcgm_fields.sample_from_fields(
            fields, time_unix_nano=t, window_s=window_s, host=entity.host, gpu_index=entity.gpu_index,
            uuid=entity.uuid, model=entity.model, source=SOURCE, sm_clock_samples=count, job_id=entity.job_id,
            resource=dict(entity.resource)))
    return out


def _take_inputs(rm: ResourceMetrics, joiner: _Joiner, keep_rest: bool) -> bool:
    """Feed rm's input points to the joiner; with keep_rest, delete them from rm in place.

    Returns whether anything is left in rm to pass through.
    """
    resource: _Resource | None = None
    for s_index in range(len(rm.scope_metrics) - 1, -1, -1):
        metrics = rm.scope_metrics[s_index].metrics
        for m_index in range(len(metrics) - 1, -1, -1):
            metric = metrics[m_index]
            name = metric.name
            if name not in INPUT_METRICS:
                continue
            kind_of_data = metric.WhichOneof("data")
            if kind_of_data not in ("gauge", "sum"):
                continue
            if resource is None:
                resource = _Resource(rm)
            points = getattr(metric, kind_of_data).data_points
            if name in _PROMETHEUS_INPUTS:
                kind = _PROMETHEUS_INPUTS[name]
                for dp in points:
                    if not dp.flags & _FLAG_NO_RECORDED_VALUE:
                        joiner.prometheus_point(resource, dp, kind, metric.unit)
                if keep_rest:
                    del metrics[m_index]
                continue
            kind = _DCGMRECEIVER_INPUTS[name]
            other_pipes = []
            for p_index, dp in enumerate(points):
                if kind == TPA:
                    pipe = next((kv.value.string_value for kv in dp.attributes if kv.key == DCGMRECEIVER_PIPE_ATTR), "")
                    if pipe != "tensor":
                        other_pipes.append(p_index)  # fp64/fp32/fp16 pipes are not ours: pass them on
                        continue
                if not dp.flags & _FLAG_NO_RECORDED_VALUE:
                    joiner.dcgmreceiver_point(resource, dp, kind, metric.unit)
            if keep_rest:
                if other_pipes:
                    keep = set(other_pipes)
                    for p_index in range(len(points) - 1, -1, -1):
                        if p_index not in keep:
                            del points[p_index]
                else:
                    del metrics[m_index]
        if keep_rest and not metrics:
            del rm.scope_metrics[s_index]
    return len(rm.scope_metrics) > 0


def split_request(request: ExportMetricsServiceRequest, *, window_s: float = 30.0, tolerance_s: float = 5.0,
                  passthrough: bool = True) -> tuple[list[GpuSample], list[ResourceMetrics]]:
    """GPU samples joined from a request's TPA/clock points, and what remains to pass through.

    The request is consumed: its input metrics are deleted in place and the remaining
    ResourceMetrics are returned as they are (not copied). With ``passthrough=False`` the
    request is left alone and the second list is empty. ``window_s`` is the TPA averaging
    window the source used (dcgm-exporter's collect interval), recorded on each sample.
    """
    joiner = _Joiner()
    rest: list[ResourceMetrics] = []
    for rm in request.resource_metrics:
        if passthrough:
            if _take_inputs(rm, joiner, keep_rest=True):
                rest.append(rm)
        else:
            _take_inputs(rm, joiner, keep_rest=False)
    tolerance_ns = int(tolerance_s * 1e9)
    samples = [s for entity in joiner.entities.values() if entity is not None
               for s in _samples(entity, window_s, tolerance_ns)]
    return samples, rest


def split_bytes(body: bytes, **kwargs: Any) -> tuple[list[GpuSample], list[ResourceMetrics]]:
    """:func:`split_request` on a serialized ExportMetricsServiceRequest (raises DecodeError)."""
    return split_request(ExportMetricsServiceRequest.FromString(body), **kwargs)
