"""Time-weighted aggregation: pure arithmetic over (start, end, value) segments.

Each GPU window is a segment [start, end] carrying one OFU value. A job's OFU over an
interval is the GPU-time-weighted mean of the segments' overlap with it. Weighting by time
rather than counting points keeps the mean right when windows are uneven (a 30 s scrape
counts three times a 10 s one) and when a window straddles the interval's edge.

Every sum is exact (core.exact) or taken with ``math.fsum``: the same windows give the same
bits in whatever order they arrived, so a window the processor emits again (after a restart,
a retried request) carries the value it had (docs/reliability.md, "Restarts").
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from otel_ofu.core.exact import SCALE, UNSCALE, exact, to_float


def window_label(seconds: float) -> str:
    """A window's attribute value: 300 -> "5m", 3600 -> "1h", 90 -> "90s", 5400 -> "90m"."""
    s = round(seconds)
    if s <= 0 or abs(s - seconds) > 1e-9:
        return f"{seconds:g}s"
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"


@dataclass(slots=True)
class _Segment:
    start: float
    end: float
    weight_count: int  # GPUs (1 per GPU window), or 1 for a job-level series such as reported MFU: exact
    weighted_count: int  # sum of value x weight: exact
    weight: float  # the two read back (core.exact.to_float)
    weighted: float


class TimeWeightedSeries:
    """Segments kept ``retention_s`` behind the newest end; integrals and means over any interval.

    Segments with the same (start, end) merge, so the GPUs of one scrape cost one entry.
    """

    def __init__(self, retention_s: float):
        if retention_s <= 0:
            raise ValueError("retention must be positive")
        self.retention_s = retention_s
        self._segments: list[_Segment] = []  # sorted by end
        self._by_key: dict[tuple[float, float], _Segment] = {}
        self.first_start = math.inf
        self.latest_end = -math.inf

    def __len__(self) -> int:
        return len(self._segments)

    def __getstate__(self) -> dict:
        """For the jobs state on disk: the segments' times as one packed float array and their sums as
        one list of integers, not an object each.

        Why: an hour of a large job is hundreds of thousands of segments; pickling them as
        objects made a checkpoint cost seconds.
        """
        state = dict(self.__dict__)
        del state["_by_key"]
        state["_segments"] = array("d", [x for s in self._segments for x in (s.start, s.end)]).tobytes()
        state["_counts"] = [x for s in self._segments for x in (s.weight_count, s.weighted_count)]
        return state

    def __setstate__(self, state: dict) -> None:
        packed = array("d")
        packed.frombytes(state.pop("_segments"))
        counts = iter(state.pop("_counts"))
        self.__dict__.update(state)
        times = iter(packed)
        self._segments = [_Segment(start, end, weight, weighted, to_float(weight), to_float(weighted))
                          for start, end, weight, weighted in zip(times, times, counts, counts)]
        self._by_key = {(s.start, s.end): s for s in self._segments}

    def add(self, start: float, end: float, value: float, weight: float = 1.0) -> None:
        if not end > start:
            raise ValueError(f"a segment needs end > start, got [{start}, {end}]")
        key = (start, end)
        segment = self._by_key.get(key)
        try:  # core.exact.exact, inline
            weight_count, weighted_count = int(weight * SCALE), int(value * weight * SCALE)
        except (OverflowError, ValueError):
            weight_count, weighted_count = exact(weight), exact(value * weight)
        if segment is not None:
            segment.weight_count += weight_count
            segment.weighted_count += weighted_count
            try:  # core.exact.to_float, inline
                segment.weight, segment.weighted = segment.weight_count * UNSCALE, segment.weighted_count * UNSCALE
            except OverflowError:
                segment.weight, segment.weighted = to_float(segment.weight_count), to_float(segment.weighted_count)
        else:
            segment = _Segment(start, end, weight_count, weighted_count, to_float(weight_count),
                               to_float(weighted_count))
            self._by_key[key] = segment
            bisect.insort(self._segments, segment, key=lambda s: s.end)
        self.first_start = min(self.first_start, start)
        if end > self.latest_end:
            self.latest_end = end
            self._evict()

    def _evict(self) -> None:
        cutoff = self.latest_end - self.retention_s
        k = bisect.bisect_right(self._segments, cutoff, key=lambda s: s.end)
        if k:
            for segment in self._segments[:k]:
                del self._by_key[(segment.start, segment.end)]
            del self._segments[:k]

    def integral(self, a: float, b: float) -> tuple[float, float]:
        """(integral of value x weight dt, integral of weight dt) over [a, b].

        For OFU: (OFU GPU-seconds, GPU-seconds). For FLOP/s with weight 1: (FLOP, GPU-seconds).
        Summed with ``math.fsum``: the same in any order of the segments (those ending together
        are kept in the order they came).
        """
        value_times: list[float] = []
        weight_times: list[float] = []
        i = bisect.bisect_right(self._segments, a, key=lambda s: s.end)
        for segment in self._segments[i:]:
            overlap = min(segment.end, b) - max(segment.start, a)
            if overlap <= 0:
                continue
            value_times.append(segment.weighted * overlap)
            weight_times.append(segment.weight * overlap)
        return math.fsum(value_times), math.fsum(weight_times)

    def next_data(self, t: float) -> float | None:
        """The earliest time at or after ``t`` that a segment covers; None when none reaches past ``t``.

        Why: a job's evaluation walks its time bins; across a gap in its data (a point stamped
        decades early, a long pause) it jumps to the next data instead of visiting every bin.
        """
        i = bisect.bisect_right(self._segments, t, key=lambda s: s.end)
        return min((max(s.start, t) for s in self._segments[i:]), default=None)

    def mean(self, a: float, b: float) -> float | None:
        """The weight-and-time-weighted mean over [a, b]; None when nothing overlaps it."""
        value_time, weight_time = self.integral(a, b)
        return value_time / weight_time if weight_time > 0 else None


