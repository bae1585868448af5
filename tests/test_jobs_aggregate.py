"""Time-weighted aggregation: uneven windows, partial overlaps, rolling retention, waste."""

import math

import pytest

from otel_ofu.jobs.aggregate import JobTotals, TimeWeightedSeries, WeightedHistogram, segment_start, window_label


@pytest.mark.parametrize("seconds, label", [(300, "5m"), (3600, "1h"), (90, "90s"), (5400, "90m"), (7200, "2h"),
                                            (1.5, "1.5s")])
def test_window_label(seconds, label):
    assert window_label(seconds) == label


def test_uneven_windows_weigh_by_duration_not_by_count():
    s = TimeWeightedSeries(3600)
    s.add(0, 30, 0.6)  # a 30 s scrape
    s.add(30, 40, 0.2)  # a 10 s scrape
    assert s.mean(0, 40) == pytest.approx((0.6 * 30 + 0.2 * 10) / 40)  # 0.5, not the count mean 0.4


def test_partial_overlap_counts_only_the_overlap():
    s = TimeWeightedSeries(3600)
    s.add(0, 60, 1.0)
    s.add(60, 120, 0.0)
    assert s.mean(30, 90) == pytest.approx(0.5)
    value_time, weight_time = s.integral(30, 90)
    assert (value_time, weight_time) == pytest.approx((30.0, 60.0))


def test_gpus_weigh_equally_and_merge_per_window():
    s = TimeWeightedSeries(3600)
    for value in (0.2, 0.4, 0.6):
        s.add(0, 10, value)  # three GPUs, one scrape
    assert len(s) == 1
    assert s.integral(0, 10) == pytest.approx((12.0, 30.0))  # OFU GPU-seconds, GPU-seconds
    assert s.mean(0, 10) == pytest.approx(0.4)


def test_explicit_weight():
    s = TimeWeightedSeries(3600)
    s.add(0, 10, 1.0, weight=3)
    s.add(0, 10, 0.0, weight=1)
    assert s.mean(0, 10) == pytest.approx(0.75)


def test_mean_of_an_empty_interval_is_none():
    s = TimeWeightedSeries(3600)
    assert s.mean(0, 10) is None
    s.add(0, 10, 0.5)
    assert s.mean(20, 30) is None
    assert s.mean(10, 20) is None  # touching is not overlapping


def test_rolling_windows_over_a_step_change():
    s = TimeWeightedSeries(3600)
    for k in range(60):  # 10 min at 0.5, then 0.1 from 600 s
        s.add(k * 10, k * 10 + 10, 0.5 if k < 60 else 0.1)
    for k in range(60, 90):
        s.add(k * 10, k * 10 + 10, 0.1)
    now = 900
    assert s.mean(now - 300, now) == pytest.approx(0.1)  # the 5 min window sees only the new level
    assert s.mean(now - 3600, now) == pytest.approx((0.5 * 600 + 0.1 * 300) / 900)  # 1 h: everything so far


def test_retention_evicts_old_segments_and_keeps_enough():
    s = TimeWeightedSeries(100)
    for k in range(50):
        s.add(k * 10, k * 10 + 10, float(k))
    assert len(s) <= 11
    assert s.mean(400, 500) == pytest.approx(sum(range(40, 50)) / 10)
    assert s.first_start == 0  # remembered after eviction: coverage checks need it


def test_out_of_order_segments_are_placed_by_end():
    s = TimeWeightedSeries(3600)
    s.add(20, 30, 0.3)
    s.add(0, 10, 0.1)
    s.add(10, 20, 0.2)
    assert s.mean(0, 15) == pytest.approx(0.1 * 10 / 15 + 0.2 * 5 / 15)
    assert s.latest_end == 30


def test_segment_needs_positive_length():
    with pytest.raises(ValueError):
        TimeWeightedSeries(10).add(5, 5, 0.1)


