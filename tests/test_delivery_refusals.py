"""A backend that refuses some samples of a request costs those samples, not the request (issue 31, item 1).

Prometheus 3's OTLP handler refuses a whole request for one sample it cannot store and stores none of it
(storage/remote/write_otlp_handler.go: HTTP 400 with each metric's first error, joined by newlines); the
exporters dropped the whole batch (58 items, among them an unrelated ``gpu_ofu`` point). Now such a
request is split until what is refused is the samples themselves: those are dropped, counted
(``sample_refused``) and their series logged once, and everything else is stored.

The backends here refuse as Prometheus does (``otlp_backends.PrometheusTsdb``, after tsdb/head_append.go);
tests/test_restart_prometheus.py runs the real Prometheus 3.
"""

from __future__ import annotations

import logging
import math

import pytest
from otlp_backends import T0, GrpcBackend, HttpBackend, PrometheusTsdb, gpu_points, triples, wait_until
from test_delivery import make, reasons

from otel_ofu.core.model import Batch, MetricPoint, attrs
from otel_ofu.delivery.retry import DUPLICATE, OUT_OF_BOUNDS, OUT_OF_ORDER, TOO_OLD, SampleRefusal
from otel_ofu.delivery.sender import SENT
from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp.payload import describe_series, metrics_payload, split_refused
from otel_ofu.otlp.transport import sample_refusal
from otel_ofu.pipeline.telemetry import Telemetry

JOB = attrs({"ofu.job.id": "train-7"})
MINUTE_NS = 60 * 10**9


def job_ofu(value: float, t: int = T0 + MINUTE_NS) -> MetricPoint:
    return MetricPoint("job.ofu", value, t, JOB, attrs({"ofu.window": "5m"}), "{ratio}")


