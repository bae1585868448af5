"""A job's loss account over time (otel_ofu.jobs.loss): windows paired, bins exact, what grew."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ofu.core.loss import CLOCK, ENGINE_IDLE, NON_TENSOR, UNACCOUNTED, USEFUL, LossTotals
from otel_ofu.core.model import MetricPoint, attrs
from otel_ofu.jobs import loss as jobs_loss
from otel_ofu.jobs.loss import LossBins, add_window, grown_part, growth_text, window_parts

GPU = attrs({"host.name": "n0", "hw.id": "GPU-1", "ofu.job.id": "j"})
OTHER = attrs({"host.name": "n0", "hw.id": "GPU-2", "ofu.job.id": "j"})


def loss_point(part, value, t, resource=GPU, cause=None):
    return MetricPoint("gpu.ofu.loss", value, t, resource,
                       attrs({"ofu.loss.part": part, **({"ofu.loss.cause": cause} if cause else {})}))


def test_a_windows_parts_are_found_by_its_gpu_and_time():
    points = [MetricPoint("gpu.ofu", 0.4, 10, GPU), loss_point(ENGINE_IDLE, 0.1, 10), loss_point(CLOCK, 0.05, 10,
              cause="sw_power_cap"), loss_point(ENGINE_IDLE, 0.3, 10, OTHER), loss_point(ENGINE_IDLE, 0.2, 20),
              loss_point(ENGINE_IDLE, math.nan, 30), MetricPoint("gpu.ofu.loss", 0.1, 10, GPU)]  # no part: not one
    found = window_parts(points)
    assert found[(GPU, 10)] == (((ENGINE_IDLE, 0.1), (CLOCK, 0.05)), {CLOCK: "sw_power_cap"})
    assert found[(OTHER, 10)] == (((ENGINE_IDLE, 0.3),), {})
    assert (GPU, 20) in found and (GPU, 30) not in found


def test_a_window_without_its_account_is_unaccounted_never_zero():
    totals = LossTotals()
    add_window(totals, None, 0.4, 10.0)
    add_window(totals, (((ENGINE_IDLE, 0.6),), {}), 0.4, 30.0)
    shares = totals.shares()
    assert shares[UNACCOUNTED] == pytest.approx(0.6 * 10 / 40)
    assert shares[ENGINE_IDLE] == pytest.approx(0.6 * 30 / 40)
    assert shares[USEFUL] == pytest.approx(0.4)


@settings(max_examples=300, deadline=None)
@given(windows=st.lists(st.tuples(st.floats(0, 600), st.floats(0.5, 90), st.floats(0, 1), st.floats(0, 1)),
                        min_size=1, max_size=30))
def test_bins_split_windows_exactly(windows):
    """Over whole bins the account is the windows' own, weighted by their overlap; all bins: all of it."""
    bins = LossBins(60.0, 3600.0)
    everything = LossTotals()
    first_half = LossTotals()
    for start, length, idle, ofu in windows:
        ofu = min(ofu, 1 - idle)
        parts = (((ENGINE_IDLE, idle), (NON_TENSOR, 1 - idle - ofu)), {})
        bins.add(start, start + length, parts, ofu)
        add_window(everything, parts, ofu, length)
        overlap = min(start + length, 300.0) - start
        if overlap > 0:
            add_window(first_half, parts, ofu, overlap)
    whole = bins.between(-1e9, 1e9)
    assert whole.seconds == pytest.approx(everything.seconds)
    assert whole.shares() == pytest.approx(everything.shares())
    part = bins.between(0.0, 300.0)
    assert part.seconds == pytest.approx(first_half.seconds)
    for name, share in first_half.shares().items():
        assert part.shares()[name] == pytest.approx(share, abs=1e-9)
    assert math.fsum(whole.shares().values()) == pytest.approx(1.0)


def test_bins_are_kept_for_the_retention_only():
    bins = LossBins(60.0, 600.0)
    for k in range(100):
        bins.add(k * 60.0, k * 60.0 + 10, None, 0.5)
    assert len(bins.bins) <= 600 / 60 + 3 and min(bins.bins) > 80


