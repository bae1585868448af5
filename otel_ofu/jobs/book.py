"""Per-job state from metric points: windows, life totals, bins, audit and regression.

:class:`JobBook` routes ``gpu.ofu`` (with ``gpu.flops.achieved``) and reported-MFU points to
one :class:`~otel_ofu.jobs.tracker.JobTracker` per ``ofu.job.id``. Each GPU point covers the
window since that GPU's previous point. Jobs are evaluated once per ``resolution`` bin of data time, when the
job's data has passed the bin's end.

When a job has ended is judged per source (the host that stamped the points, ``host.name``),
each in its own clock: a job has ended when every host that ran it has sent data
``job_timeout`` newer than the job's last point there, or has gone silent. Why per source:
nodes' clocks disagree, and a Collector replays a node's backlog after a partition; one
process-wide "newest data time" ended everyone's jobs whenever one node ran ahead, and a
single point stamped a day in the future ended them all. Silence is judged on the caller's
clock (``now``: the processor's wall clock; a recording's newest data time in the report),
and a point stamped more than ``max_future`` beyond its host's usual lead over ``now`` is not
counted at all.

Pure: no I/O, no wall clock of its own; the processor and the report both drive it. Every
per-key structure is bounded or expires (docs/jobs.md, "State").
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.attribution import HPC_JOB_ID, slurm_job_id
from otel_ofu.attribution.claims import SHARED_SEPARATOR
from otel_ofu.core.exact import exact
from otel_ofu.core.loss import LossTotals
from otel_ofu.core.model import JOB_ID, JOB_RUN, Attributes, GpuKey, MetricPoint, gpu_label, without_job_identity
from otel_ofu.jobs.aggregate import EnergyTotals, JobTotals, WeightedHistogram, segment_start
from otel_ofu.jobs.clocks import HostClocks
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.jobs.cost import Pricer
from otel_ofu.jobs.facts import GpuFacts, JobKey, gpu_facts, job_of, key_job_id
from otel_ofu.jobs.findings import Transition
from otel_ofu.jobs.loss import LOSS_METRIC, Parts, add_window, window_parts
from otel_ofu.jobs.stall import LINK_METRIC
from otel_ofu.jobs.tracker import JobSummary, JobTracker, Snapshot
from otel_ofu.jobs.units import reported_mfu
from otel_ofu.jobs.windows import SeriesWindows, take

OFU_METRIC = "gpu.ofu"
FLOPS_METRIC = "gpu.flops.achieved"
SHARE_METRIC = "gpu.job.share"
ENERGY_METRIC = "gpu.energy"


@dataclass
class Update:
    """What one batch of points changed."""

    started: list[JobTracker] = field(default_factory=list)
    snapshots: list[tuple[JobTracker, Snapshot]] = field(default_factory=list)
    transitions: list[tuple[JobTracker, Transition]] = field(default_factory=list)
    ended: list[JobSummary] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> points
    ahead: tuple[str, float] | None = None  # the host furthest ahead of the caller's clock, and by how much (s)
    # Reports dropped because no GPU ever reported for their job, by job id ("" for no job id).
    unmatched: dict[str, int] = field(default_factory=dict)
    # Reports in TFLOP/s that could not be converted (the job's GPU model or precision unknown), by job id.
    unconverted: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str, count: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + count

    def no_job(self, job: str | None) -> None:
        self.skip(MFU_WITHOUT_JOB)
        key = job or ""
        self.unmatched[key] = self.unmatched.get(key, 0) + 1


def _own_start(point: MetricPoint, max_gap: float) -> float | None:
    """Where the window a point says it covers began (its start time, when set and at most max_gap long)."""
    start = point.start_time_unix_nano
    if 0 < start < point.time_unix_nano and (point.time_unix_nano - start) / 1e9 <= max_gap:
        return start / 1e9
    return None


MFU_WITHOUT_JOB = "mfu_without_job"
TFLOPS_WITHOUT_PEAK = "tflops_without_peak"


class JobBook:
    """All jobs of one pipeline (or one recording).

    ``history``: keep every ended job's summary (``ended``) and count every GPU ever seen
    (``gpu_count``), for a recording the report reads to its end. A long-running processor
    leaves it off: then nothing here grows with the number of jobs, pods or GPUs ever seen.
    """

    def __init__(self, config: JobsConfig, history: bool = False):
        self.config = config
        self.jobs: dict[JobKey, JobTracker] = {}  # by job id and run (facts.job_key)
        self.ended: list[JobSummary] = []  # only with history
        self.newest = -math.inf  # the newest data time accepted, any host (the report's clock)
        self.clocks = HostClocks(float(config.max_future))
        self._gpu_last: dict[tuple, SeriesWindows] = {}  # (GPU, job) -> the time its points covered (jobs.windows)
        self._max_gap, self._default_interval = float(config.max_gap), float(config.default_interval)
        self._keep = self._max_gap + float(config.job_timeout)  # how long a series' covered time is kept
        # job -> reporter (metric, resource without job identity, point attributes) -> (last end, last interval)
        self._mfu_last: dict[str, dict[Any, tuple[float, float]]] = {}
        self._report_names = frozenset({config.mfu_metric, *config.tflops_metrics})
        # job -> reports before its first GPU window, as plain tuples (a book can be saved as plain data)
        self._pending: dict[str, deque[tuple]] = {}
        self._pending_count = 0
        # Another id a job's reports may carry -> the id its GPUs carry: a Slurm job its GPUs know
        # only by dcgm-exporter's hpc_job (4242) is slurm:4242 to its reports. Kept while the job lives.
        self._aliases: dict[str, str] = {}
        self._gpus_seen: set[GpuKey] | None = set() if history else None
        self._ignored = set(config.ignore_jobs)
        self._next_sweep = -math.inf
        # Which jobs expire() looks at (see there): each host's jobs, the hosts whose clock moved
        # since, each job's next time to look, and whether every job must be looked at next.
        self._host_jobs: dict[Any, set[str]] = {}
        self._hosts_moved: set[Any] = set()
        self._recheck: list[tuple[float, str]] = []  # a heap of (reference time, job); stale entries skipped
        self._recheck_at: dict[str, float] = {}
        self._check_all = True
        self._job_seq: dict[str, int] = {}  # job -> when it began, in self.jobs' order
        self._jobs_begun = 0
        self.unattributed = JobTotals()  # GPU windows of no job (idle, shared, ignored)
        self.unattributed_histogram = WeightedHistogram()
        # Every GPU window's loss account, jobs' and no job's (unallocated): the fleet's, since this book began
        self.fleet_loss = LossTotals()
        # ... and its money (jobs.cost): GPU-seconds x price per GPU-hour by part, the GPUs with a price only
        self.fleet_cost = LossTotals()
        self.pricer = Pricer(config.cost)  # the jobs processor sets its own after loading a saved book
        # GPU time with no price while prices are set (exact, core.exact), by what it is priced by (its model,
        # or the cost.by attribute's value; "" when it has none): what job.cost and fleet.cost leave out
        self.unpriced: dict[str, int] = {}
        # Every GPU window's energy (gpu.energy), the jobs' and no job's, since this book began
        self.fleet_energy = EnergyTotals()
        # The jobs processor's fleet.gpu_hours: (the last bin it went out for, the bin its series started),
        # kept with the book so that a restart continues the same cumulative series
        self.fleet_emitted: tuple[int, int] | None = None

    @property
    def history(self) -> bool:
        return self._gpus_seen is not None

    @property
    def gpu_count(self) -> int:
        """Distinct GPUs (:func:`~otel_ofu.core.model.gpu_key`) that sent OFU, with or without a job: ever
        (history), else recently."""
        if self._gpus_seen is not None:
            return len(self._gpus_seen)
        return len({gpu for gpu, _ in self._gpu_last})

    def observe(self, points: Iterable[MetricPoint], now: float | None = None) -> Update:
        """Take one batch of points. ``now``: the caller's clock, seconds (the processor's wall clock).

        Without ``now`` (a recording), the newest data time seen stands in for it.
        """
        points = list(points)
        self.clocks.next_batch()
        update = Update()
        # Each GPU window's FLOP/s, a shared GPU's job's part of it (the ofu processor's gpu.job.share) and its
        # energy and link traffic (PCIe and NVLink together: jobs.stall), by (resource, time) as its gpu.ofu point
        # has them;
        # one pass over the batch.
        flops: dict[tuple[Attributes, int], float] = {}
        shares: dict[tuple[Attributes, int], float] = {}
        links: dict[tuple[Attributes, int], float] = {}
        # A window's energy (the ofu processor's gpu.energy: a shared GPU's job's is its part already).
        energies: dict[tuple[Attributes, int], float] = {}
        any_loss = False
        for p in points:
            name = p.name
            if name == OFU_METRIC:
                continue
            if name == LOSS_METRIC:
                any_loss = True
            elif name == FLOPS_METRIC:
                flops[(p.resource, p.time_unix_nano)] = p.value
            elif name == SHARE_METRIC:
                shares[(p.resource, p.time_unix_nano)] = p.value
            elif name == ENERGY_METRIC:
                energies[(p.resource, p.time_unix_nano)] = p.value
            elif name == LINK_METRIC:
                key = (p.resource, p.time_unix_nano)
                links[key] = links.get(key, 0.0) + p.value
        if links:  # a window whose link points are not finite (or negative) has none
            links = {key: value for key, value in links.items() if math.isfinite(value) and value >= 0}
        losses = window_parts(points) if any_loss else {}
        touched: dict[str, JobTracker] = {}
        behind: dict[Any, list[MetricPoint]] = {}  # host -> its points far behind its newest data
        for point in points:
            if point.name == OFU_METRIC:
                self._gpu_point(point, flops, update, touched, now, behind, losses, shares, energies, links)
        for source, late in behind.items():
            self._late_or_stepped_back(source, late, flops, update, touched, now, losses, shares, energies, links)
        for tracker in update.started:  # reports that came before the job's first GPU window
            for name in (tracker.key, *tracker.aliases):
                for held in self._pending.pop(name, ()):
                    self._pending_count -= 1
                    self._mfu_point(MetricPoint(*held), update, touched)
        for point in points:  # after the GPU points: a job exists once a GPU has reported for it
            if point.name in self._report_names:
                self._mfu_point(point, update, touched)
        self._expire_pending(update, now)
        for tracker in touched.values():
            snapshots, transitions = tracker.advance()
            update.snapshots += [(tracker, s) for s in snapshots]
            update.transitions += [(tracker, t) for t in transitions]
        self.expire(update, now)
        return update

    def _interval(self, table: dict[Any, tuple[float, float]], key: Any, t: float,
                  first_interval: float | None = None) -> float | None:
        """Where the window ending at t began; a series' first window is ``first_interval`` when known."""
        previous = table.get(key)
        start = segment_start(t, previous[0] if previous else None, previous[1] if previous else first_interval,
                              float(self.config.default_interval), float(self.config.max_gap))
        if start is None:
            return None
        table[key] = (t, t - start)
        return start

    def _late_or_stepped_back(self, source: Any, late: list[MetricPoint], flops: dict, update: Update,
                              touched: dict[str, JobTracker], now: float | None,
                              losses: dict[tuple[Attributes, int], Parts] | None = None,
                              shares: dict[tuple[Attributes, int], float] | None = None,
                              energies: dict[tuple[Attributes, int], float] | None = None,
                              links: dict[tuple[Attributes, int], float] | None = None) -> None:
        """A host's points of this batch that are far behind its newest data: late (not counted, as
        any point out of order), or its clock was stepped back (HostClocks.stepped_back).

        A stepped-back host starts over in its new time: its GPUs' windows start afresh, and each
        job that ran on it ends (``clock_step``) at its last data in the old time; its next points
        start the job again, in the new time. Its data is then counted again, not refused for as
        long as the step.
        """
        newest = max(p.time_unix_nano for p in late) / 1e9
        arrival = now if now is not None else self.newest
        if not self.clocks.stepped_back(source, newest, newest - arrival, now is not None):
            update.skip("out_of_order", len(late))
            return
        clock = self.clocks.rebase(source, newest, now is not None)
        self._hosts_moved.add(source)
        for key in clock.gpus:
            series = self._gpu_last.get(key)
            if series is not None:
                series.forget_position()  # no position in the new time; its interval stays
        for job, tracker in list(self.jobs.items()):
            if source in tracker.sources:
                touched.pop(job, None)
                self._end(job, "clock_step", update)
        if now is None:  # a recording's clock: the newest data of its hosts as they are now
            self.newest = max(c.data for c in self.clocks.hosts.values())
        for point in late:
            self._gpu_point(point, flops, update, touched, now, losses=losses, shares=shares, energies=energies,
                            links=links)

    def _tracker(self, job: str, attributes: dict[str, Any], update: Update,
                 touched: dict[str, JobTracker], shared: bool = False) -> JobTracker:
        tracker = self.jobs.get(job)
        if tracker is None:
            extra = {k: attributes.get(k) for k in self.config.copy_attributes}
            if shared:  # a shared GPU's attributes join its jobs' values: only those all its jobs share
                extra = {k: v for k, v in extra.items() if SHARED_SEPARATOR not in str(v)}
            job_id, run = key_job_id(job), job[len(key_job_id(job)) + 1:]
            identity = {JOB_ID: job_id, JOB_RUN: run or None}
            job_resource = tuple(sorted((k, v) for k, v in {**extra, **identity}.items() if v is not None))
            tracker = self.jobs[job] = JobTracker(job_id, self.config, job_resource, run)
            self._job_seq[job] = self._jobs_begun
            self._jobs_begun += 1
            if str(attributes.get(HPC_JOB_ID, "")) == job:
                tracker.aliases = (slurm_job_id(job),)
                self._aliases[tracker.aliases[0]] = job
            update.started.append(tracker)
        touched[job] = tracker
        return tracker

    def _gpu_point(self, point: MetricPoint, flops: dict, update: Update, touched: dict[str, JobTracker],
                   now: float | None, behind: dict[Any, list[MetricPoint]] | None = None,
                   losses: dict[tuple[Attributes, int], Parts] | None = None,
                   shares: dict[tuple[Attributes, int], float] | None = None,
                   energies: dict[tuple[Attributes, int], float] | None = None,
                   links: dict[tuple[Attributes, int], float] | None = None) -> None:
        t = point.time_unix_nano / 1e9
        if not math.isfinite(point.value):
            update.skip("not_finite")
            return
        # A GPU several jobs share counts once: each job's point set its share of the GPU's time, FLOPs and loss
        # (gpu.job.share, docs/sharing.md); a point naming several jobs (older peers, recordings) evenly.
        share = shares.get((point.resource, point.time_unix_nano)) if shares else None
        if share is not None and not (0.0 <= share <= 1.0):  # NaN too
            update.skip("bad_share")
            return
        facts = gpu_facts(point)
        gpu, source = facts.gpu, facts.source
        arrival = now if now is not None else (self.newest if self.newest > -math.inf else t)
        if self.clocks.too_far_ahead(source, t - arrival, arrival, now is not None):
            update.skip("future")
            if update.ahead is None or t - arrival > update.ahead[1]:
                name = source if isinstance(source, str) else gpu_label(source)
                update.ahead = (name, t - arrival)
            return
        if behind is not None and self.clocks.behind(source, t):
            behind.setdefault(source, []).append(point)  # the whole batch decides: see _late_or_stepped_back
            return
        job = facts.job
        # Windows are kept per GPU and job (jobs.windows): a jobs-tier instance may get a GPU's points of
        # its next job (or of no job) before the last ones of its job, through another gateway lane.
        series = self._gpu_last.get((gpu, job))
        if series is None:
            series = self._gpu_last[(gpu, job)] = SeriesWindows()
        own = _own_start(point, self._max_gap) if point.start_time_unix_nano else None
        window = take(series, t, own, self._default_interval, self._max_gap, self._keep)
        if window is None:
            update.skip("out_of_order")
            return
        start, end = window
        self.newest = max(self.newest, t)
        self.clocks.accepted(source, t, arrival).gpus.add((gpu, job))
        self._hosts_moved.add(source)
        if self._gpus_seen is not None:
            self._gpus_seen.add(gpu)
        energy = energies.get((point.resource, point.time_unix_nano)) if energies else None
        if energy is not None and not (energy >= 0.0 and math.isfinite(energy)):  # NaN too
            update.skip("bad_energy")
            energy = None
        if job is None or key_job_id(job) in self._ignored or (facts.shared and not self.config.include_shared):
            part = 1.0 if share is None else share
            self.unattributed.add((end - start) * part, point.value)
            self.unattributed_histogram.add(point.value, (end - start) * part)
            self.fleet_loss.add_unallocated((end - start) * part)
            price = self._price(facts, (end - start) * part)
            if price is not None:
                self.fleet_cost.add_unallocated((end - start) * part * price)
            if energy is not None:
                self.fleet_energy.add_unallocated(energy)
            return
        loss = losses.get((point.resource, point.time_unix_nano)) if losses else None
        rate = flops.get((point.resource, point.time_unix_nano)) if flops else None
        if rate is None or share is not None:  # gpu.flops.achieved of a shared GPU's job is its part: the GPU's here
            rate = facts.flops(point.value)
        weight = share if share is not None else 1.0 / len(facts.jobs)
        price = self._price(facts, (end - start) * weight * len(facts.jobs))
        if energy is not None and share is None and len(facts.jobs) > 1:
            energy *= weight  # a point naming several jobs carries the device's energy: each job its part
        traffic = links.get((point.resource, point.time_unix_nano)) if links else None
        for name in facts.jobs:
            if key_job_id(name) in self._ignored:
                self.unattributed.add((end - start) * weight, point.value)
                self.unattributed_histogram.add(point.value, (end - start) * weight)
                self.fleet_loss.add_unallocated((end - start) * weight)
                if price is not None:
                    self.fleet_cost.add_unallocated((end - start) * weight * price)
                if energy is not None:
                    self.fleet_energy.add_unallocated(energy)
                continue
            tracker = self._tracker(name, facts.attributes, update, touched, facts.shared)
            jobs_of_host = self._host_jobs.get(source)
            if jobs_of_host is None:
                jobs_of_host = self._host_jobs[source] = set()
            jobs_of_host.add(name)
            tracker.add_gpu_window(gpu, start, end, point.value, rate, facts.normalized_precision, source, weight,
                                   loss, energy, traffic, price)
            add_window(self.fleet_loss, loss, point.value, (end - start) * weight)
            if price is not None:
                add_window(self.fleet_cost, loss, point.value, (end - start) * weight * price)
            if energy is not None:
                self.fleet_energy.add_job(energy, None if rate is None else rate * (end - start) * weight)
            tracker.peak_flops_per_gpu = facts.flops(1.0)

    def _price(self, facts: GpuFacts, seconds: float) -> float | None:
        """What an hour of the point's GPU costs: its price (jobs.cost), a MIG instance's part of it; None without
        one (or while no price is set), its ``seconds`` then counted as unpriced."""
        pricer = self.pricer
        if not pricer.config.enabled:
            return None
        key = pricer.key(facts.attributes)
        price = pricer.price(key)
        if price is not None and facts.share is not None:
            return price * facts.share
        if key in self.unpriced or len(self.unpriced) < Pricer.MAX_VALUES:
            self.unpriced[key] = self.unpriced.get(key, 0) + exact(seconds)
        return None

    def _mfu_point(self, point: MetricPoint, update: Update, touched: dict[str, JobTracker]) -> None:
        """A job's report about itself (MFU or TFLOP/s per GPU), from any of its ranks.

        Each reporter (a rank: its resource without the job identity attribution added, and its
        point attributes) is its own series of windows; the job's reported MFU over an interval
        is the time-weighted mean over all of them (docs/audit.md says why the mean).
        """
        job, _ = job_of(point)
        job = self._aliases.get(job, job) if job is not None else None
        if job is None or key_job_id(job) in self._ignored:
            update.no_job(key_job_id(job) if job is not None else None)
            return
        if not math.isfinite(point.value):
            update.skip("not_finite")
            return
        tracker = self.jobs.get(job)
        if tracker is None:
            self._hold(job, point, update)
            return
        value = reported_mfu(point, self.config.mfu_metric, tracker.peak_flops_per_gpu)
        if value is None:
            update.skip(TFLOPS_WITHOUT_PEAK)
            update.unconverted[key_job_id(job)] = update.unconverted.get(key_job_id(job), 0) + 1
            return
        t = point.time_unix_nano / 1e9
        reporter = (point.name, without_job_identity(point.resource), point.attributes)
        start = self._interval(self._mfu_last.setdefault(job, {}), reporter, t)
        if start is None:
            update.skip("out_of_order")
            return
        touched[tracker.key] = tracker
        tracker.add_mfu(start, t, value)

    def _hold(self, job: str, point: MetricPoint, update: Update) -> None:
        """Keep a report until its job's first GPU window; the oldest goes when the store is full."""
        if self.config.max_pending_reports == 0:
            update.no_job(key_job_id(job))
            return
        self._pending.setdefault(job, deque()).append(
            (point.name, point.value, point.time_unix_nano, point.resource, point.attributes, point.unit))
        self._pending_count += 1
        while self._pending_count > self.config.max_pending_reports:
            oldest = next(iter(self._pending))  # the job waiting longest
            self._drop_pending(oldest, update, 1)

    def _drop_pending(self, job: str, update: Update, count: int | None = None) -> None:
        queue = self._pending[job]
        for _ in range(len(queue) if count is None else count):
            queue.popleft()
            self._pending_count -= 1
            update.no_job(key_job_id(job))
        if not queue:
            del self._pending[job]

    def _expire_pending(self, update: Update, now: float | None) -> None:
        """Reports older than job_timeout whose job never appeared match no job.

        Older by the caller's clock (``now``), or by the newest data time for a recording.
        """
        if not self._pending:
            return
        reference = self.newest if now is None else now
        cutoff = (reference - float(self.config.job_timeout)) * 1e9
        for job in list(self._pending):
            queue = self._pending[job]
            stale = 0
            for held in queue:
                if held[2] >= cutoff:  # its time_unix_nano
                    break
                stale += 1
            if stale:
                self._drop_pending(job, update, stale)

    @property
    def pending_reports(self) -> int:
        """Reports held for jobs no GPU has reported for yet."""
        return self._pending_count

    def expire(self, update: Update, now: float | None = None) -> None:
        """End jobs that have ended by their hosts' clocks, or whose hosts all went silent; forget old keys.

        A job's end depends only on its hosts' clocks, the times its hosts last sent for it and the
        reference time. So only these jobs are looked at, with the answer of looking at all of them:
        the jobs of a host whose clock moved since (a batch from it: its data, arrival, a step back),
        and each job whose next time to look has come (the reference passing one of its hosts'
        ``arrived + job_timeout`` or ``arrived + silence_timeout``); the jobs of a host the sweep
        forgot; every job the first time. A batch from one node of a large fleet looks at that
        node's jobs, not at every job (tests/test_jobs_expire.py compares the two on random fleets).
        """
        reference = self.newest if now is None else now
        if self._check_all:
            self._check_all = False
            self._hosts_moved.clear()
            self._recheck.clear()
            self._recheck_at.clear()
            self._host_jobs = {}
            for job, tracker in self.jobs.items():
                for source in tracker.sources:
                    self._host_jobs.setdefault(source, set()).add(job)
            candidates: set[str] = set(self.jobs)
        else:
            candidates = set()
            for source in self._hosts_moved:
                candidates.update(self._host_jobs.get(source, ()))
            self._hosts_moved.clear()
            recheck, recheck_at = self._recheck, self._recheck_at
            while recheck and recheck[0][0] < reference:
                at, job = heapq.heappop(recheck)
                if recheck_at.get(job) == at:
                    del recheck_at[job]
                    candidates.add(job)
        # In the order the jobs began, as a walk of self.jobs ends them.
        for job in sorted(candidates, key=self._job_seq.__getitem__) if len(candidates) > 1 else candidates:
            tracker = self.jobs.get(job)
            if tracker is None:
                continue
            reason, at = self._end_reason(tracker, reference)
            if reason is not None:
                self._end(job, reason, update)
            elif at < self._recheck_at.get(job, math.inf):
                # One look scheduled per job, the earliest (popped once the reference is past it): a
                # look sooner than needed schedules the next, so the heap holds about one entry per job.
                self._recheck_at[job] = at
                heapq.heappush(self._recheck, (at, job))
        if reference >= self._next_sweep:
            self._sweep(reference)
            self._next_sweep = reference + float(self.config.resolution)

    def _end_reason(self, tracker: JobTracker, reference: float) -> tuple[str | None, float]:
        """``timeout`` when a host moved on past the job and none still runs it; ``silent``; else None,
        with the reference time past which the answer may change if no clock moves (inf: never)."""
        timeout, silence = float(self.config.job_timeout), float(self.config.silence_timeout)
        moved_on = False
        quiet = math.inf  # the shortest silence among its hosts
        alive = False
        change = math.inf
        for source, last in tracker.sources.items():
            clock = self.clocks.hosts.get(source)
            if clock is None:  # forgotten: silent for longer than silence_timeout
                continue
            if clock.data - last > timeout:
                moved_on = True
                continue
            if reference - clock.arrived > timeout:
                quiet = min(quiet, reference - clock.arrived)
            else:
                alive = True  # this host still runs the job (or its data is still within the timeout)
                change = min(change, clock.arrived + timeout)
            if clock.arrived + silence >= reference:  # a silence not yet long enough
                change = min(change, clock.arrived + silence)
        if alive:
            return None, change
        if moved_on:
            return "timeout", change
        if quiet > silence:
            return "silent", change
        return None, change

    def _sweep(self, reference: float) -> None:
        """Forget hosts silent past silence_timeout, and GPUs their host's clock has left behind.

        A GPU's last point only matters for the window its next point covers and to refuse
        points out of order; past ``max_gap`` its next point starts a new window anyway.
        """
        keep_gpu = float(self.config.max_gap) + float(self.config.job_timeout)
        silence = float(self.config.silence_timeout)
        for key, clock in list(self.clocks.hosts.items()):
            if reference - clock.arrived > silence:
                del self.clocks.hosts[key]
                self._hosts_moved.add(key)  # forgotten: its jobs' answers change (expire looks at them)
                for gpu in clock.gpus:
                    self._gpu_last.pop(gpu, None)
                continue
            for gpu in list(clock.gpus):
                series = self._gpu_last.get(gpu)
                if series is None or clock.data - series.end > keep_gpu:
                    clock.gpus.discard(gpu)
                    self._gpu_last.pop(gpu, None)

    def close_all(self, reason: str = "shutdown") -> Update:
        """End every job (at shutdown, or at the end of a recording)."""
        update = Update()
        for job in list(self.jobs):
            self._end(job, reason, update)
        return update

    def _end(self, job: str, reason: str, update: Update) -> None:
        tracker = self.jobs.pop(job)
        self._job_seq.pop(job, None)
        self._recheck_at.pop(job, None)
        for source in tracker.sources:
            jobs_of_host = self._host_jobs.get(source)
            if jobs_of_host is not None:
                jobs_of_host.discard(job)
                if not jobs_of_host:
                    del self._host_jobs[source]
        self._mfu_last.pop(job, None)
        for alias in tracker.aliases:
            self._aliases.pop(alias, None)
        summary, transitions = tracker.end(reason)
        update.transitions += [(tracker, t) for t in transitions]
        update.ended.append(summary)
        if self.history:
            self.ended.append(summary)
