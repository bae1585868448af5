"""GPU-hours are conserved by the jobs tier, however it is sharded and in whatever order points arrive.

A fleet of GPUs changes jobs (including none, and a GPU two jobs share) every interval. Its
samples go through the real ``ofu`` processor; the points are routed to N jobs-tier instances as
the fleet gateway routes them (collector-config/otelcol-gateway.yaml: a point whose resource names
a job by its ofu.job.id; the gateway drops the others, which the chart's direct install sends to its
one instance: here they are spread by their whole resource, so they are counted too), each a JobBook that gets
its points in any order, cut into any batches. Over all instances, each job's GPU time is the
time its GPUs held it (a shared GPU's split between its jobs with include_shared, else no
job's), and all GPU time together is the GPUs' own: nothing lost, nothing counted twice. The same for
energy (issue 34): each GPU's energy counter moves every interval, and each job's job.energy is the
counter's increase over the windows its GPUs held it; all energy together is the counters' increase.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_ofu.core.model import JOB_SHARED, Batch, GpuSample, MetricPoint, job_id_of
from otel_ofu.jobs.book import JobBook
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig

INTERVAL = 10  # seconds between a GPU's samples (the jobs processor's default_interval)
T0 = 1_800_000_000
HOLDERS = ["none", "a", "b", "c", "a,b"]  # who holds a GPU in an interval; "a,b": a GPU jobs a and b share
NO_JOB = {"none", "unknown", ""}


def energy_mj(host: int, index: int, step: int) -> int:
    """GPU (host, index)'s energy counter at ``step`` (DCGM 156, mJ since the driver loaded): it moves by
    200-700 W x INTERVAL, a different amount each interval."""
    return 9_000_000 * (index + 1) + sum(INTERVAL * (200_000 + 37_000 * ((host + 3 * index + 5 * k) % 14))
                                         for k in range(step + 1))


def fleet_points(holders: list[list[list[str]]]) -> list[MetricPoint]:
    """What the ofu processor emits for ``holders[host][gpu][step]``: each GPU sampled every INTERVAL."""
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    steps = len(holders[0][0])
    points: list[MetricPoint] = []
    for step in range(steps):
        t = (T0 + INTERVAL * (step + 1)) * 10**9
        samples = []
        for host, gpus in enumerate(holders):
            for index, held in enumerate(gpus):
                job = held[step]
                samples.append(GpuSample(
                    t, INTERVAL, f"node-{host}", index, f"GPU-{host}-{index}", "NVIDIA H100 80GB HBM3",
                    0.25 + 0.1 * index, 1755, job_id=job, precision="bf16",
                    resource={JOB_SHARED: True} if "," in job else {}, energy_mj=energy_mj(host, index, step)))
        points += ofu.process(Batch(samples=samples)).points
    return points


def routing_key(point: MetricPoint) -> object:
    """The fleet gateway's: ofu.job.id when the resource names a job (else the whole resource: see above)."""
    job = job_id_of(point)
    return ("job", job) if job not in NO_JOB and job is not None else ("resource", point.resource)


def expected(holders: list[list[list[str]]], include_shared: bool) -> tuple[dict[str, float], float]:
    """Each job's GPU seconds, and all GPUs' seconds together."""
    per_job: dict[str, float] = defaultdict(float)
    total = 0.0
    for gpus in holders:
        for held in gpus:
            for job in held:
                total += INTERVAL
                if job in NO_JOB or ("," in job and not include_shared):
                    continue
                names = job.split(",")
                for name in names:
                    per_job[name] += INTERVAL / len(names)
    return dict(per_job), total


def expected_energy(holders: list[list[list[str]]], include_shared: bool) -> tuple[dict[str, float], float]:
    """Each job's joules (the counter's increase over the intervals its GPUs held it, a shared GPU's split
    evenly), and all the counters' increase together: a GPU's first sample has none to give."""
    per_job: dict[str, float] = defaultdict(float)
    total = 0.0
    for host, gpus in enumerate(holders):
        for index, held in enumerate(gpus):
            for step in range(1, len(held)):
                joules = (energy_mj(host, index, step) - energy_mj(host, index, step - 1)) / 1000
                total += joules
                job = held[step]
                if job in NO_JOB or ("," in job and not include_shared):
                    continue
                names = job.split(",")
                for name in names:
                    per_job[name] += joules / len(names)
    return dict(per_job), total


def fleets(holders: list[str], steps: tuple[int, int] = (2, 24)) -> st.SearchStrategy:
    """holders[host][gpu][step] from ``holders``: 1-2 hosts of 1-3 GPUs, a few to 24 intervals."""
    return st.integers(1, 2).flatmap(lambda hosts: st.integers(1, 3).flatmap(lambda gpus: st.integers(*steps).flatmap(
        lambda n: st.lists(st.lists(st.lists(st.sampled_from(holders), min_size=n, max_size=n),
                                    min_size=gpus, max_size=gpus), min_size=hosts, max_size=hosts))))


def steady(holders: list[str]) -> st.SearchStrategy:
    """A fleet whose GPUs each keep one holder throughout."""
    return fleets(holders).map(lambda fleet: [[[held[0]] * len(held) for held in gpus] for gpus in fleet])


