"""The ``prometheus`` receiver: scrapes a training job's own ``/metrics`` page for what the job
reports about itself (its MFU, TFLOP/s per GPU), as points for the MFU audit (docs/audit.md).

For jobs that already serve Prometheus text (a framework's exporter, the OpenTelemetry
Prometheus exporter) instead of pushing OTLP. Only the metrics listed in ``metrics`` are read
(Prometheus name -> otel-ofu name); gauges and untyped samples, NaN left out as no value.

The reporting process's identity (which the ``attribution`` processor maps to its job, as for
OTLP reports) comes from, later ones winning: the page's ``target_info`` (the OpenTelemetry
Prometheus exporter writes the resource there, dots as underscores), identity labels on the
sample itself, and the ``resource`` setting. Identity labels are the resource attributes that
name a job or a process (``k8s_pod_name``, ``k8s_namespace_name``, ``slurm_job_id``,
``host_name``, ``process_pid``, ``ofu_job_id``, ...); a sample's other labels stay point
attributes (a ``rank`` label keeps the ranks' series apart). Scraping is the ``dcgm_exporter``
receiver's (otel_ofu.scrape): same auth, TLS, timeouts and failure telemetry.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.core.metrics import METRICS, MFU_REPORT_METRIC, TFLOPS_REPORT_METRICS
from otel_ofu.core.model import Batch, MetricPoint, attrs
from otel_ofu.pipeline.component import Context, Factory, PollingReceiver
from otel_ofu.pipeline.config import Duration, require
from otel_ofu.scrape.client import (
    BasicAuthSettings,
    ScrapePool,
    TlsSettings,
    parse_text,
    scrape_timeout,
    target_urls,
    validate_settings,
)

SOURCE = "prometheus"
TARGET_INFO = "target_info"

# Prometheus label (the resource attribute with dots as underscores) -> the attribute.
IDENTITY_LABELS = {
    "k8s_pod_name": "k8s.pod.name",
    "k8s_namespace_name": "k8s.namespace.name",
    "k8s_pod_uid": "k8s.pod.uid",
    "k8s_node_name": "k8s.node.name",
    "k8s_container_name": "k8s.container.name",
    "slurm_job_id": "slurm.job.id",
    "slurm_job_name": "slurm.job.name",
    "host_name": "host.name",
    "process_pid": "process.pid",
    "service_name": "service.name",
    "service_instance_id": "service.instance.id",
    "ofu_job_id": "ofu.job.id",
    "nemo_run_id": "nemo.run.id",
}


# --- OpenTelemetry names as Prometheus pages write them ------------------------------------------
#
# Three translators write an OpenTelemetry gauge into Prometheus, each its own way:
# - OpenTelemetry Python's Prometheus exporter (opentelemetry-exporter-prometheus, _mapping.py):
#   invalid characters -> "_", then the unit with its {annotations} removed, "/" as "_per_"
#   (T{flop}/s -> _T_per_second), unit 1 -> no suffix;
# - Prometheus 3's OTLP receiver and the Collector's prometheus exporter (prometheus/otlptranslator,
#   metric_namer.go): a main unit holding {} is dropped whole (T{flop}/s -> _per_second), a
#   gauge of unit 1 gets _ratio; escaped to underscores, or kept UTF-8 (dots) under
#   NoUTF8EscapingWithSuffixes, or without any suffix (UnderscoreEscapingWithoutSuffixes,
#   NoTranslation).
# Every one of them is accepted for the report metrics, since a job may sit behind any.

_INVALID = re.compile(r"[^a-zA-Z0-9:]+")
_ANNOTATION = re.compile(r"{.*}")
_UNITS = {"d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds", "us": "microseconds",
          "ns": "nanoseconds", "By": "bytes", "W": "watts", "J": "joules", "Hz": "hertz", "%": "percent", "1": ""}
_PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}


def _escaped(text: str) -> str:
    return _INVALID.sub("_", text).strip("_")


def _python_unit(unit: str) -> str:
    """The unit suffix OpenTelemetry Python's Prometheus exporter writes (its map_unit)."""
    unit = _ANNOTATION.sub("", unit)
    if unit in _UNITS:
        return _UNITS[unit]
    top, slash, bottom = unit.partition("/")
    if slash and _escaped(bottom):
        top = _UNITS.get(_escaped(top), _escaped(top))
        bottom = _PER_UNITS.get(_escaped(bottom), _escaped(bottom))
        return f"{top}_per_{bottom}" if top else f"per_{bottom}"
    return _escaped(unit)


def _otlp_unit(unit: str) -> str:
    """The unit suffix Prometheus' OTLP translation writes for a gauge (otlptranslator)."""
    if unit == "1":
        return "ratio"
    main, _, per = unit.partition("/")
    main = "" if not main.strip() or "{" in main or "}" in main else _UNITS.get(main.strip(), main.strip())
    per = "" if not per.strip() or "{" in per or "}" in per else "per_" + _PER_UNITS.get(per.strip(), per.strip())
    return "_".join(part for part in (_escaped(main), _escaped(per)) if part)


def prometheus_names(name: str, unit: str) -> set[str]:
    """Every name a Prometheus page may carry for OpenTelemetry gauge ``name`` of unit ``unit``."""
    escaped, python, otlp = _escaped(name), _python_unit(unit), _otlp_unit(unit)
    names = {escaped, name}  # no suffixes: escaped, or UTF-8 as the name is (NoTranslation)
    if python:
        names.add(f"{escaped}_{python}")
    if otlp:
        names |= {f"{escaped}_{otlp}", f"{name}_{otlp}"}  # UTF-8 names keep their dots (NoUTF8Escaping...)
    return names