def backend_for(protocol: str, window_ms: int = 0):
    backend = GrpcBackend() if protocol == "grpc" else HttpBackend()
    backend.tsdb = PrometheusTsdb(window_ms)
    return backend.start()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_sample_refused_as_a_duplicate_costs_only_itself(protocol, caplog):
    """The issue's case: a bin re-sent one bit apart beside unrelated GPU points."""
    backend = backend_for(protocol)
    telemetry = Telemetry()
    exporter = make(protocol, backend.endpoint, telemetry, num_consumers=1, queue_size=100)
    try:
        first = job_ofu(0.4567)
        exporter.export(Batch(points=[first]))
        assert wait_until(lambda: backend.point_counts() == triples([first]))
        gpus = gpu_points(gpus=8, windows=2)
        again = job_ofu(math.nextafter(0.4567, 1.0))  # the same bin, the last bit apart
        with caplog.at_level(logging.ERROR):
            exporter.export(Batch(points=[*gpus[:37], again, *gpus[37:]]))
            assert wait_until(lambda: reasons(telemetry) == {"sample_refused": 1}), reasons(telemetry)
        assert wait_until(lambda: set(backend.point_counts()) == set(triples([first, *gpus])))
        assert all(n == 1 for n in backend.point_counts().values())
        assert backend.tsdb.samples[((("ofu.job.id", "train-7"),), "job.ofu", (("ofu.window", "5m"),))] == \
            {(T0 + MINUTE_NS) // 10**6: 0.4567}  # the value it had
        assert wait_until(lambda: telemetry.counter(SENT, exporter="otlp/t", signal="metrics") == 1 + len(gpus))
        refused = [r.getMessage() for r in caplog.records if "the backend refuses" in r.getMessage()]
        assert len(refused) == 1
        assert "job.ofu{ofu.job.id=train-7, ofu.window=5m}" in refused[0]
        assert "duplicate sample for timestamp" in refused[0] and "\n" not in refused[0]
    finally:
        exporter.shutdown()
        backend.stop()


def test_each_refused_series_is_logged_once(caplog):
    backend = backend_for("http")
    telemetry = Telemetry()
    exporter = make("http", backend.endpoint, telemetry, num_consumers=1, queue_size=100)
    try:
        exporter.export(Batch(points=[job_ofu(0.5)]))
        assert wait_until(lambda: backend.point_counts())
        with caplog.at_level(logging.ERROR):
            for value in (0.25, 0.75):
                others = gpu_points(gpus=2, windows=1, t0=T0 + int(value * 1e9))
                exporter.export(Batch(points=[job_ofu(value), *others]))
            assert wait_until(lambda: reasons(telemetry) == {"sample_refused": 2})
        assert sum("the backend refuses" in r.getMessage() for r in caplog.records) == 1
    finally:
        exporter.shutdown()
        backend.stop()


def test_identical_points_sent_again_are_taken(tmp_path):
    """What a restart sends again (a disk queue's batch, the jobs journal's outputs) has the same bits."""
    backend = backend_for("http", window_ms=30 * 60_000)
    telemetry = Telemetry()
    exporter = make("http", backend.endpoint, telemetry, num_consumers=1, queue_size=100)
    try:
        points = [job_ofu(0.5), *gpu_points(gpus=4, windows=3)]
        newer = gpu_points(gpus=4, windows=1, t0=T0 + 5 * MINUTE_NS)
        for batch in (points, newer, points):  # the last: older than the newest, within the window
            exporter.export(Batch(points=batch))
        assert wait_until(lambda: telemetry.counter(SENT, exporter="otlp/t", signal="metrics") ==
                          2 * len(points) + len(newer))
        assert reasons(telemetry) == {} and backend.refused == 0
    finally:
        exporter.shutdown()
        backend.stop()


def test_an_out_of_order_sample_is_set_apart_without_an_out_of_order_window():
    backend = backend_for("http")
    telemetry = Telemetry()
    exporter = make("http", backend.endpoint, telemetry, num_consumers=1, queue_size=100)
    try:
        later = job_ofu(0.5, T0 + 2 * MINUTE_NS)
        exporter.export(Batch(points=[later]))
        assert wait_until(lambda: backend.point_counts())
        gpus = gpu_points(gpus=4, windows=2)
        exporter.export(Batch(points=[*gpus, job_ofu(0.4, T0 + MINUTE_NS)]))
        assert wait_until(lambda: reasons(telemetry) == {"sample_refused": 1}), reasons(telemetry)
        assert wait_until(lambda: set(backend.point_counts()) == set(triples([later, *gpus])))
    finally:
        exporter.shutdown()
        backend.stop()


def test_points_too_old_for_the_window_are_set_apart_by_their_time_in_a_few_requests():
    """A refusal for age alone splits by time: a batch of many points costs requests per time, not per point."""
    backend = backend_for("http", window_ms=30 * 60_000)
    telemetry = Telemetry()
    exporter = make("http", backend.endpoint, telemetry, num_consumers=1, queue_size=100)
    try:
        newest = job_ofu(0.5, T0 + 120 * MINUTE_NS)
        exporter.export(Batch(points=[newest]))
        assert wait_until(lambda: backend.point_counts())
        old = gpu_points(gpus=8, windows=3)  # two hours before the newest: too old
        recent = gpu_points(gpus=8, windows=1, t0=T0 + 100 * MINUTE_NS)
        before = backend.attempts
        exporter.export(Batch(points=[*old, *recent]))
        assert wait_until(lambda: reasons(telemetry) == {"sample_refused": len(old)}), reasons(telemetry)
        assert wait_until(lambda: set(backend.point_counts()) == set(triples([newest, *recent])))
        assert backend.attempts - before <= 2 * 4  # four times: the batch, then halves of its times
    finally:
        exporter.shutdown()
        backend.stop()


def test_a_partial_success_counts_what_was_rejected_and_keeps_the_rest():
    backend = HttpBackend().start()
    backend.partial_reject = 2
    telemetry = Telemetry()
    exporter = make("http", backend.endpoint, telemetry, num_consumers=1, queue_size=10)
    try:
        points = gpu_points(gpus=2, windows=1)
        exporter.export(Batch(points=points))
        assert wait_until(lambda: reasons(telemetry) == {"rejected": 2})
        assert backend.point_counts() == triples(points) and len(backend.metrics) == 1  # not sent again
    finally:
        exporter.shutdown()
        backend.stop()


# --- the pieces -------------------------------------------------------------------------------


def test_prometheus_refusals_are_read_from_their_own_words():
    """Messages as storage/errors.go and storage/interface.go write them, joined as errors.Join does, and as
    a Collector passes them on."""
    joined = ("duplicate sample for timestamp 1767225660000; overrides not allowed: existing 0.4567, new value "
              "0.4567000000000001\nout of order sample")
    assert sample_refusal(joined) == SampleRefusal(frozenset({DUPLICATE, OUT_OF_ORDER}), frozenset({1767225660000}))
    assert sample_refusal("too old sample") == SampleRefusal(frozenset({TOO_OLD}))
    assert sample_refusal("Permanent error: remote write returned HTTP status 400 Bad Request; err = <nil>: out of "
                          "bounds") == SampleRefusal(frozenset({OUT_OF_BOUNDS}))
    assert sample_refusal("invalid temporality and type combination for metric \"x\"") is None


def _request_points(payload: bytes) -> list[MetricPoint]:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    return list(otlp.from_request(ExportMetricsServiceRequest.FromString(payload)))


def test_a_named_duplicate_is_set_apart_by_its_timestamp_and_every_point_stays_once():
    points = [*gpu_points(gpus=3, windows=2), job_ofu(0.5)]
    payload, _ = metrics_payload(points)
    refusal = SampleRefusal(frozenset({DUPLICATE}), frozenset({(T0 + MINUTE_NS) // 10**6}))
    named, rest = split_refused("metrics", payload, refusal)
    assert triples(_request_points(named[0])) == triples([job_ofu(0.5)]) and named[1] == 1
    assert triples(_request_points(rest[0])) == triples(points[:-1]) and rest[1] == len(points) - 1


def test_a_refusal_for_age_splits_by_time_and_one_time_cannot_be_split():
    points = gpu_points(gpus=3, windows=4)
    payload, _ = metrics_payload(points)
    older, newer = split_refused("metrics", payload, SampleRefusal(frozenset({TOO_OLD})))
    assert max(p.time_unix_nano for p in _request_points(older[0])) < \
        min(p.time_unix_nano for p in _request_points(newer[0]))
    assert triples(_request_points(older[0]) + _request_points(newer[0])) == triples(points)
    one_time, _ = metrics_payload(gpu_points(gpus=3, windows=1))
    assert split_refused("metrics", one_time, SampleRefusal(frozenset({OUT_OF_BOUNDS}))) == []


def test_a_refused_series_is_described_by_its_name_and_labels():
    payload, _ = metrics_payload([job_ofu(0.5)])
    assert describe_series("metrics", payload) == [("job.ofu{ofu.job.id=train-7, ofu.window=5m}",
                                                    "2026-01-01T00:01:00.000Z = 0.5")]
