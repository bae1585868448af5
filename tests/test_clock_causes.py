"""The clock loss by cause (issue 34 item 4): the clock part split by each reason's throttled time.

DCGM 1420-1424 (and NVML's NVML_FI_DEV_CLOCKS_EVENT_REASON_* fields) count the nanoseconds the clock
was held down per reason; the ofu processor takes each counter's increase over a GPU's window
(core.counters) and splits the window's clock part by those shares (core.loss.split_clock), the
parts adding up to the clock part exactly; the jobs processor's job.ofu.loss carries the same split.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ofu.core import loss
from otel_ofu.core.exact import exact_sum
from otel_ofu.core.loss import BOOST, CLOCK, CLOCK_TIME_CAUSES, LossTotals, split_clock
from otel_ofu.core.model import Batch, GpuSample, MetricPoint, attrs
from otel_ofu.jobs.loss import add_window, window_parts
from otel_ofu.pipeline.component import Context
from otel_ofu.processors.ofu import CLOCK_EVENTS_MAX_STALE_S, OfuProcessor, OfuProcessorConfig

S = 10**9
ZERO = dict.fromkeys(CLOCK_TIME_CAUSES, 0)


# --- the split -----------------------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(clock=st.floats(1e-9, 1.0), throttled=st.dictionaries(
    st.sampled_from(CLOCK_TIME_CAUSES), st.one_of(st.integers(0, 10**13), st.floats(0, 1e13)), min_size=1))
def test_the_causes_add_up_to_the_clock_part_exactly(clock, throttled):
    """Whatever the throttled times, the causes' shares sum exactly (math.fsum: the correctly rounded sum of their
    exact values; core.exact's too where each is at least 2^-12) to the clock part, bit for bit; each is above 0
    and in proportion to its reason's time (to rounding)."""
    split = split_clock(clock, throttled)
    if not any(v > 0 for v in throttled.values()):
        assert split is None  # no throttled time: not split (the bitmask's cause stays)
        return
    assert split is not None
    shares = [share for _, share in split]
    assert math.fsum(shares) == clock
    if min(shares) >= 2**-12:
        assert exact_sum(shares) == clock
    assert {cause for cause, _ in split} <= {c for c in CLOCK_TIME_CAUSES if throttled.get(c, 0) > 0}
    total = math.fsum(throttled.values())
    for cause, share in split:
        assert share > 0
        if len(split) > 1:
            assert share == pytest.approx(clock * throttled[cause] / total, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("clock", [0.0, -0.04, math.nan])
def test_no_clock_loss_or_a_gain_is_never_split(clock):
    assert split_clock(clock, {"sw_power_cap": 5 * S}) is None


def test_a_window_split_by_hand():
    """3 s at the power cap and 1 s of hardware thermal slowdown in a window whose clock part is 0.08."""
    split = dict(split_clock(0.08, {"sw_power_cap": 3 * S, "hw_thermal": 1 * S, "sync_boost": 0}))
    assert split == {"hw_thermal": pytest.approx(0.02), "sw_power_cap": pytest.approx(0.06)}


# --- the ofu processor -----------------------------------------------------------------------------------


def sample(t_s: float, ns: dict[str, int] | None, reasons: object = 0x4, **kw) -> GpuSample:
    base = dict(time_unix_nano=int(t_s * S), window_s=10, host="n0", gpu_index=0, uuid="GPU-0",
                model="NVIDIA H100 80GB HBM3", tensor_active=0.5, sm_clock_mhz=1500, max_sm_clock_mhz=1980,
                clock_event_reasons=reasons, job_id="job-a", precision="bf16", gr_active=0.9, sm_active=0.8,
                clock_event_ns=None if ns is None else {**ZERO, **ns})
    base.update(kw)
    return GpuSample(**base)


def clock_points(batch: Batch) -> list[MetricPoint]:
    return [p for p in batch.points if p.name == "gpu.ofu.loss" and dict(p.attributes)["ofu.loss.part"] == CLOCK]


def causes(batch: Batch, **where) -> dict[str, float]:
    return {dict(p.attributes)["ofu.loss.cause"]: p.value for p in clock_points(batch)
            if all(dict(p.resource).get(k) == v for k, v in where.items())}


def clock_part(**kw) -> float:
    """The window's clock part as the account has it without the counters (one part, the bitmask's cause)."""
    (point,) = clock_points(OfuProcessor(OfuProcessorConfig(), Context("ofu")).process(Batch(samples=[
        sample(0, None, **kw)])))
    return point.value


def test_the_clock_part_splits_by_each_reasons_throttled_time_in_the_window():
    proc = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    first = proc.process(Batch(samples=[sample(10, {"sw_power_cap": 100 * S, "hw_thermal": 7 * S})]))
    assert causes(first) == {"sw_power_cap": pytest.approx(clock_part())}  # a first reading: the bitmask's cause
    second = proc.process(Batch(samples=[sample(20, {"sw_power_cap": 106 * S, "hw_thermal": 9 * S,
                                                     "sw_thermal": 500_000_000})]))
    split = causes(second)
    assert split == {"sw_power_cap": pytest.approx(clock_part() * 6 / 8.5),
                     "hw_thermal": pytest.approx(clock_part() * 2 / 8.5),
                     "sw_thermal": pytest.approx(clock_part() * 0.5 / 8.5)}
    assert exact_sum(list(split.values())) == clock_part()
    every = [p.value for p in second.points if p.name == "gpu.ofu.loss"] + [
        p.value for p in second.points if p.name == "gpu.ofu"]
    assert math.fsum(every) == pytest.approx(1.0)  # the account still adds up to 1


def test_without_throttled_time_the_bitmask_says_why_and_unknown_without_one():
    """Counters that did not move: the clock was low for a reason they do not count (an applications clocks
    setting, HW slowdown) or between samples; the window's point sample of the bitmask is what is left."""
    proc = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    proc.process(Batch(samples=[sample(10, {"sw_power_cap": 5 * S}, reasons=0x2)]))
    assert causes(proc.process(Batch(samples=[sample(20, {"sw_power_cap": 5 * S}, reasons=0x2)]))) == {
        "app_clocks": pytest.approx(clock_part())}
    assert causes(proc.process(Batch(samples=[sample(30, {"sw_power_cap": 5 * S}, reasons=None)]))) == {
        "unknown": pytest.approx(clock_part())}


def test_a_blank_or_reset_counter_is_the_counters_rule_not_a_zero():
    proc = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    proc.process(Batch(samples=[sample(10, {"sw_power_cap": 50 * S, "hw_thermal": 10 * S})]))
    blank = proc.process(Batch(samples=[sample(20, {"sw_power_cap": 9223372036854775794, "hw_thermal": 12 * S})]))
    assert causes(blank) == {"hw_thermal": pytest.approx(clock_part())}  # the blank reason: no value, not 0
    reset = proc.process(Batch(samples=[sample(30, {"sw_power_cap": 3 * S, "hw_thermal": 13 * S})]))
    # power cap's counter went down (a driver reload): counted from 0 (3 s), as Prometheus' increase() does
    assert causes(reset) == {"sw_power_cap": pytest.approx(clock_part() * 3 / 4),
                             "hw_thermal": pytest.approx(clock_part() * 1 / 4)}


def test_a_boost_window_is_never_split():
    proc = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    proc.process(Batch(samples=[sample(10, {"sw_power_cap": 0}, sm_clock_mhz=1980, reasons=0)]))
    out = proc.process(Batch(samples=[sample(20, {"sw_power_cap": 1 * S}, sm_clock_mhz=1980, reasons=0)]))
    ((cause, share),) = causes(out).items()
    assert cause == "none" and share < 0


def test_the_copies_of_a_shared_gpus_window_get_the_same_split():
    """dcgm-exporter repeats a shared GPU's series per pod: one window, several samples of one GPU and time."""
    proc = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    pods = [{"k8s.pod.name": "a"}, {"k8s.pod.name": "b"}]
    proc.process(Batch(samples=[sample(10, {"sw_power_cap": 0, "sync_boost": 0}, resource=r) for r in pods]))
    out = proc.process(Batch(samples=[sample(20, {"sw_power_cap": 3 * S, "sync_boost": 1 * S}, resource=r)
                                      for r in pods]))
    assert causes(out, **{"k8s.pod.name": "a"}) == causes(out, **{"k8s.pod.name": "b"})
    assert set(causes(out, **{"k8s.pod.name": "a"})) == {"sw_power_cap", "sync_boost"}


def test_a_gpu_that_left_is_forgotten_and_starts_again_with_a_first_reading():
    now = [1000.0]
    proc = OfuProcessor(OfuProcessorConfig(), Context("ofu"), clock=lambda: now[0])
    proc.process(Batch(samples=[sample(10, {"sw_power_cap": 1 * S})]))
    assert len(proc._event_counters) == 1 and len(next(iter(proc._event_counters.values()))) == len(CLOCK_TIME_CAUSES)
    now[0] += CLOCK_EVENTS_MAX_STALE_S + 61
    proc.process(Batch(samples=[sample(20, {"sw_power_cap": 1 * S}, uuid="GPU-other")]))
    assert [key[1] for key in proc._event_counters] == ["gpu-other"]  # only the other GPU's (keys are lowercase)
    back = proc.process(Batch(samples=[sample(700, {"sw_power_cap": 500 * S})]))
    assert causes(back) == {"sw_power_cap": pytest.approx(clock_part())}  # a first reading: the bitmask's


# --- jobs ---------------------------------------------------------------------------------------------------


def test_a_jobs_clock_part_is_the_sum_of_its_causes_exactly():
    """gpu.ofu.loss points of a split window pair up as one clock part; a job's account keeps each cause, and
    its clock causes (the gain as ``boost``) add up to its clock part."""
    proc = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    proc.process(Batch(samples=[sample(10, {"sw_power_cap": 0, "hw_thermal": 0})]))
    out = proc.process(Batch(samples=[sample(20, {"sw_power_cap": 3 * S, "hw_thermal": 1 * S})]))
    ((_, parts),) = window_parts(out.points).items()
    assert [p for p, _ in parts[0]].count(CLOCK) == 1
    assert dict(parts[1][CLOCK]) == causes(out)
    totals = LossTotals()
    ofu = next(p.value for p in out.points if p.name == "gpu.ofu")
    add_window(totals, parts, ofu, 10.0)
    add_window(totals, (((CLOCK, -0.01),), {CLOCK: "none"}), 1.0, 5.0)  # a boosting window: a gain
    by_cause = totals.cause_shares(CLOCK)
    assert set(by_cause) == {"sw_power_cap", "hw_thermal", BOOST} and by_cause[BOOST] < 0
    assert sum(c for (p, _), c in totals.exact_causes.items() if p == CLOCK) == totals.exact_parts[CLOCK]
    assert math.fsum(by_cause.values()) == pytest.approx(totals.shares()[CLOCK], abs=1e-15)
    assert loss.BOOST in loss.CLOCK_CAUSES


def test_split_points_for_another_gpu_do_not_mix():
    gpu = attrs({"hw.id": "GPU-1"})
    pts = [MetricPoint("gpu.ofu.loss", v, 5, gpu, attrs({"ofu.loss.part": CLOCK, "ofu.loss.cause": c}))
           for c, v in (("sw_power_cap", 0.03), ("sync_boost", 0.01))]
    ((_, (parts, by)),) = window_parts(pts).items()
    assert parts == ((CLOCK, pytest.approx(0.04)),) and by == {CLOCK: (("sw_power_cap", 0.03), ("sync_boost", 0.01))}


@settings(max_examples=300, deadline=None)
@given(windows=st.lists(st.tuples(
    st.floats(-0.05, 0.3), st.dictionaries(st.sampled_from(CLOCK_TIME_CAUSES), st.integers(0, 10**10)),
    st.sampled_from(["sw_power_cap", "none", "unknown"]), st.floats(0.5, 60)), min_size=1, max_size=20))
def test_a_jobs_clock_causes_add_up_to_its_clock_part_over_any_windows(windows):
    """Windows split by cause or not, gains among them, in any number: the job's clock causes' counts add up to
    its clock part's (exactly, as integers: core.exact), and their shares to its share (to rounding)."""
    totals = LossTotals()
    for clock, throttled, bitmask_cause, seconds in windows:
        split = split_clock(clock, throttled)
        causes = {CLOCK: split if split is not None else bitmask_cause}
        add_window(totals, (((CLOCK, clock),), causes), 0.5, seconds)
    lost = sum(c for (p, _), c in totals.exact_causes.items() if p == CLOCK)
    assert lost == totals.exact_parts.get(CLOCK, 0)
    by_cause = totals.cause_shares(CLOCK)
    if CLOCK in totals.shares():
        assert math.fsum(by_cause.values()) == pytest.approx(totals.shares()[CLOCK], abs=1e-12)
