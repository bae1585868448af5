"""``otel-ofu report`` on a recorded demo run: table, JSON, CSV, plots, findings, bad input."""

import csv
import json
import re
from pathlib import Path

import pytest
import yaml

from otel_ofu.cli.main import main
from otel_ofu.core.loss import LossTotals
from otel_ofu.core.model import Batch as PointBatch
from otel_ofu.core.model import MetricPoint, attrs
from otel_ofu.exporters.file import FileExporter, FileExporterConfig
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.otlp import codec as otlp
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.processors.jobs import JobsProcessor
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.sim import SimReceiverConfig, build_fleet, window_batch
from otel_ofu.report.build import REPORT_FIELDS, build_report, json_field_paths, metric_points
from otel_ofu.report.loss import breakdown_lines, largest_record, recommendations

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "collector-config" / "demo.yaml"
START = 1_800_000_000.0
MINUTES = 60
# The demo's jobs with one loss built in each, and that loss.
BUILT_LOSS = {"input-starved-vit": "engine_idle", "kv-decode-memory-bound": "non_tensor", "hot-node-gemm": "clock",
              "ragged-vocab-lm": "padding"}


def record(directory: Path) -> tuple[Path, Path, dict[str, dict[str, float]]]:
    """What `otel-ofu run --config demo.yaml` writes, stepped deterministically: with the jobs
    processor (as the demo runs) and without it (a recording of per-GPU points only); and each
    job's true account, GPU-seconds by part and useful (its true MFU), from the simulator's own truth
    (WindowTruth.parts)."""
    doc = yaml.safe_load(DEMO.read_text())
    sim_cfg = build_config(SimReceiverConfig, doc["receivers"]["sim"])
    fleet = build_fleet(sim_cfg, START)
    ofu = OfuProcessor(build_config(OfuProcessorConfig, doc["processors"]["ofu"]), Context("ofu"))
    # The processor's clock is the simulation's, as when the demo runs (the sim starts at the wall clock).
    jobs = JobsProcessor(build_config(JobsConfig, doc["processors"]["jobs"]), Context("jobs"),
                         clock=lambda: START + fleet.t)
    paths = directory / "demo.jsonl", directory / "raw.jsonl"
    with_jobs, raw = (FileExporter(FileExporterConfig(path=str(p)), Context("file")) for p in paths)
    with_jobs.start()
    raw.start()
    truth: dict[str, dict[str, float]] = {}
    for _ in range(MINUTES * 6):
        window = fleet.step_window()
        for sample, true in window:
            if sample.job_id is not None and sample.job_id != "none":
                job = truth.setdefault(sample.job_id, {})
                for part, share in (*true.parts.items(), ("useful", true.true_mfu)):
                    job[part] = job.get(part, 0.0) + share * sample.window_s
        batch = ofu.process(window_batch(window, True))
        raw.export(batch)
        with_jobs.export(jobs.process(batch))
    with_jobs.export(jobs.flush())
    with_jobs.shutdown()
    raw.shutdown()
    return (*paths, truth)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    return record(tmp_path_factory.mktemp("rec"))


@pytest.fixture(scope="module")
def recording(recordings):
    return recordings[0]


@pytest.fixture(scope="module")
def raw_recording(recordings):
    return recordings[1]


@pytest.fixture(scope="module")
def true_loss(recordings):
    return recordings[2]


