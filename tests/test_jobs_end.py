"""A job's cumulative counters at its end: the final values, its last, partial bin too (issue: the end's counters).

The jobs processor emits job.gpu_seconds, job.wasted_gpu_hours, job.flops, job.energy, job.emissions,
job.ofu.loss.gpu_hours, job.ofu.gain.gpu_hours, job.cost, job.cost.gained and job.stalled_gpu_hours once per
closed bin; when the job ends it emits them once more with its life totals, the values its ofu.job.end event
says. Samples go through the ofu processor and the jobs processor, as in a pipeline, on data time.
"""

from __future__ import annotations

import math

import pytest

from otel_ofu.core.model import JOB_ID, Batch, GpuSample, MetricPoint
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.processors.jobs import JobsProcessor
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig

START = 1_800_000_000  # a whole minute: bins of a minute end at START + 60 k
WINDOW_S = 10
MODEL = "NVIDIA H100 80GB HBM3"  # f_ref 1830 MHz
COUNTERS = ("job.gpu_seconds", "job.wasted_gpu_hours", "job.flops", "job.energy", "job.emissions",
            "job.ofu.loss.gpu_hours", "job.ofu.gain.gpu_hours", "job.cost", "job.cost.gained", "job.stalled_gpu_hours")
CONFIG = {"resolution": "1m", "stall": {"after": "1m"}, "cost": {"per_gpu_hour": {"*": 2.49}, "currency": "USD"},
          "carbon": {"grams_per_kwh": 400}}
# A training step at work (GR, SM, TPA, DRAM, PCIe + NVLink bytes/s) and an NCCL deadlock (tests/test_stalled.py).
WORK = dict(gr=0.95, sm=0.8, tpa=0.45, dram=0.3, links=42e9)
HUNG = dict(gr=1.0, sm=0.1, tpa=0.0, dram=0.01, links=1e6)


def sample(t: int, gpu: int, clock: float = 1755.0, gr=0.95, sm=0.8, tpa=0.45, dram=0.3, links=42e9) -> GpuSample:
    """GPU ``gpu``'s window ending at START + t s; its energy counter at 700 W since START."""
    return GpuSample((START + t) * 10**9, WINDOW_S, "node-a", gpu, f"GPU-{gpu}", MODEL, tpa, clock, 1, 1980.0,
                     gr_active=gr, sm_active=sm, dram_active=dram, job_id="train", precision="bf16",
                     energy_mj=700_000 * t, pcie_tx_bytes_per_s=links / 4, pcie_rx_bytes_per_s=links / 4,
                     nvlink_tx_bytes_per_s=links / 4, nvlink_rx_bytes_per_s=links / 4)


