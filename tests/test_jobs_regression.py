"""Regression alarms on per-minute OFU: 2.5x flagged fast, dips ignored, recovery, frozen baseline."""

import pytest

from otel_ofu.jobs.findings import CLOSE, OPEN, REGRESSION, SUSTAINED_DROP
from otel_ofu.jobs.regression import RegressionConfig, RegressionDetector
from otel_ofu.pipeline.config import FieldError, build_config

MIN = 60.0


def run(values, config=None):
    """Feed one value per minute (bin ends at 1, 2, ... min); return the detector and its transitions."""
    detector = RegressionDetector(config or RegressionConfig(), MIN)
    transitions = []
    for i, value in enumerate(values):
        transitions += detector.observe((i + 1) * MIN, value)
    return detector, transitions


def checkpointing(minutes, level=0.45):
    """A 60 s checkpoint every 15 min, landing across two one-minute bins as the sim's does."""
    out = []
    for m in range(minutes):
        phase = m % 15
        out.append(level * 0.18 if phase == 14 else level * 0.85 if phase == 0 and m else level)
    return out


def test_a_2_5x_regression_is_flagged_within_ten_minutes():
    values = [0.48] * 20 + [0.48 / 2.5] * 30
    detector, transitions = run(values)
    (opened,) = [t for t in transitions if t.action == OPEN]
    assert (opened.finding.kind, opened.finding.cause) == (REGRESSION, SUSTAINED_DROP)
    assert opened.time - 20 * MIN <= 10 * MIN
    assert opened.finding.since == 20 * MIN
    assert opened.finding.numbers["baseline"] == pytest.approx(0.48)
    assert opened.finding.numbers["ratio"] == pytest.approx(2.5)


def test_a_regression_whose_first_bin_is_partial():
    values = [0.48] * 20 + [0.30] + [0.192] * 20  # the drop starts mid-bin
    _, transitions = run(values)
    (opened,) = transitions
    assert opened.time == 25 * MIN
    assert opened.finding.numbers["ofu"] == pytest.approx(0.192)  # the median of the slow bins


def test_checkpoint_dips_are_not_flagged():
    _, transitions = run(checkpointing(180))
    assert transitions == []


def test_an_evaluation_pass_shorter_than_sustain_is_not_flagged():
    values = [0.45] * 30 + [0.05] * 4 + [0.45] * 30
    detector, transitions = run(values)
    assert transitions == []
    assert detector.baseline == pytest.approx(0.45)  # the dip joined the history, the median ignores it


def test_a_drop_smaller_than_drop_ratio_is_not_flagged():
    _, transitions = run([0.45] * 20 + [0.45 / 1.4] * 60)
    assert transitions == []


def test_recovery_clears_it():
    values = [0.48] * 20 + [0.192] * 30 + [0.48] * 10
    _, transitions = run(values)
    assert [t.action for t in transitions] == [OPEN, CLOSE]
    closed = transitions[1]
    assert closed.time == (50 + 3) * MIN  # recover_sustain: 3 bins at or above baseline / 1.2
    assert closed.finding.closed_at == closed.time
    assert closed.finding.close_numbers["ofu"] == pytest.approx(0.48)


def test_a_partial_recovery_does_not_clear():
    values = [0.48] * 20 + [0.192] * 10 + [0.34] * 20  # 0.34 < 0.48 / 1.2
    detector, transitions = run(values)
    assert [t.action for t in transitions] == [OPEN]
    assert detector.open is not None


def test_baseline_is_frozen_during_a_finding():
    # A regression longer than the baseline window: an unfrozen median would adopt the slow level.
    values = [0.48] * 20 + [0.192] * 90
    detector, transitions = run(values)
    assert [t.action for t in transitions] == [OPEN]
    assert detector.baseline == pytest.approx(0.48)
    assert all(v == 0.48 for v in detector.history)  # the slow bins never joined the history


def test_after_recovery_the_slow_bins_are_not_in_the_history():
    values = [0.48] * 20 + [0.192] * 30 + [0.48] * 10
    detector, _ = run(values)
    assert min(detector.history) == 0.48


def test_nothing_during_warmup_or_on_idle_baselines():
    detector, transitions = run([0.48] * 3 + [0.1] * 30, RegressionConfig(warmup=600))
    assert transitions == []  # it settled within the warm-up: the settled level is the job's normal
    assert detector.baseline == pytest.approx(0.1)
    detector, _ = run([0.48] * 9)
    assert detector.baseline is None  # 9 of 10 warm-up minutes
    _, transitions = run([0.03] * 20 + [0.001] * 20)
    assert transitions == []  # baseline below min_baseline


def test_thresholds_are_configurable():
    config = RegressionConfig(drop_ratio=1.2, recover_ratio=1.05, sustain=120, warmup=300)
    _, transitions = run([0.45] * 10 + [0.35] * 3, config)
    assert [t.action for t in transitions] == [OPEN] and transitions[0].time == 12 * MIN


def test_disabled():
    _, transitions = run([0.48] * 20 + [0.1] * 30, RegressionConfig(enabled=False))
    assert transitions == []


def test_config_validation():
    with pytest.raises(FieldError, match="recover_ratio"):
        build_config(RegressionConfig, {"drop_ratio": 1.5, "recover_ratio": 1.6})
    with pytest.raises(FieldError, match="drop_ratio"):
        build_config(RegressionConfig, {"drop_ratio": 1.0})
    with pytest.raises(FieldError, match="warmup"):
        build_config(RegressionConfig, {"warmup": "1h", "baseline_window": "30m"})
    cfg = build_config(RegressionConfig, {"sustain": "3m", "baseline_window": "1h"})
    assert (cfg.sustain, cfg.baseline_window) == (180, 3600)
