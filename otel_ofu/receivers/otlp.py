"""The ``otlp`` receiver: OTLP metrics over gRPC and HTTP (protobuf and JSON), e.g. from a Collector.

It makes otel-ofu a processing stage behind an OpenTelemetry Collector: the Collector sends
DCGM metrics (from its Prometheus receiver scraping dcgm-exporter, or from dcgmreceiver), the
TPA and SM clock points are joined into GPU samples (:mod:`otel_ofu.otlp.join`) for the
``ofu`` processor, and every other metric passes through untouched to the exporters.

Secure by default: it listens on 127.0.0.1 unless told otherwise, supports TLS and mTLS per
protocol, bearer-token auth and a maximum request size; the token and certificate files are
read again when they change. A malformed, oversized or unauthenticated request gets the
proper gRPC status / HTTP code, is counted in ``otel_ofu.receiver.requests`` (attribute
``outcome``) and never stops the receiver.

A host whose GPUs arrive without tensor activity or the SM clock is said once at WARNING,
with the fix in dcgm-exporter or the Collector's dcgm receiver, and so is a host whose GPUs
arrive from a source that can give no OFU (an exporter of nvidia-smi's fields, the dcgm
receiver's names before 2024-09), with what to run instead (docs/otlp-receiver.md).

Overload: at most ``max_concurrent_requests`` requests are taken in at once (worked one at a
time, the others waiting with their bodies read), the memory limiter is checked per request,
and a request that would make an exporter's sending queue push accepted data out is not
taken. Each of these refuses with the status the OTLP spec names as retryable (gRPC
RESOURCE_EXHAUSTED with RetryInfo, HTTP 429 or 503 with Retry-After), before the body is
decoded, so the sender keeps the data and retries.
"""

from __future__ import annotations

import hmac
import json
import socket
import ssl
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from otel_ofu.core.metrics import GPU_METRICS, TRAINING_REPORT_METRICS, MetricInfo, register
from otel_ofu.core.model import Batch, GpuSample
from otel_ofu.gpu.missing_inputs import (
    SOURCES_WITHOUT_OFU,
    MissingInputs,
    how_to_enable,
    how_to_enable_dcgmreceiver,
)
from otel_ofu.otlp import join as otlp_join
from otel_ofu.pipeline.component import Consumer, Context, Factory, Receiver
from otel_ofu.pipeline.config import Duration, build_config, invalid, require, require_file
from otel_ofu.pipeline.endpoints import (
    ServerTlsConfig,
    WatchedFiles,
    canonical_ip,
    check_listen,
    grpc_peer_ip,
    is_loopback,
    listen_error,
    parse_endpoint,
    server_ssl_context,
)
from otel_ofu.pipeline.memory import MemoryLimiter, MemoryLimiterConfig

REQUESTS = register(MetricInfo(
    "otel_ofu.receiver.requests", "{request}", "sum",
    "OTLP export requests a push receiver got, by receiver, protocol (grpc, http) and outcome: accepted, "
    "malformed, too_large, unauthenticated, unsupported_media_type, not_found, method_not_allowed, "
    "length_required, tls_handshake, internal; refused under load (retryable): busy, memory_limited, "
    "queue_full."))
MEMORY = register(MetricInfo(
    "otel_ofu.process.memory.usage", "By", "gauge",
    "Resident memory of the otel-ofu process, as the otlp receiver's memory limiter last measured it."))
SAMPLES = register(MetricInfo(
    "otel_ofu.receiver.samples", "{window}", "sum",
    "GPU windows (TPA joined with SM clock, or either alone) a push receiver extracted from the metrics it received."))
DECODED = register(MetricInfo(
    "otel_ofu.receiver.decoded", "{point}", "sum",
    "Data points of the metrics listed in the otlp receiver's decode setting (another otel-ofu's per-GPU "
    "metrics, a job's reported MFU) that it handed to its pipelines as points."))

# Decoded by default: what an otel-ofu node agent sends (its per-GPU metrics, job identity on the
# resource) and what a training job reports about itself, so a jobs tier or a local jobs processor
# uses them as they are.
DEFAULT_DECODE = (*GPU_METRICS, *TRAINING_REPORT_METRICS)

