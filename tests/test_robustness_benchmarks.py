"""The robustness benchmarks in small configurations: they run, and what they check holds.

benchmarks/outage.py with a short outage and a kill -9 in it (a real otel-ofu process, a disk
queue, an independent sink), benchmarks/overload.py with the real Collector at 10x capacity
for a few seconds, benchmarks/file_size.py on a few windows. Behaviour only (nothing lost,
nothing duplicated, the queue within its bound); the figures are in BENCHMARKS.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from e2e_util import collector_binary

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def run_json(script: str, *args: str, env: dict | None = None, timeout: float = 600) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, str(BENCHMARKS / script), *args, "--json"], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    try:
        start = proc.stdout.index("{")
        return proc.returncode, json.loads(proc.stdout[start:])
    except ValueError:
        raise AssertionError(f"{script} printed no JSON: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}") from None


def test_file_size_after_is_smaller_than_before():
    code, out = run_json("file_size.py", "--windows", "12")
    assert code == 0
    variants = out["variants"]
    sim = yaml.safe_load((ROOT / "collector-config" / "demo.yaml").read_text())["receivers"]["sim"]
    assert out["gpu_windows"] == sim["nodes"] * sim["gpus_per_node"] * 12
    assert variants["after"]["bytes"] < variants["before"]["bytes"]
    assert max(variants["zstd"]["bytes"], variants["gzip"]["bytes"]) < variants["after"]["bytes"]


def test_outage_with_kill_9_loses_and_duplicates_nothing():
    code, out = run_json("outage.py", "--outage-s", "12", "--before-s", "4", "--after-s", "3", "--queue-mib", "64")
    assert out["lost"] == 0 and out["duplicates"] == 0, out
    assert out["queue_within_bound"] and out["first_exit"] == -9 and out["second_exit"] == 0, out
    assert out["produced_points"] > 0 and out["delivered_points"] == out["produced_points"] - out["dropped_counted"]
    assert code == 0


def test_overload_through_the_real_collector_loses_nothing():
    otelcol = collector_binary()
    code, out = run_json("overload.py", "--capacity-s", "3", "--overload-s", "6", "--normal-s", "3",
                         "--drain-s", "240", "--max-concurrent", "2", env={"OTELCOL": otelcol})
    assert out["lost"] == 0 and out["duplicates"] == 0, out
    assert out["delivered"] + out["collector_dropped_requests"] >= out["collector_accepted"] > 0, out
    assert out["peak_rss_mb"] > 0 and out["limit_mb"] == 512
    assert code == 0
