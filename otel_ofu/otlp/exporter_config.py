"""Config of the ``otlp`` and ``otlphttp`` exporters, and how it meets the environment.

The keys are the Collector's (``endpoint``, ``tls``, ``headers``, ``compression``,
``timeout``, ``retry_on_failure``, ``sending_queue``) so settings move across unchanged. A
key left out of the config falls back to the standard variables: first
``OTEL_EXPORTER_OTLP_METRICS_<X>``, then ``OTEL_EXPORTER_OTLP_<X>``, then the default.
:func:`resolve` does that in one place, for the exporter and for ``otel-ofu validate``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from opentelemetry.util.re import parse_env_headers

from otel_ofu.pipeline.config import Duration, FieldError, require, require_directory, require_file

GRPC_DEFAULT_ENDPOINT = "localhost:4317"
HTTP_DEFAULT_ENDPOINT = "http://localhost:4318"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_COMPRESSION = "gzip"  # as the Collector's otlp exporters
NO_LOGS = "none"  # logs_endpoint: none: events are not sent


@dataclass
class TLSConfig:
    """TLS to the backend. Each file key left unset falls back to its OTEL_EXPORTER_OTLP_*
    variable (below), then to none; the files are read again when they change (a rotated
    certificate needs no restart)."""

    # otlp: true sends plaintext. Unset: decided by the endpoint's scheme (http:// plain, https://
    # TLS), then OTEL_EXPORTER_OTLP_[METRICS_]INSECURE, else TLS, as in the Collector. otlphttp:
    # the URL's scheme decides.
    insecure: bool | None = None
    ca_file: str | None = None  # CA bundle (PEM) to verify the server; unset: the system CAs
    cert_file: str | None = None  # client certificate (mTLS), with key_file
    key_file: str | None = None  # the client certificate's key
    # otlphttp only: do not verify the server certificate (logged as a warning). grpcio cannot do
    # this, so otlp rejects it: set ca_file instead.
    insecure_skip_verify: bool = False

    def validate(self) -> None:
        require((self.cert_file is None) == (self.key_file is None), "cert_file" if self.key_file else "key_file",
                "cert_file and key_file go together (the client certificate and its key)")
        for key in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, key)
            if path is not None:
                require_file(key, path)


@dataclass
class RetryConfig:
    """Retrying failures the backend calls retryable, with exponential backoff and jitter, at
    least as long as the backend asks
    (docs/reliability.md#delivery-queues-retries-outages-crashes-otlp-otlphttp-exporters)."""

    enabled: bool = True  # false: a failed send is dropped (reason retry_disabled)
    initial_interval: Duration = field(default_factory=lambda: Duration(5))  # the first backoff
    max_interval: Duration = field(default_factory=lambda: Duration(30))  # the longest backoff
    # Give a batch up after retrying this long (reason retries_exhausted); 0 = never.
    max_elapsed_time: Duration = field(default_factory=lambda: Duration(300))
    multiplier: float = 1.5  # backoff growth per attempt
    randomization_factor: float = 0.5  # jitter: each wait is the backoff +- this fraction

    def validate(self) -> None:
        require(self.initial_interval > 0, "initial_interval", "must be positive")
        require(self.max_interval >= self.initial_interval, "max_interval", "must be at least initial_interval")
        require(self.max_elapsed_time >= 0, "max_elapsed_time", "must be >= 0 (0: retry without a time limit)")
        require(self.multiplier >= 1, "multiplier", "must be >= 1")
        require(0 <= self.randomization_factor < 1, "randomization_factor", "must be within [0, 1)")


@dataclass
class QueueConfig:
    """The bounded sending queue between the pipeline and the backend
    (docs/reliability.md#delivery-queues-retries-outages-crashes-otlp-otlphttp-exporters)."""

    # false: export() sends and retries on the receiver's thread, as in the Collector (receivers
    # stall during an outage).
    enabled: bool = True
    # Threads sending from the queue in parallel. The Collector's default, kept for a node daemon
    # too: an idle consumer blocks on the queue (no polling), so the nine a daemon sending every
    # 10 s rarely needs cost no CPU, and ten keep a slow backend from holding up the next batches.
    num_consumers: int = 10
    # What queue_size counts, as the Collector's sending_queue.sizer: requests (batches),
    # items (data points and log records) or bytes (serialized payload bytes).
    sizer: Literal["requests", "items", "bytes"] = "requests"
    # Accepted and not yet sent or dropped, waiting or in flight, in sizer units. With requests:
    # one batch per receiver collection interval, so 1000 at 10 s hold about 2.8 hours of outage.
    queue_size: int = 1000
    # Full queue: false drops the oldest waiting batch (counted, reason queue_full); true makes
    # export() wait for room, which slows the receivers down.
    block_on_overflow: bool = False
    # otel-ofu only: the longest export() waits when blocking; then the new batch is dropped.
    block_timeout: Duration = field(default_factory=lambda: Duration(30))
    # otel-ofu only: a directory; the queue lives there in SQLite as <exporter id>.sqlite3 (created
    # if missing) and survives crashes and restarts. Unset: in memory.
    storage: str | None = None
    # otel-ofu only: how long shutdown keeps sending what is queued; the rest is dropped (reason shutdown).
    drain_timeout: Duration = field(default_factory=lambda: Duration(10))

    def validate(self) -> None:
        require(self.num_consumers >= 1, "num_consumers", "must be at least 1")
        require(self.queue_size >= 1, "queue_size", "must be at least 1")
        # A consumer holds one batch while it sends: fewer slots than consumers leaves some idle
        # and the queue full while they all send.
        require(self.sizer != "requests" or self.queue_size >= self.num_consumers, "queue_size",
                f"must be at least num_consumers ({self.num_consumers}) with sizer requests, "
                f"got {self.queue_size}")
        require(self.sizer != "bytes" or self.queue_size >= 1024, "queue_size",
                f"with sizer bytes it counts payload bytes: {self.queue_size} holds not even one request")
        require(self.block_timeout >= 0, "block_timeout", "must be >= 0")
        require(self.drain_timeout >= 0, "drain_timeout", "must be >= 0")
        if self.storage is not None:
            if require(bool(self.storage.strip()), "storage", "must be a directory path"):
                require_directory("storage", self.storage, "the queue database")


@dataclass
class OtlpExporterConfig:
    # host:port of the gRPC server (an http:// or https:// prefix also sets plaintext or TLS).
    # Unset: OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT, else localhost:4317.
    endpoint: str | None = None
    tls: TLSConfig = field(default_factory=TLSConfig)
    # Request headers / gRPC metadata (names lower-cased), e.g. authorization: "Bearer ${env:TOKEN}".
    # Unset: OTEL_EXPORTER_OTLP_[METRICS_]HEADERS, else none.
    headers: dict[str, str] | None = None
    # Unset: OTEL_EXPORTER_OTLP_[METRICS_]COMPRESSION, else gzip.
    compression: Literal["gzip", "none"] | None = None
    # Bound on one send attempt. Unset: OTEL_EXPORTER_OTLP_[METRICS_]TIMEOUT (milliseconds), else 10s.
    timeout: Duration | None = None
    # otel-ofu's own: send "authorization: Bearer <file contents>", read again when the file changes
    # (the Collector does this through its bearertokenauth extension's filename).
    bearer_token_file: str | None = None
    # otel-ofu's own: false sends no events (job start and end, findings: OTLP logs), for a backend
    # that takes metrics only (a Collector without a logs pipeline, Prometheus 3, VictoriaMetrics).
    events: bool = True
    retry_on_failure: RetryConfig = field(default_factory=RetryConfig)
    sending_queue: QueueConfig = field(default_factory=QueueConfig)

    protocol = "grpc"

    def validate(self) -> None:
        require(self.timeout is None or self.timeout > 0, "timeout", "must be positive")
        if self.bearer_token_file is not None:
            require_file("bearer_token_file", self.bearer_token_file)
            require("authorization" not in {k.lower() for k in (self.headers or {})}, "bearer_token_file",
                    "headers already sets authorization: use one or the other")
        require(not (self.protocol == "grpc" and self.tls.insecure_skip_verify), "tls.insecure_skip_verify",
                "not supported by the gRPC client (grpcio); set tls.ca_file to the server's CA instead")
        logs = getattr(self, "logs_endpoint", None)
        require(self.events or logs is None or logs.strip() == NO_LOGS, "events",
                f"false sends no events, but logs_endpoint names where to send them ({logs!r}): drop one")
        resolve(self, os.environ)  # raises FieldError naming a bad variable or endpoint


@dataclass
class OtlpHttpExporterConfig(OtlpExporterConfig):
    # The base URL; /v1/metrics and /v1/logs are appended unless given in full below. Unset:
    # OTEL_EXPORTER_OTLP_ENDPOINT (a base URL), else http://localhost:4318.
    endpoint: str | None = None
    # The full metrics URL, used as it is. Unset: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, else
    # endpoint + /v1/metrics.
    metrics_endpoint: str | None = None
    # The full logs URL (events: job start and end, findings), used as it is; none: events are not
    # sent (a backend that takes metrics only: Prometheus 3, VictoriaMetrics). Unset:
    # OTEL_EXPORTER_OTLP_LOGS_ENDPOINT, else endpoint + /v1/logs.
    logs_endpoint: str | None = None

    protocol = "http"


@dataclass(frozen=True)
class Settings:
    """Everything a transport needs, after config and environment are merged."""

    targets: dict[str, str]  # signal -> gRPC target (host:port) or HTTP URL; no "logs": events are not sent
    insecure: bool
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    insecure_skip_verify: bool
    headers: dict[str, str]
    compression: str  # "gzip" | "none"
    timeout: float
    bearer_token_file: str | None = None


def _env(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """(variable, value) of the metrics-specific variable, else the generic one; blank is unset."""
    for var in (f"OTEL_EXPORTER_OTLP_METRICS_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = environ.get(var, "").strip()
        if value:
            return var, value
    return None


def _env_bool(environ: Mapping[str, str], name: str) -> bool | None:
    found = _env(environ, name)
    if found is None:
        return None
    var, value = found
    if value.lower() not in ("true", "false"):
        raise FieldError(var, f"expected true or false, got {value!r}")
    return value.lower() == "true"


def _http_url(key: str, url: str) -> str:
    parsed = urlparse(url)
    require(parsed.scheme in ("http", "https") and bool(parsed.netloc), key,
            f"expected an http:// or https:// URL, got {url!r}")
    return url


def _signal_url(base: str, signal: str) -> str:
    return f"{base.rstrip('/')}/v1/{signal}"


def resolve(config: OtlpExporterConfig, environ: Mapping[str, str]) -> Settings:
    """Merge config and environment: a key set in the config always wins over a variable."""
    tls = config.tls
    scheme = None
    if config.protocol == "http":
        assert isinstance(config, OtlpHttpExporterConfig)
        targets = {}
        for signal, explicit in (("metrics", config.metrics_endpoint), ("logs", config.logs_endpoint)):
            env_signal = environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "").strip()
            env_base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
            if signal == "logs" and explicit is not None and explicit.strip() == NO_LOGS:
                continue
            if explicit:
                targets[signal] = _http_url(f"{signal}_endpoint", explicit)
            elif config.endpoint:
                targets[signal] = _signal_url(_http_url("endpoint", config.endpoint), signal)
            elif env_signal:
                targets[signal] = _http_url(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", env_signal)
            else:
                targets[signal] = _signal_url(_http_url("OTEL_EXPORTER_OTLP_ENDPOINT", env_base or
                                                        HTTP_DEFAULT_ENDPOINT), signal)
        insecure = urlparse(targets["metrics"]).scheme == "http"
    else:
        found = None if config.endpoint else _env(environ, "ENDPOINT")
        endpoint = config.endpoint or (found[1] if found else GRPC_DEFAULT_ENDPOINT)
        key = "endpoint" if config.endpoint else (found[0] if found else "endpoint")
        if "://" in endpoint:
            parsed = urlparse(endpoint)
            require(parsed.scheme in ("http", "https") and bool(parsed.netloc), key,
                    f"expected host:port, http://host:port or https://host:port, got {endpoint!r}")
            scheme, endpoint = parsed.scheme, parsed.netloc
        if require("@" not in endpoint, key, "credentials in the endpoint are not sent over gRPC (and the endpoint "
                   "is logged): set headers: {authorization: ...} or bearer_token_file"):
            require(bool(endpoint) and "/" not in endpoint, key, f"expected host:port, got {endpoint!r}")
        targets = {"metrics": endpoint, "logs": endpoint}
        if tls.insecure is not None:
            insecure = tls.insecure
        elif scheme is not None:
            insecure = scheme == "http"
        else:
            env_insecure = _env_bool(environ, "INSECURE")
            insecure = bool(env_insecure)

    if not config.events:
        targets.pop("logs", None)

    def pick(value: str | None, name: str) -> str | None:
        if value is not None:
            return value
        found = _env(environ, name)
        return found[1] if found else None

    if config.headers is not None:
        headers = {k.lower(): v for k, v in config.headers.items()}
    else:
        found = _env(environ, "HEADERS")  # k1=v1,k2=v2, percent-encoded; parsed as the SDK does
        headers = parse_env_headers(found[1], liberal=True) if found else {}

    compression = config.compression
    if compression is None:
        found = _env(environ, "COMPRESSION")
        compression = found[1].lower() if found else DEFAULT_COMPRESSION
        if found and compression not in ("gzip", "none"):
            raise FieldError(found[0], f"must be gzip or none, got {found[1]!r}")

    if config.timeout is not None:
        timeout = float(config.timeout)
    else:
        found = _env(environ, "TIMEOUT")
        timeout = DEFAULT_TIMEOUT_S
        if found:  # milliseconds, as the OTLP exporter spec says
            try:
                timeout = float(found[1]) / 1000.0
            except ValueError:
                raise FieldError(found[0], f"expected milliseconds, got {found[1]!r}") from None
            require(timeout > 0, found[0], "must be positive")

    return Settings(targets=targets, insecure=insecure, ca_file=pick(tls.ca_file, "CERTIFICATE"),
                    cert_file=pick(tls.cert_file, "CLIENT_CERTIFICATE"), key_file=pick(tls.key_file, "CLIENT_KEY"),
                    insecure_skip_verify=tls.insecure_skip_verify, headers=headers, compression=compression,
                    timeout=timeout, bearer_token_file=(str(Path(config.bearer_token_file).expanduser())
                                                        if config.bearer_token_file else None))
