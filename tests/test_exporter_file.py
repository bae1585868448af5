"""The file exporter: rotation and compression as the Collector's, crash-safe lines, lean lines."""

from __future__ import annotations

import datetime as dt
import gzip
import itertools
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from otlp_backends import gpu_points, wait_until

from otel_ofu.core.model import Batch, Event, MetricPoint, attrs
from otel_ofu.exporters import file as file_exporter
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
    config.write_text(_sim_to_file(out, compression, nodes=2, time_acceleration=2000))
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


def _windows_read_back(path: Path) -> tuple[list[int], list[str]]:
    """The windows (gpu.ofu times of one GPU) a reader gets from ``path``, and the reader's warnings."""
    warnings: list[str] = []
    times = []
    for _, line in files.read_json_lines(path, warnings.append):
        for point in otlp.from_request(otlp.from_json_line(line)):
            if point.name == "gpu.ofu" and dict(point.resource)["gpu.index"] == "0":
                times.append(point.time_unix_nano)
    return times, warnings


def _sim_to_file(out: Path, compression: str, nodes: int = 1, time_acceleration: int = 100) -> str:
    """A config that runs simulated nodes of 8 GPUs, fast, into a file exporter at ``out``."""
    return f"""
receivers:
  sim: {{nodes: {nodes}, gpus_per_node: 8, seed: 1, time_acceleration: {time_acceleration}, collection_interval: 10s}}
processors:
  ofu: {{}}
exporters:
  file: {{path: {out}, compression: "{compression}"}}
service:
  pipelines:
    metrics: {{receivers: [sim], processors: [ofu], exporters: [file]}}
"""