def test_what_grew_and_how_it_is_said():
    before, during = LossTotals(), LossTotals()
    before.add_parts(((ENGINE_IDLE, 0.06), (NON_TENSOR, 0.40)), 0.48, 600)
    during.add_parts(((ENGINE_IDLE, 0.58), (NON_TENSOR, 0.20)), 0.19, 300)
    part, old, new = grown_part(before, during)
    assert (part, old, new) == (ENGINE_IDLE, pytest.approx(0.06), pytest.approx(0.58))
    text = growth_text({"grew": part, "grew_from": old, "grew_to": new})
    assert text == "engine idle grew from 6% to 58%: the input pipeline or the host, not the kernels"
    thermal = growth_text({"grew": CLOCK, "grew_from": 0.01, "grew_to": 0.3, "grew_cause": "hw_thermal"})
    assert thermal.startswith("clock grew from 1% to 30% (hw_thermal): hardware thermal slowdown")
    assert grown_part(during, during) is None  # nothing grew
    assert growth_text({}) == ""


def test_part_attributes_are_read_once_per_tuple():
    points = [loss_point(ENGINE_IDLE, 0.1, t) for t in range(3)]
    window_parts(points)
    cached = jobs_loss._PART_OF.get(id(points[0].attributes))
    assert cached is not None and cached[0] is points[0].attributes


_RATIO_OR_BLANK = st.one_of(st.none(), st.floats(0, 1))
# One GPU window: TPA, SM clock (MHz; the H100's f_ref is 1830), GR, SM, DRAM, clock event reasons, whether its
# gpu.ofu.loss points come (an agent without them: the part "unknown").
_WINDOW = st.tuples(st.floats(0, 1), st.floats(900, 1980), _RATIO_OR_BLANK, _RATIO_OR_BLANK, _RATIO_OR_BLANK,
                    st.sampled_from([None, 0x0, 0x4, 0x40]), st.booleans())
# The SM clock boosting to its maximum (1980 MHz) above the H100's f_ref (1830 MHz), tensor pipes nearly always
# busy: OFU above 1, a negative clock part; and the same without its loss points.
_BOOSTED = (0.99, 1980.0, 1.0, 1.0, 0.2, 0x0, True)
_BOOSTED_WITHOUT_ACCOUNT = (0.99, 1980.0, 1.0, 1.0, 0.2, 0x0, False)
# A lightly loaded, memory-bound job on a GPU boosting at 1980 MHz: every window gains on the clock.
_LIGHT_BOOST = (0.3, 1980.0, 0.7, 0.5, 0.7, 0x0, True)
# Thermal throttling: every window loses on the clock.
_THROTTLED = (0.8, 1200.0, 0.95, 0.9, 0.2, 0x40, True)

_CUMULATIVE_JOB_METRICS = {"job.gpu_seconds", "job.flops", "job.wasted_gpu_hours", "job.ofu.loss.gpu_hours",
                           "job.ofu.gain.gpu_hours", "fleet.gpu_hours", "fleet.gpu_hours.gained"}


def _run_jobs(gpu_windows: list[list[tuple]], t0: int = 1_800_000_000):
    """Each step's windows (one per GPU, all of job "train", 10 s each) through the real ofu and jobs processors.

    Returns every point the jobs processor emitted, in order, and each GPU window's OFU.
    """
    from otel_ofu.core.model import Batch, GpuSample
    from otel_ofu.jobs.config import JobsConfig
    from otel_ofu.pipeline.component import Context
    from otel_ofu.pipeline.config import build_config
    from otel_ofu.processors.jobs import JobsProcessor
    from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig

    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    # One bin per step: each step's snapshot holds every window so far.
    jobs = JobsProcessor(build_config(JobsConfig, {"resolution": "10s"}), Context("jobs"), clock=lambda: t0)
    emitted: list[MetricPoint] = []
    ofus: list[float] = []
    for k, windows in enumerate(gpu_windows):
        points = []
        for gpu, (tpa, clock, gr, sm, dram, reasons, with_loss) in enumerate(windows):
            sample = GpuSample((t0 + 10 * (k + 1)) * 10**9, 10.0, "node-0", gpu, f"GPU-{gpu}",
                               "NVIDIA H100 80GB HBM3", tpa, clock, clock_event_reasons=reasons, sm_active=sm,
                               gr_active=gr, dram_active=dram, job_id="train", precision="bf16")
            made = ofu.process(Batch(samples=[sample])).points
            ofus += [p.value for p in made if p.name == "gpu.ofu"]
            # an agent that sends no gpu.ofu.loss: the part "unknown"
            points += made if with_loss else [p for p in made if p.name != "gpu.ofu.loss"]
        emitted += jobs.process(Batch(points=points)).points
    return emitted, ofus


