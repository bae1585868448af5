"""What a job's GPU time cost (otel_ofu.jobs.cost, issue 34 item 1): prices, job.cost and fleet.cost by loss part."""

from __future__ import annotations

import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ofu.core.loss import CLOCK, UNALLOCATED, USEFUL
from otel_ofu.core.model import Batch, GpuSample, MetricPoint, attrs
from otel_ofu.jobs.book import JobBook
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.jobs.cost import CostConfig, Pricer
from otel_ofu.jobs.facts import gpu_facts
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.processors.jobs import JobsProcessor
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from tests.test_jobs_loss import _BOOSTED, _BOOSTED_WITHOUT_ACCOUNT, _LIGHT_BOOST, _THROTTLED, _WINDOW

H100, B200, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA B200", "NVIDIA A100-SXM4-80GB"
PRICES = {"*H100*": 2.99, "b200": 5.49}  # per GPU-hour; the A100 has none (and there is no default)
T0 = 1_800_000_000
STEP = 10  # seconds per window


def _run(steps: list[list[tuple]], cost: dict | None = None, idle_b200: bool = True):
    """Each step: one window per GPU of job "train" (GPU 0 an H100, GPU 1 a B200, GPU 2 an A100 with no price),
    and a B200 with no job (unallocated), through the real ofu and jobs processors. Returns the jobs processor,
    every point it emitted and each job GPU window's (OFU, price per hour, seconds: since that GPU's last OFU, a
    window whose OFU was dropped joins the next, as the jobs processor counts it)."""
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    config = build_config(JobsConfig, {"resolution": "10s", "cost": {"per_gpu_hour": PRICES} if cost is None else cost})
    jobs = JobsProcessor(config, Context("jobs"), clock=lambda: T0)
    emitted: list[MetricPoint] = []
    windows: list[tuple[float, float | None, float]] = []
    last: dict[int, int] = {}
    models = (H100, B200, A100)
    prices = (PRICES["*H100*"], PRICES["b200"], None)
    for k, step in enumerate(steps):
        t = (T0 + STEP * (k + 1)) * 10**9
        points: list[MetricPoint] = []
        for gpu, (tpa, clock, gr, sm, dram, reasons, with_loss) in enumerate(step):
            sample = GpuSample(t, STEP, "node-0", gpu, f"GPU-{gpu}", models[gpu % 3], tpa, clock,
                               clock_event_reasons=reasons, sm_active=sm, gr_active=gr, dram_active=dram,
                               job_id="train", precision="bf16")
            made = ofu.process(Batch(samples=[sample])).points
            for p in made:
                if p.name == "gpu.ofu":
                    windows.append((p.value, prices[gpu % 3], STEP * (k + 1 - last.get(gpu, k))))
                    last[gpu] = k + 1
            points += made if with_loss else [p for p in made if p.name != "gpu.ofu.loss"]
        if idle_b200:
            idle = GpuSample(t, STEP, "node-0", 9, "GPU-9", B200, 0.0, 1000.0, sm_active=0.0, gr_active=0.0)
            points += ofu.process(Batch(samples=[idle])).points
        emitted += jobs.process(Batch(points=points)).points
    return jobs, emitted, windows


def _series(emitted: list[MetricPoint]) -> dict[tuple, list[float]]:
    series: dict[tuple, list[float]] = {}
    for p in emitted:
        if p.monotonic:
            series.setdefault((p.name, p.resource, p.attributes), []).append(p.value)
    return series


def _last(series: dict[tuple, list[float]], name: str) -> dict[str | None, float]:
    return {dict(a).get("ofu.loss.part"): v[-1] for (n, _, a), v in series.items() if n == name}


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.lists(_WINDOW, min_size=3, max_size=3), min_size=1, max_size=16),
       special_at=st.integers(0, 16),
       special=st.sampled_from([_BOOSTED, _BOOSTED_WITHOUT_ACCOUNT, _LIGHT_BOOST]))
