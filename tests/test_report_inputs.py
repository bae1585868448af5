"""``otel-ofu report PATH...`` as an operator meets it: several files, out of time order,
directories, globs, rotated and compressed files, dmon and CSV read directly, no job attributed,
recorded vs recomputed findings, the first window's length."""

import gzip
import json
import shutil
import struct
from pathlib import Path

import pytest
import yaml
import zstandard

from otel_ofu.cli.main import main
from otel_ofu.core.model import Batch, GpuSample
from otel_ofu.exporters.file import FACTORY, FileExporter, FileExporterConfig
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp import files
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.processors.jobs import JobsProcessor
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.sim import SimReceiverConfig, build_fleet, window_batch

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "collector-config" / "demo.yaml"
DMON = ROOT / "tests" / "data" / "replay" / "h100-dmon.txt"
START = 1_800_000_000.0
WINDOWS = 60 * 6  # an hour of 10 s windows


def _exporter(path: Path) -> FileExporter:
    exporter = FileExporter(FileExporterConfig(path=str(path)), Context("file"))
    exporter.start()
    return exporter


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo fleet for an hour: the whole recording with the jobs processor, the same with jobs
    settings that find nothing, and the per-GPU points only, one file per node."""
    directory = tmp_path_factory.mktemp("demo")
    doc = yaml.safe_load(DEMO.read_text())
    fleet = build_fleet(build_config(SimReceiverConfig, doc["receivers"]["sim"]), START)
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    jobs = JobsProcessor(build_config(JobsConfig, doc["processors"]["jobs"]), Context("jobs"))
    deaf = JobsProcessor(build_config(JobsConfig, {**doc["processors"]["jobs"],
                                                   "audit": {"min_gap_pp": 90}}), Context("jobs"))
    paths = {name: directory / f"{name}.jsonl" for name in ("whole", "deaf", "node0", "node1")}
    out = {name: _exporter(path) for name, path in paths.items()}
    for _ in range(WINDOWS):
        batch = ofu.process(window_batch(fleet.step_window(), True))
        out["whole"].export(jobs.process(batch))
        out["deaf"].export(deaf.process(batch))
        for node in (0, 1):
            points = [p for p in batch.points if dict(p.resource).get("host.name", "sim-node-0").endswith(str(node))]
            out[f"node{node}"].export(Batch(points=points))
    out["whole"].export(jobs.flush())
    out["deaf"].export(deaf.flush())
    for exporter in out.values():
        exporter.shutdown()
    return paths


def report(capsys, *args) -> dict:
    assert main(["report", *map(str, args), "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def jobs_of(data: dict) -> dict:
    return {j["job_id"]: (j["gpus"], round(j["gpu_hours"], 4), round(j["ofu_mean"], 4),
                          sorted(f["kind"] for f in j["findings"])) for j in data["jobs"]}


def test_concatenated_recordings_in_either_order_give_the_same_jobs_and_findings(demo, tmp_path, capsys):
    both = jobs_of(report(capsys, demo["node0"], demo["node1"]))
    assert set(both) >= {"llama-70b-pretrain", "moe-236b", "sft-debug-flag", "gpt-mixed-precision"}
    assert both["sft-debug-flag"][3] == ["regression"] and both["moe-236b"][3] == ["mfu_gap"]
    for first, second in (("node0", "node1"), ("node1", "node0")):
        joined = tmp_path / f"{first}-{second}.jsonl"  # cat a.jsonl b.jsonl > joined.jsonl
        joined.write_bytes(demo[first].read_bytes() + demo[second].read_bytes())
        assert jobs_of(report(capsys, joined)) == both, (first, second)


def test_a_recording_cut_in_two_and_joined_backwards_keeps_its_recorded_findings(demo, tmp_path, capsys):
    lines = demo["whole"].read_text().splitlines(keepends=True)
    backwards = tmp_path / "backwards.jsonl"
    backwards.write_text("".join(lines[len(lines) // 2:] + lines[: len(lines) // 2]))
    assert jobs_of(report(capsys, backwards)) == jobs_of(report(capsys, demo["whole"]))


def _rotated(demo, directory: Path) -> list[Path]:
    """The whole recording as the file exporter leaves it after rotating twice, older files compressed:
    gzip, a zstd stream, and the Collector's length-prefixed zstd records."""
    lines = demo["whole"].read_text().splitlines(keepends=True)
    third = len(lines) // 3
    parts = [lines[:third], lines[third:2 * third], lines[2 * third:]]
    directory.mkdir()
    older = directory / "metrics-2027-01-15T08-20-00.000.jsonl.gz"
    older.write_bytes(gzip.compress("".join(parts[0]).encode()))
    middle = directory / "metrics-2027-01-15T08-40-00.000.jsonl"  # the Collector keeps the name
    middle.write_bytes(b"".join(zstandard.ZstdCompressor().compress(line.encode()) for line in parts[1]))
    live = directory / "metrics.jsonl"
    live.write_bytes(b"".join(struct.pack(">I", len(frame)) + frame for frame in
                              (zstandard.ZstdCompressor().compress(line.rstrip("\n").encode()) for line in parts[2])))
    (directory / "plots.png").write_bytes(b"\x89PNG")
    return [older, middle, live]


def test_a_directory_of_rotated_and_compressed_files(demo, tmp_path, capsys):
    files = _rotated(demo, tmp_path / "rotated")
    data = report(capsys, tmp_path / "rotated")
    assert jobs_of(data) == jobs_of(report(capsys, demo["whole"]))
    assert [Path(i["path"]).name for i in data["inputs"]] == [f.name for f in files]  # data-time order
    assert [i["compression"] for i in data["inputs"]] == ["gzip", "zstd", "records+zstd"]
    assert main(["report", str(tmp_path / "rotated")]) == 0
    out = capsys.readouterr().out
    assert "Read 3 file(s), in data-time order:" in out
    assert "skipped 1 file(s) that are not recordings: plots.png" in out


