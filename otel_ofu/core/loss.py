"""The loss account: where one GPU window's dense peak went, in parts that add up to 1.

The counters nest: a cycle with a tensor pipe busy is a cycle with the SM busy, which is a
cycle with the graphics engine busy. So they make a chain of levels from the peak down to
OFU, and the parts of the account are the steps between consecutive levels::

    1      the dense peak at the precision in use
    GR     GR_ENGINE_ACTIVE (DCGM 1001, GPM GRAPHICS_UTIL)   engine_idle = 1 - GR
    SM     SM_ACTIVE (DCGM 1002, GPM SM_UTIL)                sm_idle     = GR - SM
    TPA    PIPE_TENSOR_ACTIVE (DCGM 1004)                    non_tensor  = SM - TPA
    raw    TPA x f_SM / f_ref                                clock       = TPA - raw
    OFU    raw x c_tile                                      padding     = raw - OFU
                                                             useful      = OFU

The sum telescopes, so the parts and OFU add up to 1 whatever the readings are (to float
rounding). The rules (docs/method.md, "Where the FLOPs go", says why):

- TPA, the clock and f_ref make OFU: without OFU there is no account.
- A blank or missing GR or SM is no level: the two steps beside it are one part, named by
  both (``sm_idle+non_tensor`` when SM_ACTIVE is not read, as by dcgm-exporter's default
  counters). Neither step is reported alone, none is zero, nothing moves silently.
- A level below the next one by sampling noise (GR < SM, SM < TPA by at most the ratio
  tolerance) is raised to it (that step is 0); further below, the counter does not describe
  the same window and is treated as missing (``inconsistent``).
- The clock part is negative when the SM clock runs above f_ref (boost): a gain.
- The clock part carries its cause, the most severe clock event reason of the window
  (DCGM 112); the part holding the non-tensor step carries whether DRAM_ACTIVE says the
  kernels were memory-bound.
- Where the window's throttled time per reason is known (DCGM 1420-1424, cumulative ns: their
  increases over the window, core.counters), a clock part above 0 is split into one part per
  reason that held the clock down, by its share of that time (:func:`split_clock`), the parts
  adding up to the clock part exactly (core.exact). Without that time (no counters, a first
  reading, no increase) the bitmask's cause stays, as above; a clock part below 0 (a gain) is
  never split.

Pure: numbers in, numbers out; :class:`LossTotals` aggregates windows GPU-time weighted for
jobs and the fleet, where time without a job is the part ``unallocated``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from otel_ofu.core.exact import SCALE, exact, to_float
from otel_ofu.core.values import TPA_TOLERANCE, clean, clean_ratio

# The steps of the chain, top to bottom, then the two below TPA.
ENGINE_IDLE = "engine_idle"
SM_IDLE = "sm_idle"
NON_TENSOR = "non_tensor"
CLOCK = "clock"
PADDING = "padding"
# Not losses: what a GPU-hours account also holds.
USEFUL = "useful"  # OFU
UNALLOCATED = "unallocated"  # GPU time with no job (fleet level)
# Lost, but where to is not known: GPU time whose OFU came without its account (a source or an
# agent that sends no gpu.ofu.loss). Jobs and the fleet only; a GPU window's own parts are never it.
UNACCOUNTED = "unknown"

MERGE = "+"  # joins the names of steps reported as one part (a level between them is missing)
_STEPS = (ENGINE_IDLE, SM_IDLE, NON_TENSOR)


def _merged_names() -> tuple[str, ...]:
    names = []
    for first in range(len(_STEPS)):
        for last in range(first, len(_STEPS)):
            names.append(MERGE.join(_STEPS[first:last + 1]))
    return tuple(names)


#: Every loss part a window can have, in chain order (merged parts beside the steps they hold).
LOSS_PARTS: tuple[str, ...] = (*_merged_names(), CLOCK, PADDING)
#: Every part of a GPU-hours account, in display order.
ACCOUNT_PARTS: tuple[str, ...] = (*LOSS_PARTS, UNACCOUNTED, USEFUL, UNALLOCATED)

# Causes (attribute ofu.loss.cause).
UNKNOWN = "unknown"  # the counter that says why was not read
NO_REASON = "none"  # clock event reasons read, no bit set
OTHER_REASON = "other"  # only bits this table does not know
MEMORY_BOUND = "memory_bound"
NOT_MEMORY_BOUND = "not_memory_bound"

# Clock event reason bits (DCGM 112; NVML nvmlClocksEventReason*), most severe first: the
# window's clock cause is the first bit set. Hardware events cut the clock by half or more
# and name a fault (power delivery, cooling); the software limits are policy.
CLOCK_REASONS: tuple[tuple[int, str], ...] = (
    (0x80, "hw_power_brake"),  # external power brake assertion
    (0x40, "hw_thermal"),  # hardware thermal slowdown
    (0x8, "hw_slowdown"),  # hardware slowdown (thermal, power brake or fast-trigger power protection)
    (0x20, "sw_thermal"),  # driver thermal limit
    (0x4, "sw_power_cap"),  # the power limit (the usual one under heavy tensor load)
    (0x10, "sync_boost"),  # held to the slowest GPU of a sync-boost group
    (0x2, "app_clocks"),  # the applications clocks setting
    (0x100, "display_clocks"),  # the display clock setting
    (0x1, "idle"),  # nothing running: clocks parked
)
#: The reasons whose held-down time DCGM counts (1420-1424, ns; NVML's NVML_FI_DEV_CLOCKS_EVENT_REASON_*
#: fields): what splits the clock part, named as their bits above, most severe first.
CLOCK_TIME_CAUSES: tuple[str, ...] = ("hw_power_brake", "hw_thermal", "sw_thermal", "sw_power_cap", "sync_boost")
#: A job's clock part gained (the SM clock above f_ref: GPU windows whose clock part is below 0), as a cause of
#: job.ofu.loss beside the reasons that lost (never a GPU window's cause).
BOOST = "boost"
CLOCK_CAUSES: tuple[str, ...] = (*(name for _, name in CLOCK_REASONS), OTHER_REASON, NO_REASON, UNKNOWN, BOOST)
MEMORY_CAUSES: tuple[str, ...] = (MEMORY_BOUND, NOT_MEMORY_BOUND, UNKNOWN)

#: DRAM_ACTIVE at or above this makes the non-tensor work memory-bound: the memory interface
#: busy in half the cycles is heavy traffic (NVIDIA's DCGM profiling guidance; a stream of
#: copies peaks near 0.8), where transformer GEMM phases sit near 0.3.
MEMORY_BOUND_DRAM = 0.5

INCONSISTENT = "inconsistent"  # a level further below the next one than the tolerance


class LossAccount:
    """One GPU window: its loss parts (shares of the dense peak, chain order) and OFU; together 1.

    ``causes`` runs beside ``parts``: the clock part's event reason, the memory cause of the part
    holding the non-tensor step, None for the others.
    """

    __slots__ = ("parts", "causes", "ofu", "clock_cause", "memory_cause", "reordered", "unused")

    def __init__(self, parts: tuple[tuple[str, float], ...], causes: tuple[str | None, ...], ofu: float,
                 clock_cause: str, memory_cause: str, reordered: bool = False,
                 unused: tuple[tuple[str, str], ...] = ()):
        self.parts = parts
        self.causes = causes
        self.ofu = ofu
        self.clock_cause = clock_cause
        self.memory_cause = memory_cause
        self.reordered = reordered  # a level was raised to the one below it (sampling noise)
        self.unused = unused  # (counter, why) of GR/SM not used as a level

    def __repr__(self) -> str:
        return f"LossAccount(parts={self.parts!r}, ofu={self.ofu!r}, clock={self.clock_cause}, " \
               f"memory={self.memory_cause}, reordered={self.reordered}, unused={self.unused!r})"

    def cause(self, part: str) -> str | None:
        """The cause a part carries: the clock part's reason, memory-bound for the non-tensor step."""
        if part == CLOCK:
            return self.clock_cause
        if NON_TENSOR in part.split(MERGE):
            return self.memory_cause
        return None

    def share(self, part: str) -> float | None:
        """A part's share; None when this window has no such part (unknown, or merged with another)."""
        for name, value in self.parts:
            if name == part:
                return value
        return None

    @property
    def lost(self) -> float:
        """All the parts together: 1 - OFU."""
        return sum(value for _, value in self.parts)

    def largest(self) -> tuple[str, float]:
        """The part that lost the most."""
        return max(self.parts, key=lambda item: item[1])


