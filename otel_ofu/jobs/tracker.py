"""Per-job state from metric points: windows, life totals, bins, audit and regression.

:class:`JobBook` routes ``gpu.ofu`` (with ``gpu.flops.achieved``) and reported-MFU points to
one :class:`JobTracker` per ``ofu.job.id``. Each GPU point covers the window since that
GPU's previous point. Jobs are evaluated once per ``resolution`` bin of data time, when the
job's data has passed the bin's end; a job whose points stop for ``job_timeout`` (data time)
has ended. Pure: no I/O, no wall clock; the processor and the report both drive it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from otel_ofu.core import specs
from otel_ofu.core.model import (
    HW_MODEL,
    JOB_ID,
    JOB_SHARED,
    NO_JOB,
    PRECISION,
    Attributes,
    MetricPoint,
    gpu_identity,
)
from otel_ofu.jobs.aggregate import JobTotals, TimeWeightedSeries, WeightedHistogram, segment_start, window_label
from otel_ofu.jobs.audit import AuditConfig, MfuAudit
from otel_ofu.jobs.findings import CLOSE, OPEN, Finding, Transition
from otel_ofu.jobs.regression import RegressionConfig, RegressionDetector
from otel_ofu.pipeline.config import Duration, require

OFU_METRIC = "gpu.ofu"
FLOPS_METRIC = "gpu.flops.achieved"
LIFE = "life"


def _default_copy_attributes() -> list[str]:
    return ["k8s.namespace.name", "slurm.job.user", "slurm.job.account", "slurm.job.partition", "slurm.job.name"]


@dataclass
class JobsConfig:
    # Rolling windows for job.ofu / job.mfu.reported (attribute ofu.window), besides "life".
    windows: list[Duration] = field(default_factory=lambda: [Duration(300), Duration(3600)])
    # Evaluation step: bins of data time; one set of job metrics per job per bin.
    resolution: Duration = field(default_factory=lambda: Duration(60))
    # A job with no points for this long (data time) has ended.
    job_timeout: Duration = field(default_factory=lambda: Duration(300))
    # The window a GPU's first point covers (set it to the collection interval) ...
    default_interval: Duration = field(default_factory=lambda: Duration(10))
    # ... and a gap between two points longer than this is a gap, not GPU time we saw.
    max_gap: Duration = field(default_factory=lambda: Duration(120))
    mfu_metric: str = "training.mfu"  # the metric a job reports its own MFU in
    ignore_jobs: list[str] = field(default_factory=lambda: [NO_JOB, "unknown", ""])
    include_shared: bool = False  # a GPU several jobs share cannot be split between them
    copy_attributes: list[str] = field(default_factory=_default_copy_attributes)  # onto the job's resource
    audit: AuditConfig = field(default_factory=AuditConfig)
    regression: RegressionConfig = field(default_factory=RegressionConfig)
    # A directory for this processor's own state (otel_ofu.jobs.state): jobs survive a restart or a
    # crash; at shutdown jobs are then kept, not ended. None: in memory only.
    storage: str | None = None
    checkpoint_interval: Duration = field(default_factory=lambda: Duration(60))  # snapshot at most this often
    max_journal_bytes: int = 64 * 1024 * 1024  # ... or when the journal since the last one is this large

    def validate(self) -> None:
        require(self.resolution > 0, "resolution", "must be positive")
        require(bool(self.windows), "windows", "at least one window is required")
        labels = [window_label(w) for w in self.windows]
        require(len(set(labels)) == len(labels), "windows", "windows must differ")
        for i, w in enumerate(self.windows):
            require(w >= self.resolution, f"windows[{i}]", f"must be at least resolution ({self.resolution:g}s)")
        require(self.job_timeout >= self.resolution, "job_timeout", "must be at least resolution")
        require(self.default_interval > 0, "default_interval", "must be positive")
        require(self.max_gap >= self.default_interval, "max_gap", "must be at least default_interval")
        require(bool(self.mfu_metric), "mfu_metric", "must name a metric")
        if self.storage is not None:
            require(bool(self.storage.strip()), "storage", "must be a directory path")
            require(not Path(self.storage).expanduser().is_file(), "storage",
                    f"{self.storage!r} is a file; storage names a directory for the jobs state")
        require(self.checkpoint_interval > 0, "checkpoint_interval", "must be positive")
        require(self.max_journal_bytes >= 1024 * 1024, "max_journal_bytes", "must be at least 1 MiB")

    def state_key(self) -> JobsConfig:
        """The settings a saved state depends on (not where or how often it is saved)."""
        return replace(self, storage=None, checkpoint_interval=Duration(60), max_journal_bytes=0)

    @property
    def retention_s(self) -> float:
        """How far back the series must reach: the longest window plus two bins of slack."""
        longest = max([*self.windows, self.audit.window, self.resolution])
        return float(longest) + 2 * float(self.resolution)


@dataclass
class Snapshot:
    """A job at the end of one bin: what the processor emits as metrics, the report plots."""

    job_id: str
    time: float  # the bin's end, data seconds
    gpus: int  # GPUs with data in the bin
    bin_ofu: float
    bin_mfu: float | None
    ofu: dict[str, float]  # window label (and "life") -> time-weighted OFU
    mfu: dict[str, float]  # window label (and "life") -> reported MFU
    flops_rate: dict[str, float]  # window label -> the job's achieved FLOP/s (all its GPUs)
    totals: JobTotals
    baseline: float | None
    open_findings: list[Finding]


@dataclass
class JobSummary:
    """A job at its end (``ofu.job.end``)."""

    job_id: str
    start: float
    end: float
    reason: str  # timeout | shutdown
    gpus: int  # distinct GPUs over its life
    peak_gpus: int
    totals: JobTotals
    ofu_p10: float | None
    ofu_p50: float | None
    ofu_p90: float | None
    mfu_reported: float | None
    precisions: dict[str, float]  # precision -> GPU-seconds
    findings: list[Finding]
    resource: Attributes
    histogram: WeightedHistogram = field(default_factory=WeightedHistogram)  # OFU weighted by GPU-seconds


class JobTracker:
    """One job: its series, life totals, per-bin evaluation and its two detectors."""

    def __init__(self, job_id: str, config: JobsConfig, resource: Attributes = ()):
        self.job_id = job_id
        self.config = config
        self.resource = resource
        retention = config.retention_s
        self.ofu = TimeWeightedSeries(retention)
        self.flops = TimeWeightedSeries(retention)
        self.mfu = TimeWeightedSeries(retention)
        self.totals = JobTotals()
        self.mfu_seconds = 0.0
        self.mfu_weighted = 0.0
        self.histogram = WeightedHistogram()
        self.precisions: dict[str, float] = {}
        self.gpus: set[Any] = set()
        self.peak_gpus = 0
        self.first_start = math.inf
        self.last_end = -math.inf
        self._res = float(config.resolution)
        self._next_bin: int | None = None
        self._bin_gpus: dict[int, set[Any]] = {}
        self.audit = MfuAudit(config.audit, self._res)
        self.regression = RegressionDetector(config.regression, self._res)
        self.findings: list[Finding] = []

    def add_gpu_window(self, gpu: Any, start: float, end: float, ofu: float, flops_per_s: float | None = None,
                       precision: str | None = None) -> None:
        seconds = end - start
        self.ofu.add(start, end, ofu)
        if flops_per_s is not None:
            self.flops.add(start, end, flops_per_s)
        self.totals.add(seconds, ofu, flops_per_s)
        self.histogram.add(ofu, seconds)
        key = precision or specs.UNKNOWN_PRECISION
        self.precisions[key] = self.precisions.get(key, 0.0) + seconds
        self.gpus.add(gpu)
        self._touch(start, end)
        assert self._next_bin is not None
        for k in range(max(self._next_bin, math.floor(start / self._res)), math.floor((end - 1e-9) / self._res) + 1):
            self._bin_gpus.setdefault(k, set()).add(gpu)

    def add_mfu(self, start: float, end: float, value: float) -> None:
        self.mfu.add(start, end, value)
        self.mfu_seconds += end - start
        self.mfu_weighted += value * (end - start)

    def _touch(self, start: float, end: float) -> None:
        self.first_start = min(self.first_start, start)
        self.last_end = max(self.last_end, end)
        if self._next_bin is None:
            self._next_bin = math.floor(start / self._res)

    @property
    def mfu_life(self) -> float | None:
        return self.mfu_weighted / self.mfu_seconds if self.mfu_seconds > 0 else None

    def open_findings(self) -> list[Finding]:
        return [f for f in (self.audit.open, self.regression.open) if f is not None]

    def advance(self) -> tuple[list[Snapshot], list[Transition]]:
        """Close every bin the job's data has passed; evaluate each that has data."""
        snapshots: list[Snapshot] = []
        transitions: list[Transition] = []
        if self._next_bin is None:
            return snapshots, transitions
        while (self._next_bin + 1) * self._res <= self.last_end + 1e-9:
            k = self._next_bin
            self._next_bin += 1
            gpus = self._bin_gpus.pop(k, set())
            bin_end = (k + 1) * self._res
            bin_ofu = self.ofu.mean(k * self._res, bin_end)
            if bin_ofu is None:
                continue
            self.peak_gpus = max(self.peak_gpus, len(gpus))
            found = self.regression.observe(bin_end, bin_ofu)
            found += self.audit.observe(bin_end, *self._audit_means(bin_end))
            for transition in found:
                if transition.action == OPEN:
                    self.findings.append(transition.finding)
                    transition.finding.id = f"{self.job_id}/{transition.finding.kind}/{len(self.findings)}"
            transitions += found
            snapshots.append(self._snapshot(bin_end, len(gpus), bin_ofu))
        return snapshots, transitions

    def _audit_means(self, bin_end: float) -> tuple[float | None, float | None]:
        start = bin_end - float(self.config.audit.window)
        covered = self.ofu.first_start <= start + 1e-9 and self.mfu.first_start <= start + 1e-9
        if not covered:
            return None, None
        return self.ofu.mean(start, bin_end), self.mfu.mean(start, bin_end)

    def _snapshot(self, bin_end: float, gpus: int, bin_ofu: float) -> Snapshot:
        ofu: dict[str, float] = {}
        mfu: dict[str, float] = {}
        rate: dict[str, float] = {}
        for window in self.config.windows:
            label, start = window_label(window), bin_end - float(window)
            if (value := self.ofu.mean(start, bin_end)) is not None:
                ofu[label] = value
            if (value := self.mfu.mean(start, bin_end)) is not None:
                mfu[label] = value
            flop, _ = self.flops.integral(start, bin_end)
            span = bin_end - max(start, self.first_start)
            if self.totals.flops_known and span > 0:
                rate[label] = flop / span
        if self.totals.ofu_mean is not None:
            ofu[LIFE] = self.totals.ofu_mean
        if self.mfu_life is not None:
            mfu[LIFE] = self.mfu_life
        return Snapshot(self.job_id, bin_end, gpus, bin_ofu, self.mfu.mean(bin_end - self._res, bin_end), ofu, mfu,
                        rate, replace(self.totals), self.regression.baseline, self.open_findings())

    def end(self, reason: str) -> tuple[JobSummary, list[Transition]]:
        """The job's summary; findings still open close with it."""
        transitions = []
        for detector in (self.audit, self.regression):
            finding = detector.open
            if finding is not None:
                detector.open = None
                finding.closed_at = self.last_end
                finding.close_numbers = {"reason": "job_end"}
                transitions.append(Transition(CLOSE, finding, self.last_end))
        summary = JobSummary(
            job_id=self.job_id, start=self.first_start, end=self.last_end, reason=reason, gpus=len(self.gpus),
            peak_gpus=max([self.peak_gpus, *(len(g) for g in self._bin_gpus.values())]), totals=self.totals,
            ofu_p10=self.histogram.quantile(0.1), ofu_p50=self.histogram.quantile(0.5),
            ofu_p90=self.histogram.quantile(0.9), mfu_reported=self.mfu_life, precisions=dict(self.precisions),
            findings=list(self.findings), resource=self.resource, histogram=self.histogram)
        return summary, transitions


