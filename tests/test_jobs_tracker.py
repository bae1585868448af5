"""JobBook / JobTracker on hand-made points: weighting, windows, bins, FLOPs, job life."""

import pytest

from otel_ofu.core import specs
from otel_ofu.core.model import HOST_NAME, HW_ID, HW_MODEL, JOB_ID, PRECISION, MetricPoint, attrs
from otel_ofu.jobs.book import JobBook
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.jobs.findings import CLOSE, MFU_GAP, OPEN
from otel_ofu.pipeline.config import FieldError, build_config

H100 = "NVIDIA H100 80GB HBM3"
T0 = 1_800_000_000  # a whole number of minutes: bins line up with the test's arithmetic


def gpu_res(gpu, model=H100, **extra):
    return attrs({HW_ID: gpu, HW_MODEL: model, HOST_NAME: "node-0", **extra})


def ofu(t, value, gpu="GPU-a", job="train", precision="bf16", model=H100, resource_extra=None, **point_extra):
    return MetricPoint("gpu.ofu", value, int((T0 + t) * 1e9), gpu_res(gpu, model, **(resource_extra or {})),
                       attrs({JOB_ID: job, PRECISION: precision, **point_extra}))


def flops(t, value, gpu="GPU-a", job="train", model=H100):
    return MetricPoint("gpu.flops.achieved", value, int((T0 + t) * 1e9), gpu_res(gpu, model),
                       attrs({JOB_ID: job, PRECISION: "bf16"}), "{flop}/s")


def mfu(t, value, job="train", name="training.mfu"):
    return MetricPoint(name, value, int((T0 + t) * 1e9), attrs({"service.name": "fw", JOB_ID: job}),
                       attrs({JOB_ID: job}))


def test_uneven_gpu_intervals_are_time_weighted():
    book = JobBook(JobsConfig())
    # GPU a every 10 s at 0.6, GPU b every 30 s at 0.3, for 2 minutes (first points cover their interval).
    for t in range(10, 121, 10):
        points = [ofu(t, 0.6, "GPU-a")]
        if t % 30 == 0:
            points.append(ofu(t, 0.3, "GPU-b"))
        book.observe(points)
    tracker = book.jobs["train"]
    # GPU b's first point covers the default 10 s interval, then 30 s each: 100 s at 0.3; GPU a 120 s at 0.6.
    assert tracker.totals.gpu_seconds == pytest.approx(120 + 100)
    assert tracker.totals.ofu_mean == pytest.approx((0.6 * 120 + 0.3 * 100) / 220)
    assert tracker.totals.wasted_gpu_hours == pytest.approx((120 * 0.4 + 100 * 0.7) / 3600)


def test_one_snapshot_per_bin_once_data_passes_its_end():
    book = JobBook(JobsConfig())
    snapshots = []
    for t in range(10, 61, 10):
        snapshots += book.observe([ofu(t, 0.5, "GPU-a"), ofu(t, 0.3, "GPU-b")]).snapshots
    assert len(snapshots) == 1  # the bin [0, 60) closed with the point at 60
    _, s = snapshots[0]
    assert s.time == T0 + 60 and s.gpus == 2
    assert s.bin_ofu == pytest.approx(0.4)
    assert s.ofu["5m"] == pytest.approx(0.4) and s.ofu["life"] == pytest.approx(0.4)
    assert book.observe([ofu(65, 0.5, "GPU-a")]).snapshots == []


def test_rolling_windows_and_life_diverge_after_a_change():
    book = JobBook(JobsConfig())
    last = None
    for t in range(10, 1201, 10):  # 10 min at 0.5, then 10 min at 0.2
        update = book.observe([ofu(t, 0.5 if t <= 600 else 0.2)])
        last = update.snapshots[-1][1] if update.snapshots else last
    assert last.time == T0 + 1200
    assert last.ofu["5m"] == pytest.approx(0.2)
    assert last.ofu["1h"] == pytest.approx(0.35)
    assert last.ofu["life"] == pytest.approx(0.35)


