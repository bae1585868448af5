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
