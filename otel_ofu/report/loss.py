"""The report's loss breakdown: where each job's and the fleet's GPU-hours went, and what to fix first.

Works on :class:`otel_ofu.core.loss.LossTotals` (a job's life account, the book's fleet account),
so :mod:`.build` (JSON and text) and :mod:`.plots` share one reading of them. A part's GPU-hours
are its share x GPU time of the windows where it lost; the parts, OFU (``useful``) and, for the
fleet, the GPU time of no job (``unallocated``), less what the windows gained (a negative clock
part: the SM clock boosted above f_ref), add up to every GPU-hour. A gain is shown as one, in a
column of its own, never netted into the losses (docs/method.md#wasted-gpu-hours-and-the-clock-gain).
"""

from __future__ import annotations

from typing import Any

from otel_ofu.core.loss import (
    ACCOUNT_PARTS,
    CLOCK_GAIN_TITLE,
    PADDING,
    UNACCOUNTED,
    UNALLOCATED,
    USEFUL,
    LossTotals,
    advice,
    part_order,
    part_title,
)
from otel_ofu.jobs.cost import money

TOP_RECOMMENDATIONS = 5  # how many (job, part) pairs the report's advice lists
# An item of "what to fix first" holds at least this many GPU-hours (36 GPU-seconds): less prints as
# 0.00-0.01 GPU h and is not where to start; the advice says how many smaller items it left out.
MIN_RECOMMENDATION_GPU_HOURS = 0.01
# How the padding part of an item was estimated (the counters cannot see GEMM shapes): with the
# built-in factor for a typical job on the job's GPUs, the same for every job there, or with another
# factor (a job's own under the ofu processor's tile_correction.jobs, or a site's fit).
FLEET_TILE_FACTOR = "fleet_tile_factor"
# The breakdown's column of GPU-hours gained (windows whose SM clock boosted above f_ref), where any were.
GAINED_COLUMN = f"{CLOCK_GAIN_TITLE} gained"
TILE_FACTOR = "tile_factor"


def largest_record(loss: LossTotals) -> dict[str, Any] | None:
    """A job's largest loss: part, share of its GPU time, GPU-hours, dominant cause, what to look at."""
    largest = loss.largest_loss()
    if largest is None:
        return None
    part, share = largest
    cause = loss.dominant_cause(part)
    return {"part": part, "share": share, "gpu_hours": loss.part_seconds[part] / 3600.0, "cause": cause,
            "advice": advice(part, cause)}


def lost_gpu_hours(loss: LossTotals) -> dict[str, float]:
    """GPU-hours each loss part (not useful) lost, in account order: they add up to the wasted GPU-hours."""
    return {part: hours for part, hours in loss.gpu_hours().items() if part != USEFUL}


def gained_gpu_hours(loss: LossTotals) -> float:
    """GPU-hours the account's windows gained (their negative parts: the SM clock boosting above f_ref)."""
    return sum(loss.gained_gpu_hours().values())


def tile_factor(loss: LossTotals) -> float | None:
    """The tile correction c_tile a job's padding part was made with: useful / (useful + padding), since
    padding = raw x (1 - c_tile) and useful = raw x c_tile. None when it has no padding part or some of its
    GPU time came without its account (then useful holds time the padding part does not)."""
    padding = loss.part_seconds.get(PADDING)
    useful = loss.part_seconds.get(USEFUL, 0.0)
    if padding is None or UNACCOUNTED in loss.part_seconds or useful + padding <= 0:
        return None
    return useful / (useful + padding)


def _estimate(loss: LossTotals, fleet_factor: float | None) -> tuple[str, float] | None:
    """How a padding part was estimated: (FLEET_TILE_FACTOR or TILE_FACTOR, c_tile); None when unknown."""
    factor = tile_factor(loss)
    if factor is None:
        return None
    fleet = fleet_factor is not None and abs(factor - fleet_factor) < 5e-4  # the table's factors: 3 decimals
    return (FLEET_TILE_FACTOR if fleet else TILE_FACTOR), factor


Costs = list[LossTotals | None]  # each job's cost account (jobs.cost), in the order of its loss account; None: no price


