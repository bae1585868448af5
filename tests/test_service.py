"""The service: wiring, fan-out, start/shutdown order, failures contained."""

import socket
import subprocess
import threading

import pytest

from otel_ofu.core.model import Batch, GpuSample
from otel_ofu.exporters.console import ConsoleExporterConfig
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.component import Context, Exporter, Factory, Processor
from otel_ofu.pipeline.config import parse_service_config
from otel_ofu.pipeline.service import Pipeline, Service, _ExporterSlot
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from tests.e2e_util import otel_ofu_command
from tools.ports import free_ports


class Recorder(Exporter):
    def __init__(self, config, context):
        super().__init__(config, context)
        self.batches = []
        self.events = []

    def start(self):
        self.events.append("start")

    def export(self, batch):
        self.batches.append(batch)

    def shutdown(self):
        self.events.append("shutdown")


class Boom(Processor):
    def process(self, batch):
        raise RuntimeError("boom")


def sample(uuid="GPU-1"):
    return GpuSample(time_unix_nano=1, window_s=10, host="h", gpu_index=0, uuid=uuid, model="NVIDIA H100 80GB HBM3",
                     tensor_active=0.5, sm_clock_mhz=1830, job_id="j", precision="bf16")


def test_failing_processor_drops_batch_for_its_pipeline_only_and_counts_it():
    telemetry = Telemetry()
    rec_ok, rec_bad = Recorder(None, Context("a")), Recorder(None, Context("b"))
    ok = Pipeline("metrics/ok", [OfuProcessor(OfuProcessorConfig(), Context("ofu"))], [("a", _ExporterSlot(rec_ok))],
                  telemetry)
    bad = Pipeline("metrics/bad", [Boom(None, Context("boom"))], [("b", _ExporterSlot(rec_bad))], telemetry)
    from otel_ofu.pipeline.service import _fan_out
    _fan_out([bad, ok])(Batch(samples=[sample()]))
    assert rec_bad.batches == []
    assert any(p.name == "gpu.ofu" for p in rec_ok.batches[0].points)
    assert telemetry.counter("otel_ofu.pipeline.dropped", pipeline="metrics/bad", reason="processor_error") == 1


def test_fan_out_gives_each_pipeline_its_own_samples():
    class Tag(Processor):
        def process(self, batch):
            for s in batch.samples:
                s.job_id = self.config
            return batch

    recs = [Recorder(None, Context(str(i))) for i in range(2)]
    pipes = [Pipeline(f"p{i}", [Tag(tag, Context("t"))], [(str(i), _ExporterSlot(recs[i]))], Telemetry())
             for i, tag in enumerate(["x", "y"])]
    from otel_ofu.pipeline.service import _fan_out
    _fan_out(pipes)(Batch(samples=[sample()]))
    assert recs[0].batches[0].samples[0].job_id == "x" and recs[1].batches[0].samples[0].job_id == "y"


def test_service_builds_shared_exporters_and_per_pipeline_processors(monkeypatch):
    factories = {k: dict(v) for k, v in registry.factories().items()}
    factories["exporters"]["recorder"] = Factory("recorder", ConsoleExporterConfig, Recorder)
    monkeypatch.setattr(registry, "factories", lambda: factories)
    doc = {"receivers": {"sim": {"nodes": 1, "gpus_per_node": 2, "time_acceleration": 1000}},
           "processors": {"ofu": {}},
           "exporters": {"recorder": {}},
           "service": {"pipelines": {
               "metrics/a": {"receivers": ["sim"], "processors": ["ofu"], "exporters": ["recorder"]},
               "metrics/b": {"receivers": ["sim"], "processors": ["ofu"], "exporters": ["recorder"]}}}}
    service = Service(parse_service_config(doc, "inline", factories))
    assert len(service.exporters) == 1 and len(service.processors) == 2
    assert service.processors[0] is not service.processors[1]
    stop = threading.Event()
    recorder = service.exporters["recorder"].exporter
    threading.Timer(1.5, stop.set).start()
    service.run(stop=stop)
    assert recorder.events == ["start", "shutdown"]
    # Both pipelines delivered the same windows to the one exporter.
    times = [b.points[0].time_unix_nano for b in recorder.batches if b.points]
    assert len(times) >= 4 and len(times) % 2 == 0
    # What came in is counted once per receiver, not per pipeline: per window 2 GPU samples, 2 truth points,
    # 1 reported MFU.
    windows = len(times) // 2
    assert service.telemetry.counter("otel_ofu.receiver.accepted", receiver="sim") == windows * 5



# --- a port already taken at start (issue 31 item 13) ------------------------------------------


@pytest.mark.parametrize("taken", ["otlp grpc", "otlp http", "prometheus"])
def test_a_taken_port_at_start_is_one_line_naming_the_component_and_address(tmp_path, taken):
    """Another process listens on the port: `otel-ofu run` exits 1 with one line naming the
    component and the address, no traceback and no error from components stopped after it (the
    jobs processor's final flush into a file exporter stopped first said "used before start()")."""
    grpc_port, http_port, prom_port = free_ports(3)
    config = tmp_path / "c.yaml"
    config.write_text(f"""
receivers:
  sim: {{nodes: 1, gpus_per_node: 2, time_acceleration: 600}}
  otlp:
    protocols:
      grpc: {{endpoint: 127.0.0.1:{grpc_port}}}
      http: {{endpoint: 127.0.0.1:{http_port}}}
processors: {{ofu: {{}}, jobs: {{}}}}
exporters:
  file: {{path: {tmp_path / "out.jsonl"}}}
  prometheus: {{endpoint: 127.0.0.1:{prom_port}}}
service:
  pipelines:
    metrics: {{receivers: [sim, otlp], processors: [ofu, jobs], exporters: [file, prometheus]}}
""")
    port, component, protocol = {"otlp grpc": (grpc_port, "otlp receiver", " (OTLP/gRPC)"),
                                 "otlp http": (http_port, "otlp receiver", " (OTLP/HTTP)"),
                                 "prometheus": (prom_port, "prometheus exporter", "")}[taken]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        done = subprocess.run(otel_ofu_command(config), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    said = [line for line in done.stderr.splitlines() if "cannot listen" in line]
    assert said == [f"otel-ofu: cannot start: {component}: cannot listen on 127.0.0.1:{port}{protocol}: address "
                    "already in use (another process listens there: another otel-ofu, a Collector; stop it or "
                    "choose another port)"], done.stderr
    assert "Traceback" not in done.stderr and "used before start" not in done.stderr, done.stderr
    assert not [line for line in done.stderr.splitlines() if " ERROR " in line or line.startswith("E")], done.stderr
