"""GPU UUID -> pids of its compute processes, from NVML (``pid_sources: [nvml]``).

For when the data does not come from a receiver that reports ``process.pid`` (a dcgm-exporter
scrape, the dcgm receiver). NVML reports host pids: run with the host's pid namespace or point
``proc_root`` at the host's /proc. MIG devices' processes are not listed (NVML reports them
per MIG handle); use the kubelet source for MIG.
"""

from __future__ import annotations

from typing import Any


class NvmlPids:
    """Callable provider; NVML is initialised on first use and shut down by ``close``."""

    def __init__(self, nvml: Any = None):
        self._nvml = nvml
        self._ready = False

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
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
            except nv.NVMLError:
                continue
            out[uuid.lower()] = sorted({int(p.pid) for p in procs})
        return out

    def close(self) -> None:
        if self._ready:
            try:
                self._nvml.nvmlShutdown()
            finally:
                self._ready = False
