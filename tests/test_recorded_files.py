"""The one reader of recorded files (otel_ofu.otlp.files): every layout a recording comes in, read
the same by each caller (the library, the replay receiver, ``otel-ofu report``); a crash's partial
tail skipped with one warning; rotated names (lumberjack, timberjack); the real Collector's files."""

from __future__ import annotations

import gzip
import logging
import struct
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard
from e2e_util import Process, collector_binary, free_ports, port_open, wait_for
from otlp_backends import T0, gpu_points

from otel_ofu.core.model import Batch, Event, attrs
from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp import files
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.receivers.replay import (
    ReplayFormatError,
    ReplayReceiver,
    ReplayReceiverConfig,
    detect_format,
    read_frames,
)
from otel_ofu.report.build import ReportError, build_report
from otel_ofu.report.inputs import InputFile, data_time_order

DATA = Path(__file__).resolve().parent / "data" / "replay"
S = 1_000_000_000
WINDOWS = 6
SENT = [p for w in range(WINDOWS) for p in gpu_points(gpus=2, windows=1, t0=T0 + w * 10 * S)]


def _lines() -> list[bytes]:
    """A recording's lines as the file exporter writes them: metrics, one per window, and an events line."""
    out = [(otlp.to_json_line(otlp.to_request(SENT[w * 10:(w + 1) * 10])) + "\n").encode() for w in range(WINDOWS)]
    event = Event("ofu.job.end", T0 + WINDOWS * 10 * S, attrs({"ofu.job.id": "job-0"}), (), "ended", "INFO")
    out.insert(3, (otlp.to_json_line(otlp.events_to_request([event])) + "\n").encode())
    return out


LINES = _lines()


def key(point) -> tuple:
    return point.resource, point.name, point.time_unix_nano, point.attributes, point.value


def _frames(lines: list[bytes]) -> bytes:
    return b"".join(zstandard.ZstdCompressor().compress(line) for line in lines)


def _records(lines: list[bytes]) -> bytes:
    """The Collector's length-prefixed records (compression: zstd without native compression)."""
    frames = [zstandard.ZstdCompressor().compress(line.rstrip(b"\n")) for line in lines]
    return b"".join(struct.pack(">I", len(frame)) + frame for frame in frames)


SKIPPABLE = struct.pack("<II", 0x184D2A50, 4) + b"pzst"  # pzstd writes one before each frame
LAYOUTS = {
    "plain": ("", lambda lines: b"".join(lines)),
    "gzip members": ("gzip", lambda lines: b"".join(gzip.compress(line, mtime=0) for line in lines)),
    "gzip stream, zero padded": ("gzip", lambda lines: gzip.compress(b"".join(lines), mtime=0) + b"\0" * 16),
    "zstd frames": ("zstd", _frames),
    "zstd stream": ("zstd", lambda lines: zstandard.ZstdCompressor().compress(b"".join(lines))),
    "pzstd": ("zstd", lambda lines: b"".join(SKIPPABLE + zstandard.ZstdCompressor().compress(line)
                                             for line in lines)),
    "records+zstd": ("records+zstd", _records),
    "records": ("records", lambda lines: b"".join(struct.pack(">I", len(line) - 1) + line[:-1] for line in lines)),
}


def _proto() -> list[bytes]:
    """The same requests as LINES, as OTLP protobuf (what the Collector's format: proto holds)."""
    out = [otlp.to_request(SENT[w * 10:(w + 1) * 10]).SerializeToString() for w in range(WINDOWS)]
    event = Event("ofu.job.end", T0 + WINDOWS * 10 * S, attrs({"ofu.job.id": "job-0"}), (), "ended", "INFO")
    out.insert(3, otlp.events_to_request([event]).SerializeToString())
    return out


PROTO = _proto()


def _prefixed(records: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(record)) + record for record in records)


# The Collector's file exporter with format: proto (exportMessageAsBuffer: 4-byte big-endian
# length, then the message): plain; compression: zstd (each record a zstd frame); with the
# exporter.file.nativeCompression gate, one zstd or gzip stream around the records.
PROTO_LAYOUTS = {
    "records": ("records", _prefixed),
    "records+zstd": ("records+zstd", lambda records: _prefixed([zstandard.ZstdCompressor().compress(r)
                                                                for r in records])),
    "zstd+records": ("zstd+records", lambda records: zstandard.ZstdCompressor().compress(_prefixed(records))),
    "gzip+records": ("gzip+records", lambda records: gzip.compress(_prefixed(records), mtime=0)),
}


