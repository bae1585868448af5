"""JobBook.expire looks only at the jobs whose end may have come, with the answer of looking at all.

A book fed one node's batch at a time used to walk every job on every batch (a directly-fed jobs
instance slowed as the fleet grew: BENCHMARKS.md section 6). Now it looks at the jobs of the
hosts whose clock moved and at the jobs whose next time to look has come. Here a random fleet
(hosts that go quiet, go silent past silence_timeout and come back, move on to other jobs, have
their clocks stepped back; a caller's wall clock or a recording's) goes through two books: one
as built, one made to look at every job on every batch. They must end the same jobs, for the
same reasons, in the same batches and order.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_ofu.core.model import HOST_NAME, HW_ID, JOB_ID, MetricPoint, attrs
from otel_ofu.jobs.book import JobBook
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.pipeline.config import build_config

T0 = 1_800_000_000.0
CONFIG = {"resolution": "10s", "windows": ["10s", "60s"], "job_timeout": "60s", "silence_timeout": "120s",
          "max_gap": "60s", "default_interval": "10s"}
JOBS = ["a", "b", "c", "d", None]


class LooksAtEveryJob(JobBook):
    """The book as it was: every job looked at on every batch."""

    def expire(self, update, now=None):
        self._check_all = True
        super().expire(update, now)


def point(host: int, gpu: int, job: str | None, t: float) -> MetricPoint:
    resource = {HOST_NAME: f"node-{host}", HW_ID: f"GPU-{host}-{gpu}", "gpu.index": str(gpu)}
    if job is not None:
        resource[JOB_ID] = job
    return MetricPoint("gpu.ofu", 0.4, int(t * 1e9), attrs(resource))


# One step of the fleet: which host sends (or none: only the clock moves), for which jobs, how far
# the data clock moves (a host's clock stepped back by a day now and then), how far the caller's.
steps = st.lists(st.tuples(
    st.one_of(st.none(), st.integers(0, 4)),            # host sending this batch
    st.lists(st.sampled_from(JOBS), min_size=1, max_size=2),  # its GPUs' jobs
    st.sampled_from([0, 5, 10, 10, 10, 30, 70, 130]),   # seconds the fleet's time moves
    st.booleans(),                                      # this host's clock stepped back a day
), min_size=5, max_size=80)


def run(book_type: type[JobBook], script, live: bool) -> list:
    book = book_type(build_config(JobsConfig, CONFIG))
    now = T0
    host_offset = [0.0] * 5
    ended = []
    for batch, (host, jobs, advance, step_back) in enumerate(script):
        now += advance
        points = []
        if host is not None:
            if step_back:
                host_offset[host] -= 86_400.0
            points = [point(host, gpu, job, now + host_offset[host]) for gpu, job in enumerate(jobs)]
        update = book.observe(points, now if live else None)
        ended += [(batch, s.job_id, s.reason, s.end) for s in update.ended]
    ended += [("close", s.job_id, s.reason, s.end) for s in book.close_all().ended]
    return ended


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=steps, live=st.booleans())
def test_expire_ends_the_jobs_looking_at_every_job_would(script, live):
    assert run(JobBook, script, live) == run(LooksAtEveryJob, script, live)


def test_a_quiet_job_ends_without_another_batch_of_its_host():
    """A job whose only host went quiet ends by the caller's clock alone (its next time to look came)."""
    book = JobBook(build_config(JobsConfig, CONFIG))
    book.observe([point(0, 0, "a", T0)], T0)
    ended = []
    for k in range(1, 30):  # only the clock moves, and another host's batches come
        ended += [s.job_id for s in book.observe([point(1, 0, "b", T0 + 10 * k)], T0 + 10 * k).ended]
    assert ended == ["a"]
    assert set(book.jobs) == {"b"}


def test_a_batch_looks_at_its_hosts_jobs_not_at_every_job():
    """What makes it cheap: with many jobs on many hosts, one host's batch looks at that host's jobs."""
    book = JobBook(build_config(JobsConfig, CONFIG))
    book.observe([point(h, 0, f"job-{h}", T0) for h in range(200)], T0)
    looked = []
    original = book._end_reason
    book._end_reason = lambda tracker, reference: (looked.append(tracker.job_id), original(tracker, reference))[1]
    book.observe([point(7, 0, "job-7", T0 + 10)], T0 + 10)
    assert looked == ["job-7"]


def test_the_looks_scheduled_stay_about_one_per_job():
    """A host sending every 10 s moves its jobs' next time to look each time: one entry each, not one per batch."""
    book = JobBook(build_config(JobsConfig, CONFIG))
    for k in range(50):
        book.observe([point(h, 0, f"job-{h}", T0 + 10 * k) for h in range(20)], T0 + 10 * k)
    assert len(book.jobs) == 20
    assert len(book._recheck) <= 2 * len(book.jobs)
