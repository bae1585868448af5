"""Job attribution: who holds each GPU (Kubernetes pod, Slurm job, a config rule) and in
which precision. Each source is a module of :mod:`otel_ofu.attribution.sources` behind one
interface; :mod:`otel_ofu.attribution.resolver` merges them by precedence; the ``attribution``
processor (otel_ofu.processors.attribution) runs them. docs/components/processors/attribution.md is
the user-facing description.
"""

from __future__ import annotations

from otel_ofu.core.model import JOB_KIND, JOB_RUN, JOB_SHARED, JOB_SOURCE

__all__ = ["JOB_KIND", "JOB_RUN", "JOB_SHARED", "JOB_SOURCE"]

# Resource attributes (OpenTelemetry semantic-convention names for Kubernetes and processes).
K8S_POD_NAME = "k8s.pod.name"
K8S_POD_UID = "k8s.pod.uid"
K8S_NAMESPACE = "k8s.namespace.name"
K8S_CONTAINER = "k8s.container.name"
K8S_POD_LABEL_PREFIX = "k8s.pod.label."
K8S_POD_ANNOTATION_PREFIX = "k8s.pod.annotation."
PROCESS_PID = "process.pid"

# DRA (dcgm-exporter's dra_* labels, set by otel_ofu.core.dcgm_fields.identity_from_labels): the
# ResourceClaim holding the GPU, and the device's driver, pool and name.
K8S_RESOURCECLAIM_NAME = "k8s.resourceclaim.name"
K8S_RESOURCECLAIM_NAMESPACE = "k8s.resourceclaim.namespace"
DRA_MIG_PROFILE = "dra.mig.profile"

# Slurm has no semantic convention: every Slurm attribute lives under ``slurm.job.``.
SLURM_JOB_ID = "slurm.job.id"
SLURM_JOB_USER = "slurm.job.user"
SLURM_JOB_ACCOUNT = "slurm.job.account"
SLURM_JOB_PARTITION = "slurm.job.partition"
SLURM_JOB_NAME = "slurm.job.name"

# dcgm-exporter's hpc_job label (set by otel_ofu.core.dcgm_fields.identity_from_labels).
HPC_JOB_ID = "hpc.job.id"


def slurm_job_id(job: str) -> str:
    """The ofu.job.id of Slurm job ``job`` named by its processes or a report's slurm.job.id.

    dcgm-exporter's hpc_job label names a job as given (``4242``): where a GPU knows its job
    only that way, the same Slurm job's reports (``slurm:4242``) join it (the jobs tier too).
    """
    return f"slurm:{job}"

# JOB_SHARED and JOB_SOURCE, set by this package next to ofu.job.id, live with it in the core model.

# Attributes that name one job (not a bounded set such as a namespace or a partition): an
# overflowed job loses them, or the series count would not be bounded.
PER_JOB_ATTRIBUTES = (K8S_POD_NAME, K8S_POD_UID, K8S_CONTAINER, SLURM_JOB_ID, SLURM_JOB_NAME, HPC_JOB_ID, JOB_RUN,
                      K8S_RESOURCECLAIM_NAME)
