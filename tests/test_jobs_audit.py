"""The MFU audit: thresholds both ways, sustain, clearing, cause classes."""

import pytest

from otel_ofu.jobs.audit import AuditConfig, MfuAudit, gap_direction
from otel_ofu.jobs.findings import CLOSE, FLOP_FORMULA_OVERCOUNT, MFU_GAP, OPEN, UNCOUNTED_PADDING_OR_RECOMPUTE
from otel_ofu.pipeline.config import FieldError, build_config


def feed(audit, pairs, start=300.0, step=60.0):
    out = []
    for i, (ofu, mfu) in enumerate(pairs):
        out += audit.observe(start + i * step, ofu, mfu)
    return out


@pytest.mark.parametrize("ofu, mfu, expected", [
    (0.2558, 0.5427, 1),  # the paper's MoE case: reported far above measured
    (0.45, 0.30, -1),  # measured far above reported: uncounted work
    (0.03, 0.06, 0),  # 2x but only 3 pp: too small to matter
    (0.70, 0.78, 0),  # 8 pp: below the absolute threshold
    (0.60, 0.72, 0),  # 12 pp but only 1.2x: below the relative threshold
    (0.40, 0.52, 1),  # 12 pp and 1.3x: both thresholds met
    (0.0, 0.15, 1),  # nothing measured, 15 pp reported
    (0.45, 0.45, 0),
])
def test_gap_direction_needs_both_thresholds(ofu, mfu, expected):
    assert gap_direction(ofu, mfu, min_gap_pp=10, min_ratio=1.3) == expected


def test_thresholds_are_configurable():
    assert gap_direction(0.70, 0.78, min_gap_pp=5, min_ratio=1.1) == 1
    assert gap_direction(0.2558, 0.5427, min_gap_pp=30, min_ratio=1.3) == 0
    assert gap_direction(0.2558, 0.5427, min_gap_pp=10, min_ratio=2.5) == 0


def test_overcount_opens_after_sustain_with_both_numbers():
    audit = MfuAudit(AuditConfig(sustain=300), 60)
    transitions = feed(audit, [(0.26, 0.55)] * 4)
    assert transitions == [] and audit.open is None  # four evaluations: not yet sustained
    transitions = feed(audit, [(0.26, 0.55)], start=540)
    assert [t.action for t in transitions] == [OPEN]
    f = transitions[0].finding
    assert (f.kind, f.cause) == (MFU_GAP, FLOP_FORMULA_OVERCOUNT)
    assert f.numbers["mfu_reported"] == 0.55 and f.numbers["ofu"] == 0.26
    assert f.numbers["gap_pp"] == pytest.approx(29.0)
    assert f.numbers["window"] == "5m"
    assert f.opened_at == 540 and f.since == 0  # the first window showing it began at 0


def test_uncounted_work_cause():
    audit = MfuAudit(AuditConfig(sustain=120), 60)
    (t,) = feed(audit, [(0.50, 0.30)] * 2)
    assert t.finding.cause == UNCOUNTED_PADDING_OR_RECOMPUTE
    assert t.finding.numbers["gap_pp"] == pytest.approx(-20.0)


def test_interrupted_streak_does_not_open():
    audit = MfuAudit(AuditConfig(sustain=300), 60)
    assert feed(audit, [(0.26, 0.55)] * 4 + [(0.45, 0.46)] + [(0.26, 0.55)] * 4) == []


def test_direction_flip_restarts_the_streak():
    audit = MfuAudit(AuditConfig(sustain=180), 60)
    assert feed(audit, [(0.26, 0.55)] * 2 + [(0.55, 0.26)] * 2) == []
    (t,) = feed(audit, [(0.55, 0.26)], start=600)
    assert t.finding.cause == UNCOUNTED_PADDING_OR_RECOMPUTE


def test_clears_after_clear_after_of_agreement():
    audit = MfuAudit(AuditConfig(sustain=60, clear_after=180), 60)
    assert [t.action for t in feed(audit, [(0.26, 0.55)])] == [OPEN]
    assert feed(audit, [(0.45, 0.46)] * 2, start=400) == []
    (t,) = feed(audit, [(0.45, 0.46)], start=600)
    assert t.action == CLOSE and t.finding.closed_at == 600
    assert t.finding.close_numbers["ofu"] == 0.45
    assert audit.open is None


def test_a_short_agreement_does_not_clear():
    audit = MfuAudit(AuditConfig(sustain=60, clear_after=180), 60)
    feed(audit, [(0.26, 0.55)])
    assert feed(audit, [(0.45, 0.46)] * 2 + [(0.26, 0.55)] + [(0.45, 0.46)] * 2, start=400) == []
    assert audit.open is not None


def test_not_comparable_yet_or_disabled():
    audit = MfuAudit(AuditConfig(sustain=60), 60)
    assert audit.observe(60, None, 0.5) == [] and audit.observe(120, 0.2, None) == []
    disabled = MfuAudit(AuditConfig(enabled=False, sustain=60), 60)
    assert feed(disabled, [(0.1, 0.9)] * 10) == []


def test_config_validation():
    cfg = build_config(AuditConfig, {"window": "10m", "min_gap_pp": 5, "min_ratio": 1.5, "sustain": "2m"})
    assert (cfg.window, cfg.sustain) == (600, 120)
    with pytest.raises(FieldError, match="min_ratio"):
        build_config(AuditConfig, {"min_ratio": 0.9})
    with pytest.raises(FieldError, match="min_gap_pp"):
        build_config(AuditConfig, {"min_gap_pp": 0})