_MISSING = "missing"


def _level(value: object, tolerance: float) -> tuple[float | None, str]:
    """A ratio that is not a plain float in [0, 1] as a level of the chain, or why it is none."""
    if value is None:
        return None, _MISSING
    number, reason = clean_ratio(value, tolerance)
    if number is None:
        return None, str(reason)
    return number, ""


def _clock_cause(mask: int) -> str:
    if mask == 0:
        return NO_REASON
    for bit, name in CLOCK_REASONS:
        if mask & bit:
            return name
    return OTHER_REASON


_CLOCK_CAUSE_TABLE = tuple(_clock_cause(mask) for mask in range(0x200))  # every combination of the known bits


def clock_cause(reasons: object) -> str:
    """The most severe clock event reason in a bitmask (DCGM 112); ``unknown`` without one."""
    if type(reasons) is int and 0 <= reasons < 0x200:  # the usual reading: a table lookup
        return _CLOCK_CAUSE_TABLE[reasons]
    if reasons is None:
        return UNKNOWN
    number, _ = clean(reasons, "int64")
    if number is None or number != int(number):
        return UNKNOWN
    return _clock_cause(int(number))


def memory_cause(dram: object, tolerance: float = TPA_TOLERANCE, threshold: float = MEMORY_BOUND_DRAM) -> str:
    """Whether DRAM_ACTIVE says the window's non-tensor work was memory-bound; ``unknown`` without it."""
    if type(dram) is float and 0.0 <= dram <= 1.0:
        return MEMORY_BOUND if dram >= threshold else NOT_MEMORY_BOUND
    if dram is None:
        return UNKNOWN
    number, _ = clean_ratio(dram, tolerance)
    if number is None:
        return UNKNOWN
    return MEMORY_BOUND if number >= threshold else NOT_MEMORY_BOUND


