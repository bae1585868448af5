"""The replay receiver: dmon, CSV and OTLP JSON recordings, pacing, looping, malformed files."""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

import pytest

from otel_ofu.core.model import Batch, Event, MetricPoint, attrs
from otel_ofu.exporters.file import FileExporter, FileExporterConfig
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.replay import (
    ReplayFormatError,
    ReplayReceiver,
    ReplayReceiverConfig,
    detect_format,
    parse_csv,
    parse_dmon,
    parse_otlp,
    read_frames,
)
from otel_ofu.receivers.sim import SimReceiverConfig, build_fleet, window_batch

DATA = Path(__file__).parent / "data" / "replay"
DMON = DATA / "h100-dmon.txt"
CSV = DATA / "a100.csv"
OTLP = DATA / "sim-ofu.jsonl"
T0 = 1_772_445_600_000_000_000  # 2026-03-02T10:00:00Z
S = 1_000_000_000


def lines(text: str) -> list[str]:
    return text.strip("\n").splitlines(keepends=True)


# --- dmon ------------------------------------------------------------------------------------

def test_dmon_recording_as_dcgmi_prints_it():
    frames = list(read_frames(DMON, "auto", start_unix_nano=T0, model="NVIDIA H100 80GB HBM3", host="n1"))
    assert len(frames) == 6
    # The recorded "-d 1000" spaces iterations 1 s apart from start_time.
    assert [f.time_unix_nano for f in frames] == [T0 + k * S for k in range(6)]
    assert [f.line for f in frames] == [4, 6, 8, 10, 12, 14]
    gpu0, gpu1 = frames[0].batch.samples
    assert (gpu0.gpu_index, gpu0.tensor_active, gpu0.sm_clock_mhz, gpu0.power_w, gpu0.sm_active) == (
        0, 0.912, 1755, 688.214, 0.981)
    assert (gpu1.gpu_index, gpu1.tensor_active, gpu1.sm_clock_mhz) == (1, 0.0, 1980)
    assert gpu0.window_s == 1.0 and gpu0.model == "NVIDIA H100 80GB HBM3" and gpu0.host == "n1"
    assert frames[3].batch.samples[0].tensor_active == "N/A"  # kept raw: values.clean says blank


def test_dmon_blanks_become_dropped_windows_and_the_rest_ofu():
    frames = list(read_frames(DMON, "dmon", start_unix_nano=T0, model="NVIDIA H100 80GB HBM3"))
    processor = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    paused = processor.process(frames[3].batch).points
    gpu0 = [p for p in paused if dict(p.resource)["gpu.index"] == "0"]
    assert not [p for p in gpu0 if p.name == "gpu.ofu"]
    assert [dict(p.attributes)["ofu.drop.reason"] for p in gpu0 if p.name == "gpu.ofu.dropped"] == ["blank"]
    first = processor.process(frames[0].batch).points
    (raw,) = [p for p in first if p.name == "gpu.ofu.raw" and dict(p.resource)["gpu.index"] == "0"]
    assert raw.value == pytest.approx(0.912 * 1755 / 1830)


