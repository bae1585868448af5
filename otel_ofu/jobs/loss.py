"""A job's loss account over time: each GPU window's parts, GPU-time weighted, by bin and over its life.

The ``ofu`` processor emits one ``gpu.ofu.loss`` point per part beside each ``gpu.ofu``
(:mod:`otel_ofu.core.loss`); :func:`window_parts` pairs them up again by GPU and window. A job
adds each window's parts for the window's GPU time (:class:`LossBins`, split at bin edges like
its OFU), so over any interval its parts and its OFU still add up to 1. A window whose loss
points did not come (a source or agent without them) counts as the part ``unknown``
(core.loss.UNACCOUNTED): lost, where to is not known; never zero. The fleet's account adds the GPU time of no job as
``unallocated``.

Pure: the jobs processor and the report both use it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from otel_ofu.core.loss import CLOCK, UNACCOUNTED, USEFUL, LossTotals, advice, part_title
from otel_ofu.core.model import LOSS_CAUSE, LOSS_PART, Attributes, MetricPoint
from otel_ofu.jobs.aggregate import bin_pieces
from otel_ofu.pipeline.caches import Cache

LOSS_METRIC = "gpu.ofu.loss"

# (part, share) pairs and part -> cause; a part split by cause (the clock by its reasons' throttled time,
# core.loss.split_clock) is one pair, its shares' sum, and its causes ((cause, share), ...).
Parts = tuple[tuple[tuple[str, float], ...], dict[str, str | tuple[tuple[str, float], ...]]]

_PART_OF = Cache("jobs loss attributes", 4096)  # id(attributes) -> (attributes, part, cause)


def _part_of(attributes: Attributes) -> tuple[str | None, str | None]:
    """A gpu.ofu.loss point's part and cause, worked out once per attribute tuple (a GPU's are the same objects)."""
    found = _PART_OF.get(id(attributes))
    if found is not None and found[0] is attributes:
        return found[1], found[2]
    part = cause = None
    for key, value in attributes:
        if key == LOSS_PART:
            part = str(value)
        elif key == LOSS_CAUSE:
            cause = str(value)
    _PART_OF.put(id(attributes), (attributes, part, cause))
    return part, cause


def window_parts(points: Iterable[MetricPoint]) -> dict[tuple[Attributes, int], Parts]:
    """The loss parts of each GPU window in a batch, by (resource, time), as its gpu.ofu point has them; a part
    that comes as several points (the clock split by cause) is one part holding its causes' shares."""
    found: dict[tuple[Attributes, int], tuple[list[tuple[str, float]], dict[str, Any]]] = {}
    split: dict[tuple[Attributes, int], dict[str, list[tuple[str, float]]]] = {}
    for point in points:
        if point.name != LOSS_METRIC or not math.isfinite(point.value):
            continue
        part, cause = _part_of(point.attributes)
        if part is None:
            continue
        key = (point.resource, point.time_unix_nano)
        entry = found.get(key)
        if entry is None:
            entry = found[key] = ([], {})
        if cause is not None and part in entry[1]:  # a part again, with another cause: a split part
            causes = split.setdefault(key, {})
            if part not in causes:
                causes[part] = [(entry[1][part], next(v for p, v in entry[0] if p == part))]
            causes[part].append((cause, point.value))
            continue
        entry[0].append((part, point.value))
        if cause is not None:
            entry[1][part] = cause
    for key, by_part in split.items():
        parts, causes = found[key]
        for part, shares in by_part.items():
            causes[part] = tuple(shares)
            parts[:] = [(p, math.fsum(v for _, v in shares) if p == part else v) for p, v in parts]
    return {key: (tuple(parts), causes) for key, (parts, causes) in found.items()}


