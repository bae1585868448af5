"""The MFU audit: does a job's self-reported MFU agree with what the hardware saw (OFU)?

Evaluated once per bin on the two means over the same window of the same job. A gap counts
only when it is large both in percentage points and relative to the smaller number, so a
job at 3 % OFU reporting 6 % (2x but 3 pp) and a job at 70 % reporting 78 % (8 pp, 1.11x)
are not findings, while the paper's MoE case (54 % reported, 26 % measured) is. The sign
gives the cause class: reported above measured means the FLOP formula counts work that did
not run; measured far above reported means tensor work the formula leaves out (padding,
activation recomputation). A finding whose job stops reporting MFU closes once a whole window
has passed without a report (reason ``no_mfu_report``): with nothing to compare it says nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from otel_ofu.jobs.aggregate import window_label
from otel_ofu.jobs.findings import (
    CLOSE,
    FLOP_FORMULA_OVERCOUNT,
    MFU_GAP,
    NO_MFU_REPORT,
    OPEN,
    UNCOUNTED_PADDING_OR_RECOMPUTE,
    Finding,
    Transition,
    sustain_bins,
)
from otel_ofu.pipeline.config import Duration, require


@dataclass
class AuditConfig:
    """The MFU audit: a sustained gap between the MFU a job reports and its OFU is a finding
    (kind mfu_gap; docs/audit.md)."""

    enabled: bool = True  # false turns the audit off
    # Both numbers are means over this window (OFU time-weighted over the job's GPUs): long
    # enough to average iteration jitter. An open finding closes when a whole window passes with
    # no MFU report (reason no_mfu_report).
    window: Duration = field(default_factory=lambda: Duration(300))
    # A gap must exceed both thresholds. |MFU - OFU| in percentage points: well above the 1-3 pp
    # raw OFU reads over MFU from padded tiles, clock-sampling noise and non-tensor work.
    min_gap_pp: float = 10.0
    # Larger / smaller: honest jobs show a 6.2 % mean error, 1.3x is five times that, and covers a
    # 60 s stall in a 5 min window (at most 1.25x); the paper's MoE case is 2.1x, Mamba/MoE 1.6x.
    min_ratio: float = 1.3
    # How long the gap must hold before a finding opens (one evaluation per bin): one glitchy
    # report or one evaluation pass never raises one.
    sustain: Duration = field(default_factory=lambda: Duration(300))
    clear_after: Duration = field(default_factory=lambda: Duration(300))  # how long it must be gone before it closes

    def validate(self) -> None:
        require(self.window > 0, "window", "must be positive")
        require(0 < self.min_gap_pp <= 100, "min_gap_pp", f"must be within (0, 100], got {self.min_gap_pp}")
        require(self.min_ratio >= 1, "min_ratio", f"must be >= 1, got {self.min_ratio}")
        require(self.sustain > 0, "sustain", "must be positive")
        require(self.clear_after > 0, "clear_after", "must be positive")


def gap_direction(ofu: float, mfu: float, min_gap_pp: float, min_ratio: float) -> int:
    """+1 when reported MFU is above OFU beyond both thresholds, -1 when below, else 0."""
    gap_pp = (mfu - ofu) * 100.0
    if abs(gap_pp) < min_gap_pp:
        return 0
    low, high = min(ofu, mfu), max(ofu, mfu)
    ratio = high / low if low > 0 else math.inf
    if ratio < min_ratio:
        return 0
    return 1 if gap_pp > 0 else -1


def _numbers(ofu: float, mfu: float, window_s: float) -> dict[str, float | str]:
    low = min(ofu, mfu)
    return {"mfu_reported": mfu, "ofu": ofu, "gap_pp": (mfu - ofu) * 100.0,
            "ratio": (mfu / ofu) if ofu > 0 else math.inf, "window": window_label(window_s),
            "relative_gap": (abs(mfu - ofu) / low) if low > 0 else math.inf}


class MfuAudit:
    """One job's audit state: feed it window means at each bin end, get transitions back."""

    def __init__(self, config: AuditConfig, resolution_s: float):
        self.config = config
        self._open_after = sustain_bins(config.sustain, resolution_s)
        self._close_after = sustain_bins(config.clear_after, resolution_s)
        self._resolution = resolution_s
        self._streak_dir = 0
        self._streak = 0
        self._streak_since = 0.0
        self._clear_streak = 0
        self.open: Finding | None = None

    def observe(self, t: float, ofu: float | None, mfu: float | None,
                last_report: float | None = None) -> list[Transition]:
        """``t`` is the bin end; ``ofu``/``mfu`` the window means (None: not comparable yet);
        ``last_report``: the end of the job's newest MFU report, if it ever sent one."""
        if not self.config.enabled:
            return []
        if mfu is None and last_report is not None and t - last_report >= float(self.config.window) - 1e-9:
            # No report in the whole window: the job stopped reporting (or hung). Nothing is compared,
            # a streak does not carry over the silence, and an open finding closes: it would say no more.
            self._streak, self._streak_dir = 0, 0
            return [self._close_unreported(t, last_report)] if self.open is not None else []
        if ofu is None or mfu is None:
            return []
        cfg = self.config
        direction = gap_direction(ofu, mfu, cfg.min_gap_pp, cfg.min_ratio)
        if self.open is not None:
            same = direction == (1 if self.open.cause == FLOP_FORMULA_OVERCOUNT else -1)
            self._clear_streak = 0 if same else self._clear_streak + 1
            if self._clear_streak < self._close_after:
                return []
            finding, self.open = self.open, None
            finding.closed_at = t
            finding.close_numbers = _numbers(ofu, mfu, cfg.window)
            self._streak = self._clear_streak = 0
            self._streak_dir = 0
            out = [Transition(CLOSE, finding, t)]
            return out + self._track(t, direction, ofu, mfu)
        return self._track(t, direction, ofu, mfu)

    def _close_unreported(self, t: float, last_report: float) -> Transition:
        finding, self.open = self.open, None
        assert finding is not None
        finding.closed_at = t
        finding.close_numbers = {"reason": NO_MFU_REPORT, "no_report_s": t - last_report,
                                 "window": window_label(self.config.window)}
        self._clear_streak = 0
        return Transition(CLOSE, finding, t)

    def _track(self, t: float, direction: int, ofu: float, mfu: float) -> list[Transition]:
        if direction == 0:
            self._streak, self._streak_dir = 0, 0
            return []
        if direction != self._streak_dir:
            # The first window that showed the gap began one window before its evaluation.
            self._streak_dir, self._streak, self._streak_since = direction, 0, t - float(self.config.window)
        self._streak += 1
        if self._streak < self._open_after:
            return []
        cause = FLOP_FORMULA_OVERCOUNT if direction > 0 else UNCOUNTED_PADDING_OR_RECOMPUTE
        self.open = Finding(MFU_GAP, cause, opened_at=t, since=self._streak_since,
                            numbers=_numbers(ofu, mfu, self.config.window))
        self._streak, self._streak_dir, self._clear_streak = 0, 0, 0
        return [Transition(OPEN, self.open, t)]