def report_json(capsys, *args):
    assert main(["report", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_shape(recording, capsys):
    data = report_json(capsys, recording)
    assert data["findings_source"] == "recorded"
    jobs = {j["job_id"]: j for j in data["jobs"]}
    assert set(jobs) == {"llama-70b-pretrain", "moe-236b", "sft-debug-flag", "vit-ckpt", "gpt-mixed-precision",
                         "capped-finetune", *BUILT_LOSS}
    for job in data["jobs"]:
        for key in ("job_id", "gpus", "gpu_hours", "ofu_mean", "ofu_p10", "ofu_p50", "ofu_p90", "flops",
                    "wasted_gpu_hours", "findings"):
            assert key in job
    llama = jobs["llama-70b-pretrain"]
    assert llama["gpus"] == 4 and llama["gpu_hours"] == pytest.approx(4.0, rel=0.01)
    assert llama["ofu_p10"] <= llama["ofu_p50"] <= llama["ofu_p90"]
    # what its loss parts lost, less what its clock gained above f_ref: GPU time x (1 - OFU)
    assert llama["wasted_gpu_hours"] - llama["gained_gpu_hours"] == \
        pytest.approx(llama["gpu_hours"] * (1 - llama["ofu_mean"]), rel=1e-6)
    # idle-reservation's GPU and the hot node's four free GPUs have no job
    assert data["fleet"]["gpus"] == 32 and data["fleet"]["unattributed_gpu_hours"] == pytest.approx(5.0, rel=0.01)


def test_jobs_are_sorted_by_wasted_gpu_hours(recording, capsys):
    wasted = [j["wasted_gpu_hours"] for j in report_json(capsys, recording)["jobs"]]
    assert wasted == sorted(wasted, reverse=True) and wasted[0] > wasted[-1]


def test_findings_have_kind_time_and_numbers(recording, capsys):
    jobs = {j["job_id"]: j for j in report_json(capsys, recording)["jobs"]}
    (moe,) = jobs["moe-236b"]["findings"]
    assert moe["kind"] == "mfu_gap" and moe["cause"] == "flop_formula_overcount"
    assert moe["time"].endswith("Z") and moe["numbers"]["mfu_reported"] > moe["numbers"]["ofu"]
    (reg,) = jobs["sft-debug-flag"]["findings"]
    assert reg["kind"] == "regression" and 20 < reg["minutes_into_job"] <= 30
    assert reg["numbers"]["baseline"] > 2 * reg["numbers"]["ofu"] and reg["closed"] is not None
    for quiet in ("llama-70b-pretrain", "vit-ckpt", "gpt-mixed-precision", "capped-finetune", *BUILT_LOSS):
        assert jobs[quiet]["findings"] == []


def test_a_recording_without_the_jobs_processor_gets_recomputed_findings(raw_recording, recording, capsys):
    raw = report_json(capsys, raw_recording)
    recorded = report_json(capsys, recording)
    assert raw["findings_source"] == "recomputed"

    def kinds(data):
        return {(j["job_id"], f["kind"], f["cause"], f["time"]) for j in data["jobs"] for f in j["findings"]}

    assert kinds(raw) == kinds(recorded)  # the same pure code, the same thresholds (demo = defaults)
    assert [j["job_id"] for j in raw["jobs"]] == [j["job_id"] for j in recorded["jobs"]]


def test_recompute_with_other_thresholds_from_a_config(recording, tmp_path, capsys):
    doc = yaml.safe_load(DEMO.read_text())
    doc["processors"]["jobs"]["audit"]["min_gap_pp"] = 50
    cfg = tmp_path / "strict.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    data = report_json(capsys, recording, "--recompute", "--config", cfg)
    assert data["findings_source"] == "recomputed"
    assert {f["kind"] for j in data["jobs"] for f in j["findings"]} == {"regression"}


def test_terminal_table(recording, capsys):
    assert main(["report", str(recording)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("job "))
    for column in ("GPUs", "GPU h", "OFU mean", "p10", "p50", "p90", "FLOPs", "wasted GPU h", "findings"):
        assert column in header
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("----")) + 1
    rows = [line.split()[0] for line in lines[first:first + 10]]
    assert rows[0] in ("kv-decode-memory-bound", "input-starved-vit")  # 4 GPUs each at OFU 0.12 and 0.18
    assert "Findings (recorded: the ofu.finding events the jobs processor logged while it ran): 2" in out
    assert "flop_formula_overcount" in out


def test_csv(recording, tmp_path, capsys):
    path = tmp_path / "jobs.csv"
    assert main(["report", str(recording), "--csv", str(path)]) == 0
    capsys.readouterr()
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 10
    wasted = [float(r["wasted_gpu_hours"]) for r in rows]
    assert wasted == sorted(wasted, reverse=True)
    moe = next(r for r in rows if r["job_id"] == "moe-236b")
    assert moe["findings"] == "1" and moe["finding_details"].startswith("mfu_gap:flop_formula_overcount@")


def test_plots_are_written(recording, tmp_path, capsys):
    import matplotlib.image

    out = tmp_path / "plots"
    assert main(["report", str(recording), "--plots", str(out)]) == 0
    capsys.readouterr()
    files = sorted(p.name for p in out.iterdir())
    assert files == ["fleet-loss-waterfall.png", "fleet-ofu-distribution.png", "job-capped-finetune.png",
                     "job-gpt-mixed-precision.png", "job-hot-node-gemm.png", "job-input-starved-vit.png",
                     "job-kv-decode-memory-bound.png", "job-llama-70b-pretrain.png", "job-moe-236b.png",
                     "job-ragged-vocab-lm.png", "job-sft-debug-flag.png", "job-vit-ckpt.png", "loss-breakdown.png"]
    for name in files:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] > 400 and image.std() > 0.05  # drawn on, not blank


def test_metric_decoding_matches_the_protobuf_parser(recording):
    names = {"gpu.ofu", "gpu.flops.achieved", "training.mfu", "job.gpu_seconds"}
    lines = [line for line in recording.read_text().splitlines() if line.startswith('{"resourceMetrics"')][:5]
    assert lines
    for line in lines:
        ours = list(metric_points(json.loads(line), names))
        theirs = [p for p in otlp.from_request(otlp.from_json_line(line)) if p.name in names]
        assert ours == theirs


def test_a_malformed_line_is_named(recording, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    first = recording.read_text().splitlines()[0]
    bad.write_text(first + "\n\n" + '{"resourceMetrics": [ oops\n')
    assert main(["report", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:3:" in err and "not a JSON line" in err


def test_a_line_that_is_not_otlp_is_named(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hello": 1}\n')
    assert main(["report", str(bad)]) == 1
    assert f"{bad}:1: not an OTLP export request" in capsys.readouterr().err


def test_malformed_metrics_are_named(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        {"name": "gpu.ofu", "gauge": {"dataPoints": [{"asDouble": "x", "timeUnixNano": "1"}]}}]}]}]}) + "\n")
    assert main(["report", str(bad)]) == 1
    assert f"{bad}:1: malformed OTLP metrics" in capsys.readouterr().err