def test_wasted_gpu_hours_arithmetic():
    t = JobTotals()
    t.add(3600, 0.25, flops_per_s=1e15)  # one GPU hour at 25 %: 0.75 GPU h wasted
    t.add(1800, 0.5)  # half an hour at 50 %, precision unknown
    assert t.gpu_hours == pytest.approx(1.5)
    assert t.wasted_gpu_hours == pytest.approx(0.75 + 0.25)
    assert t.ofu_mean == pytest.approx((0.25 * 3600 + 0.5 * 1800) / 5400)
    assert t.flop == pytest.approx(3.6e18)
    assert t.flop_gpu_seconds == 3600
    assert t.flops_known


def test_waste_is_what_the_loss_parts_lost_and_a_gain_counts_apart():
    """A window above OFU 1 (the SM clock boosting above f_ref: a negative clock part) gains GPU time: counted
    apart, so the waste never falls, and GPU time = useful + wasted - gained
    (docs/method.md#wasted-gpu-hours-and-the-clock-gain)."""
    t = JobTotals()
    t.add(100, 1.02)  # without its parts: 0.02 gained
    t.add(100, 0.4)  # 0.6 lost
    t.add(100, 0.9, shares=(0.1, -0.05, 0.05))  # parts: 0.15 lost, a clock part of -0.05
    assert t.wasted_gpu_seconds == pytest.approx(60 + 15)
    assert t.gained_gpu_seconds == pytest.approx(2 + 5)
    assert t.ofu_gpu_seconds + t.wasted_gpu_seconds - t.gained_gpu_seconds == pytest.approx(t.gpu_seconds)


def test_empty_totals():
    t = JobTotals()
    assert t.ofu_mean is None and not t.flops_known and t.wasted_gpu_hours == 0


def test_histogram_quantiles_weighted_by_time():
    h = WeightedHistogram(width=0.01)
    h.add(0.10, 90)  # 90 s at 10 %
    h.add(0.50, 10)  # 10 s at 50 %
    assert h.total == 100
    assert h.quantile(0.5) == pytest.approx(0.105, abs=0.006)
    assert h.quantile(0.95) == pytest.approx(0.505, abs=0.006)
    assert h.quantile(0.0) == pytest.approx(0.10, abs=0.01)


def test_histogram_clamps_and_rebins():
    h = WeightedHistogram(width=0.001)
    h.add(-0.2, 1)
    h.add(7.0, 1)
    h.add(0.0125, 2)
    h.add(float("nan"), 5)
    h.add(0.3, 0)
    assert h.total == 4
    buckets = [(round(left, 6), w) for left, w in h.buckets(0.01)]
    assert buckets == [(0.0, 1), (0.01, 2), (1.49, 1)]
    assert WeightedHistogram().quantile(0.5) is None


def test_histogram_merge():
    a, b = WeightedHistogram(), WeightedHistogram()
    a.add(0.1, 1)
    b.add(0.3, 3)
    a.merge(b)
    assert a.total == 4 and a.quantile(0.5) == pytest.approx(0.3, abs=0.002)
    with pytest.raises(ValueError):
        a.merge(WeightedHistogram(width=0.01))


def test_segment_start_tiles_consecutive_points():
    assert segment_start(20, 10, 10, 10, 120) == 10
    assert segment_start(50, 20, 10, 10, 120) == 20  # an uneven (30 s) window covers the whole interval


def test_segment_start_first_point_and_gaps():
    assert segment_start(100, None, None, 10, 120) == 90  # the default interval
    assert segment_start(1000, 100, 30, 10, 120) == 970  # after a gap: the last known interval, not the gap
    assert segment_start(100, 100, 10, 10, 120) is None  # duplicate
    assert segment_start(90, 100, 10, 10, 120) is None  # out of order
    assert math.isclose(segment_start(220, 100, 10, 10, 120), 100)  # exactly max_gap is still consecutive


def test_next_data_finds_the_first_covered_time_after_a_gap():
    series = TimeWeightedSeries(retention_s=1e12)
    series.add(0.0, 10.0, 0.5)
    series.add(1e9, 1e9 + 10.0, 0.5)  # decades later
    assert series.next_data(5.0) == 5.0  # inside data: that very time
    assert series.next_data(10.0) == 1e9  # in the gap: where the data resumes
    assert series.next_data(1e9 + 10.0) is None  # past all data
