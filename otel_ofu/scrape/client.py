"""The HTTP side of a scrape: settings, one fetch with auth and TLS, and a pool of endpoints.

Behaves as Prometheus does: no proxies from the environment, ``X-Prometheus-Scrape-Timeout-Seconds``,
a whole-scrape timeout, a bounded body. A failed endpoint (refused, timeout, HTTP error, bad
body) is logged when its failure changes, counted in ``otel_ofu.scrape.errors`` and marked
down in ``otel_ofu.scrape.up``; the other endpoints carry on.
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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from otel_ofu import __version__
from otel_ofu.core.metrics import MetricInfo, register
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import invalid, require, require_file
from otel_ofu.pipeline.redact import redact_url

DEFAULT_PATH = "/metrics"
MAX_BODY_BYTES = 64 * 1024 * 1024  # a node's dcgm-exporter page is ~100 KiB; this only stops runaways
MAX_WORKERS = 8
DEFAULT_SCRAPE_TIMEOUT = 10.0
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

SCRAPE_ERRORS = register(MetricInfo(
    "otel_ofu.scrape.errors", "{scrape}", "sum",
    "Failed scrapes of a Prometheus endpoint, by endpoint and reason (connection_refused, timeout, http_<code>, "
    "malformed, tls, auth_file, ...).", emitted_by=("receivers/dcgm_exporter", "receivers/prometheus")))
SCRAPE_UP = register(MetricInfo(
    "otel_ofu.scrape.up", "{state}", "gauge", "1 when the last scrape of the endpoint succeeded, 0 when it failed.",
    emitted_by=("receivers/dcgm_exporter", "receivers/prometheus")))


@dataclass
class TlsSettings:
    """TLS for https:// endpoints."""

    ca_file: str = ""  # CA bundle (PEM) to verify the endpoints' certificates; "" = the system CAs
    cert_file: str = ""  # client certificate (PEM), with key_file
    key_file: str = ""  # the client certificate's key
    insecure_skip_verify: bool = False  # do not verify the server certificate

    def validate(self) -> None:
        for key in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, key)
            if path:
                require_file(key, path)
        require(bool(self.cert_file) == bool(self.key_file), "cert_file" if not self.cert_file else "key_file",
                "cert_file and key_file go together (client certificate and its key)")


@dataclass
class BasicAuthSettings:
    """HTTP basic auth, on when username is set; not together with a bearer token."""

    username: str = ""  # the user name; setting it enables basic auth
    password: str = field(default="", repr=False)  # the password, inline (or password_file)
    # A file holding the password, read at every scrape (surrounding whitespace trimmed).
    password_file: str = ""

    def enabled(self) -> bool:
        return bool(self.username)

    def validate(self) -> None:
        require(self.enabled() or not (self.password or self.password_file), "username",
                "required with basic_auth")
        require(not (self.password and self.password_file), "password_file",
                "set either password or password_file, not both")
        if self.password_file:
            require_file("password_file", self.password_file)


def normalize_endpoint(text: str) -> str:
    """A scrape URL from ``host:port`` or a URL; the path defaults to ``/metrics`` as in Prometheus.

    Credentials in the URL are refused (they would be logged with it, and Prometheus takes them
    under basic_auth too); every message names the URL with its credentials masked.
    """
    text = text.strip()
    if not text:
        raise ValueError("empty endpoint")
    if "://" not in text:
        text = "http://" + text
    shown = redact_url(text)
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{shown!r}: the scheme must be http or https")
    if parts.username or parts.password or "@" in parts.netloc:
        raise ValueError(f"{shown!r}: put credentials under basic_auth (or bearer_token_file), not in the URL")
    if not parts.hostname:
        raise ValueError(f"{shown!r}: no host")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"{shown!r}: {exc}") from None
    path = parts.path if parts.path not in ("", "/") else DEFAULT_PATH
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


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


class ScrapeSettings(Protocol):
    """What a scraping receiver's config has (its own dataclass: each documents its keys)."""

    endpoint: str
    endpoints: list[str]
    collection_interval: Any
    scrape_timeout: Any
    tls: TlsSettings
    basic_auth: BasicAuthSettings
    bearer_token: str
    bearer_token_file: str

    def timeout(self) -> float: ...


def validate_settings(cfg: ScrapeSettings) -> None:
    """The checks every scraping receiver's ``validate()`` runs on its endpoint, timing and auth keys."""
    require(bool(cfg.endpoint) != bool(cfg.endpoints), "endpoint",
            "set exactly one of endpoint (a URL) or endpoints (a list of URLs)")
    keyed = [("endpoint", cfg.endpoint)] if cfg.endpoint else [
        (f"endpoints[{i}]", e) for i, e in enumerate(cfg.endpoints)]
    readable = True
    for key, url in keyed:
        try:
            normalize_endpoint(url)
        except ValueError as exc:
            invalid(key, str(exc))
            readable = False
    if readable:
        urls = target_urls(cfg)
        require(len(set(urls)) == len(urls), "endpoints", "lists the same endpoint twice")
    require(cfg.collection_interval > 0, "collection_interval", "must be positive")
    require(cfg.scrape_timeout is None or 0 < cfg.scrape_timeout <= cfg.collection_interval,
            "scrape_timeout",
            f"must be positive and at most collection_interval ({float(cfg.collection_interval):g}s)")
    require(not (cfg.bearer_token and cfg.bearer_token_file), "bearer_token_file",
            "set either bearer_token or bearer_token_file, not both")
    if cfg.bearer_token_file:
        require_file("bearer_token_file", cfg.bearer_token_file)
    require(not cfg.basic_auth.enabled() or not (cfg.bearer_token or cfg.bearer_token_file), "basic_auth",
            "use basic_auth or a bearer token, not both")


