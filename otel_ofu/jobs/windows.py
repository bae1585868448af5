"""Which part of a GPU's time a point covers, so that no GPU time is counted twice or lost.

Each ``gpu.ofu`` point stands for the window since the same GPU's previous point. A jobs-tier
instance sees a GPU's points for one job (a *series*: GPU and job) only, routed there by job,
and in any order: a retried request arrives after newer ones, the gateway's two lanes (points
with a job, points without) overtake each other. So each series keeps the time its points
have covered (:class:`SeriesWindows`), and a point counts only the part of its window no
earlier point covered:

- a point that says its window (``start_time_unix_nano``: the ``ofu`` processor sets it on a
  GPU's first point after its job or pod changed, the previous sample's time) covers that
  window. That is what keeps a GPU that leaves a job and comes back within ``max_gap`` from
  being counted for that job while it ran another one, on another instance;
- otherwise a point continues the covered time before it when that ended at most ``max_gap``
  earlier (a lost scrape is still the job's time), else covers the series' last interval
  (``default_interval`` for a series' first point): a gap is not GPU time we saw.

Pure; the covered time is kept ``keep`` seconds behind the series' newest point, and anything
older counts as covered (a point that late is refused as out of order).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class SeriesWindows:
    """The time one series' points have covered: disjoint ``[start, end]`` pairs, sorted, flat."""

    covered: list[float] = field(default_factory=list)  # [start0, end0, start1, end1, ...]
    # Its points' usual interval: the shorter of its last two in-order windows (one that spans a
    # lost scrape is longer than the interval); None before its first point.
    interval: float | None = None
    last_window: float | None = None

    @property
    def end(self) -> float:
        """The end of the newest covered time (``-inf`` when none)."""
        return self.covered[-1] if self.covered else -math.inf

    def forget_position(self) -> None:
        """Its host's clock started over (stepped back): what it covered is in another time."""
        self.covered = []


def take(series: SeriesWindows, t: float, own_start: float | None, default_interval: float, max_gap: float,
         keep: float) -> tuple[float, float] | None:
    """The part of the window of a point at ``t`` that the series had not covered, now covered; None
    when it covered all of it already (a duplicate, or a point out of order whose time was counted).

    ``own_start``: where the point says its window began, if it says so. A window may span
    covered time only in the past (out of order): then what it counts is the uncovered time
    right before the covered part it ends in, or right before ``t``.
    """
    covered = series.covered
    end = covered[-1] if covered else -math.inf
    if t > end:  # in order: the usual case
        if own_start is not None:
            start = max(own_start, end)
        elif t - end <= max_gap:
            start = end
        else:
            start = t - (series.interval or default_interval)
        if not t > start:
            return None
        if covered and start <= end:
            covered[-1] = t
        else:
            covered += (start, t)
        length = t - start
        series.interval = length if series.last_window is None else min(length, series.last_window)
        series.last_window = length
        cutoff = t - keep
        if (covered[0] != -math.inf and covered[0] < cutoff) or (len(covered) > 2 and covered[1] < cutoff):
            _forget_before(covered, cutoff)
        return start, t
    # Out of order: count only time no point covered, up to t or to the covered part t lies in.
    i = bisect.bisect_left(covered, t)  # covered[i - 1] < t <= covered[i]
    if i % 2 == 1:  # t lies in covered time, after the start of that part (covered[i - 1])
        if own_start is None:
            return None  # a window reaching t from its previous point: counted already
        stop, previous_end = covered[i - 1], (covered[i - 2] if i >= 3 else None)
    else:
        stop, previous_end = t, (covered[i - 1] if i >= 2 else None)
    if own_start is not None:
        start = own_start
    elif previous_end is not None and t - previous_end <= max_gap:
        start = previous_end
    elif previous_end is not None:  # after a gap, as in order
        start = t - (series.interval or default_interval)
    else:  # before all it covered: as a series' first point (its interval may span time before the series)
        start = t - default_interval
    if previous_end is not None:
        start = max(start, previous_end)
    if not stop > start:
        return None
    _cover(covered, start, stop)
    return start, stop


def _pairs(covered: list[float]) -> list[tuple[float, float]]:
    return list(zip(covered[::2], covered[1::2]))


def _flat(pairs: list[tuple[float, float]]) -> list[float]:
    """Sorted pairs -> the flat list, touching or overlapping pairs merged."""
    out: list[float] = []
    for start, end in pairs:
        if out and start <= out[-1]:
            out[-1] = max(out[-1], end)
        else:
            out += (start, end)
    return out


def _cover(covered: list[float], start: float, end: float) -> None:
    """Add ``[start, end]`` to the covered time (out of order: rare, and the list is short)."""
    covered[:] = _flat(sorted([*_pairs(covered), (start, end)]))


def _forget_before(covered: list[float], cutoff: float) -> None:
    """All time before ``cutoff`` counts as covered from now on: the covered parts that end before it (not
    the newest) merge into one from ``-inf``, and so does the oldest part when it starts before it."""
    pairs = _pairs(covered)
    old = 0
    while old < len(pairs) - 1 and pairs[old][1] < cutoff:
        old += 1
    if old:
        pairs[:old] = [(-math.inf, pairs[old - 1][1])]
    elif pairs[0][0] < cutoff:
        pairs[0] = (-math.inf, pairs[0][1])
    covered[:] = _flat(pairs)
