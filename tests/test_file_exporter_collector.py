"""The file exporter's files against the real Collector's file exporter (otelcol-ofu's fileexporter v0.161.0).

The same OTLP requests (otel-ofu's GPU points, the SDK's request from the corpus, exemplars with
trace ids, NaN; and events as logs) are written by otel-ofu's file exporter and sent to the
Collector, whose file exporters write them with ``format: proto``, ``format: proto`` +
``compression: zstd`` and ``format: json``. The framing is compared exactly; the records'
messages byte for byte (the Collector decodes and re-encodes them); the Collector reads
otel-ofu's JSON lines (its OTLP/HTTP JSON decoding, the one its otlpjsonfile receiver uses,
which otelcol-ofu does not include) back to the very same protobuf bytes.
"""

from __future__ import annotations

import json
import struct
import urllib.request
from pathlib import Path

import pytest
import yaml
import zstandard
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from otlp_backends import gpu_points

from otel_ofu.core.model import Batch, Event, MetricPoint, attrs
from otel_ofu.exporters.file import FACTORY
from otel_ofu.otlp import wire_json
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from tests.e2e_util import Process, collector_binary, free_ports, port_open, require_alive, wait_for

ROOT = Path(__file__).resolve().parent.parent
SDK_CAPTURE = ROOT / "tests" / "data" / "real" / "otlp" / "sdk-training-reporter.http-protobuf.bin"
T0 = 1_767_225_600_000_000_000


def records(path: Path) -> list[bytes]:
    """The Collector's format: proto framing (exportMessageAsBuffer): a 4-byte big-endian length, the message."""
    data = path.read_bytes() if path.exists() else b""
    out, i = [], 0
    while i + 4 <= len(data):
        (size,) = struct.unpack(">I", data[i:i + 4])
        if i + 4 + size > len(data):
            break
        out.append(data[i + 4:i + 4 + size])
        i += 4 + size
    return out


def the_batch() -> Batch:
    """GPU points (one NaN), the SDK's own request as pass-through, an exemplar with trace and span ids, events."""
    points = gpu_points(gpus=3, windows=1, t0=T0)
    points.append(MetricPoint("gpu.ofu", float("nan"), T0, points[0].resource, attrs({"ofu.job.id": "j"})))
    sdk = ExportMetricsServiceRequest.FromString(SDK_CAPTURE.read_bytes())
    exemplar = metrics_pb2.ResourceMetrics()
    exemplar.resource.attributes.add(key="service.name", value=AnyValue(string_value="trainer"))
    scope = exemplar.scope_metrics.add()
    scope.scope.name = "trainer"
    metric = scope.metrics.add(name="latency", unit="s")
    metric.histogram.aggregation_temporality = 2
    metric.histogram.data_points.add(time_unix_nano=T0, count=2, sum=0.5, bucket_counts=[1, 1], explicit_bounds=[0.1],
                                     exemplars=[metrics_pb2.Exemplar(time_unix_nano=T0, as_double=0.4,
                                                                     trace_id=bytes(range(16)),
                                                                     span_id=bytes(range(8)))])
    events = [Event("ofu.job.start", T0, points[0].resource, attrs({"ofu.job.id": "j"}), "job j started"),
              Event("ofu.finding", T0 + 1, (), attrs({"ofu.job.id": "j"}), "MFU 2× OFU", "WARN")]
    return Batch(points=points, passthrough=[*sdk.resource_metrics, exemplar], events=events)


def canonical(collector_records: list[bytes]) -> list[bytes]:
    """The Collector's metrics and logs records as protobuf (upb) serializes the same messages."""
    metrics, logs = collector_records
    return [ExportMetricsServiceRequest.FromString(metrics).SerializeToString(),
            ExportLogsServiceRequest.FromString(logs).SerializeToString()]


def write_ours(path: Path, **config) -> None:
    made = FACTORY.create(build_config(FACTORY.config_type, {"path": str(path), **config}), Context("file"))
    made.start()
    made.export(the_batch())
    made.shutdown()


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    """otelcol-ofu: an OTLP receiver, file exporters in proto, proto+zstd and json, for metrics and logs."""
    otelcol = collector_binary()
    tmp = tmp_path_factory.mktemp("collector")
    grpc_port, http_port = free_ports(2)
    exporters = {"file/proto": {"path": str(tmp / "proto.bin"), "format": "proto", "flush_interval": "10ms"},
                 "file/zstd": {"path": str(tmp / "zstd.bin"), "format": "proto", "compression": "zstd",
                               "flush_interval": "10ms"},
                 "file/json": {"path": str(tmp / "json.jsonl"), "flush_interval": "10ms"}}
    pipeline = {"receivers": ["otlp"], "exporters": list(exporters)}
    config = tmp / "otelcol.yaml"
    config.write_text(yaml.safe_dump({
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                                             "http": {"endpoint": f"127.0.0.1:{http_port}"}}}},
        "exporters": exporters,
        "service": {"telemetry": {"metrics": {"level": "none"}},
                    "pipelines": {"metrics": pipeline, "logs": pipeline}}}))
    proc = Process("otelcol", [otelcol, f"--config=file:{config}"], tmp / "otelcol.log")
    try:
        wait_for("the Collector's OTLP/HTTP port", lambda: require_alive(proc) or port_open(http_port),
                 diagnostics=proc.tail)
        yield tmp, http_port, proc
    finally:
        proc.stop()


