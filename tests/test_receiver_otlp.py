"""The otlp receiver: decode + join (pure), then real gRPC and HTTP clients against a live receiver."""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import math
import ssl
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from otel_ofu.core.model import Batch
from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp import join as otlp_join
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import ConfigError, FieldError, build_config, parse_service_config
from otel_ofu.pipeline.service import Service
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.otlp import REQUESTS, SAMPLES, OtlpReceiver, OtlpReceiverConfig
from tests import certs
from tests.otlp_shapes import H100_FREF_MHZ, Gpu, dcgm_exporter_request, dcgmreceiver_request, scraped_page_request

T0 = 1_764_000_000_000_000_000
EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
GPUS = [Gpu(0, "GPU-aaaa", 0.5, 1755.0), Gpu(1, "GPU-bbbb", 0.25, 1980.0)]


def metric_names(resource_metrics) -> list[str]:
    return sorted(m.name for rm in resource_metrics for sm in rm.scope_metrics for m in sm.metrics)


# --- the pure join -------------------------------------------------------------------------

def test_dcgm_exporter_shape_joins_per_gpu_and_passes_the_rest_through():
    samples, rest = otlp_join.split_request(dcgm_exporter_request(GPUS, T0), window_s=30.0)
    by_uuid = {s.uuid: s for s in samples}
    assert sorted(by_uuid) == ["GPU-aaaa", "GPU-bbbb"]
    a = by_uuid["GPU-aaaa"]
    assert (a.tensor_active, a.sm_clock_mhz, a.sm_clock_samples) == (0.5, 1755.0, 1)
    assert (a.host, a.gpu_index, a.model, a.time_unix_nano, a.window_s) == ("node-1", 0, "NVIDIA H100 80GB HBM3", T0,
                                                                            30.0)
    assert a.resource["gpu.pci_bus_id"] == "00000000:00:00.0"
    assert a.resource["gpu.driver.version"] == "570.86.15"
    # The scrape target (dcgm-exporter's own address) says nothing about the GPU.
    assert not {"service.name", "service.instance.id", "server.address"} & set(a.resource)
    assert by_uuid["GPU-bbbb"].sm_clock_mhz == 1980.0
    # TPA and clock are consumed; the other DCGM metrics pass through untouched, same resource.
    assert metric_names(rest) == ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"]
    assert dict(otlp.attributes_of(rest[0].resource.attributes))["service.name"] == "dcgm-exporter"
    assert len(rest[0].scope_metrics[0].metrics[0].gauge.data_points) == 2


def test_dcgmreceiver_shape_converts_hz_and_keeps_other_pipes():
    samples, rest = otlp_join.split_request(dcgmreceiver_request(GPUS, T0))
    by_uuid = {s.uuid: s for s in samples}
    a = by_uuid["GPU-aaaa"]
    assert a.tensor_active == 0.5
    assert a.sm_clock_mhz == pytest.approx(1755.0, abs=1e-9)  # Hz -> MHz
    assert (a.host, a.gpu_index, a.model) == ("node-2", 0, "NVIDIA H100 80GB HBM3")
    assert a.resource == {"cloud.region": "us-central1"}
    assert by_uuid["GPU-bbbb"].sm_clock_mhz == pytest.approx(1980.0, abs=1e-9)
    assert metric_names(rest) == ["gpu.dcgm.pipe.utilization", "gpu.dcgm.pipe.utilization", "gpu.dcgm.sm.utilization",
                                  "gpu.dcgm.sm.utilization"]
    pipes = [dict(otlp.attributes_of(dp.attributes))["gpu.pipe"] for rm in rest for m in rm.scope_metrics[0].metrics
             if m.name == "gpu.dcgm.pipe.utilization" for dp in m.gauge.data_points]
    assert sorted(pipes) == ["fp16", "fp16", "fp32", "fp32"]  # the tensor points became samples


