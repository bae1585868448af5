"""End to end: the demo config runs, shuts down cleanly, and its file output is OTLP JSON."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp.files import RecordedFile, read_json_lines, read_lines

ROOT = Path(__file__).parent.parent


def run_demo(tmp_path, *extra, duration="4"):
    out = tmp_path / "demo.jsonl"
    env = {**os.environ, "OFU_DEMO_OUT": str(out)}
    proc = subprocess.run([sys.executable, "-m", "otel_ofu", "run", "--config", "collector-config/demo.yaml",
                           "--duration", duration, *extra], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    return proc, out


def read_points(path):
    points = []
    for number, line in read_json_lines(path):  # the demo writes zstd (collector-config/demo.yaml)
        doc = json.loads(line)  # every line is one JSON document
        assert set(doc) <= {"resourceMetrics", "resourceLogs"}, f"line {number}"
        request = otlp.from_json_line(line)
        if "resourceMetrics" in doc:
            points += list(otlp.from_request(request))
    return points


def test_demo_runs_and_writes_otlp_json(tmp_path):
    proc, out = run_demo(tmp_path)
    assert proc.returncode == 0, proc.stderr
    points = read_points(out)
    ofu = [p for p in points if p.name == "gpu.ofu"]
    gpus = {dict(p.resource)["hw.id"] for p in ofu}
    assert len(gpus) == 32
    assert {dict(p.resource)["host.name"] for p in ofu} == {f"sim-node-{n}" for n in range(4)}
    assert all(0 <= p.value <= 1.2 for p in ofu)
    names = {p.name for p in points}
    assert {"gpu.ofu", "gpu.ofu.raw", "gpu.ofu.loss", "gpu.tensor.activity", "gpu.sm.clock.frequency",
            "sim.gpu.mfu.true", "training.mfu"} <= names
    # every window's loss parts and OFU add up to 1
    loss = {}
    for p in points:
        if p.name == "gpu.ofu.loss":
            loss[(p.resource, p.time_unix_nano)] = loss.get((p.resource, p.time_unix_nano), 0.0) + p.value
    assert len(loss) == len(ofu)
    assert all(abs(loss[(p.resource, p.time_unix_nano)] + p.value - 1) < 1e-9 for p in ofu)
    jobs = {dict(p.resource)["ofu.job.id"] for p in ofu}
    assert {"llama-70b-pretrain", "moe-236b", "sft-debug-flag", "gpt-mixed-precision", "none"} <= jobs
    # Timestamps are simulated time: several windows of 10 s passed in a few wall seconds.
    times = sorted({p.time_unix_nano for p in ofu})
    assert len(times) >= 10 and times[1] - times[0] == 10_000_000_000
    # Piped output: the console exporter prints plain tables, no terminal escapes.
    assert "mean OFU" in proc.stdout and "\x1b[" not in proc.stdout


def test_sigterm_stops_cleanly_and_flushes(tmp_path):
    out = tmp_path / "demo.jsonl"
    env = {**os.environ, "OFU_DEMO_OUT": str(out)}
    proc = subprocess.Popen([sys.executable, "-m", "otel_ofu", "run", "--config", "collector-config/demo.yaml"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while (not out.exists() or out.stat().st_size == 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "received SIGTERM" in stderr and "shutting down" in stderr
    source = RecordedFile(out)
    lines = [text for _, text in read_lines(source)]
    assert lines and all(line.startswith("{") and line.endswith("}\n") for line in lines)
    assert not source.partial_tail  # no torn last frame or line
    read_points(out)


def test_run_without_config_points_to_the_demo():
    proc = subprocess.run([sys.executable, "-m", "otel_ofu", "run"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0
    assert "collector-config/demo.yaml" in proc.stderr


def test_invalid_config_exits_nonzero_before_running(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("receivers: {sim: {nodes: 0}}\nexporters: {console: {}}\n"
                   "service: {pipelines: {metrics: {receivers: [sim], exporters: [console]}}}\n")
    proc = subprocess.run([sys.executable, "-m", "otel_ofu", "run", "--config", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"{bad}: receivers.sim: nodes: must be at least 1" in proc.stderr
