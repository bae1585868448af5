"""Job identity of a pod (pure rules on the API's pod JSON) and the pod record attribution keeps.

The label keys and owner references are the ones the controllers really set (see
otel_ofu/attribution/k8s_identity.py for the source of each); tests against a real API server
are in test_k8s_api.py.
"""

from __future__ import annotations

import re

import pytest

from otel_ofu.attribution.config import AttributionProcessorConfig, KubernetesApiSourceConfig
from otel_ofu.attribution.k8s_api import pod_record
from otel_ofu.attribution.k8s_identity import PodJob, controller_of, job_id, job_identity
from otel_ofu.pipeline.config import FieldError, build_config


def owner(kind: str, name: str, api_version: str, uid: str = "", controller: bool = True) -> dict:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid or f"uid-{name}",
            "controller": controller, "blockOwnerDeletion": True}


def pod(name: str, namespace: str = "team", labels: dict | None = None, owners: list[dict] | None = None,
        annotations: dict | None = None) -> dict:
    meta = {"name": name, "namespace": namespace, "uid": f"uid-pod-{name}", "labels": labels or {}}
    if owners is not None:
        meta["ownerReferences"] = owners
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"nodeName": "gpu-node-1"}}


def ident(p: dict, job_label: str = "", lookup=None) -> tuple[str, str, str]:
    job = job_identity(p, job_label, lookup)
    return job.kind, job.name, job_id(p["metadata"]["namespace"], job)


# Pods as each controller creates them: two pods of one job must name the same job.
PYTORCHJOB = [pod(f"llama-70b-{role}-{i}", labels={
    "training.kubeflow.org/job-name": "llama-70b", "training.kubeflow.org/operator-name": "pytorchjob-controller",
    "training.kubeflow.org/replica-type": role, "training.kubeflow.org/replica-index": str(i)},
    owners=[owner("PyTorchJob", "llama-70b", "kubeflow.org/v1")]) for role, i in (("master", 0), ("worker", 3))]
JOBSET = [pod(f"gpt-workers-{j}-{i}-x{j}{i}", labels={
    "jobset.sigs.k8s.io/jobset-name": "gpt", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
    "batch.kubernetes.io/job-name": f"gpt-workers-{j}", "job-name": f"gpt-workers-{j}",
    "batch.kubernetes.io/job-completion-index": str(i)},
    owners=[owner("Job", f"gpt-workers-{j}", "batch/v1")]) for j, i in ((0, 0), (1, 3))]
INDEXED_JOB = [pod(f"sweep-{i}-abcde", labels={
    "batch.kubernetes.io/job-name": "sweep", "job-name": "sweep", "batch.kubernetes.io/job-completion-index": str(i),
    "batch.kubernetes.io/controller-uid": "c0ffee", "controller-uid": "c0ffee"},
    owners=[owner("Job", "sweep", "batch/v1")]) for i in (0, 7)]
DEPLOYMENT = [pod(f"vllm-7d9c8b6f5-{s}", labels={"app": "vllm", "pod-template-hash": "7d9c8b6f5"},
                  owners=[owner("ReplicaSet", "vllm-7d9c8b6f5", "apps/v1")]) for s in ("q2w3e", "r4t5y")]
LWS = [pod(name, labels={"leaderworkerset.sigs.k8s.io/name": "deepseek", "leaderworkerset.sigs.k8s.io/group-index": "0",
                         "leaderworkerset.sigs.k8s.io/worker-index": w, "controller-revision-hash": "abc"},
           owners=[owner("StatefulSet", sts, "apps/v1")])
       for name, sts, w in (("deepseek-0", "deepseek", "0"), ("deepseek-0-1", "deepseek-0", "1"))]
VOLCANO = [pod(f"mnist-worker-{i}", labels={"volcano.sh/job-name": "mnist", "volcano.sh/job-namespace": "team",
                                            "volcano.sh/queue-name": "default"},
               owners=[owner("Job", "mnist", "batch.volcano.sh/v1alpha1")]) for i in (0, 1)]
TRAINJOB = [pod(f"ft-node-0-{i}-zz{i}", labels={
    "trainer.kubeflow.org/trainjob-name": "ft", "jobset.sigs.k8s.io/jobset-name": "ft",
    "batch.kubernetes.io/job-name": "ft-node-0"}, owners=[owner("Job", "ft-node-0", "batch/v1")]) for i in (0, 1)]
RAYJOB_SUBMITTER = pod("rl-abcde", labels={"batch.kubernetes.io/job-name": "rl", "job-name": "rl",
                                           "ray.io/originated-from-crd": "RayJob",
                                           "ray.io/originated-from-cr-name": "rl"},
                       owners=[owner("Job", "rl", "batch/v1")])