def test_passthrough_false_drops_other_metrics_but_still_joins():
    request = dcgm_exporter_request(GPUS, T0)
    samples, rest = otlp_join.split_request(request, passthrough=False)
    assert len(samples) == 2 and rest == []
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in metric_names(request.resource_metrics)  # request left alone


def test_join_matches_clock_by_time_window():
    # Two scrapes of one GPU in one request (a Collector batch), 30 s apart, and a clock
    # reading far from any TPA: each TPA gets its own scrape's clock, never the other's; the
    # lone clock is a window of its own, without TPA (no value), its clock kept.
    request = dcgm_exporter_request([Gpu(0, "GPU-a", 0.5, 1500.0)], T0)
    dcgm_exporter_request([Gpu(0, "GPU-a", 0.75, 1800.0)], T0 + 30 * 10**9, request=request)
    lone = dcgm_exporter_request([Gpu(0, "GPU-a", 0.1, 1200.0)], T0 + 300 * 10**9)
    lone_clock = next(m for m in lone.resource_metrics[0].scope_metrics[0].metrics if m.name == "DCGM_FI_DEV_SM_CLOCK")
    request.resource_metrics[0].scope_metrics[0].metrics.add().CopyFrom(lone_clock)
    samples = sorted(otlp_join.split_request(request)[0], key=lambda s: s.time_unix_nano)
    assert [(s.tensor_active, s.sm_clock_mhz) for s in samples] == [(0.5, 1500.0), (0.75, 1800.0), (None, 1200.0)]


def test_tpa_without_clock_is_a_dropped_window_not_zero():
    request = dcgm_exporter_request([Gpu(0, "GPU-a", 0.5, 1500.0)], T0)
    metrics = request.resource_metrics[0].scope_metrics[0].metrics
    del metrics[[m.name for m in metrics].index("DCGM_FI_DEV_SM_CLOCK")]
    samples, _ = otlp_join.split_request(request)
    assert samples[0].sm_clock_mhz is None
    out = OfuProcessor(OfuProcessorConfig(), Context("ofu")).process(Batch(samples=samples))
    names = {p.name for p in out.points}
    assert "gpu.ofu" not in names
    assert dict(next(p for p in out.points if p.name == "gpu.ofu.dropped").attributes)["ofu.drop.reason"] == "missing"


def test_staleness_markers_and_blank_sentinels():
    request = dcgm_exporter_request([Gpu(0, "GPU-a", 0.5, 1500.0), Gpu(1, "GPU-b", 0.5, 1500.0)], T0)
    for metric in request.resource_metrics[0].scope_metrics[0].metrics:
        if metric.name == "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE":
            metric.gauge.data_points[0].flags = 1  # Prometheus staleness marker: the series went away
            metric.gauge.data_points[1].ClearField("as_double")
            metric.gauge.data_points[1].as_int = 0x7FFFFFFFFFFFFFF0 + 2  # INT64 blank, not supported
    samples, rest = otlp_join.split_request(request)
    # GPU-a's TPA series ended: its clock still makes a window, with no TPA (the marker is no reading).
    assert {s.uuid: s.tensor_active for s in samples} == {"GPU-a": None, "GPU-b": 0x7FFFFFFFFFFFFFF0 + 2}
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" not in metric_names(rest)
    out = OfuProcessor(OfuProcessorConfig(), Context("ofu")).process(Batch(samples=samples))
    dropped = {dict(p.resource)["hw.id"]: dict(p.attributes)["ofu.drop.reason"] for p in out.points
               if p.name == "gpu.ofu.dropped"}
    assert dropped == {"GPU-a": "missing", "GPU-b": "not_supported"}


# --- a live receiver -----------------------------------------------------------------------

class Live:
    """A started receiver on free ports whose consumer records batches."""

    def __init__(self, config: dict, tmp_path: Path | None = None):
        config = {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}, **config}
        self.telemetry = Telemetry()
        self.batches: list[Batch] = []
        self.receiver = OtlpReceiver(build_config(OtlpReceiverConfig, config),
                                     Context("otlp", self.telemetry), self.batches.append)
        self.receiver.start()

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.receiver.grpc_port}"

    def outcomes(self) -> dict[tuple[str, str], float]:
        return {(dict(a)["protocol"], dict(a)["outcome"]): v for a, v in self.telemetry.counters(REQUESTS.name).items()}


