"""Property tests of every parser of outside input (Hypothesis), and the crashes fuzzing found.

The targets, generators and what must hold are in benchmarks/fuzz_targets.py, shared with the
long run (benchmarks/fuzz.py, 100,000 inputs per parser; BENCHMARKS.md). Here each parser gets
a few hundred structured (valid-then-mutated) inputs and raw bytes on every CI run, with no
deadline (the machine is shared; the long run measures time).

Each run draws a new seed (``OTEL_OFU_FUZZ_SEED`` repeats one), shown in pytest's header, so
every CI run tries inputs no earlier run tried. A failure names the seed and keeps the input
that broke the property in a file (its path is in the message).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from conftest import FUZZ_SEED  # noqa: E402 (drawn once per run; in pytest's header)
from fuzz_targets import LIVE, TARGETS  # noqa: E402

CI_SETTINGS = settings(max_examples=150, deadline=None, database=None,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FAILURES = Path(tempfile.gettempdir()) / "otel-ofu-fuzz" / f"tests-{FUZZ_SEED}"


def _check(target, data: bytes) -> None:
    """The property: every input is accepted or rejected with a clear error. On a failure the input
    is kept in a file and the message says how to repeat the run."""
    try:
        outcome = target.run(data)
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    if outcome not in ("accepted", "rejected"):
        FAILURES.mkdir(parents=True, exist_ok=True)
        kept = FAILURES / f"{target.name}-{hashlib.sha256(data).hexdigest()[:16]}.bin"
        kept.write_bytes(data)
        pytest.fail(f"{target.name}: {outcome[:2000]}\ninput kept in {kept} (run it: benchmarks/fuzz.py "
                    f"--parsers {target.name} --input {kept}); this run's seed: OTEL_OFU_FUZZ_SEED={FUZZ_SEED}")
FAST = [name for name in TARGETS if name not in ("otlp_http", "otlp_grpc")]


@pytest.fixture(scope="module")
def live_receiver():
    LIVE.start()
    yield LIVE
    LIVE.stop()


def _corpus(name: str) -> list[bytes]:
    return TARGETS[name].seeds()


def test_a_failing_input_is_kept_and_the_seed_named():
    from fuzz_targets import Target

    def crash(data: bytes) -> str:
        raise OSError(36, "File name too long")

    target = Target("broken", "always crashes", list, lambda rng, corpus: b"", crash)
    with pytest.raises(pytest.fail.Exception) as failed:
        _check(target, b"receivers: {}")
    message = str(failed.value)
    kept = Path(message.split("input kept in ")[1].split(" ")[0])
    assert kept.read_bytes() == b"receivers: {}" and "File name too long" in message
    assert f"OTEL_OFU_FUZZ_SEED={FUZZ_SEED}" in message and "--parsers broken --input" in message


@pytest.mark.parametrize("name", FAST)
def test_structured_inputs_never_crash(name):
    target = TARGETS[name]
    corpus = _corpus(name)
    for example in corpus:
        _check(target, example)

    @CI_SETTINGS
    @seed(FUZZ_SEED)
    @given(rng=st.randoms(use_true_random=False))
    def check(rng):
        _check(target, target.generate(rng, corpus))

    check()


@pytest.mark.parametrize("name", FAST)
def test_raw_bytes_never_crash(name):
    target = TARGETS[name]

    @CI_SETTINGS
    @seed(FUZZ_SEED)
    @given(data=st.binary(max_size=2048))
    def check(data):
        _check(target, data)

    check()


@pytest.mark.parametrize("name", ["otlp_http", "otlp_grpc"])
def test_a_live_receiver_answers_every_request_and_keeps_serving(name, live_receiver):
    """Real HTTP and gRPC requests: protobuf/JSON, gzip/deflate, truncated, oversized."""
    target = TARGETS[name]
    corpus = _corpus(name)

    @settings(CI_SETTINGS, max_examples=100)
    @seed(FUZZ_SEED)
    @given(rng=st.randoms(use_true_random=False))
    def check(rng):
        _check(target, target.generate(rng, corpus))

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


_TOO_LONG = "x" * 300  # one name longer than any Linux file system allows (255 bytes): ENAMETOOLONG


@pytest.mark.parametrize("section, component, body, key", [
    ("exporters", "file", {"path": f"/tmp/{_TOO_LONG}/out.jsonl"}, "path"),
    ("receivers", "replay", {"path": f"/tmp/{_TOO_LONG}"}, "path"),
    ("receivers", "replay", {"path": f"/tmp/{_TOO_LONG}/r.jsonl", "rotated": False}, "path"),
    ("exporters", "otlp", {"endpoint": "127.0.0.1:4317", "tls": {"ca_file": f"/{_TOO_LONG}"}}, "tls.ca_file"),
    ("exporters", "otlp", {"endpoint": "127.0.0.1:4317", "sending_queue": {"storage": f"/{_TOO_LONG}"}},
     "sending_queue.storage"),
    ("exporters", "otlphttp", {"endpoint": "http://127.0.0.1:4318", "bearer_token_file": _TOO_LONG},
     "bearer_token_file"),
    ("processors", "jobs", {"storage": f"~/{_TOO_LONG}"}, "storage"),
    ("receivers", "otlp", {"auth": {"bearer_token_file": _TOO_LONG}}, "auth.bearer_token_file"),
    ("receivers", "dcgm_exporter", {"endpoints": ["127.0.0.1:9400"], "bearer_token_file": _TOO_LONG},
     "bearer_token_file"),
    ("receivers", "dcgm_exporter", {"endpoints": ["127.0.0.1:9400"],
                                    "basic_auth": {"username": "u", "password_file": _TOO_LONG}},
     "basic_auth.password_file"),
    ("exporters", "prometheus", {"tls": {"cert_file": _TOO_LONG, "key_file": "k"}}, "tls.cert_file"),
])
def test_a_path_too_long_to_look_up_is_a_config_error(section, component, body, key):
    """Found by benchmarks/fuzz.py with another seed: validate died with OSError [Errno 36] File name
    too long from a stat() in a component's validate()."""
    from otel_ofu.pipeline import registry
    from otel_ofu.pipeline.config import ConfigError, parse_service_config

    doc = {section: {component: body},
           **({} if section == "receivers" else {"receivers": {"sim": {}}}),
           **({} if section == "exporters" else {"exporters": {"console": {}}}),
           "service": {"pipelines": {"metrics": {"receivers": [component if section == "receivers" else "sim"],
                                                 "exporters": [component if section == "exporters" else "console"]}}}}
    with pytest.raises(ConfigError) as error:
        parse_service_config(doc, "c.yaml", registry.factories())
    problems = [p for p in error.value.problems if p.component == f"{section}.{component}"]
    assert any(p.key == key and "File name too long" in p.message for p in problems), error.value.format()


def test_validate_of_a_path_too_long_says_so_without_a_traceback(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"receivers: {{sim: {{}}}}\nexporters: {{file: {{path: /tmp/{_TOO_LONG}/o.jsonl}}}}\n"
                    "service: {pipelines: {metrics: {receivers: [sim], processors: [], exporters: [file]}}}\n")
    done = _cli("validate", "--config", str(path))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "exporters.file: path:" in done.stderr and "File name too long" in done.stderr, done.stderr


def test_a_required_key_of_the_wrong_type_is_a_config_error():
    """Found by benchmarks/fuzz.py once validate() ran beside type errors: a required key whose value
    had the wrong type left no value to build the config with (TypeError from its __init__)."""
    from otel_ofu.pipeline.config import FieldError, build_config
    from otel_ofu.receivers.sim import SimReceiverConfig

    with pytest.raises(FieldError) as error:
        build_config(SimReceiverConfig, {"nodes": 0, "jobs": [{"scenario": ["steady"], "gpus": 1}]})
    assert {e.key for e in error.value.all} == {"jobs[0].scenario", "nodes"}, error.value.all