DEFAULT_GRPC_ENDPOINT = "127.0.0.1:4317"
DEFAULT_HTTP_ENDPOINT = "127.0.0.1:4318"
DEFAULT_MAX_REQUEST_SIZE = 16 * 1024 * 1024
METRICS_PATH = "/v1/metrics"
GRPC_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"
# gRPC itself refuses messages above this multiple of max_request_size (RESOURCE_EXHAUSTED,
# before otel-ofu sees them, so those are not counted); between the two, we refuse and count.
GRPC_HARD_LIMIT_FACTOR = 4
HTTP_TIMEOUT_S = 30.0
DEFAULT_MAX_CONCURRENT_REQUESTS = 16
# What a refused sender is told to wait (RetryInfo / Retry-After): busy clears as soon as a
# request finishes; memory and a full queue need the exporters to send first.
RETRY_AFTER_BUSY_S = 1
RETRY_AFTER_MEMORY_S = 5

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class _Unset:
    """Marks a protocol key that is absent (disabled), as opposed to present but empty (defaults)."""

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


@dataclass
class ProtocolConfig:
    # Listen address, host:port (":PORT" = every interface); a non-loopback address without TLS
    # or a bearer token is warned about at start.
    endpoint: str = ""
    tls: ServerTlsConfig = field(default_factory=ServerTlsConfig)

    def validate(self) -> None:
        try:
            parse_endpoint(self.endpoint)
        except ValueError as exc:
            invalid("endpoint", str(exc))


@dataclass
class ProtocolsConfig:
    """The protocols to serve. As in the Collector, a protocol is on when its key is present
    (``grpc:`` alone means its defaults); without a ``protocols`` key both are on."""

    grpc: Any = UNSET  # OTLP/gRPC: opentelemetry.proto.collector.metrics.v1.MetricsService/Export
    # OTLP/HTTP: POST /v1/metrics, application/x-protobuf or application/json, optionally gzip or
    # deflate encoded.
    http: Any = UNSET

    def validate(self) -> None:
        require(self.grpc is not UNSET or self.http is not UNSET, "protocols",
                "enable at least one of grpc or http")
        for name, default in (("grpc", DEFAULT_GRPC_ENDPOINT), ("http", DEFAULT_HTTP_ENDPOINT)):
            value = getattr(self, name)
            if value is UNSET or isinstance(value, ProtocolConfig):
                continue
            require(value is None or isinstance(value, dict), name, f"expected a mapping, got {value!r}")
            data = dict(value or {})
            data.setdefault("endpoint", default)
            setattr(self, name, build_config(ProtocolConfig, data, prefix=f"{name}."))


def _both_protocols() -> ProtocolsConfig:
    protocols = ProtocolsConfig(grpc=None, http=None)
    protocols.validate()
    return protocols


@dataclass
class AuthConfig:
    """Bearer-token authentication; with no token set, none."""

    # Requests must carry Authorization: Bearer <token> (gRPC metadata authorization).
    bearer_token: str = ""
    bearer_token_file: str = ""  # a file holding the token, read again when it changes

    def validate(self) -> None:
        require(not (self.bearer_token and self.bearer_token_file), "bearer_token_file",
                "set either bearer_token or bearer_token_file, not both")
        if self.bearer_token_file:
            require_file("bearer_token_file", self.bearer_token_file)

    def token(self) -> str:
        if self.bearer_token_file:
            return Path(self.bearer_token_file).expanduser().read_text().strip()
        return self.bearer_token


class TokenSource:
    """The bearer token, read again from ``bearer_token_file`` when the file changes (rotation).

    A file that is briefly missing or empty mid-rotation keeps the previous token (logged).
    """

    def __init__(self, auth: AuthConfig, log: Any):
        self._auth, self._log = auth, log
        self._watch = WatchedFiles([auth.bearer_token_file]) if auth.bearer_token_file else None
        self.value = auth.token()

    def current(self) -> str:
        if self._watch is not None and self._watch.changed():
            try:
                token = self._auth.token()
            except OSError as exc:
                self._log.warning("cannot read the rotated bearer_token_file %s (%s); keeping the previous token",
                                  self._auth.bearer_token_file, exc.strerror)
                return self.value
            if token:
                if token != self.value:
                    self._log.info("bearer_token_file %s changed: using the new token", self._auth.bearer_token_file)
                self.value = token
            else:
                self._log.warning("the rotated bearer_token_file %s is empty; keeping the previous token",
                                  self._auth.bearer_token_file)
        return self.value