def scrape_timeout(cfg: ScrapeSettings) -> float:
    """``scrape_timeout``, by default 10 s or ``collection_interval`` when shorter (as Prometheus)."""
    if cfg.scrape_timeout is not None:
        return float(cfg.scrape_timeout)
    return min(DEFAULT_SCRAPE_TIMEOUT, float(cfg.collection_interval))


def target_urls(cfg: ScrapeSettings) -> list[str]:
    return [normalize_endpoint(u) for u in ([cfg.endpoint] if cfg.endpoint else cfg.endpoints)]


class Scraper:
    """Fetches one endpoint's page with the configured auth, TLS and a whole-scrape timeout."""

    def __init__(self, config: ScrapeSettings):
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




T = TypeVar("T")


class ScrapePool:
    """Scrapes every endpoint in parallel, each on its own worker; one failing never stops the rest.

    ``parse(url, text, time_unix_nano)`` turns a page into items; a ValueError from it is a
    malformed page. Failures are logged loudly when they change and quietly while they repeat.
    """

    def __init__(self, config: ScrapeSettings, context: Context, log: logging.Logger, what: str = "items"):
        self.config = config
        self.urls = target_urls(config)
        self.scraper = Scraper(config)
        self.context = context
        self.log = log
        self.what = what  # what a page yields, for the recovery log line
        self._executor: ThreadPoolExecutor | None = None
        self._last_reason: dict[str, str | None] = {}
        self._last_error: dict[str, str] = {}  # endpoint -> its last failure, in words
        self._empty: set[str] = set()  # endpoints whose last scrape gave nothing to read

    def scrape(self, parse: Callable[[str, str, int], Sequence[T]]) -> list[T]:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(self.urls)),
                                                thread_name_prefix=self.context.component_id)
        try:
            context = _ssl_context(self.config.tls) if any(u.startswith("https:") for u in self.urls) else None
        except (OSError, ssl.SSLError) as exc:
            for url in self.urls:
                self._failed(url, ScrapeError("tls", f"cannot load the TLS settings: {exc}"))
            self._report_state([])
            return []
        results = list(self._executor.map(lambda url: self._scrape(url, context, parse), self.urls))
        self._report_state([url for url, result in zip(self.urls, results, strict=True)
                            if not result and not self._last_reason.get(url)])
        return [item for result in results for item in result]

    def _report_state(self, empty: list[str]) -> None:
        """The receiver's state (otel_ofu.receiver.status) after a round: scrape_failed while an endpoint
        fails, empty while one answers with nothing to read (a page without the metrics read here, which
        Prometheus would see as an otel-ofu that is up with no series), else ok."""
        for url in empty:
            if url not in self._empty:
                self.log.warning("scrape of %s succeeded but gave no %s: the page has none of the metrics this "
                                 "receiver reads (the wrong URL, or the exporter serves nothing yet); other endpoints "
                                 "carry on", url, self.what)
        for url in self._empty - set(empty):
            if not self._last_reason.get(url):
                self.log.info("%s: %s again", url, self.what)
        self._empty = set(empty)
        failed = [url for url in self.urls if self._last_reason.get(url)]
        retry = f"; retrying every {float(self.config.collection_interval):g}s"
        if failed:
            why = f"cannot scrape {failed[0]}: {self._last_error.get(failed[0], '')}{_and_more(failed)}{retry}"
        elif empty:
            why = f"{empty[0]} answers with none of the metrics this receiver reads{_and_more(empty)}"
        else:
            why = ""
        self.context.telemetry.receiver_state(self.context.component_id,
                                              "scrape_failed" if failed else "empty" if empty else "ok", why=why)

    def _scrape(self, url: str, context: ssl.SSLContext | None, parse: Callable[[str, str, int], Sequence[T]]
                ) -> Sequence[T]:
        try:
            text = self.scraper.fetch(url, context)
            try:
                items = parse(url, text, time.time_ns())
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
            self.log.info("%s: scrape recovered (%d %s)", url, len(items), self.what)
        self._last_reason[url] = None
        return items

    def _failed(self, url: str, exc: ScrapeError, logged: bool = False) -> None:
        self.context.telemetry.add(SCRAPE_ERRORS.name, 1, endpoint=url, reason=exc.reason)
        self.context.telemetry.set(SCRAPE_UP.name, 0, endpoint=url)
        if not logged:
            # Loud on a new failure, quiet while the same failure repeats every interval.
            level = logging.WARNING if self._last_reason.get(url) != exc.reason else logging.DEBUG
            self.log.log(level, "scrape of %s failed (%s): %s; other endpoints carry on", url, exc.reason, exc)
        self._last_reason[url] = exc.reason
        self._last_error[url] = str(exc)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _and_more(urls: list[str]) -> str:
    return f" (and {len(urls) - 1} more endpoint{'s' if len(urls) > 2 else ''})" if len(urls) > 1 else ""


def parse_text(text: str) -> Any:
    """Metric families of a Prometheus text page (prometheus_client's parser; ValueError when it is not)."""
    from prometheus_client.parser import text_string_to_metric_families

    return text_string_to_metric_families(text)
