"""One job's state: its series, life totals, per-bin evaluation, its audit and regression detectors.

:class:`otel_ofu.jobs.book.JobBook` keeps one :class:`JobTracker` per ``ofu.job.id`` and feeds
it GPU windows and reported MFU; the tracker closes the job's bins and evaluates each.

A bin's values are a pure function of the windows it was closed with: every sum is exact
(core.exact), so their order does not matter, and the life values stamped at a bin's end count
the job's time up to that end only. A window that reaches past it (it came in the batch that
closed the bin, or that batch held the next windows too) counts in the next bin's life values
for that part: how requests happened to be cut does not change what is emitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from otel_ofu.core import specs
from otel_ofu.core.exact import exact, to_float
from otel_ofu.core.loss import LossTotals
from otel_ofu.core.model import Attributes, GpuKey
from otel_ofu.jobs.aggregate import JobTotals, TimeWeightedSeries, WeightedHistogram, bin_pieces, window_label
from otel_ofu.jobs.audit import MfuAudit
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.jobs.facts import JobKey, job_key
from otel_ofu.jobs.findings import CLOSE, JOB_END, OPEN, REGRESSION, Finding, Transition
from otel_ofu.jobs.loss import LossBins, Parts, add_window, grown_part, window_shares
from otel_ofu.jobs.regression import RegressionDetector
from otel_ofu.jobs.stall import StallBin, StallDetector, window_state

LIFE = "life"


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
    # window label (and "life") -> the job's loss account over it (core.loss; its shares add up to 1 with OFU)
    loss: dict[str, LossTotals] = field(default_factory=dict)
    cost: LossTotals | None = None  # its cost account over its life (jobs.cost); None: no GPU of it had a price
    stalled_seconds: float = 0.0  # GPU time in stalled windows of its stalled findings so far (jobs.stall)


@dataclass
class JobSummary:
    """A job at its end (``ofu.job.end``)."""

    job_id: str
    start: float
    end: float
    reason: str  # timeout | silent | clock_step | shutdown (end_of_recording in the report)
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
    loss: LossTotals = field(default_factory=LossTotals)  # its loss account over its life (core.loss)
    cost: LossTotals | None = None  # its cost account over its life (jobs.cost); None: no GPU of it had a price
    stalled_seconds: float = 0.0  # GPU time in stalled windows of its stalled findings (jobs.stall)


@dataclass
class _OpenBin:
    """What a bin not closed yet holds of a job's life sums (its loss account is in the loss bins): they join
    the life values when it closes, so that a snapshot counts the job up to its bin's end only."""

    totals: JobTotals = field(default_factory=JobTotals)
    exact_mfu_seconds: int = 0
    exact_mfu_weighted: int = 0
    cost: LossTotals = field(default_factory=LossTotals)  # its windows' money by part (jobs.cost)


def _mean(weighted: int, seconds: int) -> float | None:
    """A time-weighted mean from two exact sums (core.exact); None without time."""
    return to_float(weighted) / to_float(seconds) if seconds > 0 else None