@dataclass
class OtlpReceiverConfig:
    protocols: ProtocolsConfig = field(default_factory=_both_protocols)
    auth: AuthConfig = field(default_factory=AuthConfig)
    max_request_size: int = DEFAULT_MAX_REQUEST_SIZE  # the largest request, in bytes after decompression
    # Forward every metric that is not a TPA/clock input, unchanged, to the exporters; false drops them.
    passthrough: bool = True
    # Metrics handed to the processors as points, as they came (not recomputed, forwarded once):
    # by default otel-ofu's own per-GPU metrics (another otel-ofu's output) and what jobs report
    # about themselves (docs/audit.md). Gauges and cumulative sums only.
    decode: list[str] = field(default_factory=lambda: list(DEFAULT_DECODE))
    # The TPA averaging window of the source (dcgm-exporter's collect interval -c), recorded on
    # each sample.
    window: Duration = field(default_factory=lambda: Duration(30))
    # How far apart a clock point and a TPA point of one GPU may be stamped and still be joined.
    join_tolerance: Duration = field(default_factory=lambda: Duration(5))
    # Requests taken in at once (worked one at a time, the rest wait); more are refused (retryable) until one ends.
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS
    memory_limiter: MemoryLimiterConfig = field(default_factory=MemoryLimiterConfig)

    def validate(self) -> None:
        require(self.max_request_size >= 1024, "max_request_size", "must be at least 1024 bytes")
        require(self.max_concurrent_requests >= 1, "max_concurrent_requests", "must be at least 1")
        require(self.window > 0, "window", "must be positive")
        require(self.join_tolerance >= 0, "join_tolerance", "must not be negative")
        for i, name in enumerate(self.decode):
            require(isinstance(name, str) and bool(name.strip()), f"decode[{i}]", "must name a metric")
            require(name not in otlp_join.INPUT_METRICS, f"decode[{i}]",
                    f"{name} is a DCGM input, joined into GPU samples; it cannot also be decoded as points")

    def grpc(self) -> ProtocolConfig | None:
        return self.protocols.grpc if isinstance(self.protocols.grpc, ProtocolConfig) else None

    def http(self) -> ProtocolConfig | None:
        return self.protocols.http if isinstance(self.protocols.http, ProtocolConfig) else None


class MalformedRequest(ValueError):
    """The bytes received are not an OTLP/protobuf ExportMetricsServiceRequest (protobuf's reason)."""


class RequestRefused(Exception):
    """A request otel-ofu will not take: ``outcome`` is the telemetry attribute value."""

    def __init__(self, outcome: str, message: str):
        self.outcome = outcome
        super().__init__(message)


@dataclass(frozen=True)
class Overload:
    """Why a request is refused for now, and what the sender is told (retryable)."""

    outcome: str  # busy | memory_limited | queue_full
    message: str
    http_status: int  # 429 (busy) or 503
    retry_after_s: int


