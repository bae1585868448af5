"""The seam to NVML through nvidia-ml-py (module ``pynvml``), and the GPM calls the nvml receiver makes.

Receivers and the doctor get the module from :func:`get_loader` (the real ``pynvml``, imported
lazily); tests install a fake with :func:`set_loader`. Every NVML failure that matters to an
admin is turned into an :class:`NvmlError` with a receiver state and a sentence that says
what to do.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

NvmlLoader = Callable[[], Any]


class NvmlError(Exception):
    """An NVML failure, classified: ``state`` for the status metric, ``message`` for an admin."""

    def __init__(self, state: str, message: str, code: int | None = None):
        super().__init__(f"{state}: {message}")
        self.state, self.message, self.code = state, message, code


def import_pynvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise NvmlError("nvml_missing", "the NVML Python bindings are not installed: "
                        "pip install nvidia-ml-py") from None


_loader: NvmlLoader = import_pynvml


def get_loader() -> NvmlLoader:
    """The pynvml loader receivers and the doctor use (the real one unless a test set one)."""
    return _loader


def set_loader(loader: NvmlLoader | None) -> NvmlLoader:
    """Install a loader (None restores the real one); returns the previous one."""
    global _loader
    previous, _loader = _loader, (loader or import_pynvml)
    return previous


# --- errors ----------------------------------------------------------------------------------


def error_code(api: Any, exc: BaseException) -> int | None:
    return int(exc.value) if isinstance(exc, api.NVMLError) else None


def classify_init_error(api: Any, exc: BaseException) -> NvmlError:
    """Why nvmlInit failed."""
    code = error_code(api, exc)
    if code == api.NVML_ERROR_LIBRARY_NOT_FOUND:
        return NvmlError("nvml_missing", "libnvidia-ml.so.1 not found: the NVIDIA driver is not installed here (in a "
                         "container, run it with the NVIDIA container toolkit, e.g. --gpus all)", code)
    if code == api.NVML_ERROR_DRIVER_NOT_LOADED:
        return NvmlError("driver_not_loaded", "the NVIDIA kernel driver is not loaded (nvidia-smi fails too): load it "
                         "(modprobe nvidia) or reboot after the driver install", code)
    if code == api.NVML_ERROR_NO_PERMISSION:
        return NvmlError("nvml_no_permission", "no permission to open the GPU device files (/dev/nvidia*): run as root "
                         "or as a user allowed to use the GPUs", code)
    if code == getattr(api, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", None):
        return NvmlError("driver_mismatch", "the NVML library and the loaded kernel driver differ in version (driver "
                         "upgraded without a reboot): reboot or reload the nvidia kernel modules", code)
    return NvmlError("nvml_error", f"nvmlInit failed: {exc}", code)


GPU_LOST_MESSAGE = ("NVML reports the GPU is lost (NVML_ERROR_GPU_IS_LOST): it fell off the bus; check the kernel log "
                    "for Xid 79, then reset it (nvidia-smi -r) or reboot")


def classify_gpu_error(api: Any, exc: BaseException) -> NvmlError:
    """Why a call on one GPU failed; the other GPUs carry on."""
    code = error_code(api, exc)
    if code == api.NVML_ERROR_GPU_IS_LOST:
        return NvmlError("gpu_lost", GPU_LOST_MESSAGE, code)
    if code == api.NVML_ERROR_NO_PERMISSION:
        return NvmlError("gpm_no_permission", "NVML refused a GPM read (NVML_ERROR_NO_PERMISSION): run as root", code)
    if code == getattr(api, "NVML_ERROR_RESET_REQUIRED", None):
        return NvmlError("gpu_lost", "the GPU requires a reset (NVML_ERROR_RESET_REQUIRED): nvidia-smi -r or reboot",
                         code)
    return NvmlError("gpu_error", f"NVML call failed: {exc}", code)


# --- devices ---------------------------------------------------------------------------------

_ARCH_NAMES = {"KEPLER": "Kepler", "MAXWELL": "Maxwell", "PASCAL": "Pascal", "VOLTA": "Volta", "TURING": "Turing",
               "AMPERE": "Ampere", "ADA": "Ada", "HOPPER": "Hopper", "BLACKWELL": "Blackwell", "RUBIN": "Rubin"}


def arch_name(api: Any, arch: int | None) -> str:
    for key, name in _ARCH_NAMES.items():
        if arch is not None and arch == getattr(api, f"NVML_DEVICE_ARCH_{key}", object()):
            return name
    return "unknown architecture"


@dataclass
class MigInstance:
    gpu_instance_id: int
    uuid: str  # of the first MIG device (compute instance) in this GPU instance
    slices: int | None = None  # the GPU instance's compute slices (nvmlDeviceGetAttributes), None if NVML will not say


@dataclass
class NvmlGpu:
    index: int
    handle: Any
    name: str
    uuid: str
    arch: str
    gpm: bool
    gpm_reason: str = ""  # why not, in words an admin can act on
    max_clock_mhz: int | None = None
    mig: list[MigInstance] = field(default_factory=list)


def describe_gpu(api: Any, index: int, *, mig: bool = True) -> NvmlGpu:
    """Identity, GPM support and MIG instances of one GPU. NVMLError escapes (lost GPU)."""
    handle = api.nvmlDeviceGetHandleByIndex(index)
    name, uuid = str(api.nvmlDeviceGetName(handle)), str(api.nvmlDeviceGetUUID(handle))
    arch_code = _optional(api, api.nvmlDeviceGetArchitecture, handle)
    arch = arch_name(api, arch_code)
    gpm, reason = gpm_support(api, handle, name, arch, arch_code)
    max_clock = _optional(api, api.nvmlDeviceGetMaxClockInfo, handle, api.NVML_CLOCK_SM)
    return NvmlGpu(index, handle, name, uuid, arch, gpm, reason, max_clock, mig_instances(api, handle) if mig else [])


def gpm_support(api: Any, handle: Any, name: str, arch: str, arch_code: int | None) -> tuple[bool, str]:
    advice = f"NVML GPM is not supported on {name} ({arch}): GPM needs Hopper or newer; use the dcgm receiver " \
             "(DCGM profiling fields) for this GPU"
    try:
        supported = bool(api.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except api.NVMLError as exc:
        if error_code(api, exc) == api.NVML_ERROR_GPU_IS_LOST:
            raise
        if error_code(api, exc) in (api.NVML_ERROR_NOT_SUPPORTED, api.NVML_ERROR_FUNCTION_NOT_FOUND):
            return False, advice
        return False, f"asking NVML for GPM support failed on {name}: {exc}"
    if supported:
        return True, ""
    hopper = getattr(api, "NVML_DEVICE_ARCH_HOPPER", 9)
    if arch_code is not None and arch_code != getattr(api, "NVML_DEVICE_ARCH_UNKNOWN", -1) and arch_code >= hopper:
        return False, f"NVML says GPM is not supported on {name} ({arch}) although it is Hopper or newer: update the " \
                      "NVIDIA driver (GPM needs R520 or newer)"
    return False, advice


def mig_instances(api: Any, handle: Any) -> list[MigInstance]:
    """GPU instances of a MIG-enabled GPU (one per GPU instance, whatever its compute instances)."""
    try:
        current, _pending = api.nvmlDeviceGetMigMode(handle)
    except api.NVMLError as exc:
        if error_code(api, exc) == api.NVML_ERROR_GPU_IS_LOST:
            raise
        return []  # MIG not supported on this GPU
    if current != api.NVML_DEVICE_MIG_ENABLE:
        return []
    out: dict[int, MigInstance] = {}
    for i in range(int(api.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = api.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except api.NVMLError as exc:
            if error_code(api, exc) == api.NVML_ERROR_NOT_FOUND:
                continue
            raise
        gi = int(api.nvmlDeviceGetGpuInstanceId(mig))
        if gi not in out:
            attributes = _optional(api, api.nvmlDeviceGetAttributes, mig)
            slices = int(attributes.gpuInstanceSliceCount) if attributes is not None else 0
            out[gi] = MigInstance(gi, str(api.nvmlDeviceGetUUID(mig)), slices or None)
    return sorted(out.values(), key=lambda m: m.gpu_instance_id)


def _optional(api: Any, call: Callable[..., Any], *args: Any) -> Any:
    """A value that is nice to have: None when NVML does not support it here (lost GPUs still raise)."""
    try:
        return call(*args)
    except api.NVMLError as exc:
        if error_code(api, exc) == api.NVML_ERROR_GPU_IS_LOST:
            raise
        return None


# --- GPM -----------------------------------------------------------------------------------------


def gpm_metrics(api: Any, sample1: Any, sample2: Any, metric_ids: Iterable[int]) -> dict[int, tuple[float | None, int]]:
    """Metrics between two GPM samples: {metric id: (value or None, its nvmlReturn)}.

    Values are what NVML returns (percent 0-100 for the utilization metrics).
    """
    ids = list(metric_ids)
    request = api.c_nvmlGpmMetricsGet_t()
    request.version = api.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1 = sample1
    request.sample2 = sample2
    for i, metric_id in enumerate(ids):
        request.metrics[i].metricId = metric_id
    api.nvmlGpmMetricsGet(request)
    out = {}
    for i in range(len(ids)):
        metric = request.metrics[i]
        ok = metric.nvmlReturn == api.NVML_SUCCESS
        out[int(metric.metricId)] = (float(metric.value) if ok else None, int(metric.nvmlReturn))
    return out


def running_processes(api: Any, handle: Any) -> list[Any]:
    """Compute processes on a GPU (pid, usedGpuMemory, gpuInstanceId, computeInstanceId); [] when not available."""
    try:
        return list(api.nvmlDeviceGetComputeRunningProcesses(handle))
    except api.NVMLError as exc:
        if error_code(api, exc) == api.NVML_ERROR_GPU_IS_LOST:
            raise
        return []


def total_energy_mj(api: Any, handle: Any) -> int | None:
    """The GPU's energy counter since the driver loaded, mJ (nvmlDeviceGetTotalEnergyConsumption, Volta+);
    None where NVML has none."""
    return _optional(api, api.nvmlDeviceGetTotalEnergyConsumption, handle)


# NVML's per-reason clock event time fields (nvml.h NVML_FI_DEV_CLOCKS_EVENT_REASON_*, cumulative ns):
# the same counters DCGM reads for its fields 1420-1424 (dcgmlib/src/dcgm_fields.cpp), by cause name.
CLOCK_EVENT_NS_FIELDS: tuple[tuple[str, str], ...] = (
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP", "sw_power_cap"),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST", "sync_boost"),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN", "sw_thermal"),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN", "hw_thermal"),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN", "hw_power_brake"),
)


def clock_event_ns(api: Any, handle: Any) -> dict[str, int] | None:
    """Nanoseconds the clock was held down per reason, by cause, through nvmlDeviceGetFieldValues; the
    reasons NVML answers for (the others left out), None when it answers for none (older bindings or driver)."""
    known = [(getattr(api, name), cause) for name, cause in CLOCK_EVENT_NS_FIELDS if hasattr(api, name)]
    if not known:
        return None
    values = _optional(api, api.nvmlDeviceGetFieldValues, handle, [field_id for field_id, _ in known])
    if values is None:
        return None
    out = {}
    for value, (_, cause) in zip(values, known):
        if value.nvmlReturn == api.NVML_SUCCESS:
            out[cause] = int(value.value.ullVal) if value.valueType == api.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG \
                else int(value.value.sllVal)
    return out or None


def clock_event_reasons(api: Any, handle: Any) -> int | None:
    call = getattr(api, "nvmlDeviceGetCurrentClocksEventReasons", None) or api.nvmlDeviceGetCurrentClocksThrottleReasons
    return _optional(api, call, handle)
