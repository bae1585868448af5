"""The simulated fleet's semantics: what each scenario does, deterministically."""

import statistics
from types import SimpleNamespace

import pytest

from otel_ofu.core.values import DCGM_FP64_BLANK
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.receivers import sim as sim_receiver
from otel_ofu.receivers.sim import SimReceiver, SimReceiverConfig, build_fleet, window_batch
from otel_ofu.sim import fleet as sim

START = 1_800_000_000.0


def fleet_of(jobs, models=("NVIDIA H100 80GB HBM3",), nodes=1, gpus=8, **extra):
    cfg = build_config(SimReceiverConfig, {"nodes": nodes, "gpus_per_node": gpus, "models": list(models),
                                           "jobs": jobs, **extra})
    return build_fleet(cfg, START)


def run(fleet, seconds):
    """Windows as lists of (sample, truth), for `seconds` of simulated time."""
    return [fleet.step_window() for _ in range(int(seconds / fleet.window_s))]


def by_job(windows, job_id):
    return [(s, t) for w in windows for s, t in w if s.job_id == job_id]


def test_same_seed_same_fleet_other_seed_other_noise():
    jobs = [{"scenario": "steady", "gpus": 2}]
    a = [s.tensor_active for w in run(fleet_of(jobs), 60) for s, _ in w]
    b = [s.tensor_active for w in run(fleet_of(jobs), 60) for s, _ in w]
    c = [s.tensor_active for w in run(fleet_of(jobs, seed=7), 60) for s, _ in w]
    assert a == b and a != c


def test_timestamps_are_simulated_window_ends():
    fleet = fleet_of([{"scenario": "steady", "gpus": 1}], collection_interval="10s")
    first, second = fleet.step_window(), fleet.step_window()
    assert first[0][0].time_unix_nano == int((START + 10) * 1e9)
    assert second[0][0].time_unix_nano == int((START + 20) * 1e9)
    assert first[0][0].window_s == pytest.approx(10)


def test_clock_samples_per_window_follow_the_sampling_rate():
    fleet = fleet_of([{"scenario": "steady", "gpus": 1}], collection_interval="30s", clock_sample_interval="1s")
    assert fleet.step_window()[0][0].sm_clock_samples == 30
    point = fleet_of([{"scenario": "steady", "gpus": 1}], collection_interval="30s", clock_sampling="point")
    assert point.step_window()[0][0].sm_clock_samples == 1


def test_steady_job_truth_near_its_mfu_and_tpa_is_a_ratio():
    windows = run(fleet_of([{"scenario": "steady", "gpus": 4, "mfu": 0.5}]), 600)
    rows = by_job(windows, "steady-0")
    assert statistics.mean(t.true_mfu for _, t in rows) == pytest.approx(0.5, abs=0.02)
    assert all(0 < s.tensor_active <= 1 for s, _ in rows)
    assert all(s.precision == "bf16" for s, _ in rows)


def test_idle_gpus_report_zero_activity_idle_clocks_and_no_job():
    windows = run(fleet_of([{"scenario": "steady", "gpus": 1}]), 60)
    idle = [s for w in windows for s, _ in w if s.gpu_index == 5]
    assert all(s.job_id == "none" and s.tensor_active == 0 for s in idle)
    assert all(s.clock_event_reasons & sim.REASON_IDLE for s in idle)
    assert all(s.sm_clock_mhz < 600 for s in idle)


def test_power_capped_gpu_sits_at_the_cap_with_the_reason_bit():
    windows = run(fleet_of([{"scenario": "power_capped", "gpus": 1, "power_cap_mhz": 1455}]), 300)
    rows = by_job(windows, "power_capped-0")[3:]
    assert statistics.mean(s.sm_clock_mhz for s, _ in rows) == pytest.approx(1455, abs=25)
    assert all(s.clock_event_reasons & sim.REASON_SW_POWER_CAP for s, _ in rows)
    # Throttled: the same activity does less useful work than at the loaded clock.
    steady = by_job(run(fleet_of([{"scenario": "steady", "gpus": 1}]), 300), "steady-0")[3:]
    assert statistics.mean(t.true_mfu for _, t in rows) < 0.9 * statistics.mean(t.true_mfu for _, t in steady)


