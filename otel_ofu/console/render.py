"""How the console looks: a rich layout for terminals, plain lines for pipes and logs.

Both draw the same :class:`~otel_ofu.console.state.FleetView` with the same cell formatting.
Colour carries meaning only (an open finding: red; a GPU without a value: yellow) and every
coloured thing also has a mark or a word (``⚠``, ``—  stale``), so the screen reads the same
without colour (``NO_COLOR``, a monochrome terminal).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from otel_ofu.console.state import FindingState, FleetView, GpuRow, JobRow
from otel_ofu.core.loss import CLOCK, gained_words, part_title
from otel_ofu.jobs.findings import JOB_END, MFU_GAP, NO_MFU_REPORT, REGRESSION, STALLED

MISSING = "—"
FINDING_MARK = "⚠"
SPARK = "▁▂▃▄▅▆▇█"
FINDING_STYLE = "bold red"
MISSING_STYLE = "yellow"
ENDED_STYLE = "dim"
_REASON_WORDS = {"not_supported": "unsupported", "not_permissioned": "no permission", "not_found": "not found",
                 "zero_clock": "zero clock", "out_of_range": "out of range", "no_reference_clock": "no f_ref",
                 "not_a_number": "not a number"}


# --- cells -------------------------------------------------------------------------------------


def reason_word(reason: str) -> str:
    """A drop reason as a person reads it: not_supported -> unsupported."""
    return _REASON_WORDS.get(reason, reason.replace("_", " "))


def pct(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1%}"


def clock(ns: int, seconds: bool = False) -> str:
    if not ns:
        return MISSING
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%H:%M:%SZ" if seconds else "%H:%MZ")


def stamp(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ") if ns else "no data yet"


def span(seconds: float) -> str:
    """20m, 1h05m, 45s: how long a finding has been open (data time)."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def sparkline(values: list[float | None], scale: float = 1.0) -> str:
    """One block per bucket, 0 to ``scale`` (the same for every job, so jobs compare); a gap is a space."""
    top = len(SPARK) - 1
    return "".join(" " if v is None else SPARK[max(0, min(top, round(v / scale * top)))] for v in values)


def trend_scale(jobs: list[JobRow]) -> float:
    """The sparklines' full scale: the highest bucket shown, rounded up to 10 %, at least 50 %."""
    highest = max((v for job in jobs for v in job.trend if v is not None), default=0.0)
    return max(0.5, math.ceil(highest * 10 - 1e-9) / 10)


def gpu_label(row: GpuRow) -> str:
    gpu = row.state
    return f"{gpu.index} mig{gpu.mig}" if gpu.mig else gpu.index


def short_model(model: str) -> str:
    return model.removeprefix("NVIDIA ").strip() or "?"


def clocks(row: GpuRow) -> str:
    """SM clock against the reference clock OFU divides by, MHz."""
    gpu = row.state
    sm = MISSING if gpu.sm_mhz is None else f"{gpu.sm_mhz:.0f}"
    ref = MISSING if gpu.fref_mhz is None else f"{gpu.fref_mhz:.0f}"
    return f"{sm} / {ref}"


