"""``otel-ofu doctor --backend URL``: does a Prometheus-compatible backend hold what the dashboards read?

After a few minutes of export, it asks the backend's HTTP API (Prometheus, Prometheus 3's OTLP
receiver, VictoriaMetrics, Mimir, Thanos: ``/api/v1/label/__name__/values`` and
``/api/v1/query``) for the names and labels otel-ofu's dashboards and rules read, and when they are
missing, recognises what arrived instead (OTLP names kept, unit suffixes dropped, resource
attributes left in ``target_info``, ``_ratio`` from unit ``1``) and says which setting to change.
docs/backends.md has the roads and their settings.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.cli.checks import FAIL, OK, SKIP, WARN, Check
from otel_ofu.core import metrics
from otel_ofu.exporters.prometheus import label_name, prometheus_name
from otel_ofu.pipeline.redact import redact_url, redact_urls

# What the dashboards and rules read (tests/test_backend_check.py holds this against
# deploy/grafana and deploy/prometheus).
GPU_METRIC = "gpu_ofu"
GPU_LABELS = ("hw_id", "host_name", "hw_model", "ofu_job_id", "ofu_precision")
SUFFIXED = "gpu_sm_clock_frequency_hertz"  # a unit suffix: gone with a "WithoutSuffixes" strategy
COUNTER = "gpu_ofu_dropped_total"  # _total: gone with a "WithoutSuffixes" strategy (only when windows dropped)
JOB_METRIC = "job_ofu"  # the jobs processor's
SELF_METRIC = "otel_ofu_receiver_accepted_total"  # self-telemetry, by service_instance_id
RULE = "cluster_namespace_model_precision:gpu_ofu:sum5m"
DOCS = "docs/backends.md"

NAMING_FIX = ("the backend must name OTLP metrics the Prometheus way, with unit suffixes: Prometheus 3: "
              "otlp.translation_strategy: UnderscoreEscapingWithSuffixes (the default); VictoriaMetrics: "
              "-opentelemetry.usePrometheusNaming; Collector prometheus/prometheusremotewrite exporters: "
              f"translation_strategy: UnderscoreEscapingWithSuffixes ({DOCS})")
PROMOTE_FIX = ("resource attributes must become labels: Prometheus 3: otlp.promote_all_resource_attributes: true; "
               "VictoriaMetrics: leave -opentelemetry.promoteAllResourceAttributes on (the default); Collector "
               f"exporters: resource_to_telemetry_conversion.enabled: true ({DOCS})")




@dataclass(frozen=True)
class Naming:
    """How one road names otel-ofu's metrics and attribute keys in the backend (docs/backends.md's table):
    the one place the report (``report --prometheus``) and this check learn a backend's names from."""

    key: str  # prometheus | without_suffixes | otlp
    description: str
    suffixes: bool = True  # unit suffixes and _total (UnderscoreEscapingWithSuffixes)
    escaped: bool = True  # dots become underscores; False: the OpenTelemetry names as they are (UTF-8)

    def metric(self, name: str) -> str:
        """The series name of a registered OpenTelemetry metric (``job.gpu_seconds`` -> ``job_gpu_seconds_total``)."""
        if not self.escaped:
            return name
        info = metrics.METRICS[name]
        counter = info.kind == "sum"
        out = prometheus_name(name, info.unit, counter=counter, add_suffixes=self.suffixes)
        return f"{out}_total" if counter and self.suffixes else out

    def label(self, key: str) -> str:
        """The label of an attribute key (``ofu.job.id`` -> ``ofu_job_id``)."""
        return label_name(key) if self.escaped else key

    def quoted(self, label: str) -> str:
        """A label name as PromQL takes it: quoted where it is not a classic name (Prometheus 3 and
        VictoriaMetrics read ``"ofu.job.id"`` in matchers and ``by (...)``)."""
        return label if label.replace("_", "a").isalnum() and not label[0].isdigit() else json.dumps(label)

    def selector(self, name: str, matchers: dict[str, str] | None = None) -> str:
        """A PromQL selector of metric ``name`` with ``{attribute key: value}`` equality matchers."""
        series = self.metric(name)
        parts = [f"{self.quoted(self.label(key))}={json.dumps(value)}" for key, value in (matchers or {}).items()]
        if self.escaped:
            return f"{series}{{{', '.join(parts)}}}" if parts else series
        return "{" + ", ".join([json.dumps(series), *parts]) + "}"