# The four layouts a window's parts can have, by which of GR and SM are levels; each part's kind
# of cause beside it (the clock's reason, the memory cause of the part holding the non-tensor step).
FULL = (ENGINE_IDLE, SM_IDLE, NON_TENSOR, CLOCK, PADDING)
WITHOUT_SM = (ENGINE_IDLE, SM_IDLE + MERGE + NON_TENSOR, CLOCK, PADDING)
WITHOUT_GR = (ENGINE_IDLE + MERGE + SM_IDLE, NON_TENSOR, CLOCK, PADDING)
WITHOUT_BOTH = (MERGE.join(_STEPS), CLOCK, PADDING)
_MEMORY, _CLOCK = "memory", "clock"
CAUSE_KINDS: dict[tuple[str, ...], tuple[str | None, ...]] = {
    names: tuple(_CLOCK if n == CLOCK else _MEMORY if NON_TENSOR in n.split(MERGE) else None for n in names)
    for names in (FULL, WITHOUT_SM, WITHOUT_GR, WITHOUT_BOTH)}


def causes_of(names: tuple[str, ...], memory: str, clock: str | tuple[str, ...]) -> tuple[str | None, ...]:
    """The cause beside each part of a layout; ``clock`` a tuple: a split layout's (:func:`split_layout`) clock causes,
    one per clock part, in order."""
    if type(clock) is tuple:
        causes = iter(clock)
        return tuple(next(causes) if name == CLOCK else memory if NON_TENSOR in name.split(MERGE) else None
                     for name in names)
    return tuple(clock if k is _CLOCK else memory if k is _MEMORY else None for k in CAUSE_KINDS[names])