@dataclass
class Update:
    """What one batch of points changed."""

    started: list[JobTracker] = field(default_factory=list)
    snapshots: list[tuple[JobTracker, Snapshot]] = field(default_factory=list)
    transitions: list[tuple[JobTracker, Transition]] = field(default_factory=list)
    ended: list[JobSummary] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> points

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def _job_of(point: MetricPoint) -> tuple[str | None, dict[str, Any]]:
    """The point's job id and its attributes, resource and point attributes in one dict.

    Job identity is on the resource; point attributes win for other keys and are read for
    recordings made before job identity moved to the resource.
    """
    merged = {**dict(point.resource), **dict(point.attributes)}
    for key, value in point.resource:
        if key == JOB_ID or key == PRECISION or key == JOB_SHARED:
            merged[key] = value
    job = merged.get(JOB_ID)
    return (None if job is None else str(job)), merged


def _own_window(point: MetricPoint, max_gap: float) -> float | None:
    """The window a point says it covers (its start time, when set), for a series' first window."""
    start = point.start_time_unix_nano
    if 0 < start < point.time_unix_nano and (point.time_unix_nano - start) / 1e9 <= max_gap:
        return (point.time_unix_nano - start) / 1e9
    return None


def peak_flops(model: str | None, precision: str | None, ofu: float) -> float | None:
    """OFU x the dense peak at the precision, when both the model and the precision are known."""
    spec = specs.find_spec(model)
    peak = spec.peak(specs.normalize_precision(precision)) if spec else None
    return ofu * peak.flops if peak else None