def test_windows_are_configurable():
    config = build_config(JobsConfig, {"windows": ["2m", "15m"], "resolution": "30s"})
    book = JobBook(config)
    snaps = []
    for t in range(10, 181, 10):
        snaps += book.observe([ofu(t, 0.5)]).snapshots
    assert set(snaps[-1][1].ofu) == {"2m", "15m", "life"}
    assert [s.time - T0 for _, s in snaps] == [30, 60, 90, 120, 150, 180]


def test_flops_from_achieved_points_else_from_the_peak():
    book = JobBook(JobsConfig())
    book.observe([ofu(10, 0.5, "GPU-a"), flops(10, 4e14, "GPU-a"), ofu(10, 0.5, "GPU-b")])
    peak = specs.find_spec(H100).peak("bf16").flops
    assert book.jobs["train"].totals.flop == pytest.approx(4e14 * 10 + 0.5 * peak * 10)


def test_unknown_precision_or_model_counts_no_flops():
    book = JobBook(JobsConfig())
    book.observe([ofu(10, 0.5, "GPU-a", precision="unknown"), ofu(10, 0.5, "GPU-b", model="Mystery GPU 9000")])
    totals = book.jobs["train"].totals
    assert totals.flop == 0 and not totals.flops_known and totals.gpu_seconds == 20


def test_flops_rate_over_windows():
    book = JobBook(JobsConfig())
    snaps = []
    for t in range(10, 61, 10):
        snaps += book.observe([ofu(t, 0.5, "GPU-a"), flops(t, 1e14, "GPU-a"),
                               ofu(t, 0.5, "GPU-b"), flops(t, 3e14, "GPU-b")]).snapshots
    assert snaps[-1][1].flops_rate["5m"] == pytest.approx(4e14)  # the job's two GPUs together


def test_jobs_without_a_name_are_unattributed():
    book = JobBook(build_config(JobsConfig, {"include_shared": False}))
    update = book.observe([ofu(10, 0.0, "GPU-a", job="none"), ofu(10, 0.1, "GPU-b", job="unknown"),
                           ofu(10, 0.4, "GPU-c", job="a,b", **{"ofu.job.shared": True})])
    assert book.jobs == {} and update.started == []
    assert book.unattributed.gpu_seconds == 30
    assert book.unattributed_histogram.total == 30
    assert book.gpu_count == 3


def test_a_shared_gpu_counts_for_each_of_its_jobs():
    """include_shared (the default): the GPU jobs a and b share, named in one comma-joined id (an older
    peer's or recording's point), counts for each of them, its GPU time split equally (issue 22: it became
    a pseudo-job "a,b"). GPU-hours stay those of the GPUs."""
    book = JobBook(JobsConfig())
    for t in range(10, 121, 10):
        book.observe([ofu(t, 0.4, "GPU-s", job="a,b", **{"ofu.job.shared": True}), ofu(t, 0.8, "GPU-a", job="a")])
    assert set(book.jobs) == {"a", "b"}
    a, b = book.jobs["a"].totals, book.jobs["b"].totals
    assert b.gpu_seconds == 60 and a.gpu_seconds == 120 + 60
    assert a.gpu_seconds + b.gpu_seconds + book.unattributed.gpu_seconds == 2 * 120
    assert b.ofu_mean == pytest.approx(0.4) and a.ofu_mean == pytest.approx((0.8 * 120 + 0.4 * 60) / 180)
    peak = specs.find_spec(H100).peak("bf16").flops
    assert b.flop == pytest.approx(0.4 * peak * 60)  # half the shared GPU's FLOPs
    assert book.jobs["a"].gpus == {("node-0", "gpu-a", ""), ("node-0", "gpu-s", "")}  # the GPUs each job held
    assert len(book.jobs["b"].gpus) == 1
    [summary_a, summary_b] = sorted(book.close_all().ended, key=lambda s: s.job_id)
    assert summary_a.precisions == {"bf16": 180} and summary_b.totals.gpu_hours == pytest.approx(60 / 3600)
    off = JobBook(build_config(JobsConfig, {"include_shared": False}))  # off: a shared GPU is no job's
    off.observe([ofu(10, 0.4, "GPU-s", job="a,b", **{"ofu.job.shared": True})])
    assert off.jobs == {} and off.unattributed.gpu_seconds == 10