class WeightedHistogram:
    """Values weighted by time in fixed-width buckets: bounded memory, quantiles to a bucket.

    Values outside [low, high) are clamped to the edge buckets. The weights are exact sums (core.exact).
    """

    def __init__(self, width: float = 0.001, low: float = 0.0, high: float = 1.5):
        if width <= 0 or high <= low:
            raise ValueError("need width > 0 and high > low")
        self.width, self.low, self.high = width, low, high
        self._last = int(round((high - low) / width)) - 1
        self._weights: dict[int, int] = {}  # bucket -> exact weight
        self.exact_total = 0

    @property
    def total(self) -> float:
        return to_float(self.exact_total)

    def add(self, value: float, weight: float) -> None:
        if weight <= 0 or math.isnan(value):
            return
        position = (value - self.low) / self.width + 1e-9
        if not math.isfinite(position):  # a huge value (1e308) overflows: it falls in an edge bin (found fuzzing)
            position = 0.0 if position < 0 else float(self._last)
        index = min(self._last, max(0, math.floor(position)))
        count = exact(weight)
        self._weights[index] = self._weights.get(index, 0) + count
        self.exact_total += count

    def merge(self, other: WeightedHistogram) -> None:
        if (other.width, other.low, other.high) != (self.width, self.low, self.high):
            raise ValueError("histograms differ in their buckets")
        for index, count in other._weights.items():
            self._weights[index] = self._weights.get(index, 0) + count
        self.exact_total += other.exact_total

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0..1), interpolated linearly inside its bucket; None when empty."""
        if not 0 <= q <= 1:
            raise ValueError("q must be within [0, 1]")
        if self.exact_total <= 0:
            return None
        target = exact(q * self.total)
        cumulative = 0
        for index in sorted(self._weights):
            count = self._weights[index]
            if cumulative + count >= target and count > 0:
                inside = to_float(target - cumulative) / to_float(count)
                return self.low + (index + inside) * self.width
            cumulative += count
        return self.low + (max(self._weights) + 1) * self.width

    def buckets(self, width: float | None = None) -> list[tuple[float, float]]:
        """(left edge, weight) per non-empty bucket, re-binned to ``width`` (a multiple of ours)."""
        factor = max(1, round((width or self.width) / self.width))
        out: dict[int, int] = {}
        for index, count in self._weights.items():
            out[index // factor] = out.get(index // factor, 0) + count
        return [(self.low + k * factor * self.width, to_float(w)) for k, w in sorted(out.items())]


@dataclass
class JobTotals:
    """A job's life so far: GPU time, OFU x GPU time, waste, gain and FLOPs, as exact sums (core.exact): the same
    windows give the same bits in any order, and :meth:`merge` with sign -1 takes some out again exactly.

    GPU time = OFU x GPU time (useful) + wasted - gained, and each only grows: they make cumulative
    counters (docs/method.md#wasted-gpu-hours-and-the-clock-gain).
    """

    exact_gpu_seconds: int = 0
    exact_ofu_gpu_seconds: int = 0
    exact_wasted_gpu_seconds: int = 0  # what the windows' loss parts lost: their parts above 0
    exact_flop: int = 0
    exact_flop_gpu_seconds: int = 0  # the GPU time whose FLOPs are known (precision known)
    exact_gained_gpu_seconds: int = 0  # what they gained: their parts below 0 (the SM clock boosting above f_ref)
    exact_energy: int = 0  # J, of the windows whose energy is known (gpu.energy)
    exact_energy_gpu_seconds: int = 0  # the GPU time whose energy is known
    # The energy and the FLOPs of the windows where both are known: their ratio is J per useful FLOP.
    exact_energy_of_flop: int = 0
    exact_flop_of_energy: int = 0

    def add(self, seconds: float, ofu: float, flops_per_s: float | None = None,
            shares: Iterable[float] | None = None, energy: float | None = None) -> None:
        """One GPU window. ``shares``: its loss parts' shares (jobs.loss.window_shares); without them its
        1 - OFU. A share above 0 is lost, its GPU time added to the waste (term by term as the loss account
        adds it, so the waste is exactly what the loss parts add up to); one below 0 (the clock part of a window
        whose SM clock boosted above f_ref) is gained, added to the gain, never subtracted from the waste:
        neither falls. ``energy``: the window's energy (J; None: not known)."""
        try:  # core.exact.exact, inline
            gpu, useful = int(seconds * SCALE), int(ofu * seconds * SCALE)
            parts = [int(share * seconds * SCALE) for share in ((1.0 - ofu,) if shares is None else shares)]
        except (OverflowError, ValueError):
            gpu, useful = exact(seconds), exact(ofu * seconds)
            parts = [exact(share * seconds) for share in ((1.0 - ofu,) if shares is None else shares)]
        self.exact_gpu_seconds += gpu
        self.exact_ofu_gpu_seconds += useful
        for count in parts:
            if count < 0:
                self.exact_gained_gpu_seconds -= count
            else:
                self.exact_wasted_gpu_seconds += count
        flop = None
        if flops_per_s is not None:
            flop = exact(flops_per_s * seconds)
            self.exact_flop += flop
            self.exact_flop_gpu_seconds += gpu
        if energy is not None:
            joules = exact(energy)
            self.exact_energy += joules
            self.exact_energy_gpu_seconds += gpu
            if flop is not None:
                self.exact_energy_of_flop += joules
                self.exact_flop_of_energy += flop

    def merge(self, other: JobTotals, sign: int = 1) -> None:
        """Add ``other`` exactly (``sign`` -1: take it out again)."""
        self.exact_gpu_seconds += sign * other.exact_gpu_seconds
        self.exact_ofu_gpu_seconds += sign * other.exact_ofu_gpu_seconds
        self.exact_wasted_gpu_seconds += sign * other.exact_wasted_gpu_seconds
        self.exact_flop += sign * other.exact_flop
        self.exact_flop_gpu_seconds += sign * other.exact_flop_gpu_seconds
        self.exact_gained_gpu_seconds += sign * other.exact_gained_gpu_seconds
        self.exact_energy += sign * other.exact_energy
        self.exact_energy_gpu_seconds += sign * other.exact_energy_gpu_seconds
        self.exact_energy_of_flop += sign * other.exact_energy_of_flop
        self.exact_flop_of_energy += sign * other.exact_flop_of_energy

    @property
    def gpu_seconds(self) -> float:
        return to_float(self.exact_gpu_seconds)

    @property
    def ofu_gpu_seconds(self) -> float:
        return to_float(self.exact_ofu_gpu_seconds)

    @property
    def wasted_gpu_seconds(self) -> float:
        return to_float(self.exact_wasted_gpu_seconds)

    @property
    def gained_gpu_seconds(self) -> float:
        return to_float(self.exact_gained_gpu_seconds)

    @property
    def flop(self) -> float:
        return to_float(self.exact_flop)

    @property
    def flop_gpu_seconds(self) -> float:
        return to_float(self.exact_flop_gpu_seconds)

    @property
    def ofu_mean(self) -> float | None:
        return self.ofu_gpu_seconds / self.gpu_seconds if self.exact_gpu_seconds > 0 else None

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0

    @property
    def wasted_gpu_hours(self) -> float:
        return self.wasted_gpu_seconds / 3600.0

    @property
    def gained_gpu_hours(self) -> float:
        return self.gained_gpu_seconds / 3600.0

    @property
    def flops_known(self) -> bool:
        return self.exact_flop_gpu_seconds > 0

    @property
    def energy_known(self) -> bool:
        return self.exact_energy_gpu_seconds > 0

    @property
    def energy(self) -> float | None:
        """J over the windows whose energy is known; None when none is."""
        return to_float(self.exact_energy) if self.energy_known else None

    @property
    def energy_per_useful_pflop(self) -> float | None:
        """J per PFLOP of useful work (10^15 FLOPs at OFU), over the windows whose energy and FLOPs are known."""
        return energy_per_pflop(self.exact_energy_of_flop, self.exact_flop_of_energy)


def energy_per_pflop(exact_energy: int, exact_flop: int) -> float | None:
    """J per PFLOP from two exact sums (J, FLOP) over the same windows; None without FLOPs."""
    if exact_flop <= 0:
        return None
    return to_float(exact_energy) / (to_float(exact_flop) / 1e15)


@dataclass
class EnergyTotals:
    """The fleet's energy (J, exact sums): the jobs' windows and no job's, and the jobs' J per useful FLOP."""

    exact_jobs: int = 0
    exact_unallocated: int = 0  # GPUs of no job, ignored jobs, shared GPUs not counted
    exact_energy_of_flop: int = 0  # the jobs' energy and FLOPs of the windows where both are known
    exact_flop_of_energy: int = 0

    def add_job(self, energy: float, flop: float | None) -> None:
        joules = exact(energy)
        self.exact_jobs += joules
        if flop is not None:
            self.exact_energy_of_flop += joules
            self.exact_flop_of_energy += exact(flop)

    def add_unallocated(self, energy: float) -> None:
        self.exact_unallocated += exact(energy)

    @property
    def known(self) -> bool:
        return self.exact_jobs != 0 or self.exact_unallocated != 0

    def by_use(self) -> dict[str, float]:
        """J by ofu.energy.use: ``jobs``, ``unallocated``."""
        return {"jobs": to_float(self.exact_jobs), "unallocated": to_float(self.exact_unallocated)}

    @property
    def per_useful_pflop(self) -> float | None:
        return energy_per_pflop(self.exact_energy_of_flop, self.exact_flop_of_energy)


def bin_pieces(start: float, end: float, resolution: float) -> list[tuple[int, float]]:
    """The bins of ``resolution`` seconds that ``[start, end]`` overlaps, each with the overlap (seconds)."""
    pieces = []
    for k in range(math.floor(start / resolution), math.floor((end - 1e-9) / resolution) + 1):
        overlap = min(end, (k + 1) * resolution) - max(start, k * resolution)
        if overlap > 0:
            pieces.append((k, overlap))
    return pieces


def segment_start(t: float, previous_end: float | None, previous_interval: float | None, default_interval: float,
                  max_gap: float) -> float | None:
    """Where the window ending at ``t`` began, for a series whose last window ended at ``previous_end``.

    Consecutive points of one GPU tile time: the window is [previous_end, t]. The first point
    and a point after a gap longer than ``max_gap`` (a restart, lost scrapes) cover the
    series' last known interval, else ``default_interval``: a gap is not GPU time we saw.
    Returns None for a point not after the previous one (duplicate or out of order).
    """
    if previous_end is not None:
        if t <= previous_end:
            return None
        if t - previous_end <= max_gap:
            return previous_end
    return t - (previous_interval or default_interval)
