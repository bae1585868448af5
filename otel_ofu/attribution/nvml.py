"""GPU UUID -> pids of its compute processes, and each one's SM utilization, from NVML
(``pid_sources: [nvml]``).

For when the data does not come from a receiver that reports ``process.pid`` (a dcgm-exporter
scrape, the dcgm receiver). NVML reports host pids: run with the host's pid namespace or point
``proc_root`` at the host's /proc. MIG devices' processes are not listed (NVML reports them
per MIG handle); use the kubelet source for MIG.

:meth:`NvmlPids.utilization` is what splits a GPU several jobs share by their use:
``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)`` gives one sample per process
that had non-zero utilization in each of the driver's sampling periods since that CPU timestamp
(microseconds), with its SM share in percent, and NVML_ERROR_NOT_FOUND when there is none (no
process used the GPU since); the same call dcgm-exporter makes for its per-process metrics
(NVIDIA/dcgm-exporter#594, internal/pkg/nvmlprovider/provider.go GetDeviceProcessUtilization).
"""

from __future__ import annotations

from typing import Any


class NvmlPids:
    """Callable provider; NVML is initialised on first use and shut down by ``close``."""

    def __init__(self, nvml: Any = None):
        self._nvml = nvml
        self._ready = False
        self._handles: dict[str, Any] = {}  # GPU uuid (lower case) -> its handle, from the last listing
        self._seen: dict[str, int] = {}  # GPU uuid -> the newest sample's timestamp (us) read

    def __call__(self) -> dict[str, list[int]]:
        if self._nvml is None:
            import pynvml  # nvidia-ml-py; only when this source is configured

            self._nvml = pynvml
        nv = self._nvml
        if not self._ready:
            nv.nvmlInit()
            self._ready = True
        out: dict[str, list[int]] = {}
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = nv.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            self._handles[uuid.lower()] = handle
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
            except nv.NVMLError:
                continue
            out[uuid.lower()] = sorted({int(p.pid) for p in procs})
        return out

    def utilization(self) -> dict[str, dict[int, float]]:
        """GPU uuid -> {pid: its mean SM utilization (percent) over NVML's samples since the last call}, for
        the GPUs the last :meth:`__call__` listed; {} for a GPU no process used; a GPU whose NVML gives no
        per-process utilization (NOT_SUPPORTED, another error) is left out: nothing is known of it."""
        nv = self._nvml
        out: dict[str, dict[int, float]] = {}
        for uuid, handle in self._handles.items():
            try:
                samples = nv.nvmlDeviceGetProcessUtilization(handle, self._seen.get(uuid, 0))
            except nv.NVMLError as exc:
                if exc.value == nv.NVML_ERROR_NOT_FOUND:  # no process used the GPU since the last samples
                    out[uuid] = {}
                continue
            per_pid: dict[int, list[float]] = {}
            for sample in samples:
                per_pid.setdefault(int(sample.pid), []).append(float(sample.smUtil))
                self._seen[uuid] = max(self._seen.get(uuid, 0), int(sample.timeStamp))
            out[uuid] = {pid: sum(values) / len(values) for pid, values in per_pid.items()}
        return out

    def close(self) -> None:
        if self._ready:
            try:
                self._nvml.nvmlShutdown()
            finally:
                self._ready = False
