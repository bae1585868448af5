"""What the otlp/otlphttp exporters send: points and pass-through metrics as one serialized request.

Points are encoded by :func:`otel_ofu.otlp.codec.request_fields`, the project's one points -> OTLP
encoder (all metrics of one resource in ONE ResourceMetrics: the SDK encoder's trap of
REFERENCE.md section 8 cannot happen). Pass-through ResourceMetrics (OTLP a receiver forwards
untouched) are appended as serialized bytes: ``resource_metrics`` is a repeated field, and
repeated fields concatenate in the wire format, so the two byte strings together are one
valid request, with no per-point Python work for the pass-through.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics as PbResourceMetrics

from otel_ofu.core.model import Event, MetricPoint, PointRow
from otel_ofu.otlp import codec as otlp


def metrics_payload(points: Sequence[MetricPoint | PointRow], passthrough: Iterable[object] = ()
                    ) -> tuple[bytes, int] | None:
    """A serialized ExportMetricsServiceRequest and its data point count; None when empty.

    ``points`` may hold PointRows (``Batch.points_and_rows()``), written without making their points.
    Pass-through ResourceMetrics are appended as they are (after the points' own).
    """
    forwarded = otlp.forwarded_resource_metrics(passthrough)
    if not points and not forwarded:
        return None
    fields = otlp.request_fields(points)
    fields += [wire for wire, _ in forwarded]
    body = b"".join(fields)  # one copy of every part
    count = sum([len(item.values) if type(item) is PointRow else 1 for item in points])  # type: ignore[union-attr]
    return body, count + sum(count for _, count in forwarded)


def logs_payload(events: Sequence[Event]) -> tuple[bytes, int] | None:
    """Events as a serialized ExportLogsServiceRequest (see :func:`otel_ofu.otlp.events_to_request`)."""
    if not events:
        return None
    return otlp.events_to_request(events).SerializeToString(), len(events)


def count_data_points(resource_metrics: PbResourceMetrics) -> int:
    """Gauge, sum, histogram and summary data points of one ResourceMetrics."""
    return otlp.count_data_points(resource_metrics)


def split_payload(signal: str, payload: bytes) -> list[tuple[bytes, int]]:
    """A serialized request the backend refused as too large, as two requests of about half each.

    Split at the outermost level that has two or more entries: resources, then metrics (or log
    records) of one resource, then data points of one metric. Returns [] when the request holds
    a single data point or log record, which cannot be split.
    """
    if signal == "logs":
        return _split_logs(payload)
    return _split_metrics(payload)


def _halves(items: list) -> tuple[list, list]:
    middle = len(items) // 2
    return items[:middle], items[middle:]


def _split_by_resource_or_item(request: Any, resources: str, scopes: str, items: str) -> list[Any]:
    """Two halves of an export request: of its resources, else of its one resource's items (metrics,
    log records) with their scopes; [] when it holds one item or none. ``resources``, ``scopes`` and
    ``items`` name the signal's repeated fields (resource_metrics, scope_metrics, metrics)."""
    cls = type(request)
    listed = list(getattr(request, resources))
    if len(listed) >= 2:
        return [cls(**{resources: half}) for half in _halves(listed)]
    if not listed:
        return []
    resource = listed[0]
    pairs = [(scope, item) for scope in getattr(resource, scopes) for item in getattr(scope, items)]
    if len(pairs) < 2:
        return []
    parts = []
    for half in _halves(pairs):
        part = cls()
        out = getattr(part, resources).add(resource=resource.resource, schema_url=resource.schema_url)
        targets: dict[int, Any] = {}
        for scope, item in half:
            target = targets.get(id(scope))
            if target is None:
                target = targets[id(scope)] = getattr(out, scopes).add(scope=scope.scope, schema_url=scope.schema_url)
            getattr(target, items).append(item)
        parts.append(part)
    return parts


def _split_metrics(payload: bytes) -> list[tuple[bytes, int]]:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    request = ExportMetricsServiceRequest.FromString(payload)
    parts = _split_by_resource_or_item(request, "resource_metrics", "scope_metrics", "metrics")
    metrics = [(sm, m) for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    if not parts and len(metrics) == 1:  # one metric: halves of its data points
        rm = request.resource_metrics[0]
        sm, metric = metrics[0]
        kind = metric.WhichOneof("data")
        points = list(getattr(metric, kind).data_points) if kind else []
        if len(points) >= 2:
            for half in _halves(points):
                part = ExportMetricsServiceRequest()
                out = part.resource_metrics.add(resource=rm.resource, schema_url=rm.schema_url)
                piece = out.scope_metrics.add(scope=sm.scope, schema_url=sm.schema_url).metrics.add()
                piece.CopyFrom(metric)
                data = getattr(piece, kind)
                del data.data_points[:]
                data.data_points.extend(half)
                parts.append(part)
    return [(p.SerializeToString(), sum(count_data_points(rm) for rm in p.resource_metrics)) for p in parts]


def _split_logs(payload: bytes) -> list[tuple[bytes, int]]:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    request = ExportLogsServiceRequest.FromString(payload)
    parts = _split_by_resource_or_item(request, "resource_logs", "scope_logs", "log_records")
    return [(p.SerializeToString(), sum(len(sl.log_records) for rl in p.resource_logs for sl in rl.scope_logs))
            for p in parts]
