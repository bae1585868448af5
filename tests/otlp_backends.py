"""Real OTLP backends for tests: a gRPC server and an HTTP server that record what they get.

Both can be told to fail (``fail(...)``) with a gRPC status or HTTP status, for a number of
requests or until told otherwise, and can be stopped and started again on the same port to
play a backend outage. Failed requests are not recorded as received: a client that got an
error must send again, and a duplicate would show in :meth:`Backend.point_counts`.
"""

from __future__ import annotations

import gzip
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter
from concurrent import futures
from dataclasses import dataclass
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

from otel_ofu.core.model import MetricPoint, attrs
from otel_ofu.otlp import codec as otlp

T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
GPU_METRICS = ("gpu.ofu", "gpu.ofu.raw", "gpu.tensor.activity", "gpu.sm.clock.frequency", "gpu.power.usage")


def gpu_points(gpus: int = 4, windows: int = 3, t0: int = T0, host: str = "node-1") -> list[MetricPoint]:
    """Several GPUs (one resource each), five metrics each, one point per window."""
    points = []
    for w in range(windows):
        for g in range(gpus):
            resource = attrs({"host.name": host, "hw.id": f"GPU-{host}-{g}", "gpu.index": str(g)})
            for i, name in enumerate(GPU_METRICS):
                points.append(MetricPoint(name, 0.1 * i + g + w, t0 + w * 10_000_000_000, resource,
                                          attrs({"ofu.job.id": f"job-{g % 2}"})))
    return points


def triples(points) -> Counter:
    """(resource, name, time, attributes) of each point, counted."""
    return Counter((p.resource, p.name, p.time_unix_nano, p.attributes) for p in points)


@dataclass
class Failure:
    grpc_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    http_status: int = 503
    message: str = "backend says no"
    retry_after: float | None = None  # gRPC RetryInfo / HTTP Retry-After
    times: int | None = None  # None: until cleared


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_certs(directory) -> dict[str, str]:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate (openssl CLI)."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=otel-ofu test CA")
    extensions = {"server": ["subjectAltName=IP:127.0.0.1,DNS:localhost", "extendedKeyUsage=serverAuth"],
                  "client": ["extendedKeyUsage=clientAuth"]}
    for name, lines in extensions.items():
        (directory / f"{name}.ext").write_text("\n".join(lines) + "\n")
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
            f"/CN=otel-ofu test {name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
            f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return {name: str(directory / name) for name in ("ca.pem", "server.pem", "server.key", "client.pem",
                                                      "client.key")}


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.05) -> bool:
    """Poll ``predicate`` with a generous deadline (no timing assertions: just don't hang)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def go_g(value: float) -> str:
    """A float as Go's ``%g`` writes it (strconv/ftoa.go): its shortest digits, with an exponent when that is
    below -4 or at least 6 (``0.5``, ``123456``, ``1.234567e+06``, ``1e-05``)."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple)) or "0"
    if digits == "0":
        return "-0" if sign else "0"
    point = len(digits) + int(exponent)  # where the decimal point sits among the digits
    minus = "-" if sign else ""
    if point - 1 < -4 or point - 1 >= 6:
        e = point - 1
        return f"{minus}{digits[0]}{'.' + digits[1:] if len(digits) > 1 else ''}e{'-' if e < 0 else '+'}{abs(e):02d}"
    if point <= 0:
        return f"{minus}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{minus}{digits}{'0' * (point - len(digits))}"
    return f"{minus}{digits[:point]}.{digits[point:]}"


