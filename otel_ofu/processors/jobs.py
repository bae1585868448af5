"""The ``jobs`` processor: per-GPU OFU in, per-job metrics, findings and job events out.

Place it after ``ofu`` (and after attribution, which names each GPU's job and precision).
It passes every point through and adds, once per ``resolution`` of data time and job, the
job's metrics under a resource of its own (``ofu.job.id`` plus copied scheduler
attributes), and events: ``ofu.job.start``, ``ofu.job.end`` (with the job's summary, after
``job_timeout`` without points or at shutdown), ``ofu.finding.open`` / ``ofu.finding.close``
(MFU audit, regression alarms and stalled GPUs, with their numbers and the likely cause). The logic
lives in :mod:`otel_ofu.jobs`; this module only turns its results into points and events.

Time: a job's end is judged in the clock of each host that ran it; this process's wall clock
only says when a host went silent and which points are stamped too far in the future
(docs/jobs.md, "Time").
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable

from otel_ofu.core.loss import CLOCK, USEFUL, LossTotals, gained_words, part_title
from otel_ofu.core.metrics import RATIO, MetricInfo, register
from otel_ofu.core.model import (
    COST_CURRENCY,
    ENERGY_USE,
    JOB_ID,
    LOSS_CAUSE,
    LOSS_PART,
    PRECISION,
    Attributes,
    Batch,
    Event,
    MetricPoint,
    attrs,
)
from otel_ofu.jobs.aggregate import JobTotals, window_label
from otel_ofu.jobs.book import ENERGY_METRIC, FLOPS_METRIC, OFU_METRIC, SHARE_METRIC, JobBook, Update
from otel_ofu.jobs.clocks import HostClock
from otel_ofu.jobs.config import CarbonConfig, JobsConfig
from otel_ofu.jobs.cost import Pricer, money, money_gained, total
from otel_ofu.jobs.findings import (  # noqa: F401 - the names are also read as processors.jobs.X
    CLOSE,
    EVENT_FINDING_CLOSE,
    EVENT_FINDING_OPEN,
    EVENT_JOB_END,
    EVENT_JOB_START,
    FINDING_CAUSE,
    FINDING_ID,
    FINDING_KIND,
    JOB_END,
    JOB_END_REASON,
    MFU_GAP,
    NO_MFU_REPORT,
    OPEN,
    STALLED,
    WINDOW,
    Finding,
    Transition,
)
from otel_ofu.jobs.loss import LOSS_METRIC, growth_text
from otel_ofu.jobs.stall import LINK_METRIC, WORK_RESUMED
from otel_ofu.jobs.state import JobState, Outputs, layout_fingerprint
from otel_ofu.jobs.tracker import LIFE, JobSummary, JobTracker, Snapshot
from otel_ofu.pipeline.component import Context, Factory, Processor

# A cost point's unit: money, in the currency its ofu.cost.currency attribute names (the registry holds one unit per
# metric, and the currency is a setting).
COST_UNIT = "{currency}"

for _info in (
    MetricInfo("job.ofu", RATIO, "gauge", "A job's OFU, time-weighted over its GPUs, over the window in ofu.window "
               "(rolling windows such as 5m and 1h, or life)."),
    MetricInfo("job.mfu.reported", RATIO, "gauge", "The MFU the job reports about itself, time-weighted over the "
               "window in ofu.window; the MFU audit compares it with job.ofu."),
    MetricInfo("job.gpus", "{gpu}", "gauge", "GPUs that reported for the job in the last bin."),
    MetricInfo("job.gpu_seconds", "s", "sum", "GPU time the job has held since it started."),
    MetricInfo("job.flops", "{flop}", "sum", "Floating-point operations the job's tensor cores performed since it "
               "started (OFU x dense peak at the job's precision; only GPU time with a known precision)."),
    MetricInfo("job.flops.achieved", "{flop}/s", "gauge", "The job's achieved FLOP/s, all its GPUs together, over "
               "the window in ofu.window."),
    MetricInfo("job.wasted_gpu_hours", "h", "sum", "GPU time the job has lost since it started: the compute it held "
               "but did not use, exactly the sum of job.ofu.loss.gpu_hours. A window whose SM clock boosted above "
               "f_ref gains GPU time, counted apart in job.ofu.gain.gpu_hours, so this never falls: GPU time = OFU x "
               "GPU time + this - the gain (docs/method.md#wasted-gpu-hours-and-the-clock-gain)."),
    MetricInfo("job.ofu.loss", RATIO, "gauge", "A job's loss account over the window in ofu.window: the share "
               "of its GPU time lost to each part (ofu.loss.part), GPU-time weighted like job.ofu; with job.ofu the "
               "parts add up to 1. The non-tensor part carries its dominant cause (ofu.loss.cause); the clock part "
               "comes as one point per cause (each clock event reason's loss, the boost's gain as `boost`), adding "
               "up to the part; `unknown`: OFU that came without its account.", whole_set=True),
    MetricInfo("job.ofu.loss.gpu_hours", "h", "sum", "GPU time the job has lost to each part (ofu.loss.part) since it "
               "started: share x GPU time of each window where the part is a loss; the parts add up to "
               "job.wasted_gpu_hours. Never falls: a window's negative clock part is in job.ofu.gain.gpu_hours."),
    MetricInfo("job.ofu.gain.gpu_hours", "h", "sum", "GPU time the job has gained on a part (ofu.loss.part: `clock`) "
               "since it started: -share x GPU time of each window where the part is below 0, the SM clock boosting "
               "above f_ref (docs/method.md#wasted-gpu-hours-and-the-clock-gain). A series only once the job gained."),
    MetricInfo("fleet.gpu_hours", "h", "sum", "Every GPU-hour this jobs processor has seen since it started, by "
               "where it went (ofu.loss.part): `useful` (OFU), each loss part of the jobs, `unknown`, and "
               "`unallocated` (GPU time of no job). Summed over instances and parts, less fleet.gpu_hours.gained: "
               "the fleet's GPU time."),
    MetricInfo("fleet.gpu_hours.gained", "h", "sum", "GPU-hours the jobs gained on a part (ofu.loss.part: `clock`, "
               "the SM clock boosting above f_ref) since this jobs processor started; job.ofu.gain.gpu_hours of "
               "every job together (docs/method.md#wasted-gpu-hours-and-the-clock-gain)."),
    MetricInfo("job.cost", COST_UNIT, "sum", "What the job's GPU time has cost since it started (the jobs "
               "processor's cost: price per GPU-hour of each GPU, a MIG instance's part of it, a shared GPU's job "
               "its share), by where it went (ofu.loss.part): `useful` (OFU) and each loss part; currency in "
               "ofu.cost.currency. Summed over parts, less job.cost.gained: GPU-hours x price. Only for GPU time "
               "with a price (docs/method.md#cost)."),
    MetricInfo("job.cost.gained", COST_UNIT, "sum", "Money the job's windows gained on a part (ofu.loss.part: "
               "`clock`, the SM clock boosting above f_ref), job.ofu.gain.gpu_hours x price; a series only once the "
               "job gained on a GPU with a price."),
    MetricInfo("fleet.cost", COST_UNIT, "sum", "What every GPU-hour with a price this jobs processor has seen since "
               "it started has cost, by where it went (ofu.loss.part): `useful`, each loss part of the jobs, "
               "`unknown`, and `unallocated` (GPU time of no job); currency in ofu.cost.currency. Summed over "
               "instances and parts, less fleet.cost.gained: the fleet's GPU-hours x price."),
    MetricInfo("fleet.cost.gained", COST_UNIT, "sum", "Money the jobs gained on a part (ofu.loss.part: `clock`) since "
               "this jobs processor started: job.cost.gained of every job together."),
    MetricInfo("job.energy", "J", "sum", "Energy the job's GPUs used since it started: each GPU window's gpu.energy "
               "(its counter's increase, or power x time where there is none), a shared GPU's and a MIG instance's "
               "by the job's part; only windows whose energy is known (docs/method.md#energy-per-job)."),
    MetricInfo("job.energy.per_useful_pflop", "J/{pflop}", "gauge", "Joules per PFLOP of useful work (10^15 FLOPs "
               "at OFU, job.flops) over the job's life, over the windows whose energy and FLOPs are both known. "
               "Over a rolling window: increase(job.energy) / (increase(job.flops) / 1e15) in the backend."),
    MetricInfo("job.emissions", "g", "sum", "Grams of CO2-equivalent of the job's energy since it started: "
               "job.energy in kWh x the jobs processor's carbon.grams_per_kwh (only when that is set)."),
    MetricInfo("fleet.energy", "J", "sum", "Energy of every GPU window this jobs processor has seen since it "
               "started, by whose GPUs it went to (ofu.energy.use: `jobs`, `unallocated`); summed over instances: "
               "the fleet's."),
    MetricInfo("fleet.energy.per_useful_pflop", "J/{pflop}", "gauge", "The jobs' joules per PFLOP of useful work "
               "since this jobs processor started, over the windows whose energy and FLOPs are both known (the "
               "unallocated GPUs' energy is in fleet.energy, not here)."),
    MetricInfo("job.ofu.baseline", RATIO, "gauge", "The regression detector's baseline: the median of the job's "
               "recent per-bin OFU (frozen while a regression is open)."),
    MetricInfo("job.finding", "{finding}", "gauge", "1 while a finding is open for the job (ofu.finding.kind: "
               "mfu_gap, regression or stalled; ofu.finding.cause), 0 once when it closes."),
    MetricInfo("job.stalled_gpu_hours", "h", "sum", "GPU time the job's GPUs spent stalled (engine busy, tensor "
               "pipes, DRAM and links idle) in its stalled findings since it started: the stalled windows from "
               "when each began to when work resumed (docs/jobs.md#stalled-jobs). A series only once the job "
               "had one."),
    MetricInfo("otel_ofu.jobs.checkpoints", "{checkpoint}", "sum", "Snapshots of the jobs state written to "
               "storage (each followed by an empty journal)."),
    MetricInfo("otel_ofu.jobs.skipped", "{point}", "sum", "Points the jobs processor did not use, by reason "
               "(out_of_order, not_finite, bad_share: a gpu.job.share outside 0..1, bad_energy: a gpu.energy below 0 "
               "or not finite (the window counts without energy), mfu_without_job, "
               "tflops_without_peak, future: stamped more than max_future beyond its host's usual lead over this "
               "process's clock)."),
    MetricInfo("otel_ofu.jobs.reports.pending", "{point}", "gauge", "Reports (MFU, TFLOP/s) held for jobs no GPU "
               "has reported for yet (bounded by max_pending_reports)."),
):
    register(_info)


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def finding_attributes(job_id: str, finding: Finding, transition: Transition) -> Attributes:
    """The event attributes of a finding: id, kind, cause, when it began, and its numbers."""
    numbers = finding.numbers if transition.action == OPEN else finding.close_numbers
    out: dict[str, object] = {JOB_ID: job_id, FINDING_ID: finding.id, FINDING_KIND: finding.kind,
                              FINDING_CAUSE: finding.cause, "ofu.finding.since_unix_nano": _ns(finding.since),
                              "ofu.finding.opened_unix_nano": _ns(finding.opened_at)}
    # A ratio against 0 is infinite: left out rather than written as a number that is not one.
    out.update({f"ofu.finding.{k}": v for k, v in numbers.items() if isinstance(v, str) or math.isfinite(v)})
    if transition.action == CLOSE and finding.closed_at is not None:
        out["ofu.finding.duration_s"] = finding.closed_at - finding.opened_at
    return attrs(out)


def finding_text(job_id: str, finding: Finding, action: str) -> str:
    """One line a person can act on. Only an open finding (or one its job ended with) names its cause as
    likely: one that cleared or went unreported says what it was opened for."""
    reason = finding.close_numbers.get("reason") if action == CLOSE else None
    n = finding.numbers if action == OPEN or reason == NO_MFU_REPORT else {**finding.numbers, **finding.close_numbers}
    if finding.kind == MFU_GAP:
        numbers = (f"reported MFU {float(n['mfu_reported']):.1%} vs OFU {float(n['ofu']):.1%} over {n['window']} "
                   f"(gap {float(n['gap_pp']):+.1f} pp)")
        if reason == NO_MFU_REPORT:
            silent = window_label(round(float(finding.close_numbers["no_report_s"])))
            return (f"finding closed, no MFU report for {silent} ({finding.kind}): job {job_id} sent no MFU report "
                    f"for {silent}, so the audit compares nothing until it reports again (opened for "
                    f"{finding.cause}: {numbers})")
        text = f"job {job_id}: {numbers}"
        if action == OPEN or reason == JOB_END:
            text += f": likely {finding.cause}"
        else:
            text += f"; the gap it was opened for ({finding.cause}) is gone"
    elif finding.kind == STALLED:
        text = _stalled_text(job_id, finding, n, action, reason)
        if action == OPEN:
            return f"finding ({finding.kind}): {text}"
        if reason == JOB_END:
            return f"finding closed with its job ({finding.kind}): {text}"
        return f"finding cleared, work resumed ({finding.kind}): {text}"
    elif "ofu" in n:
        text = (f"job {job_id}: OFU {float(n['ofu']):.1%} vs its baseline {float(n['baseline']):.1%} "
                f"({float(n['ratio']):.2f}x slower)")
        if "grew" in finding.numbers:  # where the regression went (the loss account): said at open and at close
            text += f": {growth_text(finding.numbers)}"
    else:
        text = f"job {job_id}: {finding.kind}"
    if action == OPEN:
        return f"finding ({finding.kind}): {text}"
    if reason == JOB_END:
        return f"finding closed with its job ({finding.kind}): {text}"
    return f"finding cleared ({finding.kind}): {text}"


def _stalled_text(job_id: str, finding: Finding, n: dict, action: str, reason: object) -> str:
    """A stalled finding for people: for how long, how many GPU-hours, and what it was judged on."""
    evidence = ("NVLink/PCIe traffic, tensor and DRAM activity idle" if n.get("evidence") == "links" else
                "tensor and DRAM activity idle (the source reads no NVLink/PCIe traffic)")
    busy = (f"job {job_id}: its GPUs kept their engine busy with nothing moving for "
            f"{window_label(round(float(n['stalled_for_s'])))} ({evidence}; "
            f"{float(n['stalled_gpu_hours']):.2f} GPU h)")
    if action == OPEN or reason == JOB_END:
        return f"{busy}: likely {finding.cause} (a collective deadlock or a spinning kernel)"
    if reason == WORK_RESUMED:
        return f"{busy}; tensor, memory or link activity is back"
    return busy


def summary_attributes(summary: JobSummary, currency: str = "") -> Attributes:
    t = summary.totals
    out: dict[str, object] = {
        JOB_ID: summary.job_id, JOB_END_REASON: summary.reason,
        "ofu.job.duration_s": summary.end - summary.start, "ofu.job.gpus": summary.gpus,
        "ofu.job.gpus.peak": summary.peak_gpus, "ofu.job.gpu_hours": t.gpu_hours,
        "ofu.job.wasted_gpu_hours": t.wasted_gpu_hours, "ofu.job.gained_gpu_hours": t.gained_gpu_hours,
        "ofu.job.ofu.mean": t.ofu_mean,
        "ofu.job.ofu.p10": summary.ofu_p10, "ofu.job.ofu.p50": summary.ofu_p50, "ofu.job.ofu.p90": summary.ofu_p90,
        "ofu.job.flops": t.flop if t.flops_known else None, "ofu.job.mfu.reported": summary.mfu_reported,
        "ofu.job.energy": t.energy, "ofu.job.energy.per_useful_pflop": t.energy_per_useful_pflop,
        "ofu.job.findings": len(summary.findings),
        "ofu.job.stalled_gpu_hours": summary.stalled_seconds / 3600.0 if summary.stalled_seconds > 0 else None,
        **_largest_loss(summary.loss),
        **_cost(summary.cost, currency),
        "ofu.job.precisions": ",".join(p for p, _ in sorted(summary.precisions.items(), key=lambda kv: -kv[1])),
    }
    return attrs(out)


def _cost(cost: LossTotals | None, currency: str) -> dict[str, object]:
    """The job end event's cost: all of it, what its loss parts lost, the currency; nothing without a price."""
    if cost is None:
        return {}
    lost = math.fsum(value for part, value in money(cost).items() if part != USEFUL)
    return {"ofu.job.cost": total(cost), "ofu.job.cost.wasted": lost, COST_CURRENCY: currency}


