"""The issue's run against a real Prometheus 3: an outage, a kill -9 and a restart lose no point and drop no
batch (issue 31, item 1).

otel-ofu (the ``sim`` receiver, ``ofu`` and ``jobs`` with its state on disk) sends over ``otlphttp`` with a
disk queue into Prometheus 3's OTLP receiver, configured as deploy/backends/prometheus-otlp.yml ships it.
Prometheus is down. A second exporter, into a recording backend without a queue, stops answering: the
pipeline is stuck exporting a batch that closed a job bin, after the disk queue took it. Then kill -9,
the restart (its simulated fleet continues where the first stopped), Prometheus up.

Before: the journal was written after the export, so the restart did not know that bin, closed it again
from its first window, and sent it one value apart; Prometheus answered ``400 duplicate sample for
timestamp`` for that request, and otel-ofu dropped all of it, the GPUs' points too.
"""

from __future__ import annotations

import math
import signal
from datetime import UTC, datetime
from pathlib import Path

from e2e_util import Process, otel_ofu_command, prometheus3_binary, wait_for
from otlp_backends import HttpBackend, gpu_points
from test_delivery import make, reasons

from otel_ofu.core.model import JOB_ID, Batch, MetricPoint, attrs
from otel_ofu.delivery.sender import SENT
from otel_ofu.otlp import codec as otlp
from otel_ofu.pipeline.telemetry import Telemetry
from tools.backends import PROMETHEUS_OTLP_CONFIG, PROMETHEUS_OTLP_FLAGS
from tools.demo_prometheus import PrometheusServer

INTERVAL = 10  # seconds of simulated time per window: one batch, and one jobs bin (resolution)
FIRST_BATCHES = 25  # the first process is stuck exporting its 25th batch when it is killed
SECOND_BATCHES = 20

def config(tmp_path: Path, prometheus_port: int, record_port: int, start: float) -> Path:
    path = tmp_path / f"otel-ofu-{int(start)}.yaml"
    path.write_text(f"""
receivers:
  sim:
    nodes: 2
    gpus_per_node: 4
    seed: 11
    start_time: "{datetime.fromtimestamp(start, UTC).isoformat()}"
    time_acceleration: 50
    collection_interval: {INTERVAL}s
    clock_sample_interval: 5s
    jobs:
      - {{id: llama-pretrain, scenario: steady, gpus: 4, node: 0, precision: bf16}}
      - {{id: moe-sft, scenario: moe_inflated, gpus: 3, node: 1}}
processors:
  ofu: {{}}
  jobs:
    storage: {tmp_path / 'jobs-state'}
    resolution: {INTERVAL}s
    windows: [1m]
exporters:
  otlphttp/prometheus:
    endpoint: http://127.0.0.1:{prometheus_port}/api/v1/otlp
    logs_endpoint: none
    retry_on_failure: {{initial_interval: 50ms, max_interval: 500ms, max_elapsed_time: 0s}}
    sending_queue: {{storage: {tmp_path / 'queue'}, queue_size: 100000, num_consumers: 1, drain_timeout: 60s}}
  otlphttp/record:
    endpoint: http://127.0.0.1:{record_port}
    timeout: 10m
    sending_queue: {{enabled: false}}
service:
  pipelines:
    metrics:
      receivers: [sim]
      processors: [ofu, jobs]
      exporters: [otlphttp/prometheus, otlphttp/record]
""")
    return path

def sent_points(backend: HttpBackend) -> list:
    with backend.lock:
        requests = list(backend.metrics)
    return [p for r in requests for p in otlp.from_request(r)]