@pytest.fixture
def live():
    made: list[Live] = []

    def make(config: dict | None = None) -> Live:
        made.append(Live(config or {}))
        return made[-1]

    yield make
    for item in made:
        item.receiver.shutdown()


def grpc_export(target: str, body: bytes, *, metadata=None, credentials=None, compression=None):
    channel = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    with channel:
        call = channel.unary_unary(EXPORT)  # raw bytes both ways
        try:
            reply = call(body, timeout=20, metadata=metadata, compression=compression)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
        ExportMetricsServiceResponse.FromString(reply)
        return grpc.StatusCode.OK, ""


def http_post(port: int, body: bytes, content_type: str = "application/x-protobuf", headers=None,
              context: ssl.SSLContext | None = None, path: str = "/v1/metrics", method: str = "POST"):
    conn = (http.client.HTTPSConnection("127.0.0.1", port, timeout=20, context=context) if context
            else http.client.HTTPConnection("127.0.0.1", port, timeout=20))
    try:
        conn.request(method, path, body=body, headers={"Content-Type": content_type, **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read(), response.getheader("Content-Type")
    finally:
        conn.close()


def good_body() -> bytes:
    return dcgm_exporter_request(GPUS, T0).SerializeToString()


def assert_still_serving(item: Live) -> None:
    before = len(item.batches)
    assert grpc_export(item.grpc_target, good_body())[0] == grpc.StatusCode.OK
    assert http_post(item.receiver.http_port, good_body())[0] == 200
    assert len(item.batches) == before + 2


def test_service_grpc_and_http_protobuf_and_json_give_ofu_and_pass_through(tmp_path):
    out = tmp_path / "out.jsonl"
    doc = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"},
                                             "http": {"endpoint": "127.0.0.1:0"}}}},
        "processors": {"ofu": {"tile_correction": {"enabled": False}}},
        "exporters": {"file": {"path": str(out)}},
        "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["ofu"], "exporters": ["file"]}}},
    }
    service = Service(parse_service_config(doc, "test", registry.factories()))
    service.start()
    try:
        receiver = service.receivers["otlp"]
        # gRPC with gzip (the Collector's otlp exporter default), dcgm-exporter shape.
        code, _ = grpc_export(f"127.0.0.1:{receiver.grpc_port}", good_body(), compression=grpc.Compression.Gzip)
        assert code == grpc.StatusCode.OK
        # HTTP protobuf, gzip (the Collector's otlphttp default), dcgmreceiver shape.
        gpus2 = [Gpu(0, "GPU-cccc", 0.4, 1600.0)]
        status, body, ctype = http_post(receiver.http_port, gzip.compress(dcgmreceiver_request(gpus2, T0)
                                                                          .SerializeToString()),
                                        headers={"Content-Encoding": "gzip"})
        assert (status, ctype) == (200, "application/x-protobuf")
        ExportMetricsServiceResponse.FromString(body)
        # HTTP JSON, dcgm-exporter shape from another node.
        gpus3 = [Gpu(3, "GPU-dddd", 0.9, 1410.0)]
        as_json = json_format.MessageToJson(dcgm_exporter_request(gpus3, T0, host="node-3"))
        status, body, ctype = http_post(receiver.http_port, as_json.encode(), "application/json")
        assert (status, ctype, json.loads(body)) == (200, "application/json", {})
    finally:
        service.shutdown()

    points = [p for line in out.read_text().splitlines() for p in otlp.from_request(otlp.from_json_line(line))]
    raw = {dict(p.resource)["hw.id"]: p.value for p in points if p.name == "gpu.ofu.raw"}
    expected = {g.uuid: g.tpa * g.clock_mhz / H100_FREF_MHZ for g in [*GPUS, *gpus2, *gpus3]}
    assert raw.keys() == expected.keys()
    for uuid, value in expected.items():
        assert math.isclose(raw[uuid], value, rel_tol=1e-12), uuid
    ofu = {dict(p.resource)["hw.id"]: p for p in points if p.name == "gpu.ofu"}
    assert dict(ofu["GPU-dddd"].resource)["host.name"] == "node-3"
    assert dict(ofu["GPU-cccc"].resource)["cloud.region"] == "us-central1"
    # The untouched metrics arrived at the exporter with their own resources.
    passed = {p.name for p in points if p.name.startswith(("DCGM_", "gpu.dcgm."))}
    assert passed == {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "gpu.dcgm.pipe.utilization",
                      "gpu.dcgm.sm.utilization"}
    power = [p for p in points if p.name == "DCGM_FI_DEV_POWER_USAGE"]
    assert all(dict(p.resource)["service.name"] == "dcgm-exporter" for p in power)
    assert {dict(p.attributes)["UUID"] for p in power} == {"GPU-aaaa", "GPU-bbbb", "GPU-dddd"}
    assert service.telemetry.counter(SAMPLES.name, receiver="otlp") == 4