class OtlpReceiver(Receiver):
    def __init__(self, config: OtlpReceiverConfig, context: Context, consumer: Consumer):
        super().__init__(config, context, consumer)
        self._token: TokenSource | None = None
        self._slots = threading.BoundedSemaphore(config.max_concurrent_requests)
        # One request's work (decode, join, processors, exporters) at a time; see accept.
        self._working = threading.Lock()
        self._missing = MissingInputs()  # by host: GPUs that arrive without an input OFU needs
        self._limiter = MemoryLimiter.from_config(config.memory_limiter)
        self._grpc_server: Any = None
        self._http_server: _HttpServer | None = None
        self._http_thread: threading.Thread | None = None
        self.grpc_port: int | None = None  # the bound ports (useful with port 0)
        self.http_port: int | None = None
        self._decode = frozenset(config.decode)
        self._undecodable_logged: set[str] = set()

    # --- shared request path --------------------------------------------------------------

    def count(self, protocol: str, outcome: str) -> None:
        self.context.telemetry.add(REQUESTS.name, 1, receiver=self.context.component_id, protocol=protocol,
                                   outcome=outcome)

    def authorized(self, header: str | None) -> bool:
        token = self._token.current() if self._token is not None else ""
        if not token:
            return True
        scheme, _, credentials = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), token.encode())

    def try_begin(self) -> Overload | None:
        """Take a request slot, or say why the request must be refused for now.

        On None the caller owns a slot and must :meth:`end` it. Checked before the body is
        decoded: a refused request costs almost nothing.
        """
        if not self._slots.acquire(blocking=False):
            return Overload("busy", f"otel-ofu is working on max_concurrent_requests "
                                    f"({self.config.max_concurrent_requests}) requests; retry later", 429,
                            RETRY_AFTER_BUSY_S)
        try:
            if self._limiter is not None:
                level = self._limiter.over_limit()
                self.context.telemetry.set(MEMORY.name, self._limiter.last_bytes)
                if level is not None:
                    limit = self._limiter.hard if level == "hard" else self._limiter.soft
                    self._slots.release()
                    return Overload("memory_limited", f"otel-ofu is above its {level} memory limit "
                                                      f"({limit // 2**20} MiB); retry later", 503,
                                    RETRY_AFTER_MEMORY_S)
            saturated = self.context.downstream_saturated()
            if saturated is not None:
                self._slots.release()
                return Overload("queue_full", f"the sending queue of exporter {saturated} is full; retry later",
                                503, RETRY_AFTER_MEMORY_S)
        except Exception:
            self._slots.release()
            raise
        return None

    def end(self) -> None:
        self._slots.release()

    def accept(self, request: Any, protocol: str, wire: bytes | None = None, *, peer: str | None = None) -> None:
        """Join, hand to the pipeline and count one ExportMetricsServiceRequest.

        ``wire``: the protobuf bytes it was parsed from, which the pass-through keeps. ``request``
        None: the request is ``wire``, parsed only where the join needs it (a request whose every
        ResourceMetrics is a known node's scrape is read from its bytes alone); raises
        :class:`MalformedRequest` when those bytes are not a request. ``peer``: the sender's IP
        address, carried on the batch (``Batch.peer``): attribution takes a training job's report
        only from the pod it names (docs/deploy.md#threat-model).

        Requests are worked one at a time (up to ``max_concurrent_requests`` are taken in and wait):
        the interpreter runs one thread's Python at a time, and the pipeline's processors and each
        exporter already take one batch at a time, so requests worked side by side only trade the
        interpreter back and forth, each through its own megabytes: a processing stage spent a few
        percent more CPU so (BENCHMARKS.md, section 11). gRPC and HTTP read the next requests, and
        gunzip them, meanwhile.
        """
        with self._working:
            self._accept(request, protocol, wire, peer)

    def _accept(self, request: Any, protocol: str, wire: bytes | None, peer: str | None) -> None:
        from google.protobuf.message import DecodeError

        settings = {"window_s": float(self.config.window), "tolerance_s": float(self.config.join_tolerance),
                    "passthrough": self.config.passthrough, "decode": self._decode}
        try:
            if request is None:
                found = otlp_join.split_wire(wire, **settings)  # type: ignore[arg-type]
            else:
                found = otlp_join.split(request, wire=wire, **settings)
        except DecodeError as exc:
            raise MalformedRequest(str(exc)) from None
        except Exception as exc:
            self.log.exception("failed on a received request")
            raise RequestRefused("internal", "otel-ofu failed on this request") from exc
        try:
            if found.samples or found.points or found.passthrough:
                self.consumer(Batch(samples=found.samples, points=found.points, passthrough=list(found.passthrough),
                                    peer=peer))
        except Exception as exc:
            self.log.exception("failed on a received request")
            raise RequestRefused("internal", "otel-ofu failed on this request") from exc
        if found.samples:
            self.context.telemetry.add(SAMPLES.name, len(found.samples), receiver=self.context.component_id)
            self._note_missing(found.samples)
        if found.noticed:
            self._note_sources_without_ofu(found.noticed)
        if found.points:
            self.context.telemetry.add(DECODED.name, len(found.points), receiver=self.context.component_id)
        for name in found.undecodable - self._undecodable_logged:
            self._undecodable_logged.add(name)
            self.log.warning("metric %s arrived as a histogram, summary or delta sum: passed through, not decoded "
                             "(only gauges and cumulative sums are read as points)", name)
        self.count(protocol, "accepted")

    def _note_missing(self, samples: list[GpuSample]) -> None:
        """Say once per host and input that its GPUs arrive without an input OFU needs, with the fix
        (:mod:`otel_ofu.gpu.missing_inputs`), and when it comes back. Checked on each request's
        GPUs: one pass over them when every GPU has both."""
        watched = self._missing.sources()  # hosts that lacked one: they may send it again
        hosts = {s.host for s in samples if s.tensor_active is None or s.sm_clock_mhz is None}
        if watched:
            hosts |= watched & {s.host for s in samples}
        if not hosts:
            return
        by_host: dict[str, list[GpuSample]] = {}
        for sample in samples:
            if sample.host in hosts:
                by_host.setdefault(sample.host, []).append(sample)
        for host, gpus in by_host.items():
            missing, back = self._missing.note(host, gpus)
            for name in missing:
                self.log.warning(
                    "the GPUs of host %s arrive without %s (in a request with %d of its GPUs, none has it): "
                    "they get no OFU (each window is counted in gpu_ofu_dropped_total{ofu_drop_reason=\"missing\"}). "
                    "Where a Collector scrapes dcgm-exporter, %s. Where it runs the dcgm receiver, %s.",
                    host or "(no host name)", name, len(gpus), how_to_enable(name), how_to_enable_dcgmreceiver(name))
            for name in back:
                self.log.info("the GPUs of host %s arrive with %s again", host or "(no host name)", name)

    def _note_sources_without_ofu(self, noticed: dict[tuple[str, str], str]) -> None:
        """Say once per host (else scrape target) and source that its GPUs arrive from a source that can give
        no OFU: what it is, what it lacks, what to run instead (missing_inputs.SOURCES_WITHOUT_OFU)."""
        for (host, target), kind in noticed.items():
            where = f"host {host}" if host else f"scrape target {target}" if target else "(no host name)"
            if not self._missing.first_time(where, kind):
                continue
            what, lacks, fix = SOURCES_WITHOUT_OFU[kind]
            self.log.warning(
                "the GPUs of %s arrive as %s: %s; they are passed through and get no OFU (where the same GPUs "
                "also arrive from a source with both inputs, their OFU comes from that). To get it, %s.",
                where, what, lacks, fix)

    def missing_fields(self) -> dict[str, list[str]]:
        """Host -> the required inputs its GPUs last arrived without."""
        return self._missing.fields()

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._token = TokenSource(self.config.auth, self.log)
        grpc_cfg, http_cfg = self.config.grpc(), self.config.http()
        try:
            if grpc_cfg is not None:
                self._start_grpc(grpc_cfg)
            if http_cfg is not None:
                self._start_http(http_cfg)
        except Exception:
            self.shutdown()
            raise
        # A push receiver is working once it listens: waiting for senders is not a fault.
        self.context.telemetry.receiver_state(self.context.component_id, "ok")

    def _warn_if_exposed(self, protocol: str, cfg: ProtocolConfig, host: str) -> None:
        if is_loopback(host):
            return
        has_token = bool(self._token and self._token.value)
        missing = [what for what, ok in (("TLS", cfg.tls.enabled), ("auth", has_token)) if not ok]
        if missing:
            self.log.warning("%s endpoint %s is reachable from other hosts without %s", protocol, cfg.endpoint,
                             " and ".join(missing))

    def _start_grpc(self, cfg: ProtocolConfig) -> None:
        from concurrent import futures

        import grpc

        limit = self.config.max_request_size * GRPC_HARD_LIMIT_FACTOR
        # A few workers beyond the request slots, so a refusal is answered while all slots work.
        workers = self.config.max_concurrent_requests + 4
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers,
                                                        thread_name_prefix=self.context.component_id),
                             options=[("grpc.max_receive_message_length", limit),
                                      ("grpc.so_reuseport", 0)])
        handler = grpc.method_handlers_generic_handler(GRPC_SERVICE, {
            "Export": grpc.unary_unary_rpc_method_handler(self._grpc_export),  # raw bytes in and out
        })
        server.add_generic_rpc_handlers((handler,))
        host, port = parse_endpoint(cfg.endpoint)
        address = f"[{host}]:{port}" if ":" in host else f"{host or '0.0.0.0'}:{port}"
        component = f"{self.context.component_id} receiver"
        try:  # gRPC's own failure says only "Failed to bind": ask the system first, for the reason
            check_listen(host, port)
        except OSError as exc:
            raise listen_error(component, cfg.endpoint, exc, "OTLP/gRPC") from None
        try:
            if cfg.tls.enabled:
                tls = _ServerTls(cfg.tls, self.log)
                # Asked at every handshake: new certificate files take effect without a restart.
                creds = grpc.dynamic_ssl_server_credentials(tls.grpc_configuration(), tls.grpc_fetch,
                                                            require_client_authentication=bool(cfg.tls.client_ca_file))
                bound = server.add_secure_port(address, creds)
            else:
                bound = server.add_insecure_port(address)
        except RuntimeError:  # grpcio raises where it used to return 0
            bound = 0
        if not bound:
            raise listen_error(component, cfg.endpoint, OSError("gRPC could not bind it"), "OTLP/gRPC")
        server.start()
        self._grpc_server, self.grpc_port = server, bound
        self._warn_if_exposed("gRPC", cfg, host)
        self.log.info("OTLP/gRPC listening on %s:%d%s", host, bound, " (TLS)" if cfg.tls.enabled else "")

    def _grpc_export(self, body: bytes, context: Any) -> bytes:
        import grpc

        metadata = dict(context.invocation_metadata())
        if not self.authorized(metadata.get("authorization")):
            self.count("grpc", "unauthenticated")
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        overload = self.try_begin()
        if overload is not None:
            self.count("grpc", overload.outcome)
            context.set_trailing_metadata((("grpc-status-details-bin", _retry_status(overload)),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, overload.message)
        try:
            return self._grpc_work(body, context)
        finally:
            self.end()

    def _grpc_work(self, body: bytes, context: Any) -> bytes:
        import grpc
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

        if len(body) > self.config.max_request_size:
            self.count("grpc", "too_large")
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"request of {len(body)} bytes exceeds max_request_size {self.config.max_request_size}")
        try:
            self.accept(None, "grpc", body, peer=grpc_peer_ip(context.peer()))
        except MalformedRequest as exc:
            self.count("grpc", "malformed")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not an ExportMetricsServiceRequest: {exc}")
        except RequestRefused as exc:
            self.count("grpc", exc.outcome)
            context.abort(grpc.StatusCode.INTERNAL, str(exc))
        return ExportMetricsServiceResponse().SerializeToString()

    def _start_http(self, cfg: ProtocolConfig) -> None:
        host, port = parse_endpoint(cfg.endpoint)
        context = _ServerTls(cfg.tls, self.log) if cfg.tls.enabled else None
        try:
            server = _HttpServer((host or "0.0.0.0", port), self, context)
        except OSError as exc:
            raise listen_error(f"{self.context.component_id} receiver", cfg.endpoint, exc, "OTLP/HTTP") from None
        self._http_server, self.http_port = server, server.server_address[1]
        self._http_thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                             name=f"{self.context.component_id}-http", daemon=True)
        self._http_thread.start()
        self._warn_if_exposed("HTTP", cfg, host)
        self.log.info("OTLP/HTTP listening on %s:%d%s", host, self.http_port, " (TLS)" if context else "")

    def shutdown(self) -> None:
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=2).wait(5)
            self._grpc_server = None
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
            self._http_server = None
        if self._http_thread is not None:
            self._http_thread.join(timeout=5)
            self._http_thread = None