def _items(jobs: list[tuple[str, LossTotals]], fleet: LossTotals, fleet_factors: dict[str, float] | None,
           costs: Costs | None = None, fleet_cost: LossTotals | None = None) -> list[dict[str, Any]]:
    """Every (job, part) that lost GPU-hours, and the fleet's unallocated time, the biggest first: by money where
    any has a price (those without one after them, by GPU-hours), else by GPU-hours."""
    items = []
    for (job, loss), cost in zip(jobs, costs or [None] * len(jobs)):
        spent = money(cost) if cost is not None else {}
        for part, hours in lost_gpu_hours(loss).items():
            if hours > 0:
                cause = loss.dominant_cause(part)
                estimate = _estimate(loss, (fleet_factors or {}).get(job)) if part == PADDING else None
                items.append({"job_id": job, "part": part, "cause": cause, "gpu_hours": hours,
                              "cost": spent.get(part),
                              "share": loss.part_seconds[part] / loss.seconds if loss.seconds else None,
                              "advice": advice(part, cause),
                              "estimate": estimate[0] if estimate else None,
                              "tile_factor": estimate[1] if estimate else None})
    unallocated = fleet.part_seconds.get(UNALLOCATED, 0.0) / 3600.0
    if unallocated > 0:
        idle_cost = money(fleet_cost).get(UNALLOCATED) if fleet_cost is not None else None
        items.append({"job_id": None, "part": UNALLOCATED, "cause": None, "gpu_hours": unallocated,
                      "cost": idle_cost, "share": fleet.part_seconds[UNALLOCATED] / fleet.seconds,
                      "advice": advice(UNALLOCATED), "estimate": None, "tile_factor": None})
    items.sort(key=lambda item: (item["cost"] is None, -(item["cost"] or 0.0), -item["gpu_hours"],
                                 str(item["job_id"]), part_order(item["part"])))
    return items


def recommendations(jobs: list[tuple[str, LossTotals]], fleet: LossTotals, top: int = TOP_RECOMMENDATIONS,
                    fleet_factors: dict[str, float] | None = None, costs: Costs | None = None,
                    fleet_cost: LossTotals | None = None) -> list[dict[str, Any]]:
    """The biggest (job, part) losses, and the fleet's unallocated time: what to fix first. By the money lost where
    prices are set (``costs``, each job's cost account beside its loss account; ``fleet_cost``), else by GPU-hours.

    Items under MIN_RECOMMENDATION_GPU_HOURS are left out. ``fleet_factors``: job -> the built-in tile
    factor of its GPUs and precision, to tell a padding part estimated with it (the same for every job)
    from one made with the job's own factor.
    """
    return _listed(_items(jobs, fleet, fleet_factors, costs, fleet_cost), top)


def _listed(items: list[dict[str, Any]], top: int = TOP_RECOMMENDATIONS) -> list[dict[str, Any]]:
    return [item for item in items if item["gpu_hours"] >= MIN_RECOMMENDATION_GPU_HOURS][:top]


def _estimate_words(tip: dict[str, Any]) -> str:
    if tip["estimate"] == FLEET_TILE_FACTOR:
        return (f" [an estimate: the fleet's tile factor for a typical job on these GPUs (c_tile "
                f"{tip['tile_factor']:.3f}), the same for every job, not this job's GEMM shapes; declare the job's "
                "own under the ofu processor's tile_correction.jobs before acting on it]")
    if tip["estimate"] == TILE_FACTOR:
        return f" [an estimate from the tile factor c_tile {tip['tile_factor']:.3f}, not a measurement]"
    if tip["part"] == PADDING:
        return " [an estimate from the tile correction, not a measurement]"
    return ""


def cause_words(cause: str | None) -> str:
    """`` (memory bound)``: a cause worth printing, in words ("" for none, unknown or no reason)."""
    return "" if cause in (None, "unknown", "none") else f" ({str(cause).replace('_', ' ')})"


def _cell(hours: float | None) -> str:
    """A table cell: GPU-hours, ``-`` for a part the row does not have."""
    return "-" if hours is None else f"{hours:.2f}"