def test_bad_points_are_skipped_and_counted():
    book = JobBook(JobsConfig())
    book.observe([ofu(20, 0.5)])
    update = book.observe([ofu(10, 0.5), ofu(20, 0.5), ofu(30, float("nan")), mfu(20, 0.5, job="other"),
                           mfu(25, float("inf"))])
    # The point at 10 came late: its window [0, 10] is counted; the one at 20 again is a duplicate.
    assert update.skipped == {"out_of_order": 1, "not_finite": 2}
    assert book.jobs["train"].totals.gpu_seconds == 20
    assert book.pending_reports == 1  # "other" may still get its first GPU window


def test_job_resource_copies_scheduler_attributes():
    book = JobBook(JobsConfig())
    point = ofu(10, 0.5, resource_extra={"k8s.namespace.name": "research"}, **{"slurm.job.user": "ada"})
    (tracker,) = book.observe([point]).started
    assert dict(tracker.resource) == {JOB_ID: "train", "k8s.namespace.name": "research", "slurm.job.user": "ada"}


def test_a_job_ends_after_the_timeout_and_a_new_one_starts():
    book = JobBook(build_config(JobsConfig, {"job_timeout": "2m"}))
    book.observe([ofu(10, 0.5, "GPU-a", job="short"), ofu(10, 0.5, "GPU-b", job="long")])
    ended = []
    for t in range(20, 200, 10):
        ended += book.observe([ofu(t, 0.5, "GPU-b", job="long")]).ended
    (summary,) = ended
    assert summary.job_id == "short" and summary.reason == "timeout"
    assert (summary.start, summary.end) == (T0, T0 + 10)
    assert summary.gpus == 1 and summary.totals.gpu_seconds == 10
    update = book.observe([ofu(200, 0.5, "GPU-a", job="short")])
    assert [t.job_id for t in update.started] == ["short"]


def test_close_all_summarises_and_closes_open_findings():
    config = build_config(JobsConfig, {"audit": {"sustain": "1m", "window": "1m"}})
    book = JobBook(config)
    transitions = []
    for t in range(10, 181, 10):
        transitions += book.observe([ofu(t, 0.25), mfu(t, 0.55)]).transitions
    assert [(t.action, t.finding.kind) for _, t in transitions] == [(OPEN, MFU_GAP)]
    assert transitions[0][1].finding.id == "train/mfu_gap/1"
    update = book.close_all()
    (summary,) = update.ended
    assert summary.reason == "shutdown" and summary.mfu_reported == pytest.approx(0.55)
    assert summary.ofu_p50 == pytest.approx(0.25, abs=0.002)
    assert len(summary.findings) == 1
    ((_, closed),) = update.transitions
    assert closed.action == CLOSE and closed.finding.close_numbers == {"reason": "job_end"}
    assert book.jobs == {}


def test_the_audit_waits_until_its_window_is_covered():
    book = JobBook(build_config(JobsConfig, {"audit": {"sustain": "1m", "window": "5m"}}))
    opened_at = None
    for t in range(10, 601, 10):
        for _, tr in book.observe([ofu(t, 0.25), mfu(t, 0.55)]).transitions:
            opened_at = tr.time
    assert opened_at == T0 + 300  # the first bin end with five minutes of both series behind it


