"""The jobs processor on the simulated fleet, stepped window by window (no threads, no sleeps)."""

from pathlib import Path

import pytest
import yaml

from otel_ofu.core.metrics import METRICS
from otel_ofu.core.model import JOB_ID
from otel_ofu.jobs.findings import FLOP_FORMULA_OVERCOUNT, MFU_GAP, REGRESSION, SUSTAINED_DROP
from otel_ofu.otlp import codec as otlp
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.pipeline.service import Service, load_config
from otel_ofu.processors.jobs import JobsProcessor
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.sim import SimReceiverConfig, build_fleet, window_batch

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "collector-config" / "demo.yaml"
START = 1_800_000_000.0
# steady, checkpoint, mixed_precision, power_capped, and the jobs with one loss built in each
QUIET_JOBS = ("llama-70b-pretrain", "vit-ckpt", "gpt-mixed-precision", "capped-finetune", "input-starved-vit",
              "kv-decode-memory-bound", "hot-node-gemm", "ragged-vocab-lm")


def demo_sections():
    doc = yaml.safe_load(DEMO.read_text())
    return doc["receivers"]["sim"], doc["processors"]["jobs"]


def run_fleet(sim_overrides=None, minutes=60):
    sim_doc, jobs_doc = demo_sections()
    sim_cfg = build_config(SimReceiverConfig, {**sim_doc, **(sim_overrides or {})})
    fleet = build_fleet(sim_cfg, START)
    ofu = OfuProcessor(build_config(OfuProcessorConfig, yaml.safe_load(DEMO.read_text())["processors"]["ofu"]),
                       Context("ofu"))
    # The processor's clock is the simulation's, as when the demo runs (the sim starts at the wall clock).
    jobs = JobsProcessor(build_config(registry.factories()["processors"]["jobs"].config_type, jobs_doc),
                         Context("jobs"), clock=lambda: START + fleet.t)
    points, events = [], []
    for _ in range(int(minutes * 60 / float(sim_cfg.collection_interval))):
        out = jobs.process(ofu.process(window_batch(fleet.step_window(), True)))
        points += [p for p in out.points if p.name.startswith(("job.", "fleet."))]
        events += out.events
    final = jobs.flush()
    return points, events, final


@pytest.fixture(scope="module", params=[42, 7], ids=["seed42", "seed7"])
def demo_run(request):
    return run_fleet({"seed": request.param})


def findings(events, name="ofu.finding.open"):
    return [(dict(e.attributes)[JOB_ID], dict(e.attributes)) for e in events if e.name == name]


def test_moe_inflated_mfu_is_flagged_as_formula_overcount(demo_run):
    _, events, _ = demo_run
    moe = [a for job, a in findings(events) if job == "moe-236b"]
    assert len(moe) == 1
    assert (moe[0]["ofu.finding.kind"], moe[0]["ofu.finding.cause"]) == (MFU_GAP, FLOP_FORMULA_OVERCOUNT)
    assert moe[0]["ofu.finding.mfu_reported"] > 1.6 * moe[0]["ofu.finding.ofu"]  # both numbers, ~2.1x apart


def test_the_regression_is_flagged_within_ten_minutes_and_cleared_on_recovery(demo_run):
    _, events, _ = demo_run
    opened = [e for e in events if e.name == "ofu.finding.open" and dict(e.attributes)[JOB_ID] == "sft-debug-flag"]
    assert len(opened) == 1
    a = dict(opened[0].attributes)
    assert (a["ofu.finding.kind"], a["ofu.finding.cause"]) == (REGRESSION, SUSTAINED_DROP)
    regress_at = START + 20 * 60  # demo.yaml: regress_at 20m
    assert 0 < opened[0].time_unix_nano / 1e9 - regress_at <= 10 * 60
    assert a["ofu.finding.ratio"] == pytest.approx(2.5, rel=0.15)
    closed = [e for e in events if e.name == "ofu.finding.close" and dict(e.attributes)[JOB_ID] == "sft-debug-flag"]
    assert len(closed) == 1 and closed[0].time_unix_nano / 1e9 > START + 50 * 60  # recover_at 50m


