"""Regression alarms: a job running well below its own recent level, for long enough.

The detector sees one number per bin (the job's time-weighted OFU over, by default, one
minute). Its baseline is the median of the job's recent accepted bins: a median ignores the
few low bins that checkpoints and evaluation passes leave (a 60 s checkpoint touches at most
two one-minute bins), where a mean would sag. A bin below ``baseline / drop_ratio`` starts a
streak; ``sustain`` of them in a row open a finding, a shorter streak was a dip and its bins
join the history. While a streak runs or a finding is open the baseline is frozen: the slow
bins never become the new normal, so a long regression stays flagged until the job
recovers (``recover_sustain`` bins at or above ``baseline / recover_ratio``).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from otel_ofu.jobs.findings import CLOSE, OPEN, REGRESSION, SUSTAINED_DROP, Finding, Transition, sustain_bins
from otel_ofu.pipeline.config import Duration, require


@dataclass
class RegressionConfig:
    """Regression alarms: a job's OFU falling well below its own recent baseline, and staying
    there, is a finding (kind regression, cause sustained_ofu_drop)."""

    enabled: bool = True  # false turns the alarms off
    # Flag when OFU < baseline / drop_ratio: 1.5 sits below a 2.5x regression and above the
    # swings of healthy jobs (precision phases move OFU by up to ~1.4x).
    drop_ratio: float = 1.5
    # Consecutive bins below that open a finding: longer than checkpoints (60 s) and typical
    # evaluation passes, short enough to flag a regression within ten minutes. Raise it if your
    # evaluation passes run longer.
    sustain: Duration = field(default_factory=lambda: Duration(300))
    # Clear when OFU >= baseline / recover_ratio for recover_sustain: hysteresis, OFU must come
    # back within ~17 % of the baseline, not just above the alarm line.
    recover_ratio: float = 1.2
    recover_sustain: Duration = field(default_factory=lambda: Duration(180))  # one good minute is no recovery
    # The baseline is the median of this much accepted history (two checkpoint cycles; adapts to
    # deliberate changes within half an hour) ...
    baseline_window: Duration = field(default_factory=lambda: Duration(1800))
    # ... and needs at least this much before anything can be flagged (a job settling:
    # compilation, data loading).
    warmup: Duration = field(default_factory=lambda: Duration(600))
    # Below this baseline OFU a job is idle-ish: ratios mean nothing there.
    min_baseline: float = 0.05

    def validate(self) -> None:
        require(self.drop_ratio > 1, "drop_ratio", f"must be > 1, got {self.drop_ratio}")
        require(1 <= self.recover_ratio < self.drop_ratio, "recover_ratio",
                f"must be within [1, drop_ratio={self.drop_ratio}), got {self.recover_ratio}")
        require(self.sustain > 0, "sustain", "must be positive")
        require(self.recover_sustain > 0, "recover_sustain", "must be positive")
        require(self.baseline_window > 0, "baseline_window", "must be positive")
        require(0 < self.warmup <= self.baseline_window, "warmup", "must be positive and at most baseline_window")
        require(0 <= self.min_baseline < 1, "min_baseline", f"must be within [0, 1), got {self.min_baseline}")


class RegressionDetector:
    """One job's regression state: feed it one OFU value per bin, get transitions back."""

    def __init__(self, config: RegressionConfig, resolution_s: float):
        self.config = config
        self._resolution = resolution_s
        self._open_after = sustain_bins(config.sustain, resolution_s)
        self._close_after = sustain_bins(config.recover_sustain, resolution_s)
        self._warmup = sustain_bins(config.warmup, resolution_s)
        self.history: deque[float] = deque(maxlen=sustain_bins(config.baseline_window, resolution_s))
        self._pending: list[tuple[float, float]] = []  # (bin end, value): a low streak not yet decided
        self._recovering: list[float] = []
        self.open: Finding | None = None

    @property
    def baseline(self) -> float | None:
        """The median of accepted history (frozen while a finding is open); None during warm-up."""
        if self.open is not None:
            return float(self.open.numbers["baseline"])
        if len(self.history) < self._warmup:
            return None
        return statistics.median(self.history)

    def observe(self, t: float, value: float) -> list[Transition]:
        """``t`` is the bin end, ``value`` the job's OFU over the bin."""
        if not self.config.enabled:
            return []
        if self.open is not None:
            return self._while_open(t, value)
        baseline = self.baseline
        if baseline is None or baseline < self.config.min_baseline or value >= baseline / self.config.drop_ratio:
            self._accept_pending()
            self.history.append(value)
            return []
        self._pending.append((t, value))
        if len(self._pending) < self._open_after:
            return []
        # The median of the slow bins: the first one is often partly before the drop.
        low = statistics.median(v for _, v in self._pending)
        self.open = Finding(REGRESSION, SUSTAINED_DROP, opened_at=t, since=self._pending[0][0] - self._resolution,
                            numbers={"baseline": baseline, "ofu": low,
                                     "ratio": baseline / low if low > 0 else float("inf")})
        self._pending = []  # the slow bins never join the baseline
        self._recovering = []
        return [Transition(OPEN, self.open, t)]

    def _accept_pending(self) -> None:
        """A low streak that ended before ``sustain``: a dip (checkpoint, eval), part of normal life."""
        self.history.extend(v for _, v in self._pending)
        self._pending = []

    def _while_open(self, t: float, value: float) -> list[Transition]:
        assert self.open is not None
        baseline = float(self.open.numbers["baseline"])
        if value < baseline / self.config.recover_ratio:
            self._recovering = []
            return []
        self._recovering.append(value)
        if len(self._recovering) < self._close_after:
            return []
        finding, self.open = self.open, None
        recovered = statistics.median(self._recovering)
        finding.closed_at = t
        finding.close_numbers = {"baseline": baseline, "ofu": recovered,
                                 "ratio": baseline / recovered if recovered > 0 else float("inf")}
        self.history.extend(self._recovering)
        self._recovering = []
        return [Transition(CLOSE, finding, t)]
