"""The dcgm_exporter receiver against a real local HTTP server serving recorded-style pages."""

from __future__ import annotations

import base64
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from otel_ofu.core import dcgm_fields, tiles
from otel_ofu.core.model import Batch, MetricPoint
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.dcgm_exporter import (
    DcgmExporterReceiver,
    DcgmExporterReceiverConfig,
    normalize_endpoint,
    parse_metrics,
)

DATA = Path(__file__).parent / "data" / "dcgm-exporter"
PAGES = {"h100": "h100.prom", "a100": "a100-old-labels.prom", "b200": "b200-mig.prom", "malformed": "malformed.prom"}
BASIC = "Basic " + base64.b64encode(b"scraper:s3cret").decode()
BEARER = "Bearer tok-123"


class _Handler(BaseHTTPRequestHandler):
    release: threading.Event
    seen: list[dict[str, str]]

    def do_GET(self):  # noqa: N802 - http.server's name
        self.seen.append({"path": self.path, **dict(self.headers.items())})
        route = self.path.strip("/").split("/")[0]
        if route == "error":
            return self._reply(500, b"internal error\n")
        if route == "slow":
            self.release.wait(5)  # far beyond the scrape timeout; released at teardown
            return self._reply(200, (DATA / "h100.prom").read_bytes())
        if route == "basic" and self.headers.get("Authorization") != BASIC:
            return self._reply(401, b"unauthorized\n")
        if route == "bearer" and self.headers.get("Authorization") != BEARER:
            return self._reply(401, b"unauthorized\n")
        page = PAGES.get(route, "h100.prom" if route in ("basic", "bearer") else None)
        if page is None:
            return self._reply(404, b"not found\n")
        return self._reply(200, (DATA / page).read_bytes())

    def _reply(self, status: int, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the scraper gave up (the slow route)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    release = threading.Event()
    handler = type("Handler", (_Handler,), {"release": release, "seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    httpd.base = f"http://127.0.0.1:{httpd.server_address[1]}"  # type: ignore[attr-defined]
    httpd.seen = handler.seen  # type: ignore[attr-defined]
    yield httpd
    release.set()
    httpd.shutdown()
    httpd.server_close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make(config: dict) -> DcgmExporterReceiver:
    cfg = build_config(DcgmExporterReceiverConfig, config)
    return DcgmExporterReceiver(cfg, Context("dcgm_exporter", Telemetry()), lambda batch: None)


def scrape_points(receiver: DcgmExporterReceiver) -> list[MetricPoint]:
    batch = receiver.poll() or Batch()
    return OfuProcessor(OfuProcessorConfig(), Context("ofu", receiver.context.telemetry)).process(batch).points


def by_gpu(points: list[MetricPoint], name: str, **resource) -> list[MetricPoint]:
    return [p for p in points if p.name == name and all(dict(p.resource).get(k) == v for k, v in resource.items())]


def test_h100_page_gives_clock_normalized_ofu_with_kubernetes_attributes(server):
    points = scrape_points(make({"endpoint": f"{server.base}/h100/metrics"}))

    (raw,) = by_gpu(points, "gpu.ofu.raw", **{"gpu.index": "0"})
    assert raw.value == pytest.approx(0.929260 * 1410 / 1830)  # f_ref of the H100 SXM from modelName
    (ofu,) = by_gpu(points, "gpu.ofu", **{"gpu.index": "0"})
    assert ofu.value == pytest.approx(raw.value * tiles.correction_factor("hopper", "unknown"))
    resource = dict(ofu.resource)
    assert resource["host.name"] == "gpu-node-h100-01"
    assert resource["hw.id"] == "GPU-3b1c5e2a-8f0d-4c61-9a7e-1d2f3a4b5c60"
    assert resource["hw.model"] == "NVIDIA H100 80GB HBM3"
    assert resource["k8s.pod.name"] == "llama-70b-pretrain-0"
    assert resource["k8s.namespace.name"] == "ml-research"
    assert resource["k8s.container.name"] == "trainer"
    assert "k8s.pod.uid" not in resource  # pod_uid="" is no value
    (clock,) = by_gpu(points, "gpu.sm.clock.frequency", **{"gpu.index": "0"})
    assert clock.value == 1410e6


def test_a_leaked_blank_sentinel_is_a_dropped_window_never_zero(server):
    points = scrape_points(make({"endpoint": f"{server.base}/h100/metrics"}))

    gpu1 = {"gpu.index": "1"}
    assert by_gpu(points, "gpu.ofu", **gpu1) == [] and by_gpu(points, "gpu.ofu.raw", **gpu1) == []
    assert by_gpu(points, "gpu.tensor.activity", **gpu1) == []
    (dropped,) = by_gpu(points, "gpu.ofu.dropped", **gpu1)
    # 9223372036854775794 = DCGM_INT64_BLANK + 2: parsed as an exact int, so the reason survives.
    assert dict(dropped.attributes)["ofu.drop.reason"] == "not_supported"
    assert by_gpu(points, "gpu.sm.clock.frequency", **gpu1)[0].value == 1980e6  # the readable inputs still flow


def test_old_label_spellings_and_hpc_job(server):
    points = scrape_points(make({"endpoint": f"{server.base}/a100/metrics"}))

    (raw,) = by_gpu(points, "gpu.ofu.raw")
    assert raw.value == pytest.approx(0.929 * 1215 / 1410)  # NVIDIA's A100 sanity point: 0.80
    resource = dict(raw.resource)
    assert resource["host.name"] == "dgx-a100-07"  # from `hostname`
    assert resource["hw.id"] == "GPU-a100aaaa-0000-1111-2222-333344445555"  # from `uuid`
    assert resource["k8s.pod.name"] == "vit-huge-2"  # from pod_name
    assert resource["k8s.namespace.name"] == "vision"  # from pod_namespace
    assert resource["k8s.container.name"] == "pytorch"  # from container_name
    assert resource["hpc.job.id"] == "slurm-4242"
    assert dict(raw.resource)["ofu.job.id"] == "slurm-4242"


def test_mig_instances_are_entities_of_their_own(server):
    receiver = make({"endpoint": f"{server.base}/b200/metrics"})
    batch = receiver.poll()
    assert batch is not None and len(batch.samples) == 2
    assert {s.resource["gpu.mig.instance_id"] for s in batch.samples} == {"1", "2"}
    assert {s.uuid for s in batch.samples} == {"GPU-b200bbbb-6666-7777-8888-99990000aaaa"}
    points = OfuProcessor(OfuProcessorConfig(), Context("ofu")).process(batch).points

    (raw,) = by_gpu(points, "gpu.ofu.raw", **{"gpu.mig.instance_id": "1"})
    assert raw.value == pytest.approx(0.6125 * 1860 / 1856)  # B200 f_ref from the spec table
    assert dict(raw.resource)["gpu.mig.profile"] == "3g.90gb"
    assert dict(raw.resource)["k8s.pod.name"] == "moe-236b-0"
    # Instance 2's TPA series is absent from the page (the exporter omits blanks): missing, not 0.
    assert by_gpu(points, "gpu.ofu", **{"gpu.mig.instance_id": "2"}) == []
    (dropped,) = by_gpu(points, "gpu.ofu.dropped", **{"gpu.mig.instance_id": "2"})
    assert dict(dropped.attributes)["ofu.drop.reason"] == "missing"


def test_failing_endpoints_are_counted_and_never_stop_the_others(server):
    refused = f"http://127.0.0.1:{_closed_port()}/metrics"
    endpoints = [f"{server.base}/h100/metrics", f"{server.base}/malformed/metrics", f"{server.base}/error/metrics",
                 f"{server.base}/slow/metrics", refused, f"{server.base}/a100/metrics"]
    receiver = make({"endpoints": endpoints, "collection_interval": "5s", "scrape_timeout": "300ms"})
    telemetry = receiver.context.telemetry

    for attempt in (1, 2):
        batch = receiver.poll()
        assert batch is not None
        assert sorted(s.host for s in batch.samples) == ["dgx-a100-07", "gpu-node-h100-01", "gpu-node-h100-01"]
        errors = {dict(a)["endpoint"]: (dict(a)["reason"], v) for a, v in telemetry.counters(
            "otel_ofu.scrape.errors").items()}
        assert errors == {
            endpoints[1]: ("malformed", attempt),
            endpoints[2]: ("http_500", attempt),
            endpoints[3]: ("timeout", attempt),
            refused: ("connection_refused", attempt),
        }
    assert telemetry.gauge("otel_ofu.scrape.up", endpoint=endpoints[0]) == 1
    assert telemetry.gauge("otel_ofu.scrape.up", endpoint=endpoints[3]) == 0


def test_basic_auth_from_a_password_file_and_wrong_credentials(server, tmp_path):
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")  # a trailing newline, as editors write it
    ok = make({"endpoint": f"{server.base}/basic/metrics",
               "basic_auth": {"username": "scraper", "password_file": str(secret)}})
    assert ok.poll() is not None
    assert server.seen[-1]["Authorization"] == BASIC
    assert server.seen[-1]["Accept"].startswith("text/plain;version=0.0.4")

    wrong = make({"endpoint": f"{server.base}/basic/metrics", "basic_auth": {"username": "scraper", "password": "no"}})
    assert wrong.poll() is None
    assert wrong.context.telemetry.counter("otel_ofu.scrape.errors", endpoint=f"{server.base}/basic/metrics",
                                           reason="http_401") == 1


def test_bearer_token_inline_and_from_file(server, tmp_path):
    token = tmp_path / "token"
    token.write_text("tok-123")
    for auth in ({"bearer_token": "tok-123"}, {"bearer_token_file": str(token)}):
        receiver = make({"endpoint": f"{server.base}/bearer/metrics", **auth})
        batch = receiver.poll()
        assert batch is not None and len(batch.samples) == 2
    assert make({"endpoint": f"{server.base}/bearer/metrics", "bearer_token": "stale"}).poll() is None


def test_host_name_overrides_the_label_and_the_url_host_is_the_fallback():
    text = (DATA / "h100.prom").read_text()
    assert {s.host for s in parse_metrics(text, time_unix_nano=1, window_s=30, host_override="n1")} == {"n1"}
    no_host = text.replace('Hostname="gpu-node-h100-01",', "")
    assert {s.host for s in parse_metrics(no_host, time_unix_nano=1, window_s=30, default_host="10.0.0.7")} == {
        "10.0.0.7"}


def test_a_scrape_is_one_point_sample_per_exporter_window():
    (sample, _) = parse_metrics((DATA / "h100.prom").read_text(), time_unix_nano=5, window_s=30)
    assert sample.window_s == 30 and sample.sm_clock_samples == 1 and sample.time_unix_nano == 5
    assert sample.source == "dcgm_exporter" and sample.power_w == pytest.approx(612.304)


@pytest.mark.parametrize(("config", "key"), [
    ({}, "endpoint"),
    ({"endpoint": "http://a:9400", "endpoints": ["http://b:9400"]}, "endpoint"),
    ({"endpoints": ["http://a:9400", "ftp://b:9400"]}, "endpoints[1]"),
    ({"endpoint": "http://user:pw@a:9400/metrics"}, "endpoint"),
    ({"endpoint": "http://a:99999"}, "endpoint"),
    ({"endpoints": ["a:9400", "http://a:9400/metrics"]}, "endpoints"),
    ({"endpoint": "a:9400", "collection_interval": "5s", "scrape_timeout": "10s"}, "scrape_timeout"),
    ({"endpoint": "a:9400", "basic_auth": {"username": "u", "password": "p", "password_file": "/etc/hosts"}},
     "basic_auth.password_file"),
    ({"endpoint": "a:9400", "basic_auth": {"password": "p"}}, "basic_auth.username"),
    ({"endpoint": "a:9400", "basic_auth": {"username": "u"}, "bearer_token": "t"}, "basic_auth"),
    ({"endpoint": "a:9400", "bearer_token_file": "/nonexistent/token"}, "bearer_token_file"),
    ({"endpoint": "a:9400", "tls": {"cert_file": "/etc/hosts"}}, "tls.key_file"),
    ({"endpoint": "a:9400", "tls": {"ca_file": "/nonexistent/ca.pem"}}, "tls.ca_file"),
])
def test_config_errors_name_the_key(config, key):
    with pytest.raises(FieldError) as info:
        build_config(DcgmExporterReceiverConfig, config)
    assert info.value.key == key


def test_endpoints_default_to_http_and_the_metrics_path():
    assert normalize_endpoint("node7:9400") == "http://node7:9400/metrics"
    assert normalize_endpoint("https://node7:9400/") == "https://node7:9400/metrics"
    assert normalize_endpoint("http://node7:9400/custom?x=1") == "http://node7:9400/custom?x=1"
    cfg = build_config(DcgmExporterReceiverConfig, {"endpoint": "node7:9400", "collection_interval": "5s"})
    assert cfg.timeout() == 5.0  # the 10s default never exceeds the interval
    assert "s3cret" not in repr(build_config(DcgmExporterReceiverConfig, {
        "endpoint": "a:1", "basic_auth": {"username": "u", "password": "s3cret"}}))



@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    from tests import certs as test_certs

    if not test_certs.available():
        pytest.skip("needs the cryptography package or the openssl command to make test certificates")
    return test_certs.make(tmp_path_factory.mktemp("certs"))


def _serve_tls(server, certs, require_client_cert: bool):
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(certs.ca)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), server.RequestHandlerClass)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


@pytest.fixture
def tls_server(server, certs):
    httpd = _serve_tls(server, certs, require_client_cert=False)
    yield f"https://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def mtls_server(server, certs):
    httpd = _serve_tls(server, certs, require_client_cert=True)
    yield f"https://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_https_verifies_against_ca_file_or_skips_when_told(tls_server, certs):
    url = f"{tls_server}/h100/metrics"
    assert make({"endpoint": url, "tls": {"ca_file": str(certs.ca)}}).poll() is not None
    assert make({"endpoint": url, "tls": {"insecure_skip_verify": True}}).poll() is not None

    for tls in ({}, {"ca_file": str(certs.other_ca)}):  # system CAs / a CA that signed nothing here
        untrusted = make({"endpoint": url, "tls": tls})
        assert untrusted.poll() is None
        assert untrusted.context.telemetry.counter("otel_ofu.scrape.errors", endpoint=url, reason="tls") == 1


def test_client_certificate_for_mutual_tls(mtls_server, certs):
    url = f"{mtls_server}/h100/metrics"
    with_cert = make({"endpoint": url, "tls": {"ca_file": str(certs.ca), "cert_file": str(certs.client_cert),
                                               "key_file": str(certs.client_key)}})
    assert with_cert.poll() is not None
    without = make({"endpoint": url, "tls": {"ca_file": str(certs.ca)}})
    assert without.poll() is None
    assert sum(without.context.telemetry.counters("otel_ofu.scrape.errors").values()) == 1


SAMPLE_OF_FIELD = {  # the GpuSample attribute each field read here lands in (base-unit fields: converted)
    100: ("sm_clock_mhz", 1755.0), 112: ("clock_event_reasons", 4), 113: ("max_sm_clock_mhz", 1980.0),
    155: ("power_w", 612.5), 1001: ("gr_active", 0.96), 1002: ("sm_active", 0.9), 1004: ("tensor_active", 0.7),
    1005: ("dram_active", 0.4), 1603: ("sm_clock_mhz", 1755.0), 1608: ("max_sm_clock_mhz", 1980.0)}


@pytest.mark.parametrize("field", [f for f in dcgm_fields.FIELDS if f.id in SAMPLE_OF_FIELD], ids=lambda f: str(f.id))
def test_every_name_a_field_has_had_is_read_as_that_field_and_documented(field):
    """Issue 31 item 15: a page may name a field by any name it has had (dcgm-exporter names metrics after its
    counters CSV; DCGM 4.6 renamed 1001-1005): each name gives the same reading, in the sample's units, and
    the receiver's page lists it."""
    attribute, expected = SAMPLE_OF_FIELD[field.id]
    raw = expected / field.to_replaced if field.replaces is not None else expected
    docs = (Path(__file__).parents[1] / "docs" / "components" / "receivers" / "dcgm_exporter.md").read_text()
    for name in field.names:
        page = f'# TYPE {name} gauge\n{name}{{gpu="0",UUID="GPU-x",modelName="NVIDIA H100 80GB HBM3"}} {raw:f}\n'
        (sample,) = parse_metrics(page, time_unix_nano=1, window_s=30.0)
        assert getattr(sample, attribute) == pytest.approx(expected), name
        assert f"`{name}`" in docs, name