def read_by_every_caller(path: Path, caplog) -> dict[str, tuple]:
    """What each caller read: (lines or frames, partial tail seen, warnings about the file)."""
    caplog.clear()
    told: list[str] = []
    library = [text for _, text in files.read_requests(path, told.append)]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        frames = list(read_frames(path, "auto", start_unix_nano=0))
    replay_warnings = [r for r in caplog.records if str(path) in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        report = build_report(path)
    report_warnings = [r for r in caplog.records if str(path) in r.getMessage()]
    (source,) = report.inputs
    return {"library": (len(library), bool(told), len(told)),
            "replay": (len(frames), bool(replay_warnings), len(replay_warnings)),
            "report": (source.lines, source.partial_tail, len(report_warnings)),
            "compression": source.compression}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_is_read_the_same_by_every_caller(tmp_path, caplog, layout):
    compression, write = LAYOUTS[layout]
    path = tmp_path / "metrics.jsonl"  # the Collector keeps the configured name when it compresses
    path.write_bytes(write(LINES))
    assert detect_format(path) == "otlp_json"
    read = read_by_every_caller(path, caplog)
    assert read.pop("compression") == compression
    assert read == {caller: (len(LINES), False, 0) for caller in ("library", "replay", "report")}
    replayed = [p for f in read_frames(path, "otlp_json", start_unix_nano=0) for p in f.batch.points]
    assert sorted(map(key, replayed)) == sorted(map(key, SENT))


@pytest.mark.parametrize("layout", ["plain", "gzip members", "zstd frames", "records+zstd"])
def test_a_crash_cut_tail_is_skipped_once_and_the_lines_before_it_are_read(tmp_path, caplog, layout):
    _, write = LAYOUTS[layout]
    whole = write(LINES)
    cut_at = len(whole) - len(write(LINES[-1:])) // 2  # halfway through the last line's bytes
    path = tmp_path / "crashed.jsonl"
    path.write_bytes(whole[:cut_at])
    read = read_by_every_caller(path, caplog)
    read.pop("compression")
    assert read == {caller: (len(LINES) - 1, True, 1) for caller in ("library", "replay", "report")}


@pytest.mark.parametrize("layout", PROTO_LAYOUTS)
def test_protobuf_records_are_read_by_every_caller_whatever_the_file_is_called(tmp_path, caplog, layout):
    """Binary OTLP recordings: told by their bytes (a .jsonl name does not matter), read as the
    same requests as the JSON lines: the same points replayed, the same report."""
    compression, write = PROTO_LAYOUTS[layout]
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(write(PROTO))
    assert detect_format(path) == "otlp_proto"
    read = read_by_every_caller(path, caplog)
    assert read.pop("compression") == compression
    assert read == {caller: (len(PROTO), False, 0) for caller in ("library", "replay", "report")}
    replayed = [f.batch for f in read_frames(path, "auto", start_unix_nano=0)]
    assert sorted(key(p) for b in replayed for p in b.points) == sorted(map(key, SENT))
    assert [e.name for b in replayed for e in b.events] == ["ofu.job.end"]
    as_json = tmp_path / "same.jsonl"
    as_json.write_bytes(b"".join(LINES))
    assert _report_of(path) == _report_of(as_json)


def _report_of(path: Path) -> dict:
    from otel_ofu.report.build import report_json

    out = report_json(build_report(path))
    out.pop("source")
    for source in out.pop("inputs"):
        assert source.pop("format") in ("otlp_json", "otlp_proto") and source.pop("path") == str(path)
        source.pop("compression")
        out.setdefault("inputs", []).append(source)
    return out


@pytest.mark.parametrize("layout", ["records", "zstd+records"])
def test_a_crash_cut_protobuf_record_is_skipped_once_and_the_records_before_it_are_read(tmp_path, caplog, layout):
    _, write = PROTO_LAYOUTS[layout]
    whole = _prefixed(PROTO)
    cut = whole[:len(whole) - len(PROTO[-1]) // 2]  # halfway through the last record
    path = tmp_path / "crashed.binpb"
    path.write_bytes(cut if layout == "records" else zstandard.ZstdCompressor().compress(cut))
    read = read_by_every_caller(path, caplog)
    read.pop("compression")
    assert read == {caller: (len(PROTO) - 1, True, 1) for caller in ("library", "replay", "report")}


def test_a_complete_last_line_without_its_newline_is_kept(tmp_path, caplog):
    path = tmp_path / "other-tool.jsonl"
    path.write_bytes(b"".join(LINES).rstrip(b"\n"))
    read = read_by_every_caller(path, caplog)
    read.pop("compression")
    assert read == {caller: (len(LINES), False, 0) for caller in ("library", "replay", "report")}


def test_a_cut_compressed_csv_replays_its_whole_rows(tmp_path, caplog):
    """A compressed dmon or CSV recording cut by a crash: the rows before the cut are replayed, with a
    warning; the cut row is not parsed (it could read as a wrong number)."""
    rows = (DATA / "a100.csv").read_bytes().splitlines(keepends=True)
    whole = b"".join(gzip.compress(row, mtime=0) for row in rows)
    path = tmp_path / "node.csv.gz"
    path.write_bytes(whole[:-12])
    with caplog.at_level(logging.WARNING):
        samples = [s for f in read_frames(path, "auto", start_unix_nano=0) for s in f.batch.samples]
    complete = [s for f in read_frames(DATA / "a100.csv", "csv", start_unix_nano=0) for s in f.batch.samples]
    assert samples == complete[:-1]
    assert len([r for r in caplog.records if str(path) in r.getMessage()]) == 1
    report = build_report(path)
    assert report.inputs[0].partial_tail and report.inputs[0].format == "csv"


def test_what_cannot_be_read_is_a_located_error_for_every_caller(tmp_path):
    damaged = tmp_path / "damaged.pb"  # a protobuf record whose first field runs past its end
    damaged.write_bytes(_records([b"\x0a\xff\xff\xff\x0f\n"]))
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(LINES[0] + '{"caf\u00e9"}\n'.encode("latin-1"))
    for path, line, words in ((damaged, 1, "not an OTLP protobuf export request"), (latin, 2, "not UTF-8 text")):
        with pytest.raises(ReplayFormatError) as replay:
            list(read_frames(path, "auto", start_unix_nano=0))
        assert replay.value.line == line and words in replay.value.message
        with pytest.raises(ReportError, match=words):
            build_report(path)
    with pytest.raises(files.RecordingError, match="not UTF-8 text") as library:
        list(files.read_json_lines(latin))
    assert library.value.line == 2
    # The JSON lines reader refuses protobuf records (read_items and read_requests read them).
    with pytest.raises(files.RecordingError, match="record 1: OTLP protobuf"):
        list(files.read_json_lines(damaged))


# --- rotated names -------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "stamp", "live"), [
    ("metrics-2026-11-30T12-07-16.799.jsonl", "2026-11-30T12-07-16.799", "metrics.jsonl"),  # lumberjack
    ("metrics-2026-11-30T12-07-16.799-size.jsonl", "2026-11-30T12-07-16.799", "metrics.jsonl"),  # timberjack
    ("metrics.jsonl-2026-11-30T12-07-16.799.zst", "2026-11-30T12-07-16.799", "metrics.jsonl.zst"),
    ("metrics-2026-11-30T12-07-16.799-time.jsonl.gz", "2026-11-30T12-07-16.799", "metrics.jsonl.gz"),
    ("metrics-2026-11-30T12-07-16.799", "2026-11-30T12-07-16.799", "metrics"),
    ("metrics.jsonl", "", "metrics.jsonl"),
    ("metrics-2026-11-30.jsonl", "", "metrics-2026-11-30.jsonl"),
])
def test_rotated_names(name, stamp, live):
    assert (files.rotation_stamp(name), files.unrotated_name(name)) == (stamp, live)