def test_dmon_interval_sources_config_then_recorded_delay_then_dcgmi_default():
    body = "#Entity   TENSO        SMCLK\nID\nGPU 0     0.500        1500\nGPU 0     0.600        1500\n"
    assert [f.time_unix_nano for f in parse_dmon(lines(body), "x", start_unix_nano=0)] == [0, S]
    recorded = "# dcgmi dmon -e 1004,100 -d 500\n" + body
    assert [f.time_unix_nano for f in parse_dmon(lines(recorded), "x", start_unix_nano=0)] == [0, S // 2]
    assert [f.time_unix_nano for f in parse_dmon(lines(recorded), "x", start_unix_nano=0, interval_s=30)] == [
        0, 30 * S]


def test_dmon_older_layout_mig_rows_and_repeated_headers():
    # DCGM 2.x prints "# Entity" and "Id" right-aligned; MIG instances follow their GPU.
    body = """
# Entity  TENSO  SMCLK
      Id
   GPU 0  0.800   1410
 GPU-I 1  0.700   1410
 GPU-I 2    N/A   1410
# Entity  TENSO  SMCLK
      Id
   GPU 0  0.810   1410
 GPU-I 1  0.720   1410
 GPU-I 2  0.100   1410
"""
    frames = list(parse_dmon(lines(body), "x", start_unix_nano=0, model="NVIDIA A100-SXM4-80GB"))
    assert len(frames) == 2
    gpu, mig1, mig2 = frames[1].batch.samples
    assert (gpu.gpu_index, gpu.tensor_active) == (0, 0.81)
    assert mig1.gpu_index == 0 and mig1.resource == {"dcgm.entity": "GPU-I 1", "gpu.mig.instance_id": "1"}
    assert frames[0].batch.samples[2].tensor_active == "N/A"


def test_dmon_recorded_field_list_names_columns_by_id():
    body = "# dcgmi dmon -e 1004,100\n#Entity   XXXXX        YYYYY\nID\nGPU 3     0.250        1200\n"
    (frame,) = parse_dmon(lines(body), "x", start_unix_nano=0)
    assert (frame.batch.samples[0].tensor_active, frame.batch.samples[0].sm_clock_mhz) == (0.25, 1200)


@pytest.mark.parametrize(("body", "line", "words"), [
    ("#Entity   TENSO        SMCLK\nID\nGPU 0     0.500        1500\nGPU 1     0.500\n", 4, "1 values for 2 columns"),
    ("GPU 0     0.500        1500\n", 1, "before any '#Entity' header"),
    ("#Entity   TENSO\nID\nGPU 0     0.5\nError setting watches. Result: -29\n", 4, "dcgmi reported an error"),
    ("#Entity   TENSO\nID\nGPU 0     0.5\n\n\nsome junk\n", 6, "unrecognised line"),
    ("#Entity   TENSO\nID\nGPU x     0.5\n", 3, "such as 'GPU 0'"),
    ("# dcgmi dmon -e 1004,100\n#Entity   TENSO\n", 2, "recorded -e list has 2 field ids"),
])
def test_malformed_dmon_names_file_and_line(body, line, words):
    with pytest.raises(ReplayFormatError) as info:
        list(parse_dmon(lines(body), "trace.dmon", start_unix_nano=0))
    assert info.value.line == line and words in info.value.message
    assert str(info.value).startswith(f"trace.dmon:{line}: ")


# --- CSV -------------------------------------------------------------------------------------------

def test_csv_rows_group_by_timestamp_with_labels_and_fields():
    frames = list(read_frames(CSV, "auto", start_unix_nano=0))
    assert [f.time_unix_nano for f in frames] == [T0, T0 + 10 * S, T0 + 20 * S]
    assert [f.line for f in frames] == [2, 4, 6]
    gpu0, gpu1 = frames[0].batch.samples
    assert (gpu0.tensor_active, gpu0.sm_clock_mhz, gpu0.power_w, gpu0.sm_active) == (0.929, 1215, 377.512, 0.981)
    assert gpu0.model == "NVIDIA A100-SXM4-80GB" and gpu0.host == "dgx-a100-07"
    assert gpu0.uuid == "GPU-a100aaaa-0000-1111-2222-333344445555"
    assert gpu0.resource == {"k8s.pod.name": "vit-huge-2", "k8s.namespace.name": "vision"}
    assert gpu1.resource == {}  # empty cells are no labels
    assert [s.window_s for f in frames for s in f.batch.samples] == [10.0] * 6  # first rows take the spacing
    assert frames[1].batch.samples[1].tensor_active == "N/A"


def test_csv_unix_timestamps_window_column_and_defaults():
    body = "timestamp,gpu,DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,100,window_s\n1772445600.5,0,0.5,1500,30\n"
    (frame,) = parse_csv(lines(body), "x", model="NVIDIA B200", host="h9")
    (sample,) = frame.batch.samples
    assert frame.time_unix_nano == T0 + S // 2 and sample.window_s == 30.0
    assert (sample.model, sample.host, sample.tensor_active, sample.sm_clock_mhz) == ("NVIDIA B200", "h9", 0.5, 1500)


@pytest.mark.parametrize("clock_column", ["DCGM_FI_DEV_SM_CLOCK_HERTZ", "1603"])
def test_csv_reads_the_base_unit_sm_clock_by_name_and_by_id(clock_column):
    """DCGM 4.6.1's SM clock in Hz (field 1603) is the clock in MHz the OFU needs: 1.83e9 Hz = 1830 MHz."""
    body = f"timestamp,gpu,1004,{clock_column},DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ\n1772445600,0,0.5,1.83e9,1965000000\n"
    (frame,) = parse_csv(lines(body), "x", model="NVIDIA H100 80GB HBM3", host="h1")
    (sample,) = frame.batch.samples
    assert (sample.sm_clock_mhz, sample.max_sm_clock_mhz) == (1830.0, 1965.0)
    (ofu,) = [p for p in OfuProcessor(OfuProcessorConfig(), Context("ofu")).process(frame.batch).points
              if p.name == "gpu.ofu.raw"]
    assert ofu.value == pytest.approx(0.5 * 1830 / 1830)  # TPA x f_SM / f_ref (H100 SXM: 1830 MHz)


def test_csv_with_both_clock_fields_uses_the_base_unit_one_never_both():
    body = "timestamp,gpu,1004,100,1603\n1772445600,0,0.5,1755,1740000000\n"
    (frame,) = parse_csv(lines(body), "x", model="NVIDIA H100 80GB HBM3")
    (sample,) = frame.batch.samples
    assert (sample.sm_clock_mhz, sample.sm_clock_samples) == (1740.0, 1)


def test_csv_base_unit_blank_stays_a_blank_not_a_tiny_clock():
    blank = "9223372036854775794"  # DCGM_INT64_BLANK + 2 (not supported), in a Hz column
    body = f"timestamp,gpu,1004,1603\n1772445600,0,0.5,{blank}\n"
    (frame,) = parse_csv(lines(body), "x", model="NVIDIA H100 80GB HBM3")
    (dropped,) = [p for p in OfuProcessor(OfuProcessorConfig(), Context("ofu")).process(frame.batch).points
                  if p.name == "gpu.ofu.dropped"]
    assert dict(dropped.attributes)["ofu.drop.reason"] == "not_supported"


@pytest.mark.parametrize(("body", "line", "words"), [
    ("time,gpu,1004\n2026-03-02T10:00:00Z,0,0.5\n", 1, "lacks 'timestamp'"),
    ("timestamp,gpu,1004,1004\n", 1, "repeats '1004'"),
    ("timestamp,gpu,1004\n2026-03-02T10:00:00Z,0,0.5\n2026-03-02T10:00:01Z,0\n", 3, "2 cells for 3 columns"),
    ("timestamp,gpu,1004\n\n2026-03-02T10:00:00Z,0,0.5\nyesterday,0,0.5\n", 4, "bad timestamp 'yesterday'"),
    ("timestamp,gpu,1004\n2026-03-02T10:00:00Z,,0.5\n", 2, "gpu cell is empty"),
    ("", 1, "empty"),
])
def test_malformed_csv_names_file_and_line(body, line, words):
    with pytest.raises(ReplayFormatError) as info:
        list(parse_csv(lines(body) if body else [], "trace.csv"))
    assert info.value.line == line and words in info.value.message


# --- OTLP JSON ------------------------------------------------------------------------------------

def record_sim_pipeline(path: Path) -> list[MetricPoint]:
    """Run the sim receiver's fleet through the ofu processor into the file exporter; the points."""
    cfg = build_config(SimReceiverConfig, {"nodes": 1, "gpus_per_node": 2, "seed": 3, "collection_interval": "10s",
                                           "start_time": "2026-03-02T10:00:00+00:00"})
    fleet = build_fleet(cfg, datetime.fromisoformat(cfg.start_time).timestamp())
    processor = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    exporter = FileExporter(FileExporterConfig(path=str(path)), Context("file"))
    exporter.start()
    sent: list[MetricPoint] = []
    for _ in range(4):
        batch = processor.process(window_batch(fleet.step_window(), True))
        exporter.export(batch)
        sent += batch.points
    event = Event("ofu.job.end", T0, attrs({"ofu.job.id": "llama"}), attrs({"reason": "done"}), "job ended")
    exporter.export(Batch(events=[event]))
    exporter.shutdown()
    return sent


def _key(p: MetricPoint):
    return (p.name, p.time_unix_nano, p.resource, p.attributes, p.monotonic, p.start_time_unix_nano)


def test_file_exporter_output_replays_to_the_same_points(tmp_path):
    recording = tmp_path / "out.jsonl"
    sent = record_sim_pipeline(recording)
    assert detect_format(recording) == "otlp_json"
    got: list[Batch] = []
    receiver = ReplayReceiver(build_config(ReplayReceiverConfig, {"path": str(recording), "speed": "max"}),
                              Context("replay"), got.append)
    receiver.poll()
    replayed = [p for b in got for p in b.points]
    assert sorted(map(_key, replayed)) == sorted(map(_key, sent))
    values = {_key(p): p.value for p in sent}
    assert all(p.value == pytest.approx(values[_key(p)]) for p in replayed)
    assert any(p.name == "gpu.ofu" for p in replayed)
    (event,) = [e for b in got for e in b.events]
    assert (event.name, event.body, dict(event.attributes)) == ("ofu.job.end", "job ended", {"reason": "done"})
    assert receiver.finished and receiver.frames_emitted == 5


def test_committed_otlp_sample_parses():
    frames = list(parse_otlp(OTLP.read_text().splitlines(), str(OTLP)))
    assert len(frames) == 3 and all(f.batch.points for f in frames)
    assert frames[1].time_unix_nano - frames[0].time_unix_nano == 10 * S


@pytest.mark.parametrize(("body", "line", "words"), [
    ('{"resourceMetrics":[]}\n{"resourceMetrics":[\n', 2, "not JSON"),
    ('\n{"hello": 1}\n', 2, "no resourceMetrics or resourceLogs"),
    ('{"resourceMetrics":[{"resource":{"attributes":7}}]}\n', 1, "not an OTLP JSON request"),
])
def test_malformed_otlp_names_the_line(body, line, words):
    with pytest.raises(ReplayFormatError) as info:
        list(parse_otlp(body.splitlines(keepends=True), "out.jsonl"))
    assert info.value.line == line and words in info.value.message


# --- format detection ----------------------------------------------------------------------------

def test_formats_are_detected_from_content(tmp_path):
    assert (detect_format(DMON), detect_format(CSV), detect_format(OTLP)) == ("dmon", "csv", "otlp_json")
    plain = tmp_path / "trace.txt"
    plain.write_text("GPU 0     0.912        1755\n")
    assert detect_format(plain) == "dmon"
    unknown = tmp_path / "notes.txt"
    unknown.write_text("\nhello world\n")
    with pytest.raises(ReplayFormatError) as info:
        detect_format(unknown)
    assert info.value.line == 2 and "set format" in info.value.message


# --- the receiver: pacing, looping, refusing ----------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(**config) -> tuple[ReplayReceiver, list[Batch], FakeClock]:
    got: list[Batch] = []
    receiver = ReplayReceiver(build_config(ReplayReceiverConfig, config), Context("replay", Telemetry()), got.append)
    clock = FakeClock()
    receiver.clock = clock
    receiver.wall_ns = lambda: 5 * T0 // 4
    return receiver, got, clock


def times(batches: list[Batch]) -> list[int]:
    return [b.samples[0].time_unix_nano for b in batches]


def test_accelerated_replay_paces_by_recorded_time_and_keeps_timestamps():
    receiver, got, clock = make(path=str(CSV), speed=60)  # rows 10 s apart: one every 1/6 s
    receiver.poll()
    assert times(got) == [T0]
    clock.now += 0.1
    receiver.poll()
    assert times(got) == [T0]
    assert 0.005 <= receiver.interval() <= 0.1  # sleeps until the next row is due
    clock.now += 0.1
    receiver.poll()
    assert times(got) == [T0, T0 + 10 * S]
    clock.now += 10
    receiver.poll()
    assert times(got) == [T0, T0 + 10 * S, T0 + 20 * S] and receiver.finished


def test_max_speed_sends_everything_in_one_poll():
    receiver, got, _ = make(path=str(DMON), speed="max", model="NVIDIA H100 80GB HBM3",
                            start_time="2026-03-02T10:00:00Z")
    receiver.poll()
    assert times(got) == [T0 + k * S for k in range(6)] and receiver.finished


def test_loop_continues_forward_in_time_and_rebase_shifts_to_now():
    receiver, got, _ = make(path=str(CSV), speed=0, loop=True)
    receiver.poll()
    receiver.poll()
    # Pass 2 follows pass 1 by its 20 s span plus one 10 s step: timestamps never repeat.
    assert times(got) == [T0, T0 + 10 * S, T0 + 20 * S, T0 + 30 * S, T0 + 40 * S, T0 + 50 * S]
    assert not receiver.finished and receiver.passes == 2

    rebased, got2, _ = make(path=str(CSV), speed=0, rebase_time=True)
    rebased.poll()
    assert times(got2) == [5 * T0 // 4 + k * 10 * S for k in range(3)]


def test_a_malformed_file_is_refused_with_its_line_before_anything_is_sent(tmp_path, caplog):
    bad = tmp_path / "trace.csv"
    bad.write_text(CSV.read_text() + "2026-03-02T10:00:30Z,0,oops\n")
    receiver, got, _ = make(path=str(bad), speed=0)
    with caplog.at_level(logging.ERROR, logger="otel_ofu.replay"):
        receiver.poll()
    assert got == [] and receiver.finished
    assert receiver.error is not None and receiver.error.line == 8
    assert f"{bad}:8: 3 cells for 11 columns" in caplog.text
    assert receiver.context.telemetry.counter("otel_ofu.replay.errors", file=str(bad)) == 1


def test_skip_malformed_sends_the_good_lines_and_counts_the_bad(tmp_path):
    bad = tmp_path / "trace.dmon"
    bad.write_text(DMON.read_text().replace("GPU 1     0.000        1980         71.207            0.000\n",
                                            "GPU 1     0.000\n", 1))
    receiver, got, _ = make(path=str(bad), speed=0, skip_malformed=True, model="NVIDIA H100 80GB HBM3")
    receiver.poll()
    assert len(got) == 6 and len(got[0].samples) == 1 and len(got[1].samples) == 2
    assert receiver.context.telemetry.counter("otel_ofu.replay.errors", file=str(bad)) == 1


@pytest.mark.parametrize(("config", "key"), [
    ({}, "path"),
    ({"path": "/nonexistent/trace.dmon"}, "path"),
    ({"path": str(DMON), "speed": -1}, "speed"),
    ({"path": str(DMON), "speed": "fast"}, "speed"),
    ({"path": str(DMON), "format": "parquet"}, "format"),
    ({"path": str(DMON), "interval": "0s"}, "interval"),
    ({"path": str(DMON), "start_time": "noon"}, "start_time"),
])
def test_config_errors_name_the_key(config, key):
    with pytest.raises(FieldError) as info:
        build_config(ReplayReceiverConfig, config)
    assert info.value.key == key


def test_dmon_reads_the_ledger_counters_by_their_short_names():
    """dcgmi dmon -e 1004,100,156,1009,1010,1011,1012,1420,1423: the columns dcgm_fields.cpp names TOTEC,
    PCITX, PCIRX, NVLTX, NVLRX, CLKPCNS, CLKHWTHNS (NVIDIA/DCGM v4.6.0 dcgmlib/src/dcgm_fields.cpp); a blank is N/A."""
    body = ("#Entity   TENSO        SMCLK        TOTEC            PCITX  PCIRX  NVLTX        NVLRX        "
            "CLKPCNS      CLKHWTHNS\nID\n"
            "GPU 0     0.500        1500         51234567890      1000   2000   3000000000   3100000000   "
            "7000000000   N/A\n")
    (frame,) = parse_dmon(lines(body), "x", start_unix_nano=0)
    (sample,) = frame.batch.samples
    assert sample.energy_mj == 51234567890
    assert (sample.pcie_tx_bytes_per_s, sample.pcie_rx_bytes_per_s) == (1000, 2000)
    assert (sample.nvlink_tx_bytes_per_s, sample.nvlink_rx_bytes_per_s) == (3000000000, 3100000000)
    assert sample.clock_event_ns == {"sw_power_cap": 7000000000, "hw_thermal": "N/A"}  # raw: N/A is no value


def test_csv_reads_the_ledger_counters_by_name_and_id_and_energy_in_joules_as_millijoules():
    body = ("timestamp,gpu,1004,100,DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL,DCGM_FI_PROF_PCIE_RX_BYTES,1424,"
            "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST_NS\n1772445600,0,0.5,1500,51234.5,4096,,12\n")
    (frame,) = parse_csv(lines(body), "x", model="NVIDIA H100 80GB HBM3")
    (sample,) = frame.batch.samples
    assert sample.energy_mj == pytest.approx(51234500.0) and sample.pcie_rx_bytes_per_s == 4096
    assert sample.clock_event_ns["sync_boost"] == 12
