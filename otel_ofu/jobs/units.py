"""Reported throughput as MFU: a job's TFLOP/s (in whatever unit it names) over its GPUs' peak."""

from __future__ import annotations

from otel_ofu.core.model import MetricPoint

# A TFLOP/s report's unit, lower-cased without braces -> FLOP/s per unit; anything else (no unit,
# "1") is the metric's definition: TFLOP/s.
_FLOPS_UNITS = {"flop/s": 1.0, "flops": 1.0, "gflop/s": 1e9, "tflop/s": 1e12, "tflops": 1e12, "pflop/s": 1e15}


def flops_per_unit(unit: str) -> float:
    """How many FLOP/s one unit of a reported throughput is (TFLOP/s unless the unit says otherwise)."""
    return _FLOPS_UNITS.get(unit.replace("{", "").replace("}", "").strip().lower(), 1e12)


def reported_mfu(point: MetricPoint, mfu_metric: str, peak_flops_per_gpu: float | None) -> float | None:
    """A report as MFU: the fraction itself (``%`` divided by 100), or TFLOP/s over the GPU's peak."""
    if point.name == mfu_metric:
        return point.value / 100.0 if point.unit == "%" else point.value
    if peak_flops_per_gpu is None or peak_flops_per_gpu <= 0:
        return None
    return point.value * flops_per_unit(point.unit) / peak_flops_per_gpu