@pytest.mark.parametrize("compression", ["", "zstd", "gzip"])
def test_a_full_file_system_leaves_the_file_readable_and_loses_no_batch(tmp_path, compression):
    """A real `otel-ofu run` writes through a file size limit (RLIMIT_FSIZE: every write past it
    fails with EFBIG, as a full disk's with ENOSPC), which is lifted later (space freed). Before
    the fix the failed write left a partial zstd frame / gzip member / line behind and the next
    writes were appended after it: readers stopped at the damage, so everything written after
    the disk filled was lost to them."""
    out = tmp_path / "out.jsonl"
    log = tmp_path / "run.log"
    config = tmp_path / "c.yaml"
    config.write_text(_sim_to_file(out, compression))
    limit = 40_000  # a few batches (about 1 kB a batch compressed, 12 kB plain)

    def limit_file_size():  # Python ignores SIGXFSZ, so a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    proc = subprocess.Popen([sys.executable, "-m", "otel_ofu", "run", "--config", str(config)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"),  # noqa: SIM115
                            preexec_fn=limit_file_size)
    try:
        assert wait_until(lambda: "File too large" in log.read_text() or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, log.read_text()[-3000:]
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        grown = 3 * limit if compression else 12 * limit  # some tens of batches more
        assert wait_until(lambda: out.stat().st_size > grown, timeout=60), log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    times, warnings = _windows_read_back(out)
    assert warnings == []  # no partial or damaged frame, no partial line: nothing skipped
    assert len(times) > 10 and len(set(times)) == len(times)
    steps = {b - a for a, b in zip(times, times[1:], strict=False)}
    assert steps == {10 * 10**9}, sorted(steps)  # every window, from the first to the last: no batch lost
    frames = list(read_frames(out, "otlp_json", start_unix_nano=0))  # the replay receiver's reader
    assert len(frames) >= len(times)
    report = subprocess.run([sys.executable, "-m", "otel_ofu", "report", "--json", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0 and "partly written" not in report.stderr and "damaged" not in report.stderr, \
        report.stderr[-2000:]


_WRITE_UNDER_A_LIMIT = """
import json, resource, sys
sys.path.insert(0, "tests")
from test_exporter_file import batches
from otel_ofu.exporters.file import FACTORY
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
path, compression, pending, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fmt = sys.argv[5] if len(sys.argv) > 5 else "json"
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))  # every write past it: EFBIG
context = Context("file")
made = FACTORY.create(build_config(FACTORY.config_type, {"path": path, "compression": compression, "format": fmt,
                                                         "max_pending_megabytes": pending}), context)
made.start()
sent = 0
for batch in batches(60, gpus=16):
    made.export(batch)
    sent += len(batch)
made.shutdown()
telemetry = context.telemetry
print(json.dumps({"sent": sent, "lines": made.lines_written,
                  "failed": sum(telemetry.counters("otel_ofu.exporter.write_failed").values()),
                  "dropped": {dict(a)["reason"]: v for a, v in telemetry.counters("otel_ofu.exporter.dropped").items()},
                  "pending": telemetry.gauge("otel_ofu.exporter.pending", exporter="file")}))
"""


@pytest.mark.parametrize("compression, pending", [("", 1), ("zstd", 0), ("gzip", 1)])
def test_writes_that_keep_failing_are_counted_and_what_was_written_stays_readable(tmp_path, compression, pending):
    """A file that can never grow again (RLIMIT_FSIZE kept): every batch is either read back or
    counted as dropped (beyond max_pending_megabytes, or still unwritten at shutdown), and the file
    holds only whole lines / frames."""
    path = tmp_path / "m.jsonl"
    limit = 100_000 if not compression else 8_000
    done = subprocess.run([sys.executable, "-c", _WRITE_UNDER_A_LIMIT, str(path), compression, str(pending),
                           str(limit)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    warnings: list[str] = []
    read = sum(len(list(otlp.from_request(otlp.from_json_line(text))))
               for _, text in files.read_json_lines(path, warnings.append))
    assert warnings == [] and 0 < path.stat().st_size <= limit
    assert result["lines"] == len(list(files.read_json_lines(path)))
    assert result["failed"] > 0 and "File too large" in done.stderr
    dropped = result["dropped"]
    assert read + sum(dropped.values()) == result["sent"], (read, result)
    if pending:  # kept up to 1 MiB (about 50 plain batches), the oldest dropped beyond; the rest lost at shutdown
        assert dropped["shutdown"] > 0 and result["pending"] == 0
        assert (dropped.get("write_error", 0) > 0) == (not compression)  # 60 compressed batches fit in 1 MiB
        assert "never written" in done.stderr
    else:
        assert set(dropped) == {"write_error"}


# --- property: what the exporter writes, the one reader gives back -----------------------------

# A metric has one kind: gauges, and one cumulative sum.
_NAMES = {"gpu.ofu": False, "gpu.sm.clock.frequency": False, "job.ofu": False, "a.metric.of.another.tool": False,
          "otel_ofu.exporter.dropped": True}
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)  # any Unicode a label may carry
_POINTS = st.lists(st.builds(
    lambda name, value, t, host, gpu, job: MetricPoint(
        name, value, t, attrs({"host.name": host, "gpu.index": gpu}), attrs({"ofu.job.id": job}) if job else (),
        unit="1", monotonic=_NAMES[name], start_time_unix_nano=1 if _NAMES[name] else 0),
    st.sampled_from(sorted(_NAMES)), st.floats(allow_nan=False, width=64) | st.integers(-2**53, 2**53).map(float),
    st.integers(1, 2**63 - 1), _TEXT, st.sampled_from(["0", "1", "7"]), _TEXT), max_size=40)
_EVENTS = st.lists(st.builds(
    lambda name, t, job, body: Event(name, t, attrs({"host.name": "n"}), attrs({"ofu.job.id": job}), body),
    st.sampled_from(["ofu.job.start", "ofu.job.end", "ofu.finding"]), st.integers(1, 2**63 - 1), _TEXT, _TEXT),
    max_size=3)
_BATCHES = st.lists(st.builds(lambda points, events: Batch(points=points, events=events), _POINTS, _EVENTS),
                    min_size=1, max_size=12)


def _point_key(point) -> tuple:
    return point.resource, point.name, point.time_unix_nano, point.attributes, point.value, point.monotonic


def _event_key(event) -> tuple:
    return event.name, event.time_unix_nano, event.resource, dict(event.attributes).get("ofu.job.id"), event.body


@pytest.mark.parametrize("compression", ["", "zstd", "gzip"])
@pytest.mark.parametrize("rotated", [False, True])
def test_every_batch_written_is_read_back(tmp_path_factory, monkeypatch, compression, rotated):
    """Any batches (Unicode labels, any finite value, events), written by the file exporter,
    plain or compressed, in one file or a rotated set (rotating every few kB here), read back by
    the one reader of recordings (report and replay use it) as exactly those batches, in order."""
    if rotated:
        monkeypatch.setattr("otel_ofu.exporters.file.MIB", 4096)  # max_megabytes: 1 is 4 kB: many rotations

    @settings(max_examples=30, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(written=_BATCHES)
    def check(written):
        path = tmp_path_factory.mktemp("rec") / "m.jsonl"
        config = {"compression": compression, **({"rotation": {"max_megabytes": 1, "max_backups": 0}}
                                                 if rotated else {})}
        made = exporter(path, **config)
        for batch in written:
            made.export(batch)
        made.shutdown()
        warnings: list[str] = []
        read_points, read_events = [], []
        for part in files.rotated_files(path):
            for _, text in files.read_json_lines(part, warnings.append):
                request = otlp.from_json_line(text)
                if text.startswith('{"resourceLogs"'):
                    read_events += [_event_key(e) for e in otlp.events_from_request(request)]
                else:
                    read_points += [_point_key(p) for p in otlp.from_request(request)]
        assert warnings == []
        # In order across batches and files; within one request the encoder groups by resource and metric.
        assert sorted(read_points) == sorted(_point_key(p) for b in written for p in b.points)
        expected_lines = [sorted(_point_key(p) for p in b.points) for b in written if b.points]
        assert _lines_of(read_points, expected_lines) == expected_lines
        assert read_events == [_event_key(e) for b in written for e in b.events]

    check()


def _lines_of(read: list[tuple], expected: list[list[tuple]]) -> list[list[tuple]]:
    """``read`` cut into consecutive runs of the lengths in ``expected``, each sorted: the order of
    the batches is kept although the order within one is the encoder's."""
    out, start = [], 0
    for want in expected:
        out.append(sorted(read[start:start + len(want)]))
        start += len(want)
    assert start == len(read)
    return out


_ROTATE_THEN_FAIL = """
import json, resource, sys
sys.path.insert(0, "tests")
from test_exporter_file import batches
import otel_ofu.exporters.file as file_exporter
from otel_ofu.otlp import files
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
file_exporter.MIB = 4096  # rotation.max_megabytes 1 is 4 kB here
resource.setrlimit(resource.RLIMIT_FSIZE, (30_000, resource.RLIM_INFINITY))  # one big batch is larger
made = file_exporter.FACTORY.create(build_config(file_exporter.FACTORY.config_type, {
    "path": sys.argv[1], "rotation": {"max_megabytes": 1, "max_backups": 0}, "max_pending_megabytes": 0}),
    Context("file"))
made.start()
made.export(next(batches(1, gpus=1)))  # about 1.5 kB: the first file
made.export(next(batches(1, gpus=40)))  # about 60 kB: rotates, then cannot be written (EFBIG): dropped
made.export(next(batches(1, gpus=1)))  # the new file's first line
made.shutdown()
print(len(files.rotated_files(sys.argv[1])))
"""


def test_a_batch_that_fails_after_a_rotation_leaves_the_new_file_its_descriptions(tmp_path):
    """The new file of a rotation gets each metric's description with its first line, also when
    the write that followed the rotation failed and was undone."""
    path = tmp_path / "m.jsonl"
    done = subprocess.run([sys.executable, "-c", _ROTATE_THEN_FAIL, str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "File too large" in done.stderr, done.stderr[-3000:]
    parts = files.rotated_files(path)
    assert len(parts) == 2 and path.stat().st_size > 0
    for part in parts:
        first = json.loads(next(files.read_json_lines(part))[1])["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
        assert all(m.get("description") for m in first), (part.name, first)


def _unshare_works() -> bool:
    """A user and mount namespace of our own, where a small tmpfs can be mounted (no root needed where
    unprivileged user namespaces are allowed)."""
    if not shutil.which("unshare"):
        return False
    done = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                          capture_output=True, timeout=30)
    return done.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="no user/mount namespace here for a small tmpfs (unshare -rm); "
                    "test_a_full_file_system_leaves_the_file_readable_and_loses_no_batch covers it with EFBIG")
@pytest.mark.parametrize("compression, size, filler, grown", [("", "1m", 900_000, 400_000),
                                                              ("zstd", "256k", 200_000, 80_000)])
def test_a_full_tmpfs_leaves_the_file_readable_and_loses_no_batch(tmp_path, compression, size, filler, grown):
    """The same with a real full disk: a small tmpfs nearly filled by another file (ENOSPC), which is
    deleted later (space freed), as a log rotation would."""
    disk = tmp_path / "disk"
    disk.mkdir()
    out, copied, log, config = disk / "out.jsonl", tmp_path / "out.jsonl", tmp_path / "run.log", tmp_path / "c.yaml"
    config.write_text(_sim_to_file(out, compression))
    script = (f"mount -t tmpfs -o size={size} tmpfs {disk} && head -c {filler} /dev/zero > {disk}/filler && "
              f"{sys.executable} -m otel_ofu run --config {config} 2> {log}; rc=$?; cp {out} {copied}; exit $rc")
    shell = subprocess.Popen(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, stdout=subprocess.DEVNULL)

    def otel_ofu() -> int | None:  # the run inside the namespace: the shell's child
        children = Path(f"/proc/{shell.pid}/task/{shell.pid}/children")
        pids = children.read_text().split() if children.exists() else []
        return int(pids[0]) if pids else None

    try:
        assert wait_until(lambda: (log.exists() and "No space left" in log.read_text()) or shell.poll() is not None,
                          timeout=60)
        pid = otel_ofu()
        assert shell.poll() is None and pid is not None, log.read_text()[-3000:]
        inside = Path(f"/proc/{pid}/root") / disk.relative_to("/")
        (inside / "filler").unlink()  # space freed
        assert wait_until(lambda: (inside / "out.jsonl").stat().st_size > grown, timeout=60)
        os.kill(pid, signal.SIGTERM)
        assert shell.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if shell.poll() is None:
            shell.kill()
    times, warnings = _windows_read_back(copied)
    assert warnings == [] and len(times) > 10
    assert {b - a for a, b in zip(times, times[1:], strict=False)} == {10 * 10**9}  # no window missing


# --- format: proto: the Collector's length-prefixed records -------------------------------------

def records_of(path: Path) -> list[bytes]:
    """The messages of a format: proto file (each after its 4-byte big-endian length), decompressed."""
    data = path.read_bytes()
    out, i = [], 0
    while i < len(data):
        (size,) = struct.unpack(">I", data[i:i + 4])
        assert i + 4 + size <= len(data), f"{path}: a record cut short at byte {i}"
        body = data[i + 4:i + 4 + size]
        out.append(zstandard.ZstdDecompressor().decompress(body) if body.startswith(files.ZSTD_MAGIC) else body)
        i += 4 + size
    return out


def requests_of(body: bytes):
    """A record's request: metrics, unless no metric has a name (a LogRecord's first field is its time,
    a fixed64, where a Metric's name is: protobuf reads a logs request as metrics without names)."""
    metrics = ExportMetricsServiceRequest.FromString(body)
    if any(m.name for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics):
        return metrics
    return ExportLogsServiceRequest.FromString(body)


def test_proto_records_hold_the_requests_the_json_lines_hold(tmp_path):
    """The same batches (points, events, descriptions once per file) as JSON lines and as proto records,
    plain and zstd: the same requests, one record per line."""
    written = [Batch(points=b.points, events=[Event("ofu.job.end", 1_767_225_600_000_000_000 + k,
                                                      attrs({"ofu.job.id": "j"}), (), "ended")] if k % 2 else [])
               for k, b in enumerate(batches(6, gpus=4))]
    lines = tmp_path / "m.jsonl"
    made = exporter(lines)
    for batch in written:
        made.export(batch)
    made.shutdown()
    expected = [otlp.from_json_line(text) for _, text in files.read_json_lines(lines)]
    assert len(expected) == 9
    for compression in ("", "zstd"):
        path = tmp_path / f"m{compression}.bin"
        made = exporter(path, format="proto", compression=compression)
        for batch in written:
            made.export(batch)
        made.shutdown()
        assert [requests_of(body) for body in records_of(path)] == expected
        assert made.lines_written == 9
        raw = path.read_bytes()
        assert raw.count(b"Overall FLOP Utilization") == (1 if not compression else 0)  # described once per file
        if compression:  # each record's message one zstd frame, as the Collector's per-message compression
            assert raw[4:8] == files.ZSTD_MAGIC


@pytest.mark.parametrize("compression", ["", "zstd"])
def test_proto_files_rotate_on_whole_records(tmp_path, monkeypatch, compression):
    monkeypatch.setattr("otel_ofu.exporters.file.MIB", 8192)  # max_megabytes: 1 is 8 kB: many rotations
    path = tmp_path / "metrics.bin"
    made = exporter(path, format="proto", compression=compression, rotation={"max_megabytes": 1, "max_backups": 0})
    sent = []
    for batch in batches(60, gpus=8):
        made.export(batch)
        sent += batch.points
    made.shutdown()
    rotated = files.rotated_files(path)
    assert len(rotated) >= 3 and all(p.stat().st_size <= 8192 for p in rotated)
    read = [key(p) for part in rotated for body in records_of(part) for p in otlp.from_request(requests_of(body))]
    assert read == [key(p) for p in sent]
    for part in rotated:  # every file starts with the descriptions again
        first = requests_of(records_of(part)[0])
        assert first.resource_metrics[0].scope_metrics[0].metrics[0].description


def test_proto_append_cuts_a_partial_record_and_a_file_keeps_one_format(tmp_path):
    path = tmp_path / "m.bin"
    made = exporter(path, format="proto")
    made.export(next(batches(1)))
    made.shutdown()
    whole = path.read_bytes()
    with open(path, "ab") as handle:  # a crash mid-record: its length says 5,000 bytes, 30 were written
        handle.write(struct.pack(">I", 5000) + b"\x0a" * 30)
    made = exporter(path, format="proto", append=True)
    made.export(next(batches(1)))
    made.shutdown()
    bodies = records_of(path)
    assert len(bodies) == 2 and path.read_bytes().startswith(whole)
    assert all(requests_of(b).resource_metrics for b in bodies)
    with pytest.raises(ValueError, match="holds length-prefixed records: format: json cannot append"):
        exporter(path, append=True)
    lines = tmp_path / "m.jsonl"
    lines.write_text('{"resourceMetrics":[]}\n')
    with pytest.raises(ValueError, match="holds text lines or frames: format: proto cannot append"):
        exporter(lines, format="proto", append=True)
    assert lines.read_text() == '{"resourceMetrics":[]}\n'


def test_a_crash_repair_of_proto_records_keeps_every_whole_record(tmp_path):
    """Cut anywhere (a crash mid-write), the repair keeps exactly the records before the cut."""
    path = tmp_path / "m.bin"
    made = exporter(path, format="proto")
    for batch in batches(4, gpus=2):
        made.export(batch)
    made.shutdown()
    whole = path.read_bytes()
    ends = list(itertools.accumulate(4 + len(b) for b in records_of(path)))
    for cut in range(0, len(whole), 97):
        path.write_bytes(whole[:cut])
        removed = file_exporter.repair_records_tail(path)
        kept = max([0] + [end for end in ends if end <= cut])
        assert path.stat().st_size == kept and removed == cut - kept


@pytest.mark.parametrize("data, key", [
    ({"format": "proto", "compression": "gzip"}, "compression"),
    ({"format": "xml"}, "format"),
])
def test_bad_format_settings_name_the_key(tmp_path, data, key):
    with pytest.raises(FieldError) as error:
        build_config(FACTORY.config_type, {"path": str(tmp_path / "x.bin"), **data})
    assert error.value.key == key


@pytest.mark.parametrize("compression, pending", [("", 1), ("zstd", 0)])
def test_proto_writes_that_keep_failing_leave_only_whole_records(tmp_path, compression, pending):
    """As for lines: a file that cannot grow holds whole records only, and every batch is read back or
    counted as dropped."""
    path = tmp_path / "m.bin"
    limit = 40_000 if not compression else 6_000
    done = subprocess.run([sys.executable, "-c", _WRITE_UNDER_A_LIMIT, str(path), compression, str(pending),
                           str(limit), "proto"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    bodies = records_of(path)  # whole records to the end of the file
    read = sum(len(list(otlp.from_request(requests_of(body)))) for body in bodies)
    assert 0 < path.stat().st_size <= limit and result["lines"] == len(bodies)
    assert result["failed"] > 0 and "File too large" in done.stderr
    assert read + sum(result["dropped"].values()) == result["sent"], (read, result)


def _json_format_lines(written: list[Batch]) -> bytes:
    """The exporter's lines as it wrote them through json_format (before wire_json): the reference."""
    described: set[str] = set()
    out = []
    for batch in written:
        request = otlp.to_request(batch.points)
        request.resource_metrics.extend(otlp.passthrough_messages(batch.passthrough))
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name in described:
                        metric.description = ""
                    elif metric.description:
                        described.add(metric.name)
        out.append(otlp.to_json_line(request))
        if batch.events:
            out.append(otlp.to_json_line(otlp.events_to_request(batch.events)))
    return ("\n".join(out) + "\n").encode()


def test_json_lines_are_byte_for_byte_what_json_format_wrote(tmp_path):
    """Points (NaN, infinities, unicode labels, sums), pass-through OTLP (the SDK's request from the corpus:
    histograms), events, descriptions once per file: the lines json_format wrote, byte for byte."""
    sdk = ExportMetricsServiceRequest.FromString(
        (ROOT / "tests" / "data" / "real" / "otlp" / "sdk-training-reporter.http-protobuf.bin").read_bytes())
    written = []
    for k, batch in enumerate(batches(4, gpus=3)):
        resource = attrs({"host.name": "nœud-1", "gpu.index": "0"})
        extra = [MetricPoint("gpu.ofu", v, 1_767_225_600_000_000_000 + k, resource, attrs({"ofu.job.id": "j"}))
                 for v in (float("nan"), float("inf"), -0.0)]
        extra.append(MetricPoint("otel_ofu.exporter.dropped", float(k), 5 + k, resource, (), "{item}", True, 1))
        events = [Event("ofu.finding", 7 + k, resource, attrs({"ofu.job.id": "j"}), "MFU 2× OFU", "WARN")]
        written.append(Batch(points=batch.points + extra, passthrough=list(sdk.resource_metrics) if k % 2 else [],
                             events=events if k % 2 == 0 else []))
    path = tmp_path / "m.jsonl"
    made = exporter(path)
    for batch in written:
        made.export(batch)
    made.shutdown()
    assert path.read_bytes() == _json_format_lines(written)


@pytest.mark.parametrize("compression", ["", "zstd"])
def test_what_format_proto_writes_the_report_and_replay_read_as_they_read_the_json_lines(tmp_path, compression):
    """The writer and the readers agree: a recording the file exporter wrote as proto records (any name)
    gives the report its JSON lines give, and the replay receiver the same points."""
    from otel_ofu.receivers.replay import read_frames
    from otel_ofu.report.build import build_report, report_json

    written = list(batches(6, gpus=4))
    lines, records = tmp_path / "m.jsonl", tmp_path / "m.recording"
    for path, config in ((lines, {}), (records, {"format": "proto", "compression": compression})):
        made = exporter(path, **config)
        for batch in written:
            made.export(batch)
        made.shutdown()

    def report_of(path: Path) -> dict:
        out = report_json(build_report(path))
        out.pop("source")
        inputs = out.pop("inputs")
        assert [source["format"] for source in inputs] == ["otlp_proto" if path == records else "otlp_json"]
        return out

    assert report_of(records) == report_of(lines)
    assert report_of(lines)["fleet"]["gpu_hours"] > 0

    def points_of(path: Path) -> list:
        return sorted((p.resource, p.name, p.time_unix_nano, p.attributes, p.value)
                      for frame in read_frames(path, "auto", start_unix_nano=0) for p in frame.batch.points)

    assert points_of(records) == points_of(lines) and points_of(lines)