def test_regression_drops_by_its_factor_then_recovers():
    jobs = [{"scenario": "regression", "gpus": 1, "regress_at": "10m", "recover_at": "20m", "regress_factor": 2.5}]
    windows = run(fleet_of(jobs), 1800)
    truth = [t.true_mfu for _, t in by_job(windows, "regression-0")]
    before, during, after = truth[30:59], truth[62:119], truth[125:]
    assert statistics.mean(before) / statistics.mean(during) == pytest.approx(2.5, rel=0.05)
    assert statistics.mean(after) == pytest.approx(statistics.mean(before), rel=0.03)


def test_moe_job_reports_inflated_mfu():
    windows = run(fleet_of([{"scenario": "moe_inflated", "gpus": 2}]), 300)
    rows = by_job(windows, "moe_inflated-0")
    ratio = statistics.mean(t.reported_mfu for _, t in rows) / statistics.mean(t.true_mfu for _, t in rows)
    assert ratio == pytest.approx(2.1, rel=0.01)


def test_steady_job_reports_honest_mfu_and_batch_carries_one_point_per_job():
    fleet = fleet_of([{"scenario": "steady", "gpus": 3}, {"scenario": "moe_inflated", "gpus": 2}])
    batch = window_batch(fleet.step_window(), emit_truth=True)
    reported = {dict(p.resource)["ofu.job.id"]: p.value for p in batch.points if p.name == "training.mfu"}
    truths = [p for p in batch.points if p.name == "sim.gpu.mfu.true"]
    assert set(reported) == {"steady-0", "moe_inflated-1"}
    assert len(truths) == 8 and len(batch.samples) == 8


def test_mixed_precision_switches_phases():
    jobs = [{"scenario": "mixed_precision", "gpus": 1,
             "phases": [{"precision": "nvfp4", "mfu": 0.3, "duration": "2m"},
                        {"precision": "fp8", "mfu": 0.4, "duration": "2m"},
                        {"precision": "bf16", "mfu": 0.5, "duration": "2m"}]}]
    windows = run(fleet_of(jobs, models=("NVIDIA B200",)), 720)
    precisions = [s.precision for s, _ in by_job(windows, "mixed_precision-0")]
    assert precisions[2:10] == ["fp4"] * 8 and precisions[14:22] == ["fp8"] * 8
    assert precisions[26:34] == ["bf16"] * 8 and precisions[38:46] == ["fp4"] * 8


def test_checkpoint_dips_are_short_and_periodic():
    jobs = [{"scenario": "checkpoint", "gpus": 1, "checkpoint_every": "5m", "checkpoint_length": "30s"}]
    truth = [t.true_mfu for _, t in by_job(run(fleet_of(jobs), 1200), "checkpoint-0")]
    dipped = [i for i, v in enumerate(truth) if v < 0.1]
    assert len(dipped) == pytest.approx(4 * 3, abs=3)  # 4 checkpoints of ~3 windows
    assert all(truth[i] > 0.35 for i in range(120) if i not in dipped and i - 1 not in dipped)


def test_a_profiler_blanks_tpa_on_the_jobs_first_gpu_only_for_its_span():
    jobs = [{"id": "p", "scenario": "steady", "gpus": 2, "start": "1m", "profiler_at": "2m", "profiler_length": "1m"}]
    windows = run(fleet_of(jobs), 360)
    first = [s.tensor_active for w in windows for s in (w[0][0],)]
    second = [s.tensor_active for w in windows for s in (w[1][0],)]
    blank = [i for i, v in enumerate(first) if v == DCGM_FP64_BLANK]
    assert blank == list(range(18, 24))  # windows ending in (3m, 4m]: job start 1m + 2m, for 1m
    assert DCGM_FP64_BLANK not in second and all(w[0][0].sm_clock_mhz for w in windows)


