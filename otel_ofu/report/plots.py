"""PNG plots for ``otel-ofu report --plots DIR`` (matplotlib, Agg backend: no display needed).

Written for someone who has not read the docs: every plot says in its title what it shows,
axes carry units, findings are shaded and labelled with their numbers in plain words.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from otel_ofu.core.loss import (
    ACCOUNT_PARTS,
    CLOCK,
    CLOCK_GAIN_TITLE,
    UNALLOCATED,
    USEFUL,
    LossTotals,
    gain_title,
    part_order,
    part_title,
)
from otel_ofu.report.build import JobReport, Report
from otel_ofu.report.loss import cause_words, largest_record, lost_gpu_hours

FINDING_STYLE = {"mfu_gap": ("#8e44ad", "MFU audit: reported MFU disagrees with OFU"),
                 "regression": ("#c0392b", "regression: OFU well below the job's baseline")}
MAX_STACKED_JOBS = 8
MAX_LOSS_JOBS = 14  # jobs drawn in the loss breakdown (those that lost the most GPU-hours)
# One colour per part of the loss account, everywhere (merged parts between their steps' colours).
PART_COLORS = {
    "engine_idle": "#d62728", "engine_idle+sm_idle": "#e377c2", "engine_idle+sm_idle+non_tensor": "#bc80bd",
    "sm_idle": "#ff7f0e", "sm_idle+non_tensor": "#ffbb78", "non_tensor": "#9467bd", "clock": "#1f77b4",
    "padding": "#8c564b", "unknown": "#c7c7c7", "useful": "#2ca02c", "unallocated": "#7f7f7f",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def safe_name(job_id: str) -> str:
    """A file-name-safe form of a job id."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", job_id).strip("_") or "job"


def _time_axis(t0: float, t1: float) -> tuple[float, str]:
    """Scale and label for elapsed time: minutes for short recordings, hours for long ones."""
    return (3600.0, "hours") if t1 - t0 > 3 * 3600 else (60.0, "minutes")


def _finding_label(finding: dict[str, Any]) -> str:
    n = finding["numbers"]
    if finding["kind"] == "mfu_gap" and "mfu_reported" in n:
        cause = finding["cause"].replace("_", " ")
        return (f"MFU gap raised: job reports {n['mfu_reported']:.0%} MFU, hardware shows {n['ofu']:.0%} OFU "
                f"(likely {cause})")
    if "baseline" in n and n.get("ofu"):
        return (f"regression raised: OFU {n['ofu']:.0%} vs baseline {n['baseline']:.0%} "
                f"({n['baseline'] / n['ofu']:.1f}x slower)")
    return f"{finding['kind']} raised ({finding['cause']})"


