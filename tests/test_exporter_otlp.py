"""The otlp (gRPC) and otlphttp exporters against real local OTLP servers."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import grpc
import pytest
from otlp_backends import (
    GPU_METRICS,
    T0,
    Failure,
    GrpcBackend,
    HttpBackend,
    gpu_points,
    make_certs,
    triples,
    wait_until,
)

from otel_ofu.core.metrics import METRICS
from otel_ofu.core.model import Batch, Event, MetricPoint, attrs
from otel_ofu.delivery.sender import DROPPED, RETRIED, SENT
from otel_ofu.exporters import otlp as otlp_exporter
from otel_ofu.exporters import otlphttp as otlphttp_exporter
from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp.exporter_config import OtlpExporterConfig, OtlpHttpExporterConfig, resolve
from otel_ofu.otlp.payload import metrics_payload
from otel_ofu.otlp.transport import parse_retry_after
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.pipeline.telemetry import Telemetry

ROOT = Path(__file__).resolve().parent.parent
def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) and key != "headers" else value
    return out


@pytest.fixture
def make_exporter():
    made = []

    def make(protocol: str, endpoint: str | None, telemetry: Telemetry | None = None, **config):
        factory = otlp_exporter.FACTORY if protocol == "grpc" else otlphttp_exporter.FACTORY
        base: dict = {"retry_on_failure": {"initial_interval": "20ms", "max_interval": "200ms"},
                      "sending_queue": {"num_consumers": 2, "drain_timeout": "2s"}}
        if endpoint is not None:
            base["endpoint"] = endpoint
        if protocol == "grpc":
            base["tls"] = {"insecure": True}
        cfg = build_config(factory.config_type, _merge(base, config))
        exporter = factory.create(cfg, Context(f"{'otlp' if protocol == 'grpc' else 'otlphttp'}/test",
                                               telemetry or Telemetry()))
        exporter.start()
        made.append(exporter)
        return exporter

    yield make
    for exporter in made:
        exporter.shutdown()


@pytest.fixture(params=["grpc", "http"])
def backend(request):
    server = (GrpcBackend() if request.param == "grpc" else HttpBackend()).start()
    server.protocol = request.param
    yield server
    server.stop()


def test_every_point_arrives_with_its_own_resource_and_timestamp(backend, make_exporter):
    exporter = make_exporter(backend.protocol, backend.endpoint)
    points = gpu_points(gpus=4, windows=3)
    counter = MetricPoint("gpu.ofu.dropped", 3.0, T0, points[0].resource, attrs({"ofu.drop.reason": "blank"}),
                          "{window}", monotonic=True, start_time_unix_nano=T0 - 10)
    exporter.export(Batch(points=[*points, counter]))
    expected = triples([*points, counter])
    assert wait_until(lambda: backend.point_counts() == expected), backend.point_counts() - expected

    request = backend.metrics[0]
    # The SDK-encoder pitfall: one ResourceMetrics per GPU, holding all five metrics.
    assert len(request.resource_metrics) == 4
    assert all(len(rm.scope_metrics[0].metrics) >= len(GPU_METRICS) for rm in request.resource_metrics)
    assert request.resource_metrics[0].scope_metrics[0].scope.name == otlp.SCOPE_NAME
    by_name = {m.name: m for rm in request.resource_metrics for m in rm.scope_metrics[0].metrics}
    assert by_name["gpu.sm.clock.frequency"].unit == METRICS["gpu.sm.clock.frequency"].unit
    assert by_name["gpu.ofu"].description == METRICS["gpu.ofu"].description
    assert by_name["gpu.ofu.dropped"].sum.is_monotonic
    assert by_name["gpu.ofu.dropped"].sum.data_points[0].start_time_unix_nano == T0 - 10
    # Counted sent when the exporter reads the backend's answer, a moment after the backend has the points.
    exporter_id = "otlp/test" if backend.protocol == "grpc" else "otlphttp/test"
    assert wait_until(lambda: exporter.context.telemetry.counter(SENT, exporter=exporter_id, signal="metrics")
                      == len(expected))


def test_payload_groups_all_metrics_of_a_resource(tmp_path):
    points = gpu_points(gpus=3, windows=2)
    payload, count = metrics_payload(points)
    assert count == len(points)
    request = otlp.ExportMetricsServiceRequest.FromString(payload)
    assert len(request.resource_metrics) == 3
    assert sorted(len(rm.scope_metrics[0].metrics) for rm in request.resource_metrics) == [5, 5, 5]
    assert triples(otlp.from_request(request)) == triples(points)


def test_events_go_out_as_logs(backend, make_exporter):
    exporter = make_exporter(backend.protocol, backend.endpoint)
    resource = attrs({"service.name": "otel-ofu", "ofu.job.id": "job-7"})
    events = [Event("ofu.job.end", T0 + i, resource, attrs({"ofu.job.id": "job-7"}), f"job ended {i}", "WARN")
              for i in range(3)]
    exporter.export(Batch(events=events))
    assert wait_until(lambda: len(backend.events()) == 3)
    got = sorted(backend.events(), key=lambda e: e.time_unix_nano)
    assert [(e.name, e.time_unix_nano, e.resource, e.body, e.severity) for e in got] == \
           [(e.name, e.time_unix_nano, e.resource, e.body, e.severity) for e in events]
    assert not backend.metrics  # an events-only batch sends no empty metrics request


@pytest.mark.parametrize("events", [True, False])
def test_events_false_sends_metrics_only_to_a_backend_without_logs(make_exporter, events, caplog):
    """A Collector with no logs pipeline answers the logs service UNIMPLEMENTED: every job start, end
    and finding is a permanent error, counted dropped (OtelOfuDroppingData fires for ever) unless the
    exporter is told `events: false`, which sends the metrics alone."""
    server = GrpcBackend(logs=False).start()
    try:
        telemetry = Telemetry()
        exporter = make_exporter("grpc", server.endpoint, telemetry, events=events)
        resource = attrs({"service.name": "otel-ofu", "ofu.job.id": "job-7"})
        points = gpu_points(gpus=1, windows=1)
        exporter.export(Batch(points=points, events=[Event("ofu.job.start", T0, resource, (), "job started", "INFO")]))
        assert wait_until(lambda: server.point_counts() == triples(points))
        exporter.shutdown()  # drains: what the exporter counts is final
        dropped = sum(telemetry.counters(DROPPED).values())
        assert dropped == (1 if events else 0)
        assert not server.events()
        drops = [r.getMessage() for r in caplog.records if "dropping" in r.getMessage()]
        assert (not drops) if not events else ("set this exporter's events: false" in drops[0]), drops
    finally:
        server.stop()


def test_events_false_and_a_logs_endpoint_are_refused_together():
    with pytest.raises(FieldError, match="events"):
        _cfg(OtlpHttpExporterConfig, {"endpoint": "http://c:4318", "events": False, "logs_endpoint": "http://l/x"})
    cfg = _cfg(OtlpHttpExporterConfig, {"endpoint": "http://c:4318", "events": False})
    assert set(resolve(cfg, {}).targets) == {"metrics"}


def test_passthrough_resource_metrics_are_forwarded_unchanged(backend, make_exporter):
    exporter = make_exporter(backend.protocol, backend.endpoint)
    foreign = otlp.to_request([MetricPoint("DCGM_FI_DEV_POWER_USAGE", 250.0, T0, attrs({"host.name": "n"}), (),
                                           "W")]).resource_metrics[0]
    exporter.export(Batch(points=gpu_points(gpus=1, windows=1), passthrough=[foreign]))
    assert wait_until(lambda: len(backend.metrics) == 1)
    assert foreign in backend.metrics[0].resource_metrics
    assert sum(backend.point_counts().values()) == len(GPU_METRICS) + 1


def test_headers_and_gzip_reach_the_backend(backend, make_exporter):
    exporter = make_exporter(backend.protocol, backend.endpoint, headers={"Authorization": "Bearer s3cret"},
                             compression="gzip")
    exporter.export(Batch(points=gpu_points(gpus=1, windows=1)))
    assert wait_until(lambda: backend.headers)
    assert backend.headers[0]["authorization"] == "Bearer s3cret"
    if backend.protocol == "http":
        assert backend.headers[0]["content-encoding"] == "gzip"
        assert backend.headers[0]["content-type"] == "application/x-protobuf"
    assert backend.headers[0]["user-agent"].startswith("otel-ofu/")


def test_retryable_failures_are_retried_and_arrive_once(backend, make_exporter):
    telemetry = Telemetry()
    exporter = make_exporter(backend.protocol, backend.endpoint, telemetry)
    backend.fail(Failure(grpc.StatusCode.UNAVAILABLE, 503, retry_after=0.05, times=3))
    points = gpu_points(gpus=2, windows=2)
    exporter.export(Batch(points=points))
    assert wait_until(lambda: backend.point_counts() == triples(points))
    assert backend.failed == 3
    retried = telemetry.counters(RETRIED)
    assert sum(retried.values()) == 3
    assert {dict(a)["reason"] for a in retried} == {"UNAVAILABLE" if backend.protocol == "grpc" else "http_503"}
    assert not telemetry.counters(DROPPED)


def test_permanent_failure_is_dropped_and_logged_with_its_reason(backend, make_exporter, caplog):
    telemetry = Telemetry()
    exporter = make_exporter(backend.protocol, backend.endpoint, telemetry, sending_queue={"num_consumers": 1})
    backend.fail(Failure(grpc.StatusCode.INVALID_ARGUMENT, 400, message="metric name is not valid", times=1))
    bad, good = gpu_points(gpus=1, windows=1), gpu_points(gpus=1, windows=1, t0=T0 + 1)
    with caplog.at_level(logging.ERROR, logger="otel_ofu"):
        exporter.export(Batch(points=bad))
        exporter.export(Batch(points=good))
        assert wait_until(lambda: backend.point_counts() == triples(good))
    assert backend.attempts == 2  # dropped at once, never retried
    reason = "INVALID_ARGUMENT" if backend.protocol == "grpc" else "http_400"
    assert any("permanent error" in r.message and reason in r.message and "metric name is not valid" in r.message
               for r in caplog.records), [r.message for r in caplog.records]
    dropped = telemetry.counters(DROPPED)
    assert {dict(a)["reason"]: v for a, v in dropped.items()} == {"permanent_error": len(bad)}


def test_resource_exhausted_is_retried_only_with_retry_info(make_exporter):
    server = GrpcBackend().start()
    try:
        telemetry = Telemetry()
        exporter = make_exporter("grpc", server.endpoint, telemetry, sending_queue={"num_consumers": 1})
        server.fail(Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, times=1))  # no RetryInfo: too large, split
        first = gpu_points(gpus=1, windows=1)
        exporter.export(Batch(points=first))
        assert wait_until(lambda: backend_has(server, first))
        assert not telemetry.counters(DROPPED) and not telemetry.counters(RETRIED)
        server.fail(Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, retry_after=0.05, times=2))
        points = gpu_points(gpus=1, windows=1, t0=T0 + 5)
        exporter.export(Batch(points=points))
        assert wait_until(lambda: backend_has(server, points))
        assert sum(telemetry.counters(RETRIED).values()) == 2
        assert server.point_counts() == triples(first) + triples(points)
    finally:
        server.stop()


def backend_has(server, points) -> bool:
    counts = server.point_counts()
    return all(counts[k] >= 1 for k in triples(points))


def test_partial_success_counts_rejected_points(backend, make_exporter, caplog):
    telemetry = Telemetry()
    exporter = make_exporter(backend.protocol, backend.endpoint, telemetry)
    backend.partial_reject = 2
    points = gpu_points(gpus=1, windows=1)
    with caplog.at_level(logging.ERROR, logger="otel_ofu"):
        exporter.export(Batch(points=points))
        assert wait_until(lambda: telemetry.counters(DROPPED))
    assert {dict(a)["reason"]: v for a, v in telemetry.counters(DROPPED).items()} == {"rejected": 2}
    assert sum(telemetry.counters(SENT).values()) == len(points) - 2
    assert any("some points were stale" in r.message for r in caplog.records)


def test_without_a_queue_export_sends_before_returning(backend, make_exporter):
    exporter = make_exporter(backend.protocol, backend.endpoint, sending_queue={"enabled": False})
    backend.fail(Failure(grpc.StatusCode.UNAVAILABLE, 503, times=2))
    points = gpu_points(gpus=2, windows=1)
    exporter.export(Batch(points=points))  # retries on this thread, as the Collector does
    assert backend.point_counts() == triples(points)
    assert backend.failed == 2


def test_http_retry_after_parsing():
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == pytest.approx(10.0)
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("nan") is None


# --- configuration and environment ------------------------------------------------------------


def test_env_vars_configure_what_the_config_leaves_out(monkeypatch, make_exporter):
    server = GrpcBackend().start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"http://{server.endpoint}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # the metrics one wins
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=gpu%20fleet,authorization=Bearer%20env")
        exporter = make_exporter("grpc", None, tls={"insecure": None})
        assert exporter.settings.insecure  # from the http:// scheme
        exporter.export(Batch(points=gpu_points(gpus=1, windows=1)))
        assert wait_until(lambda: server.headers)
        assert server.headers[0]["x-tenant"] == "gpu fleet"
        assert server.headers[0]["authorization"] == "Bearer env"
    finally:
        server.stop()


def test_http_env_endpoint_gets_signal_paths(monkeypatch, make_exporter):
    server = HttpBackend().start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.endpoint + "/")
        exporter = make_exporter("http", None)
        exporter.export(Batch(points=gpu_points(gpus=1, windows=1),
                              events=[Event("ofu.job.end", T0, attrs({"a": "b"}))]))
        assert wait_until(lambda: server.metrics and server.logs)
    finally:
        server.stop()


def _cfg(cls, data):
    return build_config(cls, data)


def test_config_wins_over_env_and_env_over_defaults():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://env:4317", "OTEL_EXPORTER_OTLP_HEADERS": "a=1",
           "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "2500", "OTEL_EXPORTER_OTLP_TIMEOUT": "99000",
           "OTEL_EXPORTER_OTLP_COMPRESSION": "none", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/env/ca.pem",
           "OTEL_EXPORTER_OTLP_INSECURE": "true"}
    from_env = resolve(_cfg(OtlpExporterConfig, {}), env)
    assert from_env.targets["metrics"] == "env:4317"
    assert not from_env.insecure  # https:// in the endpoint beats OTEL_EXPORTER_OTLP_INSECURE
    assert from_env.headers == {"a": "1"}
    assert from_env.timeout == 2.5  # milliseconds, the metrics-specific variable first
    assert from_env.compression == "none"
    assert from_env.ca_file == "/env/ca.pem"

    explicit = resolve(_cfg(OtlpExporterConfig, {"endpoint": "cfg:4317", "headers": {"B": "2"}, "timeout": "3s",
                                                 "compression": "gzip", "tls": {"insecure": True}}), env)
    assert (explicit.targets["metrics"], explicit.insecure, explicit.headers, explicit.timeout,
            explicit.compression) == ("cfg:4317", True, {"b": "2"}, 3.0, "gzip")

    defaults = resolve(_cfg(OtlpExporterConfig, {}), {})
    assert (defaults.targets["metrics"], defaults.insecure, defaults.compression, defaults.timeout) == \
           ("localhost:4317", False, "gzip", 10.0)
    assert resolve(_cfg(OtlpExporterConfig, {}), {"OTEL_EXPORTER_OTLP_INSECURE": "true"}).insecure


def test_http_endpoints():
    cfg = _cfg(OtlpHttpExporterConfig, {"endpoint": "https://collector:4318/", "logs_endpoint": "http://l/x"})
    assert resolve(cfg, {}).targets == {"metrics": "https://collector:4318/v1/metrics", "logs": "http://l/x"}
    env = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:1/custom", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:2"}
    assert resolve(_cfg(OtlpHttpExporterConfig, {}), env).targets == {"metrics": "http://m:1/custom",
                                                                      "logs": "http://b:2/v1/logs"}
    assert resolve(_cfg(OtlpHttpExporterConfig, {}), {}).targets["metrics"] == "http://localhost:4318/v1/metrics"
    # logs_endpoint: none: metrics only (no logs target: events are not sent), whatever the environment says.
    metrics_only = _cfg(OtlpHttpExporterConfig, {"endpoint": "http://prometheus:9090/api/v1/otlp",
                                                 "logs_endpoint": "none"})
    assert resolve(metrics_only, {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://l/x"}).targets == {
        "metrics": "http://prometheus:9090/api/v1/otlp/v1/metrics"}


@pytest.mark.parametrize("cls, data, env, key", [
    (OtlpHttpExporterConfig, {"endpoint": "collector:4318"}, {}, "endpoint"),
    (OtlpExporterConfig, {"endpoint": "ftp://x:1"}, {}, "endpoint"),
    (OtlpExporterConfig, {}, {"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "10s"}, "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"),
    (OtlpExporterConfig, {}, {"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "OTEL_EXPORTER_OTLP_COMPRESSION"),
    (OtlpExporterConfig, {}, {"OTEL_EXPORTER_OTLP_INSECURE": "yes"}, "OTEL_EXPORTER_OTLP_INSECURE"),
    (OtlpExporterConfig, {"tls": {"insecure_skip_verify": True}}, {}, "tls.insecure_skip_verify"),
    (OtlpExporterConfig, {"tls": {"cert_file": __file__}}, {}, "tls.key_file"),
    (OtlpExporterConfig, {"tls": {"ca_file": "/nonexistent/ca.pem"}}, {}, "tls.ca_file"),
    (OtlpExporterConfig, {"retry_on_failure": {"max_interval": "1s"}}, {}, "retry_on_failure.max_interval"),
    (OtlpExporterConfig, {"sending_queue": {"queue_size": 0}}, {}, "sending_queue.queue_size"),
    (OtlpExporterConfig, {"compression": "zstd"}, {}, "compression"),
])
def test_bad_settings_name_the_key(monkeypatch, cls, data, env, key):
    for name in list(__import__("os").environ):
        if name.startswith("OTEL_EXPORTER_OTLP"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(FieldError) as err:
        build_config(cls, data)
    assert err.value.key == key


def test_sample_config_validates():
    from otel_ofu.pipeline.service import load_config

    config = load_config(str(ROOT / "collector-config" / "sidecar-otlp.yaml"))
    otlp_cfg = config.components["exporters"]["otlp"]
    assert otlp_cfg.tls.insecure is True
    assert otlp_cfg.sending_queue.storage


# --- TLS ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make test certificates")
    return make_certs(tmp_path_factory.mktemp("certs"))


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def test_grpc_mtls(certs, make_exporter):
    credentials = grpc.ssl_server_credentials([(_read(certs["server.key"]), _read(certs["server.pem"]))],
                                              root_certificates=_read(certs["ca.pem"]), require_client_auth=True)
    server = GrpcBackend(credentials=credentials).start()
    try:
        anonymous = make_exporter("grpc", server.endpoint, Telemetry(), tls={"insecure": False,
                                                                             "ca_file": certs["ca.pem"]})
        anonymous.export(Batch(points=gpu_points(gpus=1, windows=1, t0=T0 - 1)))
        tls = {"insecure": False, "ca_file": certs["ca.pem"], "cert_file": certs["client.pem"],
               "key_file": certs["client.key"]}
        exporter = make_exporter("grpc", server.endpoint, Telemetry(), tls=tls)
        points = gpu_points(gpus=2, windows=1)
        exporter.export(Batch(points=points))
        assert wait_until(lambda: server.point_counts() == triples(points))
        # Without a client certificate the handshake fails (and is retried); nothing gets in.
        assert wait_until(lambda: sum(anonymous.context.telemetry.counters(RETRIED).values()) >= 2)
        assert server.point_counts() == triples(points)
    finally:
        server.stop()


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_https_with_ca_file_or_skip_verify(certs, make_exporter):
    server = HttpBackend(tls=(certs["server.pem"], certs["server.key"])).start()
    try:
        unverified = make_exporter("http", server.endpoint, Telemetry())  # system CAs do not know ours
        unverified.export(Batch(points=gpu_points(gpus=1, windows=1, t0=T0 - 1)))
        with_ca = make_exporter("http", server.endpoint, tls={"ca_file": certs["ca.pem"]})
        with_ca.export(Batch(points=gpu_points(gpus=1, windows=1)))
        skip = make_exporter("http", server.endpoint, tls={"insecure_skip_verify": True})
        skip.export(Batch(points=gpu_points(gpus=1, windows=1, t0=T0 + 1)))
        expected = triples([*gpu_points(gpus=1, windows=1), *gpu_points(gpus=1, windows=1, t0=T0 + 1)])
        assert wait_until(lambda: server.point_counts() == expected)
        retried = unverified.context.telemetry.counters(RETRIED)
        assert wait_until(lambda: sum(unverified.context.telemetry.counters(RETRIED).values()) >= 2), retried
        assert server.point_counts() == expected
    finally:
        server.stop()
