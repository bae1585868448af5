"""The dcgm receiver against a fake DCGM: data, reconnects, lost GPUs, blanks, profiling states."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from otel_ofu.core.model import GPU_MIG_INSTANCE, Batch
from otel_ofu.gpu import dcgm_api
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import ConfigError, FieldError, build_config
from otel_ofu.pipeline.service import load_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.dcgm import FACTORY, DcgmReceiver, DcgmReceiverConfig
from tests.fakes.clock import FakeClock
from tests.fakes.dcgm import FE_GPU, FE_GPU_I, FakeDcgmEngine, FakeDcgmGpu, FakeMigInstance

ROOT = Path(__file__).resolve().parent.parent
H100_FREF = 1830.0


def us(seconds: float) -> int:
    return int(round(seconds * 1e6))


def push_window(engine: FakeDcgmEngine, end_s: float, gpu_id: int, tpa: object, clocks: list[float], *,
                entity: tuple[int, int] | None = None, counters: tuple[int, int] | None = None,
                max_clock: int = 1980, power: float = 650.0, reasons: int = 0) -> None:
    """What DCGM stores for one 10 s window: 1 Hz clock samples, then the window's profiling values."""
    gpu = (FE_GPU, gpu_id)
    for i, mhz in enumerate(clocks):
        engine.push(gpu, 100, us(end_s - len(clocks) + 1 + i), mhz)
    engine.push(gpu, 113, us(end_s), max_clock)
    engine.push(gpu, 155, us(end_s), power)
    engine.push(gpu, 112, us(end_s), reasons)
    engine.push(entity or gpu, 1004, us(end_s), tpa)
    engine.push(entity or gpu, 1002, us(end_s), 0.9)
    engine.push(entity or gpu, 1001, us(end_s), 0.95)
    engine.push(entity or gpu, 1005, us(end_s), 0.35)
    if counters is not None:
        engine.push(entity or gpu, 1084, us(end_s), counters[0])
        engine.push(entity or gpu, 1086, us(end_s), counters[1])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def engine() -> FakeDcgmEngine:
    return FakeDcgmEngine([FakeDcgmGpu(0), FakeDcgmGpu(1)])


def make(engine: FakeDcgmEngine, clock: FakeClock, **settings) -> DcgmReceiver:
    config = build_config(DcgmReceiverConfig, settings)
    return DcgmReceiver(config, Context("dcgm", Telemetry()), lambda batch: None, loader=engine.bindings,
                        clock=clock)


def ofu_points(batch: Batch) -> list:
    return OfuProcessor(OfuProcessorConfig(), Context("ofu")).process(batch).points


def named(points: list, name: str) -> list:
    return [p for p in points if p.name == name]


def states(batch: Batch) -> list[str]:
    return [dict(p.attributes)["state"] for p in named(batch.points, "otel_ofu.receiver.status")]


def prime(receiver: DcgmReceiver, clock: FakeClock) -> Batch:
    """Connect and do the first read (DCGM's first GetAllSinceLastCall returns only the latest values)."""
    batch = receiver.poll()
    clock.advance(10)
    return batch