STATEFULSET = [pod(f"trainer-{i}", labels={"app": "trainer", "apps.kubernetes.io/pod-index": str(i)},
                   owners=[owner("StatefulSet", "trainer", "apps/v1")]) for i in (0, 1)]


@pytest.mark.parametrize(("pods", "kind", "name"), [
    (PYTORCHJOB, "PyTorchJob", "llama-70b"),
    (JOBSET, "JobSet", "gpt"),
    (INDEXED_JOB, "Job", "sweep"),
    (DEPLOYMENT, "Deployment", "vllm"),
    (LWS, "LeaderWorkerSet", "deepseek"),
    (VOLCANO, "VolcanoJob", "mnist"),
    (TRAINJOB, "TrainJob", "ft"),
    (STATEFULSET, "StatefulSet", "trainer"),
], ids=["pytorchjob", "jobset", "indexed-job", "deployment", "lws", "volcano", "trainjob", "statefulset"])
def test_all_pods_of_one_job_share_its_id(pods, kind, name):
    ids = {ident(p) for p in pods}
    assert ids == {(kind, name, f"k8s:team/{kind}/{name}")}
    assert len({job_identity(p).run for p in pods}) == 1  # the pods of one job agree on its run


# --- kind and incarnation (issue 22): a name alone is not a job --------------------------------------

def test_workloads_of_different_kinds_never_share_an_id():
    """A PyTorchJob, a Deployment and a bare pod all called llama in one namespace are three jobs."""
    pytorchjob = pod("llama-master-0", labels={"training.kubeflow.org/job-name": "llama",
                                               "training.kubeflow.org/operator-name": "pytorchjob-controller"},
                     owners=[owner("PyTorchJob", "llama", "kubeflow.org/v1", uid="pt-1")])
    deployment = pod("llama-7d9c8b6f5-q2w3e", labels={"app": "llama", "pod-template-hash": "7d9c8b6f5"},
                     owners=[owner("ReplicaSet", "llama-7d9c8b6f5", "apps/v1")])
    bare = pod("llama")
    rollout = pod("llama-5f6d-abcde", owners=[owner("ReplicaSet", "llama-5f6d", "apps/v1")])
    argo = ident(rollout, lookup=lambda ns, ref: owner("Rollout", "llama", "argoproj.io/v1alpha1")
                 if ref["kind"] == "ReplicaSet" else None)
    volcano = pod("llama-worker-0", owners=[owner("Job", "llama", "batch.volcano.sh/v1alpha1")])
    batch = pod("llama-abcde", owners=[owner("Job", "llama", "batch/v1")])
    ids = [ident(pytorchjob)[2], ident(deployment)[2], ident(bare)[2], argo[2], ident(volcano)[2], ident(batch)[2]]
    assert ids == ["k8s:team/PyTorchJob/llama", "k8s:team/Deployment/llama", "k8s:team/Pod/llama",
                   "k8s:team/Rollout.argoproj.io/llama", "k8s:team/VolcanoJob/llama", "k8s:team/Job/llama"]


def test_a_recreated_job_keeps_its_id_and_is_a_new_run():
    """Deleted and created again (a new UID): the same stable id, another run."""
    def pytorchjob(uid: str) -> dict:
        return pod("llama-worker-0", labels={"training.kubeflow.org/job-name": "llama"},
                   owners=[owner("PyTorchJob", "llama", "kubeflow.org/v1", uid=uid)])

    first, second = job_identity(pytorchjob("6f1e-aaaa")), job_identity(pytorchjob("6f1e-bbbb"))
    assert job_id("team", first) == job_id("team", second) == "k8s:team/PyTorchJob/llama"
    assert (first.run, second.run) == ("6f1e-aaaa", "6f1e-bbbb")


@pytest.mark.parametrize(("p", "run"), [
    (PYTORCHJOB[0], "uid-llama-70b"),  # the controller reference is the PyTorchJob
    (INDEXED_JOB[0], "uid-sweep"),  # the Job
    (VOLCANO[0], "uid-mnist"),
    (STATEFULSET[0], "uid-trainer"),
    (pod("p", labels={"jobset.sigs.k8s.io/jobset-name": "gpt", "jobset.sigs.k8s.io/jobset-uid": "js-1"},
         owners=[owner("Job", "gpt-workers-0", "batch/v1")]), "js-1"),  # JobSet >= 0.10 labels its UID
    (JOBSET[0], ""),  # an older JobSet: its pods name their child Job, not the JobSet
    (DEPLOYMENT[0], ""),  # the pods name a ReplicaSet, which changes with every rollout
    (LWS[0], ""),  # StatefulSets (and for workers, the leader pod)
    (pod("p", labels={"job-name": "j", "controller-uid": "c-1"}), "c-1"),  # an orphaned Job pod
    (pod("notebook"), "uid-pod-notebook"),
])
def test_the_run_is_the_named_objects_uid_when_the_pod_knows_it(p, run):
    assert job_identity(p).run == run