def test_job_start_and_duration():
    jobs = [{"scenario": "steady", "gpus": 1, "start": "1m", "duration": "2m"}]
    ids = [s.job_id for s, _ in by_job(run(fleet_of(jobs), 300), "steady-0")]
    all_ids = [w[0][0].job_id for w in run(fleet_of(jobs), 300)]
    assert all_ids[:5] == ["none"] * 5 and all_ids[6:17] == ["steady-0"] * 11 and all_ids[19:] == ["none"] * 11
    assert len(ids) == 12


def test_placement_errors_name_the_job():
    with pytest.raises(ValueError, match="'big' needs 9 GPUs"):
        sim.Fleet(nodes=1, gpus_per_node=8, models=["h100_sxm"], jobs=[sim.JobSpec("big", "steady", gpus=9)],
                  seed=1, window_s=10, clock_sample_s=1, start_unix_s=0)


def test_receiver_sleeps_until_the_next_window_is_due(monkeypatch):
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(sim_receiver, "time", SimpleNamespace(monotonic=lambda: clock.now, time=lambda: START))
    cfg = build_config(SimReceiverConfig, {"nodes": 1, "gpus_per_node": 2, "collection_interval": "10s",
                                           "time_acceleration": 2})
    got: list = []
    receiver = SimReceiver(cfg, Context("sim"), got.append)
    receiver.on_start()
    assert receiver.interval() == pytest.approx(5.0)  # a 10 s window at x2: due 5 s of wall time from now
    clock.now += 3.0
    receiver.poll()
    assert got == [] and receiver.interval() == pytest.approx(2.0)
    clock.now += 2.0
    receiver.poll()
    assert len(got) == 1 and receiver.interval() == pytest.approx(5.0)
    clock.now += 12.0  # fell behind (17 s = 34 simulated): catches up at once, then waits for 40
    receiver.poll()
    assert len(got) == 3 and receiver.interval() == pytest.approx(3.0)


@pytest.mark.parametrize(("jobs", "extra", "key"), [
    ([{"scenario": "steady", "profile": {"tensor": 0.5, "non_tensor": 0.4, "sm_idle": 0.2}}], {},
     "jobs[0].profile.tensor"),
    ([{"scenario": "steady", "non_tensor_dram": 1.5}], {}, "jobs[0].non_tensor_dram"),
    ([], {"throttled_nodes": [{"node": 5, "clock_mhz": 1100}]}, "throttled_nodes[0].node"),
    ([], {"throttled_nodes": [{"node": 0, "clock_mhz": 1100, "reason": "bad_luck"}]}, "throttled_nodes[0].reason"),
])
def test_loss_settings_are_checked(jobs, extra, key):
    from otel_ofu.pipeline.config import FieldError
    with pytest.raises(FieldError) as info:
        build_config(SimReceiverConfig, {"nodes": 1, "jobs": jobs, **extra})
    assert info.value.key == key


def test_a_throttled_node_reports_its_reason_and_holds_its_clock():
    fleet = fleet_of([{"scenario": "steady", "gpus": 1, "node": 1}, {"scenario": "steady", "gpus": 1, "node": 0}],
                     nodes=2, throttled_nodes=[{"node": 1, "clock_mhz": 1100, "reason": "hw_thermal"}])
    windows = run(fleet, 120)[2:]
    hot = [s for w in windows for s, _ in w if s.host.endswith("1") and s.job_id != "none"]
    cool = [s for w in windows for s, _ in w if s.host.endswith("0") and s.job_id != "none"]
    assert all(s.clock_event_reasons & 0x40 for s in hot) and not any(s.clock_event_reasons & 0x40 for s in cool)
    assert statistics.mean(s.sm_clock_mhz for s in hot) == pytest.approx(1100, abs=20)
    assert statistics.mean(s.sm_clock_mhz for s in cool) > 1700


