"""One OTLP send attempt over gRPC or HTTP, classified as sent, retryable or permanent.

The SDK's OTLPMetricExporter retries inside ``export()`` and reports only SUCCESS/FAILURE,
so the status code that decides between retrying and dropping never reaches the caller.
These transports send the already-serialized request once and classify the answer the
way the Collector's otlp exporters do; :mod:`otel_ofu.delivery` does the retrying.

- gRPC retryable: CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, UNAVAILABLE,
  DATA_LOSS; RESOURCE_EXHAUSTED only when the server sent RetryInfo (whose delay is honoured).
  Everything else (INVALID_ARGUMENT, UNAUTHENTICATED, UNIMPLEMENTED, ...) is permanent;
  RESOURCE_EXHAUSTED without RetryInfo is how gRPC refuses a message over its size limit, so
  it is marked ``too_large`` and the delivery loop splits the batch.
- HTTP retryable: 429, 502, 503, 504 (honouring Retry-After) and connection errors or
  timeouts; any other non-2xx status is permanent (413 marked ``too_large``).
- A refusal that names samples (HTTP 400 or gRPC INVALID_ARGUMENT saying ``duplicate sample for
  timestamp``, ``out of order sample``, ``too old sample`` or ``out of bounds``: Prometheus'
  storage errors, which its OTLP handler answers for the whole request, storing none of it) is
  marked with a :class:`~otel_ofu.delivery.retry.SampleRefusal`, and the delivery loop splits
  the request to set those samples apart.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import threading
import time
from email.utils import parsedate_to_datetime
from typing import Any

from otel_ofu.delivery import Item, SendResult
from otel_ofu.delivery.retry import DUPLICATE, OUT_OF_BOUNDS, OUT_OF_ORDER, TOO_OLD, SampleRefusal
from otel_ofu.otlp.exporter_config import Settings
from otel_ofu.pipeline.endpoints import WatchedFiles
from otel_ofu.pipeline.redact import redact_url, redact_urls

log = logging.getLogger("otel_ofu.otlp.transport")

METHODS = {
    "metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    "logs": "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
}
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
# The Collector's gzip level (configcompression's default: zlib's 6). gzip.compress's default, 9,
# costs about 1.5x the CPU for about 10 % fewer bytes on a dcgm-exporter batch (benchmarks/stage.py).
GZIP_LEVEL = 6
_RETRYABLE_GRPC_NAMES = ("CANCELLED", "DEADLINE_EXCEEDED", "ABORTED", "OUT_OF_RANGE", "UNAVAILABLE", "DATA_LOSS")
# Prometheus' storage errors (storage/interface.go, storage/errors.go), as its OTLP handler answers them
# (storage/remote/write_otlp_handler.go: HTTP 400, the errors of each metric joined by newlines).
_SAMPLE_ERRORS = (("duplicate sample for timestamp", DUPLICATE), ("out of order sample", OUT_OF_ORDER),
                  ("too old sample", TOO_OLD), ("out of bounds", OUT_OF_BOUNDS))
_DUPLICATE_AT = re.compile(r"duplicate sample for timestamp (-?\d+)")


def one_line(message: str, limit: int = 300) -> str:
    """A backend's message of several lines (an error per metric) as one, each different line once."""
    lines = dict.fromkeys(line.strip() for line in message.splitlines() if line.strip())
    text = "; ".join(lines)
    return text if len(text) <= limit else text[:limit] + "..."


def sample_refusal(message: str) -> SampleRefusal | None:
    """What a refusal's message says about samples (None: it names none), and the times a duplicate names."""
    lowered = message.lower()
    kinds = frozenset(kind for text, kind in _SAMPLE_ERRORS if text in lowered)
    if not kinds:
        return None
    return SampleRefusal(kinds, frozenset(int(t) for t in _DUPLICATE_AT.findall(lowered)))


def _user_agent() -> str:
    from opentelemetry.exporter.otlp.proto.grpc.version import __version__ as sdk_version

    from otel_ofu import __version__

    return f"otel-ofu/{__version__} OTel-OTLP-Exporter-Python/{sdk_version}"


def _response_types() -> dict[str, Any]:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

    return {"metrics": ExportMetricsServiceResponse, "logs": ExportLogsServiceResponse}


def _rejected(signal: str, response: Any) -> tuple[int, str]:
    """Items refused in a partial success, and the backend's message."""
    if not response.HasField("partial_success"):
        return 0, ""
    ps = response.partial_success
    count = ps.rejected_data_points if signal == "metrics" else ps.rejected_log_records
    return int(count), ps.error_message


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


