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

The job id is ``k8s:<namespace>/<kind>/<name>``: two workloads of different kinds (a
PyTorchJob and a Deployment both called ``llama``) never share an id. Kinds of the built-in
groups and of the training operators this module knows are bare (``PyTorchJob``, ``Job``);
other kinds carry their API group (``Rollout.argoproj.io``), so two custom resources of one
kind name in different groups stay apart too. A configured ``k8s_job_label`` names jobs
across kinds: its ids are ``k8s:<namespace>/<label value>``.

The id is the job's stable name, what dashboards group by. Its incarnation is ``run``: the
UID of the workload object the job is named after, when the pod knows it without asking the
API (its controller owner reference is that object, or a label carries its UID). A job
deleted and created again under the same name is a new run. Where a pod cannot know the
UID (a Deployment's pods name its ReplicaSet; a LeaderWorkerSet's, a StatefulSet of it), the
run is empty for every pod of that job, so the pods of one job always agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from otel_ofu.attribution import K8S_POD_LABEL_PREFIX, K8S_POD_UID

# Kubernetes (k8s.io/api batch/v1 and apps/v1 types.go).
BATCH_JOB_NAME = "batch.kubernetes.io/job-name"
LEGACY_JOB_NAME = "job-name"
# The Job's UID on its pods (batch/v1 types.go, ControllerUidLabel; the legacy key before 1.27).
BATCH_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
LEGACY_CONTROLLER_UID = "controller-uid"
POD_TEMPLATE_HASH = "pod-template-hash"
# Kubeflow Trainer v2 (kubeflow/trainer pkg/constants): a TrainJob runs as a JobSet of its name.
TRAINJOB_NAME = "trainer.kubeflow.org/trainjob-name"
# JobSet (kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go, JobSetNameKey).
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"  # since JobSet v0.10 (JobSetUIDKey)
# Kubeflow training-operator v1 / mpi-operator v2 (kubeflow/common pkg/apis/common/v1/constants.go).
KUBEFLOW_JOB_NAME = "training.kubeflow.org/job-name"
# Which operator made the pod (kubeflow/training-operator v1.9 common_types.go OperatorNameLabel;
# each controller's controllerName): the job's kind when the pod carries no owner reference.
KUBEFLOW_OPERATOR_NAME = "training.kubeflow.org/operator-name"
KUBEFLOW_OPERATOR_KINDS = {"pytorchjob-controller": "PyTorchJob", "tfjob-controller": "TFJob",
                           "mpijob-controller": "MPIJob", "xgboostjob-controller": "XGBoostJob",
                           "paddlejob-controller": "PaddleJob", "jaxjob-controller": "JAXJob",
                           "mpi-operator": "MPIJob"}
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

# Every pod label key the rules read (a scraped page's pod labels carry these: core/dcgm_fields).
JOB_RULE_LABELS = (TRAINJOB_NAME, JOBSET_NAME, JOBSET_UID, KUBEFLOW_JOB_NAME, KUBEFLOW_OPERATOR_NAME,
                   KUBEFLOW_GROUP_NAME, *LEGACY_KUBEFLOW_LABELS, LWS_NAME, VOLCANO_JOB_NAME, RAY_ORIGIN_NAME,
                   RAY_ORIGIN_KIND, BATCH_JOB_NAME, LEGACY_JOB_NAME, BATCH_CONTROLLER_UID, LEGACY_CONTROLLER_UID,
                   POD_TEMPLATE_HASH)

# API groups whose kinds are named bare in job ids; other groups' kinds carry the group.
BARE_KIND_GROUPS = frozenset({"", "apps", "batch", KUBEFLOW_GROUP, "trainer.kubeflow.org", "jobset.x-k8s.io",
                              "leaderworkerset.x-k8s.io", "ray.io"})
# A kind whose bare name would clash with a built-in one: Volcano's Job is not batch's Job.
KIND_ALIASES = {("batch.volcano.sh", "Job"): "VolcanoJob"}

MAX_OWNER_DEPTH = 5  # owner chains are short (Pod -> RayCluster -> RayJob); a loop must not hang us


