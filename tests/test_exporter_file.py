"""The file exporter: rotation and compression as the Collector's, crash-safe lines, lean lines."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard
from otlp_backends import gpu_points, wait_until

from otel_ofu.core.model import Batch, Event, attrs
from otel_ofu.exporters.file import FACTORY, FileExporter
from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp import files
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.receivers.replay import read_frames

ROOT = Path(__file__).resolve().parent.parent
LUMBERJACK = re.compile(r"^metrics-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3}\.jsonl$")


def exporter(path: Path, **config) -> FileExporter:
    made = FACTORY.create(build_config(FACTORY.config_type, {"path": str(path), **config}), Context("file"))
    made.start()
    return made


def batches(n: int, gpus: int = 16):
    for w in range(n):
        yield Batch(points=gpu_points(gpus=gpus, windows=1, t0=1_767_225_600_000_000_000 + w * 10**10))


def points_in(paths: list[Path]) -> list:
    out = []
    for path in paths:
        for _, line in files.read_json_lines(path):
            request = otlp.from_json_line(line)
            out += list(otlp.from_request(request))
    return [key(p) for p in out]


def key(point) -> tuple:
    return point.resource, point.name, point.time_unix_nano, point.attributes, point.value


def test_rotation_names_sizes_and_retention(tmp_path):
    path = tmp_path / "metrics.jsonl"
    made = exporter(path, rotation={"max_megabytes": 1, "max_backups": 2})
    sent = []
    for batch in batches(120):  # about 20 kB a line: several MiB in all
        made.export(batch)
        sent += batch.points
    made.shutdown()
    rotated = files.rotated_files(path)
    assert rotated[-1] == path and len(rotated) == 3  # max_backups 2, and the current file
    assert all(LUMBERJACK.match(p.name) for p in rotated[:-1]), [p.name for p in rotated]
    assert all(p.stat().st_size <= 1024 * 1024 for p in rotated)
    kept = points_in(rotated)
    # The newest points are all there, in time order across the files, each once.
    assert [p[2] for p in kept] == sorted(p[2] for p in kept)
    assert kept == [key(p) for p in sent[-len(kept):]]
    assert len(kept) > len(sent) // 4


def test_max_days_removes_old_rotated_files_and_localtime_names(tmp_path, monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # UTC+9, no daylight saving
    time.tzset()
    try:
        path = tmp_path / "metrics.jsonl"
        old = files.backup_path(path, dt.datetime.now().astimezone() - dt.timedelta(days=10))
        recent = files.backup_path(path, dt.datetime.now().astimezone() - dt.timedelta(days=1))
        for backup in (old, recent):
            backup.write_text("{}\n")
        path.write_text('{"resourceMetrics":[]}\n')  # a previous run's file: rotated, not truncated
        made = exporter(path, rotation={"max_megabytes": 1, "max_days": 3, "localtime": True})
        for batch in batches(80):
            made.export(batch)
        made.shutdown()
        names = [p.name for p in files.rotated_files(path, localtime=True)]
        assert old.name not in names and recent.name in names
        local_now = dt.datetime.now().astimezone()
        newest = files.backup_time(path, files.rotated_files(path, localtime=True)[-2], localtime=True)
        assert abs((local_now - newest).total_seconds()) < 600  # named in Tokyo time, not UTC
        assert f"-{local_now:%Y-%m-%dT%H}" in names[-2]
        assert any(json.loads(line) == {"resourceMetrics": []} for p in files.rotated_files(path, localtime=True)
                   for _, line in files.read_json_lines(p))  # the previous run's data was kept
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_compressed_files_are_standard_streams_and_read_back(tmp_path, compression):
    path = tmp_path / f"metrics.jsonl.{'zst' if compression == 'zstd' else 'gz'}"
    made = exporter(path, compression=compression, rotation={"max_megabytes": 1})
    sent = []
    for batch in batches(200):
        made.export(batch)
        sent += batch.points
    made.shutdown()
    rotated = files.rotated_files(path)
    for part in rotated:
        raw = part.read_bytes()
        if compression == "gzip":
            text = gzip.decompress(raw)  # multi-member gzip, as gzip -d reads it
        else:
            text = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True).read()
        assert all(json.loads(line) for line in text.splitlines())
    tool = shutil.which("zstd" if compression == "zstd" else "gzip")
    if tool:
        done = subprocess.run([tool, "-dc", str(rotated[0])], capture_output=True, check=True)
        assert done.stdout.startswith(b'{"resourceMetrics"')
    assert points_in(rotated) == [key(p) for p in sent]
    plain = tmp_path / "plain.jsonl"
    plain_exporter = exporter(plain)
    for batch in batches(20):
        plain_exporter.export(batch)
    plain_exporter.shutdown()
    assert sum(p.stat().st_size for p in rotated) < 0.2 * 10 * plain.stat().st_size  # 200 vs 20 batches


@pytest.mark.parametrize("compression", ["", "zstd", "gzip"])
def test_a_crash_leaves_at_most_one_partial_line_which_readers_skip(tmp_path, compression):
    """kill -9 of a real `otel-ofu run` while it writes; then the replay receiver reads the file."""
    out = tmp_path / "out.jsonl"
    config = tmp_path / "c.yaml"
    config.write_text(f"""
