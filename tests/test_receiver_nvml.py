"""The nvml receiver against a fake pynvml: GPM windows, clock averaging, lost and pre-Hopper GPUs."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import pynvml
import pytest

from otel_ofu.core.model import GPU_MIG_INSTANCE, Batch
from otel_ofu.gpu import nvml_api
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.pipeline.service import load_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.nvml import FACTORY, NvmlReceiver, NvmlReceiverConfig
from tests.fakes.clock import FakeClock
from tests.fakes.nvml import FakeNvml, FakeNvmlGpu, FakeNvmlMig, MissingNvml

ROOT = Path(__file__).resolve().parent.parent
A100 = dict(name="NVIDIA A100-SXM4-80GB", arch=pynvml.NVML_DEVICE_ARCH_AMPERE, gpm=False, max_clock=1410)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make(api: FakeNvml, clock: FakeClock, **settings) -> NvmlReceiver:
    config = build_config(NvmlReceiverConfig, settings)
    return NvmlReceiver(config, Context("nvml", Telemetry()), lambda b: None, loader=api, clock=clock)


def run_window(receiver: NvmlReceiver, clock: FakeClock, seconds: int = 10, during=None) -> Batch:
    """Advance the fake clock one tick at a time; return the batch the window's last tick emits."""
    batch = None
    for second in range(1, seconds + 1):
        clock.advance(1)
        if during:
            during(second)
        batch = receiver.poll()
        if second < seconds:
            assert batch is None, "no batch before the window ends"
    assert batch is not None
    return batch


def ofu_points(batch: Batch) -> list:
    return OfuProcessor(OfuProcessorConfig(), Context("ofu")).process(batch).points


def named(points: list, name: str) -> list:
    return [p for p in points if p.name == name]


def status_points(batch: Batch) -> list[tuple[str, str | None]]:
    return [(dict(p.attributes)["state"], dict(p.resource).get("hw.id"))
            for p in named(batch.points, "otel_ofu.receiver.status")]


def test_two_gpm_samples_a_window_apart_give_tpa_and_ofu(clock):
    api = FakeNvml([FakeNvmlGpu(tpa=0.8), FakeNvmlGpu(tpa=0.5, sm_clock=1400)], clock)
    receiver = make(api, clock)
    assert receiver.poll() is None  # init, first clock sample, window opens

    batch = run_window(receiver, clock)

    by_gpu = {s.gpu_index: s for s in batch.samples}
    assert by_gpu[0].tensor_active == pytest.approx(0.8)  # 80 % ANY_TENSOR_UTIL -> 0.8
    assert by_gpu[1].tensor_active == pytest.approx(0.5)
    assert by_gpu[0].sm_clock_mhz == 1755 and by_gpu[0].sm_clock_samples == 10
    assert by_gpu[0].window_s == pytest.approx(10.0)
    assert by_gpu[0].max_sm_clock_mhz == 1980 and by_gpu[0].power_w == pytest.approx(650.0)
    assert by_gpu[0].clock_event_reasons == 0x4 and by_gpu[0].sm_active == pytest.approx(0.9)
    # GPM also gives the loss account's engine and DRAM ratios for the same window
    assert by_gpu[0].gr_active == pytest.approx(0.95) and by_gpu[0].dram_active == pytest.approx(0.3)
    raw = {dict(p.resource)["gpu.index"]: p.value for p in named(ofu_points(batch), "gpu.ofu.raw")}
    assert raw == {"0": pytest.approx(0.8 * 1755 / 1830), "1": pytest.approx(0.5 * 1400 / 1830)}
    assert status_points(batch) == [("ok", None)]


def test_clock_samples_at_their_own_rate_are_averaged_over_the_window(clock):
    api = FakeNvml([FakeNvmlGpu(tpa=1.0, sm_clock=1500)], clock)
    receiver = make(api, clock, clock_sample_interval="1s", collection_interval="10s")
    receiver.poll()

    def script(second):
        if second == 4:
            api.set(0, tpa=0.5)  # 1.0 for the first 4 s, then 0.5
        if second == 6:
            api.set(0, sm_clock=1700)

    sample = run_window(receiver, clock, during=script).samples[0]

    assert sample.sm_clock_mhz == pytest.approx((5 * 1500 + 5 * 1700) / 10)
    assert sample.sm_clock_samples == 10
    assert sample.tensor_active == pytest.approx((4 * 1.0 + 6 * 0.5) / 10)  # GPM's exact time average


def test_running_processes_become_the_process_pid_attribute(clock):
    na = 0xFFFFFFFF
    api = FakeNvml([FakeNvmlGpu(tpa=0.5, processes=[(4242, 1 << 30, na, na), (17, 1 << 20, na, na)])], clock)
    receiver = make(api, clock)
    receiver.poll()
    sample = run_window(receiver, clock).samples[0]
    assert sample.attributes == {"process.pid": "17,4242"}
    assert make(api, clock, report_processes=False) is not None


