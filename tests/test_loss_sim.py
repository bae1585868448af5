"""The simulated fleet's losses come out of the loss account as they were built.

Each job below has one loss built into it (an input pipeline that starves the GPU, a node held
at a low clock by a thermal fault, GEMMs that fill tiles badly, memory-bound kernels). The
simulator knows the true account of every window (sim.WindowTruth.parts); the ofu processor
sees only the counters. Per job, GPU-time weighted: every part within 1.5 pp of the truth, the
largest part the one built in, with the cause built in.
"""

import math

import pytest

from otel_ofu.core import loss, tiles
from otel_ofu.core.loss import CLOCK, ENGINE_IDLE, NON_TENSOR, PADDING, LossTotals
from otel_ofu.core.model import Batch
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.sim import SimReceiverConfig, build_fleet
from otel_ofu.sim import fleet as sim

RAGGED_FACTOR = tiles.job_correction(sim.RAGGED_VOCAB_GEMMS, "blackwell", "bf16")
JOBS = [
    {"id": "input-bound", "scenario": "input_bound", "gpus": 2, "node": 0},
    {"id": "memory-bound", "scenario": "memory_bound", "gpus": 2, "node": 0},
    {"id": "steady", "scenario": "steady", "gpus": 2, "node": 0},
    {"id": "regression", "scenario": "regression", "gpus": 1, "node": 0, "regress_at": "5m", "recover_at": "15m"},
    {"id": "throttled", "scenario": "steady", "gpus": 2, "node": 1, "mfu": 0.75,
     "profile": {"tensor": 0.85, "non_tensor": 0.10, "sm_idle": 0.05}},
    {"id": "ragged-vocab", "scenario": "ragged_vocab", "gpus": 2, "node": 2},
]
BUILT = {"input-bound": (ENGINE_IDLE, None), "memory-bound": (NON_TENSOR, loss.MEMORY_BOUND),
         "throttled": (CLOCK, "hw_thermal"), "ragged-vocab": (PADDING, None)}


@pytest.fixture(scope="module")
def fleet_run():
    config = build_config(SimReceiverConfig, {
        "nodes": 3, "gpus_per_node": 8, "models": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "NVIDIA B200"],
        "jobs": JOBS, "throttled_nodes": [{"node": 1, "clock_mhz": 1100, "reason": "hw_thermal"}]})
    fleet = build_fleet(config, 1_800_000_000.0)
    ofu = OfuProcessor(build_config(OfuProcessorConfig, {"tile_correction": {"jobs": {"ragged-*": RAGGED_FACTOR}}}),
                       Context("ofu"))
    measured: dict[str, LossTotals] = {}
    truth: dict[str, LossTotals] = {}
    sums = []
    for _ in range(int(20 * 60 / fleet.window_s)):  # 20 minutes
        results = fleet.step_window()
        points = ofu.process(Batch(samples=[s for s, _ in results])).points
        by_gpu: dict = {}
        for p in points:
            if p.name in ("gpu.ofu", "gpu.ofu.loss"):
                by_gpu.setdefault(p.resource, []).append(p)
        for sample, window in results:
            job = sample.job_id
            mine = [p for p in by_gpu.get(next((r for r in by_gpu if dict(r)["hw.id"] == sample.uuid), None), [])]
            if not mine:
                continue
            ofu_value = next(p.value for p in mine if p.name == "gpu.ofu")
            parts = [(dict(p.attributes)["ofu.loss.part"], p.value) for p in mine if p.name == "gpu.ofu.loss"]
            causes = {dict(p.attributes)["ofu.loss.part"]: dict(p.attributes).get("ofu.loss.cause") for p in mine
                      if p.name == "gpu.ofu.loss"}
            sums.append(math.fsum(v for _, v in parts) + ofu_value)
            measured.setdefault(job, LossTotals()).add_parts(parts, ofu_value, sample.window_s,
                                                             {k: v for k, v in causes.items() if v})
            truth.setdefault(job, LossTotals()).add_parts(
                list(window.parts.items()), window.true_mfu, sample.window_s,
                {CLOCK: window.clock_cause, NON_TENSOR: loss.MEMORY_BOUND if window.memory_bound
                 else loss.NOT_MEMORY_BOUND})
    return measured, truth, sums


def test_every_window_adds_up_to_one(fleet_run):
    _, _, sums = fleet_run
    assert len(sums) > 1000
    assert max(abs(s - 1.0) for s in sums) < 1e-9


@pytest.mark.parametrize("job", [j["id"] for j in JOBS])
def test_each_part_comes_out_as_built(fleet_run, job):
    measured, truth, _ = fleet_run
    got, want = measured[job].shares(), truth[job].shares()
    assert set(got) == set(want)  # the sim reports GR, SM and DRAM: every step is its own part
    for part in want:
        assert got[part] == pytest.approx(want[part], abs=0.015), (job, part, got, want)


@pytest.mark.parametrize("job", list(BUILT))
def test_the_largest_loss_is_the_one_built_in(fleet_run, job):
    measured, truth, _ = fleet_run
    part, cause = BUILT[job]
    assert truth[job].largest_loss()[0] == part  # the construction does what it says
    assert measured[job].largest_loss()[0] == part
    if cause is not None:
        assert measured[job].dominant_cause(part) == cause


def test_a_regression_on_the_host_shows_as_engine_idle(fleet_run):
    measured, _, _ = fleet_run
    steady, regressed = measured["steady"].shares(), measured["regression"].shares()
    assert regressed[ENGINE_IDLE] > steady[ENGINE_IDLE] + 0.15  # half its life 2.5x slower: the GPU waits


def test_a_power_cap_is_told_apart_from_a_thermal_fault():
    config = build_config(SimReceiverConfig, {"nodes": 1, "gpus_per_node": 1, "jobs": [
        {"scenario": "power_capped", "gpus": 1, "power_cap_mhz": 1300}]})
    fleet = build_fleet(config, 1_800_000_000.0)
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    totals = LossTotals()
    for _ in range(30):
        (sample, _), = fleet.step_window()
        points = [p for p in ofu.process(Batch(samples=[sample])).points if p.name == "gpu.ofu.loss"]
        parts = [(dict(p.attributes)["ofu.loss.part"], p.value) for p in points]
        totals.add_parts(parts, 0.0, sample.window_s,
                         {dict(p.attributes)["ofu.loss.part"]: dict(p.attributes).get("ofu.loss.cause")
                          for p in points if dict(p.attributes).get("ofu.loss.cause")})
    assert totals.dominant_cause(CLOCK) == "sw_power_cap"