class JobBook:
    """All jobs of one pipeline (or one recording)."""

    def __init__(self, config: JobsConfig):
        self.config = config
        self.jobs: dict[str, JobTracker] = {}
        self.ended: list[JobSummary] = []
        self.now = -math.inf  # the newest data time seen
        self._gpu_last: dict[tuple, tuple[float, float]] = {}  # (GPU, job) -> (last end, last interval)
        self._mfu_last: dict[str, tuple[float, float]] = {}
        self._ignored = set(config.ignore_jobs)
        self.unattributed = JobTotals()  # GPU windows of no job (idle, shared, ignored)
        self.unattributed_histogram = WeightedHistogram()

    @property
    def gpu_count(self) -> int:
        """Distinct GPUs (resources) that sent OFU, with or without a job."""
        return len({gpu for gpu, _ in self._gpu_last})

    def observe(self, points: Iterable[MetricPoint]) -> Update:
        points = list(points)
        update = Update()
        flops = {(p.resource, p.time_unix_nano): p.value for p in points if p.name == FLOPS_METRIC}
        touched: dict[str, JobTracker] = {}
        for point in points:
            if point.name == OFU_METRIC:
                self._gpu_point(point, flops, update, touched)
        for point in points:  # after the GPU points: a job exists once a GPU has reported for it
            if point.name == self.config.mfu_metric:
                self._mfu_point(point, update, touched)
        for tracker in touched.values():
            snapshots, transitions = tracker.advance()
            update.snapshots += [(tracker, s) for s in snapshots]
            update.transitions += [(tracker, t) for t in transitions]
        self.expire(update)
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

    def _tracker(self, job: str, attributes: dict[str, Any], update: Update,
                 touched: dict[str, JobTracker]) -> JobTracker:
        tracker = self.jobs.get(job)
        if tracker is None:
            extra = {k: attributes.get(k) for k in self.config.copy_attributes}
            job_resource = tuple(sorted((k, v) for k, v in {**extra, JOB_ID: job}.items() if v is not None))
            tracker = self.jobs[job] = JobTracker(job, self.config, job_resource)
            update.started.append(tracker)
        touched[job] = tracker
        return tracker

    def _gpu_point(self, point: MetricPoint, flops: dict, update: Update, touched: dict[str, JobTracker]) -> None:
        t = point.time_unix_nano / 1e9
        if not math.isfinite(point.value):
            update.skip("not_finite")
            return
        gpu = gpu_identity(point.resource)  # the same GPU across its jobs
        job, attributes = _job_of(point)
        # Windows follow each other per GPU and job: a jobs-tier instance may get a GPU's points of
        # its next job (or of no job) before the last ones of its job, through another gateway lane.
        start = self._interval(self._gpu_last, (gpu, job), t, _own_window(point, float(self.config.max_gap)))
        if start is None:
            update.skip("out_of_order")
            return
        self.now = max(self.now, t)
        shared = bool(attributes.get(JOB_SHARED)) and not self.config.include_shared
        if job is None or job in self._ignored or shared:
            self.unattributed.add(t - start, point.value)
            self.unattributed_histogram.add(point.value, t - start)
            return
        precision = attributes.get(PRECISION)
        rate = flops.get((point.resource, point.time_unix_nano))
        if rate is None:
            rate = peak_flops(attributes.get(HW_MODEL), precision, point.value)
        tracker = self._tracker(job, attributes, update, touched)
        tracker.add_gpu_window(gpu, start, t, point.value, rate, specs.normalize_precision(precision))

    def _mfu_point(self, point: MetricPoint, update: Update, touched: dict[str, JobTracker]) -> None:
        job, _ = _job_of(point)
        tracker = self.jobs.get(job) if job is not None else None
        if tracker is None or not math.isfinite(point.value):
            update.skip("mfu_without_job")
            return
        t = point.time_unix_nano / 1e9
        start = self._interval(self._mfu_last, job, t)
        if start is None:
            update.skip("out_of_order")
            return
        touched[tracker.job_id] = tracker
        tracker.add_mfu(start, t, point.value)

    def expire(self, update: Update) -> None:
        """End jobs whose data stopped ``job_timeout`` before the newest data seen."""
        cutoff = self.now - float(self.config.job_timeout)
        for job, tracker in list(self.jobs.items()):
            if tracker.last_end < cutoff:
                self._end(job, "timeout", update)

    def close_all(self, reason: str = "shutdown") -> Update:
        """End every job (at shutdown, or at the end of a recording)."""
        update = Update()
        for job in list(self.jobs):
            self._end(job, reason, update)
        return update

    def _end(self, job: str, reason: str, update: Update) -> None:
        tracker = self.jobs.pop(job)
        summary, transitions = tracker.end(reason)
        update.transitions += [(tracker, t) for t in transitions]
        update.ended.append(summary)
        self.ended.append(summary)