def _largest_loss(loss: LossTotals) -> dict[str, object]:
    """The job end event's largest loss part, its share of the job's GPU time and its dominant cause."""
    largest = loss.largest_loss()
    if largest is None:
        return {}
    part, share = largest
    out: dict[str, object] = {"ofu.job.loss.largest": part, "ofu.job.loss.largest_share": share}
    cause = loss.dominant_cause(part)
    if cause is not None:
        out["ofu.job.loss.largest_cause"] = cause
    return out


def state_fingerprint(config: JobsConfig) -> str:
    """The layout of a JobBook's state and the settings it depends on (see otel_ofu.jobs.state)."""
    book = JobBook(config)
    tracker = JobTracker("fingerprint", config)
    summary, _ = JobTracker("fingerprint", config).end("fingerprint")
    return layout_fingerprint([book, book.clocks, HostClock(0.0, 0.0), tracker, tracker.ofu, tracker.totals,
                               tracker.histogram, tracker.loss, tracker.loss_bins, tracker.audit, tracker.regression,
                               tracker.stall, Finding("kind", "cause", 0.0, 0.0), summary], config.state_key())


FUTURE_WARNING_INTERVAL_S = 600.0  # at most one "clock ahead" warning per this many seconds
# Job ids remembered so that a report problem is logged once per job (then forgotten in bulk).
_MAX_LOGGED_JOBS = 4096


