"""Each benchmark runs in its tiny or dry configuration and prints the JSON it promises.

Why: the benchmarks are how the project's claims get rechecked; this keeps them runnable as
the code moves. No timing assertions: only that the keys exist and the values are sane.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def run_json(script: str, *args: str, timeout: float = 120) -> dict:
    proc = subprocess.run([sys.executable, str(BENCHMARKS / script), *args, "--json"], capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def test_accuracy_quick():
    out = run_json("accuracy.py", "--quick")
    for key in ("share_within_1pp", "share_within_2pp"):
        assert is_number(out[key]) and 0 <= out[key] <= 1
    assert out["share_within_1pp"] <= out["share_within_2pp"]
    for key in ("max_abs_err_pp", "clock_noise_point_pp", "clock_noise_averaged_pp"):
        assert is_number(out[key]) and out[key] >= 0
    assert out["cases"] > 0
    for kind in ("raw", "corrected", "shape_aware"):
        assert out[kind]["median"] <= out[kind]["p90"] <= out[kind]["p99"] <= out[kind]["max"]


def test_gemm_validation_dry_run():
    out = run_json("gemm_validation.py", "--dry-run")
    assert out["dry_run"] is True and out["ok"] is True
    assert out["config_ok"] is True
    assert set(out["fitted_factors"]) == set(out["known_factors"])
    for key, value in out["fitted_factors"].items():
        assert key.startswith("hopper/") and abs(value - out["known_factors"][key]) < 0.003


def test_gemm_validation_without_gpu_falls_back_to_dry_run():
    pytest.importorskip("pynvml")
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed: the script would try the GPU")
    except ImportError:
        pass
    out = run_json("gemm_validation.py")
    assert out["dry_run"] is True and out["ok"] is True and "torch" in out["reason"]


def test_sidecar_short():
    out = run_json("sidecar.py", "--seconds", "2", "--warmup", "2", timeout=60)
    for key in ("cpu_s_per_hour", "peak_rss_mb", "floor_cpu_s_per_hour", "floor_peak_rss_mb"):
        assert is_number(out[key]) and out[key] >= 0
    assert 1 < out["peak_rss_mb"] < 4096
    assert out["floor_peak_rss_mb"] > 1


def test_sidecar_without_the_loss_account():
    """--no-loss: the same daemon with the ofu processor's loss account off (what it costs)."""
    out = run_json("sidecar.py", "--seconds", "2", "--warmup", "2", "--no-loss", timeout=60)
    assert out["loss_account"] is False and is_number(out["cpu_s_per_hour"])
    assert run_json("sidecar.py", "--seconds", "1", "--warmup", "1", timeout=60)["loss_account"] is True


def test_throughput_tiny():
    out = run_json("throughput.py", "--gpus", "64", "--reps", "1")
    for key in ("ofu_points_per_s", "floor_points_per_s", "ratio"):
        assert is_number(out[key]) and out[key] > 0
    run = out["runs"][0]
    assert run["gpus"] == 64 and run["samples_joined"] == 64 and run["points_in"] > 64 * 20
    assert run["intervals"] == 2 and is_number(run["first_interval_s"]) and is_number(run["headroom_at_10s"])
    assert out["output_ok"], run["output_problems"]  # the encoded output holds every point produced


def test_throughput_measures_what_the_loss_account_costs():
    out = run_json("throughput.py", "--gpus", "64", "--reps", "1", "--intervals", "1", "--loss-cost")
    run = out["runs"][0]
    assert is_number(run["without_loss_points_per_s"]) and run["without_loss_points_per_s"] > 0
    assert is_number(run["loss_cost"]) and -1 < run["loss_cost"] < 1


def test_fleet_tiny(monkeypatch):
    from tests.e2e_util import collector_binary

    monkeypatch.setenv("OTELCOL", collector_binary())
    out = run_json("fleet.py", "--gpus", "160", "--windows", "1", timeout=300)
    assert out["complete"] and out["instances"] == [1, 2] and out["points"] > 0
    for key in ("ofu_points_per_s_per_core", "collector_passthrough_points_per_s_per_core", "ratio_to_collector",
                "scaling_1_to_2"):
        assert is_number(out[key]) and out[key] > 0
    assert set(out["points_per_s"]) == {"1", "2"}