def test_mfu_metric_name_is_configurable():
    book = JobBook(build_config(JobsConfig, {"mfu_metric": "app.mfu"}))
    book.observe([ofu(10, 0.25), mfu(10, 0.55, name="app.mfu"), mfu(10, 0.9)])
    assert book.jobs["train"].mfu_life == pytest.approx(0.55)


@pytest.mark.parametrize("data, key", [
    ({"windows": []}, "windows"),
    ({"windows": ["30s"]}, "windows[0]"),
    ({"windows": ["5m", "300s"]}, "windows"),
    ({"job_timeout": "10s"}, "job_timeout"),
    ({"max_gap": "5s"}, "max_gap"),
    ({"regression": {"drop_ratio": 0.5}}, "regression.drop_ratio"),
])
def test_config_errors_name_the_key(data, key):
    with pytest.raises(FieldError) as info:
        build_config(JobsConfig, data)
    assert info.value.key == key


# --- time: each host in its own clock (issue 11, item 1) -------------------------------------

def on_host(host, t, value=0.5, gpu=None, job="train", **extra):
    return ofu(t, value, gpu or f"GPU-{host}", job=job, resource_extra={HOST_NAME: host, **extra})


def run_two_nodes(book, minutes, job_minutes, skew_s=0.0, extra=lambda t: [], partition=None):
    """Node a (clock ``skew_s`` behind) runs job-a, node b runs job-b, for ``job_minutes``; then idle.

    ``now`` is node b's clock (the processor's wall clock). ``partition``: (from, to) seconds
    during which node a's points are held back, then delivered at once (a Collector's backlog).
    Returns every update.
    """
    updates, held = [], []
    for t in range(10, minutes * 60 + 1, 10):
        job = (lambda name: name) if t <= job_minutes * 60 else (lambda name: "none")
        a = on_host("node-a", t - skew_s, job=job("job-a"))
        points = [on_host("node-b", t, job=job("job-b")), *extra(t)]
        if partition and partition[0] <= t < partition[1]:
            held.append(a)
        else:
            points += [*held, a]
            held = []
        updates.append(book.observe(points, now=T0 + t))
    return updates


def events_per_job(updates, close=None):
    starts, ends = {}, {}
    for update in [*updates, *([close] if close else [])]:
        for tracker in update.started:
            starts[tracker.job_id] = starts.get(tracker.job_id, 0) + 1
        for summary in update.ended:
            ends[summary.job_id] = ends.get(summary.job_id, 0) + 1
    return starts, ends


def test_a_node_whose_clock_is_behind_does_not_end_its_job_early():
    book = JobBook(JobsConfig())
    updates = run_two_nodes(book, minutes=20, job_minutes=10, skew_s=360)
    assert events_per_job(updates) == ({"job-a": 1, "job-b": 1}, {"job-a": 1, "job-b": 1})
    ended = {s.job_id: s for u in updates for s in u.ended}
    assert ended["job-a"].reason == ended["job-b"].reason == "timeout"
    # Each job's life, in its own node's clock: ten minutes of one GPU.
    assert ended["job-a"].totals.gpu_seconds == ended["job-b"].totals.gpu_seconds == 600
    assert ended["job-a"].end == T0 + 600 - 360


def test_a_point_a_day_ahead_moves_nobody_and_is_counted():
    book = JobBook(JobsConfig())
    future = lambda t: [on_host("node-b", t + 86400, gpu="GPU-b2", job="job-b")] if t == 300 else []  # noqa: E731
    updates = run_two_nodes(book, minutes=20, job_minutes=20, extra=future)
    assert sum(u.skipped.get("future", 0) for u in updates) == 1
    assert events_per_job(updates, book.close_all()) == ({"job-a": 1, "job-b": 1}, {"job-a": 1, "job-b": 1})
    assert book.jobs == {}
    ahead = next(u.ahead for u in updates if u.ahead)
    assert ahead[0] == "node-b" and ahead[1] == pytest.approx(86400)