def test_cost_parts_add_up_to_gpu_hours_times_price_over_any_windows(steps, special_at, special):
    """A job on an H100 and a B200 of different prices (and an A100 with none): job.cost's parts (each loss part
    and `useful`), less job.cost.gained, are the job's GPU-hours x each GPU's price, window by window, over any
    windows (blank GR/SM/DRAM, any clock cause, windows without their loss points) including some whose SM clock
    boosted above f_ref (OFU above 1: the clock part a gain, counted in job.cost.gained as job.ofu.gain.gpu_hours
    counts it). Every cost counter only grows. The A100's time has no cost, not a cost of 0. fleet.cost holds the
    B200 with no job as `unallocated`, at its price."""
    steps = [*steps[:special_at], [special, _THROTTLED, special], *steps[special_at:]]
    jobs, emitted, windows = _run(steps)
    series = _series(emitted)
    for (name, _, attributes), values in series.items():
        assert all(b >= a for a, b in zip(values, values[1:])), (name, attributes, values)
    for p in emitted:
        if p.name.endswith((".cost", ".cost.gained")):
            assert dict(p.attributes)["ofu.cost.currency"] == "USD" and p.unit == "{currency}"
    (summary,) = [s for s in jobs.book.close_all().ended]
    cost, gained = _last(series, "job.cost"), _last(series, "job.cost.gained")
    priced = [(o, p, seconds) for o, p, seconds in windows if p is not None]
    money = math.fsum(seconds * p for _, p, seconds in priced) / 3600
    assert cost[USEFUL] == pytest.approx(math.fsum(o * seconds * p for o, p, seconds in priced) / 3600, rel=1e-9)
    assert set(gained) == {CLOCK} and gained[CLOCK] > 0
    assert math.fsum(cost.values()) - math.fsum(gained.values()) == pytest.approx(money, rel=1e-9)
    # the summary's account (what the report reads) holds the same windows, the bins not closed yet too
    assert summary.cost is not None and summary.cost.seconds / 3600 == pytest.approx(money, rel=1e-9)
    assert summary.totals.gpu_hours == pytest.approx(math.fsum(w[2] for w in windows) / 3600, rel=1e-12)
    unpriced = math.fsum(seconds for _, p, seconds in windows if p is None)  # the A100's: GPU time, no cost
    assert jobs.book.unpriced == ({A100: pytest.approx(unpriced * 2**64, rel=1e-12)} if unpriced else {})
    if len(steps) > 1:  # the fleet's account goes out once per bin from the second on
        fleet, fleet_gained = _last(series, "fleet.cost"), _last(series, "fleet.cost.gained")
        idle = len(steps) * STEP * PRICES["b200"] / 3600
        assert fleet[UNALLOCATED] == pytest.approx(idle, rel=1e-9)
        assert math.fsum(fleet.values()) - math.fsum(fleet_gained.values()) == pytest.approx(money + idle, rel=1e-9)


def test_one_price_makes_each_part_its_gpu_hours_times_the_price():
    """With one price, job.cost of each part is job.ofu.loss.gpu_hours of that part x the price."""
    steps = [[_THROTTLED, (0.4, 1600.0, 0.8, 0.6, 0.3, 0x4, True), _LIGHT_BOOST]] * 12
    _, emitted, _ = _run(steps, {"per_gpu_hour": {"*": 4.0}})
    series = _series(emitted)
    cost, hours = _last(series, "job.cost"), _last(series, "job.ofu.loss.gpu_hours")
    assert set(cost) == set(hours) | {USEFUL}
    for part, value in hours.items():
        assert cost[part] == pytest.approx(4.0 * value, rel=1e-9), part
    assert _last(series, "job.cost.gained")[CLOCK] == pytest.approx(
        4.0 * _last(series, "job.ofu.gain.gpu_hours")[CLOCK], rel=1e-9)


def test_a_gpu_without_a_price_is_said_once(caplog):
    """The A100 has no price: one warning naming it, however many windows it sends."""
    with caplog.at_level("WARNING"):
        _run([[_THROTTLED, _THROTTLED, _THROTTLED]] * 5)
    said = [r.getMessage() for r in caplog.records if "have no price" in r.getMessage()]
    assert len(said) == 1 and f"model {A100!r}" in said[0] and "cost.default" in said[0]


def test_without_a_price_there_is_no_cost_metric_at_all():
    """No cost settings, or none for these GPUs: no job.cost or fleet.cost point, never a cost of 0."""
    steps = [[_THROTTLED, _THROTTLED, _THROTTLED]] * 5
    for cost in ({}, {"per_gpu_hour": {"*V100*": 1.0}}):
        _, emitted, _ = _run(steps, cost)
        assert not [p for p in emitted if ".cost" in p.name], cost
        assert [p for p in emitted if p.name == "job.ofu.loss.gpu_hours"]


def test_a_shared_gpu_costs_once_split_by_the_jobs_shares():
    """A GPU two jobs share (gpu.job.share 0.7 and 0.3, docs/sharing.md): each job pays its share of the GPU's
    price, and together the device's price, once."""
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    config = build_config(JobsConfig, {"resolution": "10s", "cost": {"per_gpu_hour": {"h100_sxm": 3.6}}})
    jobs = JobsProcessor(config, Context("jobs"), clock=lambda: T0)
    for k in range(36):
        t = (T0 + STEP * (k + 1)) * 10**9
        samples = [GpuSample(t, STEP, "node-0", 0, "GPU-0", H100, 0.5, 1755.0, sm_active=0.8, gr_active=0.9,
                             job_id=job, precision="bf16", share=share, share_basis="use")
                   for job, share in (("a", 0.7), ("b", 0.3))]
        jobs.process(ofu.process(Batch(samples=samples)))
    summaries = {s.job_id: s for s in jobs.book.close_all().ended}
    assert summaries["a"].cost.seconds / 3600 == pytest.approx(0.7 * 0.36, rel=1e-9)
    assert summaries["b"].cost.seconds / 3600 == pytest.approx(0.3 * 0.36, rel=1e-9)
    assert jobs.book.fleet_cost.seconds / 3600 == pytest.approx(0.36, rel=1e-9)


