"""The ``prometheus`` exporter: a pull endpoint serving each series' latest point.

Names and labels are converted as the Collector's prometheus exporter converts them
(:func:`prometheus_name`, :func:`label_name`): ``gpu.sm.clock.frequency`` (Hz) becomes
``gpu_sm_clock_frequency_hertz``, monotonic sums get ``_total``, resource attributes become
labels (``resource_to_telemetry_conversion``, on by default here because every GPU is its
own resource: without it the series of two GPUs would collide). One deviation: a unit of
``1`` adds no ``_ratio`` unless ``ratio_suffix`` (otel-ofu's own ratios are declared ``{ratio}``
and get none on any road: ``gpu_ofu``).

A series not updated for ``metric_expiration`` (default 5m, as in the Collector) is dropped,
so a finished job's series disappear and Prometheus marks them stale at the next scrape. A
GPU's job identity (``ofu.job.id``, ``ofu.precision``) and its pod are on its resource: when a
GPU's points arrive under a new resource (another job, pod or container: the same GPU by
:func:`~otel_ofu.core.model.gpu_key`), the series of its previous one are dropped at once (a GPU
holds one job at a time; summing by job must not count it twice for 5 minutes). Likewise a
metric whose points at one time are a resource's whole set (``MetricInfo.whole_set``: a GPU
window's ``gpu.ofu.loss`` parts, a job's ``job.ofu.loss``) replaces that resource's previous set
at once: a part or cause that is not in the newer window (the clock's cause changed, DRAM crossed
the memory-bound threshold, SM activity went blank and two parts merged) is no longer served, so
the served parts still add up to 1 - OFU. ``job_labels``
keeps the job identity as labels also with ``resource_to_telemetry_conversion`` off.
Points are served without timestamps by default (``send_timestamps``): a point's time is
when its counter window ended, which under the simulator's time acceleration or a replay is
not "now"; Prometheus would drop such samples as out of bounds or place them outside the
query lookback. Served bare, each scrape is stamped with the scrape time.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.core.metrics import METRICS
from otel_ofu.core.model import (
    JOB_ID,
    JOB_KIND,
    JOB_RUN,
    PRECISION,
    Attributes,
    Batch,
    GpuKey,
    MetricPoint,
    gpu_key,
    names_a_gpu,
)
from otel_ofu.pipeline.component import Context, Exporter, Factory
from otel_ofu.pipeline.config import Duration, invalid, require
from otel_ofu.pipeline.endpoints import ServerTlsConfig, check_listen, is_loopback, listen_error, parse_endpoint

DEFAULT_ENDPOINT = "127.0.0.1:9464"  # the OpenTelemetry SDKs' Prometheus exporter port
EXPIRE_EVERY_S = 60.0  # exports also expire old series at most this often (scrapes always do)
WARNED_SIZE = 1024  # distinct warnings remembered (then it starts over)

# The Collector's unit translation (pkg/translator/prometheus).
UNIT_WORDS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds", "us": "microseconds",
    "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes",
    "TiBy": "tebibytes", "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes", "TBy": "terabytes",
    "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts", "g": "grams", "Cel": "celsius",
    "Hz": "hertz", "1": "", "%": "percent",
}
PER_UNIT_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}

_INVALID_NAME = re.compile(r"[^a-zA-Z0-9_:]+")
_NAME_SEPARATORS = re.compile(r"[^a-zA-Z0-9:]+")  # name tokens: "_" separates too, as in the Collector
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]")


def _clean_unit(text: str) -> str:
    return _INVALID_NAME.sub("_", text).strip("_")


def unit_suffixes(unit: str) -> list[str]:
    """``"W"`` -> ``["watts"]``, ``"{flop}/s"`` -> ``["per", "second"]``, ``"{window}"`` -> ``[]``."""
    main, _, per = (unit or "").partition("/")
    out: list[str] = []
    main, per = main.strip(), per.strip()
    if main and "{" not in main:
        word = _clean_unit(UNIT_WORDS.get(main, main))
        if word:
            out.append(word)
    if per and "{" not in per:
        word = _clean_unit(PER_UNIT_WORDS.get(per, per))
        if word:
            out += ["per", word]
    return out


def prometheus_name(name: str, unit: str, *, counter: bool, namespace: str = "", add_suffixes: bool = True,
                    ratio_suffix: bool = False) -> str:
    """The Prometheus metric name for an OpenTelemetry one (without ``_total``, see below).

    A counter's samples are exposed with ``_total`` appended by the exposition format, so
    this returns the family name: an existing ``total`` token is removed.
    """
    tokens = [t for t in _NAME_SEPARATORS.split(name) if t]  # job.gpu_seconds (s): no second "seconds"
    if add_suffixes:
        for suffix in unit_suffixes(unit):
            if suffix not in tokens or suffix == "per":
                tokens.append(suffix)
        if ratio_suffix and unit == "1" and not counter:
            tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    if counter:
        tokens = [t for t in tokens if t != "total"]
    if namespace:
        tokens.insert(0, namespace)
    out = "_".join(tokens) or "_"
    return f"_{out}" if out[0].isdigit() else out


def label_name(key: str) -> str:
    """As the Collector's NormalizeLabel: invalid characters become ``_``; no leading digit or ``_``."""
    if not key:
        return key
    out = _INVALID_LABEL.sub("_", key)
    if out[0].isdigit():
        return "key_" + out
    if out.startswith("_") and not out.startswith("__"):
        return "key" + out
    return out


