"""A fake ``pynvml``: the functions the nvml receiver and the doctor call, over scriptable GPUs.

Constants (NVML_*), structs (c_nvmlGpmMetricsGet_t, c_nvmlGpmSupport_t,
c_nvmlProcessInfo_v3_t, ...) and errors (NVMLError and its per-code subclasses such as
NVMLError_GpuIsLost) are the real ones from nvidia-ml-py, looked up on the real module, so the
fake cannot drift from them; the functions keep pynvml's names and parameter names (a test
compares the signatures). Devices integrate tensor and SM activity over the fake clock, so a
GPM window's ANY_TENSOR_UTIL is the exact time average of what the test set.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field

import pynvml as _real

from tests.fakes.clock import FakeClock

_FORWARD = re.compile(r"^(NVML_|c_nvml|struct_c_nvml|NVMLError|nvmlFriendlyObject$|nvmlStructToFriendlyObject$)")


@dataclass
class FakeNvmlMig:
    gpu_instance_id: int
    uuid: str
    tpa: float = 0.0  # tensor activity of this GPU instance
    compute_instances: int = 1
    slices: int = 1  # the GPU instance profile's compute slices (1g.10gb: 1)


@dataclass
class FakeNvmlGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    arch: int = _real.NVML_DEVICE_ARCH_HOPPER
    gpm: bool = True
    sm_clock: int = 1755
    max_clock: int = 1980
    tpa: float = 0.0  # current tensor activity, 0..1
    sm_util: float = 0.9
    gr_util: float = 0.95  # graphics engine activity (GPM GRAPHICS_UTIL / 100)
    dram_util: float = 0.3  # DRAM bandwidth utilization (GPM DRAM_BW_UTIL / 100)
    power_mw: int = 650_000
    power_limit_mw: int = 700_000
    boost_clock: int = 1980  # max customer boost
    application_clock: int = 1980  # current and default applications clock
    memory_clock: int = 2619
    reasons: int = 0x4  # SW power cap
    processes: list[tuple[int, int, int, int]] = field(default_factory=list)  # pid, bytes, GI, CI
    # The driver's per-process utilization samples: (pid, CPU timestamp in microseconds, SM util %), one per
    # process with non-zero utilization per sampling period (nvmlDeviceGetProcessUtilization)
    process_utilization: list[tuple[int, int, int]] = field(default_factory=list)
    mig: list[FakeNvmlMig] = field(default_factory=list)
    # Interconnect traffic now, MiB/s as GPM reports it (PCIE_TX/RX_PER_SEC, NVLINK_TOTAL_TX/RX_PER_SEC)
    pcie_tx_mib_s: float = 0.0
    pcie_rx_mib_s: float = 0.0
    nvlink_tx_mib_s: float = 0.0
    nvlink_rx_mib_s: float = 0.0
    energy_mj: float = 0.0  # the energy counter (power integrated over the fake clock), mJ
    event_ns: dict[int, float] = field(default_factory=dict)  # reason bit -> ns held down by it (integrated)
    ledger: bool = True  # the driver has the energy counter and the clock event time fields
    lost: bool = False
    gpm_permission: bool = True
    index: int = -1
    # integrated activity (seconds) and when it was last brought up to date
    _acc: dict[object, list[float]] = field(default_factory=dict)
    _acc_t: float = 0.0


@dataclass(frozen=True)
class FakeHandle:
    index: int
    gpu_instance_id: int | None = None  # set on MIG device handles


# The clock event time fields (nvml.h NVML_FI_DEV_CLOCKS_EVENT_REASON_*) -> the reason bit whose time each counts.
_EVENT_FIELDS = {
    _real.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: 0x4, _real.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST: 0x10,
    _real.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: 0x20,
    _real.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: 0x40,
    _real.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: 0x80,
}


class FakeNvml:
    """Module-like: ``api = FakeNvml(...)``; ``api.nvmlInit()``, ``api.NVML_CLOCK_SM``, ``api.NVMLError``."""

    def __init__(self, gpus: list[FakeNvmlGpu], clock: FakeClock | None = None):
        self.clock = clock or FakeClock()
        self.gpus: list[FakeNvmlGpu] = []
        for gpu in gpus:
            self.add_gpu(gpu)
        self.init_error: int | None = None  # an NVML_ERROR_* code nvmlInit fails with
        self.init_count = 0  # NVML counts nvmlInit calls; the last matching nvmlShutdown shuts it down
        self.calls: list[str] = []
        # address -> (gpu, GI, t, permitted, integrated seconds of tensor, SM, graphics engine, DRAM)
        self._samples: dict[int, tuple | None] = {}
        self._buffers: dict[int, ctypes.Array] = {}
        self.freed = 0

    def __getattr__(self, name: str):
        if _FORWARD.match(name):
            return getattr(_real, name)
        raise AttributeError(f"FakeNvml has no {name} (add it, with pynvml's signature)")

    def __call__(self):  # the loader the receiver calls
        return self

    # --- scripting -------------------------------------------------------------------------------

    def add_gpu(self, gpu: FakeNvmlGpu) -> None:
        gpu.index = len(self.gpus)
        gpu.uuid = gpu.uuid or f"GPU-1111111{gpu.index}-2222-3333-4444-555555555555"
        gpu._acc_t = self.clock.monotonic()
        self.gpus.append(gpu)

    def set(self, index: int, **values) -> None:
        """Change a GPU's state from now on (activity before now is kept)."""
        gpu = self.gpus[index]
        self._integrate(gpu)
        for key, value in values.items():
            setattr(gpu, key, value)

    def _integrate(self, gpu: FakeNvmlGpu) -> None:
        now = self.clock.monotonic()
        dt = now - gpu._acc_t
        gpu.energy_mj += gpu.power_mw * dt
        for bit in _EVENT_FIELDS.values():
            if gpu.reasons & bit:
                gpu.event_ns[bit] = gpu.event_ns.get(bit, 0.0) + dt * 1e9
        levels = (gpu.sm_util, gpu.gr_util, gpu.dram_util, gpu.pcie_tx_mib_s, gpu.pcie_rx_mib_s, gpu.nvlink_tx_mib_s,
                  gpu.nvlink_rx_mib_s)
        parts = [(None, gpu.tpa, *levels)] + [(m.gpu_instance_id, m.tpa, *levels) for m in gpu.mig]
        for key, *activity in parts:
            acc = gpu._acc.setdefault(key, [0.0] * len(activity))
            for i, value in enumerate(activity):
                acc[i] += value * dt
        gpu._acc_t = now

    def _error(self, code: int) -> Exception:
        return _real.NVMLError(code)

    def _gpu(self, handle: FakeHandle) -> FakeNvmlGpu:
        if not self.initialized:
            raise self._error(_real.NVML_ERROR_UNINITIALIZED)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise self._error(_real.NVML_ERROR_GPU_IS_LOST)
        return gpu

    # --- init ------------------------------------------------------------------------------------

    @property
    def initialized(self) -> bool:
        return self.init_count > 0

    def nvmlInit(self):
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise self._error(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self):
        # Reference counted, as NVML documents: shutdown happens when the count reaches zero, and
        # extra calls report no error (two users of NVML in one process do not cut each other off).
        self.init_count = max(0, self.init_count - 1)

    def nvmlSystemGetDriverVersion(self):
        return "570.124.06"

    def nvmlDeviceGetCount(self):
        self._check_init()
        return len(self.gpus)

    def _check_init(self):
        if not self.initialized:
            raise self._error(_real.NVML_ERROR_UNINITIALIZED)

    # --- devices ---------------------------------------------------------------------------------

    def nvmlDeviceGetHandleByIndex(self, index):
        self._check_init()
        if index >= len(self.gpus):
            raise self._error(_real.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    def nvmlDeviceGetName(self, handle):
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle):
        gpu = self._gpu(handle)
        if handle.gpu_instance_id is not None:
            return next(m.uuid for m in gpu.mig if m.gpu_instance_id == handle.gpu_instance_id)
        return gpu.uuid

    def nvmlDeviceGetIndex(self, handle):
        return self._gpu(handle).index

    def nvmlDeviceGetArchitecture(self, device):
        return self._gpu(device).arch

    def nvmlDeviceGetClockInfo(self, handle, type):
        gpu = self._gpu(handle)
        if type != _real.NVML_CLOCK_SM:
            raise self._error(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.sm_clock

    def nvmlDeviceGetMaxClockInfo(self, handle, type):
        gpu = self._gpu(handle)
        if type != _real.NVML_CLOCK_SM:
            raise self._error(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.max_clock

    def nvmlDeviceGetMaxCustomerBoostClock(self, handle, type):
        gpu = self._gpu(handle)
        if type != _real.NVML_CLOCK_SM:
            raise self._error(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.boost_clock

    def nvmlDeviceGetApplicationsClock(self, handle, type):
        gpu = self._gpu(handle)
        if type != _real.NVML_CLOCK_SM:
            raise self._error(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.application_clock

    def nvmlDeviceGetDefaultApplicationsClock(self, handle, type):
        return self.nvmlDeviceGetApplicationsClock(handle, type)

    def nvmlDeviceGetSupportedMemoryClocks(self, handle):
        return [self._gpu(handle).memory_clock]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle, memoryClockMHz):
        gpu = self._gpu(handle)
        if memoryClockMHz != gpu.memory_clock:
            raise self._error(_real.NVML_ERROR_NOT_FOUND)
        return list(range(gpu.max_clock, 344, -15))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self._gpu(handle).power_limit_mw

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._gpu(handle).reasons

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._gpu(handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        """As pynvml: the energy counter since the driver loaded, in mJ (an int, c_uint64)."""
        gpu = self._gpu(handle)
        if not gpu.ledger:
            raise self._error(_real.NVML_ERROR_NOT_SUPPORTED)
        self._integrate(gpu)
        return int(gpu.energy_mj)

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        """As pynvml: an array of c_nvmlFieldValue_t, each with its own nvmlReturn (NOT_SUPPORTED for a field
        this fake has not: only the clock event time per reason, cumulative ns, unsigned long long)."""
        gpu = self._gpu(handle)
        self._integrate(gpu)
        values = (_real.c_nvmlFieldValue_t * len(fieldIds))()
        for i, field_id in enumerate(fieldIds):
            values[i].fieldId = field_id
            bit = _EVENT_FIELDS.get(field_id)
            if bit is None or not gpu.ledger:
                values[i].nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
                continue
            values[i].nvmlReturn = _real.NVML_SUCCESS
            values[i].valueType = _real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            values[i].value.ullVal = int(gpu.event_ns.get(bit, 0.0))
        return values

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        gpu = self._gpu(handle)
        out = []
        for pid, used, gi, ci in gpu.processes:
            info = _real.c_nvmlProcessInfo_v3_t()
            info.pid, info.usedGpuMemory, info.gpuInstanceId, info.computeInstanceId = pid, used, gi, ci
            out.append(_real.nvmlStructToFriendlyObject(info))
        return out

    def nvmlDeviceGetProcessUtilization(self, handle, timeStamp):
        """As pynvml: the samples newer than ``timeStamp`` as c_nvmlProcessUtilizationSample_t structs;
        NVML_ERROR_NOT_FOUND when there is none (NVML's documented answer: no valid sample since then)."""
        gpu = self._gpu(handle)
        out = []
        for pid, stamp, sm in gpu.process_utilization:
            if stamp > timeStamp:
                sample = _real.c_nvmlProcessUtilizationSample_t()
                sample.pid, sample.timeStamp, sample.smUtil, sample.memUtil = pid, stamp, sm, 0
                out.append(sample)
        if not out:
            raise self._error(_real.NVML_ERROR_NOT_FOUND)
        return out

    # --- MIG -------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device):
        gpu = self._gpu(device)
        if gpu.arch < _real.NVML_DEVICE_ARCH_AMPERE:
            raise self._error(_real.NVML_ERROR_NOT_SUPPORTED)
        mode = _real.NVML_DEVICE_MIG_ENABLE if gpu.mig else _real.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device):
        self._gpu(device)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device, index):
        gpu = self._gpu(device)
        slots = [m for m in gpu.mig for _ in range(m.compute_instances)]
        if index >= len(slots):
            raise self._error(_real.NVML_ERROR_NOT_FOUND)
        return FakeHandle(device.index, slots[index].gpu_instance_id)

    def nvmlDeviceGetAttributes(self, device):
        """As NVML: only MIG device handles have attributes (NOT_SUPPORTED on a whole GPU)."""
        gpu = self._gpu(device)
        if device.gpu_instance_id is None:
            raise self._error(_real.NVML_ERROR_NOT_SUPPORTED)
        mig = next(m for m in gpu.mig if m.gpu_instance_id == device.gpu_instance_id)
        attributes = _real.c_nvmlDeviceAttributes()
        attributes.gpuInstanceSliceCount = mig.slices
        attributes.computeInstanceSliceCount = mig.slices
        return attributes

    def nvmlDeviceGetGpuInstanceId(self, device):
        self._gpu(device)
        if device.gpu_instance_id is None:
            raise self._error(_real.NVML_ERROR_INVALID_ARGUMENT)
        return device.gpu_instance_id

    # --- GPM -------------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, device):
        gpu = self._gpu(device)
        support = _real.c_nvmlGpmSupport_t()
        support.version = _real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm and gpu.arch >= _real.NVML_DEVICE_ARCH_HOPPER)
        return support

    def nvmlGpmSampleAlloc(self):
        self.calls.append("nvmlGpmSampleAlloc")
        buffer = ctypes.create_string_buffer(16)  # a distinct address per sample, like the driver's
        sample = ctypes.cast(buffer, _real.c_nvmlGpmSample_t)
        address = ctypes.cast(sample, ctypes.c_void_p).value
        self._buffers[address] = buffer
        self._samples[address] = None
        return sample

    def nvmlGpmSampleFree(self, gpmSample):
        address = ctypes.cast(gpmSample, ctypes.c_void_p).value
        self._samples.pop(address)
        self._buffers.pop(address)
        self.freed += 1

    def nvmlGpmSampleGet(self, device, gpmSample):
        return self._take(device, None, gpmSample)

    def nvmlGpmMigSampleGet(self, device, gpuInstanceId, gpmSample):
        return self._take(device, gpuInstanceId, gpmSample)

    def _take(self, device, gpu_instance_id, sample):
        self.calls.append("nvmlGpmSampleGet")
        gpu = self._gpu(device)
        if not (gpu.gpm and gpu.arch >= _real.NVML_DEVICE_ARCH_HOPPER):
            raise self._error(_real.NVML_ERROR_NOT_SUPPORTED)
        address = ctypes.cast(sample, ctypes.c_void_p).value
        if address not in self._samples:
            raise self._error(_real.NVML_ERROR_INVALID_ARGUMENT)
        self._integrate(gpu)
        integrated = tuple(gpu._acc.get(gpu_instance_id, [0.0] * 8))
        self._samples[address] = (gpu.index, gpu_instance_id, self.clock.monotonic(), gpu.gpm_permission, *integrated)
        return sample

    def nvmlGpmMetricsGet(self, metricsGet):
        if metricsGet.version != _real.NVML_GPM_METRICS_GET_VERSION:
            raise self._error(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self._samples.get(ctypes.cast(metricsGet.sample1, ctypes.c_void_p).value)
        second = self._samples.get(ctypes.cast(metricsGet.sample2, ctypes.c_void_p).value)
        if first is None or second is None or first[:2] != second[:2]:
            raise self._error(_real.NVML_ERROR_INVALID_ARGUMENT)
        dt = second[2] - first[2]
        positions = {_real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 4, _real.NVML_GPM_METRIC_SM_UTIL: 5,
                     _real.NVML_GPM_METRIC_GRAPHICS_UTIL: 6, _real.NVML_GPM_METRIC_DRAM_BW_UTIL: 7}
        rates = {_real.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 8, _real.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 9,
                 _real.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 10, _real.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 11}
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            at = positions.get(metric.metricId)
            rate_at = rates.get(metric.metricId)
            if not second[3]:
                metric.nvmlReturn = _real.NVML_ERROR_NO_PERMISSION
            elif rate_at is not None and dt > 0:  # MiB/s over the window, as GPM gives them
                metric.value, metric.nvmlReturn = (second[rate_at] - first[rate_at]) / dt, _real.NVML_SUCCESS
            elif at is not None and dt > 0:
                metric.value, metric.nvmlReturn = 100.0 * (second[at] - first[at]) / dt, _real.NVML_SUCCESS
            else:
                metric.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
        return metricsGet


class MissingNvml(FakeNvml):
    """No driver on the machine: nvmlInit fails as pynvml does without libnvidia-ml.so.1."""

    def __init__(self, code: int = _real.NVML_ERROR_LIBRARY_NOT_FOUND):
        super().__init__([])
        self.init_error = code
