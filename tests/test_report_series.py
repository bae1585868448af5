"""The report from the jobs processor's own series (report/series.py) against the replay of the GPU points.

The recording is the demo's pipeline (sim -> ofu -> jobs -> file exporter, collector-config/demo.yaml's
settings) with half of one node's GPUs going silent mid-bin and coming back later while the other half
keep reporting: their job ends by timeout part-way through a bin, and the same job id starts again (a
second incarnation). Read from the series, each job's
numbers must be what the replay with the same settings gives: the jobs processor's sums are exact
(core/exact.py), so the same windows give the same totals whichever way they are added up.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from otel_ofu.core.model import Batch
from otel_ofu.exporters.file import FileExporter, FileExporterConfig
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.processors.jobs import JobsProcessor
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.sim import SimReceiverConfig, build_fleet, window_batch
from otel_ofu.report.build import build_report, report_json

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "collector-config" / "demo.yaml"
START = 1_800_000_000.0
WINDOWS = 6 * 40  # 40 minutes of 10 s windows
SILENT = (6 * 10 + 3, 6 * 22)  # windows in which GPUs 0-3 of one node send nothing: 10.5 min (mid-bin) to 22 min


def jobs_config() -> JobsConfig:
    return build_config(JobsConfig, yaml.safe_load(DEMO.read_text())["processors"]["jobs"])


def record(directory: Path, proto: bool) -> tuple[Path, str]:
    """The demo pipeline's recording with GPUs 0-3 of one node silent for a while; the path and that node's name."""
    doc = yaml.safe_load(DEMO.read_text())
    sim = build_config(SimReceiverConfig, doc["receivers"]["sim"])
    fleet = build_fleet(sim, START)
    ofu = OfuProcessor(build_config(OfuProcessorConfig, doc["processors"]["ofu"]), Context("ofu"))
    jobs = JobsProcessor(jobs_config(), Context("jobs"), clock=lambda: START + fleet.t)
    path = directory / ("fleet.binpb" if proto else "fleet.jsonl")
    exporter = FileExporter(FileExporterConfig(path=str(path), format="proto" if proto else "json"), Context("file"))
    exporter.start()
    silent_host = ""
    for index in range(WINDOWS):
        window = fleet.step_window()
        silent_host = silent_host or window[-1][0].host
        if SILENT[0] <= index < SILENT[1]:
            window = [(sample, truth) for sample, truth in window
                      if sample.host != silent_host or int(sample.gpu_index) >= 4]
        exporter.export(jobs.process(ofu.process(window_batch(window, True))))
    exporter.export(jobs.flush())
    exporter.export(Batch())
    exporter.shutdown()
    return path, silent_host


@pytest.fixture(scope="module", params=[False, True], ids=["json", "proto"])
def recording(request, tmp_path_factory):
    return record(tmp_path_factory.mktemp("series"), request.param)


def by_job(data: dict) -> dict[tuple[str, str], dict]:
    return {(j["job_id"], j["start"]): j for j in data["jobs"]}


def close(a: float | None, b: float | None, rel: float = 1e-9) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


def test_each_jobs_numbers_from_its_series_are_what_the_replay_gives(recording):
    path, silent_host = recording
    config = jobs_config()
    series = build_report(str(path), config)
    replay = build_report(str(path), config, recompute=True)
    assert (series.jobs_source, replay.jobs_source) == ("series", "recomputed")
    got, want = by_job(report_json(series)), by_job(report_json(replay))
    assert got.keys() == want.keys()
    # The silent GPUs' job ended by timeout and started again: two incarnations.
    silent_jobs = {job for g in replay.gpus if g.key[0] == silent_host and int(g.index) < 4 for job in g.jobs}
    assert len(silent_jobs) == 1 and sum(1 for job, _ in got if job in silent_jobs) == 2, got.keys()
    assert {j["end_reason"] for (job, _), j in got.items() if job in silent_jobs} == {"timeout", "shutdown"}
    for key, job in want.items():
        mine = got[key]
        for field in ("gpu_hours", "ofu_mean", "wasted_gpu_hours", "gained_gpu_hours", "flops", "energy_joules",
                      "cost", "wasted_cost", "gained_cost", "duration_hours", "ofu_p10", "ofu_p50", "ofu_p90"):
            assert close(mine[field], job[field]), (key, field, mine[field], job[field])
        for part, hours in job["loss_gpu_hours"].items():
            assert close(mine["loss_gpu_hours"][part], hours), (key, part)
        assert mine["loss_gpu_hours"].keys() == job["loss_gpu_hours"].keys()
        assert (mine["gpus"], mine["peak_gpus"]) == (job["gpus"], job["peak_gpus"]), key
        assert {p: round(h, 9) for p, h in mine["precisions_gpu_hours"].items()} == {
            p: round(h, 9) for p, h in job["precisions_gpu_hours"].items()}
        assert (mine["largest_loss"] or {}).get("part") == (job["largest_loss"] or {}).get("part")
        assert [f["id"] for f in mine["findings"]] == [f["id"] for f in job["findings"]]


def test_the_fleet_and_the_gpus_from_the_series_report_are_the_replays(recording):
    path, _ = recording
    config = jobs_config()
    series, replay = report_json(build_report(str(path), config)), report_json(build_report(str(path), config,
                                                                                         recompute=True))
    assert series["gpus"] == replay["gpus"]
    for field in ("gpus", "jobs", "gpu_hours", "job_gpu_hours", "unattributed_gpu_hours", "ofu_mean",
                  "wasted_gpu_hours", "energy_joules", "unattributed_energy_joules", "cost", "wasted_cost"):
        assert close(series["fleet"][field], replay["fleet"][field]), field
    for part, hours in replay["fleet"]["loss_gpu_hours"].items():
        assert close(series["fleet"]["loss_gpu_hours"][part], hours), part
    assert [r["job_id"] for r in series["recommendations"]] == [r["job_id"] for r in replay["recommendations"]]


def test_a_recording_without_job_series_is_replayed(tmp_path):
    """The same fleet recorded before the jobs processor: the report replays it (and says so)."""
    doc = yaml.safe_load(DEMO.read_text())
    fleet = build_fleet(build_config(SimReceiverConfig, doc["receivers"]["sim"]), START)
    ofu = OfuProcessor(build_config(OfuProcessorConfig, doc["processors"]["ofu"]), Context("ofu"))
    path = tmp_path / "raw.jsonl"
    exporter = FileExporter(FileExporterConfig(path=str(path)), Context("file"))
    exporter.start()
    for _ in range(6 * 5):
        exporter.export(ofu.process(window_batch(fleet.step_window(), True)))
    exporter.shutdown()
    report = build_report(str(path), jobs_config())
    assert report.jobs_source == "recomputed" and report.jobs
    assert report_json(report)["jobs_source"] == "recomputed"


def test_counters_that_stop_short_of_their_end_event_are_noted(tmp_path):
    """A recording from before the jobs processor sent final values at a job's end: its counters stop at the
    last whole bin. The report says so (and --recompute replays), rather than passing the shortfall off."""
    path, _ = record(tmp_path, False)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    ends = {int(r["timeUnixNano"]) for doc in lines for rl in doc.get("resourceLogs", ()) for sl in rl["scopeLogs"]
            for r in sl["logRecords"] if {"key": "event.name", "value": {"stringValue": "ofu.job.end"}}
            in r.get("attributes", [])}
    assert ends
    for doc in lines:  # the final points: job.* points at (or 1 ms after) an end
        for rm in doc.get("resourceMetrics", ()):
            for sm in rm["scopeMetrics"]:
                for metric in sm["metrics"]:
                    data = metric.get("sum") or metric.get("gauge")
                    data["dataPoints"] = [p for p in data["dataPoints"] if not metric["name"].startswith("job.")
                                          or not any(0 <= int(p["timeUnixNano"]) - t <= 1_000_000 for t in ends)]
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps(doc) + "\n" for doc in lines))
    report = build_report(str(old), jobs_config())
    assert report.jobs_source == "series"
    assert any("short of their ofu.job.end totals" in note for note in report.notes)
    timed_out = next(j for j in report.jobs if j.summary.reason == "timeout")
    replayed = next(j for j in build_report(str(old), jobs_config(), recompute=True).jobs
                    if j.summary.job_id == timed_out.summary.job_id and j.summary.reason == "timeout")
    assert timed_out.summary.totals.gpu_seconds < replayed.summary.totals.gpu_seconds
    assert not any("short of" in note for note in build_report(str(path), jobs_config()).notes)


def test_a_job_whose_counters_fall_is_recomputed(tmp_path, caplog):
    """Two jobs instances' series of the same jobs in one recording: the first killed (no end events) after 10
    minutes, the second taking over with counters from 0. Their last values are not the jobs' totals: the report
    says so and replays the GPU points instead."""
    doc = yaml.safe_load(DEMO.read_text())
    fleet = build_fleet(build_config(SimReceiverConfig, doc["receivers"]["sim"]), START)
    ofu = OfuProcessor(build_config(OfuProcessorConfig, doc["processors"]["ofu"]), Context("ofu"))
    first, second = (JobsProcessor(jobs_config(), Context("jobs"), clock=lambda: START + fleet.t) for _ in range(2))
    path = tmp_path / "two-instances.jsonl"
    exporter = FileExporter(FileExporterConfig(path=str(path)), Context("file"))
    exporter.start()
    for index in range(6 * 20):
        exporter.export((first if index < 60 else second).process(ofu.process(window_batch(fleet.step_window(),
                                                                                             True))))
    exporter.export(second.flush())
    exporter.shutdown()
    with caplog.at_level("WARNING", logger="otel_ofu.report"):
        report = build_report(str(path), jobs_config())
    assert report.jobs_source == "recomputed"
    assert "job counters of" in caplog.text and "recomputing every job from the GPU points" in caplog.text
    replayed = build_report(str(path), jobs_config(), recompute=True)
    assert [(j.summary.job_id, j.summary.totals.gpu_seconds) for j in report.jobs] == [
        (j.summary.job_id, j.summary.totals.gpu_seconds) for j in replayed.jobs]
    assert all(j.summary.totals.gpu_seconds > 19 * 60 for j in report.jobs)  # the whole 20 minutes, not the last 10
