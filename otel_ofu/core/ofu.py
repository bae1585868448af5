"""The OFU math: pure functions on plain numbers, no I/O.

    OFU_raw = TPA x f_SM / f_ref        OFU = OFU_raw x c_tile

TPA (DCGM field 1004) is the fraction of SM cycles in which any tensor pipe was active,
averaged over the watch window; multiplying by the window's SM clock gives active tensor
cycles per second; dividing by f_ref (the clock the peak is quoted at) gives the fraction of
peak tensor throughput. Since TPA is cycle-weighted, TPA x mean(f_SM) over the same window is
exactly the mean of active-cycles/s: averaging the clock over the window removes the
sampling noise a single point sample carries (:func:`mean_clock`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from otel_ofu.core import specs, tiles
from otel_ofu.core.values import TPA_TOLERANCE, NoValue, clean_clock, clean_ratio

# Marker of where f_ref came from (attribute ofu.fref.source).
FREF_SPEC = "spec"  # the spec table's tensor reference clock for the model
FREF_CONFIG = "config"  # an override in the ofu processor's config
FREF_MAX_CLOCK = "max_sm_clock"  # unknown model: the device's reported max SM clock
ANY_MODEL = "*"  # reference_clocks key for GPUs whose model is missing from the spec table or unnamed

# No window's OFU can exceed this: TPA is at most 1 and the SM clock at most the GPU's max, at
# most 1.16 x f_ref across the spec table (H100/H200 NVL: 1785 / 1545 MHz). Above it, a clock
# is in the wrong unit (Hz read as MHz), f_ref is wrong, or the data is bad: the window is
# dropped as out_of_range, never reported as a number.
OFU_LIMIT = 1.2


@dataclass(frozen=True, slots=True)
class ReferenceClock:
    mhz: float
    source: str
    spec: specs.GpuSpec | None


def reference_clock(model: str | None, precision: str, reported_max_mhz: float | None,
                    overrides: dict[str, float] | None = None) -> ReferenceClock | None:
    """f_ref for a device: config override, else spec table, else the reported max clock."""
    spec = specs.find_spec(model)
    if overrides and model and model in overrides:
        return ReferenceClock(overrides[model], FREF_CONFIG, spec)
    if spec is not None:
        return _spec_reference(spec.key, precision)
    if overrides and ANY_MODEL in overrides:  # every model missing from the table (or not named at all)
        return ReferenceClock(overrides[ANY_MODEL], FREF_CONFIG, None)
    if reported_max_mhz:
        return ReferenceClock(reported_max_mhz, FREF_MAX_CLOCK, None)
    return None


@functools.lru_cache(maxsize=1024)
def _spec_reference(spec_key: str, precision: str) -> ReferenceClock:
    """The spec table's f_ref, one (immutable) object per GPU model and precision: asked once per sample."""
    spec = specs.SPECS_BY_KEY[spec_key]
    return ReferenceClock(spec.ref_clock_mhz(precision), FREF_SPEC, spec)


def ofu_raw(tpa: float, sm_clock_mhz: float, fref_mhz: float) -> float:
    return tpa * sm_clock_mhz / fref_mhz


def mean_clock(samples: Iterable[tuple[int, float]], start_ns: int, end_ns: int) -> tuple[float | None, int]:
    """Mean of the valid SM clock samples taken in the window (start, end], and their count.

    Samples are point readings at a fixed rate, so the arithmetic mean is the time average.
    With one sample in the window the result is that sample (the paper's method, whose noise
    is at most 0.22 pp at 5-30 s); with none, no value.
    """
    total = 0.0
    count = 0
    for t_ns, mhz in samples:
        if start_ns < t_ns <= end_ns:
            value, _ = clean_clock(mhz)
            if value is not None:
                total += value
                count += 1
    return (total / count if count else None), count


class OfuResult(NamedTuple):
    """OFU of one GPU window and what it was computed with (immutable).

    A named tuple rather than a frozen dataclass: one is built per GPU and window, and a
    frozen dataclass costs several times as much to build (its fields are set one by one
    through object.__setattr__).
    """

    tpa: float
    sm_clock_mhz: float
    raw: float
    corrected: float
    fref_mhz: float
    fref_source: str
    correction: float
    architecture: str | None
    achieved_flops: float | None  # OFU x peak(precision) x share, when the precision (and a MIG share) is known


