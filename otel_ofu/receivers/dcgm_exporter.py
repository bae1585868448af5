"""The ``dcgm_exporter`` receiver: scrapes NVIDIA dcgm-exporter ``/metrics`` endpoints.

dcgm-exporter serves Prometheus text (REFERENCE.md section 6). It exports no max SM clock,
so f_ref comes from the ``modelName`` label through the spec table (the ``ofu`` processor
does that). Its collect interval (``-c``, default 30 s) is also its DCGM watch interval: TPA
is a 30 s average, while the SM clock is one point sample taken at collection time. So one
scrape gives, per GPU, one window of TPA and exactly one clock sample (``sm_clock_samples``
= 1): scrape at the exporter's collect interval, since scraping faster only repeats values.

Labels are mapped by :mod:`otel_ofu.dcgm_fields` (both ``Hostname``/``hostname`` and
``UUID``/``uuid``, MIG, Kubernetes old and new names, ``hpc_job``). Values are kept raw:
a blank sentinel that leaks out of the exporter stays a sentinel and the ``ofu`` processor
reports it as a dropped window with its reason, never as 0. Each endpoint is scraped on its
own worker; one that fails (refused, timeout, HTTP error, bad body) is logged, counted in
``otel_ofu.scrape.errors`` and marked down in ``otel_ofu.scrape.up``; the others carry on.
"""

from __future__ import annotations

import base64
import http.client
import logging
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_ofu import __version__
from otel_ofu.core import dcgm_fields
from otel_ofu.core.metrics import MetricInfo, register
from otel_ofu.core.model import Batch, GpuSample
from otel_ofu.pipeline.component import Context, Factory, PollingReceiver
from otel_ofu.pipeline.config import Duration, FieldError, require

SOURCE = "dcgm_exporter"
DEFAULT_PATH = "/metrics"
MAX_BODY_BYTES = 64 * 1024 * 1024  # a node's dcgm-exporter page is ~100 KiB; this only stops runaways
MAX_WORKERS = 8
DEFAULT_SCRAPE_TIMEOUT = 10.0
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

SCRAPE_ERRORS = register(MetricInfo(
    "otel_ofu.scrape.errors", "{scrape}", "sum",
    "Failed scrapes of a Prometheus endpoint, by endpoint and reason (connection_refused, timeout, http_<code>, "
    "malformed, tls, auth_file, ...)."))
SCRAPE_UP = register(MetricInfo(
    "otel_ofu.scrape.up", "1", "gauge", "1 when the last scrape of the endpoint succeeded, 0 when it failed."))


@dataclass
class TlsSettings:
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    insecure_skip_verify: bool = False

    def validate(self) -> None:
        for key in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, key)
            require(not path or Path(path).expanduser().is_file(), key, f"file {path!r} does not exist")
        require(bool(self.cert_file) == bool(self.key_file), "cert_file" if not self.cert_file else "key_file",
                "cert_file and key_file go together (client certificate and its key)")


@dataclass
class BasicAuthSettings:
    username: str = ""
    password: str = field(default="", repr=False)
    password_file: str = ""

    def enabled(self) -> bool:
        return bool(self.username)

    def validate(self) -> None:
        require(self.enabled() or not (self.password or self.password_file), "username",
                "required with basic_auth")
        require(not (self.password and self.password_file), "password_file",
                "set either password or password_file, not both")
        require(not self.password_file or Path(self.password_file).expanduser().is_file(), "password_file",
                f"file {self.password_file!r} does not exist")


@dataclass
class DcgmExporterReceiverConfig:
    endpoint: str = ""  # one URL, e.g. http://node:9400/metrics ("host:port" means http://host:port/metrics)
    endpoints: list[str] = field(default_factory=list)  # or several, scraped in parallel each interval
    collection_interval: Duration = field(default_factory=lambda: Duration(30))
    scrape_timeout: Duration | None = None  # default: 10s, or collection_interval when shorter
    # dcgm-exporter's own -c/--collect-interval: the window its TPA is averaged over.
    exporter_collect_interval: Duration = field(default_factory=lambda: Duration(30))
    tls: TlsSettings = field(default_factory=TlsSettings)
    basic_auth: BasicAuthSettings = field(default_factory=BasicAuthSettings)  # on when username is set
    bearer_token: str = field(default="", repr=False)
    bearer_token_file: str = ""
    host_name: str = ""  # overrides the Hostname label (default: the label, else the endpoint's host)

    def validate(self) -> None:
        require(bool(self.endpoint) != bool(self.endpoints), "endpoint",
                "set exactly one of endpoint (a URL) or endpoints (a list of URLs)")
        keyed = [("endpoint", self.endpoint)] if self.endpoint else [
            (f"endpoints[{i}]", e) for i, e in enumerate(self.endpoints)]
        for key, url in keyed:
            try:
                normalize_endpoint(url)
            except ValueError as exc:
                raise FieldError(key, str(exc)) from None
        urls = self.urls()
        require(len(set(urls)) == len(urls), "endpoints", "lists the same endpoint twice")
        require(self.collection_interval > 0, "collection_interval", "must be positive")
        require(self.scrape_timeout is None or 0 < self.scrape_timeout <= self.collection_interval,
                "scrape_timeout",
                f"must be positive and at most collection_interval ({float(self.collection_interval):g}s)")
        require(self.exporter_collect_interval > 0, "exporter_collect_interval", "must be positive")
        require(not (self.bearer_token and self.bearer_token_file), "bearer_token_file",
                "set either bearer_token or bearer_token_file, not both")
        require(not self.bearer_token_file or Path(self.bearer_token_file).expanduser().is_file(),
                "bearer_token_file", f"file {self.bearer_token_file!r} does not exist")
        require(not self.basic_auth.enabled() or not (self.bearer_token or self.bearer_token_file), "basic_auth",
                "use basic_auth or a bearer token, not both")

    def timeout(self) -> float:
        if self.scrape_timeout is not None:
            return float(self.scrape_timeout)
        return min(DEFAULT_SCRAPE_TIMEOUT, float(self.collection_interval))

    def urls(self) -> list[str]:
        return [normalize_endpoint(u) for u in ([self.endpoint] if self.endpoint else self.endpoints)]


