"""The otlp receiver under more load than it can take.

Past a limit it refuses with the retryable status the OTLP spec names (gRPC RESOURCE_EXHAUSTED
with RetryInfo, HTTP 429/503 with Retry-After), before decoding, so the sender keeps the data
and retries; a real sender (otel-ofu's own otlp exporter here, the Collector in
benchmarks/overload.py) then delivers everything exactly once.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from otlp_backends import wait_until
from test_receiver_otlp import GPUS, T0, Live, grpc_export, http_post

from otel_ofu.core.model import Batch
from otel_ofu.otlp.transport import grpc_retry_delay
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.config import FieldError, build_config, parse_service_config
from otel_ofu.pipeline.memory import MIB, MemoryLimiter, MemoryLimiterConfig, process_rss_bytes
from otel_ofu.pipeline.service import Service
from otel_ofu.receivers.otlp import REQUESTS
from tests.otlp_shapes import dcgm_exporter_request

EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


def body(t0: int = T0) -> bytes:
    return dcgm_exporter_request(GPUS, t0).SerializeToString()


def grpc_refusal(target: str, payload: bytes) -> tuple[grpc.StatusCode, float | None]:
    with grpc.insecure_channel(target) as channel:
        try:
            channel.unary_unary(EXPORT)(payload, timeout=20)
        except grpc.RpcError as exc:
            return exc.code(), grpc_retry_delay(exc.trailing_metadata() or ())
    return grpc.StatusCode.OK, None


def http_refusal(port: int, payload: bytes) -> tuple[int, str | None]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("POST", "/v1/metrics", body=payload, headers={"Content-Type": "application/x-protobuf"})
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("Retry-After")
    finally:
        conn.close()


class Blocking(Live):
    """A live receiver whose pipeline holds each request until ``release`` is set."""

    def __init__(self, config: dict, hold_s: float = 0.0):
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        super().__init__(config)
        recorded = self.receiver.consumer

        def consumer(batch: Batch) -> None:
            self.entered.release()
            self.release.wait(60)
            time.sleep(hold_s)  # a pipeline that takes a while per request
            recorded(batch)

        self.receiver.consumer = consumer


def test_past_max_concurrent_requests_it_refuses_retryably_and_takes_the_next():
    item = Blocking({"max_concurrent_requests": 1})
    try:
        first = threading.Thread(target=grpc_export, args=(item.grpc_target, body()))
        first.start()
        assert item.entered.acquire(timeout=30)  # one request is being worked on
        code, delay = grpc_refusal(item.grpc_target, body(T0 + 1))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay == 1.0  # RetryInfo: retryable
        assert http_refusal(item.receiver.http_port, body(T0 + 2)) == (429, "1")
        item.release.set()
        first.join(30)
        assert grpc_export(item.grpc_target, body(T0 + 3))[0] == grpc.StatusCode.OK
        assert http_post(item.receiver.http_port, body(T0 + 4))[0] == 200
        outcomes = {(dict(a)["protocol"], dict(a)["outcome"]): v
                    for a, v in item.telemetry.counters(REQUESTS.name).items()}
        assert outcomes == {("grpc", "accepted"): 2, ("grpc", "busy"): 1, ("http", "busy"): 1, ("http", "accepted"): 1}
        assert len(item.batches) == 3  # the refused ones were not taken
    finally:
        item.release.set()
        item.receiver.shutdown()


def test_above_the_memory_limit_it_refuses_with_retry_info_and_503():
    rss_mib = process_rss_bytes() // MIB
    item = Live({"memory_limiter": {"limit_mib": max(rss_mib // 2, 2), "spike_limit_mib": 1}})
    try:
        code, delay = grpc_refusal(item.grpc_target, body())
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay == 5.0
        assert http_refusal(item.receiver.http_port, body()) == (503, "5")
        assert item.batches == []
        assert item.telemetry.gauge("otel_ofu.process.memory.usage") >= rss_mib // 2 * MIB
    finally:
        item.receiver.shutdown()


def test_memory_limiter_soft_and_hard_limits():
    used = [0]
    limiter = MemoryLimiter(soft_bytes=800, hard_bytes=1000, measure=lambda: used[0])
    assert limiter.over_limit() is None
    used[0] = 850
    assert limiter.over_limit() == "soft"
    used[0] = 1200
    assert limiter.over_limit() == "hard" and limiter.peak_bytes == 1200
    used[0] = 10
    assert limiter.over_limit() is None  # back below: taken again
    config = build_config(MemoryLimiterConfig, {"limit_percentage": 50, "spike_limit_percentage": 10})
    assert config.limits(total=1000) == (400, 500)
    assert build_config(MemoryLimiterConfig, {"limit_mib": 100}).limits() == (80 * MIB, 100 * MIB)  # spike 20 %
    with pytest.raises(FieldError, match="spike_limit_mib"):
        build_config(MemoryLimiterConfig, {"limit_mib": 100, "spike_limit_mib": 100})
    with pytest.raises(FieldError, match="not both"):
        build_config(MemoryLimiterConfig, {"limit_mib": 100, "limit_percentage": 50})


def _stage_config(port: int, sink: str, **queue) -> dict:
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"},
                                             "http": {"endpoint": "127.0.0.1:0"}}}},
        "processors": {"ofu": {}},
        "exporters": {"otlp": {"endpoint": sink, "tls": {"insecure": True}, "compression": "none",
                               "retry_on_failure": {"initial_interval": "50ms", "max_interval": "200ms"},
                               "sending_queue": {"num_consumers": 1, **queue}}},
        "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["ofu"], "exporters": ["otlp"]}}},
    }


def test_a_full_sending_queue_downstream_refuses_instead_of_evicting(tmp_path):
    """Before: the exporter dropped its oldest accepted batches to make room (lost, though accepted)."""
    from otlp_backends import GrpcBackend

    from otel_ofu.otlp import codec as otlp

    backend = GrpcBackend()  # down
    service = Service(parse_service_config(_stage_config(backend.port, backend.endpoint, queue_size=10),
                                           "t", registry.factories()))
    service.start()
    accepted: list[bytes] = []
    try:
        receiver = service.receivers["otlp"]
        refused = 0
        for n in range(20):
            payload = body(T0 + n * 10**10)
            code, delay = grpc_refusal(f"127.0.0.1:{receiver.grpc_port}", payload)
            if code == grpc.StatusCode.OK:
                accepted.append(payload)
            else:
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay == 5.0
                refused += 1
        assert http_refusal(receiver.http_port, body(T0 + 99 * 10**10)) == (503, "5")
        assert len(accepted) == 9 and refused == 11  # 90 % of queue_size 10
        assert not service.telemetry.counters("otel_ofu.exporter.dropped")
        backend.start()
        exporter = service.exporters["otlp"].exporter
        assert wait_until(lambda: len(exporter.delivery.queue) == 0)
    finally:
        service.shutdown()
        backend.stop()
    # every GPU window accepted arrived, once (as the OFU computed from it)
    raw = [p for r in backend.metrics for p in otlp.from_request(r) if p.name == "gpu.ofu.raw"]
    assert len({p.time_unix_nano for p in raw}) == 9 and len(raw) == 9 * len(GPUS)
    assert all(n == 1 for n in backend.point_counts().values())


def received_points(batches: list[Batch]):
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from otlp_backends import triples

    from otel_ofu.otlp import codec as otlp

    return triples([p for b in batches for p in otlp.from_request(
        ExportMetricsServiceRequest(resource_metrics=otlp.passthrough_messages(b.passthrough)))]
                   + [p for b in batches for p in b.points])  # what the receiver decodes comes as points


def test_otel_ofu_exporter_retries_a_busy_receiver_and_delivers_everything_once():
    """A real OTLP sender against the refusals: nothing accepted is lost, nothing duplicated."""
    from otlp_backends import gpu_points, triples

    from otel_ofu.exporters import otlp as otlp_exporter
    from otel_ofu.pipeline.component import Context
    from otel_ofu.pipeline.telemetry import Telemetry

    item = Blocking({"max_concurrent_requests": 1, "passthrough": True}, hold_s=0.02)
    item.release.set()  # requests pass, but one at a time: the others are refused and retried
    cfg = build_config(otlp_exporter.FACTORY.config_type, {
        "endpoint": item.grpc_target, "tls": {"insecure": True},
        "retry_on_failure": {"initial_interval": "50ms", "max_interval": "100ms", "max_elapsed_time": 0},
        "sending_queue": {"num_consumers": 8, "queue_size": 100}})
    telemetry = Telemetry()
    exporter = otlp_exporter.FACTORY.create(cfg, Context("otlp/up", telemetry))
    exporter.start()
    sent = []
    try:
        for w in range(40):
            points = gpu_points(gpus=2, windows=1, t0=T0 + w * 10**10)
            sent += points
            exporter.export(Batch(points=points))
        assert wait_until(lambda: len(exporter.delivery.queue) == 0, timeout=120)
    finally:
        exporter.shutdown()
        item.receiver.shutdown()
    assert received_points(item.batches) == triples(sent)
    assert sum(v for a, v in item.telemetry.counters(REQUESTS.name).items() if dict(a)["outcome"] == "busy") > 0
    assert not telemetry.counters("otel_ofu.exporter.dropped")
