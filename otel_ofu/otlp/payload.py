"""What the otlp/otlphttp exporters send: points and pass-through metrics as one serialized request.

Points are encoded by :func:`otel_ofu.otlp.encode_request`, the project's one points -> OTLP
encoder (all metrics of one resource in ONE ResourceMetrics: the SDK encoder's trap of
REFERENCE.md section 8 cannot happen). Pass-through ResourceMetrics (OTLP a receiver forwards
untouched) are appended as serialized bytes: ``resource_metrics`` is a repeated field, and
repeated fields concatenate in the wire format, so the two byte strings together are one
valid request, with no per-point Python work for the pass-through.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics as PbResourceMetrics

from otel_ofu.core.model import Event, MetricPoint
from otel_ofu.otlp import codec as otlp


def metrics_payload(points: Sequence[MetricPoint], passthrough: Iterable[object] = ()) -> tuple[bytes, int] | None:
    """A serialized ExportMetricsServiceRequest and its data point count; None when empty.

    Pass-through ResourceMetrics are appended as they are (after the points' own).
    """
    forwarded = otlp.forwarded_resource_metrics(passthrough)
    if not points and not forwarded:
        return None
    body = otlp.encode_request(points)
    if forwarded:
        body = b"".join([body, *(wire for wire, _ in forwarded)])
    return body, len(points) + sum(count for _, count in forwarded)


def logs_payload(events: Sequence[Event]) -> tuple[bytes, int] | None:
    """Events as a serialized ExportLogsServiceRequest (see :func:`otel_ofu.otlp.events_to_request`)."""
    if not events:
        return None
    return otlp.events_to_request(events).SerializeToString(), len(events)


def count_data_points(resource_metrics: PbResourceMetrics) -> int:
    """Gauge, sum, histogram and summary data points of one ResourceMetrics."""
    return otlp.count_data_points(resource_metrics)