@dataclass(frozen=True, slots=True)
class PodJob:
    """The job a pod belongs to: its workload kind and name, the rule that said so, and its run."""

    kind: str  # "PyTorchJob", "JobSet", "Deployment", "Pod", ...; "" for the configured label
    name: str
    rule: str  # e.g. "label training.kubeflow.org/job-name", "owner ReplicaSet->Deployment", "pod"
    run: str = ""  # the UID of the workload object named, when the pod knows it (see the module docstring)


# (namespace, owner reference) -> the owner's own controller reference, or None when it has
# none or cannot be read. Supplied by the API source for the kinds in ``owner_lookups``.
OwnerLookup = Callable[[str, Mapping[str, Any]], Mapping[str, Any] | None]


def job_id(namespace: str, job: PodJob) -> str:
    """``k8s:<namespace>/<kind>/<name>``; ``k8s:<namespace>/<name>`` for the configured label."""
    return f"k8s:{namespace}/{job.kind}/{job.name}" if job.kind else f"k8s:{namespace}/{job.name}"


def canonical_kind(api_version: str, kind: str) -> str:
    """The kind as job ids write it: bare for known groups, else ``Kind.group``."""
    group = api_group(api_version)
    alias = KIND_ALIASES.get((group, kind))
    if alias is not None:
        return alias
    return kind if group in BARE_KIND_GROUPS else f"{kind}.{group}"


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference marked ``controller: true`` (at most one per object)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") and ref.get("name"):
            return ref
    return None


def api_group(api_version: str) -> str:
    """``apps/v1`` -> ``apps``; ``v1`` (the core group) -> ``""``."""
    return api_version.rpartition("/")[0]


def job_identity(pod: Mapping[str, Any], job_label: str = "", lookup: OwnerLookup | None = None, *,
                 owners_known: bool = True) -> PodJob:
    """The job of one pod (see the module docstring for the rules and their order).

    ``owners_known=False``: the pod is known by its name and labels alone (a scraped page's pod
    labels, not the API's object), so a pod without owner references may still be a
    Deployment's (its name then starts ``<deployment>-<pod-template-hash>-``).
    """
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
            run = labels.get(BATCH_CONTROLLER_UID) or labels.get(LEGACY_CONTROLLER_UID) or ""
            return PodJob("Job", labels[label], f"label {label}", run)
    template_hash = labels.get(POD_TEMPLATE_HASH, "")
    if not owners_known and template_hash and f"-{template_hash}-" in name:
        # The Deployment controller names pods <replicaset>-<random> and its ReplicaSets
        # <deployment>-<pod-template-hash> (pkg/controller/deployment/sync.go).
        return PodJob("Deployment", name[: name.rindex(f"-{template_hash}-")], f"label {POD_TEMPLATE_HASH}")
    return PodJob("Pod", name, "pod", str(meta.get("uid") or ""))


def labelled_pod_job(namespace: str, pod: str, resource: Mapping[str, Any], job_label: str = "") -> PodJob:
    """The job of a pod known only by what a sample carries: its name, ``k8s.pod.uid`` and
    ``k8s.pod.label.<key>`` attributes (no owner references), by the rules of :func:`job_identity`."""
    labels = {k[len(K8S_POD_LABEL_PREFIX):]: str(v) for k, v in resource.items() if k.startswith(K8S_POD_LABEL_PREFIX)}
    obj = {"metadata": {"name": pod, "namespace": namespace, "uid": str(resource.get(K8S_POD_UID) or ""),
                        "labels": labels}}
    return job_identity(obj, job_label, owners_known=False)


def _run(pod: Mapping[str, Any], kind: str, name: str) -> str:
    """The UID of the job's own object when the pod's controller reference is it, else ""."""
    owner = controller_of(pod)
    if owner is None or str(owner["name"]) != name:
        return ""
    if canonical_kind(str(owner.get("apiVersion", "")), str(owner["kind"])) != kind:
        return ""
    return str(owner.get("uid") or "")