def post(port: int, signal: str, body: bytes, content_type: str) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/{signal}", data=body, method="POST",
                                     headers={"Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def collector_records(collector, path_name: str, count: int) -> list[bytes]:
    tmp, _, proc = collector
    return wait_for(f"{count} records in the Collector's {path_name}",
                    lambda: require_alive(proc) or (found if len(found := records(tmp / path_name)) >= count else None),
                    timeout=60, diagnostics=proc.tail)


def test_proto_records_are_framed_as_the_collectors_and_hold_the_same_messages(collector, tmp_path):
    """The same two requests (metrics, then events as logs) through both file exporters, format: proto."""
    ours = tmp_path / "ours.bin"
    write_ours(ours, format="proto")
    metrics, logs = records(ours)
    assert len(records(ours)) == 2 and sum(4 + len(r) for r in records(ours)) == ours.stat().st_size
    assert ExportMetricsServiceRequest.FromString(metrics).resource_metrics
    assert ExportLogsServiceRequest.FromString(logs).resource_logs
    _, port, _ = collector
    post(port, "metrics", metrics, "application/x-protobuf")
    collector_records(collector, "proto.bin", 1)
    post(port, "logs", logs, "application/x-protobuf")
    theirs = collector_records(collector, "proto.bin", 2)
    # The same framing and the same messages: protobuf reads the Collector's records as the messages ours
    # are, and writes them as ours are written. Not the same bytes: the Collector's pdata writes a message's
    # fields last field first (ours: protobuf's own order, ascending) and empty trace and span ids on log
    # records (protobuf leaves an empty field out).
    assert canonical(theirs) == [metrics, logs] and theirs != [metrics, logs]
    # zstd, per record as the Collector compresses: the same lengths-then-frames framing, each frame one
    # whole message (zstd encoders differ in their bytes, klauspost's and libzstd's; the messages do not).
    zstd_ours = tmp_path / "ours.zst.bin"
    write_ours(zstd_ours, format="proto", compression="zstd")
    theirs_zstd = collector_records(collector, "zstd.bin", 2)
    for framed in (records(zstd_ours), theirs_zstd):
        assert all(r.startswith(b"\x28\xb5\x2f\xfd") for r in framed)
    assert [zstandard.ZstdDecompressor().decompress(r) for r in records(zstd_ours)] == [metrics, logs]
    assert canonical([zstandard.ZstdDecompressor().decompress(r) for r in theirs_zstd]) == [metrics, logs]
    assert sum(4 + len(r) for r in records(zstd_ours)) == zstd_ours.stat().st_size


def test_the_collector_reads_our_json_lines_to_the_same_protobuf(collector, tmp_path):
    """Our JSON lines, posted to the Collector as OTLP/HTTP JSON, come out of its proto file exporter as
    the very bytes our proto file holds: hex trace ids, int64 strings, NaN, enums as numbers all read."""
    ours_json, ours_proto = tmp_path / "ours.jsonl", tmp_path / "ours.bin"
    write_ours(ours_json)
    write_ours(ours_proto, format="proto")
    metrics_line, logs_line = ours_json.read_text().splitlines()
    _, port, _ = collector
    before = len(records(collector[0] / "proto.bin"))
    post(port, "metrics", metrics_line.encode(), "application/json")
    collector_records(collector, "proto.bin", before + 1)
    post(port, "logs", logs_line.encode(), "application/json")
    theirs = canonical(collector_records(collector, "proto.bin", before + 2)[before:])
    # Protobuf's bytes of what the Collector read are ours but for NaN's bits: Go's math.NaN(), which its JSON
    # reader gives "NaN", is 0x7ff8000000000001; Python's float("nan") 0x7ff8000000000000.
    go_nan, python_nan = struct.pack("<Q", 0x7FF8000000000001), struct.pack("<d", float("nan"))
    assert go_nan in theirs[0]
    assert [theirs[0].replace(go_nan, python_nan), theirs[1]] == records(ours_proto)
    # Written back as JSON, what the Collector read is our lines.
    assert [wire_json.request_json(theirs[0]), wire_json.request_json(theirs[1], logs=True)] == [metrics_line,
                                                                                               logs_line]
    # And the Collector's own JSON lines for these requests (its file exporter, format: json) are ours as JSON
    # values. As text they differ: the Collector orders a message's fields as the .proto declares them
    # (json_format, and so ours: by field number) and writes non-ASCII text as UTF-8 (json_format escapes it).
    written = wait_for("the Collector's JSON lines", lambda: (lines := (collector[0] / "json.jsonl").read_text()
                                                             .splitlines()) and len(lines) >= before + 2 and lines)
    assert [json.loads(line) for line in written[before:before + 2]] == [json.loads(metrics_line),
                                                                          json.loads(logs_line)]
