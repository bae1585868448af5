"""The blank-value rule: every class of bad value is 'no value' with its reason, never 0."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ofu.core.values import (
    DCGM_FP64_BLANK,
    DCGM_INT32_BLANK,
    DCGM_INT64_BLANK,
    NoValue,
    clean,
    clean_clock,
    clean_ratio,
    rescale,
)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, NoValue.MISSING),
        (DCGM_INT32_BLANK, NoValue.BLANK),
        (DCGM_INT32_BLANK + 1, NoValue.NOT_FOUND),
        (DCGM_INT32_BLANK + 2, NoValue.NOT_SUPPORTED),
        (DCGM_INT32_BLANK + 3, NoValue.NOT_PERMISSIONED),
        (DCGM_INT64_BLANK, NoValue.BLANK),
        (DCGM_INT64_BLANK + 2, NoValue.NOT_SUPPORTED),
        (9223372036854775794, NoValue.NOT_SUPPORTED),  # as dcgm-exporter leaks it
        (DCGM_FP64_BLANK, NoValue.BLANK),
        (DCGM_FP64_BLANK + 3, NoValue.NOT_PERMISSIONED),
        (float("nan"), NoValue.NAN),
        (float("inf"), NoValue.OUT_OF_RANGE),
        (-0.01, NoValue.NEGATIVE),
        ("", NoValue.BLANK),
        ("N/A", NoValue.BLANK),
        ("abc", NoValue.NOT_A_NUMBER),
        (True, NoValue.NOT_A_NUMBER),
        ([1], NoValue.NOT_A_NUMBER),
    ],
)
def test_bad_values_have_no_value_and_a_reason(raw, reason):
    assert clean(raw) == (None, reason)


@pytest.mark.parametrize(("raw", "number"), [(0, 0.0), (0.929260, 0.92926), ("1215", 1215.0), (" 0.5 ", 0.5)])
def test_ordinary_numbers_pass(raw, number):
    assert clean(raw) == (number, None)


def test_int64_counters_above_the_int32_sentinel_are_numbers_when_typed():
    big = 5_000_000_000  # a raw cycle counter after a few seconds
    assert clean(big) == (None, NoValue.BLANK)  # untyped: read as a blank gauge
    assert clean(big, "int64") == (float(big), None)
    assert clean(DCGM_INT64_BLANK + 1, "int64") == (None, NoValue.NOT_FOUND)


def test_ratio_tolerance_clamps_small_overshoot_and_rejects_large():
    assert clean_ratio(1.01) == (1.0, None)
    assert clean_ratio(1.021) == (None, NoValue.OUT_OF_RANGE)
    assert clean_ratio(1.05, tolerance=0.1) == (1.0, None)
    assert clean_ratio(0.0) == (0.0, None)


def test_zero_clock_is_no_value():
    assert clean_clock(0) == (None, NoValue.ZERO_CLOCK)
    assert clean_clock(1830) == (1830.0, None)
    value, reason = clean_clock(float("nan"))
    assert value is None and reason is NoValue.NAN and not math.isnan(0.0)


@pytest.mark.parametrize(("raw", "reason"), [
    (DCGM_INT32_BLANK, NoValue.BLANK), (DCGM_INT32_BLANK + 2, NoValue.NOT_SUPPORTED), (float("nan"), NoValue.NAN),
    ("N/A", NoValue.BLANK), (-5.0, NoValue.NEGATIVE),
])
def test_a_rescaled_blank_is_still_blank_not_out_of_range(raw, reason):
    assert clean_ratio(rescale(raw, 0.01)) == (None, reason)


def test_rescale_converts_ordinary_readings():
    assert rescale(50, 0.01) == 0.5 and rescale("92.5", 0.01) == pytest.approx(0.925)


@settings(max_examples=2000)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
    [0.0, -0.0, 1.0, 1.0000001, float(DCGM_INT32_BLANK), float(DCGM_INT32_BLANK) - 1, 5e-324, -5e-324])),
       st.sampled_from([0.0, 0.02, 0.2]))
def test_the_fast_paths_for_floats_give_what_the_general_rule_gives(value, tolerance):
    """clean_ratio and clean_clock take an ordinary float without calling clean(): the same answer as through it."""
    number, reason = clean(value)
    ratio = (None, reason) if number is None else (
        (None, NoValue.OUT_OF_RANGE) if number > 1.0 + tolerance else (min(number, 1.0), None))
    clock = (None, reason) if number is None else ((None, NoValue.ZERO_CLOCK) if number == 0 else (number, None))
    assert repr(clean_ratio(value, tolerance)) == repr(ratio)
    assert repr(clean_clock(value)) == repr(clock)