receivers:
  sim: {{nodes: 2, gpus_per_node: 8, seed: 1, time_acceleration: 2000, collection_interval: 10s}}
processors:
  ofu: {{}}
exporters:
  file: {{path: {out}, compression: "{compression}"}}
service:
  pipelines:
    metrics: {{receivers: [sim], processors: [ofu], exporters: [file]}}
""")
    proc = subprocess.Popen([sys.executable, "-m", "otel_ofu", "run", "--config", str(config)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: out.exists() and out.stat().st_size > 300_000, timeout=60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Whatever the kill cut, cut the file again mid-line / mid-frame, as a crash mid-write would.
    data = out.read_bytes()
    out.write_bytes(data[:len(data) - 37])
    warnings: list[str] = []
    lines = list(files.read_json_lines(out, warnings.append))
    assert lines and all(json.loads(text) for _, text in lines)
    assert len(warnings) == 1, warnings
    assert any(what in warnings[0] for what in ("partly written last line", "mid-frame")), warnings
    frames = list(read_frames(out, "otlp_json", start_unix_nano=0))  # the replay receiver's reader
    assert sum(len(f.batch.points) for f in frames) == sum(
        len(list(otlp.from_request(otlp.from_json_line(text)))) for _, text in lines)
    # Appending after the crash: the broken tail is cut first, so every line parses again.
    made = exporter(out, append=True, compression=compression)
    made.export(next(batches(1)))
    made.shutdown()
    warnings.clear()
    after = list(files.read_json_lines(out, warnings.append))
    assert warnings == [] and len(after) >= len(lines) + 1


def test_descriptions_are_written_once_per_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    made = exporter(path, rotation={"max_megabytes": 1})
    for batch in batches(100):
        made.export(batch)
    made.shutdown()
    for part in files.rotated_files(path):
        described = []
        for _, line in files.read_json_lines(part):
            for rm in json.loads(line)["resourceMetrics"]:
                for sm in rm["scopeMetrics"]:
                    described += [m["name"] for m in sm["metrics"] if m.get("description")]
        assert sorted(described) == sorted(set(described)) and "gpu.ofu" in described, part.name
    repeated = tmp_path / "repeated.jsonl"
    made = exporter(repeated, repeat_descriptions=True)
    for batch in batches(3):
        made.export(batch)
    made.shutdown()
    assert repeated.read_text().count('"description"') > 3 * 5


def test_events_keep_their_own_lines(tmp_path):
    path = tmp_path / "m.jsonl.zst"
    made = exporter(path, compression="zstd")
    event = Event("ofu.job.end", 1_767_225_600_000_000_000, attrs({"ofu.job.id": "j"}), (), "ended", "INFO")
    made.export(Batch(points=gpu_points(gpus=1, windows=1), events=[event]))
    made.shutdown()
    kinds = [next(iter(json.loads(text))) for _, text in files.read_json_lines(path)]
    assert kinds == ["resourceMetrics", "resourceLogs"] and made.lines_written == 2


@pytest.mark.parametrize("data, key", [
    ({"rotation": {"max_megabytes": 0}}, "rotation.max_megabytes"),
    ({"rotation": {"max_backups": -1}}, "rotation.max_backups"),
    ({"rotation": {"max_dayz": 1}}, "rotation.max_dayz"),
    ({"rotation": 5}, "rotation"),
    ({"compression": "lz4"}, "compression"),
])
def test_bad_settings_name_the_key(tmp_path, data, key):
    with pytest.raises(FieldError) as error:
        build_config(FACTORY.config_type, {"path": str(tmp_path / "x.jsonl"), **data})
    assert error.value.key == key


def test_without_rotation_the_file_is_truncated_or_appended_as_in_the_collector(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"resourceMetrics":[]}\n')
    exporter(path).shutdown()
    assert path.read_text() == ""
    path.write_text('{"resourceMetrics":[]}\n')
    made = exporter(path, append=True)
    made.export(next(batches(1)))
    made.shutdown()
    assert path.read_text().startswith('{"resourceMetrics":[]}\n{"resourceMetrics":[{')
    assert os.listdir(tmp_path) == ["m.jsonl"]
