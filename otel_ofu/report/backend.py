"""``otel-ofu report --prometheus URL``: the report from the jobs processor's series in a Prometheus-compatible
backend (Prometheus 2 and 3, VictoriaMetrics, Thanos, Mimir), instead of from recordings.

The jobs processor already counts what the table needs, per job, as cumulative counters
(``job.gpu_seconds``, ``job.ofu.loss.gpu_hours`` by part, ``job.ofu.gain.gpu_hours``, ``job.flops``,
``fleet.gpu_hours`` by part) beside gauges (``job.ofu`` per window, ``job.gpus``, ``job.finding``). Each
answer is one instant query at the range's end over the whole range (a counter's increase as
:func:`counted` writes it, ``quantile_over_time(q, x[R])``, a coarse subquery for first and last times),
so a month of a large fleet costs a handful of queries whose work is the TSDB's, not a pull of per-step
series. The answers are
built into the file report's :class:`~otel_ofu.report.build.Report`, so the table, the loss split,
"what to fix first", the findings, ``--json`` and ``--csv`` are rendered by the same code. Cost comes from
the jobs processor's ``job.cost`` where the range holds it, else from OpenCost's ``node_gpu_hourly_cost``
(its mean over the nodes and the range: the job series carry no node to join on).

Which names the series carry depends on the road they took (docs/backends.md): one label-values
query finds which of :data:`otel_ofu.cli.backend_check.NAMINGS` is present, and the report says which.
docs/report.md#from-the-backend lists every query and what the backend report cannot give.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from otel_ofu.cli.backend_check import NAMINGS, Backend, BackendError, Naming
from otel_ofu.core.exact import exact
from otel_ofu.core.loss import UNALLOCATED, USEFUL, LossTotals
from otel_ofu.core.model import COST_CURRENCY, GPU_MIG_INSTANCE, HOST_NAME, HW_ID, JOB_ID, LOSS_CAUSE, LOSS_PART
from otel_ofu.jobs.aggregate import JobTotals, window_label
from otel_ofu.jobs.book import JobBook
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.jobs.findings import FINDING_CAUSE, FINDING_KIND, WINDOW
from otel_ofu.jobs.tracker import LIFE, JobSummary
from otel_ofu.pipeline.redact import redact_url
from otel_ofu.processors import jobs as _jobs_processor  # noqa: F401 - registers the job.* and fleet.* metrics
from otel_ofu.report.build import BACKEND_FORMAT, JobReport, Report, ReportError, _finding_record
from otel_ofu.report.inputs import InputFile
from otel_ofu.report.series import cost_from_counters, loss_from_counters

log = logging.getLogger("otel_ofu.report")

# The metric whose presence tells the naming, and that every job has.
PRESENCE_METRIC = "job.gpu_seconds"
# Subqueries (first and last times) step at least this, and at most this many steps over the range.
MIN_STEP_S = 60.0
MAX_STEPS = 1000
# OpenCost's price of a GPU-hour on a node (labels node, instance_type, ...; its name on every road): what the
# report prices the jobs' GPU-hours by where the backend has no job.cost series (docs/report.md#cost-from-the-backend).
OPENCOST_GPU_PRICE = "node_gpu_hourly_cost"
# GPUs reporting gpu.ofu in the last this of the range count as the fleet's GPUs.
FLEET_GPUS_LOOKBACK_S = 3600.0
_RELATIVE = re.compile(r"^(?:now)?\s*-\s*(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str, now: float) -> float:
    """Unix seconds of ``now``, a time relative to now (``-24h``, ``now-30d``; s, m, h, d, w), RFC 3339
    (``2026-11-01T00:00:00Z``) or unix seconds."""
    value = text.strip()
    if value == "now":
        return now
    relative = _RELATIVE.match(value)
    if relative:
        return now - float(relative.group(1)) * _UNIT_S[relative.group(2)]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ReportError(f"{text!r}: not a time: give RFC 3339 (2026-11-01T00:00:00Z), unix seconds, 'now' or a "
                          "time before now such as -24h or -30d") from None
    if parsed.tzinfo is None:
        raise ReportError(f"{text!r}: RFC 3339 needs a zone (Z or +01:00)")
    return parsed.timestamp()


def counted(selector: str, range_text: str) -> str:
    """A counter's increase over the range without extrapolation: its value at the end less its value at the
    start (a series that starts in the range, as a job's counters do, from 0); where it reset in the range,
    the TSDB's ``increase()``. ``increase()`` alone extrapolates up to half a sample interval at each edge, and
    differently for each series (so a job's parts would not add up as its counters do)."""
    r = range_text
    last = f"last_over_time({selector}[{r}])"
    return (f"((({last} - {selector} offset {r}) or {last}) unless resets({selector}[{r}]) > 0) "
            f"or increase({selector}[{r}])")


def _duration(seconds: float) -> str:
    """A PromQL duration of whole seconds, in the largest whole unit (``2592000`` -> ``720h``)."""
    return window_label(float(round(seconds)))


@dataclass(frozen=True)
class Query:
    """One instant query the backend report runs at the range's end."""

    key: str
    expr: str
    what: str  # what it answers, for docs/report.md


def subquery_step(range_s: float, resolution_s: float) -> float:
    """The step of the first/last-time subqueries: the jobs' resolution, coarser on long ranges (at most
    :data:`MAX_STEPS` steps), in whole minutes."""
    return float(max(MIN_STEP_S, resolution_s, math.ceil(range_s / MAX_STEPS / 60.0) * 60.0))


def queries(naming: Naming, range_s: float, config: JobsConfig) -> list[Query]:
    """Every query of a report over ``range_s`` seconds ending at the evaluation time."""
    r = _duration(range_s)
    step = _duration(subquery_step(range_s, float(config.resolution)))
    short = window_label(min(config.windows))
    job, part, cause = (naming.quoted(naming.label(key)) for key in (JOB_ID, LOSS_PART, LOSS_CAUSE))
    kind, finding_cause = (naming.quoted(naming.label(key)) for key in (FINDING_KIND, FINDING_CAUSE))
    gpu = ", ".join(naming.quoted(naming.label(key)) for key in (HOST_NAME, HW_ID, GPU_MIG_INSTANCE))
    s = naming.selector
    currency = naming.quoted(naming.label(COST_CURRENCY))
    finding = f"{job}, {kind}, {finding_cause}"
    lookback = _duration(min(range_s, FLEET_GPUS_LOOKBACK_S))
    out = [
        Query("gpu_seconds", f"sum by ({job}) ({counted(s('job.gpu_seconds'), r)})", "each job's GPU seconds"),
        Query("wasted", f"sum by ({job}) ({counted(s('job.wasted_gpu_hours'), r)})",
              "each job's wasted GPU hours (a check on the loss parts, which add up to it)"),
        Query("loss", f"sum by ({job}, {part}) ({counted(s('job.ofu.loss.gpu_hours'), r)})",
              "each job's GPU hours lost per loss part"),
        Query("gain", f"sum by ({job}, {part}) ({counted(s('job.ofu.gain.gpu_hours'), r)})",
              "each job's GPU hours gained per part (the SM clock above f_ref)"),
        Query("flops", f"sum by ({job}) ({counted(s('job.flops'), r)})", "each job's FLOPs"),
        Query("gpus", f"max by ({job}) (max_over_time({s('job.gpus')}[{r}]))", "each job's most GPUs at once"),
        Query("first", f"min by ({job}) (min_over_time(timestamp({s('job.gpus')})[{r}:{step}]))",
              f"when each job was first seen (to the subquery's step, {step})"),
        Query("last", f"max by ({job}) (max_over_time(timestamp({s('job.gpus')})[{r}:{step}]))",
              "when each job was last seen"),
        *(Query(f"ofu_p{int(q * 100)}",
                f"max by ({job}) (quantile_over_time({q}, {s('job.ofu', {WINDOW: short})}[{r}]))",
                f"the {int(q * 100)}th percentile of each job's {short} OFU samples") for q in (0.1, 0.5, 0.9)),
        Query("mfu", f"avg by ({job}) (avg_over_time({s('job.mfu.reported', {WINDOW: short})}[{r}]))",
              f"each job's reported MFU, the mean of its {short} samples"),
        Query("causes", f"max by ({job}, {part}, {cause}) (last_over_time({s('job.ofu.loss', {WINDOW: LIFE})}[{r}]))",
              "each job's loss parts' dominant causes, over its life"),
        Query("finding_max", f"max by ({finding}) (max_over_time({s('job.finding')}[{r}]))",
              "the findings open in the range (1)"),
        Query("finding_opened", f"min by ({finding}) (min_over_time(timestamp({s('job.finding')} == 1)[{r}:{step}]))",
              "when each finding was first seen open"),
        Query("finding_seen", f"max by ({finding}) (max_over_time(timestamp({s('job.finding')})[{r}:{step}]))",
              "when each finding's series was last seen (its close marker, 0, when closed)"),
        Query("finding_last", f"max by ({finding}) (last_over_time({s('job.finding')}[{r}]))",
              "each finding's last value: 0 once it closed"),
        Query("unallocated", f"sum({counted(s('fleet.gpu_hours', {LOSS_PART: UNALLOCATED}), r)})",
              "the GPU hours of no job (the fleet's account is the jobs' accounts and these)"),
        Query("cost", f"sum by ({job}, {part}, {currency}) ({counted(s('job.cost'), r)})",
              "each job's money per part (useful and each loss part) and currency (job.cost, the jobs processor's "
              "prices)"),
        Query("cost_gained", f"sum by ({job}, {part}, {currency}) ({counted(s('job.cost.gained'), r)})",
              "each job's money gained per part (the SM clock above f_ref)"),
        Query("cost_unallocated", f"sum by ({currency}) ({counted(s('fleet.cost', {LOSS_PART: UNALLOCATED}), r)})",
              "the money of the GPU hours of no job"),
        Query("opencost_price", f"avg(avg_over_time({OPENCOST_GPU_PRICE}[{r}]))",
              "OpenCost's price of a GPU-hour, the mean over its nodes and the range (used without job.cost)"),
        Query("fleet_gpus", f"count(count by ({gpu}) (last_over_time({s('gpu.ofu')}[{lookback}])))",
              f"the GPUs that reported OFU in the range's last {lookback}"),
    ]
    return out


def detect_naming(backend: Backend, start: float, end: float) -> Naming:
    """The naming whose ``job.gpu_seconds`` series the backend holds over [start, end] (one label-values
    query); a :class:`ReportError` naming what was looked for when none is."""
    names = [n.metric(PRESENCE_METRIC) for n in NAMINGS]
    match = "{__name__=~" + json.dumps("|".join(re.escape(n) for n in names)) + "}"
    try:
        found = set(backend.get("/api/v1/label/__name__/values",
                                {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"}))
    except BackendError as exc:
        raise ReportError(str(exc)) from None
    for naming in NAMINGS:
        if naming.metric(PRESENCE_METRIC) in found:
            return naming
    raise ReportError(f"{redact_url(backend.url)} holds no otel-ofu job series from {_iso(start)} to {_iso(end)}: "
                      f"looked for {', '.join(names)} (the jobs processor's {PRESENCE_METRIC} under each road's "
                      "naming, docs/backends.md). Is the jobs processor in the pipeline that exports there "
                      "(docs/components/processors/jobs.md), and is the range right (--start, --end)?")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def run_queries(backend: Backend, plan: list[Query], at: float) -> dict[str, list[dict[str, Any]]]:
    """Each query's vector result (``[{"metric": labels, "value": [t, "v"]}]``) by key."""
    out: dict[str, list[dict[str, Any]]] = {}
    for query in plan:
        try:
            data = backend.get("/api/v1/query", {"query": query.expr, "time": f"{at:.3f}"})
        except BackendError as exc:
            raise ReportError(f"query {query.key} failed: {exc}\n  query: {query.expr}") from None
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            raise ReportError(f"{redact_url(backend.url)}: query {query.key}: expected a vector, got "
                              f"{str(data)[:120]}\n  query: {query.expr}")
        out[query.key] = data["result"]
    return out


def _values(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    """``{label values: value}`` of a vector, non-finite values left out (no value, never 0)."""
    out: dict[tuple[str, ...], float] = {}
    for sample in result:
        value = float(sample["value"][1])
        if math.isfinite(value):
            out[tuple(sample["metric"].get(label, "") for label in labels)] = value
    return out


def _cost_accounts(results: dict[str, list[dict[str, Any]]], job: str, part: str, currency: str
                   ) -> tuple[str | None, dict[str, LossTotals], list[str]]:
    """Each job's cost account (jobs.cost: money x 3600 per part, as :class:`LossTotals` "seconds") from its
    ``job.cost`` and ``job.cost.gained`` increases, in the currency with the most money; the others noted."""
    spent = _values(results.get("cost", []), job, part, currency)
    gained = _values(results.get("cost_gained", []), job, part, currency)
    by_currency: dict[str, float] = {}
    for (_, _, c), v in spent.items():
        by_currency[c] = by_currency.get(c, 0.0) + v
    if not by_currency:
        return None, {}, []
    chosen = max(sorted(by_currency), key=lambda c: by_currency[c])
    notes = [f"job.cost in {c} ({v:.2f}) left out: the report shows one currency, {chosen}"
             for c, v in sorted(by_currency.items()) if c != chosen]
    spent_by_job: dict[str, dict[str, float]] = {}
    gained_by_job: dict[str, dict[str, float]] = {}
    for (j, p, c), v in spent.items():
        if c == chosen and v >= 0:
            spent_by_job.setdefault(j, {})[p] = v
    for (j, p, c), v in gained.items():
        if c == chosen:
            gained_by_job.setdefault(j, {})[p] = v
    accounts = {j: cost_from_counters(parts, gained_by_job.get(j, {})) for j, parts in spent_by_job.items()}
    return chosen or None, accounts, notes


def report_from_results(results: dict[str, list[dict[str, Any]]], naming: Naming, url: str, start: float,
                        end: float, config: JobsConfig, config_source: str = "default settings") -> Report:
    """The :class:`Report` the answers make (pure: the unit tests feed it captured answers)."""
    job, part, cause = (naming.label(k) for k in (JOB_ID, LOSS_PART, LOSS_CAUSE))
    kind, finding_cause = naming.label(FINDING_KIND), naming.label(FINDING_CAUSE)
    gpu_s = {k[0]: v for k, v in _values(results["gpu_seconds"], job).items() if k[0] and v > 0}
    if not gpu_s:
        raise ReportError(f"{url}: no job held GPU time from {_iso(start)} to {_iso(end)}: "
                          f"the increase of {naming.metric(PRESENCE_METRIC)} is empty (a job's counter needs a "
                          "sample in the range)")
    wasted = {k[0]: v for k, v in _values(results["wasted"], job).items()}
    lost: dict[str, dict[str, float]] = {}
    for (j, p), v in _values(results["loss"], job, part).items():
        lost.setdefault(j, {})[p] = v
    gained: dict[str, dict[str, float]] = {}
    for (j, p), v in _values(results["gain"], job, part).items():
        gained.setdefault(j, {})[p] = v
    causes: dict[str, dict[str, str]] = {}
    for (j, p, c), _ in _values(results["causes"], job, part, cause).items():
        if c:
            causes.setdefault(j, {})[p] = c
    flops = {k[0]: v for k, v in _values(results["flops"], job).items()}
    gpus = {k[0]: v for k, v in _values(results["gpus"], job).items()}
    first = {k[0]: v for k, v in _values(results["first"], job).items()}
    last = {k[0]: v for k, v in _values(results["last"], job).items()}
    quantiles = {q: {k[0]: v for k, v in _values(results[f"ofu_p{q}"], job).items()} for q in (10, 50, 90)}
    mfu = {k[0]: v for k, v in _values(results["mfu"], job).items()}
    resolution = float(config.resolution)

    findings: dict[str, list[dict[str, Any]]] = {}
    finding_labels = (job, kind, finding_cause)
    opened = _values(results["finding_opened"], *finding_labels)
    seen = _values(results["finding_seen"], *finding_labels)
    final = _values(results["finding_last"], *finding_labels)
    for key, peak in sorted(_values(results["finding_max"], *finding_labels).items()):
        if peak < 1 or key not in opened:
            continue
        j, k, c = key
        closed = seen.get(key) if final.get(key) == 0 else None
        # Closed with its job: the close marker where the job's series end (the jobs processor closes a job's
        # findings at its end).
        with_job = closed is not None and j in last and closed >= last[j] - resolution
        job_start = max(start, first.get(j, start) - resolution)
        record = _finding_record(k, c, f"{j}/{k}/{len(findings.get(j, [])) + 1}", opened[key], opened[key], closed,
                                 {}, {"reason": "job_end"} if with_job else {}, job_start)
        findings.setdefault(j, []).append(record)

    notes = []
    currency, costs, cost_notes = _cost_accounts(results, job, part, naming.label(COST_CURRENCY))
    notes += cost_notes
    opencost = next(iter(_values(results.get("opencost_price", [])).values()), None)
    price = opencost if not costs and opencost is not None and opencost > 0 else None
    if costs:
        notes.append(f"cost: the jobs processor's {naming.metric('job.cost')} increases, in {currency}")
    elif price is not None:
        currency = config.cost.currency
        notes.append(f"cost: no {naming.metric('job.cost')} in the range: each job's GPU hours x OpenCost's "
                     f"{OPENCOST_GPU_PRICE}, the mean over its nodes and the range ({price:.4f} {currency} per "
                     "GPU-hour; the job series carry no node to join on), in the jobs settings' cost.currency")
    if currency is not None and currency != config.cost.currency:
        config = replace(config, cost=replace(config.cost, currency=currency))
    jobs = []
    for j, seconds in gpu_s.items():
        loss = loss_from_counters(seconds, lost.get(j, {}), gained.get(j, {}), causes.get(j, {}), wasted.get(j))
        if j in wasted and lost.get(j) and abs(sum(lost[j].values()) - wasted[j]) > 0.01 * max(wasted[j], 1e-9):
            notes.append(f"{j}: its loss parts add up to {sum(lost[j].values()):.3f} GPU h, its "
                         f"{naming.metric('job.wasted_gpu_hours')} increase is {wasted[j]:.3f}: the parts are shown")
        totals = JobTotals()
        totals.exact_gpu_seconds = loss.exact_seconds
        totals.exact_wasted_gpu_seconds = sum(c for p, c in loss.exact_parts.items() if p != USEFUL)
        totals.exact_gained_gpu_seconds = sum(loss.exact_gains.values())
        totals.exact_ofu_gpu_seconds = loss.exact_parts[USEFUL]
        if j in flops:
            totals.exact_flop, totals.exact_flop_gpu_seconds = exact(flops[j]), loss.exact_seconds
        peak = int(gpus.get(j, 0))
        job_start = max(start, first.get(j, start) - resolution)
        cost = costs.get(j)
        if price is not None:  # OpenCost's price: the job's account in money, part by part
            cost = LossTotals()
            cost.merge(loss, factor=price)
        summary = JobSummary(j, job_start, min(end, last.get(j, end)), "end_of_range", peak, peak, totals,
                             quantiles[10].get(j), quantiles[50].get(j), quantiles[90].get(j), mfu.get(j), {}, [],
                             ((JOB_ID, j),), loss=loss, cost=cost)
        jobs.append(JobReport(summary, findings=sorted(findings.get(j, []), key=lambda f: f["time_unix_nano"])))
    jobs.sort(key=lambda r: (-r.summary.totals.wasted_gpu_hours, r.summary.job_id))

    # The fleet's account: the jobs' (so that it adds up to them exactly) and the GPU time of no job.
    book = JobBook(config)
    for r in jobs:
        book.fleet_loss.merge(r.summary.loss)
        if r.summary.cost is not None:
            book.fleet_cost.merge(r.summary.cost)
    unallocated = _values(results["unallocated"])
    if unallocated:
        seconds = max(0.0, next(iter(unallocated.values()))) * 3600.0
        book.fleet_loss.add_unallocated(seconds)
        book.unattributed.exact_gpu_seconds = book.unattributed.exact_wasted_gpu_seconds = exact(seconds)
        if price is not None:
            book.fleet_cost.add_unallocated(seconds * price)
    else:
        notes.append(f"no {naming.metric('fleet.gpu_hours')} in the range: the GPU time of no job is not known, "
                     "the fleet's figures are the jobs'")
    if costs:  # the money of no job: fleet.cost's unallocated part, in the report's currency
        idle_money = _values(results.get("cost_unallocated", []), naming.label(COST_CURRENCY)).get((currency or "",))
        if idle_money is not None:
            book.fleet_cost.add_unallocated(max(0.0, idle_money) * 3600.0)
    fleet_gpus = _values(results["fleet_gpus"])
    source = InputFile(url, format=BACKEND_FORMAT, lines=len(results), first=start, last=end,  # type: ignore[arg-type]
                       notes=[f"naming: {naming.key}: {naming.description}", *notes])
    return Report(url, len(results), start, end, "backend", jobs, book, [source], [], 0, config_source, [], False,
                  gpus_seen=int(next(iter(fleet_gpus.values()), 0)), lines_word="queries", jobs_source="backend")


def build_backend_report(backend: Backend, start: float | None = None, end: float | None = None,
                         config: JobsConfig | None = None, config_source: str = "default jobs settings") -> Report:
    """Detect the naming, run :func:`queries` at ``end`` over [start, end] (default: the last 24 h) and build
    the report."""
    config = config or JobsConfig()
    end = time.time() if end is None else end
    start = end - 86400.0 if start is None else start
    if not end > start:
        raise ReportError(f"--start ({_iso(start)}) must be before --end ({_iso(end)})")
    naming = detect_naming(backend, start, end)
    plan = queries(naming, end - start, config)
    began = time.monotonic()
    results = run_queries(backend, plan, end)
    log.info("%d queries to %s (%s naming) in %.2fs", len(plan), redact_url(backend.url), naming.key,
             time.monotonic() - began)
    return report_from_results(results, naming, redact_url(backend.url), start, end, config, config_source)



def queries_table() -> str:
    """docs/report.md's list of the queries (Prometheus naming, a 30-day range, default jobs settings)."""
    from otel_ofu.cli.backend_check import PROMETHEUS_NAMING

    month = 30 * 86400.0
    config = JobsConfig()
    rows = ["| answer | query, evaluated at the range's end |", "|---|---|"]
    for query in queries(PROMETHEUS_NAMING, month, config):
        expr = query.expr
        cell = expr.replace("|", "\\|")
        rows.append(f"| {query.what} | `{cell}` |")
    return "\n".join(rows)