def test_empty_or_missing_input(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["report", str(empty)]) == 1
    assert "empty" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nope.jsonl")]) == 1
    assert "no such file or directory" in capsys.readouterr().err


def test_build_report_keeps_timelines_for_the_plots(recording):
    assert not build_report(recording).jobs[0].timeline  # the jobs processor's series hold no per-bin OFU
    report = build_report(recording, timelines=True)
    moe = next(j for j in report.jobs if j.summary.job_id == "moe-236b")
    assert len(moe.timeline) >= MINUTES - 2 and moe.truth
    assert all(mfu is not None and mfu > ofu for _, ofu, mfu, _ in moe.timeline)


# --- what the report says next (issue 23, item 10) ----------------------------------------------


def test_the_json_has_exactly_the_documented_fields(recording, capsys):
    """docs/report.md's field list is generated from REPORT_FIELDS; a report must match it."""
    data = report_json(capsys, recording)
    assert any(j["findings"] for j in data["jobs"]) and data["gpus"] and data["inputs"]  # every part present
    assert json_field_paths(data) == set(REPORT_FIELDS)


def test_the_table_leads_with_the_fleet_ofu_the_json_gives(recording, capsys):
    fleet = report_json(capsys, recording)["fleet"]
    assert main(["report", str(recording)]) == 0
    out = capsys.readouterr().out
    assert fleet["ofu_mean"] < fleet["job_ofu_mean"]  # idle GPUs count in the fleet's figure
    assert (f"Fleet OFU {fleet['ofu_mean']:.1%} over all {fleet['gpu_hours']:.2f} GPU h, idle GPUs included; "
            f"jobs: {fleet['job_ofu_mean']:.1%} of the {fleet['job_gpu_hours']:.2f} GPU h they held.") in out


def test_each_finding_says_what_its_cause_means_and_what_to_do(recording, capsys):
    data = report_json(capsys, recording)
    findings = {f["cause"]: f for j in data["jobs"] for f in j["findings"]}
    assert set(findings) == {"flop_formula_overcount", "sustained_ofu_drop"}
    assert "FLOP formula counts work that never ran" in findings["flop_formula_overcount"]["meaning"]
    assert "TORCH_DISTRIBUTED_DEBUG" in findings["sustained_ofu_drop"]["action"]
    assert main(["report", str(recording)]) == 0
    out = capsys.readouterr().out
    for finding in findings.values():
        assert f"{finding['cause']}: {finding['meaning']}. What to do: {finding['action']}." in out


