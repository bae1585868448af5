"""jobs.windows: the part of a GPU's time each point covers (tests/test_jobs_conservation.py: the property)."""

import math

import pytest

from otel_ofu.jobs.windows import SeriesWindows, take

DEFAULT, MAX_GAP, KEEP = 10.0, 120.0, 420.0


def run(times, own=None, series=None):
    """take() for points at ``times`` (own: time -> own start); the windows they counted."""
    series = series or SeriesWindows()
    own = own or {}
    return [take(series, t, own.get(t), DEFAULT, MAX_GAP, KEEP) for t in times], series


def test_in_order_points_tile_time_and_a_first_point_covers_the_default_interval():
    windows, series = run([10, 20, 30])
    assert windows == [(0, 10), (10, 20), (20, 30)] and series.covered == [0, 30]


def test_a_lost_scrape_is_still_the_series_time_but_a_gap_past_max_gap_is_not():
    windows, series = run([10, 30, 200])
    assert windows == [(0, 10), (10, 30), (190, 200)]  # after the gap: the usual interval (10), not 20
    assert series.covered == [0, 30, 190, 200]


def test_a_duplicate_is_not_counted_and_a_late_point_fills_only_its_own_hole():
    windows, series = run([10, 40, 40, 20, 30, 30, 10])
    # 40 continues from 10 (a lost scrape, as far as it knows): the late 20 and 30 find their time counted.
    assert windows == [(0, 10), (10, 40), None, None, None, None, None]
    windows, series = run([40, 10, 20, 30])
    assert windows == [(30, 40), (0, 10), (10, 20), (20, 30)] and series.covered == [0, 40]


def test_a_point_that_says_its_window_covers_that_window():
    # The GPU ran another job from 10 to 30: the point at 40 says its window began at 30.
    windows, _ = run([10, 40], own={40: 30})
    assert windows == [(0, 10), (30, 40)]
    # Late, and the newer point came first: it still covers only its own window.
    windows, _ = run([50, 40], own={40: 30})
    assert windows == [(40, 50), (30, 40)]
    # A window reaching into covered time counts what was not covered.
    windows, _ = run([10, 20, 25], own={25: 5})
    assert windows[2] == (20, 25)


def test_time_older_than_keep_counts_as_covered_so_the_series_stays_small():
    series = SeriesWindows()
    for t in range(10, 5000, 10):
        take(series, float(t), None, DEFAULT, MAX_GAP, KEEP)
        if t % 300 == 0:
            take(series, t + 500.0, None, DEFAULT, MAX_GAP, KEEP)  # a point far ahead leaves a hole behind it
    assert len(series.covered) <= 2 * (KEEP / 300 + 3)
    assert series.covered[0] == -math.inf
    assert take(series, 100.0, None, DEFAULT, MAX_GAP, KEEP) is None  # long ago: refused as out of order


def test_a_series_whose_host_clock_started_over_continues_with_its_interval():
    _, series = run([30, 60, 90])
    series.forget_position()
    assert take(series, 5.0, None, DEFAULT, MAX_GAP, KEEP) == pytest.approx((-25.0, 5.0))
