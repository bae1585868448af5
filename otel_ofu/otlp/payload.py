"""What the otlp/otlphttp exporters send: points and pass-through metrics as one serialized request.

Points are encoded by :func:`otel_ofu.otlp.codec.request_fields`, the project's one points -> OTLP
encoder (all metrics of one resource in ONE ResourceMetrics: the SDK encoder's trap of
REFERENCE.md section 8 cannot happen). Pass-through ResourceMetrics (OTLP a receiver forwards
untouched) are appended as serialized bytes: ``resource_metrics`` is a repeated field, and
repeated fields concatenate in the wire format, so the two byte strings together are one
valid request, with no per-point Python work for the pass-through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics as PbResourceMetrics

from otel_ofu.core.model import Event, MetricPoint, PointRow
from otel_ofu.delivery.retry import SampleRefusal
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


def _data_points(metric: Any) -> Any:
    kind = metric.WhichOneof("data")
    return getattr(metric, kind).data_points if kind else ()


def _partition_metrics(request: Any, chosen: Callable[[Any], bool]) -> list[tuple[bytes, int]]:
    """The request's data points in two requests, those ``chosen`` and the rest, each keeping its resource,
    scope and metric; [] when either would be empty."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    parts = (ExportMetricsServiceRequest(), ExportMetricsServiceRequest())
    counts = [0, 0]
    for rm in request.resource_metrics:
        targets: list[Any] = [None, None]
        for sm in rm.scope_metrics:
            scopes: list[Any] = [None, None]
            for metric in sm.metrics:
                pieces: list[Any] = [None, None]
                for point in _data_points(metric):
                    side = 0 if chosen(point) else 1
                    if pieces[side] is None:
                        if scopes[side] is None:
                            if targets[side] is None:
                                targets[side] = parts[side].resource_metrics.add(resource=rm.resource,
                                                                                 schema_url=rm.schema_url)
                            scopes[side] = targets[side].scope_metrics.add(scope=sm.scope, schema_url=sm.schema_url)
                        piece = scopes[side].metrics.add()
                        piece.CopyFrom(metric)
                        del getattr(piece, metric.WhichOneof("data")).data_points[:]
                        pieces[side] = piece
                    _data_points(pieces[side]).append(point)
                    counts[side] += 1
    if not counts[0] or not counts[1]:
        return []
    return [(part.SerializeToString(), count) for part, count in zip(parts, counts)]


def split_refused(signal: str, payload: bytes, refusal: SampleRefusal) -> list[tuple[bytes, int]]:
    """A request the backend refused for some of its samples, as two requests that set them apart.

    Refused for their age alone (Prometheus' ``too old sample``, ``out of bounds``): every sample
    of one time shares its fate, so the request splits by time, the older half of its times
    apart; a request of one time cannot be split ([]). A duplicate that names its timestamp: the
    samples at that millisecond apart from the rest. Otherwise two halves (:func:`split_payload`).
    Each part the backend refuses again is split again, down to the samples themselves.
    """
    if signal != "metrics":
        return split_payload(signal, payload)
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    request = ExportMetricsServiceRequest.FromString(payload)
    if refusal.by_time:
        times = sorted({p.time_unix_nano for rm in request.resource_metrics for sm in rm.scope_metrics
                        for m in sm.metrics for p in _data_points(m)})
        if len(times) < 2:
            return []
        newer = times[len(times) // 2]
        return _partition_metrics(request, lambda point: point.time_unix_nano < newer)
    if refusal.timestamps_ms:
        named = refusal.timestamps_ms
        parts = _partition_metrics(request, lambda point: point.time_unix_nano // 1_000_000 in named)
        if parts:
            return parts
    return split_payload(signal, payload)


def describe_series(signal: str, payload: bytes, limit: int = 5) -> list[tuple[str, str]]:
    """The series of a request's data points, for a log line: (``name{resource and point attributes}``,
    ``time = value``) for the first ``limit`` (a logs request: its records by event name and resource)."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    def labels(*attribute_lists: Any) -> str:
        return ", ".join(f"{a.key}={otlp.from_any_value(a.value)}"
                         for attributes in attribute_lists for a in attributes)

    out: list[tuple[str, str]] = []
    if signal == "logs":
        logs = ExportLogsServiceRequest.FromString(payload)
        for rl in logs.resource_logs:
            for sl in rl.scope_logs:
                for record in sl.log_records:
                    out.append((f"{record.event_name or 'log record'}{{{labels(rl.resource.attributes)}}}",
                                _when(record.time_unix_nano)))
                    if len(out) >= limit:
                        return out
        return out
    request = ExportMetricsServiceRequest.FromString(payload)
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in _data_points(metric):
                    value = f" = {point.as_double!r}" if point.HasField("as_double") else ""
                    out.append((f"{metric.name}{{{labels(rm.resource.attributes, point.attributes)}}}",
                                f"{_when(point.time_unix_nano)}{value}"))
                    if len(out) >= limit:
                        return out
    return out


def _when(unix_nano: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(unix_nano / 1e9, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
