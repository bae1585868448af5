"""What a job reports about itself, in the JobBook: ranks, units, reports before the job, unmatched."""

import pytest

from otel_ofu.core import specs
from otel_ofu.core.model import HOST_NAME, HW_ID, HW_MODEL, JOB_ID, PRECISION, Batch, MetricPoint, attrs
from otel_ofu.jobs.book import JobBook
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.jobs.findings import MFU_GAP, OPEN
from otel_ofu.jobs.state import JobState
from otel_ofu.jobs.units import flops_per_unit
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.processors.jobs import JobsProcessor, state_fingerprint

H100 = "NVIDIA H100 80GB HBM3"
T0 = 1_800_000_000
H100_BF16 = specs.find_spec(H100).peak("bf16").flops


def gpu(t, value, uuid="GPU-a", job="train", precision="bf16"):
    return MetricPoint("gpu.ofu", value, int((T0 + t) * 1e9),
                       attrs({HW_ID: uuid, HW_MODEL: H100, HOST_NAME: "node-0", JOB_ID: job, PRECISION: precision}))


def report(t, value, job="train", pid=1, name="training.mfu", unit="1", host="node-0"):
    """A rank's report as attribution leaves it: the process's resource plus the job's id."""
    resource = {"service.name": "trainer", HOST_NAME: host, "process.pid": pid}
    if job is not None:
        resource[JOB_ID] = job
    return MetricPoint(name, value, int((T0 + t) * 1e9), attrs(resource), (), unit)


def fast_config(**extra):
    return build_config(JobsConfig, {"resolution": "10s", "windows": ["60s"], "job_timeout": "60s",
                                     "default_interval": "10s", "max_gap": "30s",
                                     "audit": {"window": "60s", "sustain": "30s", "clear_after": "30s"}, **extra})


def run(book, seconds, gpu_ofu, reports):
    """Every 10 s: two GPUs at ``gpu_ofu`` and whatever ``reports(t)`` returns."""
    updates = []
    for t in range(10, seconds + 1, 10):
        updates.append(book.observe([gpu(t, gpu_ofu, "GPU-a"), gpu(t, gpu_ofu, "GPU-b"), *reports(t)]))
    return updates


def opened(updates):
    return [(tracker.job_id, tr.finding) for u in updates for tracker, tr in u.transitions if tr.action == OPEN]


def test_ranks_reporting_together_give_one_value_per_window_their_mean():
    book = JobBook(fast_config())
    run(book, 120, 0.3, lambda t: [report(t, 0.30, pid=1), report(t, 0.34, pid=2)])
    tracker = book.jobs["train"]
    assert tracker.mfu.mean(T0 + 60, T0 + 120) == pytest.approx(0.32)
    assert tracker.mfu_life == pytest.approx(0.32)
    # Two ranks in one window are two series, not one series stepping backwards in time.
    assert not any(book.observe([report(125, 0.3, pid=p)]).skipped for p in (1, 2))


def test_a_rank_reporting_twice_the_ofu_opens_an_mfu_gap_for_the_job():
    book = JobBook(fast_config())
    updates = run(book, 180, 0.26, lambda t: [report(t, 0.52, pid=7)])
    ((job, finding),) = opened(updates)
    assert job == "train" and finding.kind == MFU_GAP
    assert finding.numbers["mfu_reported"] == pytest.approx(0.52) and finding.numbers["ofu"] == pytest.approx(0.26)


def test_honest_reports_open_nothing():
    book = JobBook(fast_config())
    assert opened(run(book, 300, 0.26, lambda t: [report(t, 0.25, pid=7)])) == []
    assert book.jobs["train"].mfu_life == pytest.approx(0.25)


@pytest.mark.parametrize(("precision", "tflops", "expected"), [
    ("bf16", H100_BF16 / 2 / 1e12, 0.5),
    ("fp8", H100_BF16 / 2 / 1e12, 0.25),  # the same TFLOP/s is half as much of the FP8 peak
])
def test_tflops_per_gpu_is_divided_by_the_peak_at_the_jobs_precision(precision, tflops, expected):
    book = JobBook(fast_config())
    for t in (10, 20, 30):
        book.observe([gpu(t, 0.5, precision=precision), report(t, tflops, name="megatron.training.throughput_tflops")])
    assert book.jobs["train"].mfu_life == pytest.approx(expected)


def test_tflops_of_a_job_whose_precision_is_unknown_is_not_guessed():
    book = JobBook(fast_config())
    book.observe([gpu(10, 0.5, precision="unknown")])
    update = book.observe([report(20, 400.0, name="training.tflops_per_gpu")])
    assert update.skipped == {"tflops_without_peak": 1} and update.unconverted == {"train": 1}
    assert book.jobs["train"].mfu_life is None