# The namings the roads give (docs/backends.md): every road with its documented settings gives the first;
# Prometheus 3's OTLP receiver with UnderscoreEscapingWithoutSuffixes the second; VictoriaMetrics' OTLP
# ingestion without -opentelemetry.usePrometheusNaming, or Prometheus 3 with NoTranslation, the third.
PROMETHEUS_NAMING = Naming("prometheus", "Prometheus names with unit suffixes and _total (otel-ofu's prometheus "
                           "exporter scraped, a Collector's remote write, Prometheus 3 or VictoriaMetrics OTLP with "
                           "the settings of docs/backends.md)")
WITHOUT_SUFFIXES = Naming("without_suffixes", "Prometheus names without unit suffixes or _total (Prometheus 3's "
                          "OTLP receiver with translation_strategy: UnderscoreEscapingWithoutSuffixes)", suffixes=False)
OTLP_NAMING = Naming("otlp", "the OpenTelemetry names and attribute keys, dots kept (VictoriaMetrics' OTLP ingestion "
                     "without -opentelemetry.usePrometheusNaming, Prometheus 3 with NoTranslation)", suffixes=False,
                     escaped=False)
NAMINGS = (PROMETHEUS_NAMING, WITHOUT_SUFFIXES, OTLP_NAMING)


class BackendError(RuntimeError):
    """The backend could not be reached or refused a query."""


