"""Delivery: the bounded queue, retries, outages, overflow, shutdown and kill -9 (nothing lost)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from otlp_backends import T0, GrpcBackend, HttpBackend, free_port, gpu_points, triples, wait_until

from otel_ofu.core.model import Batch
from otel_ofu.delivery import BoundedQueue, Delivery, DeliveryOptions, Item, MemoryStore, SendResult, SqliteStore
from otel_ofu.delivery.queue import QueueFull
from otel_ofu.delivery.sender import DROPPED, QUEUE_SIZE, RETRIED, SENT
from otel_ofu.exporters import otlp as otlp_exporter
from otel_ofu.exporters import otlphttp as otlphttp_exporter
from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp.exporter import OtlpExporter
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.pipeline.telemetry import Telemetry

ROOT = Path(__file__).resolve().parent.parent


def reasons(telemetry: Telemetry, name: str = DROPPED) -> dict[str, float]:
    out: dict[str, float] = {}
    for attributes, value in telemetry.counters(name).items():
        reason = dict(attributes).get("reason", "")
        out[reason] = out.get(reason, 0) + value
    return out


# --- the queue ------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    made = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "q.sqlite3")
    yield made
    made.close()


def item(n: int) -> Item:
    return Item("metrics", f"payload-{n}".encode(), n)


def test_full_queue_drops_the_oldest_waiting_never_in_flight(store):
    queue = BoundedQueue(store, capacity=3)
    assert queue.put(item(1), block=False) == []
    in_flight = queue.take(timeout=0)
    assert in_flight.payload == b"payload-1"
    queue.put(item(2), block=False)
    queue.put(item(3), block=False)
    assert queue.put(item(4), block=False) == [("metrics", 2)]  # 2 was the oldest waiting; 1 is in flight
    assert queue.put(item(5), block=False) == [("metrics", 3)]
    assert len(queue) == 3 and queue.high_water == 3
    queue.done(in_flight)
    assert [queue.take(timeout=0).payload for _ in range(2)] == [b"payload-4", b"payload-5"]
    assert queue.take(timeout=0) is None


def test_a_queue_of_only_in_flight_batches_refuses_new_ones(store):
    queue = BoundedQueue(store, capacity=1)
    queue.put(item(1), block=False)
    queue.take(timeout=0)
    with pytest.raises(QueueFull):
        queue.put(item(2), block=False)
    with pytest.raises(QueueFull):
        queue.put(item(2), block=True, timeout=0.01)


def test_blocking_put_waits_for_room(store):
    queue = BoundedQueue(store, capacity=1)
    queue.put(item(1), block=False)
    taken = queue.take(timeout=0)
    done = threading.Event()

    def producer():
        queue.put(item(2), block=True, timeout=60)
        done.set()

    thread = threading.Thread(target=producer)
    thread.start()
    assert not done.wait(0.1)  # still blocked: the queue is full
    queue.done(taken)
    thread.join(timeout=60)
    assert done.is_set() and queue.take(timeout=0).payload == b"payload-2"


def test_released_batch_goes_back_to_the_head(store):
    queue = BoundedQueue(store, capacity=5)
    for n in (1, 2):
        queue.put(item(n), block=False)
    first = queue.take(timeout=0)
    queue.release(first)
    assert queue.take(timeout=0).payload == b"payload-1"


def test_take_blocks_without_polling_until_a_batch_and_stop_taking_wakes_the_rest(store):
    queue = BoundedQueue(store, capacity=5)
    got: list[Item | None] = []
    takers = [threading.Thread(target=lambda: got.append(queue.take())) for _ in range(3)]
    for taker in takers:
        taker.start()
    queue.put(item(1), block=False)
    assert wait_until(lambda: len(got) == 1)  # one consumer woke for it; the others still wait
    queue.stop_taking()
    for taker in takers:
        taker.join(timeout=60)
    assert not any(taker.is_alive() for taker in takers)
    assert sorted((i.payload if i else b"") for i in got) == [b"", b"", b"payload-1"]
    queue.put(item(2), block=False)
    assert queue.take() is None  # stopped: nothing more leaves, and nothing is lost
    assert sorted(queue.pending()) == [("metrics", 1), ("metrics", 2)]


def idle_delivery(send, path: Path, consumers: int) -> Delivery:
    """Consumers that would wait an hour between retries and shutdown that does not drain."""
    opts = DeliveryOptions(num_consumers=consumers, initial_interval=3600.0, max_interval=3600.0,
                           max_elapsed_time=0, drain_timeout=0.0, send_timeout=0.0)
    return Delivery("otlp/idle", send, BoundedQueue(SqliteStore(path), capacity=5), opts, Telemetry(),
                    __import__("logging").getLogger("t"))


def consumer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("otlp/idle-send-")]


def test_shutdown_wakes_idle_consumers(tmp_path):
    delivery = idle_delivery(lambda _it, _timeout: SendResult.success(), tmp_path / "q.sqlite3", consumers=3)
    delivery.start()
    delivery.shutdown()
    assert not consumer_threads()


def test_shutdown_interrupts_a_retry_backoff_and_sends_nothing_new(tmp_path):
    path = tmp_path / "q.sqlite3"
    attempts: list[bytes] = []

    def send(it: Item, timeout: float) -> SendResult:
        attempts.append(it.payload)
        return SendResult.success() if it.payload == b"ok" else SendResult.retry("UNAVAILABLE")

    delivery = idle_delivery(send, path, consumers=4)
    delivery.start()
    delivery.submit("metrics", b"ok", 2)
    delivery.submit("metrics", b"down", 3)
    assert wait_until(lambda: len(attempts) == 2)  # the second now waits out a backoff of about an hour
    delivery.shutdown()
    assert not consumer_threads()
    assert sorted(attempts) == [b"down", b"ok"]  # the released batch was not taken again while stopping
    reopened = BoundedQueue(SqliteStore(path), capacity=5)
    assert reopened.pending() == [("metrics", 3)]  # released, still stored
    reopened.close()


def test_sqlite_queue_survives_reopen_and_is_exclusive(tmp_path):
    path = tmp_path / "q.sqlite3"
    queue = BoundedQueue(SqliteStore(path), capacity=10)
    for n in range(1, 6):
        queue.put(item(n), block=False)
    queue.done(queue.take(timeout=0))  # 1 sent
    queue.take(timeout=0)  # 2 in flight when the process "dies"
    with pytest.raises(RuntimeError, match="in use by another process"):
        SqliteStore(path)
    queue.close()
    reopened = BoundedQueue(SqliteStore(path), capacity=10)
    assert len(reopened) == 4
    assert [reopened.take(timeout=0).payload for _ in range(4)] == [f"payload-{n}".encode() for n in (2, 3, 4, 5)]
    reopened.close()


# --- the retry loop, with a scripted transport ------------------------------------------------


class Script:
    def __init__(self, *results: SendResult):
        self.results = list(results)
        self.sent: list[Item] = []

    def __call__(self, it: Item, timeout: float = 10.0) -> SendResult:
        result = self.results.pop(0) if self.results else SendResult.success()
        if result.ok:
            self.sent.append(it)
        return result


def inline_delivery(script: Script, **options) -> tuple[Delivery, Telemetry, list[float]]:
    """A queue-less delivery (sends on the caller's thread) whose waits are recorded, not slept."""
    telemetry = Telemetry()
    opts = DeliveryOptions(initial_interval=1.0, max_interval=4.0, **options)
    delivery = Delivery("otlp/t", script, None, opts, telemetry, __import__("logging").getLogger("t"))
    waits: list[float] = []
    delivery.wait = lambda seconds: waits.append(seconds) or False
    return delivery, telemetry, waits


def test_retryable_failures_back_off_exponentially_and_honour_retry_after():
    script = Script(SendResult.retry("UNAVAILABLE"), SendResult.retry("UNAVAILABLE"),
                    SendResult.retry("http_429", retry_after=60.0), SendResult.retry("UNAVAILABLE"))
    delivery, telemetry, waits = inline_delivery(script, max_elapsed_time=0)
    delivery.submit("metrics", b"x", 7)
    assert len(script.sent) == 1
    assert 0.5 <= waits[0] <= 1.5 and 0.75 <= waits[1] <= 2.25  # initial 1s x 1.5, +-50 %
    assert waits[2] == 60.0  # the backend's Retry-After beats the backoff
    assert waits[3] <= 4.0  # capped at max_interval
    assert telemetry.counter(SENT, exporter="otlp/t", signal="metrics") == 7
    assert telemetry.counter(RETRIED, exporter="otlp/t", signal="metrics", reason="UNAVAILABLE") == 3


@pytest.mark.parametrize("first, options, reason", [
    (SendResult.permanent("INVALID_ARGUMENT", "bad"), {}, "permanent_error"),
    (SendResult.retry("UNAVAILABLE", retry_after=400.0), {"max_elapsed_time": 300.0}, "retries_exhausted"),
    (SendResult.retry("UNAVAILABLE"), {"retry_enabled": False}, "retry_disabled"),
])
def test_failures_that_are_given_up_are_dropped_with_a_reason(first, options, reason):
    script = Script(first)
    delivery, telemetry, waits = inline_delivery(script, **options)
    delivery.submit("logs", b"x", 3)
    assert script.sent == [] and waits == []
    assert telemetry.counter(DROPPED, exporter="otlp/t", signal="logs", reason=reason) == 3


# --- real backends: outages, overflow, shutdown -------------------------------------------------


def make(protocol: str, endpoint: str, telemetry: Telemetry, timeout: str | None = None, **queue) -> OtlpExporter:
    factory = otlp_exporter.FACTORY if protocol == "grpc" else otlphttp_exporter.FACTORY
    data = {"endpoint": endpoint, "compression": "none", **({"timeout": timeout} if timeout else {}),
            "retry_on_failure": {"initial_interval": "20ms", "max_interval": "200ms", "max_elapsed_time": 0},
            "sending_queue": {"num_consumers": 4, **queue}}
    if protocol == "grpc":
        data["tls"] = {"insecure": True}
    exporter = factory.create(build_config(factory.config_type, data), Context("otlp/t", telemetry))
    exporter.start()
    return exporter


@pytest.mark.parametrize("protocol, storage", [("grpc", False), ("grpc", True), ("http", False)])
def test_outage_every_point_arrives_exactly_once(protocol, storage, tmp_path):
    backend = (GrpcBackend() if protocol == "grpc" else HttpBackend()).start()
    telemetry = Telemetry()
    queue = {"queue_size": 40, **({"storage": str(tmp_path / "queue")} if storage else {})}
    exporter = make(protocol, backend.endpoint, telemetry, **queue)
    try:
        accepted = []

        def export(windows_from: int, count: int) -> None:
            for w in range(windows_from, windows_from + count):
                points = gpu_points(gpus=3, windows=1, t0=T0 + w * 10**10)
                exporter.export(Batch(points=points))
                accepted.extend(points)

        export(0, 3)
        assert wait_until(lambda: sum(backend.point_counts().values()) == len(accepted))
        backend.stop()  # the backend goes away
        export(3, 10)
        assert wait_until(lambda: sum(telemetry.counters(RETRIED).values()) >= 4)  # senders are failing
        export(13, 10)
        assert exporter.delivery.queue.high_water <= 40
        backend.start()  # and comes back, on the same port
        export(23, 5)
        expected = triples(accepted)
        assert wait_until(lambda: sum(backend.point_counts().values()) >= len(accepted))
        assert wait_until(lambda: len(exporter.delivery.queue) == 0)
        assert backend.point_counts() == expected  # every point, each exactly once
        assert all(n == 1 for n in backend.point_counts().values())
        assert reasons(telemetry) == {}
        assert wait_until(lambda: telemetry.gauge(QUEUE_SIZE, exporter="otlp/t") == 0)
    finally:
        exporter.shutdown()
        backend.stop()


def test_overflow_drops_the_oldest_and_counts_them():
    backend = GrpcBackend()  # not started: the backend is down
    telemetry = Telemetry()
    exporter = make("grpc", backend.endpoint, telemetry, queue_size=5, num_consumers=1)
    try:
        batches = [gpu_points(gpus=2, windows=1, t0=T0 + w * 10**10) for w in range(20)]
        exporter.export(Batch(points=batches[0]))
        assert wait_until(lambda: sum(telemetry.counters(RETRIED).values()) >= 1)  # batch 0 is in flight
        for points in batches[1:]:
            exporter.export(Batch(points=points))
        assert len(exporter.delivery.queue) == 5 and exporter.delivery.queue.high_water == 5
        backend.start()
        survivors = [batches[0], *batches[16:]]  # in flight, and the four newest
        expected = triples([p for b in survivors for p in b])
        assert wait_until(lambda: backend.point_counts() == expected), backend.point_counts()
        assert reasons(telemetry) == {"queue_full": sum(len(b) for b in batches[1:16])}
    finally:
        exporter.shutdown()
        backend.stop()


def test_block_on_overflow_slows_the_producer_and_loses_nothing():
    backend = GrpcBackend()
    telemetry = Telemetry()
    exporter = make("grpc", backend.endpoint, telemetry, queue_size=3, num_consumers=1, block_on_overflow=True,
                    block_timeout="10m")
    batches = [gpu_points(gpus=1, windows=1, t0=T0 + w * 10**10) for w in range(8)]
    progress = []

    def producer():
        for points in batches:
            exporter.export(Batch(points=points))
            progress.append(len(points))

    thread = threading.Thread(target=producer, daemon=True)
    try:
        thread.start()
        assert wait_until(lambda: len(progress) == 3 and sum(telemetry.counters(RETRIED).values()) >= 2)
        assert len(progress) == 3  # blocked on the fourth batch while the backend is down
        backend.start()
        thread.join(timeout=60)
        expected = triples([p for b in batches for p in b])
        assert wait_until(lambda: backend.point_counts() == expected)
        assert exporter.delivery.queue.high_water == 3
        assert reasons(telemetry) == {}
    finally:
        exporter.shutdown()
        backend.stop()


def test_block_timeout_drops_the_new_batch():
    backend = GrpcBackend()
    telemetry = Telemetry()
    exporter = make("grpc", backend.endpoint, telemetry, queue_size=1, num_consumers=1, block_on_overflow=True,
                    block_timeout="50ms", drain_timeout=0)
    try:
        exporter.export(Batch(points=gpu_points(gpus=1, windows=1)))
        exporter.export(Batch(points=gpu_points(gpus=1, windows=1, t0=T0 + 1)))
        assert reasons(telemetry)["queue_full"] == 5
    finally:
        exporter.shutdown()


def test_shutdown_memory_queue_counts_what_it_could_not_send():
    backend = GrpcBackend()
    telemetry = Telemetry()
    exporter = make("grpc", backend.endpoint, telemetry, drain_timeout="100ms")
    points = gpu_points(gpus=2, windows=3)
    exporter.export(Batch(points=points))
    exporter.shutdown()
    assert reasons(telemetry) == {"shutdown": len(points)}


def test_shutdown_flushes_what_it_can():
    backend = GrpcBackend().start()
    telemetry = Telemetry()
    exporter = make("grpc", backend.endpoint, telemetry, drain_timeout="60s")
    try:
        points = [p for w in range(10) for p in gpu_points(gpus=2, windows=1, t0=T0 + w * 10**10)]
        for w in range(10):
            exporter.export(Batch(points=points[w * 10:(w + 1) * 10]))
        exporter.shutdown()  # returns once all is sent (well within drain_timeout)
        assert backend.point_counts() == triples(points)
    finally:
        backend.stop()


def test_disk_queue_keeps_unsent_data_across_restart(tmp_path):
    backend = GrpcBackend()
    storage = str(tmp_path / "queue")
    first = make("grpc", backend.endpoint, Telemetry(), storage=storage, drain_timeout="100ms")
    points = gpu_points(gpus=2, windows=4)
    first.export(Batch(points=points))
    first.shutdown()  # backend down: the batch stays on disk
    assert reasons(first.context.telemetry) == {}
    backend.start()
    try:
        second = make("grpc", backend.endpoint, Telemetry(), storage=storage)
        assert wait_until(lambda: backend.point_counts() == triples(points))
        second.shutdown()
        assert backend.point_counts() == triples(points)
    finally:
        backend.stop()


# --- kill -9 of a real otel-ofu process -----------------------------------------------------------


SECOND_START = "2026-02-01T00:00:00+00:00"  # the restarted process simulates a later month: new points
SECOND_START_NS = 1_769_904_000 * 10**9


def _run_config(tmp_path: Path, name: str, port: int, start_time: str) -> Path:
    config = tmp_path / f"{name}.yaml"
    config.write_text(f"""
receivers:
  sim:
    nodes: 1
    gpus_per_node: 2
    seed: 7
    start_time: "{start_time}"
    time_acceleration: 200
    collection_interval: 10s
    clock_sample_interval: 5s
processors:
  ofu: {{}}
exporters:
  otlp:
    endpoint: 127.0.0.1:{port}
    tls: {{insecure: true}}
    retry_on_failure: {{initial_interval: 50ms, max_interval: 500ms, max_elapsed_time: 0s}}
    sending_queue: {{storage: {tmp_path / 'queue'}, queue_size: 100000, num_consumers: 2, drain_timeout: 60s}}
  file:
    path: {tmp_path / (name + '.jsonl')}
service:
  pipelines:
    metrics:
      receivers: [sim]
      processors: [ofu]
      exporters: [otlp, file]
""")
    return config


def _start(config: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
    return subprocess.Popen([sys.executable, "-m", "otel_ofu", "run", "--config", str(config)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))  # noqa: SIM115


def _file_points(path: Path) -> Counter:
    lines = path.read_text().splitlines() if path.exists() else []
    requests = [otlp.from_json_line(line) for line in lines if line.startswith('{"resourceMetrics"')]
    return triples(p for r in requests for p in otlp.from_request(r))


def test_disk_queue_survives_kill_9(tmp_path):
    port = free_port()
    backend = GrpcBackend(port)  # down while the first process runs
    first = _start(_run_config(tmp_path, "first", port, "2026-01-01T00:00:00+00:00"), tmp_path / "first.log")
    try:
        assert wait_until(lambda: len(_file_points(tmp_path / "first.jsonl")) >= 300 or first.poll() is not None)
        assert first.poll() is None, (tmp_path / "first.log").read_text()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    accepted = _file_points(tmp_path / "first.jsonl")  # all the first process accepted (and then some)

    backend.start()
    second = _start(_run_config(tmp_path, "second", port, SECOND_START), tmp_path / "second.log")
    try:
        assert wait_until(lambda: set(accepted) <= set(backend.point_counts()), timeout=120), \
            (tmp_path / "second.log").read_text()[-3000:]
        second.send_signal(signal.SIGTERM)  # a clean stop drains the queue
        assert second.wait(timeout=120) == 0, (tmp_path / "second.log").read_text()[-3000:]
    finally:
        if second.poll() is None:
            second.kill()
        backend.stop()

    received = backend.point_counts()
    assert all(n == 1 for n in received.values()), [k for k, n in received.items() if n > 1][:5]
    from_first = {k for k in received if k[2] < SECOND_START_NS}
    assert from_first >= set(accepted)
    # The only extra: the batch enqueued (otlp is listed first) but not yet in the file at the kill.
    assert len({k[2] for k in from_first - set(accepted)}) <= 1
    assert set(_file_points(tmp_path / "second.jsonl")) <= set(received)
    db = sqlite3.connect(tmp_path / "queue" / "otlp.sqlite3")
    assert db.execute("SELECT COUNT(*) FROM queue").fetchone()[0] == 0
    db.close()


# --- issue 11 item 8 and issue 15: what a real fleet does to delivery ------------------------


def test_queue_size_smaller_than_num_consumers_is_refused():
    from otel_ofu.pipeline.config import FieldError

    with pytest.raises(FieldError, match="num_consumers") as error:
        build_config(otlp_exporter.FACTORY.config_type,
                     {"endpoint": "127.0.0.1:4317", "sending_queue": {"queue_size": 4, "num_consumers": 10}})
    assert error.value.key == "sending_queue.queue_size"
    build_config(otlp_exporter.FACTORY.config_type,  # bytes: not comparable with consumers
                 {"endpoint": "127.0.0.1:4317", "sending_queue": {"sizer": "bytes", "queue_size": 4096}})


def test_a_full_disk_loses_only_the_new_batch_and_counts_it(tmp_path):
    """Before: the oldest batches were evicted first, then the insert failed: both lost, uncounted."""
    store = SqliteStore(tmp_path / "q.sqlite3")
    queue = BoundedQueue(store, capacity=3)
    telemetry = Telemetry()
    delivery = Delivery("otlp/disk", lambda _it, _t: SendResult.success(), queue, DeliveryOptions(),
                        telemetry, __import__("logging").getLogger("t"))  # not started: nothing is sent
    for n in range(3):
        delivery.submit("metrics", b"x" * 100, 10 + n)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is now full (SQLITE_FULL)
    delivery.submit("metrics", b"y" * 200_000, 7)  # needs new pages: cannot be stored
    assert reasons(telemetry) == {"storage_error": 7}
    assert queue.pending() == [("metrics", 10), ("metrics", 11), ("metrics", 12)]  # nothing old was evicted
    queue.close()
    reopened = BoundedQueue(SqliteStore(tmp_path / "q.sqlite3"), capacity=3)
    assert reopened.pending() == [("metrics", 10), ("metrics", 11), ("metrics", 12)]
    reopened.close()


@pytest.mark.parametrize("sizer, capacity, expect_batches", [("bytes", 2500, 2), ("items", 25, 2), ("requests", 2, 2)])
def test_sizer_bounds_the_queue_in_its_unit(sizer, capacity, expect_batches):
    queue = BoundedQueue(MemoryStore(), capacity=capacity, sizer=sizer)
    evicted = []
    for _n in range(5):
        evicted += queue.put(Item("metrics", bytes(1000), 10), block=False)
    assert len(queue) == expect_batches and queue.used() <= capacity
    assert len(evicted) == 5 - expect_batches
    with pytest.raises(QueueFull, match="exceeds the queue's capacity"):
        BoundedQueue(MemoryStore(), capacity=500, sizer="bytes").put(Item("metrics", bytes(501), 1), block=False)


def test_disk_queue_in_bytes_reopens_with_its_sizes(tmp_path):
    queue = BoundedQueue(SqliteStore(tmp_path / "q.sqlite3"), capacity=10_000, sizer="bytes")
    for n in range(3):
        queue.put(Item("metrics", bytes(3000), n + 1), block=False)
    assert queue.used() == 9000
    queue.close()
    reopened = BoundedQueue(SqliteStore(tmp_path / "q.sqlite3"), capacity=10_000, sizer="bytes")
    assert reopened.used() == 9000
    assert reopened.put(Item("metrics", bytes(3000), 9), block=False) == [("metrics", 1)]  # oldest out
    reopened.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("queue_enabled", [True, False])
def test_a_batch_refused_as_too_large_is_split_not_dropped(protocol, queue_enabled):
    """gRPC's own size limit answers RESOURCE_EXHAUSTED without RetryInfo; an HTTP backend 413."""
    backend = (GrpcBackend(max_request_bytes=3000) if protocol == "grpc" else HttpBackend(max_request_bytes=3000))
    backend.start()
    telemetry = Telemetry()
    exporter = make(protocol, backend.endpoint, telemetry, enabled=queue_enabled, num_consumers=1, queue_size=10)
    try:
        points = gpu_points(gpus=8, windows=2)  # about 12 kB: four or more requests of <= 3000 bytes
        exporter.export(Batch(points=points))
        assert wait_until(lambda: backend.point_counts() == triples(points)), backend.point_counts()
        # The backend has the points when it reads the last request; the exporter counts them sent
        # when it reads the answer, a moment later.
        assert wait_until(lambda: telemetry.counter(SENT, exporter="otlp/t", signal="metrics") == len(points))
        assert reasons(telemetry) == {}
        assert len(backend.metrics) >= 4
    finally:
        exporter.shutdown()
        backend.stop()


def test_a_single_point_too_large_to_split_is_dropped_with_its_reason():
    backend = GrpcBackend(max_request_bytes=50).start()
    telemetry = Telemetry()
    exporter = make("grpc", backend.endpoint, telemetry, num_consumers=1, queue_size=10)
    try:
        exporter.export(Batch(points=gpu_points(gpus=1, windows=1)[:1]))
        assert wait_until(lambda: reasons(telemetry) == {"permanent_error": 1})
    finally:
        exporter.shutdown()
        backend.stop()


class DripBackend:
    """An OTLP/HTTP backend that accepts a request, then answers one byte at a time (slow proxy)."""

    def __init__(self, byte_interval: float):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.received = 0
        self.answered = threading.Event()
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                backend.received += 1
                reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
                import time as _time

                for byte in reply:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    _time.sleep(byte_interval)
                backend.answered.set()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("storage", [False, True])
def test_a_send_outliving_shutdown_is_counted_once_and_not_sent_again(storage, tmp_path):
    """Before: counted both sent and dropped (memory), or left on disk and re-sent after a restart."""
    backend = DripBackend(byte_interval=0.09)  # ~7 s to answer, each byte well within the 0.5 s timeout
    telemetry = Telemetry()
    queue = {"num_consumers": 1, "queue_size": 10, "drain_timeout": "0s",
             **({"storage": str(tmp_path / "queue")} if storage else {})}
    # shutdown waits timeout + 5 s for a consumer: the answer outlasts that
    exporter = make("http", backend.endpoint, telemetry, timeout="500ms", **queue)
    try:
        exporter.export(Batch(points=gpu_points(gpus=1, windows=1)))
        assert wait_until(lambda: backend.received == 1)
        exporter.shutdown()  # returns while the answer is still dripping in
        assert not backend.answered.is_set()
        assert wait_until(lambda: telemetry.counter(SENT, exporter="otlp/t", signal="metrics") == 5)
        assert wait_until(lambda: backend.answered.is_set())
        if storage:
            assert wait_until(lambda: _queue_rows(tmp_path / "queue" / "otlp_t.sqlite3") == 0)
        assert reasons(telemetry) == {}
    finally:
        backend.stop()


def _queue_rows(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT COUNT(*) FROM queue").fetchone()[0]
    finally:
        db.close()


def test_recovery_after_failures_is_logged_once(caplog):
    """Before: the first retry of each batch warned and recovery was silent."""
    backend = GrpcBackend()  # down
    telemetry = Telemetry()
    exporter = make("grpc", backend.endpoint, telemetry, num_consumers=4)
    caplog.set_level("DEBUG", logger="otel_ofu")
    try:
        batches = [gpu_points(gpus=1, windows=1, t0=T0 + w * 10**10) for w in range(6)]
        for points in batches:
            exporter.export(Batch(points=points))
        assert wait_until(lambda: sum(telemetry.counters(RETRIED).values()) >= 12)
        backend.start()
        assert wait_until(lambda: backend.point_counts() == triples([p for b in batches for p in b]))
        assert wait_until(lambda: any("accepts data again" in r.getMessage() for r in caplog.records))
    finally:
        exporter.shutdown()
        backend.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len([m for m in warnings if "sending failed" in m]) == 1, warnings
    assert not [m for m in warnings if "retry" in m and "sending failed" not in m], warnings
    recovered = [r for r in caplog.records if "accepts data again" in r.getMessage()]
    assert len(recovered) == 1 and recovered[0].levelname == "INFO"
    assert "failed attempts" in recovered[0].getMessage()
