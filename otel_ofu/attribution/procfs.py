"""GPU processes -> jobs through /proc: the cgroup path names the pod or Slurm job, the
environment names the Slurm job's details and the precision the job declared.

Handles cgroup v1 and v2 with the cgroupfs and systemd drivers::

    12:devices:/kubepods/burstable/pod<uid>/<container id>                            (v1, cgroupfs)
    0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/
        cri-containerd-<container id>.scope                                           (v2, systemd)
    4:memory:/slurm/uid_1000/job_4242/step_0/task_0                                   (v1, Slurm)
    0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0                     (v2, Slurm)

Only the environment variables asked for are kept in memory: environments hold secrets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_ID = re.compile(r"(?:^|[-/])([0-9a-f]{64})(?:\.scope)?$")
_SLURM_JOB = re.compile(r"/job_(\d+)(?:/|$)")
_SLURM_UID = re.compile(r"/uid_(\d+)(?:/|$)")
_SLURM_STEP = re.compile(r"/step_([A-Za-z0-9_]+)(?:/|$)")


@dataclass(frozen=True)
class CgroupInfo:
    pod_uid: str | None = None
    container_id: str | None = None
    slurm_job_id: str | None = None
    slurm_uid: str | None = None
    slurm_step: str | None = None


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    cgroup: CgroupInfo = field(default_factory=CgroupInfo)
    environ: dict[str, str] = field(default_factory=dict)  # only the keys asked for


def parse_cgroup(text: str) -> CgroupInfo:
    """The pod / container / Slurm job named by any hierarchy in a /proc/PID/cgroup file."""
    pod_uid = container_id = job = uid = step = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2].strip()
        if "kubepods" in path:
            if pod_uid is None and (m := _POD_UID.search(path)):
                pod_uid = m.group(1).replace("_", "-")
            if container_id is None and (m := _CONTAINER_ID.search(path)):
                container_id = m.group(1)
        if "slurm" in path:
            if job is None and (m := _SLURM_JOB.search(path)):
                job = m.group(1)
            if uid is None and (m := _SLURM_UID.search(path)):
                uid = m.group(1)
            if step is None and (m := _SLURM_STEP.search(path)):
                step = m.group(1)
    return CgroupInfo(pod_uid, container_id, job, uid, step)


def parse_environ(data: bytes, keys: Iterable[str]) -> dict[str, str]:
    wanted = set(keys)
    out: dict[str, str] = {}
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            key = name.decode("utf-8", "replace")
            if key in wanted:
                out[key] = value.decode("utf-8", "replace")
    return out


def read_process(proc_root: str | Path, pid: int, env_keys: Iterable[str]) -> ProcessInfo | None:
    """The process's cgroup and selected environment; None when the process is gone.

    An unreadable environment (another user's process without CAP_SYS_PTRACE) leaves the
    cgroup, which still names the pod or Slurm job.
    """
    base = Path(proc_root) / str(pid)
    try:
        cgroup = parse_cgroup((base / "cgroup").read_text(errors="replace"))
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    except OSError:
        cgroup = CgroupInfo()
        if not base.exists():
            return None
    try:
        environ = parse_environ((base / "environ").read_bytes(), env_keys)
    except OSError:
        environ = {}
    return ProcessInfo(pid, cgroup, environ)


def parse_pids(value: object) -> list[int] | None:
    """``process.pid`` as an nvml receiver may write it: int, "12,34", or a list; None if absent."""
    if value is None:
        return None
    items = value if isinstance(value, (list, tuple, set, frozenset)) else str(value).replace(";", ",").split(",")
    out = []
    for item in items:
        try:
            pid = int(str(item).strip())
        except ValueError:
            continue
        if pid > 0:
            out.append(pid)
    return out