def test_units_percent_and_flops():
    book = JobBook(fast_config())
    book.observe([gpu(10, 0.5)])
    book.observe([gpu(20, 0.5), report(20, 40.0, unit="%")])  # torchtitan logs mfu(%)
    assert book.jobs["train"].mfu_life == pytest.approx(0.40)
    assert flops_per_unit("{flop}/s") == 1.0 and flops_per_unit("T{flop}/s") == 1e12 and flops_per_unit("") == 1e12


def test_a_report_before_the_jobs_first_gpu_window_waits_for_it():
    book = JobBook(fast_config())
    first = book.observe([report(10, 0.4), report(20, 0.4)])
    assert first.skipped == {} and book.pending_reports == 2 and "train" not in book.jobs
    book.observe([gpu(30, 0.4), report(30, 0.4)])
    tracker = book.jobs["train"]
    assert book.pending_reports == 0
    assert tracker.mfu.first_start == pytest.approx(T0 + 0)  # the held reports count from their own time
    assert tracker.mfu_life == pytest.approx(0.4)


def test_a_report_no_gpu_ever_matches_is_dropped_after_job_timeout_and_named():
    book = JobBook(fast_config())
    book.observe([report(10, 0.4, job="k8s:llm/typo")])
    updates = run(book, 80, 0.3, lambda t: [])
    dropped = [u for u in updates if u.unmatched]
    assert len(dropped) == 1 and dropped[0].unmatched == {"k8s:llm/typo": 1}
    assert dropped[0].skipped.get("mfu_without_job") == 1 and book.pending_reports == 0


def test_held_reports_are_bounded_oldest_job_first():
    book = JobBook(fast_config(max_pending_reports=2))
    book.observe([report(10, 0.4, job="a")])
    book.observe([report(10, 0.4, job="b")])
    update = book.observe([report(20, 0.4, job="b")])
    assert update.unmatched == {"a": 1} and book.pending_reports == 2


def test_a_report_without_a_job_id_is_counted():
    update = JobBook(fast_config()).observe([report(10, 0.4, job=None)])
    assert update.unmatched == {"": 1} and update.skipped == {"mfu_without_job": 1}


def test_config_names_the_bad_key():
    with pytest.raises(FieldError, match="tflops_metrics"):
        build_config(JobsConfig, {"tflops_metrics": ["training.mfu"]})
    with pytest.raises(FieldError, match="max_pending_reports"):
        build_config(JobsConfig, {"max_pending_reports": -1})


def test_held_reports_survive_a_saved_jobs_state(tmp_path):
    """A jobs tier with storage saves its book: reports still waiting for their job go with it."""
    config = fast_config()
    book = JobBook(config)
    book.observe([gpu(10, 0.3), report(10, 0.3)])
    book.observe([report(20, 0.4, job="later")])
    JobState(tmp_path, "jobs", state_fingerprint(config)).checkpoint(book)
    restored, _, _ = JobState(tmp_path, "jobs", state_fingerprint(config)).load()
    assert restored.pending_reports == 1 and restored.jobs["train"].mfu_life == pytest.approx(0.3)
    restored.observe([gpu(30, 0.4, uuid="GPU-z", job="later")])
    assert restored.jobs["later"].mfu_life == pytest.approx(0.4)


@pytest.mark.parametrize("stop", ["crash", "restart"])
def test_reports_of_every_kind_resume_after_a_crash_or_a_restart(tmp_path, stop):
    """The journal and the snapshot carry MFU and TFLOP/s reports, the held ones included."""
    half_peak = H100_BF16 / 2 / 1e12  # TFLOP/s per GPU: MFU 0.5 at BF16
    batches = [
        [gpu(10, 0.5), report(10, half_peak, name="training.tflops_per_gpu"), report(10, 0.4, job="later"),
         report(10, 0.6 * half_peak, job="later", name="megatron.training.throughput_tflops")],
        [gpu(20, 0.5), report(20, half_peak, name="training.tflops_per_gpu")],
        [gpu(30, 0.5, uuid="GPU-z", job="later")],  # the held reports' job appears
    ]
    clock = [0.0]

    def processor(storage) -> JobsProcessor:
        config = build_config(JobsConfig, {"resolution": "10s", "windows": ["60s"], "job_timeout": "60s",
                                           "default_interval": "10s", "max_gap": "30s",
                                           "storage": str(storage) if storage else None, "checkpoint_interval": "1h"})
        proc = JobsProcessor(config, Context("jobs@metrics"), clock=lambda: clock[0])
        proc.start()
        return proc

    def feed(proc: JobsProcessor, points: list[MetricPoint]) -> None:
        clock[0] = points[0].time_unix_nano / 1e9
        proc.process(Batch(points=points))
        proc.exported()

    uninterrupted = processor(None)
    for points in batches:
        feed(uninterrupted, points)
    first = processor(tmp_path)
    for points in batches[:2]:
        feed(first, points)
    if stop == "crash":
        first.state.close()  # killed: only the journal since the start's checkpoint holds the reports
    else:
        first.flush()
        first.shutdown()
    second = processor(tmp_path)
    assert second.book.pending_reports == 2 and "later" not in second.book.jobs
    feed(second, batches[2])
    for job, mfu in (("train", 0.5), ("later", (0.4 + 0.3) / 2)):  # later: the mean of its two reporters
        assert second.book.jobs[job].mfu_life == pytest.approx(mfu)
        assert second.book.jobs[job].mfu_life == pytest.approx(uninterrupted.book.jobs[job].mfu_life)