def test_a_rotated_set_is_in_time_order_for_the_exporter_and_the_report(tmp_path):
    """Timberjack's names (the Collector since v0.161) and lumberjack's; the live file is the newest."""
    live = tmp_path / "metrics"
    names = ["metrics-2026-11-30T12-07-16.799-size", "metrics-2026-11-30T12-08-00.000", "metrics-2026-11-30T12-09-"
             "00.000-time", "metrics"]
    for name in names:
        (tmp_path / name).write_bytes(LINES[0])
    assert [p.name for p in files.rotated_files(live)] == names
    # The report: files with the same data (or none) are listed as the set was written, not by path.
    sources = [InputFile(tmp_path / name, first=1.0) for name in reversed(names)]
    assert [s.path.name for s in sorted(sources, key=data_time_order)] == names


# --- the real Collector's files ----------------------------------------------------------------------

def _collector_file_exporters(tmp_path: Path, exporters: Callable[[Path], dict[str, str]], signals: tuple[str, ...],
                              send: Callable[[int], None]) -> Path:
    """Run the real Collector with an OTLP/HTTP receiver and ``exporters(out)`` (name -> its settings) on the
    ``signals`` pipelines, call ``send(port)``, stop it; returns ``out``, where the exporters wrote."""
    binary = collector_binary()
    (port,) = free_ports(1)
    out = tmp_path / "out"
    out.mkdir()
    settings = exporters(out)
    lines = "\n".join(f"  {name}: {value}" for name, value in settings.items())
    names = ", ".join(settings)
    pipelines = "\n".join(f"    {signal}: {{receivers: [otlp], exporters: [{names}]}}" for signal in signals)
    config = tmp_path / "collector.yaml"
    config.write_text(f"""
receivers:
  otlp: {{protocols: {{http: {{endpoint: 127.0.0.1:{port}}}}}}}
exporters:
{lines}
service:
  telemetry: {{metrics: {{level: none}}}}
  pipelines:
{pipelines}
""")
    collector = Process("otelcol", [binary, f"--config=file:{config}"], tmp_path / "otelcol.log")
    try:
        wait_for("the Collector's OTLP/HTTP port", lambda: port_open(port) or None, timeout=60)
        send(port)
    finally:
        assert collector.stop() == 0, collector.tail()
    return out