def _read(path: str) -> bytes:
    return Path(path).expanduser().read_bytes()


def _retry_status(overload: Overload) -> bytes:
    """A google.rpc.Status carrying RetryInfo: the OTLP spec's retryable RESOURCE_EXHAUSTED."""
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=overload.retry_after_s)))
    return status_pb2.Status(code=8, message=overload.message, details=[detail]).SerializeToString()


class _ServerTls:
    """Server certificate, key and client CA, loaded again when one of the files changes.

    A rotation that leaves the files unreadable or mismatched (key written before the
    certificate) keeps serving the previous ones, logged, and is tried again on the next change.
    """

    def __init__(self, tls: ServerTlsConfig, log: Any):
        self.tls, self.log = tls, log
        self._watch = WatchedFiles([tls.cert_file, tls.key_file, tls.client_ca_file])
        self._context = self._ssl_context()

    def _ssl_context(self) -> ssl.SSLContext:
        return server_ssl_context(self.tls)

    def context(self) -> ssl.SSLContext:
        """The SSL context for the next HTTP handshake."""
        if self._watch.changed():
            try:
                self._context = self._ssl_context()
                self.log.info("TLS certificate files changed: serving %s", self.tls.cert_file)
            except (OSError, ssl.SSLError) as exc:
                self.log.error("cannot load the changed TLS files (%s); still serving the previous certificate", exc)
        return self._context

    def grpc_configuration(self) -> Any:
        import grpc

        return grpc.ssl_server_certificate_configuration(
            [(_read(self.tls.key_file), _read(self.tls.cert_file))],
            root_certificates=_read(self.tls.client_ca_file) if self.tls.client_ca_file else None)

    def grpc_fetch(self) -> Any:
        """gRPC's per-handshake question: a new configuration, or None to keep the current one."""
        if not self._watch.changed():
            return None
        try:
            configuration = self.grpc_configuration()
            self._ssl_context()  # the same check as for HTTP: key and certificate must match
        except (OSError, ssl.SSLError) as exc:
            self.log.error("cannot load the changed TLS files (%s); still serving the previous certificate", exc)
            return None
        self.log.info("TLS certificate files changed: serving %s (gRPC)", self.tls.cert_file)
        return configuration


