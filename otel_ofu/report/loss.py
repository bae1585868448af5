"""The report's loss breakdown: where each job's and the fleet's GPU-hours went, and what to fix first.

Works on :class:`otel_ofu.core.loss.LossTotals` (a job's life account, the book's fleet account),
so :mod:`.build` (JSON and text) and :mod:`.plots` share one reading of them. A part's GPU-hours
are its share x GPU time; the parts, OFU (``useful``) and, for the fleet, the GPU time of no
job (``unallocated``) add up to every GPU-hour.
"""

from __future__ import annotations

from typing import Any

from otel_ofu.core.loss import (
    ACCOUNT_PARTS,
    UNALLOCATED,
    USEFUL,
    LossTotals,
    advice,
    part_order,
    part_title,
)

TOP_RECOMMENDATIONS = 5  # how many (job, part) pairs the report's advice lists


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
    """GPU-hours per loss part (not useful), in account order."""
    return {part: hours for part, hours in loss.gpu_hours().items() if part != USEFUL}


def recommendations(jobs: list[tuple[str, LossTotals]], fleet: LossTotals,
                    top: int = TOP_RECOMMENDATIONS) -> list[dict[str, Any]]:
    """The biggest (job, part) losses in GPU-hours, and the fleet's unallocated time: what to fix first."""
    items = []
    for job, loss in jobs:
        for part, hours in lost_gpu_hours(loss).items():
            if hours > 0:
                cause = loss.dominant_cause(part)
                items.append({"job_id": job, "part": part, "cause": cause, "gpu_hours": hours,
                              "share": loss.part_seconds[part] / loss.seconds if loss.seconds else None,
                              "advice": advice(part, cause)})
    unallocated = fleet.part_seconds.get(UNALLOCATED, 0.0) / 3600.0
    if unallocated > 0:
        items.append({"job_id": None, "part": UNALLOCATED, "cause": None, "gpu_hours": unallocated,
                      "share": fleet.part_seconds[UNALLOCATED] / fleet.seconds, "advice": advice(UNALLOCATED)})
    items.sort(key=lambda item: (-item["gpu_hours"], str(item["job_id"]), part_order(item["part"])))
    return items[:top]


def cause_words(cause: str | None) -> str:
    """`` (memory bound)``: a cause worth printing, in words ("" for none, unknown or no reason)."""
    return "" if cause in (None, "unknown", "none") else f" ({str(cause).replace('_', ' ')})"


def _cell(hours: float | None) -> str:
    return "-" if hours is None else f"{hours:.2f}"


def breakdown_lines(jobs: list[tuple[str, LossTotals]], fleet: LossTotals) -> list[str]:
    """The breakdown table (GPU-hours lost per part, jobs by GPU-hours lost, the fleet last) and the advice."""
    jobs = sorted(jobs, key=lambda item: (-sum(lost_gpu_hours(item[1]).values()), item[0]))
    present = {part for _, loss in jobs for part, hours in lost_gpu_hours(loss).items()}
    present |= {part for part in fleet.part_seconds if part != USEFUL}
    parts = [part for part in ACCOUNT_PARTS if part in present and part != USEFUL]
    header = ("job", "lost GPU h", *(part_title(p) for p in parts), "largest loss")
    rows = [header]
    for job, loss in jobs:
        lost = lost_gpu_hours(loss)
        largest = largest_record(loss)
        where = "-" if largest is None else \
            f"{part_title(largest['part'])} {largest['share']:.0%}{cause_words(largest['cause'])}"
        rows.append((job, f"{sum(lost.values()):.2f}", *(_cell(lost.get(p)) for p in parts), where))
    fleet_lost = lost_gpu_hours(fleet)
    biggest = max(fleet_lost.items(), key=lambda kv: kv[1], default=None)
    where = "-" if biggest is None or not fleet.seconds else \
        f"{part_title(biggest[0])} {biggest[1] * 3600 / fleet.seconds:.0%}"
    rows.append(("fleet (every GPU)", f"{sum(fleet_lost.values()):.2f}", *(_cell(fleet_lost.get(p)) for p in parts),
                 where))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    numeric = set(range(1, len(header) - 1))

    def line(row: tuple[str, ...]) -> str:
        cells = (c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
        return "  ".join(cells).rstrip()

    out = ["Where the GPU-hours went (GPU h lost to each part: share of the dense peak x GPU time; "
           "docs/method.md#where-the-flops-go-the-loss-account):",
           line(rows[0]), line(tuple("-" * w for w in widths)), *(line(r) for r in rows[1:])]
    tips = recommendations(jobs, fleet)
    if tips:
        out += ["", "What to fix first (by GPU-hours lost):"]
        for n, tip in enumerate(tips, 1):
            share = f" ({tip['share']:.0%})" if tip["share"] is not None else ""
            if tip["part"] == UNALLOCATED:
                out.append(f"  {n}. the fleet: {tip['gpu_hours']:.2f} GPU h{share} on GPUs with no job: "
                           f"{tip['advice']}")
                continue
            out.append(f"  {n}. {tip['job_id']}: {tip['gpu_hours']:.2f} GPU h{share} lost to "
                       f"{part_title(tip['part'])}{cause_words(tip['cause'])}: {tip['advice']}")
    return out