def test_stage_tiny(monkeypatch):
    """The processing stage beside the Collector's pass-through, both protocols: every point arrived."""
    from tests.e2e_util import collector_binary

    monkeypatch.setenv("OTELCOL", collector_binary())
    out = run_json("stage.py", "--nodes", "10", "--per-request", "5", "--windows", "3", timeout=300)
    assert out["complete"] and out["gpus"] == 80 and out["windows"] == 3
    for key in ("ratio_to_collector", "first_window_ratio_to_collector", "gzip_ratio_to_collector",
                "gzip_first_window_ratio_to_collector"):
        assert is_number(out[key]) and out[key] > 0
    for protocol, run in out["runs"].items():
        assert run["points_in"] == 80 * 12 * 3
        assert run["points_out"]["collector"] == run["points_in"], protocol  # the pass-through, point for point
        # otel-ofu: the 10 metrics it does not read, and for each GPU and window its OFU and inputs.
        assert run["points_out"]["otel-ofu"] >= 80 * 10 * 3 + 80 * 3 * 3, protocol
        assert run["steady"]["windows"] == 2 and run["first_window"]["windows"] == 1


@pytest.mark.parametrize("extra", [(), ("--pod-labels",)])
def test_stage_memory_tiny(extra):
    out = run_json("stage.py", "--memory", "--nodes", "10", "--per-request", "5", "--windows", "2", *extra)
    assert out["gpus"] == 80 and out["cache_entries"] > 0
    assert out["held_bytes_per_gpu"] > out["after_release_bytes_per_gpu"]


def test_fleet_direct_tiny():
    """The Helm chart's default: the agents' requests straight into one jobs instance."""
    out = run_json("fleet.py", "--direct", "--gpus", "160", "--windows", "1", timeout=300)
    assert out["requests"] == 20 and out["points"] > 0
    assert is_number(out["jobs_instance_gpus_per_core_at_10s"]) and out["jobs_instance_gpus_per_core_at_10s"] > 0


def test_report_scale_tiny():
    """A 16-GPU fleet, 6 windows: the recording in JSON and protobuf, the decode, both reports."""
    out = run_json("report_scale.py", "--gpus", "16", "--windows", "6")
    assert out["gpu_windows"] == 16 * 6 and out["data_points"] > out["gpu_windows"]
    for key in ("upb_decode_cpu_s", "report_proto_cpu_s", "report_json_cpu_s", "ratio_proto", "ratio_json",
                "day_1000_gpus_proto_s", "day_1000_gpus_json_s", "day_1000_gpus_record_json_s"):
        assert is_number(out[key]) and out[key] > 0
    assert out["proto_bytes"] < out["json_bytes"]


def test_record_speed_tiny():
    out = run_json("record_speed.py", "--gpus", "16", "--windows", "3", "--warmup", "1")
    assert set(out["variants"]) == {"json_format", "json", "json_zstd", "proto", "proto_zstd"}
    for row in out["variants"].values():
        for key in ("exporter_cpu_s_per_window", "fleet_gpu_windows_per_cpu_s", "day_fleet_cpu_min",
                    "bytes_per_gpu_window"):
            assert is_number(row[key]) and row[key] > 0
    # The two JSON writers write the same bytes; protobuf fewer.
    variants = out["variants"]
    assert variants["json"]["bytes_per_gpu_window"] == variants["json_format"]["bytes_per_gpu_window"]
    assert variants["proto"]["bytes_per_gpu_window"] < variants["json"]["bytes_per_gpu_window"]


@pytest.mark.parametrize("extra", [(), ("--storage",)])
def test_jobs_processor_tiny(extra):
    out = run_json("jobs_processor.py", "--gpus", "32", "--windows", "4", *extra)
    assert out["gpus"] == 32 and out["storage"] is bool(extra)
    assert out["gpu_windows"] == 32 * 2 and is_number(out["us_per_gpu_window"]) and out["us_per_gpu_window"] > 0


def test_report_backend_tiny(monkeypatch):
    """A day of 64 GPUs' job series imported into a real VictoriaMetrics, reported from it: every job back."""
    from tests.e2e_util import victoriametrics_binary

    monkeypatch.setenv("VICTORIAMETRICS", victoriametrics_binary())
    out = run_json("report_backend.py", "--gpus", "64", "--days", "1", timeout=300)
    assert out["jobs"] > 0 and out["jobs_reported"] == out["jobs"] and out["samples"] > 0
    assert out["worst_job_gpu_hours_error"] < 0.01
    for key in ("report_wall_s", "report_cpu_s", "tsdb_cpu_s"):
        assert is_number(out[key]) and out[key] >= 0
