"""benchmarks/device_report.py on synthetic run folders: the BENCHMARKS.md tables and the tile verdict.

Why: after the one hardware run, this report decides whether otel_ofu/tiles.py changes. Its
inputs here are made by the GPU code paths' own functions (gemm_validation.result_document,
gpu_check.window_rows / summarize) from numbers whose answer is known.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from otel_ofu.core import specs
from otel_ofu.core.model import GpuSample

ROOT = Path(__file__).resolve().parent.parent
H200 = "NVIDIA H200"


@pytest.fixture(scope="module")
def bench():
    """The benchmark scripts as modules (they live outside the package)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        yield {name: importlib.import_module(name) for name in ("gemm_validation", "gpu_check", "device_report")}
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def gemm_rows(bench, precision: str, factor: float, wobble: float) -> list:
    """Four shapes of one precision whose MFU is ``factor`` x raw OFU, +- ``wobble`` (alternating)."""
    gv = bench["gemm_validation"]
    rows = []
    for i, (shape, ragged) in enumerate([(gv.ALIGNED[0], False), (gv.ALIGNED[1], False), (gv.RAGGED[0], True),
                                         (gv.RAGGED[1], True)]):
        raw = 0.70 + 0.04 * i
        mfu = raw * (factor + (wobble if i % 2 else -wobble))
        rows.append(gv.Row("nvml-receiver", precision, shape, ragged, mfu, raw, raw * 0.973, 5))
        rows.append(gv.Row("gpm", precision, shape, ragged, mfu, raw, raw * 0.973, 5, raw_point=raw + 0.001 * i))
    return rows