def test_a_node_steadily_ahead_counts_and_a_confirmed_jump_is_followed():
    book = JobBook(JobsConfig())
    skipped = 0
    for t in range(10, 1201, 10):
        jump = 3600 if t > 600 else 0  # node-b's clock is stepped an hour ahead half-way
        update = book.observe([on_host("node-a", t + 7200, job="job-a"), on_host("node-b", t + jump, job="job-b")],
                              now=T0 + t)
        skipped += update.skipped.get("future", 0)
        assert update.ended == []
    # node-a's first point, two hours ahead of this process's clock with no other host to compare
    # with, and node-b's first point after the jump: each until the host's next request confirmed it.
    assert skipped == 2
    assert book.jobs["job-a"].totals.gpu_seconds == 1190  # two hours ahead from the start: its own clock


def test_a_backlog_replayed_after_a_partition_does_not_end_jobs():
    book = JobBook(JobsConfig())
    updates = run_two_nodes(book, minutes=30, job_minutes=20, partition=(300, 900))  # node a cut off for 10 min
    assert events_per_job(updates) == ({"job-a": 1, "job-b": 1}, {"job-a": 1, "job-b": 1})
    ended = {s.job_id: s for u in updates for s in u.ended}
    assert ended["job-a"].totals.gpu_seconds == 1200  # the backlog counted, once


def test_a_job_whose_hosts_fall_silent_ends_after_the_silence_timeout():
    book = JobBook(build_config(JobsConfig, {"silence_timeout": "10m"}))
    for t in range(10, 301, 10):
        book.observe([on_host("node-a", t, job="job-a"), on_host("node-b", t, job="job-b")], now=T0 + t)
    ended = []
    for t in range(310, 1500, 10):  # node a is gone; node b keeps its job
        update = book.observe([on_host("node-b", t, job="job-b")], now=T0 + t)
        ended += [(s, t) for s in update.ended]
    ((summary, at),) = ended
    assert summary.job_id == "job-a" and summary.reason == "silent"
    assert summary.end == T0 + 300  # its last data, not when its end was noticed
    assert at == 300 + 600 + 10


DAY = 86400


@pytest.mark.parametrize("live", [True, False], ids=["processor", "recording"])
def test_a_node_whose_clock_is_stepped_back_a_day_loses_one_request_and_its_job_ends(live):
    """node-a boots a day fast; after 10 minutes NTP steps it back, and it runs job-a for another hour,
    then no job (issue 22: every later point of node-a was refused as out of order, and in a
    recording job-a never ended). The step costs one request, the time before it is its own job life
    (ended: clock_step), and the job after it ends by its timeout."""
    book = JobBook(JobsConfig())
    skipped: dict[str, int] = {}
    ended = []
    for t in range(10, 600 + 7200 + 1, 10):
        step = DAY if t <= 600 else 0
        update = book.observe([on_host("node-a", t + step, job="job-a" if t <= 4200 else "none"),
                               on_host("node-b", t, job="job-b")], now=T0 + t if live else None)
        for reason, count in update.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + count
        ended += update.ended
    # Refused: the first request after the step, until the next confirmed it; and with a wall
    # clock, node-a's first request a day ahead of it (its next one confirmed that time).
    assert skipped == {"out_of_order": 1, **({"future": 1} if live else {})}
    lives = [s for s in ended if s.job_id == "job-a"]
    assert [s.reason for s in lives] == ["clock_step", "timeout"]
    assert lives[0].totals.gpu_seconds == (590 if live else 600) and lives[0].end == T0 + 600 + DAY
    assert lives[1].totals.gpu_seconds == 4200 - 600 - 10 and lives[1].end == T0 + 4200
    assert list(book.jobs) == ["job-b"]
    assert book.clocks.hosts["node-a"].data == T0 + 7800  # its clock as it is now