# --- HTTP ------------------------------------------------------------------------------------

class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], receiver: OtlpReceiver, tls: _ServerTls | None):
        self.receiver = receiver
        self.tls = tls
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _HttpHandler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake runs here, on the connection's own thread, so a slow or failing
        # client never blocks the accept loop.
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        try:
            request.settimeout(HTTP_TIMEOUT_S)
            wrapped = self.tls.context().wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            self.receiver.count("http", "tls_handshake")
            self.receiver.log.info("TLS handshake with %s failed: %s", client_address[0], exc)
            return
        try:
            super().finish_request(wrapped, client_address)
        finally:
            try:
                wrapped.close()
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.receiver.log.debug("connection from %s ended with an error", client_address, exc_info=True)


_ENCODINGS = ("", "identity", "gzip", "deflate")


class _HttpHandler(BaseHTTPRequestHandler):
    server: _HttpServer
    protocol_version = "HTTP/1.1"
    # The status line, headers and body go out in separate writes: with Nagle's algorithm the
    # body waits for the client's delayed ACK, 40 ms per request on Linux (found fuzzing).
    disable_nagle_algorithm = True
    timeout = HTTP_TIMEOUT_S
    server_version = "otel-ofu"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        self.server.receiver.log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:  # http.server names handlers do_<METHOD>
        if self.path.split("?")[0] == METRICS_PATH:
            self._refuse(405, "method_not_allowed", f"POST OTLP metrics to {METRICS_PATH}", PROTOBUF, {"Allow": "POST"})
        else:
            self._refuse(404, "not_found", f"OTLP metrics go to {METRICS_PATH}", PROTOBUF)

    do_PUT = do_DELETE = do_PATCH = do_GET

    def do_POST(self) -> None:
        receiver = self.server.receiver
        path = self.path.split("?")[0]
        media = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        reply_as = JSON if media == JSON else PROTOBUF
        if path != METRICS_PATH:
            return self._refuse(404, "not_found", f"no such path {path}; OTLP metrics go to {METRICS_PATH}", reply_as)
        if not receiver.authorized(self.headers.get("Authorization")):
            return self._refuse(401, "unauthenticated", "missing or wrong bearer token", reply_as,
                                {"WWW-Authenticate": 'Bearer realm="otel-ofu"'})
        if media not in (PROTOBUF, JSON):
            return self._refuse(415, "unsupported_media_type",
                                f"Content-Type {media or '(none)'} is not supported; use {PROTOBUF} or {JSON}",
                                reply_as)
        encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
        if encoding not in _ENCODINGS:
            return self._refuse(415, "unsupported_media_type",
                                f"Content-Encoding {encoding} is not supported (gzip, deflate or none)", reply_as)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked" or self.headers.get("Content-Length") is None:
            return self._refuse(411, "length_required", "a Content-Length is required", reply_as)
        try:
            length = int(self.headers["Content-Length"])
        except ValueError:
            return self._refuse(400, "malformed", "Content-Length is not a number", reply_as)
        limit = receiver.config.max_request_size
        if length < 0:
            return self._refuse(400, "malformed", "negative Content-Length", reply_as)
        if length > limit:
            return self._refuse(413, "too_large", f"request of {length} bytes exceeds max_request_size {limit}",
                                reply_as)
        overload = receiver.try_begin()
        if overload is not None:
            # Read and discard the body (in small pieces, nothing kept): the sender gets a clean
            # answer on a connection it can reuse, not a reset while it is still writing.
            drained = self._discard(length)
            return self._refuse(overload.http_status, overload.outcome, overload.message, reply_as,
                                {"Retry-After": str(overload.retry_after_s)}, body_read=drained)
        try:
            return self._work(length, encoding, media, reply_as)
        finally:
            receiver.end()

    def _discard(self, length: int) -> bool:
        remaining = length
        while remaining > 0:
            chunk = self.rfile.read(min(remaining, 65536))
            if not chunk:
                return False
            remaining -= len(chunk)
        return True

    def _work(self, length: int, encoding: str, media: str, reply_as: str) -> None:
        receiver = self.server.receiver
        limit = receiver.config.max_request_size
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            receiver.count("http", "malformed")
            return None
        try:
            body = _decompress(body, encoding, limit)
        except RequestRefused as exc:
            return self._refuse(413 if exc.outcome == "too_large" else 400, exc.outcome, str(exc), reply_as,
                                body_read=True)
        try:
            peer = canonical_ip(self.client_address[0])
            if media == PROTOBUF:  # parsed where the join needs it (OtlpReceiver.accept)
                receiver.accept(None, "http", body, peer=peer)
            else:
                receiver.accept(_decode(body, media), "http", peer=peer)
        except MalformedRequest as exc:
            return self._refuse(400, "malformed", f"not an OTLP/protobuf ExportMetricsServiceRequest: {exc}",
                                reply_as, body_read=True)
        except ValueError as exc:
            return self._refuse(400, "malformed", str(exc), reply_as, body_read=True)
        except RequestRefused as exc:
            return self._refuse(500, exc.outcome, str(exc), reply_as, body_read=True)
        self._send(200, _response_body(reply_as), reply_as)
        return None

    def _refuse(self, code: int, outcome: str, message: str, media: str, extra: dict[str, str] | None = None,
                body_read: bool = False) -> None:
        self.server.receiver.count("http", outcome)
        if not body_read:
            self.close_connection = True  # the unread body must not be taken for the next request
        self._send(code, _status_body(code, message, media), media, extra)

    def _send(self, code: int, body: bytes, media: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Inflate gzip/deflate bodies, refusing to produce more than ``limit`` bytes (zip bombs)."""
    if encoding in ("", "identity"):
        return body
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise RequestRefused("malformed", f"body is not valid {encoding}: {exc}") from None
    if len(out) > limit:
        raise RequestRefused("too_large", f"decompressed request exceeds max_request_size {limit}")
    if not inflater.eof:
        raise RequestRefused("malformed", f"truncated {encoding} body")
    return out


def _decode(body: bytes, media: str) -> Any:
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    request = ExportMetricsServiceRequest()
    if media == JSON:
        try:
            json_format.Parse(body.decode("utf-8"), request, ignore_unknown_fields=True)
        except (json_format.ParseError, UnicodeDecodeError, RecursionError) as exc:
            raise ValueError(f"not an OTLP/JSON ExportMetricsServiceRequest: {exc}") from None
        return request
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise ValueError(f"not an OTLP/protobuf ExportMetricsServiceRequest: {exc}") from None
    return request


def _response_body(media: str) -> bytes:
    if media == JSON:
        return b"{}"
    return b""  # an empty ExportMetricsServiceResponse


def _status_body(code: int, message: str, media: str) -> bytes:
    """The OTLP/HTTP error body: a google.rpc.Status in the request's encoding."""
    grpc_code = {400: 3, 401: 16, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3, 429: 8, 500: 13, 503: 14}.get(code, 2)
    if media == JSON:
        return json.dumps({"code": grpc_code, "message": message}).encode()
    from google.rpc import status_pb2

    return status_pb2.Status(code=grpc_code, message=message).SerializeToString()


FACTORY = Factory("otlp", OtlpReceiverConfig, OtlpReceiver,
                  "OTLP metrics over gRPC and HTTP; joins DCGM TPA and SM clock into GPU samples", output="any")