def run_jobs_tier(points: list[MetricPoint], instances: int, include_shared: bool, data: st.DataObject,
                  keep_series_order: bool, energy: dict | None = None) -> tuple[dict[str, float], float]:
    """Route ``points`` as the gateway does to ``instances`` JobBooks, each getting its GPU windows in an order
    hypothesis draws (each GPU's windows for one job in their order when ``keep_series_order``), in
    batches it draws (a window's points, one resource's at one time, travel together: the ofu processor makes
    them as one row, and an OTLP request carries a resource's points together); each job's GPU seconds over
    all instances, and all GPU seconds together. ``energy`` gets each job's joules ("jobs"), all joules together
    ("total") and the books' fleet total of the jobs' ("fleet_jobs")."""
    config = build_config(JobsConfig, {"include_shared": include_shared, "default_interval": f"{INTERVAL}s"})
    route: dict[object, int] = {}
    windows: dict[tuple, list[MetricPoint]] = defaultdict(list)
    for point in points:
        windows[(point.resource, point.time_unix_nano)].append(point)
    shards: list[list[list[MetricPoint]]] = [[] for _ in range(instances)]
    for window in windows.values():
        key = routing_key(window[0])
        if key not in route:
            route[key] = data.draw(st.integers(0, instances - 1), label="instance")
        shards[route[key]].append(window)
    per_job: dict[str, float] = defaultdict(float)
    joules: dict[str, float] = defaultdict(float)
    total = 0.0
    fleet_jobs = fleet_unallocated = 0.0
    for shard in shards:
        book = JobBook(config)
        arrival = data.draw(st.permutations(shard), label="arrival order")
        if keep_series_order:  # the drawn order of series, each series' own windows in their order
            by_series: dict[object, list[list[MetricPoint]]] = defaultdict(list)
            for window in sorted(shard, key=lambda w: w[0].time_unix_nano):
                by_series[window[0].resource].append(window)
            arrival = [by_series[window[0].resource].pop(0) for window in arrival]
        while arrival:
            size = data.draw(st.integers(1, len(arrival)), label="batch size")
            for summary in book.observe([p for window in arrival[:size] for p in window]).ended:
                per_job[summary.job_id] += summary.totals.gpu_seconds
                joules[summary.job_id] += summary.totals.energy or 0.0
            arrival = arrival[size:]
        for summary in book.close_all().ended:
            per_job[summary.job_id] += summary.totals.gpu_seconds
            joules[summary.job_id] += summary.totals.energy or 0.0
        total += book.unattributed.gpu_seconds
        fleet = book.fleet_energy.by_use()
        fleet_jobs += fleet["jobs"]
        fleet_unallocated += fleet["unallocated"]
    if energy is not None:
        energy.update(jobs={job: j for job, j in joules.items() if j}, total=sum(joules.values()) + fleet_unallocated,
                      fleet_jobs=fleet_jobs)
    return dict(per_job), total + sum(per_job.values())


def assert_energy_conserved(holders: list[list[list[str]]], include_shared: bool, energy: dict,
                            exact: bool = True) -> None:
    """Each job's energy is its GPUs' counters' increase while they held it; all of it is the counters'.
    Not ``exact`` (a series' own windows out of order): never more, each window counted at most once (a
    window that comes after a newer one of its series, whose time that one covered, loses its energy:
    docs/method.md#energy-per-job)."""
    want_jobs, want_total = expected_energy(holders, include_shared)
    assert energy["fleet_jobs"] == pytest.approx(sum(energy["jobs"].values()), rel=1e-9)
    if exact:
        assert energy["jobs"] == pytest.approx({job: j for job, j in want_jobs.items() if j}, rel=1e-9)
        assert energy["total"] == pytest.approx(want_total, rel=1e-9)
        return
    for job, joules in energy["jobs"].items():
        assert joules <= want_jobs[job] * (1 + 1e-9)
    assert energy["total"] <= want_total * (1 + 1e-9)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(holders=fleets(HOLDERS), instances=st.integers(1, 4), include_shared=st.booleans(), data=st.data())
def test_gpu_hours_are_conserved_across_any_sharding_and_interleaving(holders, instances, include_shared, data):
    """GPUs change jobs every interval; each instance gets its points in any order that keeps a GPU's points
    for one job in their order (as the gateway's queues deliver them), in any batches."""
    energy: dict = {}
    per_job, total = run_jobs_tier(fleet_points(holders), instances, include_shared, data, keep_series_order=True,
                                   energy=energy)
    want_jobs, want_total = expected(holders, include_shared)
    assert total == pytest.approx(want_total)
    assert per_job == pytest.approx(want_jobs)
    assert_energy_conserved(holders, include_shared, energy)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(holders=steady(HOLDERS), instances=st.integers(1, 4), include_shared=st.booleans(), data=st.data())
def test_points_in_any_order_at_all_are_each_counted_once(holders, instances, include_shared, data):
    """Any order at all, a GPU's own points too (a retried request arrives after newer ones): no point's time
    is lost or counted twice, for GPUs that keep their job (or none, or a shared pair)."""
    energy: dict = {}
    per_job, total = run_jobs_tier(fleet_points(holders), instances, include_shared, data, keep_series_order=False,
                                   energy=energy)
    want_jobs, want_total = expected(holders, include_shared)
    assert total == pytest.approx(want_total)
    assert per_job == pytest.approx(want_jobs)
    assert_energy_conserved(holders, include_shared, energy, exact=False)