def split_clock(clock: float, throttled: dict[str, float] | None) -> tuple[tuple[str, float], ...] | None:
    """The clock part split by each reason's share of the window's throttled time: ``((cause, share), ...)`` in
    :data:`CLOCK_TIME_CAUSES` order, for the reasons with time above 0; None when it is not split (a clock part
    of 0 or below, no throttled time known, none above 0).

    ``throttled``: cause -> ns the clock was held down by that reason in the window (the increases of DCGM
    1420-1424). Time under two reasons at once counts for each, so the shares are of their sum. The shares
    add up to the clock part exactly (their exact sum, ``math.fsum``, is it; so is core.exact's where each is
    at least 2^-12): one reason's share takes the rest.
    """
    if not throttled or not clock > 0.0 or not math.isfinite(clock):
        return None
    weights = [(cause, float(ns)) for cause in CLOCK_TIME_CAUSES
               if (ns := throttled.get(cause)) is not None and ns > 0 and math.isfinite(ns)]
    if not weights:
        return None
    total = math.fsum(w for _, w in weights)
    shares = [clock * (w / total) for _, w in weights]
    kept = [item for item, share in zip(weights, shares) if share > 0.0]  # a share below the smallest double: none
    if len(kept) <= 1:
        return ((kept[0][0] if kept else max(weights, key=lambda item: item[1])[0], clock),)
    weights, shares = kept, [share for share in shares if share > 0.0]
    # One share takes the rest, the smallest first: its last bit is the finest, so the rest is most often
    # exactly a double; the exact sum (math.fsum) is then the clock part, else a nudge of an ulp or two makes it.
    proportional = list(shares)
    for holder in sorted(range(len(shares)), key=lambda k: (proportional[k], k)):
        shares = list(proportional)
        shares[holder] = math.fsum([clock, *(-share for k, share in enumerate(proportional) if k != holder)])
        for _ in range(4):
            found = math.fsum(shares)
            if found == clock or shares[holder] <= 0.0:
                break
            shares[holder] = math.nextafter(shares[holder], math.inf if found < clock else -math.inf)
        if shares[holder] > 0.0 and math.fsum(shares) == clock:
            break
    return tuple((cause, share) for (cause, _), share in zip(weights, shares))


def split_layout(names: tuple[str, ...], shares: tuple[float, ...] | list[float], split: tuple[tuple[str, float], ...]
                 ) -> tuple[tuple[str, ...], tuple[float, ...], tuple[str, ...]]:
    """A window's layout and shares with its clock part as the split's parts (one ``clock`` per cause), and the
    split's causes in their order (the ``clock`` argument of :func:`causes_of`)."""
    at = names.index(CLOCK)
    return ((*names[:at], *(CLOCK for _ in split), *names[at + 1:]),
            (*shares[:at], *(share for _, share in split), *shares[at + 1:]), tuple(cause for cause, _ in split))


def _levels(tpa: float, gr: object, sm: object, tolerance: float
            ) -> tuple[float | None, float | None, bool, str, str]:
    """GR and SM as levels above TPA (or None), whether one was raised, and why each is not used ("" if it is).

    A plain ratio (a float within [0, 1], the usual reading) is taken as is; anything else goes
    through the blank rule (values.clean_ratio), which also names why it is no value. Bottom up:
    TPA is the anchor (it makes OFU); a level may sit below the next one by noise only.
    """
    if type(sm) is float and 0.0 <= sm <= 1.0:
        sm_level: float | None = sm
        sm_why = ""
    else:
        sm_level, sm_why = _level(sm, tolerance)
    if type(gr) is float and 0.0 <= gr <= 1.0:
        gr_level: float | None = gr
        gr_why = ""
    else:
        gr_level, gr_why = _level(gr, tolerance)
    reordered = False
    below = tpa
    if sm_level is not None:
        if sm_level < below - tolerance:
            sm_level, sm_why = None, INCONSISTENT
        else:
            if sm_level < below:
                sm_level, reordered = below, True
            below = sm_level
    if gr_level is not None:
        if gr_level < below - tolerance:
            gr_level, gr_why = None, INCONSISTENT
        elif gr_level < below:
            gr_level, reordered = below, True
    return gr_level, sm_level, reordered, gr_why, sm_why