def window_account(parts: Parts | None, ofu: float) -> Parts:
    """A GPU window's parts as an account counts them: its own, or ``unknown`` (1 - OFU) when it came without
    them. OFU above 1 is only ever the SM clock above f_ref (TPA and the tile factor are at most 1), so such a
    window without its parts gained at least OFU - 1 on the clock: counted as that, nothing unknown."""
    if parts is not None:
        return parts
    if ofu > 1.0:
        return ((UNACCOUNTED, 0.0), (CLOCK, 1.0 - ofu)), {}
    return ((UNACCOUNTED, 1.0 - ofu),), {}


def add_window(totals: LossTotals, parts: Parts | None, ofu: float, seconds: float) -> None:
    """One GPU window into an account: its parts, or ``unknown`` when it came without them (window_account)."""
    counted = window_account(parts, ofu)
    totals.add_parts(counted[0], ofu, seconds, counted[1])


def window_shares(parts: Parts | None, ofu: float) -> tuple[float, ...]:
    """A GPU window's parts' shares as :func:`add_window` counts them: what a job's wasted GPU-hours (those above
    0) and gained ones (below 0) add (jobs.aggregate.JobTotals.add)."""
    return tuple(share for _, share in window_account(parts, ofu)[0])


class LossBins:
    """A job's account per bin of ``resolution`` seconds, kept ``retention_s``: windows and rolling means.

    Each GPU window is split at bin edges by its overlap, so the account over an interval made
    of whole bins is exact; a partial bin at an interval's start counts by its overlapping share.
    """

    def __init__(self, resolution: float, retention_s: float):
        self.resolution = resolution
        self._keep = max(1, math.ceil(retention_s / resolution) + 2)
        self.bins: dict[int, LossTotals] = {}

    def add(self, start: float, end: float, parts: Parts | None, ofu: float, weight: float = 1.0) -> None:
        """One window, split at bin edges."""
        for k, overlap in bin_pieces(start, end, self.resolution):
            add_window(self.bin(k), parts, ofu, overlap * weight)
        self.evict()

    def bin(self, k: int) -> LossTotals:
        """Bin ``k``'s account (a new one when it had none)."""
        totals = self.bins.get(k)
        if totals is None:
            totals = self.bins[k] = LossTotals()
        return totals

    def evict(self, keep_from: int | None = None) -> None:
        """Forget the bins older than the retention (behind the newest), except from ``keep_from`` on."""
        if len(self.bins) > self._keep:
            cutoff = max(self.bins) - self._keep
            if keep_from is not None:
                cutoff = min(cutoff, keep_from - 1)
            for k in [k for k in self.bins if k <= cutoff]:
                del self.bins[k]

    def between(self, a: float, b: float) -> LossTotals:
        """The account of [a, b] (bins overlapping it; a bin cut by the interval counts by its share)."""
        out = LossTotals()
        res = self.resolution
        for k, totals in self.bins.items():
            overlap = min(b, (k + 1) * res) - max(a, k * res)
            if overlap <= 0:
                continue
            out.merge(totals, overlap / res if overlap < res - 1e-9 else 1.0)
        return out


def grown_part(before: LossTotals, during: LossTotals) -> tuple[str, float, float] | None:
    """The loss part whose share grew most from ``before`` to ``during``, with both shares: what a regression did."""
    old, new = before.shares(), during.shares()
    growth = {part: share - old.get(part, 0.0) for part, share in new.items() if part != USEFUL}
    if not growth:
        return None
    part = max(growth, key=growth.__getitem__)
    if growth[part] <= 0:
        return None
    return part, old.get(part, 0.0), new[part]


def growth_text(numbers: dict[str, Any]) -> str:
    """From a finding's numbers: ``engine idle grew from 6% to 58%: the input pipeline or the host, ...``."""
    part = numbers.get("grew")
    if not isinstance(part, str):
        return ""
    cause = numbers.get("grew_cause")
    why = advice(part, cause if isinstance(cause, str) else None).split(":")[0]
    return (f"{part_title(part)} grew from {float(numbers['grew_from']):.0%} to {float(numbers['grew_to']):.0%}"
            f"{f' ({cause})' if isinstance(cause, str) else ''}: {why}")