@settings(max_examples=120, deadline=None)
@given(steps=st.lists(st.lists(_WINDOW, min_size=2, max_size=2), min_size=1, max_size=30),
       special_at=st.integers(0, 30),
       special=st.sampled_from([_BOOSTED, _BOOSTED_WITHOUT_ACCOUNT, _LIGHT_BOOST]))
def test_every_cumulative_job_counter_only_grows_and_the_gpu_time_adds_up_also_above_ofu_1(steps, special_at,
                                                                                          special):
    """Issue 31 item 6: every cumulative counter the jobs processor emits (job.wasted_gpu_hours,
    job.ofu.loss.gpu_hours, job.ofu.gain.gpu_hours, fleet.gpu_hours, ...) is non-decreasing from one emission to
    the next, over any windows (blank GR/SM/DRAM, any clock cause, windows without their loss points) including
    some whose SM clock boosted above f_ref (OFU above 1, a negative clock part). And the convention adds up:
    the loss parts' GPU-hours are the wasted GPU-hours, and GPU time = useful (OFU x time) + wasted - gained.
    Before: a boosted window's negative clock part and waste were added to the counters, which fell: a counter
    reset to Prometheus, whose increase() then counts the whole value again."""
    steps = [*steps[:special_at], [special, _THROTTLED], *steps[special_at:]]
    emitted, ofus = _run_jobs(steps)
    assert len(ofus) == 2 * len(steps)
    series: dict[tuple, list[float]] = {}
    for p in emitted:
        if p.monotonic:
            series.setdefault((p.name, p.resource, p.attributes), []).append(p.value)
    assert {name for name, _, _ in series} >= _CUMULATIVE_JOB_METRICS - {"fleet.gpu_hours", "fleet.gpu_hours.gained"}
    for (name, _, attributes), values in series.items():
        assert all(b >= a for a, b in zip(values, values[1:])), (name, attributes, values)

    def last(name: str) -> dict[str | None, float]:
        return {dict(a).get("ofu.loss.part"): v[-1] for (n, _, a), v in series.items() if n == name}

    gpu_hours = last("job.gpu_seconds")[None] / 3600
    assert gpu_hours == pytest.approx(len(ofus) * 10 / 3600, rel=1e-12)
    wasted, lost, gained = last("job.wasted_gpu_hours")[None], last("job.ofu.loss.gpu_hours"), \
        last("job.ofu.gain.gpu_hours")
    assert set(gained) == {CLOCK} and gained[CLOCK] > 0
    assert math.fsum(lost.values()) == pytest.approx(wasted, rel=1e-9, abs=1e-9 * gpu_hours)
    useful = math.fsum(o * 10 for o in ofus) / 3600
    assert useful + wasted - math.fsum(gained.values()) == pytest.approx(gpu_hours, rel=1e-9)
    if len(steps) > 1:  # the fleet's account goes out once per bin from the second on: every GPU-hour, less the gain
        fleet, fleet_gained = last("fleet.gpu_hours"), last("fleet.gpu_hours.gained")
        assert fleet[USEFUL] == pytest.approx(useful, rel=1e-9)
        assert math.fsum(fleet.values()) - math.fsum(fleet_gained.values()) == pytest.approx(gpu_hours, rel=1e-9)


def test_a_jobs_end_says_what_its_clock_boost_gained():
    """The job end event of a job whose SM clock boosted above f_ref names the gain as one."""
    from otel_ofu.core.model import Batch, GpuSample
    from otel_ofu.jobs.config import JobsConfig
    from otel_ofu.pipeline.component import Context
    from otel_ofu.pipeline.config import build_config
    from otel_ofu.processors.jobs import JobsProcessor
    from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig

    t0 = 1_800_000_000
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    jobs = JobsProcessor(build_config(JobsConfig, {}), Context("jobs"), clock=lambda: t0)
    for k in range(360):  # an hour at the maximum clock, 1980 MHz against the H100's 1830 MHz f_ref
        sample = GpuSample((t0 + 10 * (k + 1)) * 10**9, 10.0, "node-0", 0, "GPU-0", "NVIDIA H100 80GB HBM3", 0.8,
                           1980.0, clock_event_reasons=0, sm_active=0.9, gr_active=0.95, job_id="train",
                           precision="bf16")
        jobs.process(ofu.process(Batch(samples=[sample])))
    (end,) = [e for e in jobs.flush().events if e.name == "ofu.job.end"]
    assert "(clock boost: +0.07 GPU h gained)" in end.body  # 0.8 x (1980 / 1830 - 1) of a GPU hour
    assert "-0.0" not in end.body
