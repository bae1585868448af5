"""Metric points -> the SDK's MetricsData -> a serialized OTLP request, via the SDK's encoder.

Points keep their own timestamps and resources, so the SDK's data classes are built
directly (no instruments, no aggregation). All metrics of one resource go into ONE
ResourceMetrics: ``encode_metrics`` keys its output by Resource, and a second entry with an
equal resource would replace the first one's metrics (REFERENCE.md section 8).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics as PbResourceMetrics
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_ofu import __version__, otlp
from otel_ofu.metrics import METRICS
from otel_ofu.model import Attributes, Event, MetricPoint


def to_metrics_data(points: Iterable[MetricPoint]) -> MetricsData:
    """One ResourceMetrics per distinct resource, one Metric per name within it."""
    by_resource: dict[Attributes, dict[str, list[MetricPoint]]] = {}
    for point in points:
        by_resource.setdefault(point.resource, {}).setdefault(point.name, []).append(point)
    scope = InstrumentationScope(otlp.SCOPE_NAME, __version__)
    resource_metrics = []
    for resource, by_name in by_resource.items():
        metrics = [_metric(name, pts) for name, pts in by_name.items()]
        resource_metrics.append(ResourceMetrics(Resource(dict(resource)), [ScopeMetrics(scope, metrics, "")], ""))
    return MetricsData(resource_metrics)


def _metric(name: str, points: list[MetricPoint]) -> Metric:
    info = METRICS.get(name)
    data_points = [NumberDataPoint(attributes=dict(p.attributes), start_time_unix_nano=p.start_time_unix_nano,
                                   time_unix_nano=p.time_unix_nano, value=float(p.value)) for p in points]
    data: Gauge | Sum
    if points[0].monotonic:
        data = Sum(data_points, AggregationTemporality.CUMULATIVE, True)
    else:
        data = Gauge(data_points)
    return Metric(name, info.description if info else "", info.unit if info else points[0].unit, data)


def metrics_payload(points: Sequence[MetricPoint], passthrough: Iterable[object] = ()) -> tuple[bytes, int] | None:
    """A serialized ExportMetricsServiceRequest and its data point count; None when empty.

    Pass-through ResourceMetrics (OTLP a receiver forwards untouched) are appended as they are.
    """
    forwarded = [r for r in passthrough if isinstance(r, PbResourceMetrics)]
    if not points and not forwarded:
        return None
    request = encode_metrics(to_metrics_data(points))
    request.resource_metrics.extend(forwarded)
    return request.SerializeToString(), len(points) + sum(count_data_points(r) for r in forwarded)


def logs_payload(events: Sequence[Event]) -> tuple[bytes, int] | None:
    """Events as a serialized ExportLogsServiceRequest (see :func:`otel_ofu.otlp.events_to_request`)."""
    if not events:
        return None
    return otlp.events_to_request(events).SerializeToString(), len(events)


def count_data_points(resource_metrics: PbResourceMetrics) -> int:
    count = 0
    for scope_metrics in resource_metrics.scope_metrics:
        for metric in scope_metrics.metrics:
            kind = metric.WhichOneof("data")
            if kind:
                count += len(getattr(metric, kind).data_points)
    return count