def test_steady_checkpoint_power_capped_and_mixed_precision_raise_nothing(demo_run):
    _, events, _ = demo_run
    flagged = {job for job, _ in findings(events)}
    assert flagged == {"moe-236b", "sft-debug-flag"}
    assert not flagged & set(QUIET_JOBS)


def test_job_metrics_are_registered_and_carry_a_job_resource(demo_run):
    points, _, _ = demo_run
    names = {p.name for p in points}
    assert {"job.ofu", "job.gpus", "job.gpu_seconds", "job.flops", "job.wasted_gpu_hours", "job.mfu.reported",
            "job.finding", "job.flops.achieved"} <= names
    for name in names:
        assert name in METRICS, name
    assert {dict(p.attributes)["ofu.window"] for p in points if p.name == "job.ofu"} == {"5m", "1h", "life"}
    gpus = {dict(p.resource)[JOB_ID]: p.value for p in points if p.name == "job.gpus"}
    assert gpus["llama-70b-pretrain"] == 4 and gpus["moe-236b"] == 2 and "none" not in gpus
    sums = [p for p in points if p.name in ("job.gpu_seconds", "job.flops", "job.wasted_gpu_hours")]
    assert all(p.monotonic and p.start_time_unix_nano for p in sums)


def test_finding_gauge_is_one_while_open_and_zero_at_close(demo_run):
    points, _, _ = demo_run
    reg = [p for p in points if p.name == "job.finding" and dict(p.resource)[JOB_ID] == "sft-debug-flag"]
    values = [p.value for p in sorted(reg, key=lambda p: p.time_unix_nano)]
    assert values[0] == 1.0 and values[-1] == 0.0 and values.count(0.0) == 1


def test_job_start_and_end_events_with_a_summary(demo_run):
    _, events, final = demo_run
    started = {dict(e.attributes)[JOB_ID] for e in events if e.name == "ofu.job.start"}
    assert started == {"llama-70b-pretrain", "moe-236b", "sft-debug-flag", "vit-ckpt", "gpt-mixed-precision",
                       "capped-finetune", "input-starved-vit", "kv-decode-memory-bound", "hot-node-gemm",
                       "ragged-vocab-lm"}
    ends = {dict(e.attributes)[JOB_ID]: dict(e.attributes) for e in final.events if e.name == "ofu.job.end"}
    assert set(ends) == started
    llama = ends["llama-70b-pretrain"]
    assert llama["ofu.job.end_reason"] == "shutdown" and llama["ofu.job.gpus"] == 4
    assert llama["ofu.job.gpu_hours"] == pytest.approx(4.0, rel=0.01)
    # what its parts lost, less what its clock gained above f_ref: GPU time x (1 - OFU)
    assert llama["ofu.job.wasted_gpu_hours"] - llama["ofu.job.gained_gpu_hours"] == \
        pytest.approx(llama["ofu.job.gpu_hours"] * (1 - llama["ofu.job.ofu.mean"]), rel=1e-6)
    assert 0 < llama["ofu.job.gained_gpu_hours"] < llama["ofu.job.wasted_gpu_hours"]
    assert ends["moe-236b"]["ofu.job.findings"] == 1
    # The MoE finding is still open at shutdown: it closes with its job.
    closes = [dict(e.attributes) for e in final.events if e.name == "ofu.finding.close"]
    assert [c[JOB_ID] for c in closes] == ["moe-236b"] and closes[0]["ofu.finding.reason"] == "job_end"


def test_demo_config_runs_jobs_after_ofu():
    config = load_config(str(DEMO))
    pipeline = next(p for p in config.pipelines if p.name == "metrics")
    assert pipeline.processors.index("jobs") > pipeline.processors.index("ofu")