def _table(jobs: list[tuple[str, LossTotals]], fleet: LossTotals, unit: str,
           fleet_label: str = "fleet (every GPU)") -> list[str]:
    """An account table: what each part lost and, where any, what a clock boost gained, in ``unit`` (GPU h, or a
    currency for cost accounts, whose "GPU-hours" are money: jobs.cost); jobs by what they lost, the fleet last."""
    jobs = sorted(jobs, key=lambda item: (-sum(lost_gpu_hours(item[1]).values()), item[0]))
    present = {part for _, loss in jobs for part, hours in lost_gpu_hours(loss).items()}
    present |= {part for part in fleet.part_seconds if part != USEFUL}
    parts = [part for part in ACCOUNT_PARTS if part in present and part != USEFUL]
    gains = any(loss.gain_seconds for _, loss in jobs) or bool(fleet.gain_seconds)
    header = ("job", f"lost {unit}", *(part_title(p) for p in parts), *([GAINED_COLUMN] if gains else []),
              "largest loss")
    rows = [header]
    for job, loss in jobs:
        lost = lost_gpu_hours(loss)
        largest = largest_record(loss)
        where = "-" if largest is None else \
            f"{part_title(largest['part'])} {largest['share']:.0%}{cause_words(largest['cause'])}"
        gained = [_cell(gained_gpu_hours(loss) if loss.gain_seconds else None)] if gains else []
        rows.append((job, f"{sum(lost.values()):.2f}", *(_cell(lost.get(p)) for p in parts), *gained, where))
    fleet_lost = lost_gpu_hours(fleet)
    biggest = max(fleet_lost.items(), key=lambda kv: kv[1], default=None)
    where = "-" if biggest is None or biggest[1] <= 0 or not fleet.seconds else \
        f"{part_title(biggest[0])} {biggest[1] * 3600 / fleet.seconds:.0%}"
    gained = [_cell(gained_gpu_hours(fleet) if fleet.gain_seconds else None)] if gains else []
    rows.append((fleet_label, f"{sum(fleet_lost.values()):.2f}",
                 *(_cell(fleet_lost.get(p)) for p in parts), *gained, where))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    numeric = set(range(1, len(header) - 1))

    def line(row: tuple[str, ...]) -> str:
        cells = (c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
        return "  ".join(cells).rstrip()

    return [line(rows[0]), line(tuple("-" * w for w in widths)), *(line(r) for r in rows[1:])]


def breakdown_lines(jobs: list[tuple[str, LossTotals]], fleet: LossTotals,
                    fleet_factors: dict[str, float] | None = None, costs: Costs | None = None,
                    fleet_cost: LossTotals | None = None, currency: str = "") -> list[str]:
    """The breakdown table (GPU-hours lost per part and, where any, gained by a clock boost; jobs by GPU-hours
    lost, the fleet last), the same in money where prices are set (``costs``: each job's cost account beside its
    loss account, None without a price; ``fleet_cost``), and the advice, by money where prices are set."""
    out = ["Where the GPU-hours went (GPU h lost to each part: share of the dense peak x GPU time; "
           "docs/method.md#where-the-flops-go-the-loss-account):", *_table(jobs, fleet, "GPU h")]
    gains = any(loss.gain_seconds for _, loss in jobs) or bool(fleet.gain_seconds)
    if gains:
        out.append(f"  {GAINED_COLUMN}: GPU h gained where the SM clock ran above the clock the peak is quoted at "
                   "(f_ref), counted apart from those lost: GPU time = useful + lost - gained "
                   "(docs/method.md#wasted-gpu-hours-and-the-clock-gain)")
    priced = [(job, cost) for (job, _), cost in zip(jobs, costs or []) if cost is not None]
    if priced and fleet_cost is not None:
        out += ["", f"Where the money went ({currency} lost to each part: GPU h x the price per GPU-hour of each "
                    "GPU, window by window; docs/method.md#cost):",
                *_table(priced, fleet_cost, currency, "fleet (GPUs with a price)")]
        if len(priced) < len(jobs):
            out.append(f"  {len(jobs) - len(priced)} job(s) ran on GPUs with no price: not in this table")
    every = _items(jobs, fleet, fleet_factors, costs, fleet_cost)
    tips = _listed(every)
    small = len(every) - len(_listed(every, len(every)))
    if every:
        by_money = any(item["cost"] is not None for item in every)
        out += ["", f"What to fix first (by {currency} lost):" if by_money
                else "What to fix first (by GPU-hours lost):"]
        for n, tip in enumerate(tips, 1):
            share = f" ({tip['share']:.0%})" if tip["share"] is not None else ""
            spent = f", {tip['cost']:.2f} {currency}" if tip["cost"] is not None else ""
            if tip["part"] == UNALLOCATED:
                out.append(f"  {n}. the fleet: {tip['gpu_hours']:.2f} GPU h{spent}{share} on GPUs with no job: "
                           f"{tip['advice']}")
                continue
            out.append(f"  {n}. {tip['job_id']}: {tip['gpu_hours']:.2f} GPU h{spent}{share} lost to "
                       f"{part_title(tip['part'])}{cause_words(tip['cause'])}: {tip['advice']}{_estimate_words(tip)}")
        if small:
            out.append(f"  ({small} smaller item{'s' if small != 1 else ''}, each under "
                       f"{MIN_RECOMMENDATION_GPU_HOURS} GPU h, not listed)")
    return out
