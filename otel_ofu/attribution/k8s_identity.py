"""Which job a Kubernetes pod belongs to: pure rules on the pod object (a dict as the API sends it).

All pods of one training job must get one ``ofu.job.id`` (a 16-pod PyTorchJob is one job
holding 128 GPUs, not 16 jobs). Rules, first that applies:

1. the configured label (``k8s_job_label``);
2. the labels the workload controllers put on their pods, each naming the top-level job
   (docs/kubernetes-attribution.md lists them with the source they were read from);
3. the owning controller, through the pod's controller owner reference: a ReplicaSet whose
   name is ``<deployment>-<pod-template-hash>`` is the Deployment (no API call); other owners
   are read from the API only for the kinds listed in ``owner_lookups`` (``lookup``);
4. the batch Job labels (``batch.kubernetes.io/job-name``, ``job-name``) on a pod without owner;
5. the pod itself.

The job id is ``k8s:<namespace>/<job name>``, the form ``k8s_job_label`` always gave, so a
configured ``batch.kubernetes.io/job-name`` and the built-in Job rule name a Job the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# Kubernetes (k8s.io/api batch/v1 and apps/v1 types.go).
BATCH_JOB_NAME = "batch.kubernetes.io/job-name"
LEGACY_JOB_NAME = "job-name"
POD_TEMPLATE_HASH = "pod-template-hash"
# Kubeflow Trainer v2 (kubeflow/trainer pkg/constants): a TrainJob runs as a JobSet of its name.
TRAINJOB_NAME = "trainer.kubeflow.org/trainjob-name"
# JobSet (kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go, JobSetNameKey).
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
# Kubeflow training-operator v1 / mpi-operator v2 (kubeflow/common pkg/apis/common/v1/constants.go).
KUBEFLOW_JOB_NAME = "training.kubeflow.org/job-name"
# Older Kubeflow operators: unprefixed job-name with group-name=kubeflow.org (training-operator
# before the prefixed labels), and the per-framework labels of pytorch-operator, tf-operator
# and mpi-operator v1.
KUBEFLOW_GROUP_NAME = "group-name"
KUBEFLOW_GROUP = "kubeflow.org"
LEGACY_KUBEFLOW_LABELS = {"pytorch-job-name": "PyTorchJob", "tf-job-name": "TFJob", "mpi-job-name": "MPIJob"}
# LeaderWorkerSet (kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go, SetNameLabelKey).
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
# Volcano (volcano-sh/apis pkg/apis/batch/v1alpha1/labels.go, JobNameKey).
VOLCANO_JOB_NAME = "volcano.sh/job-name"
# KubeRay (ray-project/kuberay ray-operator/controllers/ray/utils/constant.go): the root custom
# resource (RayJob, RayService) of what KubeRay created.
RAY_ORIGIN_NAME = "ray.io/originated-from-cr-name"
RAY_ORIGIN_KIND = "ray.io/originated-from-crd"
RAY_ROOT_KINDS = frozenset({"RayJob", "RayService"})

MAX_OWNER_DEPTH = 5  # owner chains are short (Pod -> RayCluster -> RayJob); a loop must not hang us


@dataclass(frozen=True, slots=True)
class PodJob:
    """The job a pod belongs to: its workload kind and name, and the rule that said so."""

    kind: str  # "PyTorchJob", "JobSet", "Deployment", "Pod", ...; "" for the configured label
    name: str
    rule: str  # e.g. "label training.kubeflow.org/job-name", "owner ReplicaSet->Deployment", "pod"


# (namespace, owner reference) -> the owner's own controller reference, or None when it has
# none or cannot be read. Supplied by the API source for the kinds in ``owner_lookups``.
OwnerLookup = Callable[[str, Mapping[str, Any]], Mapping[str, Any] | None]


def job_id(namespace: str, job: PodJob) -> str:
    return f"k8s:{namespace}/{job.name}"


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference marked ``controller: true`` (at most one per object)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") and ref.get("name"):
            return ref
    return None


def api_group(api_version: str) -> str:
    """``apps/v1`` -> ``apps``; ``v1`` (the core group) -> ``""``."""
    return api_version.rpartition("/")[0]


def job_identity(pod: Mapping[str, Any], job_label: str = "", lookup: OwnerLookup | None = None) -> PodJob:
    """The job of one pod (see the module docstring for the rules and their order)."""
    meta = pod.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    name = str(meta.get("name") or "")
    if job_label and labels.get(job_label):
        return PodJob("", labels[job_label], f"label {job_label}")
    found = _well_known(pod, labels)
    if found is not None:
        return found
    found = _owner_chain(pod, labels, str(meta.get("namespace") or ""), lookup)
    if found is not None:
        return found
    for label in (BATCH_JOB_NAME, LEGACY_JOB_NAME):
        if labels.get(label):
            return PodJob("Job", labels[label], f"label {label}")
    return PodJob("Pod", name, "pod")


def _owner_kind(pod: Mapping[str, Any], group: str, default: str) -> str:
    owner = controller_of(pod)
    if owner is not None and api_group(str(owner.get("apiVersion", ""))) == group:
        return str(owner["kind"])
    return default


def _well_known(pod: Mapping[str, Any], labels: Mapping[str, str]) -> PodJob | None:
    """The workload controllers' own labels naming the top-level job (no API call)."""
    if labels.get(TRAINJOB_NAME):
        return PodJob("TrainJob", labels[TRAINJOB_NAME], f"label {TRAINJOB_NAME}")
    if labels.get(JOBSET_NAME):  # before the batch Job labels: a JobSet's pods belong to its child Jobs
        return PodJob("JobSet", labels[JOBSET_NAME], f"label {JOBSET_NAME}")
    if labels.get(KUBEFLOW_JOB_NAME):
        return PodJob(_owner_kind(pod, KUBEFLOW_GROUP, "KubeflowJob"), labels[KUBEFLOW_JOB_NAME],
                      f"label {KUBEFLOW_JOB_NAME}")
    for label, kind in LEGACY_KUBEFLOW_LABELS.items():
        if labels.get(label):
            return PodJob(kind, labels[label], f"label {label}")
    if labels.get(KUBEFLOW_GROUP_NAME) == KUBEFLOW_GROUP and labels.get(LEGACY_JOB_NAME):
        return PodJob(_owner_kind(pod, KUBEFLOW_GROUP, "KubeflowJob"), labels[LEGACY_JOB_NAME],
                      f"label {LEGACY_JOB_NAME} (group-name {KUBEFLOW_GROUP})")
    if labels.get(LWS_NAME):
        return PodJob("LeaderWorkerSet", labels[LWS_NAME], f"label {LWS_NAME}")
    if labels.get(VOLCANO_JOB_NAME):
        return PodJob("VolcanoJob", labels[VOLCANO_JOB_NAME], f"label {VOLCANO_JOB_NAME}")
    if labels.get(RAY_ORIGIN_NAME) and labels.get(RAY_ORIGIN_KIND) in RAY_ROOT_KINDS:
        return PodJob(labels[RAY_ORIGIN_KIND], labels[RAY_ORIGIN_NAME], f"label {RAY_ORIGIN_NAME}")
    return None