def test_a_rank_is_one_reporter_before_and_after_attribution_names_its_jobs_kind():
    """Attribution adds the job's identity to a report's resource (ofu.job.id, .run, .kind, ...); a rank
    whose reports gain one of those (the Kubernetes API source caught up with its pod) is the same
    rank: its windows go on, its next report does not start a new series of its own."""
    book = JobBook(fast_config())

    def ranked(t, kind):
        point = report(t, 0.3)
        return point if kind is None else MetricPoint(point.name, point.value, point.time_unix_nano,
                                                      attrs({**dict(point.resource), "ofu.job.kind": kind}),
                                                      point.attributes, point.unit)

    for t in range(30, 121, 30):  # every 30 s; the API source names the kind from the third report on
        book.observe([gpu(t - 20, 0.3), gpu(t - 10, 0.3), gpu(t, 0.3), ranked(t, None if t < 90 else "PyTorchJob")])
    # One rank: its first window is default_interval (10 s), then 30 s each: 100 s, not 10 + 30 + 10 + 30.
    assert book.jobs["train"].mfu_seconds == pytest.approx(100)


def test_an_mfu_gap_closes_once_its_job_stops_reporting_mfu_and_says_why():
    """Issue 31 item 4: a job reporting twice its OFU raises an mfu_gap, then stops reporting MFU (a hung
    or removed reporter) while its GPUs run on. After one audit window (5m) with no report the finding
    closes: the event says why and names no "likely" cause, job.finding goes to 0 and stays there (the
    OfuJobMfuGap alert stops), and reports that come back are audited afresh."""
    now = [float(T0)]
    jobs = JobsProcessor(build_config(JobsConfig, {}), Context("jobs"), clock=lambda: now[0])
    outs = []
    for t in range(10, 45 * 60 + 1, 10):  # 45 minutes of GPU data; MFU in minutes 0-15 and 30-45
        now[0] = T0 + t
        points = [gpu(t, 0.26, "GPU-a"), gpu(t, 0.26, "GPU-b")]
        if t <= 15 * 60 or t > 30 * 60:
            points.append(report(t, 0.55))
        outs.append(jobs.process(Batch(points=points)))
    events = [e for out in outs for e in out.events if e.name.startswith("ofu.finding.")]
    assert [e.name for e in events] == ["ofu.finding.open", "ofu.finding.close", "ofu.finding.open"]
    close = dict(events[1].attributes)
    assert close["ofu.finding.reason"] == "no_mfu_report"
    # The first bin end a whole window (5m) after the last report, evaluated once a minute.
    assert 300 <= close["ofu.finding.no_report_s"] < 360
    assert 15 * 60 + 300 <= events[1].time_unix_nano / 1e9 - T0 < 15 * 60 + 360
    assert "no MFU report for 5m" in events[1].body and "likely" not in events[1].body
    assert "opened for flop_formula_overcount" in events[1].body
    closed, reopened = (e.time_unix_nano / 1e9 - T0 for e in events[1:])
    gauge = sorted((p.time_unix_nano / 1e9 - T0, p.value) for out in outs for p in out.points
                   if p.name == "job.finding")
    assert {value for t, value in gauge if t < closed} == {1.0}
    assert [value for t, value in gauge if closed <= t < reopened] == [0.0]  # nothing to compare: no 1
    assert reopened >= 30 * 60 + 300  # the audit's sustain again, not the streak from before the silence


def test_a_cleared_mfu_gap_says_what_it_was_opened_for_not_a_likely_cause():
    """Once the reports agree again, the close event's text must not still call the cause likely."""
    jobs = JobsProcessor(fast_config(), Context("jobs"), clock=lambda: float(T0))
    events = []
    for t in range(10, 301, 10):
        mfu = 0.55 if t <= 120 else 0.27
        events += jobs.process(Batch(points=[gpu(t, 0.26, "GPU-a"), gpu(t, 0.26, "GPU-b"), report(t, mfu)])).events
    opened_, closed = [e for e in events if e.name.startswith("ofu.finding.")]
    assert "likely flop_formula_overcount" in opened_.body
    assert closed.body.startswith("finding cleared (mfu_gap)") and "likely" not in closed.body
    assert "the gap it was opened for (flop_formula_overcount) is gone" in closed.body