def test_configured_label_comes_first():
    p = JOBSET[0]
    p = {**p, "metadata": {**p["metadata"], "labels": {**p["metadata"]["labels"], "team.example/run": "run-42"}}}
    assert ident(p, "team.example/run") == ("", "run-42", "k8s:team/run-42")  # names jobs across kinds
    # an empty value does not count: the next rule applies
    p["metadata"]["labels"]["team.example/run"] = ""
    assert ident(p, "team.example/run")[1] == "gpt"


def test_configured_batch_job_label_keeps_its_ids():
    """Users who set k8s_job_label: batch.kubernetes.io/job-name keep their job ids (no kind)."""
    assert ident(INDEXED_JOB[0], "batch.kubernetes.io/job-name")[2] == "k8s:team/sweep"
    assert ident(INDEXED_JOB[0])[2] == "k8s:team/Job/sweep"


@pytest.mark.parametrize(("labels", "owners", "expected"), [
    ({"pytorch-job-name": "old-pt", "group-name": "kubeflow.org"}, None, ("PyTorchJob", "old-pt")),
    ({"tf-job-name": "old-tf"}, None, ("TFJob", "old-tf")),
    ({"mpi-job-name": "old-mpi", "mpi-job-role": "worker"}, None, ("MPIJob", "old-mpi")),
    ({"job-name": "tj", "group-name": "kubeflow.org"}, [owner("TFJob", "tj", "kubeflow.org/v1")], ("TFJob", "tj")),
    ({"training.kubeflow.org/job-name": "mpi2", "training.kubeflow.org/operator-name": "mpi-operator"},
     [owner("MPIJob", "mpi2", "kubeflow.org/v2beta1")], ("MPIJob", "mpi2")),
    ({"training.kubeflow.org/job-name": "orphan"}, None, ("KubeflowJob", "orphan")),
    # without an owner reference the operator's name label says the kind
    ({"training.kubeflow.org/job-name": "pt", "training.kubeflow.org/operator-name": "pytorchjob-controller"}, None,
     ("PyTorchJob", "pt")),
    ({"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": "rl", "ray.io/cluster": "rl-x7k2p"},
     [owner("RayCluster", "rl-x7k2p", "ray.io/v1")], ("RayJob", "rl")),
])
def test_older_kubeflow_labels_and_ray_origin(labels, owners, expected):
    assert ident(pod("p", labels=labels, owners=owners))[:2] == expected


def test_ray_pods_name_their_cluster_and_with_a_lookup_the_rayjob():
    worker = pod("rl-x7k2p-gpu-worker-abcde", labels={"ray.io/cluster": "rl-x7k2p", "ray.io/node-type": "worker"},
                 owners=[owner("RayCluster", "rl-x7k2p", "ray.io/v1", uid="rc-1")])
    assert ident(worker) == ("RayCluster", "rl-x7k2p", "k8s:team/RayCluster/rl-x7k2p")
    asked = []

    def lookup(namespace, ref):
        asked.append((namespace, ref["kind"], ref["name"]))
        return owner("RayJob", "rl", "ray.io/v1") if ref["kind"] == "RayCluster" else None

    assert ident(worker, lookup=lookup) == ("RayJob", "rl", "k8s:team/RayJob/rl")
    assert asked == [("team", "RayCluster", "rl-x7k2p"), ("team", "RayJob", "rl")]
    assert job_identity(worker, lookup=lookup).run == ""  # reached through an owner: the run stays unknown
    # The RayJob's submitter pod carries KubeRay's origin labels: the same id.
    assert ident(RAYJOB_SUBMITTER)[2] == "k8s:team/RayJob/rl"


def test_replicaset_without_the_deployment_hash_is_its_own_job_unless_looked_up():
    bare = pod("rs-pod", labels={"app": "x"}, owners=[owner("ReplicaSet", "canary-5f6d", "apps/v1")])
    assert ident(bare)[:2] == ("ReplicaSet", "canary-5f6d")
    # a hash that does not end the owner's name is not the Deployment rule
    odd = pod("p", labels={"pod-template-hash": "abc"}, owners=[owner("ReplicaSet", "other-xyz", "apps/v1")])
    assert ident(odd)[:2] == ("ReplicaSet", "other-xyz")
    rollout = owner("Rollout", "canary", "argoproj.io/v1alpha1")
    assert ident(bare, lookup=lambda ns, ref: rollout if ref["kind"] == "ReplicaSet" else None)[:2] == (
        "Rollout.argoproj.io", "canary")