def test_shutdown_flushes_job_end_events_through_the_exporters(tmp_path):
    out = tmp_path / "out.jsonl"
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(yaml.safe_dump({
        "receivers": {"sim": {"nodes": 1, "gpus_per_node": 2, "jobs": [{"id": "j", "scenario": "steady",
                                                                         "gpus": 2}]}},
        "processors": {"ofu": {}, "jobs": {}},
        "exporters": {"file": {"path": str(out)}},
        "service": {"pipelines": {"metrics": {"receivers": ["sim"], "processors": ["ofu", "jobs"],
                                              "exporters": ["file"]}}},
    }))
    service = Service(load_config(str(cfg)))
    exporter = service.exporters["file"].exporter
    exporter.start()
    fleet = build_fleet(service.receivers["sim"].config, START)
    for _ in range(12):
        service.pipelines[0].consume(window_batch(fleet.step_window(), True))
    service.shutdown()  # the receiver never started: shutdown must still flush the processor
    lines = out.read_text().splitlines()
    log_lines = [line for line in lines if line.startswith('{"resourceLogs"')]
    names = [e.name for line in log_lines for e in otlp.events_from_request(otlp.from_json_line(line))]
    assert names == ["ofu.job.start", "ofu.job.end"]


def test_no_series_holds_two_values_at_one_time_even_when_a_finding_closes_with_its_job(demo_run):
    """The MoE job's mfu_gap is open when the pipeline stops: its close marker (0) must not share
    the last snapshot's timestamp (1), which backends reject as a conflicting duplicate."""
    points, _, final = demo_run
    seen: dict[tuple, float] = {}
    for p in [*points, *(q for q in final.points if q.name.startswith("job."))]:
        key = (p.name, p.resource, p.attributes, p.time_unix_nano // 1_000_000)  # Prometheus: ms resolution
        assert seen.setdefault(key, p.value) == p.value, f"{p.name} {dict(p.resource)[JOB_ID]} at {p.time_unix_nano}"
    closes = [p for p in final.points if p.name == "job.finding" and p.value == 0.0]
    assert closes  # the open findings did close with their jobs


def test_without_passthrough_only_what_the_processor_makes_leaves_it():
    """The chart's jobs instance: the node agents serve the per-GPU data, so it must not be served twice."""
    sim_doc, jobs_doc = demo_sections()
    fleet = build_fleet(build_config(SimReceiverConfig, sim_doc), START)
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    factory = registry.factories()["processors"]["jobs"]
    both = [JobsProcessor(build_config(factory.config_type, {**jobs_doc, "passthrough": flag}), Context("jobs"))
            for flag in (True, False)]
    made: dict[bool, list] = {True: [], False: []}
    for _ in range(30):
        batch = ofu.process(window_batch(fleet.step_window(), True))
        for jobs, flag in zip(both, (True, False), strict=True):
            out = jobs.process(batch)
            made[flag].append(out)
    names = {flag: {p.name for out in outs for p in out.points} for flag, outs in made.items()}
    assert "gpu.ofu" in names[True] and "job.ofu" in names[True]
    made_here = ("job.", "fleet.")  # per job, and the fleet's GPU-hours by part
    assert names[False] and all(name.startswith(made_here) for name in names[False])
    assert names[False] == {n for n in names[True] if n.startswith(made_here)}
    assert not any(out.samples or out.passthrough for out in made[False])
    assert [e.name for out in made[False] for e in out.events] == [e.name for out in made[True] for e in out.events]


# The demo's jobs with one loss built in each (collector-config/demo.yaml), and that loss.
BUILT_LOSS = {"input-starved-vit": ("engine_idle", None), "kv-decode-memory-bound": ("non_tensor", "memory_bound"),
              "hot-node-gemm": ("clock", "hw_thermal"), "ragged-vocab-lm": ("padding", None)}


def test_each_jobs_end_names_the_loss_built_into_it(demo_run):
    _, _, final = demo_run
    ends = {dict(e.attributes)[JOB_ID]: (dict(e.attributes), e.body) for e in final.events if e.name == "ofu.job.end"}
    for job, (part, cause) in BUILT_LOSS.items():
        attributes, body = ends[job]
        assert attributes["ofu.job.loss.largest"] == part, job
        assert 0 < attributes["ofu.job.loss.largest_share"] < 1
        if cause is not None:
            assert attributes["ofu.job.loss.largest_cause"] == cause
        assert "largest loss: " in body


def test_job_loss_and_ofu_add_up_to_one_in_every_window(demo_run):
    points, _, _ = demo_run
    ofu = {(dict(p.resource)[JOB_ID], p.time_unix_nano, dict(p.attributes)["ofu.window"]): p.value
           for p in points if p.name == "job.ofu"}
    lost: dict[tuple, float] = {}
    for p in points:
        if p.name == "job.ofu.loss":
            key = (dict(p.resource)[JOB_ID], p.time_unix_nano, dict(p.attributes)["ofu.window"])
            lost[key] = lost.get(key, 0.0) + p.value
    assert set(lost) == set(ofu)
    assert max(abs(lost[k] + ofu[k] - 1.0) for k in ofu) < 1e-9
    # the clock part says why, per window: the hot node's thermal slowdown
    clock = [dict(p.attributes) for p in points if p.name == "job.ofu.loss" and dict(p.resource)[JOB_ID] ==
             "hot-node-gemm" and dict(p.attributes)["ofu.loss.part"] == "clock"]
    assert clock and all(a["ofu.loss.cause"] == "hw_thermal" for a in clock)


def test_loss_gpu_hours_add_up_to_the_waste_and_the_fleet_to_all_gpu_time(demo_run):
    points, _, _ = demo_run
    last: dict[tuple, float] = {}
    for p in sorted(points, key=lambda p: p.time_unix_nano):
        if p.name in ("job.ofu.loss.gpu_hours", "job.wasted_gpu_hours", "job.gpu_seconds", "fleet.gpu_hours",
                      "fleet.gpu_hours.gained"):
            last[(p.name, dict(p.resource).get(JOB_ID), dict(p.attributes).get("ofu.loss.part"))] = p.value
    jobs = {job for name, job, _ in last if name == "job.wasted_gpu_hours"}
    for job in jobs:
        parts = sum(v for (name, j, _), v in last.items() if name == "job.ofu.loss.gpu_hours" and j == job)
        assert parts == pytest.approx(last[("job.wasted_gpu_hours", job, None)], rel=1e-6), job
    fleet = {part: v for (name, _, part), v in last.items() if name == "fleet.gpu_hours"}
    gained = {part: v for (name, _, part), v in last.items() if name == "fleet.gpu_hours.gained"}
    assert {"useful", "unallocated", "engine_idle", "clock", "padding"} <= set(fleet)
    assert set(gained) == {"clock"}  # the demo's GPUs boost above f_ref at times
    # 32 GPUs for about an hour; the idle reservation and the hot node's 4 free GPUs have no job
    assert sum(fleet.values()) - sum(gained.values()) == pytest.approx(32.0, rel=0.05)
    assert fleet["unallocated"] == pytest.approx(5.0, rel=0.05)


def test_the_regression_finding_says_which_part_grew(demo_run):
    _, events, _ = demo_run
    (opened,) = [e for e in events if e.name == "ofu.finding.open" and dict(e.attributes)[JOB_ID] == "sft-debug-flag"]
    a = dict(opened.attributes)
    # the debug flag serializes collectives on the host: the GPU waits between kernels
    assert a["ofu.finding.grew"] == "engine_idle"
    assert a["ofu.finding.grew_to"] > a["ofu.finding.grew_from"] + 0.3
    assert "engine idle grew from" in opened.body and "the input pipeline or the host, not the kernels" in opened.body