def label_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def to_labels(*attribute_sets: Iterable[tuple[str, Any]]) -> tuple[tuple[str, str], ...]:
    """Attribute sets (later ones win on equal keys) -> sorted Prometheus labels.

    Distinct keys that normalize to the same label name are joined with ``;`` in key order,
    as the Collector does.
    """
    merged: dict[str, Any] = {}
    for attributes in attribute_sets:
        merged.update(attributes)
    labels: dict[str, str] = {}
    for key in sorted(merged):
        name = label_name(key)
        value = label_value(merged[key])
        labels[name] = f"{labels[name]};{value}" if name in labels else value
    return tuple(sorted(labels.items()))


@dataclass
class ResourceToTelemetryConfig:
    """Resource attributes as labels, as in the Collector's prometheus exporter."""

    # On by default (the Collector: off), as every GPU is its own resource: without it two GPUs'
    # gpu_ofu series would have the same labels. Off: series get job and instance labels and the
    # other resource attributes go to a target_info series.
    enabled: bool = True


@dataclass
class PrometheusExporterConfig:
    # Listen address, host:port; /metrics is served there (9464: the OpenTelemetry SDKs'
    # Prometheus exporter port).
    endpoint: str = DEFAULT_ENDPOINT
    namespace: str = ""  # a prefix for every metric name
    const_labels: dict[str, str] = field(default_factory=dict)  # labels added to every series
    # Serve each point's own timestamp (off: each scrape is stamped with the scrape time, which is
    # what queries expect; see Timestamps below).
    send_timestamps: bool = False
    # A series not updated for this long is no longer served (Prometheus marks it stale).
    metric_expiration: Duration = field(default_factory=lambda: Duration(300))
    resource_to_telemetry_conversion: ResourceToTelemetryConfig = field(default_factory=ResourceToTelemetryConfig)
    add_metric_suffixes: bool = True  # the unit's suffix (_hertz, _watts, ...) and _total on counters
    ratio_suffix: bool = False  # also add _ratio to gauges of unit 1, as the Collector does
    # Also serve gauges and cumulative sums passed through from an otlp receiver (delta sums and
    # histograms are skipped, logged once).
    passthrough: bool = True
    # Resource attributes that are labels even with resource_to_telemetry_conversion off, so
    # gpu_ofu{ofu_job_id="..."} works either way: the job's identity (its id, run and kind: two
    # runs of one job are two jobs, whose series must not merge) and the precision.
    job_labels: list[str] = field(default_factory=lambda: [JOB_ID, JOB_RUN, JOB_KIND, PRECISION])
    tls: ServerTlsConfig = field(default_factory=ServerTlsConfig)

    def validate(self) -> None:
        try:
            parse_endpoint(self.endpoint)
        except ValueError as exc:
            invalid("endpoint", str(exc))
        require(self.metric_expiration > 0, "metric_expiration", "must be positive")
        require(not self.namespace or re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", self.namespace) is not None,
                "namespace", f"must be a valid Prometheus name prefix, got {self.namespace!r}")