@dataclass
class Backend:
    """A Prometheus-compatible query API at ``url`` (e.g. http://prometheus:9090).

    ``bearer_token`` is sent as ``Authorization: Bearer``; ``context`` is the TLS of an https:// URL (the
    scrape client's settings, :class:`otel_ofu.scrape.client.TlsSettings`). Neither ever reaches a message.
    """

    url: str
    timeout: float = 10.0
    headers: tuple[tuple[str, str], ...] = ()
    bearer_token: str = field(default="", repr=False)
    context: ssl.SSLContext | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        """Credentials in the URL (http://user:password@host:9090) are sent as basic auth, as Prometheus'
        clients do, and kept out of ``url``, which messages print."""
        parts = urllib.parse.urlsplit(self.url)
        if "@" not in parts.netloc:
            return
        userinfo, _, host = parts.netloc.rpartition("@")
        user, _, password = userinfo.partition(":")
        token = base64.b64encode(f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()).decode()
        self.headers = (*self.headers, ("Authorization", f"Basic {token}"))
        self.url = urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))

    def get(self, path: str, params: dict[str, str]) -> Any:
        """``data`` of a GET of ``path``; a :class:`BackendError` saying what went wrong (the URL's
        credentials and the token never in it)."""
        headers = dict(self.headers)
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        request = urllib.request.Request(f"{self.url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}",
                                         headers=headers)
        # No proxies from the environment, as the scrape client; TLS as configured.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=self.context))
        try:
            with opener.open(request, timeout=self.timeout) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise BackendError(f"{redact_url(self.url)}{path}: HTTP {exc.code} {exc.reason}: the backend refused "
                                   "the credentials (give a bearer token file, or user:password in the URL)") from None
            try:
                body = json.load(exc)
            except ValueError:
                raise BackendError(f"{redact_url(self.url)}{path}: HTTP {exc.code} {exc.reason}") from None
        except (OSError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise BackendError(f"{redact_url(self.url)}: cannot query: {redact_urls(str(reason))}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else body
            kind = body.get("errorType") if isinstance(body, dict) else "bad_response"
            raise BackendError(f"{redact_url(self.url)}{path}: {kind}: {redact_urls(str(error))}")
        return body["data"]

    def names(self, start: float, end: float) -> set[str]:
        return set(self.get("/api/v1/label/__name__/values", {"start": f"{start:.0f}", "end": f"{end:.0f}"}))

    def count(self, expr: str, at: float) -> int:
        """The value of ``count(expr)`` at ``at``; 0 for no series."""
        result = self.get("/api/v1/query", {"query": f"count({expr})", "time": f"{at:.0f}"})["result"]
        return int(float(result[0]["value"][1])) if result else 0


def check_backend(backend: Backend, *, lookback_s: float = 3600.0, now: float | None = None) -> list[Check]:
    """Each finding about ``backend`` as a :class:`Check`, most important first."""
    end = time.time() if now is None else now
    start = end - lookback_s
    try:
        names = backend.names(start, end)
    except BackendError as exc:
        return [Check("backend", FAIL, f"cannot list metric names: {exc}",
                      "give the query API's base URL (http://HOST:9090 for Prometheus, http://HOST:8428 for "
                      "VictoriaMetrics); otel-ofu doctor --backend reads /api/v1/label/__name__/values")]
    window = f"[{int(lookback_s)}s]"
    checks = [Check("backend", OK, f"{backend.url} answers: {len(names)} metric names in the last {int(lookback_s)}s")]
    if GPU_METRIC not in names:
        checks.append(_missing_gpu_metric(names))
        return checks
    series = backend.count(f"last_over_time({GPU_METRIC}{window})", end)
    checks.append(Check("names", OK, f"{GPU_METRIC}: {series} series"))
    missing = [label for label in GPU_LABELS
               if backend.count(f'last_over_time({GPU_METRIC}{{{label}=""}}{window})', end)]
    if missing:
        hint = " (they are in target_info: not promoted)" if "target_info" in names else ""
        checks.append(Check("labels", FAIL, f"{GPU_METRIC} series without {', '.join(missing)}{hint}", PROMOTE_FIX))
    else:
        checks.append(Check("labels", OK, f"{GPU_METRIC} has {', '.join(GPU_LABELS)}"))
    suffix_gone = SUFFIXED not in names and SUFFIXED.removesuffix("_hertz") in names
    total_gone = COUNTER not in names and COUNTER.removesuffix("_total") in names
    if suffix_gone or total_gone:
        found = SUFFIXED.removesuffix("_hertz") if suffix_gone else COUNTER.removesuffix("_total")
        checks.append(Check("unit suffixes", FAIL, f"{found} arrived without its suffix (a WithoutSuffixes strategy):"
                            " the GPU dashboard's clock panels and the clock and drop alerts find nothing",
                            NAMING_FIX))
    elif SUFFIXED in names:
        checks.append(Check("unit suffixes", OK, f"{SUFFIXED}"))
    else:
        checks.append(Check("unit suffixes", SKIP, f"no {SUFFIXED} (inputs not exported: ofu emit_inputs off?)"))
    if JOB_METRIC in names:
        checks.append(Check("job metrics", OK, JOB_METRIC))
    else:
        checks.append(Check("job metrics", WARN, f"no {JOB_METRIC}: the Job dashboard's OFU, baseline and findings and "
                            "the OfuJob* alerts need otel-ofu's jobs processor",
                            "add the jobs processor to the pipeline that exports here (docs/components/processors/"
                            "jobs.md), or load deploy/prometheus/otel-ofu-promql.alerts.yml instead"))
    if RULE in names:
        checks.append(Check("recording rules", OK, RULE))
    else:
        checks.append(Check("recording rules", WARN, f"no {RULE}: the Fleet dashboard reads the recording rules",
                            "load deploy/prometheus/otel-ofu.rules.yml (Prometheus: rule_files; VictoriaMetrics: "
                            "vmalert -rule=...; docs/dashboards.md#loading-the-rules)"))
    if SELF_METRIC in names:
        if backend.count(f'last_over_time({SELF_METRIC}{{service_instance_id=""}}{window})', end):
            checks.append(Check("self-telemetry", WARN, f"{SELF_METRIC} without service_instance_id: the Self "
                                "dashboard cannot tell instances apart",
                                "Prometheus 3: otlp.keep_identifying_resource_attributes: true"))
        else:
            checks.append(Check("self-telemetry", OK, SELF_METRIC))
    return checks


def _missing_gpu_metric(names: set[str]) -> Check:
    """No gpu_ofu: what arrived instead, and the setting that makes it gpu_ofu."""
    if "gpu.ofu" in names:
        return Check("names", FAIL, "gpu.ofu arrived with its OTLP name (dots kept): a UTF-8 translation "
                     "(Prometheus 3 NoTranslation or NoUTF8EscapingWithSuffixes, or VictoriaMetrics without "
                     "-opentelemetry.usePrometheusNaming)", NAMING_FIX)
    if "gpu_ofu_ratio" in names:
        return Check("names", FAIL, "gpu_ofu_ratio: the sender declared unit 1 (otel-ofu before 0.3, or a "
                     "relabelled copy); otel-ofu now declares its ratios {ratio}, which every road names gpu_ofu",
                     "upgrade otel-ofu on the nodes (or rename with a metric_relabel_configs rule)")
    return Check("names", FAIL, "no gpu_ofu (nor gpu.ofu, gpu_ofu_ratio) in the last hour: nothing from otel-ofu "
                 "arrived", "check the exporter's endpoint (Prometheus 3: http://HOST:9090/api/v1/otlp and "
                 "--web.enable-otlp-receiver; VictoriaMetrics: http://HOST:8428/opentelemetry) and its "
                 f"otel_ofu_exporter_* self-telemetry ({DOCS})")


def render(url: str, checks: list[Check]) -> str:
    lines = [f"otel-ofu doctor: what {url} holds for otel-ofu's dashboards and rules", ""]
    for check in checks:
        lines.append(f"  [{check.status.upper():4}] {check.name}: {check.detail}")
        if check.fix:
            lines.append(f"         fix: {check.fix}")
    return "\n".join(lines)