class PrometheusTsdb:
    """What Prometheus 3's OTLP handler answers (storage/remote/write_otlp_handler.go, tsdb/head_append.go),
    for the delivery tests that cannot run the real one: per series (resource, metric, point attributes) the
    samples stored, by millisecond. A request whose sample is refused is refused whole and nothing of it is
    stored; the message holds each metric's first error, joined by newlines (errors.Join):

    - at the series' newest time with other bits: ``duplicate sample for timestamp T; overrides not
      allowed: existing A, new value B`` (the same bits: a duplicate, taken and ignored);
    - older than the series' newest, or than half a block (1 h) behind the database's newest time:
      without an out-of-order window ``out of order sample`` (``out of bounds`` for the latter); with
      one, taken when within the window of the database's newest time (another value at a time held
      is dropped silently, as the out-of-order head does), else ``too old sample``.
    """

    def __init__(self, out_of_order_window_ms: int = 0):
        self.window = out_of_order_window_ms
        self.samples: dict[tuple, dict[int, float]] = {}

    def refuse(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> str | None:
        """The error message for a request that is refused (nothing stored); None: stored."""
        head_max = max((t for series in self.samples.values() for t in series), default=None)
        # The oldest time the in-order head takes: half a block (2 h) behind the newest (appendableMinValidTime).
        min_valid = head_max - 3_600_000 if head_max is not None else None
        staged: dict[tuple, dict[int, float]] = {}
        errors = []
        for point_group in _metric_groups(request):
            for key, t, value in point_group:
                stored = {**self.samples.get(key, {}), **staged.get(key, {})}
                newest = max(stored, default=None)
                error = None
                in_order = min_valid is None or t >= min_valid
                if in_order and (newest is None or t > newest):
                    staged.setdefault(key, {})[t] = value
                elif in_order and t == newest:
                    if stored[t].hex() != value.hex():
                        error = (f"duplicate sample for timestamp {t}; overrides not allowed: existing "
                                 f"{go_g(stored[t])}, new value {go_g(value)}")
                elif self.window and head_max is not None and t >= head_max - self.window:
                    if t not in stored:
                        staged.setdefault(key, {})[t] = value
                elif self.window:
                    error = "too old sample"
                else:
                    error = "out of bounds" if not in_order else "out of order sample"
                if error is not None:
                    errors.append(error)
                    break  # the rest of this metric's points are not appended
        if errors:
            return "\n".join(errors)
        for key, series in staged.items():
            self.samples.setdefault(key, {}).update(series)
        return None


def _metric_groups(request) -> list[list[tuple[tuple, int, float]]]:
    """Each metric's points as (series, millisecond, value), in the request's order."""
    groups = []
    for rm in request.resource_metrics:
        resource = tuple((a.key, otlp.from_any_value(a.value)) for a in rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                groups.append([((resource, metric.name, tuple((a.key, otlp.from_any_value(a.value))
                                                               for a in dp.attributes)),
                                dp.time_unix_nano // 1_000_000, dp.as_double)
                               for dp in getattr(metric, kind).data_points])
    return groups


class Backend:
    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.lock = threading.Lock()
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.logs: list[logs_service_pb2.ExportLogsServiceRequest] = []
        self.headers: list[dict[str, str]] = []
        self.attempts = 0
        self.failed = 0
        self.partial_reject = 0  # answer every success with a partial success rejecting this many
        self.tsdb: PrometheusTsdb | None = None  # refuse samples as Prometheus 3 does
        self.refused = 0  # requests refused for their samples
        self._failure: Failure | None = None

    def fail(self, failure: Failure | None) -> None:
        with self.lock:
            self._failure = failure

    def _next_failure(self) -> Failure | None:
        with self.lock:
            self.attempts += 1
            failure = self._failure
            if failure is None:
                return None
            self.failed += 1
            if failure.times is not None:
                failure.times -= 1
                if failure.times <= 0:
                    self._failure = None
            return failure

    def _refusal(self, kind: str, request) -> str | None:
        """With ``tsdb``: why Prometheus would refuse this metrics request (None: it stores it)."""
        if self.tsdb is None or kind != "metrics":
            return None
        with self.lock:
            message = self.tsdb.refuse(request)
            if message is not None:
                self.refused += 1
            return message

    def _record(self, kind: str, request, headers: dict[str, str]) -> None:
        with self.lock:
            (self.metrics if kind == "metrics" else self.logs).append(request)
            self.headers.append(headers)

    def point_counts(self) -> Counter:
        """How many times each (resource, name, time, attributes) arrived."""
        with self.lock:
            requests = list(self.metrics)
        return Counter((p.resource, p.name, p.time_unix_nano, p.attributes)
                       for r in requests for p in otlp.from_request(r))

    def events(self) -> list:
        with self.lock:
            requests = list(self.logs)
        return [e for r in requests for e in otlp.events_from_request(r)]


def _rpc_status(failure: Failure) -> bytes:
    status = status_pb2.Status(code=failure.grpc_code.value[0], message=failure.message)
    if failure.retry_after is not None:
        info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(
            seconds=int(failure.retry_after), nanos=int((failure.retry_after % 1) * 1e9)))
        detail = any_pb2.Any()
        detail.Pack(info)
        status.details.append(detail)
    return status.SerializeToString()


class GrpcBackend(Backend):
    """OTLP/gRPC metrics and logs services on 127.0.0.1 (plaintext, or TLS with ``credentials``)."""

    def __init__(self, port: int | None = None, credentials: grpc.ServerCredentials | None = None,
                 max_request_bytes: int | None = None, logs: bool = True):
        super().__init__(port)
        self.credentials = credentials
        self.logs_service = logs  # False: no logs service, as a Collector without a logs pipeline (UNIMPLEMENTED)
        self.max_request_bytes = max_request_bytes  # gRPC's own limit: larger requests get RESOURCE_EXHAUSTED
        self._server: grpc.Server | None = None

    def _handle(self, kind: str, request, context, response):
        failure = self._next_failure()
        if failure is not None:
            context.set_trailing_metadata((("grpc-status-details-bin", _rpc_status(failure)),))
            context.abort(failure.grpc_code, failure.message)
        refusal = self._refusal(kind, request)
        if refusal is not None:  # as a Collector's receiver passes on its exporter's permanent error
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Permanent error: {refusal}")
        self._record(kind, request, dict(context.invocation_metadata()))
        if self.partial_reject:
            field = "rejected_data_points" if kind == "metrics" else "rejected_log_records"
            response.partial_success.SetInParent()
            setattr(response.partial_success, field, self.partial_reject)
            response.partial_success.error_message = "some points were stale"
        return response

    def start(self) -> GrpcBackend:
        backend = self

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):  # noqa: N802 (generated name)
                return backend._handle("metrics", request, context, metrics_service_pb2.ExportMetricsServiceResponse())

        class Logs(logs_service_pb2_grpc.LogsServiceServicer):
            def Export(self, request, context):  # noqa: N802
                return backend._handle("logs", request, context, logs_service_pb2.ExportLogsServiceResponse())

        options = [("grpc.max_receive_message_length", self.max_request_bytes)] if self.max_request_bytes else []
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=options)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
        if self.logs_service:
            logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
        address = f"127.0.0.1:{self.port}"
        bound = (server.add_secure_port(address, self.credentials) if self.credentials
                 else server.add_insecure_port(address))
        assert bound == self.port, f"could not bind {address}"
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