def test_pre_hopper_gpu_is_reported_unsupported_with_the_reason(clock):
    api = FakeNvml([FakeNvmlGpu(**A100)], clock)
    receiver = make(api, clock)
    receiver.poll()

    batch = run_window(receiver, clock)
    points = ofu_points(batch)

    assert receiver.status.state == "gpm_unsupported"
    assert "Ampere" in receiver.status.message and "dcgm receiver" in receiver.status.message
    assert named(points, "gpu.ofu") == []
    assert {dict(p.attributes)["ofu.drop.reason"] for p in named(points, "gpu.ofu.dropped")} == {"not_supported"}
    assert named(points, "gpu.sm.clock.frequency")  # clocks are still exported
    assert not [c for c in api.calls if "Gpm" in c]


def test_mixed_machine_reports_the_a100_and_reads_the_h100(clock):
    api = FakeNvml([FakeNvmlGpu(tpa=0.6), FakeNvmlGpu(**A100)], clock)
    receiver = make(api, clock)
    receiver.poll()
    batch = run_window(receiver, clock)
    assert ("ok", None) in status_points(batch)
    assert ("gpm_unsupported", api.gpus[1].uuid) in status_points(batch)
    assert [dict(p.resource)["gpu.index"] for p in named(ofu_points(batch), "gpu.ofu")] == ["0"]


def test_a_lost_gpu_is_reported_and_the_others_carry_on(clock, caplog):
    caplog.set_level(logging.WARNING)
    api = FakeNvml([FakeNvmlGpu(tpa=0.8), FakeNvmlGpu(tpa=0.4)], clock)
    receiver = make(api, clock, reconnect_initial_interval="5s", reconnect_max_interval="5s")
    receiver.poll()
    run_window(receiver, clock)

    api.set(1, lost=True)
    lost = run_window(receiver, clock)
    again = run_window(receiver, clock)

    for batch in (lost, again):
        assert [s.gpu_index for s in batch.samples] == [0]
        assert ("gpu_lost", api.gpus[1].uuid) in status_points(batch)
    assert receiver.status.state == "ok"
    assert len([r for r in caplog.records if "gpu_lost" in r.getMessage()]) == 1

    api.set(1, lost=False)  # reset: the re-probe finds it, a fresh window opens, data resumes
    run_window(receiver, clock)
    back = run_window(receiver, clock)
    assert sorted(s.gpu_index for s in back.samples) == [0, 1]
    assert next(s for s in back.samples if s.gpu_index == 1).tensor_active == pytest.approx(0.4)
    assert ("gpu_lost", api.gpus[1].uuid) not in status_points(back)


def test_mig_gpu_instances_are_sampled_on_their_own(clock):
    mig = [FakeNvmlMig(1, "MIG-aaaa", tpa=0.6, compute_instances=2, slices=3), FakeNvmlMig(2, "MIG-bbbb", tpa=0.2)]
    api = FakeNvml([FakeNvmlGpu(mig=mig, processes=[(100, 1, 1, 0), (200, 1, 2, 0), (300, 1, 1, 1)])], clock)
    receiver = make(api, clock)
    receiver.poll()

    samples = run_window(receiver, clock).samples

    by_gi = {s.resource[GPU_MIG_INSTANCE]: s for s in samples}
    assert set(by_gi) == {"1", "2"}
    assert by_gi["1"].tensor_active == pytest.approx(0.6) and by_gi["2"].tensor_active == pytest.approx(0.2)
    assert by_gi["1"].attributes["process.pid"] == "100,300" and by_gi["2"].attributes["process.pid"] == "200"
    assert by_gi["1"].resource["gpu.mig.uuid"] == "MIG-aaaa" and by_gi["1"].power_w is None
    assert (by_gi["1"].resource["gpu.mig.slices"], by_gi["2"].resource["gpu.mig.slices"]) == ("3", "1")


def test_gpm_without_permission_is_blank_with_its_reason(clock):
    api = FakeNvml([FakeNvmlGpu(tpa=0.5, gpm_permission=False)], clock)
    receiver = make(api, clock)
    receiver.poll()
    points = ofu_points(run_window(receiver, clock))
    assert named(points, "gpu.ofu") == []
    assert dict(named(points, "gpu.ofu.dropped")[0].attributes)["ofu.drop.reason"] == "not_permissioned"


def test_nvml_missing_is_reported_and_retried_with_backoff(clock):
    api = MissingNvml()
    receiver = make(api, clock, reconnect_initial_interval="1s", reconnect_max_interval="8s")
    first = receiver.poll()
    assert status_points(first) == [("nvml_missing", None)]
    assert "libnvidia-ml.so.1" in receiver.status.message
    for _ in range(30):
        clock.advance(1)
        receiver.poll()
    assert 4 <= api.calls.count("nvmlInit") <= 7  # 1, 2, 4, 8, 8, ... not once a second

    api.init_error = None  # the driver is loaded
    api.add_gpu(FakeNvmlGpu(tpa=0.3))
    for _ in range(9):
        clock.advance(1)
        receiver.poll()
    assert receiver.status.state == "ok"