@dataclass(slots=True)
class _Series:
    value: float
    time_unix_nano: int
    updated: float  # the exporter's clock when the point arrived


@dataclass(slots=True)
class _GpuResource:
    """One resource of a GPU (the GPU in one job and pod) and the series its points feed."""

    gpu: GpuKey
    series: set[tuple[str, tuple[tuple[str, str], ...]]] = field(default_factory=set)  # (family, labels)


@dataclass(slots=True)
class _SeriesSet:
    """The series of one resource's whole-set metric (MetricInfo.whole_set) at its newest time."""

    time_unix_nano: int
    labels: set[tuple[tuple[str, str], ...]] = field(default_factory=set)


@dataclass(slots=True)
class _Family:
    counter: bool
    help: str
    series: dict[tuple[tuple[str, str], ...], _Series] = field(default_factory=dict)


class PrometheusExporter(Exporter):
    def __init__(self, config: PrometheusExporterConfig, context: Context):
        super().__init__(config, context)
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self._targets: dict[tuple[tuple[str, str], ...], float] = {}  # target_info label sets
        self._warned: set[str] = set()
        # GPU -> (its current resource: its job and pod, time of its newest point); and what each
        # such resource is, so that a job or pod change drops the series of the previous one.
        self._gpu_jobs: dict[GpuKey, tuple[Attributes, int]] = {}
        self._series_of: dict[Attributes, _GpuResource] = {}
        # (family, resource) of a whole-set metric -> the series of its newest time: an older one's go
        self._sets: dict[tuple[str, Attributes], _SeriesSet] = {}
        self.clock: Callable[[], float] = time.monotonic  # a seam for expiration tests
        self._expired_at = -math.inf
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    # --- accepting points -----------------------------------------------------------------

    def export(self, batch: Batch) -> None:
        now = self.clock()
        with self._lock:
            for point in batch.points:
                self._put(point, now)
            if self.config.passthrough and batch.passthrough:
                for point in _passthrough_points(batch.passthrough, self._warn_once):
                    self._put(point, now)
            # Also without scrapes (Prometheus down for days): series of gone pods must not pile up.
            if now - self._expired_at >= min(EXPIRE_EVERY_S, float(self.config.metric_expiration)):
                self._expire_locked(now)

    def _put(self, point: MetricPoint, now: float) -> None:
        cfg = self.config
        info = METRICS.get(point.name)
        unit = info.unit if info else point.unit
        name = prometheus_name(point.name, unit, counter=point.monotonic, namespace=cfg.namespace,
                               add_suffixes=cfg.add_metric_suffixes, ratio_suffix=cfg.ratio_suffix)
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _Family(point.monotonic, info.description if info else point.name)
        elif family.counter != point.monotonic:
            self._warn_once(f"type:{name}", "metric %s is both a counter and a gauge; the %s points are dropped",
                            name, "counter" if point.monotonic else "gauge")
            return
        if cfg.resource_to_telemetry_conversion.enabled:
            labels = to_labels(point.resource, point.attributes, cfg.const_labels.items())
        else:
            resource = dict(point.resource)
            identity = _job_instance(resource)
            job = [(k, resource[k]) for k in cfg.job_labels if k in resource]
            labels = to_labels(job, point.attributes, identity.items(), cfg.const_labels.items())
            target = to_labels(identity.items(), ((k, v) for k, v in resource.items()
                                                  if k not in ("service.name", "service.namespace",
                                                               "service.instance.id")))
            self._targets[target] = now
        if not self._follow_job(point):
            return
        if info is not None and info.whole_set and not self._replace_set(name, family, point, labels):
            return
        current = family.series.get(labels)
        if current is None or point.time_unix_nano >= current.time_unix_nano:
            family.series[labels] = _Series(float(point.value), point.time_unix_nano, now)
            held = self._series_of.get(point.resource)
            if held is not None:
                held.series.add((name, labels))

    def _follow_job(self, point: MetricPoint) -> bool:
        """Track which resource (job, pod) each GPU holds; False for a point of one it has since left.

        When a GPU's points arrive under another resource, the series of its previous one are dropped.
        """
        resource = point.resource
        known = self._series_of.get(resource)
        if known is not None:
            gpu = known.gpu
            held, newest = self._gpu_jobs[gpu]
            if held == resource:
                self._gpu_jobs[gpu] = (resource, max(newest, point.time_unix_nano))
                return True
        elif not names_a_gpu(resource):
            return True  # a job's or a process's series: several live side by side
        else:
            gpu = gpu_key(resource)
        previous = self._gpu_jobs.get(gpu)
        if previous is not None and previous[0] != resource:
            if point.time_unix_nano < previous[1]:
                return False  # a late point of a job or pod this GPU no longer holds
            gone = self._series_of.pop(previous[0], None)
            for name, labels in gone.series if gone is not None else ():
                family = self._families.get(name)
                if family is not None:
                    family.series.pop(labels, None)
                    if not family.series:
                        del self._families[name]
        if previous is None or previous[0] != resource:
            self._series_of[resource] = _GpuResource(gpu)
        self._gpu_jobs[gpu] = (resource, max(point.time_unix_nano, previous[1] if previous else 0))
        return True

    def _replace_set(self, name: str, family: _Family, point: MetricPoint,
                     labels: tuple[tuple[str, str], ...]) -> bool:
        """A point of a whole-set metric: the first of a newer time drops the resource's series of the time
        before (the rest of the new set follows in the same batch); False for a point older than the set."""
        key = (name, point.resource)
        held = self._sets.get(key)
        t = point.time_unix_nano
        if held is not None and t == held.time_unix_nano:
            held.labels.add(labels)
            return True
        if held is not None and t < held.time_unix_nano:
            return False  # a late window's part: the set it belonged to was replaced
        if held is not None:
            for old in held.labels - {labels}:
                family.series.pop(old, None)
        self._sets[key] = _SeriesSet(t, {labels})
        return True

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            if len(self._warned) >= WARNED_SIZE:
                self._warned.clear()  # keys name senders' metrics: bounded, at worst warned again
            self._warned.add(key)
            self.log.warning(message, *args)

    # --- serving --------------------------------------------------------------------------

    def expire(self) -> None:
        """Drop series older than metric_expiration (done on every scrape, and every minute of exports)."""
        now = self.clock()
        with self._lock:
            self._expire_locked(now)

    def _expire_locked(self, now: float) -> None:
        self._expired_at = now
        limit = now - float(self.config.metric_expiration)
        for name in list(self._families):
            family = self._families[name]
            for labels in [k for k, s in family.series.items() if s.updated < limit]:
                del family.series[labels]
            if not family.series:
                del self._families[name]
        for labels in [k for k, t in self._targets.items() if t < limit]:
            del self._targets[labels]
        for key, series_set in list(self._sets.items()):
            family = self._families.get(key[0])
            if family is None or not any(labels in family.series for labels in series_set.labels):
                del self._sets[key]  # every series of the set expired (or went with its GPU's old job)
        for resource, held in list(self._series_of.items()):
            live = {(n, labels) for n, labels in held.series
                    if n in self._families and labels in self._families[n].series}
            if live:
                held.series = live
            else:  # every series of this GPU's job expired: forget the GPU
                del self._series_of[resource]
                if self._gpu_jobs.get(held.gpu, (None,))[0] == resource:
                    del self._gpu_jobs[held.gpu]

    def snapshot(self) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        """Prometheus name -> labels -> value, as the next scrape would serve (after expiry)."""
        self.expire()
        with self._lock:
            return {name: {labels: s.value for labels, s in family.series.items()}
                    for name, family in self._families.items()}

    def collect(self) -> Iterator[Any]:
        """prometheus_client's Collector protocol: one family per name, from our latest points."""
        from prometheus_client.metrics_core import Metric

        self.expire()
        with self._lock:
            families = [(name, family.counter, family.help, list(family.series.items()))
                        for name, family in self._families.items()]
            targets = list(self._targets)
        for name, counter, help_text, series in sorted(families):
            metric = Metric(name, help_text, "counter" if counter else "gauge")
            sample_name = f"{name}_total" if counter else name
            for labels, s in series:
                stamp = s.time_unix_nano / 1e9 if self.config.send_timestamps and s.time_unix_nano else None
                metric.add_sample(sample_name, dict(labels), s.value, stamp)
            yield metric
        if targets:
            info = Metric("target", "Target metadata (resource attributes)", "info")
            for labels in targets:
                info.add_sample("target_info", dict(labels), 1.0)
            yield info

    def start(self) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        host, port = parse_endpoint(self.config.endpoint)
        tls = self.config.tls
        kwargs: dict[str, Any] = {}
        if tls.enabled:
            kwargs = {"certfile": tls.cert_file, "keyfile": tls.key_file,
                      "client_cafile": tls.client_ca_file or None, "client_auth_required": bool(tls.client_ca_file)}
        try:  # the address first: prometheus_client's own error names neither it nor this exporter
            check_listen(host, port)
        except OSError as exc:
            raise listen_error(f"{self.context.component_id} exporter", self.config.endpoint, exc) from None
        self._server, self._thread = start_http_server(port, addr=host or "0.0.0.0", registry=registry, **kwargs)
        self.port = self._server.server_port
        if not is_loopback(host):
            self.log.warning("Prometheus endpoint %s is reachable from other hosts%s", self.config.endpoint,
                             "" if tls.enabled else " without TLS")
        self.log.info("serving Prometheus metrics on http%s://%s:%d/metrics", "s" if tls.enabled else "",
                      host or "0.0.0.0", self.port)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def _job_instance(resource: dict[str, Any]) -> dict[str, str]:
    """The Collector's job/instance labels from service.namespace/name and service.instance.id."""
    out = {}
    name = resource.get("service.name")
    if name:
        namespace = resource.get("service.namespace")
        out["job"] = f"{namespace}/{name}" if namespace else str(name)
    if resource.get("service.instance.id"):
        out["instance"] = str(resource["service.instance.id"])
    return out


