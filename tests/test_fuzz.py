"""Property tests of every parser of outside input (Hypothesis), and the crashes fuzzing found.

The targets, generators and what must hold are in benchmarks/fuzz_targets.py, shared with the
long run (benchmarks/fuzz.py, 100,000 inputs per parser; BENCHMARKS.md). Here each parser gets
a few hundred structured (valid-then-mutated) inputs and raw bytes on every CI run,
deterministically (``derandomize``), with no deadline (the machine is shared; the long run
measures time). A failure prints the input that broke the property.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from fuzz_targets import LIVE, TARGETS  # noqa: E402

CI_SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FAST = [name for name in TARGETS if name not in ("otlp_http", "otlp_grpc")]


@pytest.fixture(scope="module")
def live_receiver():
    LIVE.start()
    yield LIVE
    LIVE.stop()


def _corpus(name: str) -> list[bytes]:
    return TARGETS[name].seeds()


@pytest.mark.parametrize("name", FAST)
def test_structured_inputs_never_crash(name):
    target = TARGETS[name]
    corpus = _corpus(name)
    for seed in corpus:
        assert target.run(seed) in ("accepted", "rejected")

    @CI_SETTINGS
    @given(rng=st.randoms(use_true_random=False))
    def check(rng):
        assert target.run(target.generate(rng, corpus)) in ("accepted", "rejected")

    check()


@pytest.mark.parametrize("name", FAST)
def test_raw_bytes_never_crash(name):
    target = TARGETS[name]

    @CI_SETTINGS
    @given(data=st.binary(max_size=2048))
    def check(data):
        assert target.run(data) in ("accepted", "rejected")

    check()


@pytest.mark.parametrize("name", ["otlp_http", "otlp_grpc"])
def test_a_live_receiver_answers_every_request_and_keeps_serving(name, live_receiver):
    """Real HTTP and gRPC requests: protobuf/JSON, gzip/deflate, truncated, oversized."""
    target = TARGETS[name]
    corpus = _corpus(name)

    @settings(CI_SETTINGS, max_examples=100)
    @given(rng=st.randoms(use_true_random=False))
    def check(rng):
        assert target.run(target.generate(rng, corpus)) in ("accepted", "rejected")

    check()
    assert target.run(corpus[0]) == "accepted"  # still serving


def test_the_long_run_script_runs_and_reports_each_parser():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fuzz.py"), "--inputs", "40",
                           "--parsers", "dmon,csv,proc_slurm", "--json"], capture_output=True, text=True, timeout=300)
    import json

    result = json.loads(done.stdout)
    for name in ("dmon", "csv", "proc_slurm"):
        row = result["parsers"][name]
        assert row["inputs"] == 40 and {"crashes", "hangs", "max_ms", "max_rss_mb"} <= set(row)
        assert row["crashes"] == 0 and row["hangs"] == 0, row


# --- crashes and hangs the fuzzer found, as regression tests ---------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_ofu", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_a_config_that_is_not_utf8_is_a_config_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"receivers:\n  sim: {}\n  \xe3\x28: 1\n")
    done = _cli("validate", "--config", str(path))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"{path}: line 3: not UTF-8 text" in done.stderr + done.stdout


@pytest.mark.parametrize("text, message", [
    ("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
     + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10))
     + "receivers: {sim: {jobs: *a9}}\n", "values through YAML aliases"),
    ("a: &a [1, *a]\nreceivers: {}\n", "refers to a node that contains it"),
])
def test_yaml_alias_bombs_are_refused_not_walked(tmp_path, text, message):
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    done = _cli("validate", "--config", str(path))  # before: hung (billions of values) or RecursionError
    assert done.returncode != 0 and message in done.stderr + done.stdout, done.stderr


def test_a_huge_sim_fleet_is_refused_at_validation():
    from otel_ofu.pipeline.config import FieldError, build_config
    from otel_ofu.receivers.sim import SimReceiverConfig

    with pytest.raises(FieldError, match="nodes: must be at most 100000"):
        build_config(SimReceiverConfig, {"nodes": 140737488355328})  # before: validation never returned


def test_a_csv_window_that_is_not_a_duration_is_a_located_error(tmp_path):
    from otel_ofu.core.model import Batch
    from otel_ofu.pipeline.component import Context
    from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
    from otel_ofu.receivers.replay import ReplayFormatError, read_frames

    path = tmp_path / "r.csv"
    path.write_text("timestamp,gpu,window_s,1004,100\n2026-01-01T00:00:00Z,0,nan,,1755\n"
                    "2026-01-01T00:00:10Z,0,inf,,1755\n2026-01-01T00:00:20Z,0,10,,1755\n")
    skipped: list[ReplayFormatError] = []
    frames = list(read_frames(path, "csv", start_unix_nano=0, on_error=skipped.append))
    assert [e.line for e in skipped] == [2, 3] and all("bad window_s" in str(e) for e in skipped)
    processor = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    for frame in frames:  # before: "cannot convert float NaN to integer" in the ofu processor
        processor.process(Batch(samples=frame.batch.samples))


def test_a_csv_timestamp_out_of_range_is_a_located_error(tmp_path):
    from otel_ofu.receivers.replay import ReplayFormatError, read_frames

    path = tmp_path / "r.csv"
    path.write_text("timestamp,gpu,1004,100\n2026-01-01T00:00:00Z,0,0.5,1755\ninf,0,0.5,1755\n1e300,0,0.5,1755\n")
    skipped: list[ReplayFormatError] = []
    frames = list(read_frames(path, "csv", start_unix_nano=0, on_error=skipped.append))
    assert len(frames) == 1  # before: OverflowError out of the receiver
    assert [e.line for e in skipped] == [3, 4] and all("bad timestamp" in str(e) for e in skipped)


def test_report_on_a_file_that_is_not_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"resourceMetrics":[]}\n\xbb\xbb\n')
    done = _cli("report", str(path))
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert f"{path}:" in done.stderr and "not UTF-8" in done.stderr


def test_report_on_attributes_of_the_wrong_type_is_a_report_error(tmp_path):
    from otel_ofu.report.build import ReportError, build_report

    path = tmp_path / "r.jsonl"
    path.write_text('{"resourceMetrics":[{"resource":{"attributes":[{"key":["x"],"value":{"stringValue":"a"}}]},'
                    '"scopeMetrics":[{"metrics":[{"name":"gpu.ofu","gauge":{"dataPoints":[{"timeUnixNano":"1",'
                    '"asDouble":0.5}]}}]}]}]}\n')
    with pytest.raises(ReportError, match=r"r.jsonl:1: malformed OTLP metrics"):
        build_report(path)  # before: TypeError (unhashable list) from the jobs tracker


def test_report_on_points_centuries_apart_finishes(tmp_path):
    path = tmp_path / "r.jsonl"
    lines = []
    for t in (1_767_225_600_000_000_000, 6_328_813_553_988_640_070):
        lines.append('{"resourceMetrics":[{"resource":{"attributes":[{"key":"hw.id","value":{"stringValue":"G"}}]},'
                     '"scopeMetrics":[{"metrics":[{"name":"gpu.ofu","gauge":{"dataPoints":[{"timeUnixNano":"%d",'
                     '"asDouble":0.5,"attributes":[{"key":"ofu.job.id","value":{"stringValue":"j"}}]}]}}]}]}]}'
                     .replace("%d", str(t)))
    path.write_text("\n".join(lines) + "\n")
    try:  # in a process of its own, so a hang is killed rather than left spinning
        subprocess.run([sys.executable, "-m", "otel_ofu", "report", str(path)], cwd=ROOT, capture_output=True,
                       timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the report did not finish in 30 s on two points")


@pytest.mark.parametrize("fmt, text", [
    ("dmon", "#Entity   TENSO   SMCLK\nID\nGPU \u2469   0.5   1755\nGPU 0   0.5   1755\n"),
    ("csv", "timestamp,gpu,1004,100\n2026-01-01T00:00:00Z,10\u2077,0.5,1755\n2026-01-01T00:00:00Z,1,0.5,1755\n"),
])
def test_unicode_digits_in_a_gpu_index_are_a_located_error_not_a_crash(tmp_path, fmt, text):
    """'\u2469'.isdigit() is True but int() refuses it: the parsers now ask isdecimal()."""
    from otel_ofu.receivers.replay import ReplayFormatError, read_frames

    path = tmp_path / f"r.{fmt}"
    path.write_text(text)
    skipped: list[ReplayFormatError] = []
    frames = list(read_frames(path, fmt, start_unix_nano=0, on_error=skipped.append))  # before: ValueError
    assert frames and all(str(path) in str(e) for e in skipped)


def test_a_repeated_attribute_key_with_values_of_two_types_keeps_the_last():
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    from otel_ofu.otlp import codec

    pairs = [KeyValue(key="k", value=AnyValue(string_value="a")), KeyValue(key="k", value=AnyValue()),
             KeyValue(key="a", value=AnyValue(int_value=1))]
    assert codec.attributes_of(pairs) == (("a", 1), ("k", None))  # before: TypeError comparing str and None


@pytest.mark.parametrize("time_field", ['"timeUnixNano":"99999999999999999999999"', '"asDouble":0.5'])
def test_report_on_a_point_without_a_usable_time_names_the_line(tmp_path, time_field):
    from otel_ofu.report.build import ReportError, build_report

    point = '{' + time_field + (',"asDouble":0.5' if "time" in time_field else '') + '}'
    path = tmp_path / "r.jsonl"
    path.write_text('{"resourceMetrics":[{"resource":{"attributes":[]},"scopeMetrics":[{"metrics":[{"name":'
                    '"gpu.ofu","gauge":{"dataPoints":[' + point + ']}}]}]}]}\n')
    with pytest.raises(ReportError, match=r"r.jsonl:1: .*out of range"):  # before: OverflowError, or a hang
        build_report(path)


def test_report_on_a_point_stamped_1970_finishes(tmp_path):
    path = tmp_path / "r.jsonl"
    line = ('{"resourceMetrics":[{"resource":{"attributes":[{"key":"hw.id","value":{"stringValue":"G"}}]},'
            '"scopeMetrics":[{"metrics":[{"name":"gpu.ofu","gauge":{"dataPoints":[{"timeUnixNano":"T",'
            '"asDouble":0.5,"attributes":[{"key":"ofu.job.id","value":{"stringValue":"j"}}]}]}}]}]}]}')
    times = ("1772445610000000000", "1", "1772445620000000000")
    path.write_text("".join(line.replace('"T"', f'"{t}"') + "\n" for t in times))
    try:  # in a process of its own, so a hang is killed rather than left spinning
        subprocess.run([sys.executable, "-m", "otel_ofu", "report", str(path)], cwd=ROOT, capture_output=True,
                       timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the report did not finish in 30 s on three points")


def test_report_on_a_huge_ofu_value_does_not_overflow_the_histogram(tmp_path):
    from otel_ofu.report.build import build_report

    path = tmp_path / "r.jsonl"
    line = ('{"resourceMetrics":[{"resource":{"attributes":[{"key":"hw.id","value":{"stringValue":"G"}}]},'
            '"scopeMetrics":[{"metrics":[{"name":"gpu.ofu","gauge":{"dataPoints":[{"timeUnixNano":"T",'
            '"asDouble":1e308,"attributes":[{"key":"ofu.job.id","value":{"stringValue":"j"}}]}]}}]}]}]}')
    path.write_text("".join(line.replace('"T"', f'"{t}"') + "\n" for t in ("1772445610000000000",
                                                                            "1772445620000000000")))
    build_report(path)  # before: OverflowError (cannot convert float infinity to integer) in the histogram