def test_the_collectors_rotated_and_length_prefixed_files(tmp_path, capsys):
    """The Collector's file exporter (v0.161): rotation gives timberjack names (``-size``),
    ``compression: zstd`` gives length-prefixed records. Replay and the report read both."""
    sent = []

    def send(port: int) -> None:
        for w in range(120):  # about 20 kB a request: a few rotations at 1 MiB
            points = gpu_points(gpus=16, windows=1, t0=T0 + w * 10 * S)
            sent.extend(points)
            assert _post(port, otlp.to_request(points).SerializeToString())

    out = _collector_file_exporters(tmp_path, lambda out: {
        "file/records": f"{{path: {out / 'records.jsonl'}, compression: zstd}}",
        "file/rotated": f"{{path: {out / 'rotated.jsonl'}, rotation: {{max_megabytes: 1}}}}"}, ("metrics",), send)
    rotated = files.rotated_files(out / "rotated.jsonl")
    assert len(rotated) >= 3 and all(p.name.endswith("-size.jsonl") for p in rotated[:-1]), rotated
    records = out / "records.jsonl"
    assert files.detect_compression(records.read_bytes()[:8]) == "records"
    expected = sorted(map(key, sent))
    for recording in (records, *rotated):
        assert detect_format(recording) == "otlp_json"
    assert sorted(key(p) for f in read_frames(records, "auto", start_unix_nano=0) for p in f.batch.points) == expected
    assert sorted(key(p) for r in rotated for f in read_frames(r, "auto", start_unix_nano=0)
                  for p in f.batch.points) == expected
    by_record = build_report(records)
    by_rotation = build_report(out / "rotated*")
    assert by_record.inputs[0].compression == "records+zstd"
    assert [s.path for s in by_rotation.inputs] == rotated  # in the order the Collector wrote them
    assert sum(s.lines for s in by_rotation.inputs) == by_record.inputs[0].lines == 120
    # The replay receiver, pointed at the live file, replays the whole rotated set in written order.
    got = _replay(out / "rotated.jsonl")
    assert sorted(map(key, got)) == expected
    assert [p.time_unix_nano for p in got] == sorted(p.time_unix_nano for p in got)
    assert sorted(map(key, _replay(out / "rotated.jsonl", rotated=False))) == sorted(
        key(p) for f in read_frames(rotated[-1], "auto", start_unix_nano=0) for p in f.batch.points)