def normalize_endpoint(text: str) -> str:
    """A scrape URL from ``host:port`` or a URL; the path defaults to ``/metrics`` as in Prometheus."""
    text = text.strip()
    if not text:
        raise ValueError("empty endpoint")
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{text!r}: the scheme must be http or https")
    if not parts.hostname:
        raise ValueError(f"{text!r}: no host")
    if parts.username or parts.password:
        raise ValueError(f"{text!r}: put credentials under basic_auth, not in the URL")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    path = parts.path if parts.path not in ("", "/") else DEFAULT_PATH
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _field_of(metric_name: str) -> int | None:
    fid = dcgm_fields.FIELD_IDS_BY_NAME.get(metric_name)
    if fid is None and metric_name.endswith("_total"):  # the parser renames counters' samples
        fid = dcgm_fields.FIELD_IDS_BY_NAME.get(metric_name[:-6])
    return fid


def parse_metrics(text: str, *, time_unix_nano: int, window_s: float, host_override: str = "",
                  default_host: str = "") -> list[GpuSample]:
    """GPU samples from one dcgm-exporter page; raises ValueError when the text is not Prometheus.

    One sample per GPU entity: a GPU, or a MIG instance (same UUID, its own GPU_I_ID), or one
    pod's view of a shared GPU (dcgm-exporter repeats the series per pod). Metrics that are
    not DCGM fields we read, and series without a GPU identity, are ignored.
    """
    from prometheus_client.parser import text_string_to_metric_families

    entities: dict[tuple, tuple[dict[str, Any], dict[int, object]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            fid = _field_of(sample.name)
            labels = sample.labels
            if fid is None or not (labels.get("gpu") or labels.get("UUID") or labels.get("uuid")):
                continue
            ident = dcgm_fields.identity_from_labels(labels)
            key = (ident["host"], ident["gpu_index"], ident["uuid"], tuple(sorted(ident["resource"].items())))
            entities.setdefault(key, (ident, {}))[1][fid] = sample.value  # raw: int, float, NaN or a sentinel
    out = []
    for ident, fields in entities.values():
        index = ident["gpu_index"]
        out.append(dcgm_fields.sample_from_fields(
            fields, time_unix_nano=time_unix_nano, window_s=window_s,
            host=host_override or ident["host"] or default_host,
            gpu_index=int(index) if str(index).isdigit() else index, uuid=ident["uuid"], model=ident["model"],
            source=SOURCE, job_id=ident["job_id"], resource=dict(ident["resource"]),
        ))
    return out


class ScrapeError(Exception):
    """A failed scrape: ``reason`` is the telemetry attribute, the message says what happened."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


def _read_secret(path: str) -> str:
    try:
        return Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise ScrapeError("auth_file", f"cannot read {path}: {exc.strerror}") from None


def _ssl_context(tls: TlsSettings) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(Path(tls.ca_file).expanduser()) if tls.ca_file else None)
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if tls.cert_file:
        context.load_cert_chain(str(Path(tls.cert_file).expanduser()), str(Path(tls.key_file).expanduser()))
    return context


def _classify(exc: BaseException) -> tuple[str, str]:
    """(reason, message) for a transport failure."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"http_{exc.code}", f"HTTP {exc.code} {exc.reason}"
    cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(cause, ConnectionRefusedError):
        return "connection_refused", "connection refused"
    if isinstance(cause, (TimeoutError, socket.timeout)):
        return "timeout", "timed out"
    if isinstance(cause, ssl.SSLError):
        return "tls", f"TLS error: {cause}"
    if isinstance(cause, socket.gaierror):
        return "dns", f"cannot resolve host: {cause}"
    if isinstance(cause, http.client.HTTPException):
        return "connection_error", f"bad HTTP response: {cause!r}"
    return "connection_error", str(cause)


class Scraper:
    """Fetches one endpoint's page with the configured auth, TLS and a whole-scrape timeout."""

    def __init__(self, config: DcgmExporterReceiverConfig):
        self.config = config

    def headers(self) -> dict[str, str]:
        cfg = self.config
        headers = {"Accept": ACCEPT, "User-Agent": f"otel-ofu/{__version__}",
                   "X-Prometheus-Scrape-Timeout-Seconds": f"{cfg.timeout():g}"}
        if cfg.basic_auth.enabled():
            auth = cfg.basic_auth
            password = _read_secret(auth.password_file) if auth.password_file else auth.password
            token = base64.b64encode(f"{auth.username}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        elif cfg.bearer_token or cfg.bearer_token_file:
            token = _read_secret(cfg.bearer_token_file) if cfg.bearer_token_file else cfg.bearer_token
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def fetch(self, url: str, context: ssl.SSLContext | None) -> str:
        timeout = self.config.timeout()
        deadline = time.monotonic() + timeout
        # No proxies from the environment: like Prometheus, scrape the endpoint directly.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=context))
        request = urllib.request.Request(url, headers=self.headers())
        chunks: list[bytes] = []
        size = 0
        try:
            with opener.open(request, timeout=timeout) as response:
                while chunk := response.read(65536):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_BODY_BYTES:
                        raise ScrapeError("body_too_large", f"body larger than {MAX_BODY_BYTES} bytes")
                    if time.monotonic() > deadline:
                        raise ScrapeError("timeout", f"body not read within {timeout:g}s")
        except ScrapeError:
            raise
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason, message = _classify(exc)
            raise ScrapeError(reason, message) from None
        try:
            return b"".join(chunks).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ScrapeError("malformed", f"body is not UTF-8: {exc}") from None


class DcgmExporterReceiver(PollingReceiver):
    def __init__(self, config: DcgmExporterReceiverConfig, context: Context, consumer):
        super().__init__(config, context, consumer)
        self.urls = config.urls()
        self.scraper = Scraper(config)
        self._executor: ThreadPoolExecutor | None = None
        self._last_reason: dict[str, str | None] = {}
        self._poll_started = 0.0

    def interval(self) -> float:
        # Keep a fixed scrape period, as Prometheus does: a slow scrape shortens the wait.
        elapsed = time.monotonic() - self._poll_started if self._poll_started else 0.0
        return max(0.0, float(self.config.collection_interval) - elapsed)

    def on_start(self) -> None:
        self.log.info("scraping %d dcgm-exporter endpoint(s) every %gs: %s", len(self.urls),
                      float(self.config.collection_interval), ", ".join(self.urls))

    def poll(self) -> Batch | None:
        self._poll_started = time.monotonic()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(self.urls)),
                                                thread_name_prefix=self.context.component_id)
        try:
            context = _ssl_context(self.config.tls) if any(u.startswith("https:") for u in self.urls) else None
        except (OSError, ssl.SSLError) as exc:
            for url in self.urls:
                self._failed(url, ScrapeError("tls", f"cannot load the TLS settings: {exc}"))
            return None
        results = list(self._executor.map(lambda url: self._scrape(url, context), self.urls))
        samples = [s for result in results for s in result]
        return Batch(samples=samples) if samples else None

    def _scrape(self, url: str, context: ssl.SSLContext | None) -> list[GpuSample]:
        try:
            text = self.scraper.fetch(url, context)
            now = time.time_ns()
            try:
                samples = parse_metrics(text, time_unix_nano=now,
                                        window_s=float(self.config.exporter_collect_interval),
                                        host_override=self.config.host_name,
                                        default_host=urllib.parse.urlsplit(url).hostname or "")
            except ValueError as exc:
                detail = (str(exc) or "a line does not parse")[:200]
                raise ScrapeError("malformed", f"not Prometheus text: {detail}") from None
        except ScrapeError as exc:
            self._failed(url, exc)
            return []
        except Exception as exc:  # a bug must not stop the other endpoints
            self.log.exception("scrape of %s failed unexpectedly", url)
            self._failed(url, ScrapeError("internal_error", repr(exc)), logged=True)
            return []
        self.context.telemetry.set(SCRAPE_UP.name, 1, endpoint=url)
        if self._last_reason.get(url):
            self.log.info("%s: scrape recovered (%d GPU entities)", url, len(samples))
        self._last_reason[url] = None
        return samples

    def _failed(self, url: str, exc: ScrapeError, logged: bool = False) -> None:
        self.context.telemetry.add(SCRAPE_ERRORS.name, 1, endpoint=url, reason=exc.reason)
        self.context.telemetry.set(SCRAPE_UP.name, 0, endpoint=url)
        if not logged:
            # Loud on a new failure, quiet while the same failure repeats every interval.
            level = logging.WARNING if self._last_reason.get(url) != exc.reason else logging.DEBUG
            self.log.log(level, "scrape of %s failed (%s): %s; other endpoints carry on", url, exc.reason, exc)
        self._last_reason[url] = exc.reason

    def on_stop(self) -> None:
        self._close_executor()

    def shutdown(self) -> None:
        super().shutdown()
        self._close_executor()

    def _close_executor(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


FACTORY = Factory("dcgm_exporter", DcgmExporterReceiverConfig, DcgmExporterReceiver,
                  "scrapes NVIDIA dcgm-exporter /metrics endpoints", output="samples")