def test_a_fresh_processor_refuses_a_first_point_a_day_ahead_of_its_clock():
    """No other host has a lead yet: the processor's own clock is the reference (issue 22: the point
    was taken, made a job a day in the future and had node-a's later points refused for 16 minutes)."""
    book = JobBook(JobsConfig())
    skipped: dict[str, int] = {}
    for t in range(10, 1201, 10):
        points = [on_host("node-a", t + (DAY if t == 10 else 0), job="job-a")]
        for reason, count in book.observe(points, now=T0 + t).skipped.items():
            skipped[reason] = skipped.get(reason, 0) + count
    assert skipped == {"future": 1}
    tracker = book.jobs["job-a"]
    assert tracker.first_start == T0 + 10 and tracker.last_end == T0 + 1200
    assert tracker.totals.gpu_seconds == 1190


# --- bounded state (issue 11, item 5) --------------------------------------------------------

def test_a_thousand_short_jobs_and_pods_leave_bounded_state():
    book = JobBook(build_config(JobsConfig, {"job_timeout": "2m", "max_gap": "1m", "resolution": "1m",
                                             "windows": ["2m"]}))
    ended = 0
    t = 0
    for job in range(1000):  # each job one minute on one GPU, in its own pod, reporting its own MFU
        for _ in range(6):
            t += 10
            update = book.observe([on_host("node-a", t, job=f"job-{job}", **{"k8s.pod.name": f"pod-{job}"}),
                                   mfu(t, 0.4, job=f"job-{job}")], now=T0 + t)
            ended += len(update.ended)
    assert ended >= 997
    assert book.ended == []  # no history kept in a long-running processor
    assert len(book.jobs) <= 3 and len(book._mfu_last) <= 3
    assert book.gpu_count == 1  # one GPU, whichever pods held it
    assert len(book.clocks.hosts) == 1


def test_pod_rollouts_of_one_job_on_the_same_gpus_are_those_gpus_not_more():
    """A Deployment rolled out 300 times on the same 8 GPUs holds 8 GPUs, not 2,400 (issue 22):
    the pod is an attribute of a GPU's time, not part of which GPU it is."""
    book = JobBook(JobsConfig())
    t = 0
    for rollout in range(300):
        for _ in range(3):  # 30 s per rollout
            t += 10
            book.observe([on_host("node-a", t, gpu=f"GPU-{g}", job="k8s:ml/serve",
                                  **{"k8s.pod.name": f"serve-{rollout}-{g}", "k8s.pod.uid": f"uid-{rollout}-{g}"})
                          for g in range(8)], now=T0 + t)
    assert len(book.jobs["k8s:ml/serve"].gpus) == 8 and book.gpu_count == 8
    [summary] = book.close_all().ended
    assert summary.gpus == 8 and summary.peak_gpus == 8
    assert summary.totals.gpu_seconds == 8 * t  # every rollout's GPU time, once


def test_hosts_and_their_gpus_are_forgotten_after_the_silence_timeout():
    book = JobBook(JobsConfig())
    for host in range(200):  # 200 nodes each report once, then are gone
        book.observe([on_host(f"node-{host}", 10, job="none")], now=T0 + 10)
    for t in range(20, 1200, 10):
        book.observe([on_host("node-keep", t, job="none")], now=T0 + t)
    assert set(book.clocks.hosts) == {"node-keep"} and book.gpu_count == 1


def test_history_keeps_every_summary_and_gpu_for_the_report():
    book = JobBook(build_config(JobsConfig, {"job_timeout": "2m"}), history=True)
    for job in range(5):
        for t in range(job * 300 + 10, job * 300 + 61, 10):
            book.observe([on_host("node-a", t, gpu=f"GPU-{job}", job=f"job-{job}")])
    book.close_all()
    assert [s.job_id for s in book.ended] == [f"job-{j}" for j in range(5)] and book.gpu_count == 5