def _passthrough_points(resource_metrics: Iterable[Any], warn: Callable[..., None]) -> Iterator[MetricPoint]:
    """Gauges and cumulative sums of passed-through OTLP ResourceMetrics as points."""
    from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_DELTA

    from otel_ofu.otlp.codec import attributes_of, passthrough_messages

    for rm in passthrough_messages(resource_metrics):
        resource = attributes_of(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind not in ("gauge", "sum"):
                    warn(f"kind:{metric.name}", "metric %s is a %s: not served (gauges and sums only)",
                         metric.name, kind)
                    continue
                data = getattr(metric, kind)
                if kind == "sum" and data.aggregation_temporality == AGGREGATION_TEMPORALITY_DELTA:
                    warn(f"delta:{metric.name}", "metric %s is a delta sum: not served (cumulative only)", metric.name)
                    continue
                monotonic = kind == "sum" and data.is_monotonic
                for dp in data.data_points:
                    if dp.flags & 1:  # no recorded value (a staleness marker)
                        continue
                    value = dp.as_double if dp.WhichOneof("value") == "as_double" else float(dp.as_int)
                    yield MetricPoint(metric.name, value, dp.time_unix_nano, resource, attributes_of(dp.attributes),
                                      metric.unit, monotonic, dp.start_time_unix_nano)


FACTORY = Factory("prometheus", PrometheusExporterConfig, PrometheusExporter,
                  "serves the latest points on a Prometheus /metrics endpoint")