def test_normal_windows_give_ofu_per_gpu(engine, clock):
    receiver = make(engine, clock)
    assert states(prime(receiver, clock)) == ["ok"]
    end = clock.wall_s
    push_window(engine, end, 0, 0.8, [1500.0] * 10)
    push_window(engine, end, 1, 0.4, [1200.0] * 10)

    batch = receiver.poll()

    assert sorted(s.gpu_index for s in batch.samples) == [0, 1]
    sample = next(s for s in batch.samples if s.gpu_index == 0)
    assert sample.window_s == pytest.approx(10.0)
    assert sample.sm_clock_samples == 10
    assert sample.time_unix_nano == us(end) * 1000
    assert sample.max_sm_clock_mhz == 1980 and sample.power_w == 650.0 and sample.source == "dcgm"
    assert sample.resource["gpu.pci_bus_id"] == "00000000:18:00.0"
    ofu = {dict(p.resource)["gpu.index"]: p.value for p in named(ofu_points(batch), "gpu.ofu.raw")}
    assert ofu == {"0": pytest.approx(0.8 * 1500 / H100_FREF), "1": pytest.approx(0.4 * 1200 / H100_FREF)}
    assert states(batch) == ["ok"]
    # field ids are watched by number, each group at its own rate
    watched = {ids: freq for ids, freq, _ in engine.watched.values()}
    assert watched[(100,)] == 1_000_000
    assert watched[(113, 112, 155, 156, 1420, 1421, 1422, 1423, 1424)] == 10_000_000
    assert watched[(1004, 1002, 1001, 1005, 1014, 1009, 1010, 1011, 1012, 1084, 1086)] == 10_000_000
    # the loss account's ratios come with each window
    assert (sample.gr_active, sample.sm_active, sample.dram_active) == (0.95, 0.9, 0.35)


def test_clock_is_the_mean_of_the_samples_inside_the_tpa_window(engine, clock):
    receiver = make(engine, clock)
    prime(receiver, clock)
    end = clock.wall_s
    engine.push((FE_GPU, 0), 100, us(end - 15), 600.0)  # before the window: must not count
    push_window(engine, end, 0, 0.5, [1400.0] * 5 + [1600.0] * 5)

    sample = next(s for s in receiver.poll().samples if s.gpu_index == 0)

    assert sample.sm_clock_mhz == pytest.approx(1500.0)
    assert sample.sm_clock_samples == 10