def test_globs_and_several_paths(demo, tmp_path, capsys):
    _rotated(demo, tmp_path / "rotated")
    assert jobs_of(report(capsys, str(tmp_path / "rotated" / "metrics*"))) == jobs_of(report(capsys, demo["whole"]))
    assert main(["report", str(tmp_path / "rotated" / "nothing-*.jsonl")]) == 1
    assert "no file matches" in capsys.readouterr().err


def test_a_directory_of_the_file_exporters_compressed_rotation(demo, tmp_path, capsys):
    """``path: metrics.jsonl.zst`` rotates to ``metrics.jsonl-<time>.zst`` (lumberjack's names, the
    last extension kept last): a directory holding them is read whole."""
    batches = []
    for line in demo["whole"].read_text().splitlines():
        request = otlp.from_json_line(line)
        batches.append(Batch(events=list(otlp.events_from_request(request))) if line.startswith('{"resourceLogs"')
                       else Batch(points=list(otlp.from_request(request))))
    directory = tmp_path / "zst"
    directory.mkdir()
    config = {"path": str(directory / "metrics.jsonl.zst"), "compression": "zstd", "rotation": {}}
    for part in (batches[: len(batches) // 2], batches[len(batches) // 2:]):
        exporter = FACTORY.create(build_config(FACTORY.config_type, config), Context("file"))
        exporter.start()  # the previous run's file is rotated away
        for batch in part:
            exporter.export(batch)
        exporter.shutdown()
    rotated = files.rotated_files(directory / "metrics.jsonl.zst")
    assert len(rotated) == 2 and rotated[0].name.startswith("metrics.jsonl-20") and rotated[0].suffix == ".zst"
    data = report(capsys, directory)
    assert [Path(i["path"]) for i in data["inputs"]] == rotated
    assert jobs_of(data) == jobs_of(report(capsys, demo["whole"]))


def test_dmon_and_csv_are_read_directly(tmp_path, capsys):
    data = report(capsys, DMON, "--model", "NVIDIA H100 80GB HBM3", "--host-name", "node7")
    gpus = {g["gpu"]: g for g in data["gpus"]}
    assert set(gpus) == {"0", "1"} and data["fleet"]["gpus"] == 2  # no UUID: keyed by host and index
    assert gpus["0"]["ofu_mean"] == pytest.approx(0.85, abs=0.03) and gpus["1"]["ofu_mean"] == 0
    assert data["inputs"][0]["format"] == "dmon"
    csv = report(capsys, ROOT / "tests" / "data" / "replay" / "a100.csv")
    assert csv["fleet"]["gpus"] == 2 and csv["inputs"][0]["format"] == "csv"
    unknown = tmp_path / "notes.txt"
    unknown.write_text("hello\n")
    assert main(["report", str(unknown)]) == 1
    assert "not a recording" in capsys.readouterr().err


def test_without_jobs_the_gpus_are_shown_and_the_message_says_why(capsys):
    assert main(["report", str(DMON), "--model", "NVIDIA H100 80GB HBM3"]) == 0
    out = capsys.readouterr().out
    assert "No job: the 2 GPUs below come from a dmon recording, which names no job" in out
    assert "GPU 0" in out and "GPU 1" in out and "85." in out
    assert "record the output of the ofu processor" not in out


def test_recorded_findings_say_what_they_are_and_why_recomputing_differs(demo, capsys, tmp_path):
    assert main(["report", str(demo["deaf"])]) == 0
    out = capsys.readouterr().out
    assert "Findings (recorded: the ofu.finding events the jobs processor logged while it ran): 1" in out
    assert "Jobs: as the jobs processor counted them while it ran" in out and "Recomputed from" not in out
    assert main(["report", str(demo["deaf"]), "--plots", str(tmp_path)]) == 0  # a replay: the findings compared
    out = capsys.readouterr().out
    assert "Findings (recorded: the ofu.finding events the jobs processor logged while it ran): 1" in out
    assert "Recomputed from these points with default jobs settings, there are 2 finding(s), not the 1 recorded" in out
    assert main(["report", str(demo["deaf"]), "--recompute"]) == 0
    assert "as --recompute asks" in capsys.readouterr().out
    assert main(["report", str(demo["node0"])]) == 0
    assert "the recording holds no finding events" in capsys.readouterr().out


def test_the_first_window_is_as_long_as_the_recordings_interval(tmp_path, capsys):
    """30 s scrapes: 120 windows are exactly one GPU hour, the first included (not 10 s of it)."""
    path = tmp_path / "scrapes.jsonl"
    exporter = _exporter(path)
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    for k in range(1, 121):
        sample = GpuSample(int((START + 30 * k) * 1e9), 30.0, "node", 0, "GPU-1", "NVIDIA H100 80GB HBM3", 0.5, 1830,
                           job_id="train", precision="bf16")
        exporter.export(ofu.process(Batch(samples=[sample])))
    exporter.shutdown()
    data = report(capsys, path)
    assert data["jobs"][0]["gpu_hours"] == pytest.approx(1.0, abs=1e-9)
    assert data["gpus"][0]["gpu_hours"] == pytest.approx(1.0, abs=1e-9)


def test_a_copy_of_the_same_file_counts_once(demo, tmp_path, capsys):
    copy = tmp_path / "copy.jsonl"
    shutil.copy(demo["node0"], copy)
    assert jobs_of(report(capsys, demo["node0"], copy)) == jobs_of(report(capsys, demo["node0"]))