def test_time_config_errors():
    with pytest.raises(FieldError) as info:
        build_config(JobsConfig, {"job_timeout": "10m", "silence_timeout": "5m"})
    assert info.value.key == "silence_timeout"
    with pytest.raises(FieldError) as info:
        build_config(JobsConfig, {"max_future": "0s"})
    assert info.value.key == "max_future"


def test_flops_from_the_peak_count_a_mig_instance_by_its_slices():
    """A recording without gpu.flops.achieved: a 3g instance stands for 3/7 of the GPU (issue 11, item 4)."""
    book = JobBook(JobsConfig())
    book.observe([ofu(10, 0.5, "GPU-m", resource_extra={"gpu.mig.instance_id": "2", "gpu.mig.profile": "3g.40gb"})])
    peak = specs.find_spec(H100).peak("bf16").flops
    assert book.jobs["train"].totals.flop == pytest.approx(0.5 * peak * 3 / 7 * 10)


def test_what_a_gpus_tuples_say_is_read_by_their_identity_not_equality():
    """A GPU's facts are kept per attribute tuples: equal tuples of other types still name their own job."""
    book = JobBook(JobsConfig())
    as_int = MetricPoint("gpu.ofu", 0.5, int((T0 + 10) * 1e9), gpu_res("GPU-a", **{JOB_ID: 1}), ())
    as_bool = MetricPoint("gpu.ofu", 0.5, int((T0 + 10) * 1e9), gpu_res("GPU-b", **{JOB_ID: True}), ())
    assert as_int.resource != as_bool.resource  # (other GPUs) but the job values compare equal: 1 == True
    book.observe([as_int, MetricPoint("gpu.ofu", 0.5, as_int.time_unix_nano, gpu_res("GPU-b", **{JOB_ID: 1}), ())])
    book.observe([as_bool])
    assert set(book.jobs) == {"1", "True"}
    # The same tuples again, later: the same answers.
    book.observe([MetricPoint("gpu.ofu", 0.4, int((T0 + 20) * 1e9), as_bool.resource, ())])
    assert book.jobs["True"].totals.gpu_seconds == pytest.approx(20)


def test_a_recreated_job_is_a_new_run_with_its_own_totals_and_baseline():
    """Issue 22: a PyTorchJob deleted and created again under its name keeps its id, but is a new
    run (ofu.job.run, its new UID): a second start, its own GPU-hours, no inherited baseline."""
    book = JobBook(JobsConfig())
    job = "k8s:ml/PyTorchJob/llama"
    started, ended = [], []

    def run_for(start: int, end: int, value: float, run: str) -> None:
        for t in range(start, end + 1, 10):
            update = book.observe([ofu(t, value, resource_extra={JOB_ID: job, "ofu.job.run": run})])
            started.extend((tr.job_id, dict(tr.resource).get("ofu.job.run")) for tr in update.started)
            ended.extend((s.job_id, dict(s.resource).get("ofu.job.run"), s.totals.gpu_seconds) for s in update.ended)

    run_for(10, 20 * 60, 0.6, "uid-1")
    (first,) = book.jobs.values()
    assert first.regression.baseline is not None  # twenty minutes of history
    run_for(20 * 60 + 10, 30 * 60, 0.2, "uid-2")  # re-created: same name, new UID, on the same GPU
    assert started == [(job, "uid-1"), (job, "uid-2")]
    assert ended == [(job, "uid-1", 20 * 60)]  # the first run ended when its GPU moved on, with its own totals
    (second,) = book.jobs.values()
    assert dict(second.resource)[JOB_ID] == job  # the stable name dashboards group by
    assert second.totals.gpu_seconds == pytest.approx(10 * 60) and second.totals.ofu_mean == pytest.approx(0.2)
    assert not [f for f in second.open_findings() if f.kind == "regression"]  # 0.2 is its own normal, not a drop
