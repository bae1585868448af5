"""What the console shows, built from a pipeline's points and events: the fleet, its jobs, its GPUs.

Pure bookkeeping (no terminal, no threads): :meth:`FleetState.update` takes batches,
:meth:`FleetState.view` returns a :class:`FleetView` that the renderers draw. Wall time
comes from an injected clock, so staleness is testable.

- A GPU is one row per (host, UUID or index, MIG instance): dmon replays have no UUID and
  MIG instances share their parent's UUID, so neither the UUID nor the index alone is a key.
- A GPU's OFU is either a value (its newest ``gpu.ofu``), or no value with the reason its
  newest window was dropped (``gpu.ofu.dropped``: blank, not_supported, ...), or ``stale``
  when nothing arrived for three of its own arrival intervals: never a 0 it did not report.
- The fleet's mean OFU, GPU hours and waste are time-weighted over the GPU windows the
  console saw (:class:`otel_ofu.jobs.aggregate.JobTotals`, as per-job totals are).
- Jobs come from the GPUs' ``ofu.job.id`` (on the resource, or a point attribute in older
  data); the ``jobs`` processor's metrics (``job.ofu`` over the job's life,
  ``job.mfu.reported``) and events (``ofu.finding.open/close``, ``ofu.job.end``) add life OFU,
  reported MFU and findings when it runs; with prices set there, ``job.cost`` adds what a job's
  loss parts are costing per hour (over its last few bins).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from otel_ofu.core.loss import CLOCK, USEFUL, LossTotals
from otel_ofu.core.model import (
    COST_CURRENCY,
    DROP_REASON,
    GPU_INDEX,
    GPU_MIG_PROFILE,
    HW_MODEL,
    LOSS_PART,
    NO_JOB,
    Batch,
    Event,
    GpuKey,
    MetricPoint,
    gpu_key,
    job_id_of,
    precision_of,
)
from otel_ofu.jobs.aggregate import JobTotals
from otel_ofu.jobs.findings import (
    EVENT_FINDING_CLOSE,
    EVENT_FINDING_OPEN,
    EVENT_JOB_END,
    FINDING_CAUSE,
    FINDING_ID,
    FINDING_KIND,
    JOB_END_REASON,
    WINDOW,
)
from otel_ofu.jobs.loss import LOSS_METRIC, Parts, add_window, window_parts, window_shares
from otel_ofu.pipeline.telemetry import STARTING

STALE = "stale"
NO_JOB_IDS = frozenset({NO_JOB, "unknown", ""})  # the jobs processor's default ignore_jobs
LIFE = "life"

# The console's columns come from these metrics (gpu.* from the ofu processor, job.* from jobs).
OFU, OFU_RAW, FREF, TPA, SM_CLOCK, DROPPED = ("gpu.ofu", "gpu.ofu.raw", "gpu.ofu.reference_clock",
                                             "gpu.tensor.activity", "gpu.sm.clock.frequency", "gpu.ofu.dropped")
_GPU_METRICS = frozenset({OFU, OFU_RAW, FREF, TPA, SM_CLOCK, DROPPED})
JOB_OFU, JOB_MFU, JOB_GPUS, JOB_COST = "job.ofu", "job.mfu.reported", "job.gpus", "job.cost"
COST_BINS = 6  # a job's cost lost per hour is over its last this many job.cost stamps (5 bins: 5 minutes at 1m)
JOB_ENERGY, JOB_ENERGY_PER_PFLOP = "job.energy", "job.energy.per_useful_pflop"
_JOB_METRICS = frozenset({JOB_OFU, JOB_MFU, JOB_GPUS, JOB_COST, JOB_ENERGY, JOB_ENERGY_PER_PFLOP})

@dataclass
class GpuState:
    key: GpuKey
    host: str
    index: str
    mig: str = ""
    mig_profile: str = ""
    model: str = ""
    job: str = ""
    precision: str = ""
    tpa: float | None = None
    sm_mhz: float | None = None
    fref_mhz: float | None = None
    ofu_raw: float | None = None
    ofu: float | None = None
    ofu_ns: int = 0  # data time of the newest gpu.ofu
    drop_ns: int = 0  # ... and of the newest dropped window
    drop_reason: str = ""
    data_ns: int = 0
    arrived: float = 0.0  # wall (monotonic) seconds of the newest point
    arrival_interval: float | None = None

    @property
    def reason(self) -> str:
        """Why there is no value ("" when there is one): the newest window's drop reason."""
        if self.ofu is not None and self.ofu_ns >= self.drop_ns:
            return ""
        return self.drop_reason or "missing"