def _kubeflow_kind(pod: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    """A training-operator job's kind: its controller reference, else the operator's name label."""
    owner = controller_of(pod)
    if owner is not None and api_group(str(owner.get("apiVersion", ""))) == KUBEFLOW_GROUP:
        return str(owner["kind"])
    return KUBEFLOW_OPERATOR_KINDS.get(labels.get(KUBEFLOW_OPERATOR_NAME, ""), "KubeflowJob")


def _labelled(pod: Mapping[str, Any], kind: str, name: str, label: str, run: str | None = None) -> PodJob:
    return PodJob(kind, name, f"label {label}", _run(pod, kind, name) if run is None else run)


def _well_known(pod: Mapping[str, Any], labels: Mapping[str, str]) -> PodJob | None:
    """The workload controllers' own labels naming the top-level job (no API call)."""
    if labels.get(TRAINJOB_NAME):  # a TrainJob runs as a JobSet of its name, re-created with it
        return _labelled(pod, "TrainJob", labels[TRAINJOB_NAME], TRAINJOB_NAME, labels.get(JOBSET_UID, ""))
    if labels.get(JOBSET_NAME):  # before the batch Job labels: a JobSet's pods belong to its child Jobs
        return _labelled(pod, "JobSet", labels[JOBSET_NAME], JOBSET_NAME, labels.get(JOBSET_UID, ""))
    if labels.get(KUBEFLOW_JOB_NAME):
        return _labelled(pod, _kubeflow_kind(pod, labels), labels[KUBEFLOW_JOB_NAME], KUBEFLOW_JOB_NAME)
    for label, kind in LEGACY_KUBEFLOW_LABELS.items():
        if labels.get(label):
            return _labelled(pod, kind, labels[label], label)
    if labels.get(KUBEFLOW_GROUP_NAME) == KUBEFLOW_GROUP and labels.get(LEGACY_JOB_NAME):
        job = _labelled(pod, _kubeflow_kind(pod, labels), labels[LEGACY_JOB_NAME], LEGACY_JOB_NAME)
        return PodJob(job.kind, job.name, f"label {LEGACY_JOB_NAME} (group-name {KUBEFLOW_GROUP})", job.run)
    if labels.get(LWS_NAME):  # its pods' owners are StatefulSets (and a leader pod): no run
        return _labelled(pod, "LeaderWorkerSet", labels[LWS_NAME], LWS_NAME, "")
    if labels.get(VOLCANO_JOB_NAME):
        return _labelled(pod, "VolcanoJob", labels[VOLCANO_JOB_NAME], VOLCANO_JOB_NAME)
    if labels.get(RAY_ORIGIN_NAME) and labels.get(RAY_ORIGIN_KIND) in RAY_ROOT_KINDS:
        return _labelled(pod, labels[RAY_ORIGIN_KIND], labels[RAY_ORIGIN_NAME], RAY_ORIGIN_NAME)
    return None


def _owner_chain(pod: Mapping[str, Any], labels: Mapping[str, str], namespace: str,
                 lookup: OwnerLookup | None) -> PodJob | None:
    owner = controller_of(pod)
    if owner is None or owner.get("kind") == "Node":  # no controller, or a static (mirror) pod
        return None
    template_hash = labels.get(POD_TEMPLATE_HASH, "")
    steps: list[str] = []
    for depth in range(MAX_OWNER_DEPTH):
        kind = canonical_kind(str(owner.get("apiVersion", "")), str(owner["kind"]))
        name = str(owner["name"])
        steps.append(str(owner["kind"]))
        if (depth == 0 and kind == "ReplicaSet" and template_hash and name.endswith("-" + template_hash)):
            # The Deployment controller names its ReplicaSets <deployment>-<pod-template-hash>
            # and puts the hash on their pods (pkg/controller/deployment/sync.go).
            return PodJob("Deployment", name[: -len(template_hash) - 1], "owner ReplicaSet->Deployment")
        parent = lookup(namespace, owner) if lookup is not None else None
        if parent is None or not parent.get("kind") or not parent.get("name"):
            # the pod's own controller is the job: its UID is the run; further up, the pods of one
            # job may reach it through different owners (ReplicaSets of a Rollout): no run
            return PodJob(kind, name, "owner " + "->".join(steps), str(owner.get("uid") or "") if depth == 0 else "")
        owner = parent
    steps.append(str(owner["kind"]))
    return PodJob(canonical_kind(str(owner.get("apiVersion", "")), str(owner["kind"])), str(owner["name"]),
                  "owner " + "->".join(steps))