def test_malformed_requests_are_refused_counted_and_survived(live):
    item = live()
    code, details = grpc_export(item.grpc_target, b"\xff\xff\xff\xff not protobuf")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    status, body, _ = http_post(item.receiver.http_port, b"\xff\xff\xff\xff")
    assert status == 400
    assert status_pb2.Status.FromString(body).code == 3  # INVALID_ARGUMENT
    status, body, ctype = http_post(item.receiver.http_port, b'{"resourceMetrics": [', "application/json")
    assert (status, ctype) == (400, "application/json")
    assert json.loads(body)["code"] == 3
    status, _, _ = http_post(item.receiver.http_port, b"\x00garbage", headers={"Content-Encoding": "gzip"})
    assert status == 400
    assert item.outcomes() == {("grpc", "malformed"): 1, ("http", "malformed"): 3}
    assert item.batches == []
    assert_still_serving(item)
    assert item.outcomes()[("grpc", "accepted")] == 1


def test_oversized_requests_get_resource_exhausted_and_413(live):
    item = live({"max_request_size": 4096})
    small = dcgm_exporter_request(GPUS, T0)
    big = ExportMetricsServiceRequest()
    while big.ByteSize() <= 4096:
        dcgm_exporter_request(GPUS, T0, request=big)
    assert big.ByteSize() < 4 * 4096  # below gRPC's own hard limit: otel-ofu refuses and counts it
    code, details = grpc_export(item.grpc_target, big.SerializeToString())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_request_size" in details
    status, body, _ = http_post(item.receiver.http_port, big.SerializeToString())
    assert status == 413
    assert status_pb2.Status.FromString(body).code == 8  # RESOURCE_EXHAUSTED
    # A small gzip body that inflates beyond the limit (a zip bomb) is refused too.
    bomb = gzip.compress(small.SerializeToString() + b"\x00" * 100_000)
    assert len(bomb) < 4096
    status, _, _ = http_post(item.receiver.http_port, bomb, headers={"Content-Encoding": "gzip"})
    assert status == 413
    # Far beyond the limit gRPC itself refuses, with the same status.
    huge = b"\x0a" + b"\xff" * (4 * 4096 + 10)
    assert grpc_export(item.grpc_target, huge)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert item.outcomes() == {("grpc", "too_large"): 1, ("http", "too_large"): 2}
    assert_still_serving(item)


def test_http_content_type_path_and_method(live):
    item = live()
    port = item.receiver.http_port
    assert http_post(port, good_body(), "text/plain")[0] == 415
    assert http_post(port, good_body(), headers={"Content-Encoding": "br"})[0] == 415
    assert http_post(port, good_body(), path="/v1/traces")[0] == 404
    assert http_post(port, b"", method="GET")[0] == 405
    assert item.outcomes() == {("http", "unsupported_media_type"): 2, ("http", "not_found"): 1,
                               ("http", "method_not_allowed"): 1}
    assert_still_serving(item)