@dataclass
class FindingState:
    id: str
    kind: str
    cause: str
    since_ns: int
    numbers: dict[str, float | str] = field(default_factory=dict)
    closed_ns: int | None = None
    # "job_end" when it closed with its job, "no_mfu_report" when its job stopped reporting MFU, else "cleared"
    close_reason: str = ""
    no_report_s: float | None = None  # with no_mfu_report: how long the job had sent none

    @property
    def is_open(self) -> bool:
        return self.closed_ns is None


@dataclass
class JobState:
    job_id: str
    totals: JobTotals = field(default_factory=JobTotals)
    buckets: dict[int, list[float]] = field(default_factory=dict)  # bucket -> [OFU x s, s]
    life_ofu: float | None = None  # job.ofu{ofu.window=life} from the jobs processor
    mfu: dict[str, float] = field(default_factory=dict)  # job.mfu.reported by window
    reported_gpus: int | None = None  # job.gpus
    energy: float | None = None  # job.energy (J), its newest
    energy_per_pflop: float | None = None  # job.energy.per_useful_pflop (J per useful PFLOP), its newest
    loss: LossTotals = field(default_factory=LossTotals)  # its GPUs' loss account, over what the console saw
    findings: dict[str, FindingState] = field(default_factory=dict)  # open, by id
    closed: dict[str, FindingState] = field(default_factory=dict)  # the newest closed, by kind
    ended: bool = False
    last_ns: int = 0
    seen: float = 0.0  # the console's clock when data of the job last arrived
    # job.cost of its loss parts (not useful) by stamp, its last COST_BINS stamps: part -> money so far
    cost: dict[int, dict[str, float]] = field(default_factory=dict)
    currency: str = ""


@dataclass(frozen=True)
class GpuRow:
    state: GpuState
    reason: str  # "" when the GPU has a value; else blank, not_supported, stale, ...
    job_finding: bool  # its job has an open finding


@dataclass(frozen=True)
class JobRow:
    job_id: str
    gpus: int
    ofu_now: float | None
    ofu_life: float | None
    mfu_reported: float | None
    trend: list[float | None]  # oldest first, one value per sparkline bucket
    open_findings: list[FindingState]
    closed_findings: list[FindingState]
    ended: bool
    largest_loss: tuple[str, float, str | None] | None = None  # its largest loss part, share, dominant cause
    # The share of its GPU time its SM clock gained above f_ref (boost: its windows' negative clock parts), else None
    clock_gain: float | None = None
    # What its loss parts cost per hour of data time over its last few bins (job.cost), and in what; None without
    cost_lost_per_hour: float | None = None
    currency: str = ""
    energy: float | None = None  # J since it started (job.energy), where its energy is known
    energy_per_pflop: float | None = None  # J per useful PFLOP over its life


@dataclass(frozen=True)
class FleetView:
    data_ns: int  # newest data time seen
    hosts: int
    gpus: list[GpuRow]  # natural order: host, index, MIG instance
    jobs: list[JobRow]  # findings first, then lowest OFU, ended jobs last
    no_value: dict[str, int]  # reason -> GPUs
    ofu_now: float | None  # mean over the GPUs with a value now
    totals: JobTotals  # the fleet, over what the console saw
    open_findings: int
    sources: tuple[str, ...] = ()  # what the sources say of themselves (:func:`source_lines`)

    @property
    def with_value(self) -> int:
        return len(self.gpus) - sum(self.no_value.values())


def source_lines(states: Mapping[str, tuple[str, str]], accepted: Mapping[str, float], has_data: bool
                 ) -> tuple[str, ...]:
    """``receiver: what it says`` for each receiver in trouble (a scrape failing, a host engine out of
    reach: its state in words), and while no data has arrived, for each one still waiting, so that an
    empty screen says why it is empty. ``states``: receiver -> (state, why); ``accepted``: what
    each handed in so far."""
    out = []
    for receiver, (state, why) in sorted(states.items()):
        waiting = state in (STARTING, "ok") and not accepted.get(receiver)
        if state in ("ok", STARTING, "finished") and not (waiting and not has_data):
            continue
        text = why or {STARTING: "nothing read yet", "ok": "nothing received yet"}.get(state, state.replace("_", " "))
        out.append(f"{receiver}: {text}")
    return tuple(out)


def _natural(value: str) -> tuple[int, str]:
    return (int(value), "") if value.isdecimal() else (1 << 30, value)