def _owner_chain(pod: Mapping[str, Any], labels: Mapping[str, str], namespace: str,
                 lookup: OwnerLookup | None) -> PodJob | None:
    owner = controller_of(pod)
    if owner is None or owner.get("kind") == "Node":  # no controller, or a static (mirror) pod
        return None
    template_hash = labels.get(POD_TEMPLATE_HASH, "")
    steps: list[str] = []
    for depth in range(MAX_OWNER_DEPTH):
        kind, name = str(owner["kind"]), str(owner["name"])
        steps.append(kind)
        if (depth == 0 and kind == "ReplicaSet" and api_group(str(owner.get("apiVersion", ""))) == "apps"
                and template_hash and name.endswith("-" + template_hash)):
            # The Deployment controller names its ReplicaSets <deployment>-<pod-template-hash>
            # and puts the hash on their pods (pkg/controller/deployment/sync.go).
            return PodJob("Deployment", name[: -len(template_hash) - 1], "owner ReplicaSet->Deployment")
        parent = lookup(namespace, owner) if lookup is not None else None
        if parent is None or not parent.get("kind") or not parent.get("name"):
            return PodJob(kind, name, "owner " + "->".join(steps))
        owner = parent
    steps.append(str(owner["kind"]))
    return PodJob(str(owner["kind"]), str(owner["name"]), "owner " + "->".join(steps))