def _close_marker_ns(tracker: JobTracker, transition: Transition) -> int:
    """When the ``job.finding`` 0 point of a closing finding is stamped.

    At the finding's close time, except when it closes with its job at the very end of a bin
    whose snapshot already marked it open (1) at that time: then 1 ms later (Prometheus'
    resolution), since one series must not hold two values at one timestamp.
    """
    closed_through = tracker.closed_through()
    if transition.finding.close_numbers.get("reason") == JOB_END and closed_through is not None \
            and transition.time <= closed_through + 1e-9:
        return _ns(closed_through) + 1_000_000
    return _ns(transition.time)


class JobsProcessor(Processor):
    def __init__(self, config: JobsConfig, context: Context, *, clock: Callable[[], float] = time.time):
        super().__init__(config, context)
        self.book = JobBook(config)
        self._clock = clock
        self._warned_future_at = -math.inf
        self._logged: set[tuple[str, str]] = set()  # (problem, job id) already logged
        self._unpriced_logged: set[str] = set()  # what GPUs with no price are priced by, already logged
        self.state: JobState | None = None
        self._journal_names = frozenset({OFU_METRIC, FLOPS_METRIC, LOSS_METRIC, SHARE_METRIC, ENERGY_METRIC,
                                         LINK_METRIC, config.mfu_metric, *config.tflops_metrics})
        # fleet.gpu_hours: this instance's (summed over instances: the fleet's), once per resolution bin
        host = socket.gethostname()
        self._fleet_resource = attrs({"service.name": "otel-ofu", "service.instance.id": f"{host}:{os.getpid()}"})
        # Outputs a previous run journaled but may not have handed to the exporters: sent with the next batch.
        self._unsent: Outputs = ([], [])
        self._unmarked = False  # journal records whose outputs the exporters have not taken yet
        self._last_checkpoint = 0.0

    def start(self) -> None:
        """With ``storage``: load the saved jobs, replay the journal since, and checkpoint at once.

        Outputs the journal has no export mark for go out again with the first batch, as they were.
        """
        if self.config.storage is None:
            return
        self.state = JobState(self.config.storage, self.context.component_id, state_fingerprint(self.config),
                              self.log)
        book, batches, unsent = self.state.load()
        if book is not None:
            self.book = book
            self.book.pricer = Pricer(self.config.cost)  # the prices in force now, not those it was saved with
        for now, points in batches:  # their outputs are in the journal: not made again
            self.book.observe(points, now)
            self._fleet_points()  # ... fleet.gpu_hours too: the next goes out when it would have
        if book is not None or batches:
            self.log.info("resumed %d job(s) from %s (%d batch(es) replayed from the journal); jobs new to this "
                          "instance start fresh", len(self.book.jobs), self.state.snapshot_path, len(batches))
        self._checkpoint()
        if unsent[0] or unsent[1]:
            self.log.info("%d job point(s) and %d event(s) the previous run made may not have reached the exporters: "
                          "they go out again with the next batch, with the values they had", len(unsent[0]),
                          len(unsent[1]))
            self._unsent = unsent
            self.state.append_outputs(unsent)
            self._unmarked = True

    def process(self, batch: Batch) -> Batch:
        now = self._clock()
        update = self.book.observe(batch.points, now)
        if update.ahead is not None and now - self._warned_future_at >= FUTURE_WARNING_INTERVAL_S:
            self._warned_future_at = now
            host, ahead = update.ahead
            self.log.warning("jobs: %d point(s) stamped further ahead than their host's clock has run so far "
                             "(max_future %gs) were not counted (e.g. host %s, %.0fs ahead of this process's clock): "
                             "check that node's clock (NTP)", update.skipped.get("future", 0),
                             float(self.config.max_future), host, ahead)
        points, events = self._render(update)
        if self.state is not None:
            names = self._journal_names
            used = [p for p in batch.points if p.name in names]
            if used or points or events:  # write-ahead: in the journal before it reaches the exporters
                self.state.append(now, used, (points, events))
                self._unmarked = True
            if self._unsent[0] or self._unsent[1]:
                points, events = self._unsent[0] + points, self._unsent[1] + events
        if not self.config.passthrough:
            return Batch(points=points, events=events)
        return Batch(samples=batch.samples, points=[*batch.points, *points], passthrough=batch.passthrough,
                     events=[*batch.events, *events])

    def exported(self) -> None:
        """Mark the batch just exported in the journal; checkpoint when due."""
        if self.state is None or not self._unmarked:
            return
        self.state.mark_exported()
        self._unmarked = False
        self._unsent = ([], [])
        if (time.monotonic() - self._last_checkpoint >= float(self.config.checkpoint_interval)
                or self.state.journal_bytes >= self.config.max_journal_bytes):
            self._checkpoint()

    def _checkpoint(self) -> None:
        assert self.state is not None
        started = time.monotonic()
        self.state.checkpoint(self.book)
        self._last_checkpoint = time.monotonic()
        self.context.telemetry.add("otel_ofu.jobs.checkpoints", 1)
        self.log.debug("jobs state saved (%d jobs) in %.3f s", len(self.book.jobs), self._last_checkpoint - started)

    def flush(self) -> Batch | None:
        """At shutdown every job ends (reason ``shutdown``) with its summary; with ``storage`` they are kept.

        Outputs still to send again go out now, and stay journaled (unmarked) for the next start.
        """
        if self.state is not None:
            unsent, self._unsent = self._unsent, ([], [])
            self._checkpoint()
            self.log.info("jobs state saved: %d job(s) continue when this instance starts again", len(self.book.jobs))
            if not (unsent[0] or unsent[1]):
                return None
            self.state.append_outputs(unsent)
            return Batch(points=unsent[0], events=unsent[1])
        points, events = self._render(self.book.close_all("shutdown"))
        return Batch(points=points, events=events) if points or events else None

    def shutdown(self) -> None:
        if self.state is not None:
            self.state.close()

    @property
    def inputs(self) -> frozenset[str]:
        """The metrics this processor reads: what a jobs tier's otlp receiver decodes and the fleet gateway
        forwards to it (collector-config/fleet-jobs.yaml, otelcol-gateway.yaml), all it needs."""
        return self._journal_names

    def _render(self, update: Update) -> tuple[list[MetricPoint], list[Event]]:
        for reason, count in update.skipped.items():
            self.context.telemetry.add("otel_ofu.jobs.skipped", count, reason=reason)
        self.context.telemetry.set("otel_ofu.jobs.reports.pending", self.book.pending_reports)
        self._log_report_problems(update)
        self._log_unpriced()
        points: list[MetricPoint] = []
        events: list[Event] = [self._start_event(tracker) for tracker in update.started]
        for tracker, snapshot in update.snapshots:
            points += self._snapshot_points(snapshot, tracker, self.config.cost.currency)
            if tracker.stall.cannot_tell:
                self._log_cannot_tell(tracker)
        for tracker, transition in update.transitions:
            events.append(self._finding_event(tracker, transition))
            if transition.action == CLOSE:
                f = transition.finding
                points.append(MetricPoint("job.finding", 0.0, _close_marker_ns(tracker, transition),
                                          tracker.resource, attrs({FINDING_KIND: f.kind, FINDING_CAUSE: f.cause}),
                                          "{finding}"))
        for summary in update.ended:
            text = self._end_text(summary, self.config.cost.currency)
            events.append(Event(EVENT_JOB_END, _ns(summary.end), summary.resource,
                                summary_attributes(summary, self.config.cost.currency), text))
            points += self._final_points(summary)
            self.log.info("%s", text)
        points += self._fleet_points()
        return points, events

    def _fleet_points(self) -> list[MetricPoint]:
        """fleet.gpu_hours by part, once per resolution bin of data time (stamped at the bin's start)."""
        loss = self.book.fleet_loss
        if loss.seconds <= 0 or not math.isfinite(self.book.newest):
            return []
        resolution = float(self.config.resolution)
        current = math.floor(self.book.newest / resolution)
        if self.book.fleet_emitted is None:
            self.book.fleet_emitted = (current, current)
            return []
        last, first = self.book.fleet_emitted
        if current <= last:
            return []
        self.book.fleet_emitted = (current, first)
        t, start = _ns(current * resolution), _ns(first * resolution)
        out = [MetricPoint(name, hours, t, self._fleet_resource, attrs({LOSS_PART: part}), "h", True, start)
               for name, hours_by_part in (("fleet.gpu_hours", loss.gpu_hours()),
                                           ("fleet.gpu_hours.gained", loss.gained_gpu_hours()))
               for part, hours in hours_by_part.items()]
        energy = self.book.fleet_energy
        if energy.known:
            out += [MetricPoint("fleet.energy", joules, t, self._fleet_resource, attrs({ENERGY_USE: use}), "J", True,
                                start) for use, joules in energy.by_use().items()]
            if (per_pflop := energy.per_useful_pflop) is not None:
                out.append(MetricPoint("fleet.energy.per_useful_pflop", per_pflop, t, self._fleet_resource, (),
                                       "J/{pflop}"))
        cost = self.book.fleet_cost
        if cost.exact_seconds > 0:
            currency = self.config.cost.currency
            out += [MetricPoint(name, value, t, self._fleet_resource,
                                attrs({LOSS_PART: part, COST_CURRENCY: currency}), COST_UNIT, True, start)
                    for name, by_part in (("fleet.cost", money(cost)), ("fleet.cost.gained", money_gained(cost)))
                    for part, value in by_part.items()]
        return out

    def _log_unpriced(self) -> None:
        """Once per model (or cost.by value): GPUs with no price, whose time has no cost."""
        new = self.book.unpriced.keys() - self._unpriced_logged
        if not new:
            return
        self._unpriced_logged |= new
        by = self.config.cost.by
        for key in sorted(new):
            self.log.warning("jobs: GPUs with %s %s have no price: their GPU time has no cost (not a cost of 0); add "
                             "it to cost.per_gpu_hour or set cost.default (docs/jobs.md#cost). Logged once.", by,
                             repr(key) if key else "(none)")

    def _log_report_problems(self, update: Update) -> None:
        """Once per job: reports that matched no job, TFLOP/s that could not become MFU."""
        problems = [("unmatched", job) for job in update.unmatched] + [("unconverted", j) for j in update.unconverted]
        for problem, job in problems:
            if (problem, job) in self._logged:
                continue
            if len(self._logged) >= _MAX_LOGGED_JOBS:
                self._logged.clear()
            self._logged.add((problem, job))
            if problem == "unconverted":
                self.log.warning("job %s reports TFLOP/s but the model or precision of its GPUs is unknown, so it "
                                 "cannot be compared with OFU: declare the job's precision (docs/audit.md, Units) "
                                 "or report MFU. Logged once per job.", job)
            elif job:
                self.log.warning("reports (MFU/TFLOP/s) for job %s match no job: no GPU reported for it within "
                                 "job_timeout (%gs). Check that the reporting process names the same pod, Slurm job "
                                 "or process as its GPUs (docs/audit.md). Logged once per job.", job,
                                 float(self.config.job_timeout))
            else:
                self.log.warning("reports (MFU/TFLOP/s) without ofu.job.id: put the attribution processor before "
                                 "jobs and give the reporting process a pod, Slurm or process identity "
                                 "(docs/audit.md). Logged once.")

    def _log_cannot_tell(self, tracker: JobTracker) -> None:
        """Once per job: its GPUs read neither GR nor SM activity, so whether it is stalled cannot be told."""
        if ("stall_unknown", tracker.job_id) in self._logged:
            return
        if len(self._logged) >= _MAX_LOGGED_JOBS:
            self._logged.clear()
        self._logged.add(("stall_unknown", tracker.job_id))
        self.log.info("job %s: its GPUs read neither GR_ENGINE_ACTIVE (DCGM 1001) nor SM_ACTIVE (1002), or sent no "
                      "loss account (gpu.ofu.loss): whether it is stalled, busy with nothing moving, cannot be told, "
                      "and no stalled finding is raised for that time. Add field 1001 to the source's counters "
                      "(docs/jobs.md#stalled-jobs). Logged once per job.", tracker.job_id)

    def _start_event(self, tracker: JobTracker) -> Event:
        precisions = ",".join(sorted(tracker.precisions))
        # In a jobs tier a job also "starts" on an instance it moved to (docs/fleet.md): its totals begin there.
        self.log.info("job %s first seen by this instance (%d GPUs, precision %s): its totals start here",
                      tracker.job_id, len(tracker.gpus), precisions)
        return Event(EVENT_JOB_START, _ns(tracker.first_start), tracker.resource,
                     attrs({JOB_ID: tracker.job_id, "ofu.job.gpus": len(tracker.gpus), PRECISION: precisions}),
                     f"job {tracker.job_id} started ({len(tracker.gpus)} GPUs seen, precision {precisions})")

    def _finding_event(self, tracker: JobTracker, transition: Transition) -> Event:
        finding = transition.finding
        text = finding_text(tracker.job_id, finding, transition.action)
        if transition.action == OPEN:
            self.log.warning("%s", text)
        else:
            self.log.info("%s", text)
        name = EVENT_FINDING_OPEN if transition.action == OPEN else EVENT_FINDING_CLOSE
        return Event(name, _ns(transition.time), tracker.resource,
                     finding_attributes(tracker.job_id, finding, transition), text,
                     "WARN" if transition.action == OPEN else "INFO")

    @staticmethod
    def _end_text(summary: JobSummary, currency: str = "") -> str:
        t = summary.totals
        ofu = f"{t.ofu_mean:.1%}" if t.ofu_mean is not None else "n/a"
        gpus = f"{summary.gpus} GPU{'s' if summary.gpus != 1 else ''}"
        largest = summary.loss.largest_loss()
        where = f" (largest loss: {part_title(largest[0])}, {largest[1]:.0%})" if largest else ""
        gained = summary.loss.gained_gpu_hours()
        gain = "".join(f" ({gained_words(part, hours)})" for part, hours in gained.items() if hours >= 0.005)
        cost = ""
        if summary.cost is not None:
            numbers = _cost(summary.cost, currency)
            cost = f", cost {numbers['ofu.job.cost']:.2f} {currency} ({numbers['ofu.job.cost.wasted']:.2f} wasted)"
        return (f"job {summary.job_id} ended ({summary.reason}): {gpus}, {t.gpu_hours:.2f} GPU h, "
                f"OFU {ofu}, {t.wasted_gpu_hours:.2f} GPU h wasted{where}{gain}{cost}, {len(summary.findings)} "
                "finding(s)")

    @staticmethod
    def _snapshot_points(s: Snapshot, tracker: JobTracker, currency: str = "") -> list[MetricPoint]:
        resource, start = tracker.resource, _ns(tracker.first_start)
        t = _ns(s.time)
        out = [MetricPoint("job.ofu", v, t, resource, attrs({WINDOW: w}), RATIO) for w, v in s.ofu.items()]
        out += [MetricPoint("job.mfu.reported", v, t, resource, attrs({WINDOW: w}), RATIO)
                for w, v in s.mfu.items()]
        out += [MetricPoint("job.flops.achieved", v, t, resource, attrs({WINDOW: w}), "{flop}/s")
                for w, v in s.flops_rate.items()]
        out.append(MetricPoint("job.gpus", float(s.gpus), t, resource, (), "{gpu}"))
        if s.totals.energy is not None and (per_pflop := s.totals.energy_per_useful_pflop) is not None:
            out.append(MetricPoint("job.energy.per_useful_pflop", per_pflop, t, resource, (), "J/{pflop}"))
        for window, loss in s.loss.items():
            for part, share in loss.shares().items():
                if part == USEFUL:
                    continue  # job.ofu
                by_cause = loss.cause_shares(part) if part == CLOCK else None
                if by_cause:  # the clock: one point per cause (each reason's, the boost's gain), adding up to it
                    out += [MetricPoint("job.ofu.loss", cause_share, t, resource,
                                        attrs({WINDOW: window, LOSS_PART: part, LOSS_CAUSE: cause}), RATIO)
                            for cause, cause_share in by_cause.items()]
                    continue
                cause = loss.dominant_cause(part)
                out.append(MetricPoint("job.ofu.loss", share, t, resource,
                                       attrs({WINDOW: window, LOSS_PART: part, LOSS_CAUSE: cause}), RATIO))
        out += _counter_points(t, resource, start, s.totals, s.loss.get(LIFE), s.cost, s.stalled_seconds,
                               tracker.config.carbon, currency)
        if s.baseline is not None:
            out.append(MetricPoint("job.ofu.baseline", s.baseline, t, resource, (), RATIO))
        out += [MetricPoint("job.finding", 1.0, t, resource, attrs({FINDING_KIND: f.kind, FINDING_CAUSE: f.cause}),
                            "{finding}") for f in s.open_findings]
        return out

    def _final_points(self, summary: JobSummary) -> list[MetricPoint]:
        """An ended job's cumulative counters at its end: its life totals, the windows of its last, partial bin
        too, which no snapshot counted (without these a backend's counters stop up to one bin short)."""
        if not math.isfinite(summary.start):
            return []
        # The trackers' configuration (the book's), as the snapshots used: a resumed book keeps the one it was
        # saved with, and emissions from another carbon intensity could fall below the last snapshot's.
        carbon = self.book.config.carbon
        return _counter_points(_final_ns(summary.end, float(self.config.resolution)), summary.resource,
                               _ns(summary.start), summary.totals, summary.loss, summary.cost,
                               summary.stalled_seconds, carbon, self.config.cost.currency)