class JobTracker:
    """One job: its series, life totals, per-bin evaluation and its two detectors."""

    def __init__(self, job_id: str, config: JobsConfig, resource: Attributes = (), run: str = ""):
        self.job_id = job_id
        self.run = run  # ofu.job.run: its incarnation, "" when unknown
        self.config = config
        self.resource = resource
        self.aliases: tuple[str, ...] = ()  # other ids its reports may carry (JobBook._aliases)
        retention = config.retention_s
        self.ofu = TimeWeightedSeries(retention)
        self.flops = TimeWeightedSeries(retention)
        self.mfu = TimeWeightedSeries(retention)
        # Life sums (exact: core.exact) up to the end of the last bin closed; the bins not closed yet hold the
        # rest (_open, and loss_bins for the loss account). A window that comes for a closed bin goes here.
        self.closed_totals = JobTotals()
        self.closed_mfu_seconds = 0
        self.closed_mfu_weighted = 0
        self.closed_loss = LossTotals()  # the loss account over its life
        self.closed_cost = LossTotals()  # ... and its money (jobs.cost): GPU-seconds x price per GPU-hour by part
        self.histogram = WeightedHistogram()
        self.loss_bins = LossBins(float(config.resolution), retention)  # ... and by bin, for windows and findings
        self.precisions: dict[str, float] = {}
        self.gpus: set[GpuKey] = set()  # distinct GPUs over its life (core.model.gpu_key)
        self.sources: dict[Any, float] = {}  # host -> the end of the job's last window there (that host's clock)
        self.peak_gpus = 0
        # Dense peak FLOP/s of one of the job's GPUs at its precision, from its latest GPU window
        # (None while the model or the precision is unknown): converts reported TFLOP/s to MFU.
        self.peak_flops_per_gpu: float | None = None
        self.first_start = math.inf
        self.last_end = -math.inf
        self._res = float(config.resolution)
        self._next_bin: int | None = None
        self._bin_gpus: dict[int, set[GpuKey]] = {}
        self._open: dict[int, _OpenBin] = {}  # bins not closed yet that hold some of the life sums
        self.audit = MfuAudit(config.audit, self._res)
        self.regression = RegressionDetector(config.regression, self._res)
        self.stall = StallDetector(config.stall, self._res)
        self._stall_bins: dict[int, StallBin] = {}  # bins not closed yet: what its GPU windows did (jobs.stall)
        self.findings: list[Finding] = []

    def add_gpu_window(self, gpu: GpuKey, start: float, end: float, ofu: float, flops_per_s: float | None = None,
                       precision: str | None = None, source: Any = None, weight: float = 1.0,
                       loss: Parts | None = None, energy: float | None = None, links: float | None = None,
                       price: float | None = None) -> None:
        """One window of one of its GPUs; ``weight``: the part of the GPU's time that is this job's (a GPU
        ``n`` jobs share: 1/n of its time and FLOPs). The GPU counts as one of the job's GPUs either way.
        ``loss``: the window's loss parts (jobs.loss.window_parts); without them its loss is unaccounted.
        ``energy``: the job's energy in the window (J, its part already: gpu.energy), shared among the bins the
        window overlaps as its time is. ``links``: its PCIe + NVLink traffic in bytes per second, None where the
        source reads none (jobs.stall). ``price``: what an hour of the GPU costs (jobs.cost.Pricer; a MIG
        instance's part of its GPU's price); None: the window has no cost."""
        seconds = (end - start) * weight
        self._touch(start, end)
        next_bin = self._next_bin
        assert next_bin is not None
        shares = window_shares(loss, ofu)  # its parts lost (waste) and gained apart: neither counter falls
        stall_state = window_state(loss, links, self.config.stall) if self.config.stall.enabled else None
        pieces = bin_pieces(start, end, self._res)
        for k, overlap in pieces:  # bin by bin: a snapshot counts up to its bin's end
            piece = overlap * weight
            joules = None if energy is None else energy if len(pieces) == 1 else energy * (overlap / (end - start))
            add_window(self.loss_bins.bin(k), loss, ofu, piece)
            if stall_state is not None and k >= next_bin:
                stall_bin = self._stall_bins.get(k)
                if stall_bin is None:
                    stall_bin = self._stall_bins[k] = StallBin()
                stall_bin.add(stall_state, piece, links is not None)
            if k >= next_bin:
                open_bin = self._open.get(k)
                if open_bin is None:
                    open_bin = self._open[k] = _OpenBin()
                open_bin.totals.add(piece, ofu, flops_per_s, shares, joules)
                if price is not None:
                    add_window(open_bin.cost, loss, ofu, piece * price)
            else:  # late for a bin already closed: into the life values at once
                add_window(self.closed_loss, loss, ofu, piece)
                self.closed_totals.add(piece, ofu, flops_per_s, shares, joules)
                if price is not None:
                    add_window(self.closed_cost, loss, ofu, piece * price)
        self.loss_bins.evict(next_bin)
        if end > self.sources.get(source, -math.inf):
            self.sources[source] = end
        self.ofu.add(start, end, ofu, weight)
        if flops_per_s is not None:
            self.flops.add(start, end, flops_per_s, weight)
        self.histogram.add(ofu, seconds)
        key = precision or specs.UNKNOWN_PRECISION
        self.precisions[key] = self.precisions.get(key, 0.0) + seconds
        self.gpus.add(gpu)
        for k in range(max(self._next_bin, math.floor(start / self._res)), math.floor((end - 1e-9) / self._res) + 1):
            self._bin_gpus.setdefault(k, set()).add(gpu)

    def add_mfu(self, start: float, end: float, value: float) -> None:
        self.mfu.add(start, end, value)
        next_bin = self._next_bin if self._next_bin is not None else -math.inf
        for k, overlap in bin_pieces(start, end, self._res):
            seconds, weighted = exact(overlap), exact(value * overlap)
            if k >= next_bin:
                open_bin = self._open.get(k)
                if open_bin is None:
                    open_bin = self._open[k] = _OpenBin()
                open_bin.exact_mfu_seconds += seconds
                open_bin.exact_mfu_weighted += weighted
            else:
                self.closed_mfu_seconds += seconds
                self.closed_mfu_weighted += weighted

    def _touch(self, start: float, end: float) -> None:
        self.first_start = min(self.first_start, start)
        self.last_end = max(self.last_end, end)
        if self._next_bin is None:
            self._next_bin = math.floor(start / self._res)

    @property
    def key(self) -> JobKey:
        """The book's key of this job: its id and run (facts.job_key)."""
        return job_key(self.job_id, self.run)

    @property
    def totals(self) -> JobTotals:
        """Its life totals, every window so far (those of the bins not closed yet too)."""
        totals = replace(self.closed_totals)
        for open_bin in self._open.values():
            totals.merge(open_bin.totals)
        return totals

    @property
    def loss(self) -> LossTotals:
        """Its loss account over its life, every window so far."""
        loss = self.closed_loss.copy()
        for k in self._open:
            if k in self.loss_bins.bins:
                loss.merge(self.loss_bins.bins[k])
        return loss

    @property
    def cost(self) -> LossTotals | None:
        """Its cost account over its life, every window so far (jobs.cost); None while none had a price."""
        cost = self.closed_cost.copy()
        for open_bin in self._open.values():
            cost.merge(open_bin.cost)
        return cost if cost.exact_seconds > 0 else None

    def _mfu_sums(self) -> tuple[int, int]:
        seconds, weighted = self.closed_mfu_seconds, self.closed_mfu_weighted
        for open_bin in self._open.values():
            seconds += open_bin.exact_mfu_seconds
            weighted += open_bin.exact_mfu_weighted
        return seconds, weighted

    @property
    def mfu_seconds(self) -> float:
        return to_float(self._mfu_sums()[0])

    @property
    def mfu_life(self) -> float | None:
        seconds, weighted = self._mfu_sums()
        return _mean(weighted, seconds)

    def open_findings(self) -> list[Finding]:
        return [f for f in (self.audit.open, self.regression.open, self.stall.open) if f is not None]

    def advance(self) -> tuple[list[Snapshot], list[Transition]]:
        """Close every bin the job's data has passed; evaluate each that has data."""
        snapshots: list[Snapshot] = []
        transitions: list[Transition] = []
        if self._next_bin is None:
            return snapshots, transitions
        while (self._next_bin + 1) * self._res <= self.last_end + 1e-9:
            k = self._next_bin
            self._next_bin += 1
            self._close_open_bins(k)
            gpus = self._bin_gpus.pop(k, set())
            bin_end = (k + 1) * self._res
            bin_ofu = self.ofu.mean(k * self._res, bin_end)
            if bin_ofu is None:  # no data in this bin: go straight to the next bin that has some
                following = self.ofu.next_data(bin_end)
                skip_to = int(following // self._res) if following is not None else self._next_bin
                if skip_to > self._next_bin:
                    self._next_bin = skip_to
                    for empty in [b for b in self._bin_gpus if b < skip_to]:
                        del self._bin_gpus[empty]
                    for empty in [b for b in self._stall_bins if b < skip_to]:
                        del self._stall_bins[empty]
                    self._close_open_bins(skip_to - 1)
                continue
            self.peak_gpus = max(self.peak_gpus, len(gpus))
            found = self.regression.observe(bin_end, bin_ofu)
            found += self.audit.observe(bin_end, *self._audit_means(bin_end), last_report=self._last_report())
            found += self.stall.observe(bin_end, self._stall_bins.pop(k, None))
            for transition in found:
                if transition.action == OPEN:
                    self.findings.append(transition.finding)
                    transition.finding.id = f"{self.job_id}/{transition.finding.kind}/{len(self.findings)}"
                    if transition.finding.kind == REGRESSION:
                        self._what_grew(transition.finding, bin_end)
            transitions += found
            snapshots.append(self._snapshot(bin_end, len(gpus), bin_ofu))
        return snapshots, transitions

    def closed_through(self) -> float | None:
        """The end of the last bin :meth:`advance` closed (its snapshot, if any, is out)."""
        return None if self._next_bin is None else self._next_bin * self._res

    def _what_grew(self, finding: Finding, bin_end: float) -> None:
        """Which loss part grew from the baseline's time to the slow bins: the regression's likely place."""
        baseline = float(self.config.regression.baseline_window)
        before = self.loss_bins.between(finding.since - baseline, finding.since)
        during = self.loss_bins.between(finding.since, bin_end)
        grown = grown_part(before, during) if before.seconds > 0 and during.seconds > 0 else None
        if grown is None:
            return
        part, old, new = grown
        finding.numbers.update({"grew": part, "grew_from": old, "grew_to": new})
        cause = during.dominant_cause(part)
        if cause is not None:
            finding.numbers["grew_cause"] = cause

    def _audit_means(self, bin_end: float) -> tuple[float | None, float | None]:
        start = bin_end - float(self.config.audit.window)
        covered = self.ofu.first_start <= start + 1e-9 and self.mfu.first_start <= start + 1e-9
        if not covered:
            return None, None
        return self.ofu.mean(start, bin_end), self.mfu.mean(start, bin_end)

    def _last_report(self) -> float | None:
        """The end of the job's newest MFU report (None before its first)."""
        return self.mfu.latest_end if self.mfu_seconds > 0 else None

    def _close_open_bins(self, through: int) -> None:
        """The bins up to ``through`` are closed: what they hold joins the life values."""
        for k in sorted(b for b in self._open if b <= through):
            open_bin = self._open.pop(k)
            self.closed_totals.merge(open_bin.totals)
            self.closed_mfu_seconds += open_bin.exact_mfu_seconds
            self.closed_mfu_weighted += open_bin.exact_mfu_weighted
            self.closed_cost.merge(open_bin.cost)
            account = self.loss_bins.bins.get(k)
            if account is not None:
                self.closed_loss.merge(account)

    def _snapshot(self, bin_end: float, gpus: int, bin_ofu: float) -> Snapshot:
        totals, life = replace(self.closed_totals), self.closed_loss.copy()
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
            if totals.flops_known and span > 0:
                rate[label] = flop / span
        if totals.ofu_mean is not None:
            ofu[LIFE] = totals.ofu_mean
        if (mfu_life := _mean(self.closed_mfu_weighted, self.closed_mfu_seconds)) is not None:
            mfu[LIFE] = mfu_life
        loss = {window_label(w): self.loss_bins.between(bin_end - float(w), bin_end) for w in self.config.windows}
        loss[LIFE] = life
        cost = self.closed_cost.copy() if self.closed_cost.exact_seconds > 0 else None
        return Snapshot(self.job_id, bin_end, gpus, bin_ofu, self.mfu.mean(bin_end - self._res, bin_end), ofu, mfu,
                        rate, totals, self.regression.baseline, self.open_findings(), loss, cost=cost,
                        stalled_seconds=self.stall.stalled_seconds)

    def end(self, reason: str) -> tuple[JobSummary, list[Transition]]:
        """The job's summary; findings still open close with it."""
        transitions = []
        for detector in (self.audit, self.regression):
            finding = detector.open
            if finding is not None:
                detector.open = None
                finding.closed_at = self.last_end
                finding.close_numbers = {"reason": JOB_END}
                transitions.append(Transition(CLOSE, finding, self.last_end))
        if self.stall.open is not None:
            transitions.append(self.stall.close(self.last_end, JOB_END))
        summary = JobSummary(
            job_id=self.job_id, start=self.first_start, end=self.last_end, reason=reason, gpus=len(self.gpus),
            peak_gpus=max([self.peak_gpus, *(len(g) for g in self._bin_gpus.values())]), totals=self.totals,
            ofu_p10=self.histogram.quantile(0.1), ofu_p50=self.histogram.quantile(0.5),
            ofu_p90=self.histogram.quantile(0.9), mfu_reported=self.mfu_life, precisions=dict(self.precisions),
            findings=list(self.findings), resource=self.resource, histogram=self.histogram, loss=self.loss,
            cost=self.cost, stalled_seconds=self.stall.stalled_seconds)
        return summary, transitions
