"""A job's values are a pure function of its inputs: the same windows give the same bits, in any order,
cut into any batches, across a restart from the state on disk (issue 31, item 1).

Why bits: Prometheus refuses a sample that changes the value already stored at its timestamp
(``duplicate sample for timestamp``, storage/errors.go), and its OTLP handler then refuses the
whole request. A window the processor emits again (a restart, a retried request) must therefore
carry exactly the value it had, not one a float rounding away.
"""

from __future__ import annotations

import math
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_ofu.core.exact import exact, exact_sum, to_float
from otel_ofu.core.loss import LossTotals
from otel_ofu.core.model import JOB_ID, Batch
from otel_ofu.jobs.aggregate import JobTotals, TimeWeightedSeries, WeightedHistogram
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.processors.jobs import JobsProcessor
from tools.fleet_sim import NodeTier

JOBS = [{"id": "steady-a", "scenario": "steady", "gpus": 3, "precision": "bf16"},
        {"id": "moe-b", "scenario": "moe_inflated", "gpus": 3},
        {"id": "regress-c", "scenario": "regression", "gpus": 2, "regress_at": "6m", "recover_at": "12m"}]
WINDOWS = 100  # 10 s windows: 16 minutes, bins of 1 minute


def fleet_windows() -> list[list]:
    tier = NodeTier.of(nodes=2, gpus_per_node=4, jobs=JOBS)
    return [[p for points in tier.window().values() for p in points] for _ in range(WINDOWS)]


WINDOW_POINTS = fleet_windows()


def processor(storage=None) -> JobsProcessor:
    config = build_config(JobsConfig, {"storage": str(storage) if storage else None, "checkpoint_interval": "1h",
                                       "cost": {"per_gpu_hour": {"*": 2.49}}})  # job.cost: exact sums too
    proc = JobsProcessor(config, Context("jobs@metrics"), clock=lambda: 1_767_225_600.0)
    proc.start()
    return proc


def run(proc: JobsProcessor, batches: list[list]) -> list[Batch]:
    out = []
    for points in batches:
        out.append(proc.process(Batch(points=list(points))))
        proc.exported()
    return out


def job_values(batches: list[Batch]) -> list[tuple]:
    """Every job point with its value's exact bits."""
    return sorted((p.name, str(dict(p.resource).get(JOB_ID)), p.time_unix_nano, p.start_time_unix_nano,
                   p.attributes, p.value.hex())
                  for b in batches for p in b.points if p.name.startswith("job."))


UNINTERRUPTED = job_values(run(processor(), WINDOW_POINTS))


def test_the_fleet_exercises_every_job_value():
    names = {name for name, *_ in UNINTERRUPTED}
    assert names >= {"job.ofu", "job.mfu.reported", "job.flops.achieved", "job.gpu_seconds", "job.wasted_gpu_hours",
                     "job.flops", "job.ofu.loss", "job.ofu.loss.gpu_hours", "job.ofu.baseline", "job.finding",
                     "job.cost"}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), restart_at=st.integers(1, WINDOWS - 1), data=st.data())
def test_the_same_windows_give_the_same_bits_in_any_order_batching_and_restart(tmp_path_factory, seed, restart_at,
                                                                                 data):
    """Each window's points shuffled (its GPUs, its hosts, the reports), consecutive windows cut into other
    batches (a batch that closes a bin may hold the next windows too), and the process killed at a batch
    boundary and resumed from its snapshot and journal: every job value is bit for bit the same."""
    rng = random.Random(seed)
    shuffled = []
    for points in WINDOW_POINTS:
        points = list(points)
        rng.shuffle(points)  # one point per GPU and window: a series' own points stay in time order
        shuffled.append(points)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, WINDOWS - 1), max_size=40))) | {restart_at})
    batches = [sum(shuffled[a:b], []) for a, b in zip([0, *cuts], [*cuts, WINDOWS])]
    restart_batch = cuts.index(restart_at) + 1
    storage = tmp_path_factory.mktemp("state")
    first = processor(storage)
    if data.draw(st.booleans()):
        first._checkpoint()  # the state a restart reads: a snapshot alone, or a snapshot and a journal
    before = run(first, batches[:restart_batch])
    first.state.close()  # killed: no flush, no checkpoint
    after = run(processor(storage), batches[restart_batch:])
    assert job_values(before + after) == UNINTERRUPTED


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), max_size=40), st.randoms(use_true_random=False))
def test_an_exact_sum_is_the_same_in_any_order_and_the_nearest_float(values, rng):
    shuffled = list(values)
    rng.shuffle(shuffled)
    assert exact_sum(shuffled).hex() == exact_sum(values).hex()
    # Terms of at least 2^-12 are held exactly: the sum read back is the correctly rounded one.
    held = [v for v in values if abs(v) >= 2**-12 or v == 0]
    assert exact_sum(held) == math.fsum(held)


def test_an_infinite_or_nan_term_reads_back_without_a_crash():
    assert to_float(exact(math.inf) + exact(1.0)) == math.inf
    assert to_float(exact(-math.inf)) == -math.inf
    assert to_float(exact(math.nan) + exact(2.5)) == 2.5
    assert to_float(exact(1e300) + exact(1e300)) == 2e300


@given(st.lists(st.tuples(st.sampled_from([(0.0, 10.0), (0.0, 7.5), (2.5, 10.0)]),
                          st.floats(0, 1.5), st.sampled_from([1.0, 0.5, 1 / 3])), min_size=1, max_size=30),
       st.randoms(use_true_random=False))
def test_aggregates_are_the_same_in_any_order(windows, rng):
    """Segments (GPUs of one scrape merge), life totals, loss accounts and histograms."""
    def build(order):
        series, totals, loss, histogram = TimeWeightedSeries(3600), JobTotals(), LossTotals(), WeightedHistogram()
        for (start, end), ofu, weight in order:
            series.add(start, end, ofu, weight)
            totals.add((end - start) * weight, ofu, 1e15 * ofu)
            loss.add_parts((("engine_idle", 0.3 * (1 - ofu)), ("clock", 0.7 * (1 - ofu))), ofu,
                           (end - start) * weight, {"clock": "sw_power_cap"})
            histogram.add(ofu, (end - start) * weight)
        return (series.integral(1.0, 9.0), series.mean(0.0, 10.0), totals.ofu_mean, totals.flop,
                totals.wasted_gpu_seconds, loss.shares(), loss.gpu_hours(), histogram.quantile(0.5))

    shuffled = list(windows)
    rng.shuffle(shuffled)
    assert repr(build(shuffled)) == repr(build(windows))