def finding_text(finding: FindingState, data_ns: int, is_open: bool = True) -> str:
    """The kind, the two numbers and since when: what a person acts on."""
    n = finding.numbers

    def num(key: str) -> float | None:
        value = n.get(key)
        return float(value) if isinstance(value, int | float) else None

    if finding.kind == MFU_GAP:
        text = f"reported MFU {pct(num('mfu_reported'))} vs OFU {pct(num('ofu'))}"
        text += f" ({n['window']})" if "window" in n else ""
        if finding.cause and is_open:  # once closed, the cause is what it was opened for, no longer likely
            text += f", likely {finding.cause.replace('_', ' ')}"
    elif finding.kind == REGRESSION:
        ratio = num("ratio")
        text = f"OFU {pct(num('ofu'))} vs baseline {pct(num('baseline'))}"
        text += f" ({ratio:.2f}x slower)" if ratio is not None else ""
    elif finding.kind == STALLED:  # jobs.stall: what it was judged on, and the GPU-hours held when it opened
        links = "links idle" if n.get("evidence") == "links" else "no link counters"
        hours = num("stalled_gpu_hours")
        text = f"engine busy, nothing moving ({links})" + (f", {hours:.2f} GPU h at open" if hours is not None else "")
        if is_open:
            text += ", likely a deadlock or a spinning kernel"
    else:
        text = finding.cause.replace("_", " ")
    if is_open:
        return f"{finding.kind}: {text}, since {clock(finding.since_ns)} ({span((data_ns - finding.since_ns) / 1e9)})"
    if finding.close_reason == JOB_END:
        return f"{finding.kind} open when the job ended"
    was = f"{text}, {finding.cause.replace('_', ' ')}" if finding.kind == MFU_GAP and finding.cause else text
    if finding.close_reason == NO_MFU_REPORT:
        silent = f" for {span(finding.no_report_s)}" if finding.no_report_s is not None else ""
        return f"{finding.kind} closed at {clock(finding.closed_ns or 0)}: no MFU report{silent} (was {was})"
    return f"{finding.kind} cleared at {clock(finding.closed_ns or 0)} (was {was})"


def header_facts(view: FleetView) -> tuple[str, str, str, str]:
    """The fleet: GPUs; those without OFU and why; OFU, GPU time and waste; open findings."""
    gpus = f"GPUs {len(view.gpus)} on {view.hosts} host{'s' if view.hosts != 1 else ''}, {view.with_value} with OFU"
    missing = ""
    if view.no_value:
        reasons = ", ".join(f"{count} {reason_word(r)}" for r, count in sorted(view.no_value.items()))
        missing = f"{sum(view.no_value.values())} without ({reasons})"
    t = view.totals
    gained = f" ({gained_words(CLOCK, t.gained_gpu_hours)})" if t.gained_gpu_hours >= 0.005 else ""
    ofu = (f"OFU now {pct(view.ofu_now)}, mean OFU {pct(t.ofu_mean)} over {t.gpu_hours:.2f} GPU h, "
           f"wasted {t.wasted_gpu_hours:.2f} GPU h{gained}{fleet_cost_text(view)}")
    return gpus, missing, ofu, f"findings open: {view.open_findings}"


def order_for_truncation(rows: list[GpuRow]) -> list[GpuRow]:
    """When not all GPUs fit: those of jobs with findings, then those without a value, then lowest OFU."""
    return sorted(rows, key=lambda r: (not r.job_finding, not r.reason,
                                       r.state.ofu if r.state.ofu is not None else -1.0))


def pick_gpus(rows: list[GpuRow], limit: int) -> tuple[list[GpuRow], int]:
    """The rows shown (natural order kept among them) and how many were left out."""
    if len(rows) <= limit:
        return rows, 0
    shown = {id(r) for r in order_for_truncation(rows)[:limit]}
    return [r for r in rows if id(r) in shown], len(rows) - limit


# --- rich (terminal) ----------------------------------------------------------------------------


def header_panel(view: FleetView, title: str) -> Panel:
    gpus, missing, ofu, findings = header_facts(view)
    line1 = Text(gpus)
    if missing:
        line1.append(", ").append(f"{MISSING} {missing}", MISSING_STYLE)
    line2 = Text(ofu + ", ")
    if view.open_findings:
        line2.append(f"{FINDING_MARK} {findings}", FINDING_STYLE)
    else:
        line2.append(findings)
    sources = [Text(f"source {line}", MISSING_STYLE) for line in view.sources]
    return Panel(Group(line1, line2, *sources), title=f"[bold]{title}[/] · data time {stamp(view.data_ns)}",
                 title_align="left", box=box.ROUNDED, padding=(0, 1))