def test_the_collectors_protobuf_files_with_and_without_compression(tmp_path):
    """The real Collector's file exporter, ``format: proto``: plain, ``compression: zstd`` (each
    record a zstd frame), and a logs pipeline into the same file (records of both signals with no
    marker). Recognized by their bytes whatever they are called (.binpb, no extension); replay
    reads the same points and events as were sent, and the report is the one of the JSON file the
    same Collector wrote beside them."""
    sent = []
    event = Event("ofu.job.end", T0 + 20 * 10 * S, attrs({"ofu.job.id": "job-0"}), (("ofu.job.end_reason", "idle"),),
                  "ended", "INFO")

    def send(port: int) -> None:
        for w in range(20):
            points = gpu_points(gpus=4, windows=1, t0=T0 + w * 10 * S)
            sent.extend(points)
            assert _post(port, otlp.to_request(points).SerializeToString())
        assert _post(port, otlp.events_to_request([event]).SerializeToString(), "logs")

    out = _collector_file_exporters(tmp_path, lambda out: {
        "file/proto": f"{{path: {out / 'metrics.binpb'}, format: proto}}",
        "file/zstd": f"{{path: {out / 'metrics'}, format: proto, compression: zstd}}",
        "file/json": f"{{path: {out / 'metrics.jsonl'}}}"}, ("metrics", "logs"), send)
    plain, zstd = out / "metrics.binpb", out / "metrics"
    assert files.detect_compression(plain.read_bytes()[:8]) == files.detect_compression(zstd.read_bytes()[:8]) \
        == "records"
    expected = sorted(map(key, sent))
    for recording in (plain, zstd):
        assert detect_format(recording) == "otlp_proto"
        frames = [f.batch for f in read_frames(recording, "auto", start_unix_nano=0)]
        assert sorted(key(p) for b in frames for p in b.points) == expected
        assert [e for b in frames for e in b.events] == [event]
        assert sorted(map(key, _replay(recording))) == expected  # the receiver in a pipeline
    reports = {path.name: _report_of(path) for path in (plain, zstd, out / "metrics.jsonl")}
    assert reports["metrics.binpb"] == reports["metrics"] == reports["metrics.jsonl"], reports
    assert build_report(zstd).inputs[0].compression == "records+zstd"
    # A directory of them: the report finds the protobuf files by their bytes, whatever their names.
    assert sorted(s.path.name for s in build_report(out).inputs) == ["metrics", "metrics.binpb", "metrics.jsonl"]


def _replay(path: Path, **config) -> list:
    got: list[Batch] = []
    receiver = ReplayReceiver(build_config(ReplayReceiverConfig, {"path": str(path), "speed": "max", **config}),
                              Context("replay"), got.append)
    receiver.poll()
    assert receiver.finished and receiver.error is None
    return [p for b in got for p in b.points]


def test_replay_of_a_rotated_set_whose_live_file_is_gone(tmp_path, caplog):
    """Backups alone are a recording (the live file was removed or not yet reopened); without
    them, or with rotated: false, the missing file is named."""
    live = tmp_path / "metrics.jsonl"
    lines = _lines()
    (tmp_path / "metrics-2026-11-30T12-00-00.000.jsonl").write_bytes(b"".join(lines[:2]))
    (tmp_path / "metrics-2026-11-30T12-05-00.000.jsonl").write_bytes(b"".join(lines[2:]))
    everything = sorted(key(p) for f in read_frames_of(b"".join(lines), tmp_path / "all.jsonl") for p in f)
    with caplog.at_level(logging.INFO):
        assert sorted(map(key, _replay(live))) == everything
    assert "has 2 rotated files" in caplog.text
    with pytest.raises(FieldError, match="does not exist$"):
        build_config(ReplayReceiverConfig, {"path": str(live), "rotated": False})
    with pytest.raises(FieldError, match="nor any rotated file"):
        build_config(ReplayReceiverConfig, {"path": str(tmp_path / "other.jsonl")})


def read_frames_of(data: bytes, path: Path) -> list[list]:
    path.write_bytes(data)
    return [f.batch.points for f in read_frames(path, "auto", start_unix_nano=0)]


def _post(port: int, body: bytes, signal: str = "metrics") -> bool:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/{signal}", data=body,
                                     headers={"Content-Type": "application/x-protobuf"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status == 200
    except OSError:
        return False