def test_the_counters_nest_as_on_a_gpu():
    windows = run(fleet_of([{"scenario": "steady", "gpus": 2}, {"scenario": "input_bound", "gpus": 2}]), 300)
    for sample, truth in (x for w in windows for x in w):
        if sample.job_id == "none":
            assert sample.gr_active == sample.sm_active == sample.tensor_active == 0.0
            continue
        # reported within the sampling noise of GR >= SM >= TPA; the truth adds up with the true MFU
        assert sample.gr_active >= sample.sm_active - 0.01 >= sample.tensor_active - 0.02
        assert sum(truth.parts.values()) + truth.true_mfu == pytest.approx(1.0, abs=1e-12)


def test_the_energy_counter_moves_by_the_windows_power_times_its_length():
    """Issue 34: the sim's energy counter (DCGM 156, mJ) is its power integrated over the ticks, so each window's
    increase is its mean power x its length."""
    windows = run(fleet_of([{"scenario": "steady", "gpus": 2}]), 60)
    for before, after in zip(windows, windows[1:]):
        for (a, _), (b, _) in zip(before, after):
            assert b.energy_mj - a.energy_mj == pytest.approx(b.power_w * b.window_s * 1000, rel=1e-3, abs=2)


def test_the_clock_event_time_per_reason_agrees_with_the_bitmask():
    """A reason's ns counter (DCGM 1420-1424) moves only in windows whose bitmask has its bit, and by at most the
    window; a reason the counters do not time (idle) moves none."""
    fleet = fleet_of([{"scenario": "power_capped", "gpus": 1, "node": 0}, {"scenario": "steady", "gpus": 1, "node": 1}],
                     nodes=2, gpus=2, throttled_nodes=[{"node": 1, "clock_mhz": 1100, "reason": "hw_thermal"}])
    windows = run(fleet, 120)
    moved = {}
    for before, after in zip(windows, windows[1:]):
        for (a, _), (b, _) in zip(before, after):
            for bit, cause in sim.TIMED_REASONS:
                grew = b.clock_event_ns[cause] - a.clock_event_ns[cause]
                assert 0 <= grew <= b.window_s * 1e9
                assert (grew > 0) == bool(b.clock_event_reasons & bit), (cause, b.clock_event_reasons)
                moved[cause] = moved.get(cause, 0) + grew
    assert moved["sw_power_cap"] > 0 and moved["hw_thermal"] > 0 and moved["sync_boost"] == 0


def test_interconnect_traffic_by_scenario():
    """A multi-GPU training job talks over NVLink, an input-bound job reads over PCIe, an idle GPU moves nothing."""
    windows = run(fleet_of([{"scenario": "steady", "gpus": 2}, {"scenario": "input_bound", "gpus": 1},
                            {"scenario": "steady", "gpus": 1}]), 60)[1:]

    def mean(job, field):
        return statistics.mean(getattr(s, field) for s, _ in by_job(windows, job))

    assert mean("steady-0", "nvlink_tx_bytes_per_s") > 1e10 and mean("steady-0", "nvlink_rx_bytes_per_s") > 1e10
    assert mean("input_bound-1", "pcie_rx_bytes_per_s") > 10 * mean("steady-0", "pcie_rx_bytes_per_s")
    assert mean("input_bound-1", "nvlink_tx_bytes_per_s") == 0 and mean("steady-2", "nvlink_tx_bytes_per_s") == 0
    idle = [s for w in windows for s, _ in w if s.job_id == "none"]
    assert idle and all(s.pcie_tx_bytes_per_s == s.pcie_rx_bytes_per_s == s.nvlink_tx_bytes_per_s == 0 for s in idle)