def jobs_table(view: FleetView, limit: int) -> Table:
    table = Table(title="Jobs", title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, expand=True,
                  padding=(0, 1), show_edge=False)
    table.add_column("job", no_wrap=True, max_width=28)
    table.add_column("GPUs", justify="right")
    table.add_column("OFU now", justify="right")
    table.add_column("OFU job", justify="right")
    table.add_column("MFU rep.", justify="right")
    table.add_column("largest loss", no_wrap=True, overflow="ellipsis", max_width=30)
    scale = trend_scale(view.jobs[:limit])
    table.add_column(f"OFU trend (0-{scale:.0%})", no_wrap=True)
    table.add_column("findings", ratio=1, overflow="fold")
    for job in view.jobs[:limit]:
        table.add_row(*_job_cells(job, view.data_ns, scale), style=ENDED_STYLE if job.ended else None)
    if len(view.jobs) > limit:
        table.add_row(f"… {len(view.jobs) - limit} more jobs", style=ENDED_STYLE)
    if not view.jobs:
        table.add_row(Text("no jobs seen (GPUs carry no ofu.job.id)", style=ENDED_STYLE))
    return table


def _job_cells(job: JobRow, data_ns: int, scale: float) -> list[RenderableType]:
    name = Text(job.job_id)
    if job.open_findings:
        name = Text.assemble((f"{FINDING_MARK} ", FINDING_STYLE), (job.job_id, FINDING_STYLE))
    elif job.ended:
        name = Text(f"{job.job_id} (ended)")
    findings = Text()
    for finding in job.open_findings:
        findings.append(("\n" if findings else "") + f"{FINDING_MARK} " + finding_text(finding, data_ns),
                        FINDING_STYLE)
    for finding in job.closed_findings:
        findings.append(("\n" if findings else "") + "✓ " + finding_text(finding, data_ns, is_open=False), "dim")
    return [name, str(job.gpus), pct(job.ofu_now), pct(job.ofu_life), pct(job.mfu_reported),
            largest_loss_text(job, "\n"), sparkline(job.trend, scale), findings]


def fleet_cost_text(view: FleetView) -> str:
    """``, jobs losing 61.20 USD/h``: what the running jobs' loss parts cost per hour together (job.cost, prices
    set); "" without. A job's own is on its line in plain text (the live table has no room for a column)."""
    running = [job for job in view.jobs if job.cost_lost_per_hour is not None and not job.ended]
    currencies = {job.currency for job in running}
    if not running or len(currencies) != 1:
        return ""
    return f", jobs losing {sum(job.cost_lost_per_hour or 0.0 for job in running):.2f} {currencies.pop()}/h"


def cost_text(job: JobRow, prefix: str = "") -> str:
    """``12.34 USD/h``: what the job's loss parts are costing per hour (job.cost, prices set); "" without."""
    if job.cost_lost_per_hour is None:
        return ""
    return f"{prefix}{job.cost_lost_per_hour:.2f} {job.currency}/h".rstrip()
def energy_text(job: JobRow) -> str:
    """``, energy 12.40 kWh (1,310 J/useful PFLOP)``: where the jobs processor sent its job.energy; else ""."""
    if job.energy is None:
        return ""
    per_pflop = f" ({job.energy_per_pflop:,.0f} J/useful PFLOP)" if job.energy_per_pflop is not None else ""
    return f", energy {job.energy / 3.6e6:.2f} kWh{per_pflop}"


def _gain_shown(job: JobRow) -> bool:
    """A clock gain worth a word: one that prints as at least 1%."""
    return job.clock_gain is not None and job.clock_gain >= 0.005


def largest_loss_text(job: JobRow, separator: str = "; ") -> str:
    """``non-tensor 63% (memory bound)``: where the job's GPU time went most, after useful work; and what its
    clock gained above f_ref, as a gain (``clock boost: +2% gained``), never as a negative loss."""
    gain = gained_words(CLOCK, job.clock_gain, "%", 0) if job.clock_gain and _gain_shown(job) else ""
    if job.largest_loss is None:
        return gain or MISSING
    part, share, cause = job.largest_loss
    why = f" ({cause.replace('_', ' ')})" if cause not in (None, "unknown", "none") else ""
    return f"{part_title(part)} {share:.0%}{why}" + (separator + gain if gain else "")


