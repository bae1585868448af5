"""The ``process`` and ``slurm`` source: a GPU's processes, through /proc.

Pids per GPU come from ``process.pid`` on the samples (the nvml receiver reports each GPU's
compute processes) and/or from NVML here (``pid_sources: [nvml]``). Each pid's cgroup names its
pod (UID) or Slurm job, its environment the Slurm job's details and the precision it declares
(:mod:`otel_ofu.attribution.procfs`, :mod:`otel_ofu.attribution.slurm`). A process that names no
job may still declare a precision: that goes on the device, not on a job.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

from otel_ofu.attribution import K8S_POD_UID, PROCESS_PID, SLURM_JOB_ID
from otel_ofu.attribution.claims import Claim
from otel_ofu.attribution.config import ProcessSourceConfig
from otel_ofu.attribution.procfs import ProcessInfo, parse_pids, read_process
from otel_ofu.attribution.slurm import ENV_KEYS, slurm_attributes
from otel_ofu.attribution.sources import Device, Polled, Source
from otel_ofu.core import specs
from otel_ofu.core.model import GpuKey

PidProvider = Callable[[], dict[str, list[int]]]
MAX_LOCAL_HOSTS = 64  # host names of this machine learnt from its samples


class ProcessSource(Source):
    name = "process"

    def __init__(self, config: ProcessSourceConfig, precision_env: str, *, provider: PidProvider | None,
                 polled: Polled, used: Polled, clock: Callable[[], float]):
        self.config = config
        self.precision_env = precision_env
        # GPU uuid -> [pids]; a test's seam, else NVML when configured. One with a ``utilization()`` (NvmlPids)
        # also gives each pid's SM utilization.
        self.provider = provider
        self._nvml: Any = None
        self._clock = clock
        self._provider_pids = polled  # uuid -> [pid]
        self._provider_use = used  # uuid -> {pid: SM utilization, percent}
        self._lock = threading.Lock()  # guards _sample_pids and _procs
        self._sample_pids: dict[GpuKey, tuple[list[int], float]] = {}  # by GPU: dmon/CSV GPUs have no UUID
        self._procs: dict[int, ProcessInfo | None] = {}
        self._env_keys = (*ENV_KEYS, precision_env)
        # Hosts whose /proc this source reads: a report's process.pid is looked up only there.
        self.local_hosts = {socket.gethostname()}

    # --- background ---------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Ask the pid provider, then re-read every pid some GPU still has: exited processes drop out."""
        provider = self.provider
        if provider is None and "nvml" in self.config.pid_sources:
            from otel_ofu.attribution.nvml import NvmlPids

            provider = self._nvml = self._nvml or NvmlPids()
        if provider is not None:
            self._provider_pids.poll(lambda: {str(k).strip().lower(): list(v) for k, v in provider().items()})
            utilization = getattr(provider, "utilization", None)
            if utilization is not None and self.config.utilization:
                self._provider_use.poll(lambda: {str(k).strip().lower(): dict(v) for k, v in utilization().items()})
        now = self._clock()
        with self._lock:
            ttl = self.config.pid_ttl
            self._sample_pids = {u: e for u, e in self._sample_pids.items() if now - e[1] <= ttl}
            wanted = {pid for pids, _ in self._sample_pids.values() for pid in pids}
        wanted |= {pid for pids in self._provider_pids.value.values() for pid in pids}
        fresh = {pid: read_process(self.config.proc_root, pid, self._env_keys) for pid in sorted(wanted)}
        with self._lock:
            self._procs = fresh

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()

    def version(self) -> int | None:
        """None while enabled: a device's pids are the window's (and remembered pid_ttl on the clock), and
        a pid's /proc is read on first sight. Off, it answers nothing: always the same."""
        return None if self.config.enabled else 0

    # --- hot path -------------------------------------------------------------------------------------

    def take_pids(self, device: Device) -> None:
        """The device's pids (``process.pid`` on the sample, remembered pid_ttl, and the provider's); the
        attribute leaves the sample unless keep_pid_attribute (pids on points multiply series)."""
        raw = device.attributes.get(PROCESS_PID, device.resource.get(PROCESS_PID))
        if not self.config.keep_pid_attribute:
            device.attributes.pop(PROCESS_PID, None)
            device.resource.pop(PROCESS_PID, None)
        if not self.config.enabled:
            return
        now = self._clock()
        reported = parse_pids(raw) if "samples" in self.config.pid_sources else None
        with self._lock:
            if reported is not None:
                self._sample_pids[device.key] = (reported, now)
                pids = set(reported)
            else:
                entry = self._sample_pids.get(device.key)
                pids = set(entry[0]) if entry and now - entry[1] <= self.config.pid_ttl else set()
        pids.update(self._provider_pids.value.get(device.uuid, ()))
        device.pids = sorted(pids)
        if len(self.local_hosts) < MAX_LOCAL_HOSTS:
            self.local_hosts.add(str(device.host))

    def process(self, pid: int) -> ProcessInfo | None:
        """A pid's cgroup and environment: the last refresh's read, or read now on first sight."""
        with self._lock:
            if pid in self._procs:
                return self._procs[pid]
        info = read_process(self.config.proc_root, pid, self._env_keys)  # first sight: one small read
        with self._lock:
            self._procs[pid] = info
        return info

    def claims(self, device: Device) -> list[Claim]:
        """Each process's pod or Slurm job, with the process's SM use where NVML measured the GPU's (a GPU,
        not a MIG instance: NVML gives no per-process utilization of those)."""
        claims: list[Claim] = []
        used = None if device.mig else self._provider_use.value.get(device.uuid)
        for pid in device.pids:
            info = self.process(pid)
            if info is None:
                continue
            precision = specs.normalize_precision(info.environ.get(self.precision_env))
            precisions = {precision} if precision != specs.UNKNOWN_PRECISION else set()
            claim = process_claim(info, precisions)
            if claim is not None:
                if used is not None:
                    claim.use = used.get(pid, 0.0)  # NVML lists only processes that used it
                claims.append(claim)
            else:
                device.precisions |= precisions
        if used is not None and claims:
            device.measured = True
        return claims

    def claim_of(self, pid: int) -> Claim | None:
        """The Slurm job or pod of one process of this node (a report's sender)."""
        info = self.process(pid)
        return process_claim(info, set()) if info is not None else None


def process_claim(info: ProcessInfo, precisions: set[str]) -> Claim | None:
    """The Slurm job (cgroup, environment) or the pod (cgroup UID) a process belongs to; None if neither."""
    slurm = slurm_attributes(info)
    if slurm:
        return Claim(("slurm", slurm[SLURM_JOB_ID]), "slurm", slurm, precisions)
    if info.cgroup.pod_uid:
        return Claim(("k8s-uid", info.cgroup.pod_uid), "process", {K8S_POD_UID: info.cgroup.pod_uid}, precisions)
    return None