def loss_shares(tpa: float, raw: float, ofu: float, gr: object = None, sm: object = None, dram: object = None,
                reasons: object = None, tolerance: float = TPA_TOLERANCE,
                memory_bound_dram: float = MEMORY_BOUND_DRAM
                ) -> tuple[tuple[str, ...], tuple[float, ...], str, str]:
    """The account of one window, lean: (layout, the parts' shares in its order, memory cause, clock cause).

    What :func:`loss_account` returns, without the object and the diagnostics: the ofu processor
    calls this once per GPU window. ``layout`` is one of the module's four tuples of part names.
    """
    if type(gr) is float and type(sm) is float and 1.0 >= gr >= sm >= tpa and sm >= 0.0:
        gr_level: float | None = gr  # the usual reading: plain ratios in order, taken as they are
        sm_level: float | None = sm
    else:
        gr_level, sm_level, _, _, _ = _levels(tpa, gr, sm, tolerance)
    if type(reasons) is int and 0 <= reasons < 0x200:
        clock = _CLOCK_CAUSE_TABLE[reasons]
    else:
        clock = UNKNOWN if reasons is None else clock_cause(reasons)
    if type(dram) is float and 0.0 <= dram <= 1.0:
        memory = MEMORY_BOUND if dram >= memory_bound_dram else NOT_MEMORY_BOUND
    else:
        memory = memory_cause(dram, tolerance, memory_bound_dram)
    if gr_level is not None:
        if sm_level is not None:
            return FULL, (1.0 - gr_level, gr_level - sm_level, sm_level - tpa, tpa - raw, raw - ofu), memory, clock
        return WITHOUT_SM, (1.0 - gr_level, gr_level - tpa, tpa - raw, raw - ofu), memory, clock
    if sm_level is not None:
        return WITHOUT_GR, (1.0 - sm_level, sm_level - tpa, tpa - raw, raw - ofu), memory, clock
    return WITHOUT_BOTH, (1.0 - tpa, tpa - raw, raw - ofu), memory, clock


def loss_account(tpa: float, raw: float, ofu: float, gr: object = None, sm: object = None, dram: object = None,
                 reasons: object = None, *, tolerance: float = TPA_TOLERANCE,
                 memory_bound_dram: float = MEMORY_BOUND_DRAM) -> LossAccount:
    """The account of one window from its OFU figures (TPA, raw and corrected OFU, clean
    numbers as :func:`otel_ofu.core.ofu.compute_ofu` returns them) and the raw readings of
    GR, SM, DRAM and the clock event reasons (None, blanks, NaN: no value)."""
    names, values, memory, clock = loss_shares(tpa, raw, ofu, gr, sm, dram, reasons, tolerance, memory_bound_dram)
    _, _, reordered, gr_why, sm_why = _levels(tpa, gr, sm, tolerance)
    unused = tuple((name, why) for name, why in (("sm_active", sm_why), ("gr_engine_active", gr_why)) if why)
    return LossAccount(tuple(zip(names, values)), causes_of(names, memory, clock), ofu, clock, memory, reordered,
                       unused)


def part_order(part: str) -> int:
    """A part's place in :data:`ACCOUNT_PARTS` (unknown names last), for sorting tables and stacks."""
    try:
        return ACCOUNT_PARTS.index(part)
    except ValueError:
        return len(ACCOUNT_PARTS)


