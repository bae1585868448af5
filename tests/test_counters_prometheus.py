"""A job whose SM clock boosts above f_ref, its cumulative counters in a real Prometheus 3: no counter reset.

Issue 31 item 6 (and issue 33, which builds the report from the backend with ``increase()``): a lightly
loaded, memory-bound job on H100s boosting at 1980 MHz against the 1830 MHz f_ref has a negative clock
part in every window; a few windows are power-capped, a few pass OFU 1. The real ofu and jobs processors
make its points, otel-ofu's own otlphttp exporter sends them into Prometheus 3's OTLP receiver with the
shipped settings (deploy/backends/prometheus-otlp.yml), and Prometheus answers ``resets()`` and
``increase()``. Before, ``job.ofu.loss.gpu_hours{clock}`` and ``job.wasted_gpu_hours`` fell whenever a
bin's gain outweighed its loss: Prometheus saw a counter reset in each and ``increase()`` counted the whole
value again.
"""

from __future__ import annotations

import math
import time

import pytest

from otel_ofu.core.model import Batch, GpuSample
from otel_ofu.exporters import otlphttp
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.processors.jobs import JobsProcessor
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from tests.e2e_util import prometheus3_binary, wait_for
from tools.backends import PROMETHEUS_OTLP_CONFIG, PROMETHEUS_OTLP_FLAGS, prometheus_config
from tools.demo_prometheus import PrometheusServer

H100 = "NVIDIA H100 80GB HBM3"  # f_ref 1830 MHz (docs/gpus.md)
WINDOW_S = 10
STEPS = 150  # 25 minutes of 10 s windows, two GPUs
COUNTERS = ("job_gpu_seconds_total", "job_wasted_gpu_hours_total", "job_ofu_loss_gpu_hours_total",
            "job_ofu_gain_gpu_hours_total", "fleet_gpu_hours_total", "fleet_gpu_hours_gained_total")


def _window(step: int, gpu: int) -> tuple[float, float, int]:
    """(TPA, SM clock MHz, clock event reasons) of one GPU window: mostly a light, memory-bound load boosting at
    the maximum clock (a clock gain), every 7th window power-capped (a clock loss), every 23rd tensor-bound at
    the boost clock (OFU above 1)."""
    if (step + gpu) % 23 == 0:
        return 0.99, 1980.0, 0x0
    if (step + 3 * gpu) % 7 == 0:
        return 0.6, 1400.0, 0x4
    return 0.3, 1980.0, 0x0


def _job_points(t0: float) -> list[Batch]:
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    jobs = JobsProcessor(build_config(JobsConfig, {}), Context("jobs"), clock=lambda: t0 + STEPS * WINDOW_S)
    batches = []
    for step in range(STEPS):
        t = t0 + (step + 1) * WINDOW_S
        samples = []
        for gpu in range(2):
            tpa, clock, reasons = _window(step, gpu)
            samples.append(GpuSample(int(t * 1e9), float(WINDOW_S), "node-0", gpu, f"GPU-{gpu}", H100, tpa, clock,
                                     clock_event_reasons=reasons, sm_active=min(1.0, tpa + 0.2),
                                     gr_active=min(1.0, tpa + 0.3), dram_active=0.7, job_id="boosting",
                                     precision="bf16"))
        out = jobs.process(ofu.process(Batch(samples=samples)))
        if out.points:
            batches.append(Batch(points=out.points))
    return batches


# Prometheus' created-timestamp-zero-ingestion: a counter's OTLP start time (the job's start) becomes a 0 sample, so
# increase() over the job's life is the counter's final value.
CREATED_ZERO = "--enable-feature=created-timestamp-zero-ingestion"


@pytest.mark.parametrize("created_zero", [False, True], ids=["shipped", "created_timestamp_zero"])
def test_increase_over_a_boosting_jobs_life_is_its_final_value_with_no_counter_reset(tmp_path, created_zero):
    """Every cumulative counter the jobs processor sends: resets() 0 over its life, and increase() its growth:
    from the first sample to the last; with a zero at the job's start (created timestamps), its final value."""
    flags = (*PROMETHEUS_OTLP_FLAGS, CREATED_ZERO) if created_zero else PROMETHEUS_OTLP_FLAGS
    prometheus = PrometheusServer(prometheus3_binary(), tmp_path / "prometheus",
                                  config=prometheus_config(PROMETHEUS_OTLP_CONFIG), flags=flags)
    prometheus.start()
    try:
        t0 = math.floor(time.time() / 60) * 60 - 3600  # within the head block, as a live job's points are
        batches = _job_points(t0)
        exporter = otlphttp.FACTORY.create(
            build_config(otlphttp.FACTORY.config_type, {"endpoint": f"{prometheus.api.url}/api/v1/otlp",
                                                        "logs_endpoint": "none"}),
            Context("otlphttp/prometheus"))
        exporter.start()
        for batch in batches:
            exporter.export(batch)
        exporter.shutdown()  # flushes its queue
        sent: dict[tuple, list[tuple[float, float]]] = {}  # (name, part) -> (time, value) as sent, in time order
        for batch in batches:
            for p in batch.points:
                if p.monotonic:
                    part = dict(p.attributes).get("ofu.loss.part")
                    sent.setdefault((p.name, part), []).append((p.time_unix_nano / 1e9, p.value))
        assert ("job.ofu.gain.gpu_hours", "clock") in sent and ("job.ofu.loss.gpu_hours", "clock") in sent
        end = max(t for points in sent.values() for t, _ in points)
        api = prometheus.api
        wait_for("the job's points in Prometheus", lambda: api.query("job_gpu_seconds_total", end), timeout=60)

        checked = 0
        for name in COUNTERS:
            for series in api.query(f'{{__name__="{name}"}}[2h]', end):  # each series' raw samples
                labels = series["metric"]
                selector = ", ".join(f'{k}="{v}"' for k, v in labels.items() if k != "__name__")
                (first_t, first), *_, (_, last) = [(float(t), float(v)) for t, v in series["values"]]
                span = f"{round((end - first_t) * 1000) + 1}ms"  # its whole life: from just before its first sample
                resets = float(api.query(f"resets({name}{{{selector}}}[{span}])", end)[0]["value"][1])
                increase = float(api.query(f"increase({name}{{{selector}}}[{span}])", end)[0]["value"][1])
                assert resets == 0, (name, labels)
                assert increase == pytest.approx(last - first, rel=1e-4, abs=1e-9), (name, labels, first, last)
                if created_zero and name.startswith("job_"):  # from 0 at the job's start: the final value
                    assert first == 0 and first_t == t0
                    assert increase == pytest.approx(last, rel=1e-4), (name, labels, last)
                checked += 1
        assert checked >= 8  # gpu seconds, waste, the loss parts, the gain, the fleet's
    finally:
        prometheus.stop()