def test_exact_interval_tpa_from_cycle_counters_is_preferred(engine, clock):
    receiver = make(engine, clock)
    prime(receiver, clock)
    base = 2**62  # large raw counters: the difference must stay exact
    push_window(engine, clock.wall_s, 0, 0.55, [1500.0] * 10, counters=(base, base // 2))
    first = next(s for s in receiver.poll().samples if s.gpu_index == 0)
    assert first.tensor_active == 0.55  # no previous counters yet: DCGM's 1004 average
    clock.advance(10)
    push_window(engine, clock.wall_s, 0, 0.55, [1500.0] * 10,
                counters=(base + 2_000_000_000_000, base // 2 + 1_200_000_000_000))

    second = next(s for s in receiver.poll().samples if s.gpu_index == 0)

    assert second.tensor_active == pytest.approx(0.6, abs=1e-12)
    assert second.window_s == pytest.approx(10.0)


def test_without_counter_fields_the_receiver_uses_field_1004(engine, clock):
    engine.counters_known = False  # DCGM older than 4.6
    receiver = make(engine, clock)
    prime(receiver, clock)
    push_window(engine, clock.wall_s, 0, 0.7, [1500.0] * 10)
    sample = next(s for s in receiver.poll().samples if s.gpu_index == 0)
    assert sample.tensor_active == 0.7
    assert (1004, 1002, 1001, 1005, 1014, 1009, 1010, 1011, 1012) in {ids for ids, _, _ in engine.watched.values()}


def test_multi_pass_fields_are_dropped_until_the_watch_succeeds(engine, clock):
    engine.multi_pass_fields = {1014}
    receiver = make(engine, clock)
    prime(receiver, clock)
    assert (1004, 1002, 1001, 1005) in {ids for ids, _, _ in engine.watched.values()}
    push_window(engine, clock.wall_s, 0, 0.3, [1500.0] * 10)
    sample = next(s for s in receiver.poll().samples if s.gpu_index == 0)
    assert sample.tensor_active == 0.3 and sample.gr_active == 0.95


def test_when_the_loss_ratios_cannot_be_watched_together_tpa_and_sm_still_are(engine, clock):
    engine.multi_pass_fields = {1001}
    receiver = make(engine, clock)
    prime(receiver, clock)
    assert (1004, 1002) in {ids for ids, _, _ in engine.watched.values()}
    push_window(engine, clock.wall_s, 0, 0.3, [1500.0] * 10)
    sample = next(s for s in receiver.poll().samples if s.gpu_index == 0)
    assert sample.tensor_active == 0.3 and sample.sm_active == 0.9 and sample.gr_active is None


def test_host_engine_goes_away_and_comes_back(engine, clock, caplog):
    caplog.set_level(logging.INFO)
    receiver = make(engine, clock, address="gpu-node-7:5555", reconnect_initial_interval="2s")
    prime(receiver, clock)
    push_window(engine, clock.wall_s, 0, 0.8, [1500.0] * 10)
    push_window(engine, clock.wall_s, 1, 0.8, [1500.0] * 10)
    assert len(receiver.poll().samples) == 2
    assert engine.addresses == ["gpu-node-7:5555"]

    engine.stop()
    clock.advance(10)
    lost = receiver.poll()
    assert lost.samples == [] and states(lost) == ["hostengine_lost"]
    assert receiver.session is None
    # still down: retries follow the backoff (2 s, then 4 s), one log line per state
    for _ in range(8):
        clock.advance(1)
        assert receiver.poll().samples == []
    assert len(engine.addresses) - 1 == 2  # attempts at +2 s and +6 s
    assert receiver.status.state == "hostengine_unreachable"
    unreachable_logs = [r for r in caplog.records if "hostengine_unreachable" in r.getMessage()]
    assert len(unreachable_logs) == 1
    assert receiver.interval() <= 10  # wakes for the next attempt, not a whole window later

    engine.start()
    clock.advance(60)
    assert states(receiver.poll()) == ["ok"]
    clock.advance(10)
    push_window(engine, clock.wall_s, 0, 0.6, [1400.0] * 10)
    push_window(engine, clock.wall_s, 1, 0.6, [1400.0] * 10)
    resumed = receiver.poll()
    assert sorted(s.gpu_index for s in resumed.samples) == [0, 1]
    assert named(ofu_points(resumed), "gpu.ofu")


def test_a_gpu_that_stops_reporting_is_reported_and_the_others_carry_on(engine, clock):
    receiver = make(engine, clock)
    prime(receiver, clock)
    push_window(engine, clock.wall_s, 0, 0.8, [1500.0] * 10)
    push_window(engine, clock.wall_s, 1, 0.8, [1500.0] * 10)
    receiver.poll()
    for _ in range(4):  # GPU 1 falls off the bus: DCGM has nothing new for it
        clock.advance(10)
        push_window(engine, clock.wall_s, 0, 0.8, [1500.0] * 10)
        batch = receiver.poll()
        assert [s.gpu_index for s in batch.samples] == [0]

    status = named(batch.points, "otel_ofu.receiver.status")
    lost = [p for p in status if dict(p.attributes)["state"] == "gpu_no_data"]
    assert len(lost) == 1 and dict(lost[0].resource)["hw.id"] == engine.gpus[1].uuid
    assert receiver.status.state == "ok"


def test_paused_profiling_reports_blanks_as_dropped_never_as_zero(engine, clock):
    receiver = make(engine, clock)
    prime(receiver, clock)
    push_window(engine, clock.wall_s, 0, 0.8, [1500.0] * 10)
    push_window(engine, clock.wall_s, 1, 0.8, [1500.0] * 10)
    receiver.poll()
    engine.paused = True  # dcgmi profile --pause: DCGM stores blanks
    clock.advance(10)
    push_window(engine, clock.wall_s, 0, 0.8, [1500.0] * 10)
    push_window(engine, clock.wall_s, 1, 0.8, [1500.0] * 10)

    batch = receiver.poll()
    points = ofu_points(batch)

    assert states(batch)[0] == "profiling_paused"
    assert named(points, "gpu.ofu") == []
    dropped = named(points, "gpu.ofu.dropped")
    assert len(dropped) == 2 and {dict(p.attributes)["ofu.drop.reason"] for p in dropped} == {"blank"}
    assert named(points, "gpu.sm.clock.frequency")  # the clocks still flow

    engine.paused = False
    clock.advance(10)
    push_window(engine, clock.wall_s, 0, 0.8, [1500.0] * 10)
    push_window(engine, clock.wall_s, 1, 0.8, [1500.0] * 10)
    assert states(receiver.poll()) == ["ok"]


@pytest.mark.parametrize(("mode", "state", "reason", "hint"), [
    ("not_supported", "profiling_not_supported", "not_supported", "nvml receiver"),
    ("no_permission", "profiling_no_permission", "not_permissioned", "root"),
    ("in_use", "profiling_in_use", "blank", "Nsight"),
])
def test_profiling_unavailable_says_why(engine, clock, mode, state, reason, hint):
    engine.profiling = mode
    receiver = make(engine, clock)
    prime(receiver, clock)
    push_window(engine, clock.wall_s, 0, 0.8, [1500.0] * 10)

    batch = receiver.poll()
    points = ofu_points(batch)

    assert states(batch) == [state]
    assert hint in receiver.status.message
    assert named(points, "gpu.ofu") == []
    assert {dict(p.attributes)["ofu.drop.reason"] for p in named(points, "gpu.ofu.dropped")} == {reason}
    # the lock is released later: the receiver retries the watch with backoff and recovers
    engine.profiling = "ok"
    clock.advance(10)
    receiver.poll()
    clock.advance(10)
    push_window(engine, clock.wall_s, 0, 0.8, [1500.0] * 10)
    push_window(engine, clock.wall_s, 1, 0.8, [1500.0] * 10)
    assert named(ofu_points(receiver.poll()), "gpu.ofu")
    assert receiver.status.state == "ok"


def test_dcgm_missing_is_reported_and_the_receiver_keeps_running(tmp_path, clock):
    config = build_config(DcgmReceiverConfig, {"bindings_path": str(tmp_path)})
    receiver = DcgmReceiver(config, Context("dcgm", Telemetry()), lambda b: None, loader=dcgm_api.import_bindings,
                            clock=clock)
    for _ in range(3):
        batch = receiver.poll()
        clock.advance(120)
    assert batch.samples == []
    assert states(batch) == ["dcgm_missing"]
    assert str(tmp_path) in receiver.status.message
    assert "datacenter-gpu-manager-4" in receiver.status.message


def test_embedded_host_engine_refusing_names_the_cause(engine, clock):
    engine.refuse_code = "DCGM_ST_NVML_NOT_LOADED"
    receiver = make(engine, clock)
    assert states(receiver.poll()) == ["hostengine_refused"]
    assert "driver" in receiver.status.message
    assert engine.addresses == [None]  # embedded: no address


def test_mig_instances_are_their_own_samples(clock):
    engine = FakeDcgmEngine([FakeDcgmGpu(0, mig=[FakeMigInstance(7, 1, slices=3), FakeMigInstance(8, 2, slices=4)])])
    receiver = make(engine, clock)
    prime(receiver, clock)
    push_window(engine, clock.wall_s, 0, 0.5, [1500.0] * 10, entity=(FE_GPU_I, 7))
    engine.push((FE_GPU_I, 8), 1004, us(clock.wall_s), 0.25)

    samples = receiver.poll().samples

    by_instance = {s.resource[GPU_MIG_INSTANCE]: s for s in samples}
    assert set(by_instance) == {"1", "2"}
    assert by_instance["1"].tensor_active == 0.5 and by_instance["2"].tensor_active == 0.25
    assert by_instance["2"].sm_clock_mhz == pytest.approx(1500.0)  # the parent GPU's clock
    assert by_instance["1"].resource["gpu.mig.slices"] == "3"
    assert by_instance["1"].power_w is None  # board power is not an instance's
    entities = {ids[0]: groups for ids, _, groups in engine.watched.values()}
    assert entities[1004] == ((FE_GPU_I, 7), (FE_GPU_I, 8))  # profiling per instance
    assert entities[100] == ((FE_GPU, 0),)  # clocks from the physical GPU


def test_the_provider_seam_serves_receivers_built_by_the_factory(engine, clock):
    previous = dcgm_api.set_loader(engine.bindings)
    try:
        receiver = FACTORY.create(build_config(DcgmReceiverConfig, {}), Context("dcgm/x", Telemetry()), lambda b: None)
        receiver.clock = clock
        assert states(receiver.poll()) == ["ok"]
    finally:
        dcgm_api.set_loader(previous)
    assert dcgm_api.get_loader() is dcgm_api.import_bindings


@pytest.mark.parametrize(("settings", "key"), [
    ({"address": "http://x:5555"}, "address"),
    ({"clock_sample_interval": "50ms"}, "clock_sample_interval"),
    ({"collection_interval": "1s", "clock_sample_interval": "2s"}, "collection_interval"),
])
def test_config_rejects_bad_settings(settings, key):
    with pytest.raises(FieldError) as err:
        build_config(DcgmReceiverConfig, settings)
    assert err.value.key == key


def test_collector_config_validates():
    config = load_config(str(ROOT / "collector-config" / "dcgm.yaml"))
    assert [p.receivers for p in config.pipelines] == [["dcgm"], ["selftelemetry"]]
    with pytest.raises(ConfigError):
        load_config(str(ROOT / "collector-config" / "missing.yaml"))


def test_with_dcgm_4_6_1_the_base_unit_clocks_are_watched_and_read_in_mhz(engine, clock):
    """Bindings that know the base-unit fields: the SM clock is watched as 1603 (Hz) and the max as 1608."""
    engine.base_units_known = True
    receiver = make(engine, clock)
    prime(receiver, clock)
    end = clock.wall_s
    gpu = (FE_GPU, 0)
    for i in range(10):
        engine.push(gpu, 1603, us(end - 9 + i), 1_755_000_000 if i < 5 else 1_845_000_000)
    engine.push(gpu, 1608, us(end), 1_980_000_000)
    engine.push(gpu, 155, us(end), 650.0)
    engine.push(gpu, 112, us(end), 0)
    engine.push(gpu, 1004, us(end), 0.8)

    sample = next(s for s in receiver.poll().samples if s.gpu_index == 0)

    watched = {ids for ids, _, _ in engine.watched.values()}
    assert (1603,) in watched and (100,) not in watched
    assert (1608, 112, 155, 1611, 1420, 1421, 1422, 1423, 1424) in watched
    assert sample.sm_clock_mhz == pytest.approx(1800.0) and sample.sm_clock_samples == 10
    assert sample.max_sm_clock_mhz == 1980.0
    ofu = [p.value for p in named(ofu_points(Batch(samples=[sample])), "gpu.ofu.raw")]
    assert ofu == [pytest.approx(0.8 * 1800 / H100_FREF)]  # TPA x mean(1755, 1845) MHz / f_ref


def test_an_engine_that_refuses_the_base_unit_fields_gets_the_old_ones(engine, clock):
    """New bindings, an older remote nv-hostengine: the watch of 1603 fails, 100 is watched instead."""
    engine.base_units_known = True
    engine.refused_fields = {1603, 1608}
    receiver = make(engine, clock)
    prime(receiver, clock)
    push_window(engine, clock.wall_s, 0, 0.5, [1500.0] * 10)

    sample = next(s for s in receiver.poll().samples if s.gpu_index == 0)

    watched = {ids for ids, _, _ in engine.watched.values()}
    assert (100,) in watched and (113, 112, 155, 156, 1420, 1421, 1422, 1423, 1424) in watched
    assert (sample.sm_clock_mhz, sample.max_sm_clock_mhz) == (1500.0, 1980)


def test_the_ledger_counters_are_watched_and_read_energy_clock_event_time_and_traffic(engine, clock):
    """156 (mJ), 1420-1424 (ns per reason) with the device fields, 1009-1012 (bytes per second) with the
    profiling fields: each sample carries them raw, the reasons by their loss account cause."""
    receiver = make(engine, clock)
    prime(receiver, clock)
    end = clock.wall_s
    push_window(engine, end, 0, 0.8, [1500.0] * 10, reasons=0x44)
    gpu = (FE_GPU, 0)
    engine.push(gpu, 156, us(end), 123_456_789)
    for field_id, ns in ((1420, 7_000_000_000), (1421, 0), (1422, 0), (1423, 2_000_000_000), (1424, 0)):
        engine.push(gpu, field_id, us(end), ns)
    for field_id, rate in ((1009, 1_000), (1010, 2_000), (1011, 3_000_000_000), (1012, 4_000_000_000)):
        engine.push(gpu, field_id, us(end), rate)

    sample = next(s for s in receiver.poll().samples if s.gpu_index == 0)

    assert sample.energy_mj == 123_456_789
    assert sample.clock_event_ns == {"sw_power_cap": 7_000_000_000, "sync_boost": 0, "sw_thermal": 0,
                                     "hw_thermal": 2_000_000_000, "hw_power_brake": 0}
    assert (sample.pcie_tx_bytes_per_s, sample.pcie_rx_bytes_per_s) == (1_000, 2_000)
    assert (sample.nvlink_tx_bytes_per_s, sample.nvlink_rx_bytes_per_s) == (3_000_000_000, 4_000_000_000)


def test_a_gpu_without_the_ledger_counters_has_no_value_and_its_ofu_as_before(engine, clock):
    engine.ledger_known = False  # bindings that know none of 156, 1009-1012, 1420-1424
    receiver = make(engine, clock)
    prime(receiver, clock)
    push_window(engine, clock.wall_s, 0, 0.8, [1500.0] * 10)
    sample = next(s for s in receiver.poll().samples if s.gpu_index == 0)
    assert (sample.energy_mj, sample.clock_event_ns, sample.pcie_tx_bytes_per_s) == (None, None, None)
    assert {ids for ids, _, _ in engine.watched.values()} >= {(113, 112, 155), (1004, 1002, 1001, 1005, 1014, 1084,
                                                                                 1086)}


def test_an_engine_refusing_the_clock_event_time_fields_still_watches_the_device_fields(engine, clock):
    """Bindings newer than a remote nv-hostengine: the ledger's fields are refused, the device fields are not lost."""
    engine.refused_fields = {1420}
    receiver = make(engine, clock)
    prime(receiver, clock)
    push_window(engine, clock.wall_s, 0, 0.5, [1500.0] * 10, reasons=0x4)
    sample = next(s for s in receiver.poll().samples if s.gpu_index == 0)
    assert (113, 112, 155) in {ids for ids, _, _ in engine.watched.values()}
    assert sample.clock_event_reasons == 0x4 and sample.max_sm_clock_mhz == 1980 and sample.clock_event_ns is None


def test_a_blank_energy_counter_is_carried_as_the_blank_it_is(engine, clock):
    receiver = make(engine, clock)
    prime(receiver, clock)
    end = clock.wall_s
    push_window(engine, end, 0, 0.5, [1500.0] * 10)
    engine.push((FE_GPU, 0), 156, us(end), dcgm_api.DCGM_INT64_BLANK)
    sample = next(s for s in receiver.poll().samples if s.gpu_index == 0)
    assert sample.energy_mj == dcgm_api.DCGM_INT64_BLANK  # the counters' rule (core.counters) reads it as no value