@dataclass
class LossTotals:
    """Windows added up GPU-time weighted: seconds x share per part (``useful`` is OFU x seconds).

    Each window's part adds to what that part lost (``part_seconds``) when it is 0 or more, and to
    what it gained (``gain_seconds``) when it is below 0: the clock part of a window whose SM clock
    boosted above f_ref. So neither ever falls (they make cumulative counters), and ``seconds``, the
    GPU time with an account, is what the parts lost less what they gained. Causes are kept as
    seconds x share lost per (part, cause), so the dominant cause of a part is the one behind most
    of its loss. Every sum is exact (core.exact): the same windows give the same bits in any order,
    and one account can be taken from another exactly (:meth:`subtract`).
    """

    exact_seconds: int = 0
    exact_parts: dict[str, int] = field(default_factory=dict)
    exact_causes: dict[tuple[str, str], int] = field(default_factory=dict)
    exact_gains: dict[str, int] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return to_float(self.exact_seconds)

    @property
    def part_seconds(self) -> dict[str, float]:
        """Each part's GPU seconds lost (seconds x share, where the share is 0 or more)."""
        return {part: to_float(count) for part, count in self.exact_parts.items()}

    @property
    def cause_seconds(self) -> dict[tuple[str, str], float]:
        """Each (part, cause)'s GPU seconds lost."""
        return {key: to_float(count) for key, count in self.exact_causes.items()}

    @property
    def gain_seconds(self) -> dict[str, float]:
        """Each part's GPU seconds gained (-seconds x share, where the share is below 0)."""
        return {part: to_float(count) for part, count in self.exact_gains.items()}

    def add(self, account: LossAccount, seconds: float) -> None:
        self.add_parts(account.parts, account.ofu, seconds,
                       {part: cause for (part, _), cause in zip(account.parts, account.causes) if cause is not None})

    def add_parts(self, parts: Iterable[tuple[str, float]], ofu: float, seconds: float,
                  causes: dict[str, str | tuple[tuple[str, float], ...]] | None = None) -> None:
        """One window given as parts (what the ``gpu.ofu.loss`` points of a window say). A part whose cause is
        ``((cause, share), ...)`` (the clock split by cause) counts as the sum of its causes' counts, exactly."""
        if seconds <= 0:
            return
        try:  # core.exact.exact, inline: one window is a dozen terms
            counts = [(part, int(share * seconds * SCALE)) for part, share in parts]
            total, useful = int(seconds * SCALE), int(ofu * seconds * SCALE)
        except (OverflowError, ValueError):  # a term beyond a double or NaN: what exact() makes of it
            counts = [(part, exact(share * seconds)) for part, share in parts]
            total, useful = exact(seconds), exact(ofu * seconds)
        self.exact_seconds += total
        totals = self.exact_parts
        for part, count in counts:
            cause = causes.get(part) if causes else None
            if type(cause) is tuple:  # split by cause (its shares above 0): the part is its causes' counts' sum
                for name, share in cause:
                    lost = exact(share * seconds)
                    key = (part, name)
                    self.exact_causes[key] = self.exact_causes.get(key, 0) + lost
                    totals[part] = totals.get(part, 0) + lost
                continue
            if count < 0:  # a gain (the SM clock above f_ref): counted apart, the part lost nothing here
                self.exact_gains[part] = self.exact_gains.get(part, 0) - count
                count = 0
            totals[part] = totals.get(part, 0) + count
            if cause is not None:
                key = (part, cause)
                self.exact_causes[key] = self.exact_causes.get(key, 0) + count
        totals[USEFUL] = totals.get(USEFUL, 0) + useful

    def add_unallocated(self, seconds: float) -> None:
        """GPU time no job held: all of it is the part ``unallocated`` (fleet level)."""
        if seconds <= 0:
            return
        count = exact(seconds)
        self.exact_seconds += count
        self.exact_parts[UNALLOCATED] = self.exact_parts.get(UNALLOCATED, 0) + count

    def merge(self, other: LossTotals, factor: float = 1.0) -> None:
        """Add ``other`` (times ``factor``: the share of it that counts, e.g. part of a bin).

        With a factor each of its sums is read back, scaled and added as one term: the same in
        any order of merging too.
        """
        if factor == 1.0:
            self.exact_seconds += other.exact_seconds
            for part, count in other.exact_parts.items():
                self.exact_parts[part] = self.exact_parts.get(part, 0) + count
            for key, count in other.exact_causes.items():
                self.exact_causes[key] = self.exact_causes.get(key, 0) + count
            for part, count in other.exact_gains.items():
                self.exact_gains[part] = self.exact_gains.get(part, 0) + count
            return
        self.exact_seconds += exact(to_float(other.exact_seconds) * factor)
        for part, count in other.exact_parts.items():
            self.exact_parts[part] = self.exact_parts.get(part, 0) + exact(to_float(count) * factor)
        for key, count in other.exact_causes.items():
            self.exact_causes[key] = self.exact_causes.get(key, 0) + exact(to_float(count) * factor)
        for part, count in other.exact_gains.items():
            self.exact_gains[part] = self.exact_gains.get(part, 0) + exact(to_float(count) * factor)

    def subtract(self, other: LossTotals) -> None:
        """Take ``other`` out again, exactly (a job's life account without its bins still open)."""
        self.exact_seconds -= other.exact_seconds
        for part, count in other.exact_parts.items():
            self.exact_parts[part] = self.exact_parts.get(part, 0) - count
        for key, count in other.exact_causes.items():
            self.exact_causes[key] = self.exact_causes.get(key, 0) - count
        for part, count in other.exact_gains.items():
            self.exact_gains[part] = self.exact_gains.get(part, 0) - count

    def copy(self) -> LossTotals:
        return LossTotals(self.exact_seconds, dict(self.exact_parts), dict(self.exact_causes), dict(self.exact_gains))

    def shares(self) -> dict[str, float]:
        """Each part's share of the GPU time, in account order: what it lost less what it gained (the clock
        part is below 0 where its gains outweigh its losses); with ``useful`` they add up to 1."""
        seconds = self.seconds
        if seconds <= 0:
            return {}
        gains = self.exact_gains
        return {part: to_float(self.exact_parts.get(part, 0) - gains.get(part, 0)) / seconds
                for part in sorted(self.exact_parts.keys() | gains.keys(), key=part_order)}

    def gpu_hours(self) -> dict[str, float]:
        """The GPU-hours each part lost (never below 0; ``useful``: OFU x GPU time), in account order."""
        return {part: to_float(self.exact_parts[part]) / 3600.0 for part in sorted(self.exact_parts, key=part_order)}

    def gained_gpu_hours(self) -> dict[str, float]:
        """The GPU-hours each part gained (its windows below 0: the clock boosting above f_ref), in account order.
        GPU time = the parts' GPU-hours (useful, lost, unallocated) - these."""
        return {part: to_float(self.exact_gains[part]) / 3600.0 for part in sorted(self.exact_gains, key=part_order)}

    def cause_shares(self, part: str) -> dict[str, float]:
        """A part's share of the GPU time by cause (the clock's: each reason's): what each cause lost, and what the
        part gained as :data:`BOOST` (below 0); together they are the part's share in :meth:`shares`, exactly in the
        sums (a rounding left by a scaled merge goes to the cause that lost most; lost without a cause: ``unknown``)."""
        seconds = self.seconds
        if seconds <= 0:
            return {}
        counts = {cause: count for (p, cause), count in self.exact_causes.items() if p == part and count}
        rest = self.exact_parts.get(part, 0) - sum(counts.values())
        if rest:
            largest = max(counts, key=lambda c: (counts[c], c), default=UNKNOWN)
            counts[largest] = counts.get(largest, 0) + rest
        gained = self.exact_gains.get(part, 0)
        if gained:
            counts[BOOST] = counts.get(BOOST, 0) - gained
        return {cause: to_float(count) / seconds for cause, count in counts.items() if count}

    def dominant_cause(self, part: str) -> str | None:
        """The cause behind most of a part's loss (the clock's reason, memory-bound or not)."""
        found = [(count, cause) for (p, cause), count in self.exact_causes.items() if p == part and count > 0]
        return max(found)[1] if found else None

    def largest_loss(self) -> tuple[str, float] | None:
        """The loss part (not useful, not unallocated) that lost the most GPU time, and that share of the GPU time
        (what it lost, its gains not subtracted); None when no part lost any (a clock gain is not a loss)."""
        seconds = self.seconds
        if seconds <= 0:
            return None
        lost = {p: c for p, c in self.exact_parts.items() if p not in (USEFUL, UNALLOCATED) and c > 0}
        if not lost:
            return None
        part = max(lost, key=lambda p: (lost[p], -part_order(p)))
        return part, to_float(lost[part]) / seconds