def gpu_table(view: FleetView, limit: int) -> Table:
    rows, more = pick_gpus(view.gpus, limit)
    table = Table(title="GPUs", title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1),
                  show_edge=False)
    for name, justify in (("host", "left"), ("GPU", "right"), ("model", "left"), ("job", "left"),
                          ("precision", "left"), ("TPA", "right"), ("SM / ref MHz", "right"),
                          ("OFU raw", "right"), ("OFU", "right")):
        table.add_column(name, justify=justify, no_wrap=True, overflow="ellipsis")  # type: ignore[arg-type]
    for row in rows:
        gpu = row.state
        job = Text.assemble((f"{FINDING_MARK} ", FINDING_STYLE), gpu.job) if row.job_finding else Text(gpu.job)
        if row.reason:
            ofu: RenderableType = Text(f"{MISSING} {reason_word(row.reason)}", style=MISSING_STYLE)
            raw: RenderableType = Text(MISSING, style=MISSING_STYLE)
        else:
            ofu, raw = Text(pct(gpu.ofu), style="bold"), pct(gpu.ofu_raw)
        table.add_row(gpu.host, gpu_label(row), short_model(gpu.model), job, gpu.precision or MISSING, pct(gpu.tpa),
                      clocks(row), raw, ofu)
    if more:
        table.caption = f"… {more} more GPUs (shown: jobs with findings, then GPUs without OFU, then lowest OFU)"
        table.caption_justify = "left"
    return table


def live_layout(view: FleetView, console: Console, *, title: str = "otel-ofu", max_gpus: int = 64,
                max_jobs: int = 12) -> RenderableType:
    """The whole screen, sized to the console: the GPU table gets the lines the rest leaves."""
    header = header_panel(view, title)
    jobs_limit = max(1, min(max_jobs, (console.height - 8) // 3))
    jobs = jobs_table(view, jobs_limit)
    used = len(console.render_lines(Group(header, jobs), console.options, pad=False))
    gpu_rows = max(3, min(max_gpus, console.height - used - 5))
    return Group(header, jobs, gpu_table(view, gpu_rows))


# --- plain (pipes, logs) ------------------------------------------------------------------------


def plain_lines(view: FleetView, *, title: str = "otel-ofu", gpus: bool = True, max_gpus: int = 64) -> list[str]:
    """The view as plain text: a header line, a line per job (findings below it), the GPU table."""
    data_time = datetime.fromtimestamp(view.data_ns / 1e9, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ") \
        if view.data_ns else "-"
    gpus_text, missing, ofu, findings = header_facts(view)
    lines = [f"{title} {data_time}  {gpus_text}{', ' + missing if missing else ''}; {ofu}; {findings}"]
    lines += [f"  source {line}" for line in view.sources]
    for job in view.jobs:
        mfu = f", reported MFU {pct(job.mfu_reported)}" if job.mfu_reported is not None else ""
        state = " (ended)" if job.ended else ""
        loss = f", largest loss {largest_loss_text(job)}" if job.largest_loss is not None else \
            f", {largest_loss_text(job)}" if _gain_shown(job) else ""
        lines.append(f"  job {job.job_id}{state}: {job.gpus} GPUs, OFU {pct(job.ofu_now)} now, "
                     f"{pct(job.ofu_life)} over the job{mfu}{loss}{energy_text(job)}{cost_text(job, ', losing ')}")
        lines += [f"    FINDING {finding_text(f, view.data_ns)}" for f in job.open_findings]
        lines += [f"    {finding_text(f, view.data_ns, is_open=False)}" for f in job.closed_findings]
    if gpus and view.gpus:
        rows, more = pick_gpus(view.gpus, max_gpus)
        columns = ("host", "gpu", "model", "job", "precision", "tpa", "sm/ref_mhz", "ofu_raw", "ofu")
        cells = [[r.state.host, gpu_label(r), short_model(r.state.model), r.state.job or "-",
                  r.state.precision or "-", pct(r.state.tpa), clocks(r),
                  "-" if r.reason else pct(r.state.ofu_raw),
                  f"- ({reason_word(r.reason)})" if r.reason else pct(r.state.ofu)] for r in rows]
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip())
        lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
        if more:
            lines.append(f"  ... {more} more GPUs (shown: jobs with findings, then GPUs without OFU, then lowest OFU)")
    return [line.replace(MISSING, "-") for line in lines]  # plain ASCII marks for logs and grep