def _final_ns(end: float, resolution: float) -> int:
    """When an ended job's final counter values are stamped: at its end (data time), except within 1 ms after
    the end of a bin, where its last snapshot may be stamped (1 ms: Prometheus' resolution) with other values
    (a window late for a bin already closed counts in the next bin's, the end's here): then 1 ms after that
    bin's end, since one series must not hold two values at one timestamp (as :func:`_close_marker_ns`)."""
    t, after_bin = _ns(end), _ns(math.floor((end + 1e-9) / resolution) * resolution) + 1_000_000
    return after_bin if t < after_bin else t


def _counter_points(t: int, resource: Attributes, start: int, totals: JobTotals, life: LossTotals | None,
                    cost: LossTotals | None, stalled_seconds: float, carbon: CarbonConfig,
                    currency: str) -> list[MetricPoint]:
    """A job's cumulative counters at ``t`` (ns), counted since ``start`` (its first window's start): from a bin's
    snapshot (its life values up to the bin's end) and, once more, from its summary at its end (all of its life).
    A series comes only once it has something to count (FLOPs of a known precision, energy, a gain, a price, a
    stall), as each counter's description says."""
    out = [MetricPoint("job.gpu_seconds", totals.gpu_seconds, t, resource, (), "s", True, start),
           MetricPoint("job.wasted_gpu_hours", totals.wasted_gpu_hours, t, resource, (), "h", True, start)]
    if totals.flops_known:
        out.append(MetricPoint("job.flops", totals.flop, t, resource, (), "{flop}", True, start))
    if (energy := totals.energy) is not None:
        out.append(MetricPoint("job.energy", energy, t, resource, (), "J", True, start))
        if (grams := carbon.grams(energy)) is not None:
            out.append(MetricPoint("job.emissions", grams, t, resource, (), "g", True, start))
    if life is not None:  # what each part lost and gained: two counters, neither falls
        out += [MetricPoint("job.ofu.loss.gpu_hours", hours, t, resource, attrs({LOSS_PART: part}), "h", True, start)
                for part, hours in life.gpu_hours().items() if part != USEFUL]
        out += [MetricPoint("job.ofu.gain.gpu_hours", hours, t, resource, attrs({LOSS_PART: part}), "h", True, start)
                for part, hours in life.gained_gpu_hours().items()]
    if cost is not None:  # its money by part and what the clock gained: two counters, as the GPU-hours
        out += [MetricPoint(name, value, t, resource, attrs({LOSS_PART: part, COST_CURRENCY: currency}), COST_UNIT,
                            True, start)
                for name, by_part in (("job.cost", money(cost)), ("job.cost.gained", money_gained(cost)))
                for part, value in by_part.items()]
    if stalled_seconds > 0:
        out.append(MetricPoint("job.stalled_gpu_hours", stalled_seconds / 3600.0, t, resource, (), "h", True, start))
    return out


FACTORY = Factory("jobs", JobsConfig, JobsProcessor,
                  "per-job OFU over rolling windows and life, the MFU audit, regression alarms, job events",
                  consumes="points", produces="points")