def _default_metrics() -> dict[str, str]:
    """The report metrics under every name a Prometheus translator gives them (see above)."""
    out: dict[str, str] = {}
    for name in (MFU_REPORT_METRIC, *TFLOPS_REPORT_METRICS):
        info = METRICS.get(name)
        units = {info.unit if info else ""}
        if name == MFU_REPORT_METRIC:  # a fraction: {ratio} now, 1 by convention and in older reporters
            units.add("1")
        for unit in sorted(units):
            out.update(dict.fromkeys(sorted(prometheus_names(name, unit)), name))
    return out


@dataclass
class PrometheusReceiverConfig:
    # The job's metrics page, e.g. http://trainer-0:8000/metrics ("host:port" means
    # http://host:port/metrics). Set exactly one of endpoint and endpoints.
    endpoint: str = ""
    endpoints: list[str] = field(default_factory=list)  # several pages, scraped in parallel (8 at a time)
    collection_interval: Duration = field(default_factory=lambda: Duration(30))  # how often to scrape
    # Limit for one whole scrape (connect, headers and body), at most collection_interval;
    # unset: 10s, or collection_interval when shorter.
    scrape_timeout: Duration | None = None
    tls: TlsSettings = field(default_factory=TlsSettings)
    basic_auth: BasicAuthSettings = field(default_factory=BasicAuthSettings)
    bearer_token: str = field(default="", repr=False)  # sent as Authorization: Bearer <token>
    # A file holding the token, read at every scrape (a rotated Kubernetes token is picked up).
    bearer_token_file: str = ""
    # Prometheus metric name -> the name otel-ofu reads it as; nothing else on the page is kept.
    # Default: training.mfu, training.tflops_per_gpu and megatron.training.throughput_tflops under
    # every name OpenTelemetry's Python exporter, the Collector's prometheus exporter and Prometheus
    # 3's OTLP translation write (training_mfu, training_mfu_ratio, training_tflops_per_gpu_T_per_second,
    # training_tflops_per_gpu_per_second, ...).
    metrics: dict[str, str] = field(default_factory=_default_metrics)
    # Resource attributes of every point scraped here (e.g. k8s.pod.name and k8s.namespace.name of
    # the pod the page belongs to), over what the page itself says.
    resource: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        validate_settings(self)
        require(bool(self.metrics), "metrics", "list at least one metric to read")
        for name, target in self.metrics.items():
            require(bool(name) and bool(target), f"metrics.{name}", "map a Prometheus name to a metric name")

    def timeout(self) -> float:
        return scrape_timeout(self)

    def urls(self) -> list[str]:
        return target_urls(self)


def _identity(labels: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(identity attributes, other labels) of one label set."""
    identity: dict[str, Any] = {}
    rest: dict[str, str] = {}
    for label, value in labels.items():
        attribute = IDENTITY_LABELS.get(label)
        if attribute is None:
            rest[label] = value
        elif value != "":
            identity[attribute] = int(value) if attribute == "process.pid" and value.isdecimal() else value
    return identity, rest


def parse_reports(text: str, *, metrics: dict[str, str], time_unix_nano: int,
                  resource: dict[str, str] | None = None) -> list[MetricPoint]:
    """Points of the listed metrics on one page; raises ValueError when the text is not Prometheus."""
    wanted: list[tuple[str, dict[str, str], float]] = []
    page_identity: dict[str, Any] = {}
    for family in parse_text(text):
        for sample in family.samples:
            if sample.name == TARGET_INFO:
                page_identity.update(_identity(sample.labels)[0])
            elif sample.name in metrics and family.type in ("gauge", "unknown", "untyped"):
                wanted.append((sample.name, sample.labels, float(sample.value)))
    out = []
    for name, labels, value in wanted:
        if math.isnan(value):
            continue  # no value, never 0
        identity, rest = _identity(labels)
        target = metrics[name]
        info = METRICS.get(target)
        out.append(MetricPoint(target, value, time_unix_nano, attrs({**page_identity, **identity, **(resource or {})}),
                               attrs(rest), info.unit if info else ""))
    return out


class PrometheusReceiver(PollingReceiver):
    def __init__(self, config: PrometheusReceiverConfig, context: Context, consumer):
        super().__init__(config, context, consumer)
        self.urls = config.urls()
        self.pool = ScrapePool(config, context, self.log, "points")
        self._poll_started = 0.0

    def interval(self) -> float:
        elapsed = time.monotonic() - self._poll_started if self._poll_started else 0.0
        return max(0.0, float(self.config.collection_interval) - elapsed)

    def on_start(self) -> None:
        self.log.info("scraping %d endpoint(s) every %gs for %s: %s", len(self.urls),
                      float(self.config.collection_interval), ", ".join(sorted(set(self.config.metrics.values()))),
                      ", ".join(self.urls))

    def poll(self) -> Batch | None:
        self._poll_started = time.monotonic()
        points = self.pool.scrape(self._parse)
        return Batch(points=points) if points else None

    def _parse(self, url: str, text: str, time_unix_nano: int) -> list[MetricPoint]:
        return parse_reports(text, metrics=self.config.metrics, time_unix_nano=time_unix_nano,
                             resource=self.config.resource)

    def on_stop(self) -> None:
        self.pool.close()

    def shutdown(self) -> None:
        super().shutdown()
        self.pool.close()


FACTORY = Factory("prometheus", PrometheusReceiverConfig, PrometheusReceiver,
                  "scrapes a training job's own /metrics page for the MFU or TFLOP/s it reports")