def test_recorded_findings_that_a_recomputation_would_not_give_are_explained(recording, tmp_path, capsys):
    """From the jobs processor's series the findings are what it logged, whatever --config says; a replay (the
    plots need one) recomputes them too, and explains a difference."""
    doc = yaml.safe_load(DEMO.read_text())
    doc["processors"]["jobs"]["audit"]["min_gap_pp"] = 50  # the MoE job's gap is under 50 pp
    strict = tmp_path / "strict.yaml"
    strict.write_text(yaml.safe_dump(doc))
    for config in (None, strict):
        series = report_json(capsys, recording, *(("--config", config) if config else ()))
        assert (series["jobs_source"], series["findings_source"], series["findings_count"],
                series["findings_recomputed_count"], series["findings_note"]) == ("series", "recorded", 2, None, None)
    agree = report_json(capsys, recording, "--plots", tmp_path / "plots")
    assert (agree["jobs_source"], agree["findings_source"], agree["findings_count"],
            agree["findings_recomputed_count"]) == ("recomputed", "recorded", 2, 2)
    assert agree["findings_note"] is None
    differ = report_json(capsys, recording, "--config", strict, "--plots", tmp_path / "plots")
    assert (differ["findings_source"], differ["findings_count"], differ["findings_recomputed_count"]) == (
        "recorded", 2, 1)
    assert "there are 1 finding(s), not the 2 recorded" in differ["findings_note"]
    assert main(["report", str(recording), "--config", str(strict), "--plots", str(tmp_path / "plots")]) == 0
    assert differ["findings_note"] in capsys.readouterr().out
    recomputed = report_json(capsys, recording, "--recompute")
    assert recomputed["findings_recomputed_count"] is None and recomputed["findings_note"] is None
    assert recomputed["jobs_source"] == "recomputed"


def test_flops_unknown_says_to_declare_the_precision(tmp_path, capsys):
    """A job whose precision nobody declared: OFU, but no FLOPs, and the report says how to fix that."""
    path = tmp_path / "no-precision.jsonl"
    exporter = FileExporter(FileExporterConfig(path=str(path)), Context("file"))
    exporter.start()
    for minute in range(10):
        t = int((START + 60 * minute) * 1e9)
        resource = attrs({"host.name": "node-1", "hw.id": "GPU-1", "hw.model": "NVIDIA H100 80GB HBM3",
                          "gpu.index": "0", "ofu.job.id": "eval-run"})
        exporter.export(PointBatch(points=[MetricPoint("gpu.ofu", 0.3, t, resource, (), "1", False,
                                                       t - 60 * 10**9)]))
    exporter.shutdown()
    (job,) = report_json(capsys, path)["jobs"]
    assert job["flops"] is None and job["ofu_mean"] == pytest.approx(0.3)
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "FLOPs '-' (eval-run): the job's precision is unknown" in out
    assert "ofu.dev/precision" in out and "OFU_PRECISION" in out


def test_a_dmon_recording_says_what_it_lacks(tmp_path, capsys):
    dmon = ROOT / "tests" / "data" / "replay" / "h100-dmon.txt"
    assert main(["report", str(dmon)]) == 1
    assert "--model 'NVIDIA H100 80GB HBM3'" in capsys.readouterr().err
    assert main(["report", str(dmon), "--model", "NVIDIA H100 80GB HBM3"]) == 0
    out = capsys.readouterr().out
    assert "come from a dmon recording, which names no job" in out
    for pointer in set(re.findall(r"docs/[\w/.-]+\.md", out)):
        assert (ROOT / pointer).is_file(), pointer


def test_every_docs_page_the_code_names_exists():
    """Messages point users at docs/...: each page must be there (docs/attribution.md was not)."""
    named = {}
    for source in (ROOT / "otel_ofu").rglob("*.py"):
        for page in re.findall(r"docs/[\w/.-]+?\.md", source.read_text()):
            if page != "docs/x.md":  # cli/docs.py's docstring: "docs/x.md named in comments"
                named.setdefault(page, source.relative_to(ROOT))
    assert "docs/audit.md" in named
    missing = {page: str(where) for page, where in named.items() if not (ROOT / page).is_file()}
    assert not missing, missing