def test_real_pynvml_without_a_driver_says_the_driver_is_missing(clock):
    api = nvml_api.import_pynvml()
    assert api is pynvml
    try:
        api.nvmlInit()
    except api.NVMLError as exc:
        error = nvml_api.classify_init_error(api, exc)
        assert error.state in ("nvml_missing", "driver_not_loaded")
        return
    api.nvmlShutdown()
    pytest.skip("this machine has an NVIDIA driver")


def test_fake_functions_have_pynvml_signatures():
    fake = FakeNvml([])
    names = [n for n in dir(FakeNvml) if n.startswith("nvml") and callable(getattr(FakeNvml, n))]
    assert len(names) > 20
    for name in names:
        real = inspect.signature(getattr(pynvml, name))
        mine = inspect.signature(getattr(fake, name))
        assert list(mine.parameters) == list(real.parameters), name
    assert fake.NVMLError is pynvml.NVMLError and fake.c_nvmlGpmMetricsGet_t is pynvml.c_nvmlGpmMetricsGet_t
    assert isinstance(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST), pynvml.NVMLError_GpuIsLost)


def test_the_provider_seam_serves_receivers_built_by_the_factory(clock):
    api = FakeNvml([FakeNvmlGpu(tpa=0.5)], clock)
    previous = nvml_api.set_loader(api)
    try:
        receiver = FACTORY.create(build_config(NvmlReceiverConfig, {}), Context("nvml", Telemetry()), lambda b: None)
        receiver.clock = clock
        receiver.poll()
        assert receiver.status.state == "ok"
        receiver.close()
        assert api.freed == 2 and not api.initialized
    finally:
        nvml_api.set_loader(previous)


@pytest.mark.parametrize(("settings", "key"), [
    ({"clock_sample_interval": "10ms"}, "clock_sample_interval"),
    ({"collection_interval": "1s", "clock_sample_interval": "5s"}, "collection_interval"),
    ({"gpu_indices": [-1]}, "gpu_indices"),
])
def test_config_rejects_bad_settings(settings, key):
    with pytest.raises(FieldError) as err:
        build_config(NvmlReceiverConfig, settings)
    assert err.value.key == key


def test_collector_config_validates():
    config = load_config(str(ROOT / "collector-config" / "nvml.yaml"))
    assert [p.receivers for p in config.pipelines] == [["nvml"], ["selftelemetry"]]


def test_the_ledger_counters_are_read_energy_clock_event_time_per_reason_and_gpm_traffic(clock):
    """Energy (nvmlDeviceGetTotalEnergyConsumption, mJ), the clock's event time per reason (the
    NVML_FI_DEV_CLOCKS_EVENT_REASON_* field values DCGM's 1420-1424 read, ns) and GPM's PCIe/NVLink traffic
    (MiB/s, carried in bytes per second): cumulative counters move by what the window added."""
    api = FakeNvml([FakeNvmlGpu(power_mw=500_000, reasons=0x4 | 0x40, pcie_tx_mib_s=2.0, pcie_rx_mib_s=8.0,
                                nvlink_tx_mib_s=1000.0, nvlink_rx_mib_s=1500.0)], clock)
    receiver = make(api, clock)
    receiver.poll()
    first = run_window(receiver, clock).samples[0]
    api.set(0, reasons=0x4)
    second = run_window(receiver, clock).samples[0]

    assert second.energy_mj - first.energy_mj == pytest.approx(500_000 * 10, abs=1)  # 500 W for 10 s, in mJ
    assert set(first.clock_event_ns) == {"sw_power_cap", "sync_boost", "sw_thermal", "hw_thermal", "hw_power_brake"}
    moved = {cause: second.clock_event_ns[cause] - first.clock_event_ns[cause] for cause in first.clock_event_ns}
    assert moved == {"sw_power_cap": pytest.approx(10e9, abs=1), "hw_thermal": 0, "sync_boost": 0, "sw_thermal": 0,
                     "hw_power_brake": 0}
    assert (second.pcie_tx_bytes_per_s, second.pcie_rx_bytes_per_s) == (pytest.approx(2 << 20), pytest.approx(8 << 20))
    assert second.nvlink_tx_bytes_per_s == pytest.approx(1000 << 20)
    assert second.nvlink_rx_bytes_per_s == pytest.approx(1500 << 20)


def test_without_the_ledger_counters_the_samples_carry_no_value_not_zero(clock):
    api = FakeNvml([FakeNvmlGpu(ledger=False)], clock)
    receiver = make(api, clock)
    receiver.poll()
    sample = run_window(receiver, clock).samples[0]
    assert sample.energy_mj is None and sample.clock_event_ns is None
    assert sample.tensor_active is not None  # the window itself is whole


def test_a_mig_instance_carries_its_gpus_clock_event_time_and_no_energy_of_its_own(clock):
    api = FakeNvml([FakeNvmlGpu(mig=[FakeNvmlMig(1, "MIG-aaaa", tpa=0.6)], reasons=0x20)], clock)
    receiver = make(api, clock)
    receiver.poll()
    sample = run_window(receiver, clock).samples[0]
    assert sample.energy_mj is None and sample.clock_event_ns["sw_thermal"] == pytest.approx(10e9, abs=1)