# --- words for people: what a part is and what to do about it (report, console, docs) ----------

PART_TITLES: dict[str, str] = {
    ENGINE_IDLE: "engine idle",
    SM_IDLE: "SMs idle",
    NON_TENSOR: "non-tensor",
    CLOCK: "clock",
    PADDING: "padding",
    USEFUL: "useful (OFU)",
    UNALLOCATED: "no job",
    UNACCOUNTED: "unaccounted",
}

PART_MEANINGS: dict[str, str] = {
    ENGINE_IDLE: "no kernel running: the input pipeline, the host, checkpoints, waiting for other ranks outside "
                 "kernels",
    SM_IDLE: "kernels running but SMs idle: launch gaps, small grids, tails",
    NON_TENSOR: "SMs busy, tensor pipes idle: elementwise, softmax, normalization and communication kernels, "
                "memory-bound phases",
    CLOCK: "SMs below the clock the peak is quoted at (power cap, thermal, application clocks); GPU time gained "
           "(counted apart, a share below 0) when boosting above it",
    PADDING: "tensor work that 2MNK does not count: padded GEMM tiles",
    USEFUL: "the tensor work the dense peak counts: OFU",
    UNALLOCATED: "GPU time no job held",
    UNACCOUNTED: "lost, where to is not known: OFU came without its account (a source or agent that sends no "
                 "gpu.ofu.loss)",
}