def test_a_mig_instance_costs_its_part_of_the_gpu():
    """A 3g.40gb instance of an H100 is 3/7 of the GPU: 3/7 of its price per hour."""
    pricer = Pricer(CostConfig(per_gpu_hour={"*H100*": 7.0}))
    book = JobBook(build_config(JobsConfig, {"cost": {"per_gpu_hour": {"*H100*": 7.0}}}))
    point = MetricPoint("gpu.ofu", 0.5, T0 * 10**9, attrs({"host.name": "n", "hw.id": "GPU-0", "hw.model": H100,
                                                          "gpu.mig.instance_id": "1", "gpu.mig.profile": "3g.40gb"}))
    assert book._price(gpu_facts(point), 10.0) == pytest.approx(3.0)
    assert pricer.price(H100) == 7.0


def test_prices_by_the_first_matching_key_a_pattern_the_table_key_or_the_default():
    pricer = Pricer(CostConfig(per_gpu_hour={"NVIDIA H100 80GB HBM3": 3.0, "*H100*": 2.5, "b200": 5.0,
                                             "*": 1.0}))
    assert pricer.price("NVIDIA H100 80GB HBM3") == 3.0  # exact, and first
    assert pricer.price("NVIDIA H100 PCIe") == 2.5  # the pattern (the exact key is another model)
    assert pricer.price("nvidia b200") == 5.0  # the spec table's key, case-insensitively
    assert pricer.price("NVIDIA A100-SXM4-80GB") == 1.0
    by_type = Pricer(CostConfig(per_gpu_hour={"p5.*": 3.9, "a3-highgpu-8g": 3.7}, default=2.0, by="host.type"))
    assert by_type.key({"host.type": "p5.48xlarge", "hw.model": H100}) == "p5.48xlarge"
    assert by_type.price("p5.48xlarge") == 3.9 and by_type.price("A3-HIGHGPU-8G") == 3.7
    assert by_type.price(by_type.key({"hw.model": H100})) == 2.0  # no host.type: the default
    assert Pricer(CostConfig(per_gpu_hour={"p5.*": 3.9}, by="host.type")).price("") is None
    assert pickle.loads(pickle.dumps(by_type)).price("p5.4xlarge") == 3.9  # a saved book's pricer


@pytest.mark.parametrize(("cost", "key"), [
    ({"per_gpu_hour": {"*H100*": 0}}, "cost.per_gpu_hour.*H100*"),
    ({"per_gpu_hour": {"*H100*": -2.5}}, "cost.per_gpu_hour.*H100*"),
    ({"per_gpu_hour": {"*H100*": "two"}}, "cost.per_gpu_hour.*H100*"),
    ({"default": 0}, "cost.default"),
    ({"currency": "US dollars"}, "cost.currency"),
    ({"by": " "}, "cost.by"),
    ({"per_gpu_hours": {"*": 1}}, "cost.per_gpu_hours"),
])
def test_a_bad_cost_setting_is_refused_naming_its_key(cost, key):
    with pytest.raises(FieldError) as raised:
        build_config(JobsConfig, {"cost": cost})
    assert key in str(raised.value)


def test_a_saved_job_keeps_its_cost_and_goes_on_at_the_prices_in_force(tmp_path):
    """With storage, a restarted processor resumes each job's cost account; a price changed in between counts
    from then on (the prices are not part of what a saved state must match, so the jobs are not set aside)."""
    def processor(price: float) -> JobsProcessor:
        config = build_config(JobsConfig, {"resolution": "10s", "storage": str(tmp_path),
                                           "cost": {"per_gpu_hour": {"*": price}}})
        jobs = JobsProcessor(config, Context("jobs"), clock=lambda: T0)
        jobs.start()
        return jobs

    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))

    def feed(jobs: JobsProcessor, steps: range) -> None:
        for k in steps:
            sample = GpuSample((T0 + STEP * (k + 1)) * 10**9, STEP, "node-0", 0, "GPU-0", H100, 0.5, 1755.0,
                               sm_active=0.8, gr_active=0.9, job_id="train", precision="bf16")
            jobs.process(ofu.process(Batch(samples=[sample])))
            jobs.exported()

    first = processor(3.6)
    feed(first, range(36))  # 0.1 GPU h at 3.6 an hour
    first.flush()
    first.shutdown()
    second = processor(7.2)
    assert second.book.pricer.config.per_gpu_hour == {"*": 7.2}
    feed(second, range(36, 72))  # 0.1 GPU h more at 7.2
    (summary,) = second.book.close_all().ended
    assert summary.cost is not None and summary.cost.seconds / 3600 == pytest.approx(0.36 + 0.72, rel=1e-9)