def plot_job_timeline(job: JobReport, path: Path, t0: float, t1: float) -> None:
    """OFU per bin, reported and true MFU, the regression baseline, findings shaded and labelled."""
    plt = _pyplot()
    from matplotlib.patches import Patch
    from matplotlib.ticker import PercentFormatter

    s, totals = job.summary, job.summary.totals
    scale, unit = _time_axis(t0, t1)
    fig, ax = plt.subplots(figsize=(12, 5.2), dpi=110)
    handles = []
    bin_label = _bin_label(job)
    if job.timeline:
        xs = [(t - t0) / scale for t, *_ in job.timeline]
        handles += ax.plot(xs, [row[1] for row in job.timeline], color="#1f77b4", lw=1.8,
                           label=f"OFU measured by the GPUs (time-weighted over the job's GPUs, per {bin_label})")
        mfu = [(x, row[2]) for x, row in zip(xs, job.timeline) if row[2] is not None]
        if mfu:
            handles += ax.plot([x for x, _ in mfu], [v for _, v in mfu], color="#ff7f0e", lw=1.6, ls="--",
                               label="MFU reported by the job itself")
        base = [(x, row[3]) for x, row in zip(xs, job.timeline) if row[3] is not None]
        if base:
            handles += ax.plot([x for x, _ in base], [v for _, v in base], color="#7f7f7f", lw=1.0, ls="-.",
                               label="regression baseline (median of recent OFU)")
    if job.truth:
        handles += ax.plot([(t - t0) / scale for t, _ in job.truth], [v for _, v in job.truth], color="#2ca02c",
                           lw=1.2, ls=":", label="true MFU (simulator ground truth)")
    seen_kinds = set()
    for i, finding in enumerate(job.findings):
        color, legend = FINDING_STYLE.get(finding["kind"], ("#d35400", finding["kind"]))
        opened = finding["time_unix_nano"] / 1e9
        since = _parse_iso(finding["since"]) or opened
        closed = _parse_iso(finding["closed"]) or s.end
        ax.axvspan((since - t0) / scale, (closed - t0) / scale, color=color, alpha=0.13, lw=0)
        ax.axvline((opened - t0) / scale, color=color, lw=1.4)
        reason = finding.get("close_numbers", {}).get("reason")
        if finding.get("closed") and reason == "no_mfu_report":
            when = (f"raised at {(opened - t0) / scale:.0f}, closed at {(closed - t0) / scale:.0f} {unit}: "
                    "no MFU report")
        elif finding.get("closed") and reason != "job_end":
            when = f"raised at {(opened - t0) / scale:.0f}, cleared at {(closed - t0) / scale:.0f} {unit}"
        else:
            when = f"raised at {(opened - t0) / scale:.0f} {unit}, open until the end"
        ax.annotate(f"{_finding_label(finding)}  [{when}]",
                    xy=((opened - t0) / scale, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(4, -14 - 14 * i), textcoords="offset points", fontsize=8.5, color=color,
                    va="top", bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": color, "alpha": 0.85})
        if finding["kind"] not in seen_kinds:
            seen_kinds.add(finding["kind"])
            handles.append(Patch(color=color, alpha=0.3, label=f"{legend} (shaded: from when it began until it "
                                 "cleared; solid line: when it was raised)"))
    top = max([0.05, *(row[1] for row in job.timeline), *(row[2] or 0 for row in job.timeline),
               *(v for _, v in job.truth)])
    ax.set_ylim(0, min(1.05, top * 1.35 + 0.02) if top <= 1 else top * 1.2)
    ax.set_xlim((s.start - t0) / scale, (s.end - t0) / scale)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel(f"time since the start of the recording ({unit}, data time)")
    ax.set_ylabel("utilization (% of dense tensor peak\nat the precision in use)")
    ofu = f"{totals.ofu_mean:.1%}" if totals.ofu_mean is not None else "n/a"
    gpus = f"{s.gpus} GPU{'s' if s.gpus != 1 else ''}"
    found = f"{len(job.findings)} finding{'s' if len(job.findings) != 1 else ''}"
    gained = f", {totals.gained_gpu_hours:.1f} gained by a {CLOCK_GAIN_TITLE}" \
        if totals.gained_gpu_hours >= 0.05 else ""
    ax.set_title(f"Job {s.job_id}: OFU over time\n{gpus}, {totals.gpu_hours:.1f} GPU hours, mean OFU {ofu}, "
                 f"{totals.wasted_gpu_hours:.1f} GPU hours wasted{gained}, {found}", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, loc="lower left", fontsize=8.5, framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _bin_label(job: JobReport) -> str:
    """'minute' for 60 s bins, else the bin length."""
    if len(job.timeline) < 2:
        return "bin"
    step = round(min(b[0] - a[0] for a, b in zip(job.timeline, job.timeline[1:])))
    return "minute" if step == 60 else f"{step} s"


def _parse_iso(value: str | None) -> float | None:
    if not value:
        return None
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def plot_fleet_distribution(report: Report, path: Path, bucket: float = 0.02) -> None:
    """GPU hours per OFU bucket, stacked by job (the biggest jobs; the rest together; no job)."""
    plt = _pyplot()
    from matplotlib.ticker import PercentFormatter

    from otel_ofu.jobs.aggregate import WeightedHistogram

    jobs = sorted(report.jobs, key=lambda j: -j.summary.totals.gpu_seconds)
    series: list[tuple[str, WeightedHistogram, str | None]] = []
    for job in jobs[:MAX_STACKED_JOBS]:
        series.append((job.summary.job_id, job.summary.histogram, None))
    if len(jobs) > MAX_STACKED_JOBS:
        rest = WeightedHistogram()
        for job in jobs[MAX_STACKED_JOBS:]:
            rest.merge(job.summary.histogram)
        series.append((f"{len(jobs) - MAX_STACKED_JOBS} other jobs", rest, "#bcbd22"))
    if report.book.unattributed_histogram.total > 0:
        series.append(("no job (idle or unattributed GPUs)", report.book.unattributed_histogram, "#c7c7c7"))

    fig, ax = plt.subplots(figsize=(13, 5.2), dpi=110)
    bottoms: dict[float, float] = {}
    for label, hist, color in series:
        buckets = hist.buckets(bucket)
        xs = [left for left, _ in buckets]
        heights = [w / 3600.0 for _, w in buckets]
        ax.bar(xs, heights, width=bucket * 0.95, align="edge", bottom=[bottoms.get(x, 0.0) for x in xs],
               label=f"{label} ({hist.total / 3600.0:.1f} GPU h)", color=color, edgecolor="white", lw=0.3)
        for x, h in zip(xs, heights):
            bottoms[x] = bottoms.get(x, 0.0) + h
    job_seconds = sum(j.summary.totals.gpu_seconds for j in report.jobs)
    if job_seconds:
        mean = sum(j.summary.totals.ofu_gpu_seconds for j in report.jobs) / job_seconds
        ax.axvline(mean, color="black", ls="--", lw=1.2, label=f"mean OFU of job GPU time: {mean:.1%}")
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlim(0, max([0.6, *(x + bucket for x in bottoms)]))
    ax.set_xlabel(f"OFU of a GPU over one collection window (% of dense tensor peak; {bucket:.0%} buckets)")
    ax.set_ylabel("GPU hours")
    total = (job_seconds + report.book.unattributed.gpu_seconds) / 3600.0
    ax.set_title(f"Fleet OFU distribution: where {total:.1f} GPU hours on {report.gpu_count} GPUs went\n"
                 "(bars stacked by job; further right is better)", fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _stack(ax: Any, y: float, loss: LossTotals, labelled: set[str], height: float = 0.7) -> float:
    """One horizontal bar of an account's GPU-hours stacked by part (account order): what each lost, and useful;
    returns its length. What it gained (the SM clock above f_ref) is drawn left of 0, labelled as a gain: the
    useful part holds what it added."""
    hours = loss.gpu_hours()
    gain = sum(loss.gained_gpu_hours().values())
    if gain > 0:
        label = None if CLOCK_GAIN_TITLE in labelled else f"{CLOCK_GAIN_TITLE} (gained)"
        labelled.add(CLOCK_GAIN_TITLE)
        ax.barh(y, -gain, left=0.0, height=height, color=PART_COLORS[CLOCK], label=label, edgecolor="white",
                lw=0.4, hatch="xx")
    left = 0.0
    for part in ACCOUNT_PARTS:
        value = hours.get(part, 0.0)
        if value <= 0:
            continue
        label = None if part in labelled else part_title(part)
        labelled.add(part)
        ax.barh(y, value, left=left, height=height, color=PART_COLORS.get(part, "#17becf"), label=label,
                edgecolor="white", lw=0.4, hatch="//" if part == USEFUL else None)
        left += value
    return left


def plot_loss_breakdown(report: Report, path: Path) -> None:
    """Each job's GPU-hours stacked by where they went (useful last), the jobs that lost the most on top;
    and the fleet's, every GPU with a job or not."""
    plt = _pyplot()

    jobs = sorted(report.jobs, key=lambda j: (-sum(lost_gpu_hours(j.summary.loss).values()), j.summary.job_id))
    shown = jobs[:MAX_LOSS_JOBS]
    fleet = report.book.fleet_loss
    fig, (ax, fleet_ax) = plt.subplots(2, 1, figsize=(13, 1.6 + 0.42 * max(len(shown), 3)), dpi=110,
                                       gridspec_kw={"height_ratios": [max(len(shown), 3), 1.4]})
    labelled: set[str] = set()
    longest = 0.0
    for row, job in enumerate(shown):
        length = _stack(ax, row, job.summary.loss, labelled)
        longest = max(longest, length)
        largest = largest_record(job.summary.loss)
        if largest is not None:
            ax.text(length, row, f"  {part_title(largest['part'])} {largest['share']:.0%}"
                    f"{cause_words(largest['cause'])}", va="center", fontsize=8.5)
    ax.set_yticks(range(len(shown)), [j.summary.job_id for j in shown], fontsize=9)
    ax.invert_yaxis()
    gained = max([0.0, *(sum(j.summary.loss.gained_gpu_hours().values()) for j in shown)])
    ax.set_xlim(-gained * 1.1, longest * 1.35 if longest else 1)
    ax.set_xlabel("GPU hours")
    more = f" ({len(jobs) - len(shown)} more jobs in the table)" if len(jobs) > len(shown) else ""
    ax.set_title("Where each job's GPU-hours went: the dense peak split into parts that add up to its GPU time\n"
                 f"(jobs that lost the most on top; the label names each job's largest loss){more}", fontsize=11)
    ax.grid(axis="x", alpha=0.3)
    length = _stack(fleet_ax, 0, fleet, labelled, height=0.6)
    fleet_gained = sum(fleet.gained_gpu_hours().values())
    total = fleet.seconds / 3600.0  # every GPU-hour: what the parts lost, useful and no job, less what they gained
    useful = fleet.part_seconds.get(USEFUL, 0.0) / 3600.0
    fleet_ax.set_yticks([0], [f"fleet, every GPU\n({report.gpu_count} GPUs)"], fontsize=9)
    fleet_ax.set_xlim(-fleet_gained * 1.1, length * 1.02 if length else 1)
    fleet_ax.set_xlabel(f"GPU hours: {total:.1f} in all, {useful:.1f} useful ({useful / total:.0%})" if total
                        else "GPU hours")
    fleet_ax.grid(axis="x", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    more_handles, more_labels = fleet_ax.get_legend_handles_labels()
    order = {part_title(part): part_order(part) for part in ACCOUNT_PARTS}
    order[f"{CLOCK_GAIN_TITLE} (gained)"] = part_order(CLOCK)
    legend = sorted(zip(handles + more_handles, labels + more_labels), key=lambda hl: order.get(hl[1], 99))
    ax.legend([h for h, _ in legend], [label for _, label in legend], fontsize=8.5, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0, title="part", title_fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_fleet_waterfall(report: Report, path: Path) -> None:
    """The fleet's GPU-hours from all of them down to the useful ones: each part a step (a waterfall)."""
    plt = _pyplot()

    fleet = report.book.fleet_loss
    hours, gained = fleet.gpu_hours(), fleet.gained_gpu_hours()
    total = fleet.seconds / 3600.0  # every GPU-hour: the parts' and useful, less what they gained
    # (name, GPU-hours lost, or below 0 gained, colour): each part's loss a step down, a gain (a clock boost) up
    steps = []
    for part in ACCOUNT_PARTS:
        color = PART_COLORS.get(part, "#17becf")
        if part in hours and part != USEFUL:
            steps.append((part_title(part).replace(" or ", " or\n"), hours[part], color))
        if gained.get(part, 0.0) > 0:
            steps.append((gain_title(part), -gained[part], color))
    fig, ax = plt.subplots(figsize=(13, 5.2), dpi=110)
    ax.bar(0, total, color="#4c4c4c", width=0.7)
    ax.text(0, total, f"{total:.1f} h", ha="center", va="bottom", fontsize=8.5)
    level = top = total
    for k, (_, value, color) in enumerate(steps, 1):  # a clock gain is a step up
        ax.bar(k, -value, bottom=level, color=color, width=0.7, hatch="xx" if value < 0 else None,
               edgecolor="white" if value < 0 else None)
        words = f"+{-value:.1f} h\ngained" if value < 0 else f"-{value:.1f} h\n{value / total:.0%}"
        ax.text(k, max(level, level - value), words if total else "", ha="center", va="bottom", fontsize=8.5)
        level -= value
        top = max(top, level)
    useful = hours.get(USEFUL, 0.0)
    ax.bar(len(steps) + 1, useful, color=PART_COLORS[USEFUL], width=0.7, hatch="//", edgecolor="white")
    ax.text(len(steps) + 1, useful, f"{useful:.1f} h\n{useful / total:.0%}" if total else "", ha="center",
            va="bottom", fontsize=8.5)
    names = ["all GPU time", *(name for name, _, _ in steps), "useful (OFU)"]
    ax.set_xticks(range(len(names)), names, fontsize=8.5)
    ax.set_ylabel("GPU hours")
    ax.set_ylim(0, top * 1.12 if total else 1)
    no_job = hours.get(UNALLOCATED, 0.0)
    ax.set_title(f"Fleet: where {total:.1f} GPU hours on {report.gpu_count} GPUs went, part by part\n"
                 f"({no_job:.1f} h had no job; the rest is the jobs' loss account, "
                 "docs/method.md#where-the-flops-go-the-loss-account)", fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_plots(report: Report, directory: str | Path) -> list[Path]:
    """Every plot into ``directory`` (created); returns the files written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    t0 = report.start if report.start is not None else 0.0
    t1 = report.end if report.end is not None else t0
    written = []
    for job in report.jobs:
        path = out / f"job-{safe_name(job.summary.job_id)}.png"
        if path in written:  # the same job id ran twice (ended, then came back)
            path = out / f"job-{safe_name(job.summary.job_id)}-{len(written)}.png"
        plot_job_timeline(job, path, t0, t1)
        written.append(path)
    path = out / "fleet-ofu-distribution.png"
    plot_fleet_distribution(report, path)
    written.append(path)
    if report.book.fleet_loss.seconds > 0:
        for name, plot in (("loss-breakdown.png", plot_loss_breakdown), ("fleet-loss-waterfall.png",
                                                                          plot_fleet_waterfall)):
            plot(report, out / name)
            written.append(out / name)
    return written