class _Credentials:
    """The TLS files and bearer token file of an exporter, read again when they are rotated.

    ``refresh()`` is called before each send and says whether the transport must reconnect
    (new certificates apply to new connections). A rotation caught half-done (an unreadable or
    empty token file) keeps the previous credentials, logged, until the next change.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self._watch = WatchedFiles([p for p in (settings.ca_file, settings.cert_file, settings.key_file,
                                                settings.bearer_token_file) if p])
        self.token = self._read_token() if settings.bearer_token_file else None

    def _read_token(self) -> str:
        with open(str(self.settings.bearer_token_file), encoding="utf-8") as handle:
            return handle.read().strip()

    def headers(self) -> dict[str, str]:
        headers = dict(self.settings.headers)
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        return headers

    def refresh(self) -> bool:
        if not self._watch.changed():
            return False
        if self.settings.bearer_token_file:
            try:
                token = self._read_token()
            except OSError as exc:
                log.warning("cannot read the rotated bearer_token_file %s (%s); keeping the previous token",
                            self.settings.bearer_token_file, exc.strerror)
            else:
                if token:
                    self.token = token
        log.info("credential files changed (%s): reconnecting with them", ", ".join(self._watch.paths))
        return True


class GrpcTransport:
    """A grpcio channel with the configured credentials, compression and metadata."""

    def __init__(self, settings: Settings):
        import grpc

        self._grpc = grpc
        self.settings = settings
        self._credentials = _Credentials(settings)
        self._lock = threading.Lock()
        self._retryable = frozenset(getattr(grpc.StatusCode, name) for name in _RETRYABLE_GRPC_NAMES)
        self._connect()

    def _connect(self) -> None:
        grpc, settings = self._grpc, self.settings
        # A short reconnect backoff: while the channel waits to reconnect, calls fail fast
        # with UNAVAILABLE, so a long one would outlast the backend's outage.
        options = [("grpc.primary_user_agent", _user_agent()), ("grpc.initial_reconnect_backoff_ms", 1000),
                   ("grpc.min_reconnect_backoff_ms", 1000), ("grpc.max_reconnect_backoff_ms", 5000)]
        compression = grpc.Compression.Gzip if settings.compression == "gzip" else grpc.Compression.NoCompression
        target = settings.targets["metrics"]
        if settings.insecure:
            channel = grpc.insecure_channel(target, options=options, compression=compression)
        else:
            credentials = grpc.ssl_channel_credentials(root_certificates=_read(settings.ca_file),
                                                       private_key=_read(settings.key_file),
                                                       certificate_chain=_read(settings.cert_file))
            channel = grpc.secure_channel(target, credentials, options=options, compression=compression)
        responses = _response_types()
        # request_serializer=None: the payload is already a serialized request.
        self._calls = {signal: channel.unary_unary(method, request_serializer=None,
                                                   response_deserializer=responses[signal].FromString)
                       for signal, method in METHODS.items()}
        self._metadata = tuple((k.lower(), v) for k, v in self._credentials.headers().items())
        # The previous channel is not closed: sends still on it finish there (closing would
        # cancel them, and a cancelled send that the backend got would be sent twice).
        self._channel = channel

    def send(self, item: Item, timeout: float | None = None) -> SendResult:
        if self._credentials.refresh():
            with self._lock:
                try:
                    self._connect()
                except OSError as exc:
                    log.error("cannot read the rotated TLS files (%s); keeping the previous connection", exc)
        calls, metadata = self._calls, self._metadata
        try:
            response = calls[item.signal](item.payload, metadata=metadata,
                                          timeout=self.settings.timeout if timeout is None else timeout)
        except self._grpc.RpcError as error:
            result = self.classify(error)
            if item.signal == "logs" and error.code() == self._grpc.StatusCode.UNIMPLEMENTED:
                result = SendResult.permanent(result.reason, (
                    f"{result.detail}. The backend at {self.settings.targets['logs']} takes no OTLP logs (a Collector "
                    "without a logs pipeline): the job events (ofu.job.start, ofu.job.end, findings) cannot go there. "
                    "Give it a logs pipeline, or set this exporter's events: false to send metrics only "
                    "(docs/collector.md)"))
            return result
        rejected, message = _rejected(item.signal, response)
        return SendResult.success(rejected, message)

    def classify(self, error: Any) -> SendResult:
        code = error.code()
        name = code.name if code is not None else "UNKNOWN"
        retry_after = grpc_retry_delay(error.trailing_metadata() or ())
        exhausted = code == self._grpc.StatusCode.RESOURCE_EXHAUSTED
        if code in self._retryable or (exhausted and retry_after is not None):
            return SendResult.retry(name, error.details() or "", retry_after)
        detail = error.details() or ""
        refusal = sample_refusal(detail) if code == self._grpc.StatusCode.INVALID_ARGUMENT else None
        return SendResult.permanent(name, one_line(detail) if refusal else detail, too_large=exhausted,
                                    refusal=refusal)

    def close(self) -> None:
        self._channel.close()


def grpc_retry_delay(trailing_metadata: Any) -> float | None:
    """The RetryInfo delay a server attached, in seconds; None when it sent none.

    Read from the standard ``grpc-status-details-bin`` (a google.rpc.Status whose details hold
    a RetryInfo), and from ``google.rpc.retryinfo-bin``, which the Python SDK reads.
    """
    from google.rpc import error_details_pb2, status_pb2

    for key, value in trailing_metadata:
        try:
            if key == "grpc-status-details-bin":
                for detail in status_pb2.Status.FromString(value).details:
                    if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                        info = error_details_pb2.RetryInfo()
                        detail.Unpack(info)
                        return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
            elif key == "google.rpc.retryinfo-bin":
                info = error_details_pb2.RetryInfo.FromString(value)
                return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
        except Exception:  # a malformed trailer is no retry info
            continue
    return None


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds from now: delay-seconds or an HTTP-date (RFC 9110); None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(when.timestamp() - (time.time() if now is None else now), 0.0)
    return max(seconds, 0.0) if seconds == seconds and seconds != float("inf") else None


class HttpTransport:
    """OTLP/HTTP protobuf POSTs with a requests Session (TLS, client cert, headers, gzip)."""

    def __init__(self, settings: Settings):
        import requests

        self._requests = requests
        self.settings = settings
        self._credentials = _Credentials(settings)
        # Passed with each request, not set on the session: requests lets REQUESTS_CA_BUNDLE /
        # CURL_CA_BUNDLE override a session's verify, which would ignore tls.ca_file.
        self._verify: bool | str = False if settings.insecure_skip_verify else (settings.ca_file or True)
        self._cert = (settings.cert_file, settings.key_file) if settings.cert_file else None
        self._responses = _response_types()
        self._connect()

    def _connect(self) -> None:
        """A new session: its connections load the certificate files afresh (the old one's stay pooled)."""
        self._session = self._requests.Session()
        headers = {"Content-Type": "application/x-protobuf", "User-Agent": _user_agent(),
                   **self._credentials.headers()}
        if self.settings.compression == "gzip":
            headers["Content-Encoding"] = "gzip"
        self._headers = headers

    def send(self, item: Item, timeout: float | None = None) -> SendResult:
        if self._credentials.refresh():
            self._connect()
        body = gzip.compress(item.payload, compresslevel=GZIP_LEVEL, mtime=0) \
            if self.settings.compression == "gzip" else item.payload
        url = self.settings.targets[item.signal]
        try:
            response = self._session.post(url, data=body, headers=self._headers,
                                          timeout=self.settings.timeout if timeout is None else timeout,
                                          verify=self._verify, cert=self._cert, allow_redirects=False)
        except self._requests.exceptions.RequestException as error:
            # Connection refused/reset, timeouts, TLS handshake: retryable, as in the Collector.
            return SendResult.retry(type(error).__name__, redact_urls(str(error)))
        status = response.status_code
        if 200 <= status < 300:
            rejected, message = 0, ""
            if response.content and "protobuf" in response.headers.get("Content-Type", ""):
                try:
                    rejected, message = _rejected(item.signal, self._responses[item.signal].FromString(
                        response.content))
                except Exception:  # a 2xx with an unreadable body is still a success
                    pass
            return SendResult.success(rejected, message)
        detail = _http_error_message(response)
        if item.signal == "logs" and _takes_no_logs(status, detail):
            detail = (f"{detail}. The backend takes no OTLP logs at {redact_url(url)}: the job events (ofu.job.start, "
                      "ofu.job.end, findings) cannot go there. Set this exporter's logs_endpoint to a logs backend's "
                      "OTLP URL (Loki, VictoriaLogs), or logs_endpoint: none to send metrics only (docs/backends.md)")
        if status in RETRYABLE_HTTP:
            return SendResult.retry(f"http_{status}", detail, parse_retry_after(response.headers.get("Retry-After")))
        refusal = None
        if status == 400:
            message = _full_message(response)
            refusal = sample_refusal(message)
            if refusal is not None:  # one error per metric: each said once
                detail = f"{response.reason}: {one_line(message)}"
        return SendResult.permanent(f"http_{status}", detail, too_large=status == 413, refusal=refusal)

    def close(self) -> None:
        self._session.close()


def _takes_no_logs(status: int, detail: str) -> bool:
    """A refusal that says there is no OTLP logs endpoint at the URL, not that the logs were bad.

    404/405: no such path (Prometheus 3's /api/v1/otlp/v1/logs answers 404); VictoriaMetrics'
    /opentelemetry/v1/logs answers 400 "unsupported path requested".
    """
    return status in (404, 405) or (status == 400 and "unsupported path" in detail.lower())


def _full_message(response: Any) -> str:
    """A refusal's whole text (a google.rpc.Status message, or the body): what sample_refusal reads."""
    if "protobuf" in response.headers.get("Content-Type", ""):
        try:
            from google.rpc import status_pb2

            return status_pb2.Status.FromString(response.content).message
        except Exception:
            return ""
    return response.text if response.content else ""


def _http_error_message(response: Any) -> str:
    """The backend's reason: a google.rpc.Status body (OTLP/HTTP's error format) or the text."""
    content_type = response.headers.get("Content-Type", "")
    try:
        if "protobuf" in content_type:
            from google.rpc import status_pb2

            return f"{response.reason}: {status_pb2.Status.FromString(response.content).message}"
        if "json" in content_type:
            return f"{response.reason}: {json.loads(response.content).get('message', response.text[:200])}"
    except Exception:
        pass
    text = response.text.strip()[:200] if response.content else ""
    return f"{response.reason}: {text}" if text else str(response.reason)