def write_run(folder: Path, *, gemm: dict | None = None, check: dict | None = None, gpu: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    steps = [{"name": n, "status": "ok" if gpu else "no-gpu", "message": "no GPU (torch is not installed)",
              "seconds": 1.0} for n in ("doctor", "gpu_check", "gemm_validation")]
    (folder / "device_run.json").write_text(json.dumps({"gpu": gpu, "gpu_reason": "" if gpu else "torch is not "
                                                        "installed", "gpu_name": H200 if gpu else None,
                                                        "started_utc": "2026-12-01T10:00:00Z", "steps": steps}))
    if gemm is not None:
        (folder / "gemm_validation.json").write_text(json.dumps(gemm))
    if check is not None:
        (folder / "gpu_check.json").write_text(json.dumps(check))
    return folder


def test_factors_outside_the_fit_interval_differ_inside_agree_and_one_shape_cannot_tell(bench, tmp_path):
    gv = bench["gemm_validation"]
    rows = (gemm_rows(bench, "bf16", 0.950, 0.002)  # well below the table's 0.973
            + gemm_rows(bench, "fp16", 0.973, 0.004)  # the table's value, within noise
            + [gv.Row("nvml-receiver", "tf32", gv.ALIGNED[0], False, 0.55, 0.58, 0.58 * 0.974, 5)])
    doc = gv.result_document(rows, "hopper", ["bf16", "fp16", "tf32"], notes=[], device={"name": H200},
                             gemms=[])
    markdown, verdict = bench["device_report"].report(write_run(tmp_path / "run", gemm=doc))
    factors = verdict["factors"]
    assert factors["hopper/bf16"]["differs"] is True
    assert factors["hopper/bf16"]["fitted"] == pytest.approx(0.95, abs=1e-3)
    assert factors["hopper/fp16"]["differs"] is False and factors["hopper/fp16"]["ci95"] > 0
    assert factors["hopper/tf32"]["ci95"] is None and factors["hopper/tf32"]["verdict"].startswith("cannot tell")
    assert verdict["update_tiles"] is True
    assert "hopper/bf16 differ(s) from otel_ofu/core/tiles.py" in markdown


def test_the_table_gives_mfu_raw_corrected_and_gaps_per_precision_and_shape(bench, tmp_path):
    gv = bench["gemm_validation"]
    rows = [gv.Row("nvml-receiver", "bf16", (8192, 50257, 4096), True, mfu=0.71, raw=0.75, corrected=0.7296,
                   windows=5),
            gv.Row("gpm", "bf16", (8192, 50257, 4096), True, mfu=0.71, raw=0.75, corrected=0.7296, windows=5,
                   raw_point=0.7523)]
    doc = gv.result_document(rows, "hopper", ["bf16"], notes=["GPU 0: NVIDIA H200"], device={}, gemms=[])
    markdown, verdict = bench["device_report"].report(write_run(tmp_path / "run", gemm=doc))
    assert "| bf16 | 8192x50257x4096 | ragged | 71.00 | 75.00 | 72.96 | +4.00 | +1.96 | 5 |" in markdown
    assert "| bf16 | 8192x50257x4096 | 75.00 | 75.23 | +0.230 |" in markdown  # point against averaged clock
    assert "- GPU 0: NVIDIA H200" in markdown
    assert verdict["factors"]["hopper/bf16"]["n"] == 1


def test_the_long_gemm_gives_point_against_averaged_clock_and_the_spec_check(bench, tmp_path):
    gc = bench["gpu_check"]
    spec = specs.find_spec(H200)
    peak = spec.peak("bf16")
    t0 = 1_800_000_000.0
    samples, readings, chunks = [], [], []
    for w in range(4):  # 5 s windows; the clock walks 1700 -> 1790 MHz in each, so the point clock reads high
        end = t0 + 5 * (w + 1)
        sample = GpuSample(int(end * 1e9), 5.0, "node", 0, "GPU-0", H200, 0.8, 1745.0, 5, 1980)
        raw = 0.8 * 1745 / spec.tensor_ref_clock_mhz
        samples.append((sample, {"gpu.tensor.activity": 0.8, "gpu.ofu.raw": raw, "gpu.ofu": raw * 0.973}))
        readings += [gc.ClockReading(end - 5 + 0.5 * (i + 1), 1700.0 + 10 * i, 0, 650.0) for i in range(10)]
        chunks.append(gc.Chunk(end - 1, flops=0.95 * raw * peak.flops * 4.0, gpu_s=4.0))
    rows = gc.window_rows(samples, readings, chunks, H200, "bf16", peak.flops)
    device = {"name": H200, "sm_count": 132, "max_sm_clock_mhz": 1980, "driver": "580.159.04"}
    check = {"gpu": True, "device": device, "dtype": "bf16", "size": 8192, "seconds": 20, "window_s": 5,
             "clock_interval_s": 1, "point_interval_s": 0.5, "windows": rows,
             "summary": gc.summarize(rows, readings, spec, "bf16", device)}
    summary = check["summary"]
    assert summary["steady_windows"] == 2 and summary["implied_factor"] == pytest.approx(0.95)
    pva = summary["point_vs_averaged"]
    expected_pp = 0.8 * (1790 - 1745) / spec.tensor_ref_clock_mhz * 100
    assert pva["point_minus_averaged_pp_mean"] == pytest.approx(expected_pp)
    assert summary["clocks_under_gemm"]["min_mhz"] == 1700 and summary["clocks_under_gemm"]["max_mhz"] == 1790
    assert summary["spec_check"]["max_clock_matches"] is True
    markdown, _ = bench["device_report"].report(write_run(tmp_path / "run", check=check))
    assert f"mean {expected_pp:+.3f} pp" in markdown
    assert "| max SM clock, MHz | 1980 | 1980 (NVML max)" in markdown
    assert "min 1700, mean 1745, median 1745, max 1790 MHz" in markdown


def test_a_run_without_a_gpu_reports_no_measurement(bench, tmp_path):
    folder = write_run(tmp_path / "run", gpu=False, check={"gpu": False, "reason": "no GPU: torch is not installed"})
    markdown, verdict = bench["device_report"].report(folder)
    assert "No GPU measurement: torch is not installed." in markdown
    assert verdict["gpu"] is False and verdict["factors"] == {}
    assert "- gpu_check: no-gpu: no GPU (torch is not installed)" in markdown


def test_the_command_line_refuses_a_missing_folder(bench, tmp_path, capsys):
    assert bench["device_report"].main([str(tmp_path / "absent")]) == 2
    assert "is not a folder" in capsys.readouterr().err