_ADVICE: dict[str, str] = {
    ENGINE_IDLE: "the input pipeline or the host, not the kernels: more data-loader workers and prefetch, pinned "
                 "memory, asynchronous checkpoints; look for CPU-side stalls (debug flags, Python overhead, "
                 "collectives waiting on a slow rank)",
    SM_IDLE: "fewer, larger kernels: CUDA graphs or torch.compile against launch gaps, larger micro-batches "
             "against small grids",
    NON_TENSOR: "fuse the non-tensor work: fused attention kernels (FlashAttention), elementwise work in GEMM "
                "epilogues, communication overlapped with compute",
    CLOCK: "power cap or cooling: check the node's power limit and thermal state (nvidia-smi -q -d PERFORMANCE)",
    PADDING: "shape alignment: pad the vocabulary to a multiple of 128, pack sequences to multiples of the tile "
             "(128/256 tokens), keep hidden and FFN sizes multiples of 128",
    UNALLOCATED: "schedule work on idle GPUs or give them back",
    UNACCOUNTED: "upgrade the agents that send OFU without gpu.ofu.loss (or stop dropping that metric on the way)",
}
_CAUSE_ADVICE: dict[tuple[str, str], str] = {
    (NON_TENSOR, MEMORY_BOUND): "memory-bound kernels (DRAM busy): fuse them (FlashAttention, fused norms and "
                                "activations), raise arithmetic intensity with larger batches",
    (CLOCK, "sw_power_cap"): "the power cap: raise the power limit, or accept the clock it buys",
    (CLOCK, "hw_thermal"): "hardware thermal slowdown: the node's cooling (airflow, inlet temperature, fans)",
    (CLOCK, "sw_thermal"): "the driver's thermal limit: the node's cooling",
    (CLOCK, "hw_power_brake"): "an external power brake: the rack's power delivery",
    (CLOCK, "hw_slowdown"): "hardware slowdown (thermal or power protection): the node's cooling and power delivery",
    (CLOCK, "app_clocks"): "the applications clocks setting: reset it (nvidia-smi -rac)",
    (CLOCK, "sync_boost"): "sync boost holds the group at its slowest GPU: find the throttled one",
}
_SPLIT_BY = {ENGINE_IDLE + MERGE + SM_IDLE: "GR_ENGINE_ACTIVE", SM_IDLE + MERGE + NON_TENSOR: "SM_ACTIVE"}


def part_title(part: str) -> str:
    """A part's short name for people; merged parts as ``SMs idle or non-tensor``."""
    return " or ".join(PART_TITLES.get(step, step) for step in part.split(MERGE))


#: What a negative clock part is called for people: the SM clock ran above f_ref (boost), a gain.
CLOCK_GAIN_TITLE = "clock boost"


def gain_title(part: str) -> str:
    """What a part's gain is called: ``clock boost`` for the clock (the only part that gains from real
    readings), else the part's own name."""
    return CLOCK_GAIN_TITLE if part == CLOCK else part_title(part)


def gained_words(part: str, gained: float, unit: str = "GPU h", decimals: int = 2) -> str:
    """What a part gained (a positive amount, LossTotals.gained_gpu_hours): ``clock boost: +0.02 GPU h gained``.
    ``unit`` "%" takes a share."""
    number = f"{gained:.{decimals}%}" if unit == "%" else f"{gained:.{decimals}f} {unit}"
    return f"{gain_title(part)}: +{number} gained"


def part_meaning(part: str) -> str:
    return "; or ".join(PART_MEANINGS.get(step, step) for step in part.split(MERGE))


def advice(part: str, cause: str | None = None) -> str:
    """What to look at first for a part (worded by its cause where that changes the answer)."""
    steps = part.split(MERGE)
    if len(steps) > 1:
        missing = [counter for merged, counter in _SPLIT_BY.items() if merged in part]
        missing = missing or ["GR_ENGINE_ACTIVE and SM_ACTIVE"]
        return (f"either {' or '.join(_ADVICE[s].split(':')[0] for s in steps)}; read "
                f"DCGM_FI_PROF_{' and DCGM_FI_PROF_'.join(missing)} to tell them apart")
    if cause is not None and (part, cause) in _CAUSE_ADVICE:
        return _CAUSE_ADVICE[(part, cause)]
    return _ADVICE.get(part, part)
