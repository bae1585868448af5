"""The stalled finding (otel_ofu.jobs.stall): GPUs that keep their engine busy while nothing moves.

Samples go through the ofu processor (which makes the loss account and gpu.link.throughput the
jobs processor judges on) and then the jobs processor, as in a pipeline. The simulated fleet's
scenarios (hung, input_bound, memory_bound, checkpoint) are run as the demo runs them.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu.core.model import JOB_ID, Batch, GpuSample
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.jobs.findings import STALLED, STALLED_ENGINE_BUSY_NO_WORK
from otel_ofu.jobs.stall import (
    EVIDENCE_ACTIVITY_ONLY,
    EVIDENCE_LINKS,
    IDLE,
    STALLED_WINDOW,
    UNKNOWN,
    WORK_RESUMED,
    WORKING,
    StallConfig,
    window_state,
)
from otel_ofu.otlp import codec as otlp
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.processors.jobs import JobsProcessor
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.sim import SimReceiverConfig, build_fleet, window_batch
from otel_ofu.report.build import build_report, render_table, report_json, write_csv

ROOT = Path(__file__).resolve().parent.parent
START = 1_800_000_000.0
WINDOW_S = 10.0
MODEL = "NVIDIA H100 80GB HBM3"
# What a working training step reads (GR, SM, TPA, DRAM, PCIe and NVLink bytes/s each way).
WORK = dict(gr=0.95, sm=0.8, tpa=0.45, dram=0.3, pcie=2e9, nvlink=40e9)
# An NCCL deadlock: a kernel resident (GR 1), a collective spinning on a few SMs, nothing else moving.
HUNG = dict(gr=1.0, sm=0.1, tpa=0.0, dram=0.01, pcie=1e6, nvlink=0.0)


def sample(t: float, gpu: int, job: str, gr=None, sm=None, tpa=0.0, dram=None, pcie=None, nvlink=None) -> GpuSample:
    return GpuSample(int(t * 1e9), WINDOW_S, "node-a", gpu, f"GPU-{gpu:08d}-0000-0000-0000-000000000000", MODEL,
                     tpa, 1755.0, 1, 1980.0, gr_active=gr, sm_active=sm, dram_active=dram, job_id=job,
                     precision="bf16", pcie_tx_bytes_per_s=None if pcie is None else pcie / 2,
                     pcie_rx_bytes_per_s=None if pcie is None else pcie / 2,
                     nvlink_tx_bytes_per_s=None if nvlink is None else nvlink / 2,
                     nvlink_rx_bytes_per_s=None if nvlink is None else nvlink / 2)


class Pipeline:
    """The ofu processor then the jobs processor, on data time (the jobs processor's clock follows it)."""

    def __init__(self, jobs: dict | None = None):
        self.t = START
        self.ofu = OfuProcessor(build_config(OfuProcessorConfig, {}), Context("ofu"))
        self.jobs = JobsProcessor(build_config(JobsConfig, jobs or {}), Context("jobs"), clock=lambda: self.t)
        self.events: list = []
        self.points: list = []
        self.lines: list[str] = []  # everything the jobs processor passed on, as the file exporter writes it

    def run(self, minutes: float, gpus: int = 2, job: str = "train", **readings) -> None:
        for _ in range(round(minutes * 60 / WINDOW_S)):
            self.t += WINDOW_S
            out = self.jobs.process(self.ofu.process(Batch(samples=[sample(self.t, g, job, **readings)
                                                                     for g in range(gpus)])))
            self.events += out.events
            self.points += [p for p in out.points if p.name.startswith("job.")]
            self.record(out)

    def record(self, out: Batch) -> None:
        if out.points:
            self.lines.append(otlp.to_json_line(otlp.to_request(out.points)))
        if out.events:
            self.lines.append(otlp.to_json_line(otlp.events_to_request(out.events)))

    def end(self) -> None:
        final = self.jobs.flush()
        if final is not None:
            self.events += final.events
            self.points += final.points
            self.record(final)

    def stalled(self, name: str = "ofu.finding.open") -> list[dict]:
        return [dict(e.attributes) for e in self.stalled_events(name)]

    def stalled_events(self, name: str) -> list:
        return [e for e in self.events if e.name == name and dict(e.attributes)["ofu.finding.kind"] == STALLED]


def test_a_hung_job_is_found_after_ten_minutes_and_cleared_when_work_resumes(caplog):
    caplog.set_level("INFO", logger="otel_ofu")
    pipeline = Pipeline()
    pipeline.run(15, **WORK)
    pipeline.run(9, **HUNG)
    assert pipeline.stalled() == []  # nine minutes: not yet
    pipeline.run(3, **HUNG)
    [opened] = pipeline.stalled()
    assert opened["ofu.finding.cause"] == STALLED_ENGINE_BUSY_NO_WORK
    assert opened["ofu.finding.evidence"] == EVIDENCE_LINKS  # NVLink/PCIe read idle, not only the activity counters
    assert opened["ofu.finding.stalled_for_s"] == 600.0
    # two GPUs for ten minutes, less the part of the first stalled bin still at work
    assert 0.3 <= opened["ofu.finding.stalled_gpu_hours"] <= 2 * 600 / 3600
    [event] = pipeline.stalled_events("ofu.finding.open")
    assert event.severity == "WARN"
    text = event.body
    assert "engine busy" in text and "likely engine_busy_no_work" in text
    assert any(p.name == "job.finding" and p.value == 1.0 and dict(p.attributes)["ofu.finding.kind"] == STALLED
               for p in pipeline.points)
    pipeline.run(5, **HUNG)
    pipeline.run(2, **WORK)
    [closed] = pipeline.stalled("ofu.finding.close")
    assert closed["ofu.finding.reason"] == WORK_RESUMED
    assert closed["ofu.finding.stalled_gpu_hours"] > opened["ofu.finding.stalled_gpu_hours"]
    assert "work resumed" in pipeline.stalled_events("ofu.finding.close")[0].body
    assert any(p.name == "job.finding" and p.value == 0.0 for p in pipeline.points)
    hours = [p.value for p in pipeline.points if p.name == "job.stalled_gpu_hours"]
    assert hours == sorted(hours) and hours[-1] == pytest.approx(closed["ofu.finding.stalled_gpu_hours"])
    pipeline.end()
    assert not any("cannot be told" in r.getMessage() for r in caplog.records)  # GR read: it can tell
    end = next(dict(e.attributes) for e in pipeline.events if e.name == "ofu.job.end")
    assert end["ofu.job.stalled_gpu_hours"] == pytest.approx(closed["ofu.finding.stalled_gpu_hours"])


def test_without_link_counters_the_activity_counters_decide_and_say_so():
    pipeline = Pipeline()
    pipeline.run(5, **{**WORK, "pcie": None, "nvlink": None})
    pipeline.run(12, **{**HUNG, "pcie": None, "nvlink": None})
    [opened] = pipeline.stalled()
    assert opened["ofu.finding.evidence"] == EVIDENCE_ACTIVITY_ONLY
    assert "reads no NVLink/PCIe traffic" in pipeline.stalled_events("ofu.finding.open")[0].body


def test_link_traffic_alone_is_work_a_job_moving_data_is_not_stalled():
    pipeline = Pipeline()
    pipeline.run(20, **{**HUNG, "nvlink": 20e9})  # tensor idle, engine busy, NVLink moving: a long all-reduce
    assert pipeline.stalled() == []


def test_where_gr_is_not_read_a_busy_sm_says_busy():
    pipeline = Pipeline()
    pipeline.run(12, gr=None, sm=0.95, tpa=0.0, dram=0.02)
    [opened] = pipeline.stalled()
    assert opened["ofu.finding.evidence"] == EVIDENCE_ACTIVITY_ONLY


def test_gpus_without_gr_or_sm_cannot_tell_and_raise_nothing(caplog):
    pipeline = Pipeline()
    with caplog.at_level("INFO", logger="otel_ofu"):
        pipeline.run(30, gr=None, sm=None, tpa=0.0, dram=0.01, pcie=1e6, nvlink=0.0)
    assert pipeline.stalled() == []
    said = [r.getMessage() for r in caplog.records if "cannot be told" in r.getMessage()]
    assert len(said) == 1 and "job train" in said[0]  # said once, naming the job
    config = StallConfig()
    parts = ((("engine_idle+sm_idle+non_tensor", 1.0), ("clock", 0.0), ("padding", 0.0)), {})
    assert window_state(parts, 0.0, config) == UNKNOWN
    assert window_state(None, 0.0, config) == UNKNOWN  # no loss account came with the window


def test_a_memory_bound_window_is_work():
    pipeline = Pipeline()
    pipeline.run(20, gr=1.0, sm=0.95, tpa=0.0, dram=0.9)  # no tensor work at all, DRAM streaming
    assert pipeline.stalled() == []


def test_a_job_between_steps_is_not_stalled_the_window_must_be_continuous():
    pipeline = Pipeline()
    for _ in range(6):  # an hour: eight minutes that look stalled, then two of work (an eval, a slow step)
        pipeline.run(8, **HUNG)
        pipeline.run(2, **WORK)
    assert pipeline.stalled() == []


def test_a_missing_bin_breaks_the_streak():
    pipeline = Pipeline({"job_timeout": "30m", "silence_timeout": "30m"})
    pipeline.run(6, **HUNG)
    pipeline.t += 180  # three minutes without data
    pipeline.run(6, **HUNG)
    assert pipeline.stalled() == []
    pipeline.run(5, **HUNG)
    [opened] = pipeline.stalled()
    assert opened["ofu.finding.stalled_for_s"] == 600.0


def test_an_open_stalled_finding_closes_with_its_job():
    pipeline = Pipeline()
    pipeline.run(12, **HUNG)
    pipeline.end()
    [closed] = pipeline.stalled("ofu.finding.close")
    assert closed["ofu.finding.reason"] == "job_end"


def test_stall_after_and_thresholds_are_validated():
    with pytest.raises(FieldError, match="stall.after"):
        build_config(JobsConfig, {"stall": {"after": "30s"}})
    with pytest.raises(FieldError, match="engine_busy"):
        build_config(JobsConfig, {"stall": {"engine_busy": 1.5}})
    with pytest.raises(FieldError, match="link_idle"):
        build_config(JobsConfig, {"stall": {"link_idle": -1}})
    with pytest.raises(FieldError, match="tensor_idle"):
        build_config(JobsConfig, {"stall": {"tensor_idle": 0.95}})
    pipeline = Pipeline({"stall": {"after": "3m"}})
    pipeline.run(4, **HUNG)
    assert len(pipeline.stalled()) == 1
    pipeline = Pipeline({"stall": {"enabled": False}})
    pipeline.run(20, **HUNG)
    assert pipeline.stalled() == []


def test_window_states_from_the_ofu_processors_account():
    """Each state from the points the ofu processor makes of one window's readings."""
    ofu = OfuProcessor(build_config(OfuProcessorConfig, {}), Context("ofu"))
    config = StallConfig()

    def state(**readings) -> str:
        points = ofu.sample_points(sample(START, 0, "j", **readings))
        from otel_ofu.jobs.loss import window_parts
        parts = next(iter(window_parts(points).values()), None)
        traffic = [p.value for p in points if p.name == "gpu.link.throughput"]
        links = sum(traffic) if traffic else None
        return window_state(parts, links, config)

    assert state(**WORK) == WORKING
    assert state(**HUNG) == STALLED_WINDOW
    assert state(gr=0.3, sm=0.25, tpa=0.0, dram=0.05) == IDLE  # waiting for its input
    assert state(gr=1.0, sm=0.95, tpa=0.0, dram=0.9) == WORKING  # memory-bound
    assert state(**{**HUNG, "pcie": 4e9}) == WORKING  # moving data over PCIe (offload, a checkpoint read)


def test_the_ofu_processor_emits_link_traffic_both_ways_or_none():
    ofu = OfuProcessor(build_config(OfuProcessorConfig, {}), Context("ofu"))
    points = ofu.sample_points(sample(START, 0, "j", gr=1.0, sm=0.5, tpa=0.1, pcie=3e9, nvlink=6e11))
    links = {dict(p.attributes)["ofu.link"]: p for p in points if p.name == "gpu.link.throughput"}
    assert {k: p.value for k, p in links.items()} == {"pcie": 3e9, "nvlink": 6e11}  # 600 GB/s is no DCGM blank
    assert {p.unit for p in links.values()} == {"By/s"}
    one_way = sample(START + 10, 0, "j", gr=1.0, sm=0.5, tpa=0.1)
    one_way.pcie_tx_bytes_per_s = 1e9  # rx not read: no value, never tx alone
    one_way.nvlink_tx_bytes_per_s, one_way.nvlink_rx_bytes_per_s = 9223372036854775794, 0  # DCGM's int64 blank
    assert [p for p in ofu.sample_points(one_way) if p.name == "gpu.link.throughput"] == []


SIM_JOBS = [
    {"id": "hung", "scenario": "hung", "gpus": 4, "node": 0, "hang_at": "15m"},
    {"id": "input-bound", "scenario": "input_bound", "gpus": 2, "node": 1},
    {"id": "memory-bound", "scenario": "memory_bound", "gpus": 2, "node": 1},
    {"id": "checkpoint", "scenario": "checkpoint", "gpus": 2, "node": 1, "checkpoint_every": "10m",
     "checkpoint_length": "2m"},
    {"id": "steady", "scenario": "steady", "gpus": 2, "node": 1},
]


@pytest.mark.parametrize("seed", [42, 7])
def test_the_simulated_hung_job_is_found_and_the_input_and_memory_bound_jobs_are_not(seed):
    sim_config = build_config(SimReceiverConfig, {"nodes": 2, "gpus_per_node": 8, "models": [MODEL],
                                                  "jobs": SIM_JOBS, "seed": seed, "collection_interval": "10s"})
    fleet = build_fleet(sim_config, START)
    ofu = OfuProcessor(build_config(OfuProcessorConfig, {}), Context("ofu"))
    jobs = JobsProcessor(build_config(JobsConfig, {}), Context("jobs"), clock=lambda: START + fleet.t)
    events = []
    links = False  # whether the simulator reports link traffic
    for _ in range(int(40 * 60 / WINDOW_S)):
        results = fleet.step_window()
        links |= any(s.pcie_tx_bytes_per_s is not None or s.nvlink_tx_bytes_per_s is not None for s, _ in results)
        events += jobs.process(ofu.process(window_batch(results, True))).events
    opened = [dict(e.attributes) for e in events if e.name == "ofu.finding.open"
              and dict(e.attributes)["ofu.finding.kind"] == STALLED]
    assert [a[JOB_ID] for a in opened] == ["hung"]
    # it hung 15 minutes in: found ten minutes later, within a bin
    assert opened[0]["ofu.finding.since_unix_nano"] == pytest.approx((START + 15 * 60) * 1e9, abs=60e9)
    assert opened[0]["ofu.finding.opened_unix_nano"] <= (START + 26 * 60) * 1e9
    assert opened[0]["ofu.finding.evidence"] == (EVIDENCE_LINKS if links else EVIDENCE_ACTIVITY_ONLY)


@pytest.mark.parametrize("recompute", [False, True], ids=["recorded", "recomputed"])
def test_the_report_lists_each_jobs_stalled_gpu_hours(tmp_path, recompute):
    """The file exporter's recording of a hung job beside a working one: the report's JSON, table, findings and
    CSV carry the stalled GPU-hours, from the recorded events or recomputed from the points (links included)."""
    pipeline = Pipeline()
    for minutes, hung in ((5, WORK), (15, HUNG), (3, WORK)):
        for _ in range(round(minutes * 60 / WINDOW_S)):
            pipeline.t += WINDOW_S
            samples = [sample(pipeline.t, g, "hung-job", **hung) for g in range(2)]
            samples += [sample(pipeline.t, g, "working-job", **WORK) for g in range(2, 4)]
            out = pipeline.jobs.process(pipeline.ofu.process(Batch(samples=samples)))
            pipeline.events += out.events
            pipeline.record(out)
    pipeline.end()
    recording = tmp_path / "out.jsonl"
    recording.write_text("\n".join(pipeline.lines) + "\n")
    [closed] = pipeline.stalled("ofu.finding.close")
    report = build_report(recording, recompute=recompute)
    data = report_json(report)
    by_job = {j["job_id"]: j for j in data["jobs"]}
    assert by_job["working-job"]["stalled_gpu_hours"] is None
    hours = by_job["hung-job"]["stalled_gpu_hours"]
    assert hours == pytest.approx(closed["ofu.finding.stalled_gpu_hours"])
    assert data["fleet"]["stalled_gpu_hours"] == pytest.approx(hours)
    [finding] = [f for f in by_job["hung-job"]["findings"] if f["kind"] == STALLED]
    assert finding["close_numbers"]["reason"] == WORK_RESUMED
    text = render_table(report)
    assert f"Stalled: {hours:.2f} GPU h held by 1 job(s)" in text
    assert f"({hours:.2f} GPU h stalled)" in text  # the job table's findings column
    assert "engine busy with nothing moving for" in text and "(links and activity)" in text
    write_csv(report, tmp_path / "jobs.csv")
    rows = {r["job_id"]: r for r in csv.DictReader((tmp_path / "jobs.csv").open())}
    assert float(rows["hung-job"]["stalled_gpu_hours"]) == pytest.approx(hours)
    assert rows["working-job"]["stalled_gpu_hours"] == ""


def test_behind_a_collector_and_in_a_jobs_tier_the_finding_has_what_it_needs():
    """A processing stage: GR, SM and DRAM pass through under their DCGM names (ratios_forwarded), the loss account
    still carries the levels. A jobs tier: only the names fleet-jobs.yaml decodes reach it over OTLP."""
    decode = set(yaml.safe_load((ROOT / "collector-config" / "fleet-jobs.yaml").read_text())["receivers"]["otlp"]
                 ["decode"])
    node_ofu = OfuProcessor(build_config(OfuProcessorConfig, {}), Context("ofu"))
    stage = Pipeline()
    tier = JobsProcessor(build_config(JobsConfig, {"passthrough": False}), Context("jobs"), clock=lambda: stage.t)
    tier_events = []
    for minutes, readings in ((5, WORK), (12, HUNG)):
        for _ in range(round(minutes * 60 / WINDOW_S)):
            stage.t += WINDOW_S
            samples = [sample(stage.t, g, "train", **readings) for g in range(2)]
            forwarded = [sample(stage.t, g, "train", **readings) for g in range(2)]
            for s in forwarded:
                s.ratios_forwarded = True
            out = stage.jobs.process(stage.ofu.process(Batch(samples=forwarded)))
            stage.events += out.events
            assert not any(p.name == "gpu.graphics_engine.activity" for p in out.points)
            wire = otlp.to_request(node_ofu.process(Batch(samples=samples)).points).SerializeToString()
            request = ExportMetricsServiceRequest.FromString(wire)
            arrived = [p for p in otlp.from_request(request) if p.name in decode]
            tier_events += tier.process(Batch(points=arrived)).events
    assert [a["ofu.finding.evidence"] for a in stage.stalled()] == [EVIDENCE_LINKS]
    opened = [dict(e.attributes) for e in tier_events if e.name == "ofu.finding.open"
              and dict(e.attributes)["ofu.finding.kind"] == STALLED]
    assert [a["ofu.finding.evidence"] for a in opened] == [EVIDENCE_LINKS]