def test_the_report_names_each_built_loss_as_its_jobs_largest(recording, true_loss, capsys):
    """The demo's jobs with one loss built in each (sim scenarios): the simulator's truth has it as
    the job's largest loss, and the report's breakdown, from the counters, finds the same part."""
    data = report_json(capsys, recording)
    jobs = {j["job_id"]: j for j in data["jobs"]}
    true_shares = {job: {part: seconds / sum(parts.values()) for part, seconds in parts.items()}
                   for job, parts in true_loss.items()}
    lost = {job: {part: share for part, share in shares.items() if part != "useful"}
            for job, shares in true_shares.items()}
    true_largest = {job: max(parts, key=parts.__getitem__) for job, parts in lost.items()}
    assert {job: true_largest[job] for job in BUILT_LOSS} == BUILT_LOSS  # the sim built what it says
    for job, part in BUILT_LOSS.items():
        assert jobs[job]["largest_loss"]["part"] == part, (job, jobs[job]["loss"])
    for job, shares in true_shares.items():  # each part of each job as the simulator made it, within 2 pp
        assert jobs[job]["loss"] == pytest.approx(shares, abs=0.02), job
    assert jobs["kv-decode-memory-bound"]["largest_loss"]["cause"] == "memory_bound"
    assert jobs["hot-node-gemm"]["largest_loss"]["cause"] == "hw_thermal"
    for job in data["jobs"]:  # every job's account adds up: its parts and OFU to 1, its losses to its waste
        assert sum(job["loss"].values()) == pytest.approx(1.0, abs=1e-9)
        assert job["loss"]["useful"] == pytest.approx(job["ofu_mean"], abs=1e-9)
        assert sum(job["loss_gpu_hours"].values()) == pytest.approx(job["wasted_gpu_hours"], rel=1e-6)
        assert sum(job["gain_gpu_hours"].values()) == pytest.approx(job["gained_gpu_hours"], rel=1e-6)
        assert min(job["loss_gpu_hours"].values()) >= 0  # a gain is counted apart, never as a negative loss
        # GPU time = useful + wasted - gained
        assert job["gpu_hours"] * job["ofu_mean"] + job["wasted_gpu_hours"] - job["gained_gpu_hours"] == \
            pytest.approx(job["gpu_hours"], rel=1e-6)
    fleet = data["fleet"]
    assert sum(fleet["loss_gpu_hours"].values()) - sum(fleet["gain_gpu_hours"].values()) == \
        pytest.approx(fleet["gpu_hours"], rel=1e-6)
    assert fleet["gained_gpu_hours"] == pytest.approx(sum(fleet["gain_gpu_hours"].values()), rel=1e-6)
    assert fleet["loss_gpu_hours"]["unallocated"] == pytest.approx(fleet["unattributed_gpu_hours"], rel=1e-6)
    tips = data["recommendations"]
    assert [t["gpu_hours"] for t in tips] == sorted((t["gpu_hours"] for t in tips), reverse=True)
    assert {(t["job_id"], t["part"]) for t in tips} >= {("input-starved-vit", "engine_idle"),
                                                        ("kv-decode-memory-bound", "non_tensor")}


