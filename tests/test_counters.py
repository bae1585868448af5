"""The one counter rule (core/counters.py): a window's increase of a cumulative counter."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from otel_ofu.core.counters import CounterTracker, Increase, counter_increase
from otel_ofu.core.values import DCGM_INT64_BLANK


def test_first_reading_gives_no_increase_and_the_next_one_the_difference():
    tracker = CounterTracker()
    assert tracker.step("gpu0", 1_000, 5_000).how is Increase.FIRST
    step = tracker.step("gpu0", 11_000_000_000, 7_500)
    assert (step.value, step.how) == (2_500, Increase.OK)
    assert step.seconds == (11_000_000_000 - 1_000) / 1e9


def test_a_blank_is_no_value_and_the_next_reading_is_compared_with_the_last_good_one():
    tracker = CounterTracker()
    tracker.step("g", 1, 100)
    assert tracker.step("g", 2, DCGM_INT64_BLANK).how is Increase.NO_VALUE
    assert tracker.step("g", 3, None).how is Increase.NO_VALUE
    assert tracker.step("g", 4, "").how is Increase.NO_VALUE
    assert tracker.step("g", 5, 160).value == 60


def test_a_counter_that_went_down_was_reset_and_counts_its_new_reading():
    tracker = CounterTracker()
    tracker.step("g", 1, 10_000)
    step = tracker.step("g", 2, 300)
    assert (step.value, step.how) == (300, Increase.RESET)
    assert counter_increase(10.0, 10.0) == (0.0, Increase.OK)


def test_a_reading_not_later_than_the_last_is_ignored():
    tracker = CounterTracker()
    tracker.step("g", 10, 100)
    assert tracker.step("g", 10, 150).how is Increase.STALE
    assert tracker.step("g", 9, 150).how is Increase.STALE
    assert tracker.step("g", 11, 120).value == 20


def test_series_are_kept_apart_and_forgotten():
    tracker = CounterTracker()
    tracker.step("a", 1, 100)
    tracker.step("b", 1, 5)
    assert tracker.step("a", 2, 110).value == 10
    tracker.forget("a")
    assert len(tracker) == 1
    assert tracker.step("a", 3, 200).how is Increase.FIRST


@given(st.lists(st.one_of(st.integers(min_value=0, max_value=10**6), st.none()), min_size=1, max_size=40))
def test_without_resets_the_increases_add_up_to_last_minus_first(increments):
    """Any run of growing readings with blanks between: the increases sum to the counter's whole rise."""
    tracker = CounterTracker()
    total, value, first, last, got = 0, 1_000, None, None, 0
    for t, increment in enumerate(increments, start=1):
        if increment is None:
            tracker.step("g", t, None)
            continue
        value += increment
        step = tracker.step("g", t, value)
        first = value if first is None else first
        last = value
        if step.value is not None:
            got += step.value
            assert step.how is Increase.OK
    if first is not None:
        total = last - first
    assert got == total


@given(st.lists(st.tuples(st.integers(0, 50), st.one_of(
    st.integers(-5, 10**12), st.floats(allow_nan=True, allow_infinity=True), st.none(), st.just("N/A"),
    st.just(str(10**9)), st.sampled_from([DCGM_INT64_BLANK, DCGM_INT64_BLANK + 2, 2**47, 0x7FFFFFF0]))), max_size=30),
    st.sampled_from(["int64", "int32", "fp64"]))
def test_increase_is_steps_value_for_any_sequence_of_readings(readings, field_type):
    """The hot path's increase() (no object made) is step()'s value, reading for reading: one rule, two shapes."""
    stepped, fast = CounterTracker(field_type), CounterTracker(field_type)
    for t, raw in readings:
        assert fast.increase("k", t, raw) == stepped.step("k", t, raw).value
