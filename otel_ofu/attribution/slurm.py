"""Slurm job attributes from a GPU process's environment, with its cgroup path as fallback
(the environment of another user's process is unreadable without privileges)."""

from __future__ import annotations

from otel_ofu.attribution import (
    SLURM_JOB_ACCOUNT,
    SLURM_JOB_ID,
    SLURM_JOB_NAME,
    SLURM_JOB_PARTITION,
    SLURM_JOB_USER,
)
from otel_ofu.attribution.procfs import ProcessInfo

# Environment variable -> attribute. SLURM_JOBID is the old spelling of SLURM_JOB_ID.
ENV_ATTRIBUTES = {
    "SLURM_JOB_ID": SLURM_JOB_ID,
    "SLURM_JOBID": SLURM_JOB_ID,
    "SLURM_JOB_USER": SLURM_JOB_USER,
    "SLURM_JOB_ACCOUNT": SLURM_JOB_ACCOUNT,
    "SLURM_JOB_PARTITION": SLURM_JOB_PARTITION,
    "SLURM_JOB_NAME": SLURM_JOB_NAME,
}
ENV_KEYS = tuple(ENV_ATTRIBUTES)


def slurm_attributes(process: ProcessInfo) -> dict[str, str]:
    """``slurm.job.*`` attributes of a process; empty when it is not in a Slurm job."""
    out: dict[str, str] = {}
    for env, attribute in ENV_ATTRIBUTES.items():
        value = process.environ.get(env)
        if value:
            out.setdefault(attribute, value)
    # The cgroup is the kernel's word, the environment the user's (it can be inherited from
    # another job): when they disagree, keep the cgroup's job id and none of the environment.
    cgroup_job = process.cgroup.slurm_job_id
    if cgroup_job and out.get(SLURM_JOB_ID) != cgroup_job:
        out = {SLURM_JOB_ID: cgroup_job}
    return out if SLURM_JOB_ID in out else {}
