"""The loss account (otel_ofu.core.loss): hand-computed windows, and properties over all readings."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ofu.core import loss, tiles
from otel_ofu.core.loss import (
    CLOCK,
    ENGINE_IDLE,
    LOSS_PARTS,
    MEMORY_BOUND,
    MERGE,
    NON_TENSOR,
    NOT_MEMORY_BOUND,
    PADDING,
    SM_IDLE,
    UNALLOCATED,
    UNKNOWN,
    USEFUL,
    LossTotals,
    loss_account,
)
from otel_ofu.core.ofu import OfuResult, compute_ofu
from otel_ofu.core.values import DCGM_FP64_BLANK, DCGM_INT32_BLANK, DCGM_INT64_BLANK, TPA_TOLERANCE, clean_ratio

H100 = "NVIDIA H100 80GB HBM3"
C_HOPPER_BF16 = tiles.DEFAULT_CORRECTIONS["hopper"]["bf16"]


def h100(tpa: float, clock: float, **readings) -> loss.LossAccount:
    result = compute_ofu(tpa, clock, H100, "bf16", 1980)
    assert isinstance(result, OfuResult)
    return loss_account(result.tpa, result.raw, result.corrected, **readings)


def test_a_window_with_every_counter_by_hand():
    # H100 SXM, f_ref 1830 MHz: GR 0.95, SM 0.85, TPA 0.60 at 1755 MHz, Hopper BF16 tile correction.
    account = h100(0.60, 1755, gr=0.95, sm=0.85, dram=0.31, reasons=0x4)
    raw = 0.60 * 1755 / 1830
    ofu = raw * C_HOPPER_BF16
    assert dict(account.parts) == pytest.approx({
        ENGINE_IDLE: 0.05, SM_IDLE: 0.10, NON_TENSOR: 0.25, CLOCK: 0.60 - raw, PADDING: raw - ofu})
    assert [name for name, _ in account.parts] == [ENGINE_IDLE, SM_IDLE, NON_TENSOR, CLOCK, PADDING]
    assert account.ofu == pytest.approx(ofu)
    assert account.lost + account.ofu == pytest.approx(1.0, abs=1e-12)
    assert account.clock_cause == "sw_power_cap" and account.memory_cause == NOT_MEMORY_BOUND
    assert account.cause(CLOCK) == "sw_power_cap" and account.cause(NON_TENSOR) == NOT_MEMORY_BOUND
    assert account.cause(ENGINE_IDLE) is None
    assert account.largest() == (NON_TENSOR, pytest.approx(0.25))
    assert not account.reordered and account.unused == ()


def test_boost_above_the_reference_clock_is_a_negative_clock_part():
    account = h100(0.90, 1980, gr=1.0, sm=0.95, reasons=0)
    assert account.share(CLOCK) == pytest.approx(0.90 * (1 - 1980 / 1830))
    assert account.share(CLOCK) < 0
    assert account.clock_cause == loss.NO_REASON
    assert account.lost + account.ofu == pytest.approx(1.0, abs=1e-12)


def test_dcgm_exporter_default_counters_merge_sm_idle_with_non_tensor_under_both_names():
    # dcgm-exporter's default counters: GR, TPA, DRAM; no SM_ACTIVE.
    account = h100(0.40, 1700, gr=0.90, dram=0.62)
    names = [name for name, _ in account.parts]
    assert names == [ENGINE_IDLE, SM_IDLE + MERGE + NON_TENSOR, CLOCK, PADDING]
    assert account.share(SM_IDLE + MERGE + NON_TENSOR) == pytest.approx(0.50)
    assert account.share(SM_IDLE) is None and account.share(NON_TENSOR) is None  # unknown, never 0
    assert account.cause(SM_IDLE + MERGE + NON_TENSOR) == MEMORY_BOUND
    assert account.unused == (("sm_active", "missing"),)
    assert account.clock_cause == UNKNOWN  # dcgm-exporter exports no clock event reasons


def test_without_gr_engine_idle_and_sm_idle_are_one_part():
    account = h100(0.40, 1700, sm=0.70)
    assert [name for name, _ in account.parts][:2] == [ENGINE_IDLE + MERGE + SM_IDLE, NON_TENSOR]
    assert account.share(ENGINE_IDLE + MERGE + SM_IDLE) == pytest.approx(0.30)


def test_with_neither_gr_nor_sm_the_three_steps_are_one_part():
    account = h100(0.40, 1700)
    assert account.parts[0] == (MERGE.join((ENGINE_IDLE, SM_IDLE, NON_TENSOR)), pytest.approx(0.60))
    assert account.memory_cause == UNKNOWN


@pytest.mark.parametrize("blank,reason", [
    (DCGM_FP64_BLANK, "blank"), (DCGM_FP64_BLANK + 2, "not_supported"), (DCGM_INT32_BLANK + 3, "not_permissioned"),
    (float("nan"), "nan"), (-0.2, "negative"), (1.5, "out_of_range"), ("N/A", "blank"), (None, "missing"),
])
def test_a_blank_ratio_is_no_level_and_says_why(blank, reason):
    account = h100(0.40, 1700, gr=0.90, sm=blank, dram=blank)
    assert account.share(SM_IDLE + MERGE + NON_TENSOR) == pytest.approx(0.50)
    assert ("sm_active", reason) in account.unused
    assert account.memory_cause == UNKNOWN


def test_sampling_noise_below_the_next_level_is_raised_to_it():
    # SM reads 0.005 below TPA, GR 0.01 below SM: within the tolerance, noise.
    account = h100(0.60, 1830, gr=0.585, sm=0.595)
    assert account.share(NON_TENSOR) == 0.0 and account.share(SM_IDLE) == 0.0
    assert account.share(ENGINE_IDLE) == pytest.approx(0.40)
    assert account.reordered


def test_a_level_far_below_the_next_is_not_the_same_window_and_is_not_used():
    account = h100(0.60, 1830, gr=0.30, sm=0.80)
    assert ("gr_engine_active", loss.INCONSISTENT) in account.unused
    assert account.share(ENGINE_IDLE + MERGE + SM_IDLE) == pytest.approx(0.20)
    assert account.share(NON_TENSOR) == pytest.approx(0.20)


def test_an_idle_gpu_is_all_engine_idle():
    account = h100(0.0, 345, gr=0.0, sm=0.0, reasons=0x1)
    assert dict(account.parts)[ENGINE_IDLE] == 1.0
    assert account.ofu == 0.0 and account.clock_cause == "idle"


@pytest.mark.parametrize("mask,cause", [
    (0x0, "none"), (0x1, "idle"), (0x4, "sw_power_cap"), (0x4 | 0x1, "sw_power_cap"), (0x4 | 0x40, "hw_thermal"),
    (0x8 | 0x40, "hw_thermal"), (0x8 | 0x80 | 0x40, "hw_power_brake"), (0x8, "hw_slowdown"), (0x20 | 0x4, "sw_thermal"),
    (0x2, "app_clocks"), (0x10 | 0x2, "sync_boost"), (0x100, "display_clocks"), (0x400, "other"),
    (None, "unknown"), (DCGM_INT64_BLANK, "unknown"), ("4", "sw_power_cap"), (4.0, "sw_power_cap"),
    (float("nan"), "unknown"), (2.5, "unknown"),
])
def test_clock_cause_is_the_most_severe_reason(mask, cause):
    assert loss.clock_cause(mask) == cause


def test_the_clock_cause_table_agrees_with_the_bits_for_every_mask():
    for mask in range(0x800):
        assert loss.clock_cause(mask) == loss.clock_cause(float(mask)) == loss.clock_cause(str(mask))


@pytest.mark.parametrize("dram,cause", [(0.49, NOT_MEMORY_BOUND), (0.5, MEMORY_BOUND), (0.91, MEMORY_BOUND),
                                        (None, UNKNOWN), (DCGM_FP64_BLANK, UNKNOWN)])
def test_memory_cause_from_dram_active(dram, cause):
    assert loss.memory_cause(dram) == cause


def test_part_names_are_the_chain_steps_and_their_merges():
    assert LOSS_PARTS == ("engine_idle", "engine_idle+sm_idle", "engine_idle+sm_idle+non_tensor", "sm_idle",
                          "sm_idle+non_tensor", "non_tensor", "clock", "padding")


ratio = st.floats(0.0, 1.0)
reading = st.one_of(st.none(), ratio, st.sampled_from([DCGM_FP64_BLANK, float("nan"), -1.0, 3.0, "N/A"]),
                    st.floats(1.0, 1.0 + TPA_TOLERANCE))


@settings(max_examples=1000, deadline=None)
@given(tpa=st.floats(0.0, 1.0 + TPA_TOLERANCE), clock=st.floats(100, 2500), fref=st.floats(500, 2500),
       correction=st.floats(0.5, 1.0), gr=reading, sm=reading, dram=reading,
       reasons=st.one_of(st.none(), st.integers(0, 0x7FF)))
def test_the_parts_and_ofu_add_up_to_one(tpa, clock, fref, correction, gr, sm, dram, reasons):
    tpa = min(tpa, 1.0)  # as clean_ratio hands it over
    raw = tpa * clock / fref
    ofu = raw * correction
    account = loss_account(tpa, raw, ofu, gr, sm, dram, reasons)
    assert math.fsum(v for _, v in account.parts) + account.ofu == pytest.approx(1.0, abs=1e-9)
    names = [name for name, _ in account.parts]
    # every step of the chain is in exactly one part, in order
    steps = [step for name in names for step in name.split(MERGE)]
    assert steps == [ENGINE_IDLE, SM_IDLE, NON_TENSOR, CLOCK, PADDING]
    assert all(name in LOSS_PARTS for name in names)
    for name, value in account.parts:
        if name != CLOCK:
            assert value >= 0, (name, value)
    assert account.cause(CLOCK) in loss.CLOCK_CAUSES
    assert account.causes == tuple(account.cause(name) for name in names)
    # the ofu processor's lean path (its shortcut for plain ratios in order included) gives the same account
    layout, shares, memory, clock_cause = loss.loss_shares(tpa, raw, ofu, gr, sm, dram, reasons)
    assert layout == tuple(names) and shares == tuple(v for _, v in account.parts)
    assert clock_cause == account.cause(CLOCK)
    assert memory == account.cause(next(name for name in names if NON_TENSOR in name.split(MERGE)))
    # a counter with a clean, consistent value is used as a level; one without a value never is
    for counter, value, step_above in (("gr_engine_active", gr, ENGINE_IDLE), ("sm_active", sm, SM_IDLE)):
        used = counter not in dict(account.unused)
        assert used == any(name.split(MERGE)[-1] == step_above for name in names)
        if clean_ratio(value)[0] is None:
            assert not used


@settings(max_examples=500, deadline=None)
@given(levels=st.lists(ratio, min_size=3, max_size=3), clock=st.floats(100, 2500))
def test_consistent_counters_give_their_own_differences(levels, clock):
    tpa, sm, gr = sorted(levels)
    raw = tpa * clock / 1830
    account = loss_account(tpa, raw, raw * 0.973, gr, sm)
    assert dict(account.parts)[ENGINE_IDLE] == pytest.approx(1 - gr, abs=1e-12)
    assert dict(account.parts)[SM_IDLE] == pytest.approx(gr - sm, abs=1e-12)
    assert dict(account.parts)[NON_TENSOR] == pytest.approx(sm - tpa, abs=1e-12)
    assert not account.reordered and account.unused == ()


def test_totals_weight_windows_by_gpu_time_and_keep_unallocated_apart():
    totals = LossTotals()
    a = h100(0.60, 1830, gr=0.95, sm=0.85, reasons=0x4)
    b = h100(0.20, 1830, gr=0.30, sm=0.25, reasons=0x40)
    totals.add(a, 30.0)
    totals.add(b, 10.0)
    totals.add_unallocated(20.0)
    assert totals.seconds == 60.0
    shares = totals.shares()
    assert shares[ENGINE_IDLE] == pytest.approx((0.05 * 30 + 0.70 * 10) / 60)
    assert shares[UNALLOCATED] == pytest.approx(20 / 60)
    assert shares[USEFUL] == pytest.approx((a.ofu * 30 + b.ofu * 10) / 60)
    assert math.fsum(shares.values()) == pytest.approx(1.0, abs=1e-12)
    assert totals.gpu_hours()[UNALLOCATED] == pytest.approx(20 / 3600)
    # the dominant clock cause is the one behind most clock loss (both have TPA x 0 here: none)
    assert totals.dominant_cause(CLOCK) is None
    assert totals.largest_loss() == (ENGINE_IDLE, pytest.approx(shares[ENGINE_IDLE]))
    assert list(shares) == sorted(shares, key=loss.part_order)


def test_dominant_cause_is_weighted_by_the_loss_it_explains():
    totals = LossTotals()
    totals.add(h100(0.80, 1200, gr=1, sm=0.9, reasons=0x40), 10.0)  # big clock loss, thermal
    totals.add(h100(0.80, 1755, gr=1, sm=0.9, reasons=0x4), 40.0)  # small clock loss, power cap
    thermal = 0.80 * (1 - 1200 / 1830) * 10
    power = 0.80 * (1 - 1755 / 1830) * 40
    assert thermal > power
    assert totals.dominant_cause(CLOCK) == "hw_thermal"


def test_merged_totals_equal_one_pass():
    windows = [(h100(0.6, 1800, gr=0.9, sm=0.8), 10.0), (h100(0.3, 1500, gr=0.5), 20.0),
               (h100(0.1, 1200, sm=0.2, dram=0.7), 5.0)]
    whole, first, second = LossTotals(), LossTotals(), LossTotals()
    for account, seconds in windows:
        whole.add(account, seconds)
    for account, seconds in windows[:1]:
        first.add(account, seconds)
    for account, seconds in windows[1:]:
        second.add(account, seconds)
    first.merge(second)
    assert first.shares() == pytest.approx(whole.shares())
    assert first.cause_seconds == pytest.approx(whole.cause_seconds)


def test_words_for_every_part():
    for part in (*LOSS_PARTS, UNALLOCATED):
        assert loss.part_title(part) and loss.advice(part)
    assert loss.part_title("sm_idle+non_tensor") == "SMs idle or non-tensor"
    assert "SM_ACTIVE" in loss.advice("sm_idle+non_tensor")
    assert "GR_ENGINE_ACTIVE" in loss.advice("engine_idle+sm_idle")
    assert "input pipeline" in loss.advice(ENGINE_IDLE)
    assert "cooling" in loss.advice(CLOCK, "hw_thermal")
    assert "power" in loss.advice(CLOCK, "sw_power_cap")
    assert "128" in loss.advice(PADDING)
    assert "memory-bound" in loss.advice(NON_TENSOR, MEMORY_BOUND)