class Pipeline:
    def __init__(self, config: dict | None = None):
        self.ofu = OfuProcessor(build_config(OfuProcessorConfig, {}), Context("ofu"))
        self.t = 0
        self.jobs = JobsProcessor(build_config(JobsConfig, config or CONFIG), Context("jobs"),
                                  clock=lambda: START + self.t)
        self.points: list[MetricPoint] = []
        self.events: list = []

    def send(self, samples: list[GpuSample]) -> None:
        self.t = max(self.t, max(s.time_unix_nano for s in samples) // 10**9 - START)
        out = self.jobs.process(self.ofu.process(Batch(samples=samples)))
        self.points += [p for p in out.points if p.name.startswith("job.")]
        self.events += out.events

    def run(self, until: int, gpus: int = 2, **readings) -> None:
        """Windows of every GPU, one batch each, up to START + until s; GPU 1 boosts above f_ref (a gain)."""
        while self.t < until:
            t = self.t + WINDOW_S
            self.send([sample(t, g, 1980.0 if g == 1 else 1755.0, **readings) for g in range(gpus)])

    def end(self) -> dict:
        """Stop the pipeline (every job ends, reason shutdown): its end event's attributes."""
        final = self.jobs.flush()
        assert final is not None
        self.points += [p for p in final.points if p.name.startswith("job.")]
        self.events += final.events
        (end,) = [dict(e.attributes) for e in self.events if e.name == "ofu.job.end"]
        return end

    def series(self, name: str) -> dict[tuple, list[MetricPoint]]:
        """Each series of ``name`` (by resource and attributes), its points in time order."""
        out: dict[tuple, list[MetricPoint]] = {}
        for p in sorted((p for p in self.points if p.name == name), key=lambda p: p.time_unix_nano):
            out.setdefault((p.resource, p.attributes), []).append(p)
        return out

    def last(self, name: str) -> dict[str | None, MetricPoint]:
        """The last point of each series of ``name``, by its ofu.loss.part (None without one)."""
        return {dict(attributes).get("ofu.loss.part"): points[-1] for (_, attributes), points in
                self.series(name).items()}


def assert_one_value_per_timestamp_and_counters_only_grow(points: list[MetricPoint]) -> None:
    seen: dict[tuple, float] = {}
    for p in points:
        key = (p.name, p.resource, p.attributes, p.time_unix_nano // 1_000_000)  # Prometheus: ms resolution
        assert seen.setdefault(key, p.value) == p.value, f"{p.name} {dict(p.attributes)} at {p.time_unix_nano}"
    series: dict[tuple, list[MetricPoint]] = {}
    for p in sorted((p for p in points if p.monotonic), key=lambda p: p.time_unix_nano):
        series.setdefault((p.name, p.resource, p.attributes), []).append(p)
    for (name, _, attributes), values in series.items():
        assert all(b.value >= a.value for a, b in zip(values, values[1:])), (name, attributes)
        assert len({p.start_time_unix_nano for p in values}) == 1, (name, attributes)


def assert_final_values_are_the_summarys(pipeline: Pipeline, end: dict) -> None:
    """Each counter's last value is the job's life total its end event says, exactly where the event has it."""
    last = {name: pipeline.last(name) for name in COUNTERS}
    assert all(last[name] for name in COUNTERS), [name for name in COUNTERS if not last[name]]
    assert last["job.gpu_seconds"][None].value / 3600.0 == end["ofu.job.gpu_hours"]
    assert last["job.wasted_gpu_hours"][None].value == end["ofu.job.wasted_gpu_hours"]
    assert last["job.flops"][None].value == end["ofu.job.flops"]
    assert last["job.energy"][None].value == end["ofu.job.energy"]
    assert last["job.emissions"][None].value == end["ofu.job.energy"] / 3.6e6 * 400
    assert last["job.stalled_gpu_hours"][None].value == end["ofu.job.stalled_gpu_hours"]
    lost = math.fsum(p.value for p in last["job.ofu.loss.gpu_hours"].values())
    assert lost == pytest.approx(end["ofu.job.wasted_gpu_hours"], rel=1e-12)
    gained = math.fsum(p.value for p in last["job.ofu.gain.gpu_hours"].values())
    assert gained == pytest.approx(end["ofu.job.gained_gpu_hours"], rel=1e-9)
    cost = last["job.cost"]
    assert math.fsum(p.value for part, p in cost.items() if part != "useful") == end["ofu.job.cost.wasted"]
    money = math.fsum(p.value for p in cost.values()) - math.fsum(p.value for p in last["job.cost.gained"].values())
    assert money == pytest.approx(end["ofu.job.cost"], rel=1e-12)
    assert end["ofu.job.cost"] == pytest.approx(2.49 * end["ofu.job.gpu_hours"], rel=1e-12)
    (resource,) = {p.resource for by_part in last.values() for p in by_part.values()}
    assert dict(resource)[JOB_ID] == "train"


def test_a_job_that_ends_mid_bin_ends_its_counters_with_its_summarys_totals():
    """5 min 30 s of two GPUs: the last bin, 30 s, was never a snapshot; the final values count it."""
    pipeline = Pipeline()
    pipeline.run(60, **WORK)
    pipeline.run(240, **HUNG)  # stalled for 3 min (stall.after 1m): job.stalled_gpu_hours
    pipeline.run(330, **WORK)
    end = pipeline.end()
    assert end["ofu.job.gpu_hours"] * 3600 == pytest.approx(2 * 330)
    assert_final_values_are_the_summarys(pipeline, end)
    end_ns = (START + 330) * 10**9
    snapshot_ns = (START + 300) * 10**9
    for name in ("job.gpu_seconds", "job.wasted_gpu_hours", "job.flops", "job.energy", "job.cost"):
        for points in pipeline.series(name).values():
            assert [p.time_unix_nano for p in points[-2:]] == [snapshot_ns, end_ns], name
            assert points[-1].value > points[-2].value, name  # the last 30 s, short before
    (seconds,) = pipeline.series("job.gpu_seconds").values()
    assert seconds[-2].value == 2 * 300 and seconds[-1].value == 2 * 330
    # gauges stay per bin: nothing at the end
    assert not [p for p in pipeline.points if p.time_unix_nano == end_ns and not p.monotonic]
    assert_one_value_per_timestamp_and_counters_only_grow(pipeline.points)


def test_a_job_that_ends_on_a_bins_end_repeats_its_last_snapshot_one_millisecond_later():
    """Its last bin's snapshot already holds every window: the final values are the same, 1 ms later (never a
    second value at the snapshot's timestamp)."""
    pipeline = Pipeline()
    pipeline.run(300, **WORK)
    end = pipeline.end()
    snapshot_ns = (START + 300) * 10**9
    for name in ("job.gpu_seconds", "job.wasted_gpu_hours", "job.flops", "job.energy", "job.emissions",
                 "job.ofu.loss.gpu_hours", "job.ofu.gain.gpu_hours", "job.cost", "job.cost.gained"):
        assert pipeline.series(name), name
        for points in pipeline.series(name).values():
            assert [p.time_unix_nano for p in points[-2:]] == [snapshot_ns, snapshot_ns + 1_000_000], name
            assert points[-1].value == points[-2].value, name
    assert pipeline.last("job.gpu_seconds")[None].value / 3600 == end["ofu.job.gpu_hours"] == 2 * 300 / 3600
    assert pipeline.last("job.wasted_gpu_hours")[None].value == end["ofu.job.wasted_gpu_hours"]
    assert_one_value_per_timestamp_and_counters_only_grow(pipeline.points)


def test_a_window_late_for_the_last_bin_counts_at_the_end_one_millisecond_after_the_bins_end():
    """GPU 0's window closes the last bin before GPU 1's window for it comes: the snapshot at the bin's end holds
    GPU 0's only, the end both. The values differ at the bin's end: the final ones are stamped 1 ms later."""
    pipeline = Pipeline()
    pipeline.run(290, **WORK)
    pipeline.send([sample(300, 0, **WORK)])  # closes the bin ending at 300 s
    pipeline.send([sample(300, 1, 1980.0, **WORK)])  # late for it: no bin closes again before the end
    end = pipeline.end()
    snapshot_ns = (START + 300) * 10**9
    (seconds,) = pipeline.series("job.gpu_seconds").values()
    assert [(p.time_unix_nano, p.value) for p in seconds[-2:]] == [(snapshot_ns, 590.0),
                                                                   (snapshot_ns + 1_000_000, 600.0)]
    assert end["ofu.job.gpu_hours"] == 600 / 3600
    assert pipeline.last("job.wasted_gpu_hours")[None].value == end["ofu.job.wasted_gpu_hours"]
    lost = math.fsum(p.value for p in pipeline.last("job.ofu.loss.gpu_hours").values())
    assert lost == pytest.approx(end["ofu.job.wasted_gpu_hours"], rel=1e-12)
    assert pipeline.last("job.flops")[None].value == end["ofu.job.flops"]
    assert_one_value_per_timestamp_and_counters_only_grow(pipeline.points)


def test_a_job_that_times_out_ends_its_counters_at_its_last_data():
    """Ended by job_timeout while the pipeline runs (its GPUs moved on to no job): the final values go out with
    the batch that ends it, stamped at its last data, not when the end was noticed."""
    pipeline = Pipeline({**CONFIG, "job_timeout": "2m"})
    pipeline.run(150, **WORK)
    while not any(e.name == "ofu.job.end" for e in pipeline.events):
        t = pipeline.t + WINDOW_S
        assert t < 600
        pipeline.send([GpuSample((START + t) * 10**9, WINDOW_S, "node-a", g, f"GPU-{g}", MODEL, 0.0, 1755.0,
                                 gr_active=0.0, sm_active=0.0, dram_active=0.0) for g in range(2)])
    (end,) = [dict(e.attributes) for e in pipeline.events if e.name == "ofu.job.end"]
    assert end["ofu.job.end_reason"] == "timeout"
    (seconds,) = pipeline.series("job.gpu_seconds").values()
    assert seconds[-1].time_unix_nano == (START + 150) * 10**9 and seconds[-2].time_unix_nano == (START + 120) * 10**9
    assert seconds[-1].value == 2 * 150 and seconds[-1].value / 3600 == end["ofu.job.gpu_hours"]
    assert pipeline.last("job.cost")["useful"].time_unix_nano == (START + 150) * 10**9
    assert_one_value_per_timestamp_and_counters_only_grow(pipeline.points)
