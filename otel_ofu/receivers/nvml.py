"""The ``nvml`` receiver: tensor activity from NVML GPM (Hopper and newer), no DCGM needed.

Two GPM samples one ``collection_interval`` apart give ANY_TENSOR_UTIL (percent, divided by
100: TPA), and SM_UTIL, GRAPHICS_UTIL and DRAM_BW_UTIL (the loss account's ratios) for the
window; GPM takes no profiling lock, so users can still run Nsight. The SM clock is sampled
every ``clock_sample_interval`` (default 1 s) and averaged over the same window
(``otel_ofu.core.ofu.mean_clock``). The same GPM window gives PCIe and NVLink traffic
(PCIE_TX/RX_PER_SEC, NVLINK_TOTAL_TX/RX_PER_SEC, MiB/s, carried in bytes per second as DCGM's
1009-1012 are). Max SM clock, clock event reasons, power, the energy counter
(nvmlDeviceGetTotalEnergyConsumption, mJ), the nanoseconds the clock was held down per reason
(the NVML_FI_DEV_CLOCKS_EVENT_REASON_* field values DCGM's 1420-1424 read) and the running
compute processes are read at each window's end; the processes' pids go into the point
attribute ``process.pid`` (comma-separated, sorted), per MIG GPU instance when MIG is on
(``report_processes: false`` leaves them out).

A GPU without GPM (before Hopper) is reported as ``gpm_unsupported`` with the reason, and
its samples say ``not_supported`` (the ofu processor counts them as dropped, with clocks
still exported). A lost GPU (NVML_ERROR_GPU_IS_LOST) is reported as ``gpu_lost`` and
re-probed with backoff; the other GPUs carry on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.core.model import GPU_MIG_INSTANCE, GPU_MIG_SLICES, Batch, GpuSample
from otel_ofu.core.ofu import mean_clock
from otel_ofu.core.values import rescale
from otel_ofu.gpu import nvml_api, status
from otel_ofu.gpu.backoff import Backoff
from otel_ofu.gpu.clock import SYSTEM_CLOCK, Clock
from otel_ofu.gpu.nvml_api import NvmlError, NvmlGpu
from otel_ofu.pipeline.component import Context, Factory, PollingReceiver
from otel_ofu.pipeline.config import Duration, require

SOURCE = "nvml"
PROCESS_PID = "process.pid"


@dataclass
class NvmlReceiverConfig:
    # GPM window: two GPM samples this far apart give ANY_TENSOR_UTIL (percent / 100 = TPA) and
    # SM_UTIL (gpu.sm.activity).
    collection_interval: Duration = field(default_factory=lambda: Duration(10))
    # SM clock sampling (nvmlDeviceGetClockInfo), averaged over each window; the receiver wakes
    # at this rate.
    clock_sample_interval: Duration = field(default_factory=lambda: Duration(1))
    gpu_indices: list[int] = field(default_factory=list)  # NVML indices; [] = every GPU
    # One sample per MIG GPU instance (nvmlGpmMigSampleGet), with gpu.mig.instance_id,
    # gpu.mig.uuid and gpu.mig.slices.
    mig: bool = True
    # Pids of the compute processes on the GPU (per GPU instance under MIG) as the point attribute
    # process.pid, sorted and comma-separated ("1771,2042"; absent when none). It splits series
    # when the process set changes: false leaves it out.
    report_processes: bool = True
    # Backoff between retries of nvmlInit and re-probes of a lost GPU, doubling per failure:
    reconnect_initial_interval: Duration = field(default_factory=lambda: Duration(1))  # the first delay
    reconnect_max_interval: Duration = field(default_factory=lambda: Duration(60))  # the longest delay

    def validate(self) -> None:
        require(self.clock_sample_interval >= 0.1, "clock_sample_interval", "must be at least 100ms")
        require(self.collection_interval >= self.clock_sample_interval, "collection_interval",
                "must be at least clock_sample_interval")
        require(self.reconnect_initial_interval > 0, "reconnect_initial_interval", "must be positive")
        require(self.reconnect_max_interval >= self.reconnect_initial_interval, "reconnect_max_interval",
                "must be at least reconnect_initial_interval")
        require(all(i >= 0 for i in self.gpu_indices), "gpu_indices", "GPU indices are >= 0")


@dataclass
class _Target:
    """What one sample describes: the whole GPU, or one MIG GPU instance."""

    gpu_instance_id: int | None
    samples: list[Any]  # two allocated GPM samples, swapped each window
    previous: Any = None  # the GPM sample that opened the current window
    previous_ns: int = 0


@dataclass
class _Gpu:
    info: NvmlGpu
    targets: list[_Target]
    clocks: deque = field(default_factory=deque)  # (t_ns, MHz)
    lost: bool = False
    probe: Backoff | None = None

    @property
    def key(self) -> str:
        return self.info.uuid


class NvmlReceiver(PollingReceiver):
    def __init__(self, config: NvmlReceiverConfig, context: Context, consumer, *,
                 loader: nvml_api.NvmlLoader | None = None, clock: Clock | None = None):
        super().__init__(config, context, consumer)
        self._loader = loader
        self.clock = clock or SYSTEM_CLOCK
        self.status = status.StatusReporter(context.component_id, self.log, context.telemetry)
        self.api: Any = None
        self.gpus: list[_Gpu] = []
        self.backoff = Backoff(float(config.reconnect_initial_interval), float(config.reconnect_max_interval))
        self._window_start = 0.0  # monotonic
        self._last_status = -1e18

    def interval(self) -> float:
        return float(self.config.clock_sample_interval)

    def on_stop(self) -> None:
        self.close()

    # --- the loop ----------------------------------------------------------------------------

    def poll(self) -> Batch | None:
        """One clock tick: sample SM clocks; at the end of a window, read GPM and emit the samples."""
        now = self.clock.monotonic()
        if self.api is None:
            if self.backoff.ready(now):
                self._init(now)
            if self.api is None:
                return self._status_batch(now)
        for gpu in self.gpus:
            self._sample_clock(gpu, now)
        if now - self._window_start < float(self.config.collection_interval) - 1e-6:
            return None
        self._window_start = now
        batch = Batch()
        for gpu in self.gpus:
            batch.samples += self._close_window(gpu, now)
        self._update_state()
        batch.points = self.status.points(self.clock.time_ns())
        self._last_status = now
        return batch

    def _status_batch(self, now: float) -> Batch | None:
        if now - self._last_status < float(self.config.collection_interval) - 1e-6:
            return None
        self._last_status = now
        return Batch(points=self.status.points(self.clock.time_ns()))

    # --- init / shutdown -------------------------------------------------------------------------

    def _init(self, now: float) -> None:
        cfg = self.config
        try:
            api = (self._loader or nvml_api.get_loader())()
            try:
                api.nvmlInit()
            except api.NVMLError as exc:
                raise nvml_api.classify_init_error(api, exc) from None
        except NvmlError as exc:
            delay = self.backoff.failed(now)
            self.status.set(exc.state, f"{exc.message} (retrying, next in {delay:.0f}s)")
            return
        self.api = api
        self.backoff.succeeded()
        indices = list(cfg.gpu_indices) or list(range(int(api.nvmlDeviceGetCount())))
        t_ns = self.clock.time_ns()
        for index in indices:
            try:
                info = nvml_api.describe_gpu(api, index, mig=cfg.mig)
            except api.NVMLError as exc:
                error = nvml_api.classify_gpu_error(api, exc)
                self.status.set_gpu(f"index-{index}", error.state, error.message, {"gpu.index": str(index)})
                continue
            gpu = _Gpu(info, self._targets(info))
            self.gpus.append(gpu)
            if not info.gpm:
                self.status.set_gpu(gpu.key, "gpm_unsupported", info.gpm_reason, self._resource(gpu))
            else:
                self._open_windows(gpu, t_ns)
        self._window_start = now
        self._update_state()
        names = ", ".join(f"{g.info.index}: {g.info.name}" for g in self.gpus) or "none"
        self.log.info("%s: NVML %s; GPUs %s", self.context.component_id,
                      _optional_text(api, "nvmlSystemGetDriverVersion"), names)

    def _targets(self, info: NvmlGpu) -> list[_Target]:
        if not info.gpm:
            return [_Target(None, [])]
        ids = [m.gpu_instance_id for m in info.mig] or [None]
        return [_Target(gi, [self.api.nvmlGpmSampleAlloc(), self.api.nvmlGpmSampleAlloc()]) for gi in ids]

    def close(self) -> None:
        if self.api is None:
            return
        for gpu in self.gpus:
            for target in gpu.targets:
                for sample in target.samples:
                    _quietly(self.api, self.api.nvmlGpmSampleFree, sample)
        _quietly(self.api, self.api.nvmlShutdown)
        self.api, self.gpus = None, []

    # --- per GPU ---------------------------------------------------------------------------------

    def _sample_clock(self, gpu: _Gpu, now: float) -> None:
        if gpu.lost:
            self._reprobe(gpu, now)
            return
        try:
            mhz = self.api.nvmlDeviceGetClockInfo(gpu.info.handle, self.api.NVML_CLOCK_SM)
        except self.api.NVMLError as exc:
            self._gpu_failed(gpu, exc, now)
            return
        t_ns = self.clock.time_ns()
        gpu.clocks.append((t_ns, mhz))
        keep_ns = 3 * float(self.config.collection_interval) * 1e9
        while gpu.clocks and gpu.clocks[0][0] < t_ns - keep_ns:
            gpu.clocks.popleft()

    def _open_windows(self, gpu: _Gpu, t_ns: int) -> None:
        for target in gpu.targets:
            target.previous = self._gpm_sample(gpu, target, target.samples[0])
            target.previous_ns = t_ns

    def _gpm_sample(self, gpu: _Gpu, target: _Target, sample: Any) -> Any:
        if target.gpu_instance_id is None:
            return self.api.nvmlGpmSampleGet(gpu.info.handle, sample)
        return self.api.nvmlGpmMigSampleGet(gpu.info.handle, target.gpu_instance_id, sample)

    def _close_window(self, gpu: _Gpu, now: float) -> list[GpuSample]:
        if gpu.lost:
            return []
        api = self.api
        t_ns = self.clock.time_ns()
        try:
            reasons = nvml_api.clock_event_reasons(api, gpu.info.handle)
            power_mw = _optional_call(api, api.nvmlDeviceGetPowerUsage, gpu.info.handle)
            device = _Device(nvml_api.total_energy_mj(api, gpu.info.handle),
                             nvml_api.clock_event_ns(api, gpu.info.handle))
            processes = nvml_api.running_processes(api, gpu.info.handle) if self.config.report_processes else []
            out = []
            for target in gpu.targets:
                sample = self._window_sample(gpu, target, t_ns, reasons, power_mw, processes, device)
                if sample is not None:
                    out.append(sample)
        except api.NVMLError as exc:
            self._gpu_failed(gpu, exc, now)
            return []
        if gpu.info.gpm and self.status.gpu_state(gpu.key) != status.OK:
            self.status.set_gpu(gpu.key, status.OK)
        return out

    def _window_sample(self, gpu: _Gpu, target: _Target, t_ns: int, reasons: object, power_mw: object,
                       processes: list[Any], device: _Device | None = None) -> GpuSample | None:
        api = self.api
        start = t_ns - int(float(self.config.collection_interval) * 1e9)
        tpa: object = status.TPA_NOT_SUPPORTED
        sm_util: object = None
        gr_util: object = None
        dram_util: object = None
        traffic: dict[str, object] = {}
        if gpu.info.gpm:
            if target.previous is None:  # re-opened after a lost GPU came back
                self._open_windows(gpu, t_ns)
                return None
            spare = target.samples[1] if target.previous is target.samples[0] else target.samples[0]
            current = self._gpm_sample(gpu, target, spare)
            rates = {getattr(api, metric): name for metric, name in _TRAFFIC_METRICS}
            metrics = nvml_api.gpm_metrics(api, target.previous, current, (
                api.NVML_GPM_METRIC_ANY_TENSOR_UTIL, api.NVML_GPM_METRIC_SM_UTIL, api.NVML_GPM_METRIC_GRAPHICS_UTIL,
                api.NVML_GPM_METRIC_DRAM_BW_UTIL, *rates))
            traffic = {name: value * _MIB for metric, name in rates.items()
                       if (value := metrics[metric][0]) is not None}
            tpa = _ratio(api, *metrics[api.NVML_GPM_METRIC_ANY_TENSOR_UTIL])
            sm_util = _ratio(api, *metrics[api.NVML_GPM_METRIC_SM_UTIL])
            gr_util = _ratio(api, *metrics[api.NVML_GPM_METRIC_GRAPHICS_UTIL])
            dram_util = _ratio(api, *metrics[api.NVML_GPM_METRIC_DRAM_BW_UTIL])
            start = target.previous_ns
            target.previous, target.previous_ns = current, t_ns
        clock, count = mean_clock(gpu.clocks, start, t_ns)
        resource: dict[str, object] = {}
        attributes: dict[str, object] = {}
        if target.gpu_instance_id is not None:
            mig = next(m for m in gpu.info.mig if m.gpu_instance_id == target.gpu_instance_id)
            resource.update({GPU_MIG_INSTANCE: str(mig.gpu_instance_id), "gpu.mig.uuid": mig.uuid})
            if mig.slices:
                resource[GPU_MIG_SLICES] = str(mig.slices)
            processes = [p for p in processes if getattr(p, "gpuInstanceId", None) == target.gpu_instance_id]
        pids = sorted({int(p.pid) for p in processes})
        if pids:
            attributes[PROCESS_PID] = ",".join(map(str, pids))
        return GpuSample(
            time_unix_nano=t_ns, window_s=(t_ns - start) / 1e9, host=self.status.host, gpu_index=gpu.info.index,
            uuid=gpu.info.uuid, model=gpu.info.name, tensor_active=tpa, sm_clock_mhz=clock, sm_clock_samples=count,
            max_sm_clock_mhz=gpu.info.max_clock_mhz,
            power_w=power_mw / 1000.0 if isinstance(power_mw, (int, float)) and target.gpu_instance_id is None
            else None,
            clock_event_reasons=reasons, sm_active=sm_util, gr_active=gr_util, dram_active=dram_util, source=SOURCE,
            resource=resource, attributes=attributes,
            # The whole GPU's energy (an instance has none of its own, as with power); the clock's event
            # time is its GPU's, as the clock is.
            energy_mj=device.energy_mj if device is not None and target.gpu_instance_id is None else None,
            clock_event_ns=dict(device.clock_event_ns) if device is not None and device.clock_event_ns else None,
            **traffic,
        )

    def _gpu_failed(self, gpu: _Gpu, exc: BaseException, now: float) -> None:
        error = nvml_api.classify_gpu_error(self.api, exc)
        if error.state == "gpu_lost":
            gpu.lost = True
            gpu.probe = gpu.probe or Backoff(float(self.config.reconnect_initial_interval),
                                             float(self.config.reconnect_max_interval))
            gpu.probe.failed(now)
            for target in gpu.targets:
                target.previous = None
        self.status.set_gpu(gpu.key, error.state, error.message, self._resource(gpu))

    def _reprobe(self, gpu: _Gpu, now: float) -> None:
        assert gpu.probe is not None
        if not gpu.probe.ready(now):
            return
        try:
            self.api.nvmlDeviceGetClockInfo(gpu.info.handle, self.api.NVML_CLOCK_SM)
        except self.api.NVMLError:
            gpu.probe.failed(now)
            return
        gpu.lost = False
        gpu.probe.succeeded()
        gpu.clocks.clear()
        self.status.set_gpu(gpu.key, status.OK, "answers again; its next window starts now")

    # --- state ---------------------------------------------------------------------------------------

    def _update_state(self) -> None:
        if not self.gpus:
            self.status.set("no_gpus", "NVML sees no GPU" + (f" among gpu_indices {self.config.gpu_indices}"
                            if self.config.gpu_indices else "") + " (nvidia-smi -L lists them)")
        elif not any(g.info.gpm for g in self.gpus):
            names = "; ".join(g.info.gpm_reason for g in self.gpus[:3])
            self.status.set("gpm_unsupported", f"no GPU here supports NVML GPM: {names}")
        elif all(g.lost for g in self.gpus):
            self.status.set("gpu_lost", nvml_api.GPU_LOST_MESSAGE)
        else:
            usable = sum(1 for g in self.gpus if g.info.gpm and not g.lost)
            self.status.set(status.OK, f"reading GPM on {usable} of {len(self.gpus)} GPU(s)")

    def _resource(self, gpu: _Gpu) -> dict[str, object]:
        return {"hw.id": gpu.info.uuid, "gpu.index": str(gpu.info.index), "hw.model": gpu.info.name}


@dataclass(frozen=True, slots=True)
class _Device:
    """What a window reads once per GPU for its samples: the energy counter and the clock event time per reason."""

    energy_mj: object
    clock_event_ns: dict[str, int] | None


# GPM's interconnect metrics (MiB/s, nvml.h) -> the GpuSample attribute each fills, in bytes per second.
_TRAFFIC_METRICS = (
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", "pcie_tx_bytes_per_s"),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", "pcie_rx_bytes_per_s"),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "nvlink_tx_bytes_per_s"),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "nvlink_rx_bytes_per_s"),
)
_MIB = 1 << 20


def _ratio(api: Any, value: float | None, ret: int) -> object:
    """A GPM percent as a 0..1 ratio; when NVML has no value, the reason (never 0)."""
    if value is not None:
        return rescale(value, 0.01)  # NaN or a negative reading stays as read, for clean() to name
    if ret == api.NVML_ERROR_NOT_SUPPORTED:
        return status.TPA_NOT_SUPPORTED
    if ret == api.NVML_ERROR_NO_PERMISSION:
        return status.TPA_NOT_PERMISSIONED
    return status.TPA_BLANK


def _optional_call(api: Any, call, *args: Any) -> object:
    try:
        return call(*args)
    except api.NVMLError as exc:
        if nvml_api.error_code(api, exc) == api.NVML_ERROR_GPU_IS_LOST:
            raise
        return None


def _optional_text(api: Any, name: str) -> str:
    try:
        return f"driver {getattr(api, name)()}"
    except Exception:  # older bindings or a driver that will not say
        return "driver version unknown"


def _quietly(api: Any, call, *args: Any) -> None:
    try:
        call(*args)
    except Exception:  # cleanup on a GPU or library that may be gone
        pass


FACTORY = Factory(SOURCE, NvmlReceiverConfig, NvmlReceiver, "NVML GPM tensor activity (Hopper and newer, no DCGM)",
                  output="samples")