def test_the_breakdown_table_and_what_to_fix_first(recording, capsys):
    assert main(["report", str(recording)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Where the GPU-hours went"))
    header = lines[start + 1]
    for column in ("lost GPU h", "engine idle", "SMs idle", "non-tensor", "clock", "padding", "no job",
                   "largest loss"):
        assert column in header
    rows = {line.split()[0]: line for line in lines[start + 3:start + 14] if line.strip()}
    assert "clock 3" in rows["hot-node-gemm"] and "(hw thermal)" in rows["hot-node-gemm"]
    assert rows["ragged-vocab-lm"].rstrip().endswith(tuple(f"padding {n}%" for n in range(5, 20)))
    assert any(line.startswith("fleet (every GPU)") for line in lines[start:start + 16])
    fix = lines.index("What to fix first (by GPU-hours lost):")
    assert "input-starved-vit" in "".join(lines[fix:fix + 6]) and "input pipeline" in "".join(lines[fix:fix + 6])
    # the regression finding says which part grew, and what that points at
    assert "engine idle grew from" in out and "the input pipeline or the host, not the kernels" in out


def _account(gpu_hours: float, parts: dict[str, float], ofu: float) -> LossTotals:
    """A job's life account: ``parts`` and ``ofu`` as shares of ``gpu_hours`` (they add up to 1)."""
    totals = LossTotals()
    totals.add_parts(parts.items(), ofu, gpu_hours * 3600)
    return totals


def test_a_clock_boost_reads_as_a_gain_in_the_breakdown_never_as_a_negative_loss():
    """Issue 31 item 6: the SM clock above f_ref makes the clock part negative; the table shows the gain in a
    column of its own, counted apart from the GPU h lost (never netted into them, as the jobs processor's
    counters count it), and it is never a largest loss nor a thing to fix."""
    boosted = _account(1.0, {"engine_idle": 0.10, "clock": -0.05, "padding": 0.02}, 0.93)
    fleet = LossTotals()
    fleet.merge(boosted)
    lines = breakdown_lines([("boosted", boosted)], fleet)
    table = "\n".join(lines)
    header = lines[1].split("  ")
    assert "clock boost gained" in lines[1]
    row = next(line for line in lines if line.startswith("boosted"))
    cells = dict(zip([h.strip() for h in header if h.strip()], row.split()))
    assert cells["clock boost gained"] == "0.05" and cells["clock"] == "0.00" and "-0.05" not in table
    assert cells["lost GPU h"] == "0.12"  # what was lost: 0.10 + 0.02; the gain apart
    assert "GPU time = useful + lost - gained" in table
    assert "lost to clock" not in table and row.rstrip().endswith("engine idle 10%")
    only_gain = _account(1.0, {"engine_idle": 0.0, "clock": -0.05}, 1.05)
    assert largest_record(only_gain) is None  # a gain is no loss


def test_what_to_fix_first_skips_crumbs_and_labels_padding_estimated_with_the_fleet_factor():
    """Trial item of issue 31: no advice about 0.00 GPU h; advice on padding made with the fleet's tile factor
    (the same for every job on those GPUs) says it is that estimate; a job's own factor is named as such."""
    fleet_c, own_c = 0.977, 0.864
    raw = 0.5  # padding = raw x (1 - c_tile), useful = raw x c_tile
    typical = _account(4.0, {"engine_idle": 0.5, "padding": raw * (1 - fleet_c)}, raw * fleet_c)
    ragged = _account(2.0, {"non_tensor": 0.5, "padding": raw * (1 - own_c)}, raw * own_c)
    crumb = _account(0.004, {"engine_idle": 0.9}, 0.1)  # 0.0036 GPU h: prints as 0.00
    jobs = [("typical", typical), ("ragged", ragged), ("crumb", crumb)]
    fleet = LossTotals()
    for _, loss in jobs:
        fleet.merge(loss)
    factors = {"typical": fleet_c, "ragged": fleet_c, "crumb": fleet_c}
    tips = recommendations(jobs, fleet, top=20, fleet_factors=factors)
    assert all(t["gpu_hours"] >= 0.01 for t in tips) and "crumb" not in {t["job_id"] for t in tips}
    padding = {t["job_id"]: t for t in tips if t["part"] == "padding"}
    assert padding["typical"]["estimate"] == "fleet_tile_factor"
    assert padding["typical"]["tile_factor"] == pytest.approx(fleet_c)
    assert padding["ragged"]["estimate"] == "tile_factor" and padding["ragged"]["tile_factor"] == pytest.approx(own_c)
    assert {t["estimate"] for t in tips if t["part"] != "padding"} == {None}
    lines = breakdown_lines(jobs, fleet, factors)
    advice = lines[lines.index("What to fix first (by GPU-hours lost):") + 1:]
    assert not any("0.00 GPU h" in line for line in advice)
    assert advice[-1] == "  (1 smaller item, each under 0.01 GPU h, not listed)"
    said = {line.split(":")[0].split(". ")[1]: line for line in advice if "lost to padding" in line}
    assert "[an estimate: the fleet's tile factor for a typical job on these GPUs (c_tile 0.977)" in said["typical"]
    assert "[an estimate from the tile factor c_tile 0.864, not a measurement]" in said["ragged"]


def test_the_csv_names_each_jobs_largest_loss(recording, tmp_path, capsys):
    path = tmp_path / "jobs.csv"
    assert main(["report", str(recording), "--csv", str(path)]) == 0
    capsys.readouterr()
    rows = {r["job_id"]: r for r in csv.DictReader(path.open())}
    assert {job: rows[job]["largest_loss"] for job in BUILT_LOSS} == BUILT_LOSS
    assert float(rows["input-starved-vit"]["lost_gpu_hours_engine_idle"]) > 2
    assert rows["input-starved-vit"]["lost_gpu_hours_sm_idle+non_tensor"] == ""  # the sim reads SM: no merged part


DEMO_PRICES = {"NVIDIA H100 80GB HBM3": 3.00, "NVIDIA B200": 5.50}  # demo.yaml's cost.per_gpu_hour, by model


def test_the_demos_report_prices_each_job_and_the_fleet(recording, capsys):
    """Issue 34 item 1 in the report: with the demo's prices (--config), each job's cost is its GPU-hours x its
    GPUs' price (the demo's jobs each run on one model), its parts less the gain add up to it, and the fleet's is
    every GPU-hour x its model's price, the GPUs of no job included; what to fix first is ranked by money."""
    data = report_json(capsys, recording, "--config", DEMO)
    fleet = data["fleet"]
    assert fleet["currency"] == "USD" and fleet["unpriced_gpu_hours"] == {}
    models = {}
    for gpu in data["gpus"]:
        for job in gpu["jobs"]:
            models.setdefault(job, set()).add(gpu["model"])
    for job in data["jobs"]:
        (model,) = models[job["job_id"]]
        assert job["cost"] == pytest.approx(job["gpu_hours"] * DEMO_PRICES[model], rel=1e-9), job["job_id"]
        assert sum(job["cost_by_part"].values()) - job["gained_cost"] == pytest.approx(job["cost"], rel=1e-9)
        lost = {part: v for part, v in job["cost_by_part"].items() if part != "useful"}
        assert sum(lost.values()) == pytest.approx(job["wasted_cost"], rel=1e-9)
        assert set(lost) == set(job["loss_gpu_hours"])
    every_gpu = sum(g["gpu_hours"] * DEMO_PRICES[g["model"]] for g in data["gpus"])
    assert fleet["cost"] == pytest.approx(every_gpu, rel=1e-6)
    assert sum(fleet["cost_by_part"].values()) - fleet["gained_cost"] == pytest.approx(fleet["cost"], rel=1e-9)
    assert fleet["cost_by_part"]["unallocated"] == pytest.approx(4 * 3.00 + 1 * 5.50, rel=0.01)  # 4 H100s, 1 B200
    money = [tip["cost"] for tip in data["recommendations"]]
    assert None not in money and money == sorted(money, reverse=True)
    without = report_json(capsys, recording)  # no prices: no cost, never 0
    assert {job["cost"] for job in without["jobs"]} == {None} and without["fleet"]["cost"] is None
    assert main(["report", str(recording), "--config", str(DEMO)]) == 0
    out = capsys.readouterr().out
    assert "cost USD" in out and "wasted USD" in out and "Where the money went" in out
    assert "What to fix first (by USD lost):" in out and "Jobs are sorted by wasted USD" in out


def test_what_to_fix_first_is_ranked_by_money_where_prices_are_set():
    """A cheap GPU's bigger loss in GPU-hours comes after a dear GPU's smaller one once prices are set; without
    prices the order is by GPU-hours, as before."""
    cheap = _account(2.0, {"engine_idle": 0.5}, 0.5)  # 1 GPU h lost at 1.00 an hour
    dear = _account(1.0, {"non_tensor": 0.6}, 0.4)  # 0.6 GPU h lost at 6.00 an hour
    jobs = [("cheap", cheap), ("dear", dear)]
    fleet = LossTotals()
    for _, loss in jobs:
        fleet.merge(loss)
    costs = [_account(2.0 * 1.00, {"engine_idle": 0.5}, 0.5), _account(1.0 * 6.00, {"non_tensor": 0.6}, 0.4)]
    fleet_cost = LossTotals()
    for cost in costs:
        fleet_cost.merge(cost)
    assert [t["job_id"] for t in recommendations(jobs, fleet)] == ["cheap", "dear"]
    tips = recommendations(jobs, fleet, costs=costs, fleet_cost=fleet_cost)
    assert [(t["job_id"], t["cost"]) for t in tips] == [("dear", pytest.approx(3.6)), ("cheap", pytest.approx(1.0))]
    lines = breakdown_lines(jobs, fleet, costs=costs, fleet_cost=fleet_cost, currency="EUR")
    fix = lines.index("What to fix first (by EUR lost):")
    assert lines[fix + 1].startswith("  1. dear: 0.60 GPU h, 3.60 EUR (60%) lost to non-tensor")
    assert any(line.startswith("Where the money went (EUR lost") for line in lines)