# Builds an OfuResult from a tuple of its fields in C: the named tuple's own __new__ is a Python
# function, which costs about as much again as the OFU math (ofu_with).
_new_tuple = tuple.__new__


@dataclass(frozen=True, slots=True)
class Calibration:
    """What OFU is computed with for a GPU model and precision: f_ref, the tile factor, the peak.

    The same for every window of a GPU: :func:`calibration` works it out, :func:`ofu_with` uses
    it, and a caller may keep it between windows (the ``ofu`` processor does, per GPU).
    """

    fref_mhz: float
    fref_source: str
    correction: float
    architecture: str | None
    peak_flops: float | None  # the dense peak at the precision, when known


def calibration(model: str | None, precision: str = specs.UNKNOWN_PRECISION, max_sm_clock_mhz: float | None = None,
                *, fref_overrides: dict[str, float] | None = None, correction_overrides: dict[str, float] | None = None,
                apply_correction: bool = True) -> Calibration | None:
    """The :class:`Calibration` of a GPU; None when there is no f_ref for it (``max_sm_clock_mhz``: cleaned)."""
    ref = reference_clock(model, precision, max_sm_clock_mhz, fref_overrides)
    if ref is None:
        return None
    arch = ref.spec.architecture if ref.spec else None
    factor = tiles.correction_factor(arch, precision, correction_overrides) if apply_correction else 1.0
    peak = ref.spec.peak(precision) if ref.spec else None
    return Calibration(ref.mhz, ref.source, factor, arch, peak.flops if peak is not None else None)


def ofu_with(cal: Calibration | None, tpa: object, sm_clock_mhz: object, tpa_tolerance: float = TPA_TOLERANCE,
             share: float | None = 1.0) -> OfuResult | NoValue:
    """OFU for one GPU window from raw readings and the GPU's calibration (None: no f_ref); see :func:`compute_ofu`.

    Its settings may be passed by position: the ofu processor calls it once per GPU window."""
    tpa_value, reason = clean_ratio(tpa, tpa_tolerance)
    if tpa_value is None:
        return reason  # type: ignore[return-value]
    clock_value, reason = clean_clock(sm_clock_mhz)
    if clock_value is None:
        return reason  # type: ignore[return-value]
    if cal is None:
        return NoValue.NO_REFERENCE_CLOCK
    raw = ofu_raw(tpa_value, clock_value, cal.fref_mhz)
    corrected = raw * cal.correction
    if raw > OFU_LIMIT or corrected > OFU_LIMIT:
        return NoValue.OUT_OF_RANGE
    return _new_tuple(OfuResult, (
        tpa_value, clock_value, raw, corrected, cal.fref_mhz, cal.fref_source, cal.correction, cal.architecture,
        corrected * cal.peak_flops * share if cal.peak_flops is not None and share is not None else None))


def compute_ofu(tpa: object, sm_clock_mhz: object, model: str | None, precision: str = specs.UNKNOWN_PRECISION,
                max_sm_clock_mhz: object = None, *, tpa_tolerance: float = TPA_TOLERANCE,
                fref_overrides: dict[str, float] | None = None,
                correction_overrides: dict[str, float] | None = None,
                apply_correction: bool = True, share: float | None = 1.0) -> OfuResult | NoValue:
    """OFU for one GPU window from raw readings; a :class:`NoValue` reason when it has none.

    ``share``: the fraction of the GPU the readings stand for (a MIG instance's slices, see
    :func:`specs.instance_share`); it scales the achieved FLOP/s, not OFU (TPA is measured
    per instance). None: unknown, so no FLOP/s.
    """
    cal = calibration(model, precision, clean_clock(max_sm_clock_mhz)[0], fref_overrides=fref_overrides,
                      correction_overrides=correction_overrides, apply_correction=apply_correction)
    return ofu_with(cal, tpa, sm_clock_mhz, tpa_tolerance=tpa_tolerance, share=share)