def test_an_outage_a_kill_and_a_restart_lose_no_point_and_drop_no_batch(tmp_path):
    binary = prometheus3_binary()
    prometheus = PrometheusServer(binary, tmp_path / "prometheus", config=PROMETHEUS_OTLP_CONFIG.read_text(),
                                  flags=PROMETHEUS_OTLP_FLAGS)  # its port taken now, the server started later
    start = float(int(datetime.now(UTC).timestamp()) // 60 * 60 - 3 * 3600)  # simulated time: in the past

    first_record = HttpBackend().start()
    first_record.hold_after = FIRST_BATCHES
    first = Process("otel-ofu first", otel_ofu_command(config(tmp_path, prometheus.port, first_record.port, start)),
                    tmp_path / "first.log")
    second = second_record = None
    try:
        wait_for("the first process to be stuck exporting its last batch",
                 lambda: len(first_record.metrics) >= FIRST_BATCHES or not first.alive(), timeout=180)
        assert first.alive(), first.tail()
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(30)
        first_points = sent_points(first_record)
        stuck = [p for p in otlp.from_request(first_record.metrics[-1])]
        assert any(p.name == "job.ofu" for p in stuck), "the stuck batch closed a job bin"
        last = max(p.time_unix_nano for p in first_points if p.name == "gpu.ofu") / 1e9

        prometheus.start()
        second_record = HttpBackend().start()
        second = Process("otel-ofu second", otel_ofu_command(config(tmp_path, prometheus.port, second_record.port,
                                                                     last)), tmp_path / "second.log")
        wait_for("the restarted process to send its batches",
                 lambda: len(second_record.metrics) >= SECOND_BATCHES or not second.alive(), timeout=180)
        assert second.alive(), second.tail()
        assert second.stop(timeout=120) == 0, second.tail()  # a clean stop drains the disk queue
        log = (tmp_path / "second.log").read_text()
        assert "dropping" not in log and "refuses" not in log, second.tail(80)

        sent = first_points + sent_points(second_record)
        end = max(p.time_unix_nano for p in sent) / 1e9 + 1
        span = f"{math.ceil(end - start) + 60}s"

        def stored(metric: str, label: str) -> dict[tuple[str, int], float]:
            return {(series["metric"][label], round(float(t) * 1000)): float(v)
                    for series in prometheus.api.query(f"{metric}[{span}]", end)
                    for t, v in series["values"]}

        gpu_points = {(dict(p.resource)["hw.id"], p.time_unix_nano // 10**6) for p in sent if p.name == "gpu.ofu"}
        assert len(gpu_points) >= 8 * (FIRST_BATCHES + SECOND_BATCHES) - 8
        missing = gpu_points - set(stored("gpu_ofu", "hw_id"))
        assert not missing, sorted(missing)[:5]

        # Every job.ofu point went out with one value per timestamp, and Prometheus holds that value.
        values: dict[tuple[str, int], set[float]] = {}
        for p in sent:
            if p.name == "job.ofu" and dict(p.attributes).get("ofu.window") == "1m":
                values.setdefault((str(dict(p.resource)[JOB_ID]), p.time_unix_nano // 10**6), set()).add(p.value)
        assert {key: v for key, v in values.items() if len(v) > 1} == {}
        held = stored('job_ofu{ofu_window="1m"}', "ofu_job_id")
        assert {key: next(iter(v)) for key, v in values.items()} == {key: held.get(key) for key in values}
    finally:
        for process in (first, second):
            if process is not None:
                process.stop(timeout=10)
        for backend in (first_record, second_record):
            if backend is not None:
                backend.stop()
        prometheus.stop()


def test_a_sample_prometheus_refuses_costs_only_itself(tmp_path, caplog):
    """Prometheus 3's own answer: a job bin sent again one bit apart among GPU points is refused, its
    request refused whole (400, nothing stored); the exporter sets the sample apart and stores the rest."""
    prometheus = PrometheusServer(prometheus3_binary(), tmp_path / "prometheus",
                                  config=PROMETHEUS_OTLP_CONFIG.read_text(), flags=PROMETHEUS_OTLP_FLAGS).start()
    telemetry = Telemetry()
    exporter = make("http", f"{prometheus.api.url}/api/v1/otlp", telemetry, num_consumers=1, queue_size=100)
    t = (int(datetime.now(UTC).timestamp()) - 600) * 10**9
    job = attrs({"ofu.job.id": "train-7"})

    def job_ofu(value: float) -> MetricPoint:
        return MetricPoint("job.ofu", value, t, job, attrs({"ofu.window": "5m"}), "{ratio}")

    try:
        exporter.export(Batch(points=[job_ofu(0.4567)]))
        wait_for("the first value", lambda: telemetry.counter(SENT, exporter="otlp/t", signal="metrics") == 1)
        gpus = gpu_points(gpus=8, windows=2, t0=t)
        exporter.export(Batch(points=[*gpus[:30], job_ofu(math.nextafter(0.4567, 1.0)), *gpus[30:]]))
        wait_for("the sample refused", lambda: reasons(telemetry) == {"sample_refused": 1} or None, timeout=60)
        assert telemetry.counter(SENT, exporter="otlp/t", signal="metrics") == 1 + len(gpus)
        held = prometheus.api.query("job_ofu[1h]", t / 1e9 + 1)
        assert [[float(v) for _, v in series["values"]] for series in held] == [[0.4567]]
        stored = {(s["metric"]["hw_id"], s["metric"]["__name__"], round(float(ts) * 1e9))
                  for s in prometheus.api.query('{__name__=~"gpu_.*", hw_id!=""}[1h]', t / 1e9 + 60)
                  for ts, _ in s["values"]}
        assert len(stored) == len(gpus)
        refused = [r.getMessage() for r in caplog.records if "the backend refuses" in r.getMessage()]
        assert len(refused) == 1 and "job.ofu{ofu.job.id=train-7, ofu.window=5m}" in refused[0], refused
        assert "duplicate sample for timestamp" in refused[0]
    finally:
        exporter.shutdown()
        prometheus.stop()