def test_bearer_token_auth(live, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    item = live({"auth": {"bearer_token_file": str(token_file)}})
    good = [("authorization", "Bearer s3cret-token")]
    assert grpc_export(item.grpc_target, good_body())[0] == grpc.StatusCode.UNAUTHENTICATED
    assert grpc_export(item.grpc_target, good_body(), metadata=[("authorization", "Bearer nope")])[0] == \
        grpc.StatusCode.UNAUTHENTICATED
    assert grpc_export(item.grpc_target, good_body(), metadata=good)[0] == grpc.StatusCode.OK
    port = item.receiver.http_port
    assert http_post(port, good_body())[0] == 401
    assert http_post(port, good_body(), headers={"Authorization": "Basic s3cret-token"})[0] == 401
    assert http_post(port, good_body(), headers={"Authorization": "Bearer s3cret-token"})[0] == 200
    assert item.outcomes() == {("grpc", "unauthenticated"): 2, ("grpc", "accepted"): 1,
                               ("http", "unauthenticated"): 2, ("http", "accepted"): 1}
    assert len(item.batches) == 2


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    if not certs.available():
        pytest.skip("needs the cryptography package or the openssl command to make test certificates")
    return certs.make(tmp_path_factory.mktemp("certs"))


def test_tls_and_mtls(live, tls_files):
    tls = {"cert_file": str(tls_files.server_cert), "key_file": str(tls_files.server_key),
           "client_ca_file": str(tls_files.ca)}
    item = live({"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "tls": tls},
                               "http": {"endpoint": "127.0.0.1:0", "tls": tls}}})
    ca, cert, key = (tls_files.ca.read_bytes(), tls_files.client_cert.read_bytes(), tls_files.client_key.read_bytes())
    with_cert = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    assert grpc_export(item.grpc_target, good_body(), credentials=with_cert)[0] == grpc.StatusCode.OK
    without_cert = grpc.ssl_channel_credentials(root_certificates=ca)
    assert grpc_export(item.grpc_target, good_body(), credentials=without_cert)[0] == grpc.StatusCode.UNAVAILABLE
    assert grpc_export(item.grpc_target, good_body())[0] == grpc.StatusCode.UNAVAILABLE  # plaintext

    port = item.receiver.http_port
    client = ssl.create_default_context(cafile=str(tls_files.ca))
    client.load_cert_chain(str(tls_files.client_cert), str(tls_files.client_key))
    assert http_post(port, good_body(), context=client)[0] == 200
    bare = ssl.create_default_context(cafile=str(tls_files.ca))
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        http_post(port, good_body(), context=bare)
    wrong_ca = ssl.create_default_context(cafile=str(tls_files.other_ca))
    wrong_ca.load_cert_chain(str(tls_files.client_cert), str(tls_files.client_key))
    with pytest.raises(ssl.SSLError):
        http_post(port, good_body(), context=wrong_ca)  # the client does not trust the server
    # The server counts a failed handshake on its own thread, after the client has seen it fail.
    deadline = time.monotonic() + 30
    while item.outcomes().get(("http", "tls_handshake"), 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert item.outcomes()[("http", "tls_handshake")] == 2
    assert http_post(port, good_body(), context=client)[0] == 200  # still serving
    assert len(item.batches) == 3


def test_config_defaults_and_errors(tmp_path):
    config = build_config(OtlpReceiverConfig, {})
    assert config.grpc().endpoint == "127.0.0.1:4317" and config.http().endpoint == "127.0.0.1:4318"
    assert config.max_request_size == 16 * 1024 * 1024 and config.passthrough is True
    only_grpc = build_config(OtlpReceiverConfig, {"protocols": {"grpc": None}})
    assert only_grpc.grpc().endpoint == "127.0.0.1:4317" and only_grpc.http() is None
    with pytest.raises(FieldError, match="protocols: enable at least one"):
        build_config(OtlpReceiverConfig, {"protocols": {}})
    with pytest.raises(FieldError, match="protocols.http.endpoint"):
        build_config(OtlpReceiverConfig, {"protocols": {"http": {"endpoint": "localhost"}}})
    with pytest.raises(FieldError, match="protocols.grpc.tls.key_file"):
        build_config(OtlpReceiverConfig, {"protocols": {"grpc": {"tls": {"cert_file": str(tmp_path)}}}})
    with pytest.raises(FieldError, match="auth.bearer_token_file: file"):
        build_config(OtlpReceiverConfig, {"auth": {"bearer_token_file": str(tmp_path / "missing")}})
    with pytest.raises(ConfigError, match=r"protocols.grpc.endpont: unknown key \(did you mean 'endpoint'"):
        doc = {"receivers": {"otlp": {"protocols": {"grpc": {"endpont": "x:1"}}}}, "exporters": {"console": {}},
               "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["console"]}}}}
        parse_service_config(doc, "f.yaml", registry.factories())


def test_requests_are_worked_one_at_a_time_while_more_are_taken_in():
    """A request arriving over gRPC while one from HTTP is in the pipeline waits for it (see
    OtlpReceiver.accept); both are then worked and answered."""
    import threading

    inside, most, order = [0], [0], []
    first_in, release = threading.Event(), threading.Event()
    lock = threading.Lock()

    def consumer(batch: Batch) -> None:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            order.append(len(order))
        if len(order) == 1:
            first_in.set()
            release.wait(20)
        with lock:
            inside[0] -= 1

    config = {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}}
    receiver = OtlpReceiver(build_config(OtlpReceiverConfig, config), Context("otlp", Telemetry()), consumer)
    receiver.start()
    try:
        answers: dict[str, object] = {}
        http_thread = threading.Thread(target=lambda: answers.setdefault(
            "http", http_post(receiver.http_port, good_body())[0]))
        http_thread.start()
        assert first_in.wait(20), "the first request never reached the pipeline"
        grpc_thread = threading.Thread(target=lambda: answers.setdefault(
            "grpc", grpc_export(f"127.0.0.1:{receiver.grpc_port}", good_body())[0]))
        grpc_thread.start()
        # Without one-at-a-time the second request reaches the pipeline within milliseconds.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and len(order) < 2:
            time.sleep(0.01)
        assert len(order) == 1
        release.set()
        http_thread.join(20)
        grpc_thread.join(20)
        assert answers == {"http": 200, "grpc": grpc.StatusCode.OK}
        assert len(order) == 2 and most[0] == 1
    finally:
        release.set()
        receiver.shutdown()


def _without(request: ExportMetricsServiceRequest, name: str) -> ExportMetricsServiceRequest:
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            kept = [m for m in sm.metrics if m.name != name]
            del sm.metrics[:]
            sm.metrics.extend(kept)
    return request


def test_a_host_whose_gpus_arrive_without_tensor_activity_is_said_once_with_the_fix_and_when_it_is_back(caplog):
    """A node scraped without profiling fields (dcgm-exporter's default CSV) behind a Collector: said once
    at WARNING naming the host, the field and the fix in dcgm-exporter and in the dcgm receiver; a host
    that sends it is never named; said again (INFO) when it comes back."""
    receiver = OtlpReceiver(OtlpReceiverConfig(), Context("otlp", Telemetry()), lambda batch: None)
    t = T0

    def request(tpa_on_node_1: bool) -> ExportMetricsServiceRequest:
        plain = dcgm_exporter_request(GPUS, t, host="node-1")
        if not tpa_on_node_1:
            _without(plain, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
        return dcgm_exporter_request(GPUS, t, host="node-2", request=plain)

    with caplog.at_level(logging.INFO, logger="otel_ofu"):
        for _ in range(3):
            body = request(tpa_on_node_1=False).SerializeToString()
            receiver.accept(None, "grpc", body)
            t += 30 * 10**9
        assert receiver.missing_fields() == {"node-1": ["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]}
        receiver.accept(None, "grpc", request(tpa_on_node_1=True).SerializeToString())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    (warning,) = warnings
    assert "host node-1 " in warning and "node-2" not in warning
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge" in warning  # the counters CSV line
    assert "dcp-metrics-included.csv" in warning  # dcgm-exporter's Helm chart way
    assert "gpu.dcgm.pipe.utilization (gpu.pipe=tensor)" in warning  # the dcgm receiver's name
    assert "in a request with 2 of its GPUs, none has it" in warning
    assert [r.getMessage() for r in caplog.records if "again" in r.getMessage()] == [
        "the GPUs of host node-1 arrive with DCGM_FI_PROF_PIPE_TENSOR_ACTIVE again"]
    assert receiver.missing_fields() == {}


REAL_OTLP = Path(__file__).parent / "data" / "real" / "otlp"
NVIDIA_SMI_PAGE = Path(__file__).parent / "data" / "real" / "nvidia-gpu-exporter" / "v1.14.0_h100-x2.prom"


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_the_dcgm_receivers_first_names_are_said_once_to_give_no_ofu(caplog):
    """Issue 31 item 16: the dcgm receiver's metrics as named up to 2024-09 (dcgm.gpu.profiling.*: tensor
    activity, no SM clock; the corpus request in that shape, tests/data/real/README.md) pass through whole,
    make no GPU window, and the receiver says once, at WARNING, why no OFU can come of them and what to run."""
    got: list[Batch] = []
    receiver = OtlpReceiver(OtlpReceiverConfig(), Context("otlp", Telemetry()), got.append)
    request = json_format.Parse((REAL_OTLP / "dcgmreceiver-v1_h100.json").read_text(), ExportMetricsServiceRequest())
    body = request.SerializeToString()
    with caplog.at_level(logging.INFO, logger="otel_ofu"):
        for _ in range(3):
            receiver.accept(None, "grpc", body)  # as bytes: the shapes learned on the way must not hide it
    assert not [s for batch in got for s in batch.samples]
    sent = metric_names(request.resource_metrics)
    for batch in got:
        assert metric_names(rm.message for rm in batch.passthrough) == sent  # nothing taken out
    (warning,) = _warnings(caplog)
    assert "host a3-highgpu-8g-017 " in warning and "dcgm.gpu.profiling" in warning
    assert "no SM clock" in warning and "receiver_version: 2" in warning and "gpu.dcgm.clock.frequency" in warning


def test_a_host_scraped_from_an_nvidia_smi_exporter_is_said_once_by_every_receiver(caplog):
    """Issue 31 item 17: utkuozdemir/nvidia_gpu_exporter's page (nvidia-smi's fields: the SM clock, no tensor
    activity; the corpus page) as a Collector forwards its scrapes passes through, and the otlp receiver says
    once, at WARNING, what the host's GPUs lack and how to get OFU. A second receiver in the same process says it
    too: the pass-through shapes both share (otel_ofu.otlp.wire) never take such a ResourceMetrics."""
    page = NVIDIA_SMI_PAGE.read_text()
    for number in range(2):
        got: list[Batch] = []
        receiver = OtlpReceiver(OtlpReceiverConfig(), Context("otlp", Telemetry()), got.append)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="otel_ofu"):
            for scrape in range(3):
                request = scraped_page_request(page, T0 + scrape * 30 * 10**9, "nvidia-gpu-exporter",
                                               "gpu-node-12:9835")
                receiver.accept(None, "grpc", request.SerializeToString())
        assert not [s for batch in got for s in batch.samples]
        assert [metric_names(rm.message for rm in batch.passthrough) for batch in got] == [
            metric_names(request.resource_metrics)] * 3
        (warning,) = _warnings(caplog)
        assert "host gpu-node-12 " in warning, number
        assert "nvidia_smi_" in warning and "no tensor pipe activity" in warning
        assert "dcgm-exporter" in warning and "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge" in warning
        assert "dcp-metrics-included.csv" in warning