class FleetState:
    """Everything the console knows; fed by :meth:`update`, read through :meth:`view`."""

    def __init__(self, *, sparkline_bucket_s: float = 60.0, sparkline_width: int = 24, max_gap_s: float = 120.0,
                 stale_after_s: float | None = None, min_stale_s: float = 5.0, first_interval_s: float = 30.0,
                 forget_after_s: float = 3600.0, keep_ended_jobs: int = 20,
                 clock: Callable[[], float] = time.monotonic):
        self.sparkline_bucket_s = sparkline_bucket_s
        self.sparkline_width = sparkline_width
        self.max_gap_s = max_gap_s
        self.stale_after_s = stale_after_s
        self.min_stale_s = min_stale_s
        self.first_interval_s = first_interval_s  # a GPU seen once: assume dcgm-exporter's 30 s until it shows
        self.forget_after_s = forget_after_s  # a GPU silent this long (wall) is gone from the fleet
        self.keep_ended_jobs = keep_ended_jobs
        self.clock = clock
        self.gpus: dict[GpuKey, GpuState] = {}
        self.jobs: dict[str, JobState] = {}
        self.totals = JobTotals()
        self._losses: dict[tuple, Parts] = {}  # the batch being read: each GPU window's loss parts
        self.data_ns = 0
        self._last_window: dict[GpuKey, tuple[int, float | None]] = {}  # GPU -> (last gpu.ofu ns, its window s)

    # --- input ---------------------------------------------------------------------------

    def update(self, batch: Batch) -> bool:
        """Take one batch; True when it changed anything shown."""
        now = self.clock()
        changed = False
        arrived: set[GpuKey] = set()
        # each GPU window's loss parts (the ofu processor's gpu.ofu.loss), for its job's account
        self._losses = window_parts(batch.points) if any(p.name == LOSS_METRIC for p in batch.points) else {}
        for point in batch.points:
            if point.name in _GPU_METRICS:
                self._gpu_point(point, now, arrived)
                changed = True
            elif point.name in _JOB_METRICS:
                changed |= self._job_point(point)
        for event in batch.events:
            changed |= self._event(event)
        return changed

    def _gpu_point(self, point: MetricPoint, now: float, arrived: set[GpuKey]) -> None:
        resource = dict(point.resource)
        key = gpu_key(resource)
        gpu = self.gpus.get(key)
        if gpu is None:
            gpu = self.gpus[key] = GpuState(key, key[0] or "?", str(resource.get(GPU_INDEX, "?")))
        if key not in arrived:  # one arrival per GPU per batch
            arrived.add(key)
            if gpu.arrived:
                gpu.arrival_interval = now - gpu.arrived
            gpu.arrived = now
        gpu.model = str(resource.get(HW_MODEL) or gpu.model)
        gpu.mig = key[2]
        gpu.mig_profile = str(resource.get(GPU_MIG_PROFILE) or gpu.mig_profile)
        t = point.time_unix_nano
        gpu.data_ns = max(gpu.data_ns, t)
        self.data_ns = max(self.data_ns, t)
        attributes = dict(point.attributes)
        name = point.name
        if name == DROPPED:
            if t >= gpu.drop_ns:
                gpu.drop_ns, gpu.drop_reason = t, str(attributes.get(DROP_REASON) or "missing")
            return
        job, precision = job_id_of(point), precision_of(point)
        if job is not None:
            gpu.job = job
        if precision is not None:
            gpu.precision = precision
        value = point.value
        if name == OFU:
            if t >= gpu.ofu_ns:
                gpu.ofu, gpu.ofu_ns = value, t
            self._account(key, gpu.job, t, value, self._losses.get((point.resource, t)))
        elif name == OFU_RAW:
            gpu.ofu_raw = value
        elif name == FREF:
            gpu.fref_mhz = value / 1e6
        elif name == TPA:
            gpu.tpa = value
        elif name == SM_CLOCK:
            gpu.sm_mhz = value / 1e6

    def _account(self, key: GpuKey, job_id: str, t: int, ofu: float, loss: Parts | None = None) -> None:
        """GPU time: each gpu.ofu covers the time since the GPU's previous one (a gap: its last interval)."""
        previous = self._last_window.get(key)
        seconds: float = 0.0  # the first window of a GPU only starts its series: its length is unknown
        if previous is not None:
            if t <= previous[0]:
                return
            gap = (t - previous[0]) / 1e9
            seconds = gap if gap <= self.max_gap_s else (previous[1] or 0.0)
        self._last_window[key] = (t, seconds or (previous[1] if previous else None))
        if not math.isfinite(ofu):
            return
        # lost and gained apart, as the jobs processor counts them (docs/method.md#wasted-gpu-hours-and-the-clock-gain)
        shares = window_shares(loss, ofu)
        self.totals.add(seconds, ofu, None, shares)
        if job_id in NO_JOB_IDS:
            return
        job = self._job(job_id)
        job.totals.add(seconds, ofu, None, shares)
        if seconds > 0:
            add_window(job.loss, loss, ofu, seconds)
        job.last_ns = max(job.last_ns, t)
        bucket = job.buckets.setdefault(int(t / 1e9 // self.sparkline_bucket_s), [0.0, 0.0])
        weight = seconds or 1.0
        bucket[0] += ofu * weight
        bucket[1] += weight
        if len(job.buckets) > self.sparkline_width * 2:
            for k in sorted(job.buckets)[: len(job.buckets) - self.sparkline_width]:
                del job.buckets[k]

    def _job(self, job_id: str) -> JobState:
        job = self.jobs.get(job_id)
        if job is None:
            job = self.jobs[job_id] = JobState(job_id)
        elif job.ended:  # the same id again: a restarted job
            job.ended = False
        job.seen = self.clock()
        return job

    def _job_point(self, point: MetricPoint) -> bool:
        job_id = job_id_of(point)
        if job_id is None or job_id in NO_JOB_IDS:
            return False
        job = self._job(str(job_id))
        window = str(dict(point.attributes).get(WINDOW, ""))
        if point.name == JOB_OFU and window == LIFE:
            job.life_ofu = point.value
        elif point.name == JOB_MFU:
            job.mfu[window] = point.value
        elif point.name == JOB_GPUS:
            job.reported_gpus = int(point.value)
        elif point.name == JOB_COST:
            attributes = dict(point.attributes)
            part = str(attributes.get(LOSS_PART, ""))
            if part == USEFUL:
                return False
            job.currency = str(attributes.get(COST_CURRENCY, ""))
            at = job.cost.get(point.time_unix_nano)
            if at is None:
                at = job.cost[point.time_unix_nano] = {}
                for old in sorted(job.cost)[:-COST_BINS]:
                    del job.cost[old]
            at[part] = point.value
        elif point.name == JOB_ENERGY:
            job.energy = point.value
        elif point.name == JOB_ENERGY_PER_PFLOP:
            job.energy_per_pflop = point.value
        return True

    def _event(self, event: Event) -> bool:
        attributes = dict(event.attributes)
        job_id = job_id_of(event) or ""
        if not job_id or event.name not in (EVENT_FINDING_OPEN, EVENT_FINDING_CLOSE, EVENT_JOB_END):
            return False
        if event.name == EVENT_JOB_END:
            job = self.jobs.get(job_id)
            if job is None or attributes.get(JOB_END_REASON) == "shutdown":
                return False  # the pipeline stops, not the job: the last frame shows it as it was
            job.ended = True
            for finding in [f for f in job.findings.values() if not f.is_open]:  # closed with the job
                del job.findings[finding.id]
                job.closed[finding.kind] = finding
            ended = [j for j in self.jobs.values() if j.ended]
            for old in sorted(ended, key=lambda j: j.last_ns)[: max(0, len(ended) - self.keep_ended_jobs)]:
                del self.jobs[old.job_id]  # a long watch of a busy fleet: keep the newest ended jobs only
            return True
        job = self.jobs.get(job_id) or self._job(job_id)
        prefix = "ofu.finding."
        numbers = {k[len(prefix):]: v for k, v in attributes.items()
                   if k.startswith(prefix) and k not in (FINDING_ID, FINDING_KIND, FINDING_CAUSE)}
        finding_id = str(attributes.get(FINDING_ID) or f"{job_id}/{attributes.get(FINDING_KIND)}")
        if event.name == EVENT_FINDING_OPEN:
            job.findings[finding_id] = FindingState(
                finding_id, str(attributes.get(FINDING_KIND, "")), str(attributes.get(FINDING_CAUSE, "")),
                int(numbers.pop("since_unix_nano", event.time_unix_nano)), numbers)
            return True
        finding = job.findings.get(finding_id)
        if finding is None:  # opened before the console started
            finding = FindingState(finding_id, str(attributes.get(FINDING_KIND, "")),
                                   str(attributes.get(FINDING_CAUSE, "")),
                                   int(numbers.get("since_unix_nano", event.time_unix_nano)))
        finding.closed_ns = event.time_unix_nano
        if numbers.get("reason") == "job_end":
            # Closed because its job ended: moved to closed by the job's end event, unless
            # that end is the pipeline's shutdown (then the finding was still open).
            finding.close_reason = "job_end"
            job.findings[finding_id] = finding
            return False
        finding.close_reason = str(numbers.get("reason") or "cleared")
        silent = numbers.get("no_report_s")
        finding.no_report_s = float(silent) if isinstance(silent, int | float) else None
        job.findings.pop(finding_id, None)
        job.closed[finding.kind] = finding
        return True

    # --- output --------------------------------------------------------------------------

    def stale(self, gpu: GpuState, now: float) -> bool:
        """Nothing arrived for three of the GPU's own arrival intervals (at least ``min_stale_s``)."""
        if self.stale_after_s is not None:
            limit = self.stale_after_s
        else:
            limit = max(self.min_stale_s, 3 * (gpu.arrival_interval or self.first_interval_s))
        return now - gpu.arrived > limit

    def view(self) -> FleetView:
        now = self.clock()
        for key in [k for k, g in self.gpus.items() if now - g.arrived > self.forget_after_s]:
            del self.gpus[key]  # removed from the fleet (a node drained, a scaled-down pool)
            self._last_window.pop(key, None)
        for job_id in [j for j, job in self.jobs.items() if not job.ended and now - job.seen > self.forget_after_s]:
            del self.jobs[job_id]  # no end event came (no jobs processor upstream): gone with its GPUs
        open_jobs = {j.job_id for j in self.jobs.values() if j.findings and not j.ended}
        rows: list[GpuRow] = []
        no_value: dict[str, int] = {}
        by_job: dict[str, list[GpuRow]] = {}
        for gpu in sorted(self.gpus.values(), key=lambda g: (g.host, _natural(g.index), _natural(g.mig))):
            reason = STALE if self.stale(gpu, now) else gpu.reason
            if reason:
                no_value[reason] = no_value.get(reason, 0) + 1
            row = GpuRow(gpu, reason, gpu.job in open_jobs)
            rows.append(row)
            by_job.setdefault(gpu.job, []).append(row)
        values = [r.state.ofu for r in rows if not r.reason and r.state.ofu is not None]
        jobs = [self._job_row(job, by_job.get(job.job_id, [])) for job in self.jobs.values()]
        jobs.sort(key=lambda j: (j.ended, not j.open_findings, math.inf if j.ofu_now is None else j.ofu_now,
                                 j.job_id))
        return FleetView(self.data_ns, len({g.host for g in self.gpus.values()}), rows, jobs, no_value,
                         sum(values) / len(values) if values else None, self.totals,
                         sum(len(j.findings) for j in self.jobs.values()))

    def _job_row(self, job: JobState, rows: list[GpuRow]) -> JobRow:
        values = [r.state.ofu for r in rows if not r.reason and r.state.ofu is not None]
        newest = max(job.buckets, default=0)
        trend: list[float | None] = []
        for k in range(newest - self.sparkline_width + 1, newest + 1):
            bucket = job.buckets.get(k)
            trend.append(bucket[0] / bucket[1] if bucket and bucket[1] > 0 else None)
        while trend and trend[0] is None:
            trend.pop(0)
        mfu = job.mfu.get(LIFE) if not job.mfu else job.mfu[min(job.mfu, key=_window_order)]
        closed = [f for f in job.closed.values() if f.kind not in {o.kind for o in job.findings.values()}]
        largest = job.loss.largest_loss()
        gained = job.loss.gain_seconds.get(CLOCK)
        return JobRow(job.job_id, len(rows) or job.reported_gpus or 0,
                      sum(values) / len(values) if values and not job.ended else None,
                      job.life_ofu if job.life_ofu is not None else job.totals.ofu_mean, mfu, trend,
                      sorted(job.findings.values(), key=lambda f: f.since_ns), closed, job.ended,
                      (largest[0], largest[1], job.loss.dominant_cause(largest[0])) if largest else None,
                      gained / job.loss.seconds if gained and job.loss.seconds > 0 else None,
                      _cost_per_hour(job.cost), job.currency, job.energy, job.energy_per_pflop)


def _cost_per_hour(cost: dict[int, dict[str, float]]) -> float | None:
    """What a job's loss parts cost per hour between its first and last job.cost stamps kept (a counter each: a
    part new in the last counts from 0); None with fewer than two."""
    if len(cost) < 2:
        return None
    first, last = min(cost), max(cost)
    lost = sum(last_value - cost[first].get(part, 0.0) for part, last_value in cost[last].items())
    return max(lost, 0.0) / ((last - first) / 1e9) * 3600.0


def _window_order(label: str) -> float:
    """The shortest rolling window first ("5m" before "1h"); "life" last."""
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        return float(label[:-1]) * units[label[-1]]
    except (KeyError, ValueError, IndexError):
        return math.inf