def test_owner_chain_is_bounded():
    looping = pod("p", owners=[owner("A", "a", "example.com/v1")])
    job = job_identity(looping, "", lambda ns, ref: owner(ref["kind"], ref["name"], "example.com/v1"))
    assert job.name == "a" and job.rule.count("->") == 5


def test_pod_itself_when_nothing_else_applies():
    assert ident(pod("notebook-0")) == ("Pod", "notebook-0", "k8s:team/Pod/notebook-0")
    # a static pod is owned by its Node: that is not a job
    mirror = pod("etcd-node-1", owners=[owner("Node", "node-1", "v1")])
    assert ident(mirror)[:2] == ("Pod", "etcd-node-1")
    # a non-controller owner reference is not the controller
    assert ident(pod("p", owners=[owner("ConfigMap", "cm", "v1", controller=False)]))[:2] == ("Pod", "p")
    # batch Job labels on a pod without owner (orphaned) still name the Job
    assert ident(pod("p", labels={"job-name": "j"}))[:2] == ("Job", "j")


def test_controller_of_ignores_malformed_references():
    assert controller_of({"metadata": {"ownerReferences": [{"controller": True}, "x", None]}}) is None
    assert controller_of({}) is None


def test_pod_record_precision_labels_and_uid():
    p = pod("w-0", labels={"app.kubernetes.io/name": "llm", "team": "a", "other": "x", "ofu.dev/precision": "bf16"},
            annotations={"ofu.dev/precision": "FP8", "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
            owners=PYTORCHJOB[0]["metadata"]["ownerReferences"])
    p["metadata"]["labels"]["training.kubeflow.org/job-name"] = "llama-70b"
    record = pod_record(p, precision_key="ofu.dev/precision",
                        copy_labels=[re.compile(r"app\.kubernetes\.io/.*"), re.compile("team")])
    assert (record.namespace, record.name, record.uid) == ("team", "w-0", "uid-pod-w-0")
    assert record.job == PodJob("PyTorchJob", "llama-70b", "label training.kubeflow.org/job-name", "uid-llama-70b")
    assert record.job_id == "k8s:team/PyTorchJob/llama-70b"
    assert record.precision == "fp8"  # the annotation wins over the label
    assert record.labels == {"k8s.pod.label.app.kubernetes.io/name": "llm", "k8s.pod.label.team": "a"}
    del p["metadata"]["annotations"]["ofu.dev/precision"]
    assert pod_record(p, precision_key="ofu.dev/precision").precision == "bf16"
    p["metadata"]["labels"]["ofu.dev/precision"] = "fp9"
    assert pod_record(p, precision_key="ofu.dev/precision").precision is None  # unknown is no value
    assert pod_record({"metadata": {"name": "no-namespace"}}) is None


def test_config_defaults_and_errors(monkeypatch):
    monkeypatch.setenv("K8S_NODE_NAME", "gpu-node-1")  # as the downward API sets it (validate checks, as run does)
    cfg = build_config(AttributionProcessorConfig, {"kubernetes_api": {"enabled": True}})
    k = cfg.kubernetes_api
    assert (k.enabled, k.node_name, k.kubeconfig, k.copy_labels, k.owner_lookups) == (True, "", "", [], [])
    assert (k.stale_after, k.watch_timeout) == (60.0, 300.0)
    assert cfg.precision_key == "ofu.dev/precision"  # one key for the annotation, the label and the attribute
    assert isinstance(build_config(KubernetesApiSourceConfig, {"owner_lookups": ["RayCluster", "Job.batch"]}),
                      KubernetesApiSourceConfig)
    for bad, key in (({"copy_labels": ["app("]}, "kubernetes_api.copy_labels[0]"),
                     ({"owner_lookups": ["ray cluster"]}, "kubernetes_api.owner_lookups[0]"),
                     ({"stale_after": "0s"}, "kubernetes_api.stale_after"),
                     ({"retry_initial_interval": "10s", "retry_max_interval": "1s"},
                      "kubernetes_api.retry_max_interval"),
                     ({"node": "x"}, "kubernetes_api.node")):
        with pytest.raises(FieldError) as err:
            build_config(AttributionProcessorConfig, {"kubernetes_api": bad})
        assert err.value.key == key
