"""A training process's own identity, as its OpenTelemetry resource gives it, as a claim.

A job reports its MFU from its training processes (any rank), not from its GPUs. Their
resource names them the way OpenTelemetry SDKs do: on Kubernetes ``k8s.pod.name`` and
``k8s.namespace.name`` (downward API), on Slurm ``slurm.job.id`` (``SLURM_JOB_ID``),
elsewhere ``host.name`` and ``process.pid``. The attribution processor turns that into the
same claim a GPU of the job gets, so both end up with one ``ofu.job.id`` (docs/audit.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_ofu.attribution import (
    K8S_NAMESPACE,
    K8S_POD_LABEL_PREFIX,
    K8S_POD_NAME,
    K8S_POD_UID,
    PROCESS_PID,
    SLURM_JOB_ID,
)
from otel_ofu.attribution.claims import Claim, k8s_key

REPORT_SOURCE = "report"  # ofu.job.source of a report named from its own resource


def resource_claim(resource: Mapping[str, Any]) -> Claim | None:
    """The pod or Slurm job a report's resource names, or None (then only its pid may tell).

    A pod wins over a Slurm id: Slurm inside Kubernetes pods (Slinky) names the pod's job too,
    and the pod is what the GPU's other sources name.
    """
    k8s = {k: str(v) for k, v in resource.items()
           if v not in (None, "") and (k in (K8S_NAMESPACE, K8S_POD_NAME, K8S_POD_UID)
                                      or k.startswith(K8S_POD_LABEL_PREFIX))}
    key = k8s_key(k8s)
    if key:
        return Claim(key, REPORT_SOURCE, k8s)
    slurm = resource.get(SLURM_JOB_ID)
    if slurm not in (None, ""):
        return Claim(("slurm", str(slurm).strip()), REPORT_SOURCE, {SLURM_JOB_ID: str(slurm).strip()})
    return None


def resource_pid(resource: Mapping[str, Any]) -> int | None:
    """``process.pid`` as a positive int, or None."""
    try:
        pid = int(resource.get(PROCESS_PID))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return pid if pid > 0 else None
