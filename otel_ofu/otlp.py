"""Metric points <-> OTLP protobuf messages and OTLP JSON.

One ``ExportMetricsServiceRequest`` per batch; points are grouped by resource (one
ResourceMetrics per distinct resource: a GPU, a job, otel-ofu itself) and by metric name
within the ``otel-ofu`` scope. Grouping by resource once, here, avoids the SDK encoder's
trap where equal resources replace each other (REFERENCE.md section 8).

The JSON form is the OTLP/JSON mapping the Collector's file exporter writes: one request
per line, lowerCamelCase keys, 64-bit integers as strings, enums as integers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_ofu import __version__
from otel_ofu.metrics import METRICS
from otel_ofu.model import Attributes, Event, MetricPoint

SCOPE_NAME = "otel-ofu"
CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE


def _any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def _key_values(attributes: Attributes) -> list[KeyValue]:
    return [KeyValue(key=k, value=_any_value(v)) for k, v in attributes]


def from_any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value"):
        return json_format.MessageToJson(getattr(value, kind), indent=None)
    return getattr(value, kind)


def attributes_of(key_values: Iterable[KeyValue]) -> Attributes:
    return tuple(sorted((kv.key, from_any_value(kv.value)) for kv in key_values))


def to_request(points: Iterable[MetricPoint]) -> ExportMetricsServiceRequest:
    """Build one export request; points of one resource and name share a Metric."""
    by_resource: dict[Attributes, dict[str, list[MetricPoint]]] = {}
    for point in points:
        by_resource.setdefault(point.resource, {}).setdefault(point.name, []).append(point)
    request = ExportMetricsServiceRequest()
    for resource, metrics in by_resource.items():
        rm = request.resource_metrics.add()
        rm.resource.attributes.extend(_key_values(resource))
        sm = rm.scope_metrics.add()
        sm.scope.name = SCOPE_NAME
        sm.scope.version = __version__
        for name, pts in metrics.items():
            info = METRICS.get(name)
            metric = sm.metrics.add(name=name, unit=info.unit if info else pts[0].unit,
                                    description=info.description if info else "")
            if pts[0].monotonic:
                metric.sum.aggregation_temporality = CUMULATIVE
                metric.sum.is_monotonic = True
                container = metric.sum.data_points
            else:
                container = metric.gauge.data_points
            for p in pts:
                dp = container.add(time_unix_nano=p.time_unix_nano, as_double=float(p.value))
                if p.start_time_unix_nano:
                    dp.start_time_unix_nano = p.start_time_unix_nano
                dp.attributes.extend(_key_values(p.attributes))
    return request


def from_request(request: ExportMetricsServiceRequest) -> Iterator[MetricPoint]:
    """Every gauge and sum data point of a request as a MetricPoint (histograms are skipped)."""
    for rm in request.resource_metrics:
        resource = attributes_of(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind not in ("gauge", "sum"):
                    continue
                data = getattr(metric, kind)
                monotonic = kind == "sum" and data.is_monotonic
                for dp in data.data_points:
                    value = dp.as_double if dp.WhichOneof("value") == "as_double" else float(dp.as_int)
                    yield MetricPoint(metric.name, value, dp.time_unix_nano, resource, attributes_of(dp.attributes),
                                      metric.unit or "1", monotonic, dp.start_time_unix_nano)


_SEVERITY = {"INFO": logs_pb2.SEVERITY_NUMBER_INFO, "WARN": logs_pb2.SEVERITY_NUMBER_WARN,
             "ERROR": logs_pb2.SEVERITY_NUMBER_ERROR}


def events_to_request(events: Iterable[Event]) -> ExportLogsServiceRequest:
    """Events as OTLP logs: ``event.name`` attribute, body text, one ResourceLogs per resource."""
    by_resource: dict[Attributes, list[Event]] = {}
    for event in events:
        by_resource.setdefault(event.resource, []).append(event)
    request = ExportLogsServiceRequest()
    for resource, items in by_resource.items():
        rl = request.resource_logs.add()
        rl.resource.attributes.extend(_key_values(resource))
        sl = rl.scope_logs.add()
        sl.scope.name = SCOPE_NAME
        sl.scope.version = __version__
        for event in items:
            record = sl.log_records.add(time_unix_nano=event.time_unix_nano,
                                        observed_time_unix_nano=event.time_unix_nano,
                                        severity_number=_SEVERITY.get(event.severity, logs_pb2.SEVERITY_NUMBER_INFO),
                                        severity_text=event.severity)
            record.body.string_value = event.body
            record.attributes.extend(_key_values((("event.name", event.name), *event.attributes)))
    return request


def events_from_request(request: ExportLogsServiceRequest) -> Iterator[Event]:
    for rl in request.resource_logs:
        resource = attributes_of(rl.resource.attributes)
        for sl in rl.scope_logs:
            for record in sl.log_records:
                attributes = dict(attributes_of(record.attributes))
                name = str(attributes.pop("event.name", ""))
                yield Event(name, record.time_unix_nano, resource, tuple(sorted(attributes.items())),
                            record.body.string_value, record.severity_text or "INFO")


def to_json_line(request: ExportMetricsServiceRequest | ExportLogsServiceRequest) -> str:
    """One request as a single line of OTLP JSON (no trailing newline)."""
    return json.dumps(json_format.MessageToDict(request, use_integers_for_enums=True), separators=(",", ":"))


def from_json_line(line: str) -> ExportMetricsServiceRequest | ExportLogsServiceRequest:
    """Parse one line of OTLP JSON (metrics or logs); raises ValueError with the parser's reason."""
    request: ExportMetricsServiceRequest | ExportLogsServiceRequest
    is_logs = line.lstrip().startswith('{"resourceLogs"')
    request = ExportLogsServiceRequest() if is_logs else ExportMetricsServiceRequest()
    try:
        json_format.Parse(line, request, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise ValueError(f"not an OTLP JSON request: {exc}") from None
    return request