class HttpBackend(Backend):
    """OTLP/HTTP protobuf on 127.0.0.1: POST /v1/metrics and /v1/logs (gzip understood)."""

    def __init__(self, port: int | None = None, tls: tuple[str, str] | None = None,
                 max_request_bytes: int | None = None):
        super().__init__(port)
        self.tls = tls  # (certificate chain file, key file): serve HTTPS
        self.max_request_bytes = max_request_bytes  # larger bodies (after gzip) get 413
        self.too_large = 0
        # Take this many metrics requests, then hold the answer to the last one until release(): the
        # sender is stuck in that send (a backend that stopped answering).
        self.hold_after: int | None = None
        self.released = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> HttpBackend:
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                kinds = {"/v1/metrics": ("metrics", metrics_service_pb2.ExportMetricsServiceRequest,
                                         metrics_service_pb2.ExportMetricsServiceResponse),
                         "/v1/logs": ("logs", logs_service_pb2.ExportLogsServiceRequest,
                                      logs_service_pb2.ExportLogsServiceResponse)}
                if self.path not in kinds:
                    return self._reply(404, status_pb2.Status(code=5, message="no such path").SerializeToString())
                kind, request_type, response_type = kinds[self.path]
                if backend.max_request_bytes is not None and len(body) > backend.max_request_bytes:
                    with backend.lock:
                        backend.too_large += 1
                    status = status_pb2.Status(code=8, message=f"{len(body)} bytes is too large")
                    return self._reply(413, status.SerializeToString())
                failure = backend._next_failure()
                if failure is not None:
                    extra = {"Retry-After": f"{failure.retry_after:g}"} if failure.retry_after is not None else {}
                    status = status_pb2.Status(code=3, message=failure.message).SerializeToString()
                    return self._reply(failure.http_status, status, extra)
                request = request_type.FromString(body)
                refusal = backend._refusal(kind, request)
                if refusal is not None:  # Go's http.Error: text/plain, the message and a newline
                    return self._reply(400, f"{refusal}\n".encode(), content_type="text/plain; charset=utf-8")
                backend._record(kind, request, headers)
                if kind == "metrics" and backend.hold_after is not None and len(backend.metrics) >= backend.hold_after:
                    backend.released.wait()
                response = response_type()
                if backend.partial_reject:
                    field = "rejected_data_points" if kind == "metrics" else "rejected_log_records"
                    setattr(response.partial_success, field, backend.partial_reject)
                    response.partial_success.error_message = "some points were stale"
                self._reply(200, response.SerializeToString())

            def _reply(self, status: int, body: bytes, extra: dict[str, str] | None = None,
                       content_type: str = "application/x-protobuf") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for key, value in (extra or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def release(self) -> None:
        """Answer the held request (and every one after it)."""
        self.hold_after = None
        self.released.set()

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
