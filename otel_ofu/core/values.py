"""The one blank-value rule: what counts as "no value" and why.

DCGM publishes blanks as sentinels at the top of each type's range (REFERENCE.md section 2,
dcgmlib/dcgm_structs.h, testing/python3/dcgmvalue.py): a value is blank when it is >= its
type's sentinel, and sentinel+1/+2/+3 say *why* (not found, not supported, no permission).
dcgm-exporter can leak them as huge ints. Every receiver and processor goes through
:func:`clean` so that a missing counter is reported as missing, never turned into 0.
"""

from __future__ import annotations

import enum
import math

DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0  # 2**47
DCGM_STR_BLANK = "<<<NULL>>>"

# Offsets above the sentinel, as dcgm_structs.h defines them (*_BLANK + n).
_BLANK_OFFSETS = {1: "not_found", 2: "not_supported", 3: "not_permissioned"}

#: TPA is a ratio 0..1; counters may overshoot by rounding. Beyond this it is bad data.
TPA_TOLERANCE = 0.02


class NoValue(enum.StrEnum):
    """Why a counter has no value. The string is the `ofu.drop.reason` attribute."""

    MISSING = "missing"  # the source did not report the field at all
    BLANK = "blank"  # DCGM blank sentinel (profiling paused, not yet sampled)
    NOT_FOUND = "not_found"
    NOT_SUPPORTED = "not_supported"
    NOT_PERMISSIONED = "not_permissioned"
    NAN = "nan"
    NEGATIVE = "negative"
    OUT_OF_RANGE = "out_of_range"  # e.g. TPA above 1 + tolerance
    ZERO_CLOCK = "zero_clock"
    NOT_A_NUMBER = "not_a_number"  # a string or other type that does not parse
    NO_REFERENCE_CLOCK = "no_reference_clock"  # unknown model and no max clock reported


_SENTINEL_BY_TYPE = {"int32": DCGM_INT32_BLANK, "fp64": DCGM_FP64_BLANK, "int64": DCGM_INT64_BLANK}


def blank_reason(value: int | float, field_type: str | None = None) -> NoValue | None:
    """The DCGM blank class of a numeric value, or None when it is an ordinary number.

    ``field_type`` ("int32", "fp64", "int64") is the DCGM field's type when known. Without
    it the smallest sentinel applies, which is right for every gauge we read (ratios, MHz,
    W) but not for raw 64-bit cycle counters: pass "int64" for those.
    """
    threshold = _SENTINEL_BY_TYPE[field_type] if field_type else DCGM_INT32_BLANK
    if value < threshold:
        return None
    # The sentinels are ordered INT32 < FP64 < INT64; the offset is taken from the largest
    # one the value reaches (an INT64 blank is also >= the INT32 sentinel).
    base = max(s for s in (DCGM_INT32_BLANK, DCGM_FP64_BLANK, DCGM_INT64_BLANK) if value >= s)
    offset = int(value) - int(base)  # ints stay exact; a float near 2**63 cannot tell +1 from +2
    return NoValue(_BLANK_OFFSETS[offset]) if offset in _BLANK_OFFSETS else NoValue.BLANK


def clean(value: object, field_type: str | None = None) -> tuple[float | None, NoValue | None]:
    """Turn a raw counter reading into ``(number, None)`` or ``(None, reason)``.

    Accepts ints, floats, numeric strings (dcgm-exporter / dmon text), None and DCGM
    sentinels. Range checks specific to a field (TPA <= 1, clock > 0) are in the callers
    below, so this function alone never rejects a legitimate value.
    """
    if type(value) is float:  # the common case, checked in the order of the general path below
        if value != value:
            return None, NoValue.NAN
        if value >= DCGM_INT32_BLANK:  # the smallest sentinel: also +inf
            if math.isinf(value):
                return None, NoValue.OUT_OF_RANGE
            reason = blank_reason(value, field_type)
            if reason is not None:
                return None, reason
        elif value < 0:
            if math.isinf(value):
                return None, NoValue.OUT_OF_RANGE
            return None, NoValue.NEGATIVE
        return value, None
    if value is None:
        return None, NoValue.MISSING
    if isinstance(value, bool):
        return None, NoValue.NOT_A_NUMBER
    if isinstance(value, str):
        text = value.strip()
        if text in ("", "N/A", "-", DCGM_STR_BLANK):
            return None, NoValue.BLANK
        try:
            value = int(text)  # exact: int64 sentinels lose their offset as floats
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                return None, NoValue.NOT_A_NUMBER
    if not isinstance(value, (int, float)):
        return None, NoValue.NOT_A_NUMBER
    number = float(value)
    if math.isnan(number):
        return None, NoValue.NAN
    if math.isinf(number):
        return None, NoValue.OUT_OF_RANGE
    reason = blank_reason(value, field_type)
    if reason is not None:
        return None, reason
    if number < 0:
        return None, NoValue.NEGATIVE
    return number, None


def clean_ratio(value: object, tolerance: float = TPA_TOLERANCE) -> tuple[float | None, NoValue | None]:
    """A 0..1 activity ratio (TPA). Values in (1, 1+tolerance] are clamped to 1."""
    if type(value) is float and 0.0 <= value <= 1.0:  # the common case, as the general path below takes it
        return value, None
    number, reason = clean(value)
    if number is None:
        return None, reason
    if number > 1.0 + tolerance:
        return None, NoValue.OUT_OF_RANGE
    return min(number, 1.0), None


def clean_clock(value: object) -> tuple[float | None, NoValue | None]:
    """A clock in MHz: must be strictly positive."""
    if type(value) is float and 0.0 < value < DCGM_INT32_BLANK:  # the common case, as the general path takes it
        return value, None
    number, reason = clean(value)
    if number is None:
        return None, reason
    if number == 0:
        return None, NoValue.ZERO_CLOCK
    return number, None


def rescale(value: object, factor: float) -> object:
    """A reading in other units (percent -> ratio), multiplied by ``factor``; no value left as read.

    Why: a DCGM blank scaled is no longer a blank (2**47 / 100 is just a large number, then
    judged "out of range"), so a blank, NaN or unreadable value keeps its raw form and
    :func:`clean` later names the reason. Not for readings whose scale alone may exceed a
    sentinel (a clock in Hz): convert those before judging them.
    """
    number, _ = clean(value)
    return value if number is None else number * factor
