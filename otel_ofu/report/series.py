"""The report's job table from the jobs processor's own output in a recording, instead of a replay.

A recording made behind the ``jobs`` processor already holds every job's answer: its cumulative
counters (``job.gpu_seconds``, ``job.wasted_gpu_hours``, ``job.ofu.loss.gpu_hours`` and
``job.ofu.gain.gpu_hours`` by part, ``job.flops``, ``job.energy``, ``job.cost`` ...), which end with the
job's final values at its end, and its ``ofu.job.end`` event (percentiles, distinct GPUs, reason).
Reading those is a few numbers per job and minute; replaying the GPU points through a
:class:`~otel_ofu.jobs.book.JobBook` is the jobs processor's whole work again, 10-30 times the decode of
the recording (issue 33, BENCHMARKS.md §16). The GPU points are read only for what only they give:
the per-GPU table, each job's GPUs, precisions and OFU distribution while it runs, and the GPU time of
no job (replayed through a JobBook, so that the fleet's account counts it as the processor does).

What this gives is what the jobs processor computed, with the settings it ran with; ``--recompute``
replays the GPU points with the report's settings instead (docs/report.md#two-ways-to-read-a-recording).
The answers are built into the same :class:`~otel_ofu.report.build.Report` as the replay's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.core import specs
from otel_ofu.core.exact import exact
from otel_ofu.core.loss import UNKNOWN, USEFUL, LossTotals
from otel_ofu.core.model import (
    COST_CURRENCY,
    JOB_ID,
    JOB_RUN,
    LOSS_CAUSE,
    LOSS_PART,
    Attributes,
    Event,
    GpuKey,
    MetricPoint,
    job_id_of,
)
from otel_ofu.jobs.aggregate import JobTotals, WeightedHistogram
from otel_ofu.jobs.book import ENERGY_METRIC, OFU_METRIC, SHARE_METRIC, JobBook
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.jobs.cost import Pricer
from otel_ofu.jobs.facts import gpu_facts, job_key, key_job_id
from otel_ofu.jobs.findings import EVENT_JOB_END, EVENT_JOB_START, JOB_END_REASON, WINDOW
from otel_ofu.jobs.tracker import LIFE, JobSummary
from otel_ofu.report.points import PointFilter, PointStore

# The jobs processor's series the job table is built from: its cumulative counters (the last value of each is
# the job's total) and the gauges that say what no counter does.
COUNTERS = ("job.gpu_seconds", "job.wasted_gpu_hours", "job.flops", "job.energy", "job.ofu.loss.gpu_hours",
            "job.ofu.gain.gpu_hours", "job.cost", "job.cost.gained", "job.stalled_gpu_hours")
GAUGES = ("job.gpus", "job.ofu.loss", "job.mfu.reported", "job.energy.per_useful_pflop")
JOB_SERIES = frozenset(COUNTERS + GAUGES)
# The GPU points read beside them: OFU per window, a shared GPU's job's part, the window's energy (the GPU time
# of no job is replayed with them).
GPU_SERIES = frozenset({OFU_METRIC, SHARE_METRIC, ENERGY_METRIC})
PRESENCE = "job.gpu_seconds"  # a recording with this holds the jobs processor's output


def names() -> set[str]:
    """Every metric the series report reads."""
    return set(JOB_SERIES | GPU_SERIES)


def point_filter(config: JobsConfig) -> PointFilter:
    """What the series report leaves out as it reads: a GPU's share and energy where a job holds it (its series
    count them), the job gauges over rolling windows (only their values over the job's life are read)."""
    return PointFilter(frozenset({SHARE_METRIC, ENERGY_METRIC}), frozenset(config.ignore_jobs),
                       (("job.ofu.loss", WINDOW, LIFE), ("job.mfu.reported", WINDOW, LIFE)))


def has_job_series(store: PointStore) -> bool:
    """Whether the recording holds the jobs processor's job series."""
    import numpy

    if PRESENCE not in store.names or not len(store):
        return False
    code = store.names.index(PRESENCE)
    return bool((numpy.frombuffer(store.metric, dtype=numpy.int8) == code).any())


@dataclass
class JobSeries:
    """One job incarnation's series in the recording: each counter's last value, the gauges that matter."""

    resource: Attributes
    first: float = math.inf  # data seconds of its first and last series point
    last: float = -math.inf
    counters: dict[tuple[str, Attributes], float] = field(default_factory=dict)  # (metric, attributes) -> last value
    peak_gpus: int = 0
    causes: dict[str, str] = field(default_factory=dict)  # loss part -> dominant cause over its life (last seen)
    mfu_life: float | None = None
    energy_per_pflop: float | None = None
    end: Event | None = None
    incarnation: int = 0  # how many ends of its job id (and run) came before it
    started: float | None = None  # its ofu.job.start event's time
    # Its counters stop short of its end event's totals: recorded by an otel-ofu whose jobs processor sent no
    # final values at a job's end (before issue 33), so its last, partial bin is missing.
    short: bool = False
    fell: bool = False  # its job.gpu_seconds fell somewhere: its last values are not its totals (read_series)

    @property
    def key(self) -> tuple[str, int]:
        """Which job incarnation: its JobBook key and how many ends of it came before (GpuPass' keys)."""
        return _job_key(self.resource), self.incarnation

    def counter(self, name: str) -> float | None:
        return self.counters.get((name, ()))

    def by_part(self, name: str) -> dict[str, float]:
        return {dict(a).get(LOSS_PART, ""): v for (n, a), v in self.counters.items() if n == name}


@dataclass
class GpuPass:
    """What the GPU points add: each job's GPUs, precisions and OFU distribution (by its book key), and which
    rows are GPU time of no job (replayed for the fleet's account)."""

    # By job incarnation: (JobBook key, how many of its ends came before).
    gpus: dict[tuple[str, int], set[GpuKey]] = field(default_factory=dict)
    precisions: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    histograms: dict[tuple[str, int], WeightedHistogram] = field(default_factory=dict)
    priced_by: dict[tuple[str, int], Any] = field(default_factory=dict)  # its first GPU's facts (what prices it)
    unattributed: Any = None  # numpy bool mask over the store's rows


def _job_key(resource: Attributes) -> str:
    """The JobBook key of a job resource: its id, and its run when it has one."""
    values = dict(resource)
    return job_key(str(values.get(JOB_ID, "")), str(values.get(JOB_RUN) or ""))


# A job's final counters go at its end, or 1 ms after it (processors/jobs.py _final_ns): they are its.
FINAL_POINTS_AFTER_END_NS = 1_000_000


def _end_events(events: list[Event]) -> dict[str, list[Event]]:
    """Each job's (JobBook key's) ``ofu.job.end`` events, in time order."""
    out: dict[str, list[Event]] = {}
    for event in events:
        if event.name == EVENT_JOB_END:
            out.setdefault(_job_key(event.resource), []).append(event)
    for listed in out.values():
        listed.sort(key=lambda e: e.time_unix_nano)
    return out


def job_ends(events: list[Event]) -> dict[str, list[int]]:
    """Each job's (JobBook key's) ends, ns in order, each moved to the last time its final points may have:
    what cuts its points into incarnations (a point at or before the n-th is of incarnation n)."""
    return {key: [e.time_unix_nano + FINAL_POINTS_AFTER_END_NS for e in listed]
            for key, listed in _end_events(events).items()}


def read_series(store: PointStore, events: list[Event]) -> list[JobSeries]:
    """Each job incarnation's series: a job's points split at its ``ofu.job.end`` events (a job id seen again
    after its end is a new job, as the jobs processor counts it)."""
    import numpy

    codes = {name: store.names.index(name) for name in JOB_SERIES if name in store.names}
    if not codes or not len(store):
        return []
    times = numpy.frombuffer(store.times, dtype=numpy.int64)
    metrics = numpy.frombuffer(store.metric, dtype=numpy.int8)
    resources = numpy.frombuffer(store.resource, dtype=numpy.int32)
    attrs = numpy.frombuffer(store.attrs, dtype=numpy.int32)
    values = numpy.frombuffer(store.values, dtype=numpy.float64)
    rows = numpy.flatnonzero(numpy.isin(metrics, numpy.array(sorted(codes.values()), dtype=numpy.int8)))
    # The ends of each job (by resource) in time order: they cut its points into incarnations.
    ends = _end_events(events)
    starts: dict[str, list[int]] = {}
    for event in events:
        if event.name == EVENT_JOB_START:
            starts.setdefault(_job_key(event.resource), []).append(event.time_unix_nano)
    # The last row of each (resource, metric, attributes, incarnation): sort rows by those, then time.
    order = rows[numpy.lexsort((times[rows], attrs[rows], metrics[rows], resources[rows]))]
    res_sorted = resources[order]
    incarnation = numpy.zeros(len(order), dtype=numpy.int64)
    boundaries = numpy.flatnonzero(numpy.diff(res_sorted)) + 1
    segments = numpy.split(numpy.arange(len(order)), boundaries) if len(order) else []
    resource_keys: dict[int, str] = {}
    for segment in segments:
        code = int(res_sorted[segment[0]])
        key = resource_keys[code] = _job_key(store.attributes[code])
        job_ends = ends.get(key)
        if job_ends:
            cuts = numpy.array([e.time_unix_nano + FINAL_POINTS_AFTER_END_NS for e in job_ends], dtype=numpy.int64)
            incarnation[segment] = numpy.searchsorted(cuts, times[order[segment]], side="left")
    keys = numpy.stack([res_sorted, incarnation, metrics[order], attrs[order]])
    changed = numpy.any(keys[:, 1:] != keys[:, :-1], axis=0) if len(order) > 1 else numpy.zeros(0, dtype=bool)
    last_rows = order[numpy.flatnonzero(numpy.append(changed, True))] if len(order) else order
    last_inc = incarnation[numpy.flatnonzero(numpy.append(changed, True))] if len(order) else incarnation
    # Each incarnation's first and last time, and its peak GPUs (job.gpus' most).
    spans: dict[tuple[int, int], list[float]] = {}
    first_rows = order[numpy.flatnonzero(numpy.insert(changed, 0, True))] if len(order) else order
    first_inc = incarnation[numpy.flatnonzero(numpy.insert(changed, 0, True))] if len(order) else incarnation
    for row, inc in zip(first_rows.tolist(), first_inc.tolist(), strict=True):
        key = (int(resources[row]), inc)
        t = times[row] / 1e9
        span = spans.setdefault(key, [t, t])
        span[0] = min(span[0], t)
    # A counter that falls within one incarnation: two jobs instances' series of one job read together (a job that
    # moved in a jobs tier), or an instance restarted without its storage. Its last value is not the job's total.
    fell: set[tuple[int, int]] = set()
    seconds_code = codes.get(PRESENCE)
    if seconds_code is not None:
        at = numpy.flatnonzero(metrics[order] == seconds_code)
        same = (res_sorted[at][1:] == res_sorted[at][:-1]) & (incarnation[at][1:] == incarnation[at][:-1])
        for position in at[1:][same & (numpy.diff(values[order[at]]) < 0)].tolist():
            fell.add((int(res_sorted[position]), int(incarnation[position])))
    gpus_code = codes.get("job.gpus")
    peaks: dict[tuple[int, int], float] = {}
    if gpus_code is not None:
        gpu_rows = numpy.flatnonzero(metrics[order] == gpus_code)
        for position in gpu_rows.tolist():
            key = (int(res_sorted[position]), int(incarnation[position]))
            peaks[key] = max(peaks.get(key, 0.0), float(values[order[position]]))
    names_by_code = {code: name for name, code in codes.items()}
    jobs: dict[tuple[int, int], JobSeries] = {}
    causes_seen: dict[tuple[tuple[int, int], str], tuple[int, float, str]] = {}
    for row, inc in zip(last_rows.tolist(), last_inc.tolist(), strict=True):
        code = int(resources[row])
        key = (code, inc)
        series = jobs.get(key)
        if series is None:
            series = jobs[key] = JobSeries(store.attributes[code])
            series.first, series.last = spans.get(key, [math.inf])[0], -math.inf
            series.peak_gpus = int(peaks.get(key, 0))
            series.incarnation = inc
            series.fell = key in fell
            job_ends = ends.get(resource_keys[code], [])
            if inc < len(job_ends):
                series.end = job_ends[inc]
        name = names_by_code[int(metrics[row])]
        point_attrs = store.attributes[int(attrs[row])]
        value = float(values[row])
        series.last = max(series.last, times[row] / 1e9)
        if name in COUNTERS:
            series.counters[(name, _without(point_attrs, WINDOW))] = value
            continue
        window = dict(point_attrs).get(WINDOW)
        if name == "job.ofu.loss" and window == LIFE:
            part, cause = dict(point_attrs).get(LOSS_PART), dict(point_attrs).get(LOSS_CAUSE)
            if part and cause:  # the newest point's cause; the clock has one per cause: the largest is dominant
                seen = (int(times[row]), value, str(cause))
                if seen > causes_seen.setdefault((key, str(part)), seen):
                    causes_seen[(key, str(part))] = seen
        elif name == "job.mfu.reported" and window == LIFE:
            series.mfu_life = value
        elif name == "job.energy.per_useful_pflop":
            series.energy_per_pflop = value
    for (key, part), (_, _, cause) in causes_seen.items():
        jobs[key].causes[part] = cause
    out = list(jobs.values())
    for series in out:
        job_starts = [t / 1e9 for t in starts.get(_job_key(series.resource), []) if t / 1e9 <= series.first + 1e-9]
        if job_starts:
            series.started = max(job_starts)
    return out


def _without(attributes: Attributes, key: str) -> Attributes:
    return tuple(kv for kv in attributes if kv[0] != key)


def gpu_pass(store: PointStore, config: JobsConfig, gpu_window: Callable[..., float | None],
             ends: dict[str, list[int]] | None = None) -> GpuPass:
    """One pass over the ``gpu.ofu`` points, GPU by GPU in time order: ``gpu_window`` takes each (its GPU,
    resource, time, first window's start, value and job id: the report's per-GPU table, build.gpu_window) and
    returns the start of the window it closes (None: not counted). Each
    job incarnation (split at ``ends``, :func:`job_ends`) gets its GPUs, precisions and OFU distribution from
    those windows; the rows of GPU time of no job are marked for the fleet's account."""
    import bisect

    import numpy

    out = GpuPass()
    if OFU_METRIC not in store.names or not len(store):
        return out
    times = numpy.frombuffer(store.times, dtype=numpy.int64)
    metrics = numpy.frombuffer(store.metric, dtype=numpy.int8)
    resources = numpy.frombuffer(store.resource, dtype=numpy.int32)
    attrs = numpy.frombuffer(store.attrs, dtype=numpy.int32)
    values = numpy.frombuffer(store.values, dtype=numpy.float64)
    rows = numpy.flatnonzero(metrics == store.names.index(OFU_METRIC))
    # What each distinct (resource, attributes) pair says: its GPU, its jobs, whether its time is no job's.
    pairs = resources[rows].astype(numpy.int64) << 32 | attrs[rows].astype(numpy.int64)
    distinct, which = numpy.unique(pairs, return_inverse=True)
    ignored = set(config.ignore_jobs)
    facts_of: list[Any] = []
    gpu_numbers: dict[GpuKey, int] = {}
    pair_gpu: list[int] = []
    no_job: list[bool] = []
    job_ids: list[str | None] = []  # the point's ofu.job.id, as the per-GPU table lists it
    for value in distinct.tolist():
        point = MetricPoint(OFU_METRIC, 0.0, 1, store.attributes[value >> 32], store.attributes[value & 0xFFFFFFFF])
        facts = gpu_facts(point)
        facts_of.append(facts)
        job_ids.append(job_id_of(point))
        pair_gpu.append(gpu_numbers.setdefault(facts.gpu, len(gpu_numbers)))
        no_job.append(facts.job is None or (facts.shared and not config.include_shared)
                      or all(key_job_id(name) in ignored for name in facts.jobs))
    mask = numpy.zeros(len(store), dtype=bool)
    unattributed = numpy.array(no_job, dtype=bool)[which] if len(rows) else numpy.zeros(0, dtype=bool)
    if unattributed.any():
        mask[rows[unattributed]] = True
        # ... with their windows' share and energy points (same resources), for the replay of them.
        other_codes = [store.names.index(n) for n in (SHARE_METRIC, ENERGY_METRIC) if n in store.names]
        others = numpy.flatnonzero(numpy.isin(metrics, numpy.array(other_codes or [-1], dtype=numpy.int8)))
        if len(others):
            mask[others[numpy.isin(resources[others], numpy.unique(resources[rows[unattributed]]))]] = True
    out.unattributed = mask
    shares: dict[tuple[int, int], float] = {}
    if SHARE_METRIC in store.names:
        share_rows = numpy.flatnonzero(metrics == store.names.index(SHARE_METRIC))
        shares = dict(zip(zip(resources[share_rows].tolist(), times[share_rows].tolist(), strict=True),
                          values[share_rows].tolist(), strict=True))
    gpu_of_row = numpy.array(pair_gpu, dtype=numpy.int64)[which] if len(rows) else numpy.zeros(0, dtype=numpy.int64)
    by_gpu = numpy.lexsort((times[rows], gpu_of_row))  # GPU by GPU, in time order (ties as recorded)
    order, gpu_sorted, pair_sorted = rows[by_gpu], gpu_of_row[by_gpu], which[by_gpu]
    t_sorted = times[order]
    # Each GPU's first point: its window as long as the spacing to the GPU's next later point (as the replay
    # takes a series' first window), when within max_gap.
    first_start: dict[int, int] = {}
    heads = numpy.flatnonzero(numpy.insert(gpu_sorted[1:] != gpu_sorted[:-1], 0, True)) if len(order) else []
    max_gap_ns = float(config.max_gap) * 1e9
    for head in numpy.asarray(heads).tolist():
        t0, gpu = int(t_sorted[head]), int(gpu_sorted[head])
        for later in range(head + 1, min(head + 8, len(order))):
            if int(gpu_sorted[later]) != gpu:
                break
            if int(t_sorted[later]) > t0:
                if int(t_sorted[later]) - t0 <= max_gap_ns:
                    first_start[head] = 2 * t0 - int(t_sorted[later])
                break
    attributes = store.attributes
    for position, (t_ns, res, pair, value) in enumerate(zip(
            t_sorted.tolist(), resources[order].tolist(), pair_sorted.tolist(), values[order].tolist(), strict=True)):
        facts = facts_of[pair]
        start = gpu_window(facts.gpu, attributes[res], t_ns, first_start.get(position, 0), value, job_ids[pair])
        if start is None or no_job[pair]:
            continue
        share = shares.get((res, t_ns)) if shares else None
        seconds = (t_ns / 1e9 - start) * (share if share is not None else 1.0 / max(1, len(facts.jobs)))
        precision = facts.normalized_precision or specs.UNKNOWN_PRECISION
        for name in facts.jobs:
            if key_job_id(name) in ignored:
                continue
            cuts = ends.get(name) if ends else None
            job = (name, bisect.bisect_left(cuts, t_ns) if cuts else 0)
            histogram = out.histograms.get(job)
            if histogram is None:
                histogram = out.histograms[job] = WeightedHistogram()
                out.priced_by[job] = facts
                out.gpus[job] = set()
                out.precisions[job] = {}
            histogram.add(value, seconds)
            out.gpus[job].add(facts.gpu)
            by_precision = out.precisions[job]
            by_precision[precision] = by_precision.get(precision, 0.0) + seconds
    return out


def loss_from_counters(gpu_s: float, lost_h: dict[str, float], gained_h: dict[str, float], causes: dict[str, str],
                       wasted_h: float | None = None) -> LossTotals:
    """A job's account from its counters (their last values in a recording, their increases in a backend): each
    part what it lost (a part at 0 kept, as the jobs processor writes it), ``useful`` the rest of its GPU time, so
    the shares add up to 1 exactly; without loss parts its waste is all ``unknown``."""
    lost = {part: h for part, h in lost_h.items() if h >= 0}
    if not any(h > 0 for h in lost.values()) and wasted_h:
        lost = {UNKNOWN: wasted_h}
    totals = LossTotals()
    totals.exact_seconds = exact(gpu_s)
    totals.exact_parts = {part: exact(h * 3600.0) for part, h in lost.items()}
    totals.exact_gains = {part: exact(h * 3600.0) for part, h in gained_h.items() if h > 0}
    totals.exact_parts[USEFUL] = (totals.exact_seconds - sum(totals.exact_parts.values())
                                  + sum(totals.exact_gains.values()))
    totals.exact_causes = {(part, cause): totals.exact_parts[part] for part, cause in causes.items()
                           if part in totals.exact_parts}
    return totals


def cost_from_counters(spent: dict[str, float], gained: dict[str, float]) -> LossTotals:
    """A job's cost account from its ``job.cost`` and ``job.cost.gained`` counters by part, in one currency (their
    last values in a recording, their increases in a backend): money x 3600 per part, as LossTotals "seconds"
    (jobs.cost); a part that lost nothing is 0, as the jobs processor writes it."""
    account = LossTotals()
    account.exact_parts = {part: exact(value * 3600.0) for part, value in spent.items() if value >= 0}
    account.exact_gains = {part: exact(value * 3600.0) for part, value in gained.items() if value > 0}
    account.exact_seconds = sum(account.exact_parts.values()) - sum(account.exact_gains.values())
    return account


def _cost(series: JobSeries, currency: str) -> LossTotals | None:
    """Its cost account in ``currency`` from its job.cost and job.cost.gained; None without job.cost in it."""
    by_name: dict[str, dict[str, float]] = {"job.cost": {}, "job.cost.gained": {}}
    for (name, point_attrs), value in series.counters.items():
        values = dict(point_attrs)
        if name in by_name and values.get(COST_CURRENCY, "") == currency:
            by_name[name][str(values.get(LOSS_PART, ""))] = value
    if not by_name["job.cost"]:
        return None
    return cost_from_counters(by_name["job.cost"], by_name["job.cost.gained"])


def summary_of(series: JobSeries, gpus: GpuPass, config: JobsConfig, resolution: float) -> JobSummary | None:
    """The :class:`JobSummary` a job's series and end event make; None for one with no GPU time."""
    seconds = series.counter("job.gpu_seconds")
    if seconds is None or seconds <= 0:
        return None
    end = dict(series.end.attributes) if series.end is not None else {}
    key = series.key
    loss = loss_from_counters(seconds, series.by_part("job.ofu.loss.gpu_hours"),
                              series.by_part("job.ofu.gain.gpu_hours"), series.causes,
                              series.counter("job.wasted_gpu_hours"))
    totals = JobTotals()
    totals.exact_gpu_seconds = loss.exact_seconds
    totals.exact_wasted_gpu_seconds = sum(c for p, c in loss.exact_parts.items() if p != USEFUL)
    totals.exact_gained_gpu_seconds = sum(loss.exact_gains.values())
    totals.exact_ofu_gpu_seconds = loss.exact_parts[USEFUL]
    flop = series.counter("job.flops")
    if flop is not None:
        totals.exact_flop, totals.exact_flop_gpu_seconds = exact(flop), loss.exact_seconds
    energy = series.counter("job.energy")
    if energy is not None:
        totals.exact_energy, totals.exact_energy_gpu_seconds = exact(energy), loss.exact_seconds
        per_pflop = end.get("ofu.job.energy.per_useful_pflop", series.energy_per_pflop)
        if per_pflop is not None and float(per_pflop) > 0:
            totals.exact_energy_of_flop = exact(energy)
            totals.exact_flop_of_energy = exact(energy / float(per_pflop) * 1e15)
    histogram = gpus.histograms.get(key, WeightedHistogram())
    if series.end is not None:
        recorded_hours = end.get("ofu.job.gpu_hours")
        series.short = recorded_hours is not None and seconds < float(recorded_hours) * 3600.0 * (1 - 1e-9)
        job_end = series.end.time_unix_nano / 1e9
        start = job_end - float(end.get("ofu.job.duration_s", job_end - series.first))
        reason = str(end.get(JOB_END_REASON, "end_of_recording"))
        distinct, peak = int(end.get("ofu.job.gpus", 0)), int(end.get("ofu.job.gpus.peak", series.peak_gpus))
        quantiles = [end.get(f"ofu.job.ofu.p{q}") for q in (10, 50, 90)]
        mfu = end.get("ofu.job.mfu.reported", series.mfu_life)
    else:
        start = series.started if series.started is not None else series.first - resolution
        job_end, reason = series.last, "end_of_recording"
        distinct, peak = len(gpus.gpus.get(key, ())) or series.peak_gpus, series.peak_gpus
        quantiles = [histogram.quantile(q) for q in (0.1, 0.5, 0.9)]
        mfu = series.mfu_life
    stalled = series.counter("job.stalled_gpu_hours")
    cost = None
    if config.cost.enabled:  # priced as the report's settings say: the recorded job.cost, else its GPUs' price
        cost = _cost(series, config.cost.currency)
        facts = gpus.priced_by.get(key)
        if cost is None and facts is not None:
            pricer = Pricer(config.cost)
            price = pricer.price(pricer.key(facts.attributes))
            if price is not None:
                cost = LossTotals()
                cost.merge(loss, factor=price * (facts.share if facts.share is not None else 1.0))
    return JobSummary(str(dict(series.resource).get(JOB_ID, "")), start, job_end, reason, distinct,
                      max(peak, 0), totals, *(None if q is None else float(q) for q in quantiles),
                      None if mfu is None else float(mfu), gpus.precisions.get(key, {}), [], series.resource,
                      histogram, loss, cost,
                      stalled * 3600.0 if stalled is not None else 0.0)


def fleet_book(store: PointStore, jobs: list[tuple[JobSeries, JobSummary]], gpus: GpuPass, config: JobsConfig
               ) -> JobBook:
    """The fleet's account: the jobs' (so that it adds up to them exactly) and the GPU time of no job, replayed
    through a JobBook as the jobs processor counts it (its energy, price, unpriced hours)."""
    book = JobBook(config)
    if gpus.unattributed is not None and gpus.unattributed.any():
        for batch in store.in_time_order(float(config.max_gap), rows=gpus.unattributed):
            book.observe(batch)
    pricer = Pricer(config.cost)
    for job, summary in jobs:
        book.fleet_loss.merge(summary.loss)
        if summary.cost is not None:
            book.fleet_cost.merge(summary.cost)
        elif pricer.config.enabled:  # GPU time with no price
            facts = gpus.priced_by.get(job.key)
            key = pricer.key(facts.attributes if facts is not None else {})
            book.unpriced[key] = book.unpriced.get(key, 0) + exact(summary.totals.gpu_seconds)
        if summary.totals.energy is not None:
            per_pflop = summary.totals.energy_per_useful_pflop
            book.fleet_energy.add_job(summary.totals.energy, None if not per_pflop else
                                      summary.totals.energy / per_pflop * 1e15)
    return book
