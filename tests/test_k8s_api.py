"""The Kubernetes API source against a real kube-apiserver (on etcd; see tests/kube_apiserver.py).

Pods are created as the workload controllers create them (labels, owner references,
``spec.nodeName``); one PodWatcher per node plays the node agent of a DaemonSet. Covered: the
job identity of PyTorchJob / JobSet / indexed Job / Deployment pods across nodes, watch adds
and deletes, owner lookups (a ReplicaSet's Rollout, a RayCluster's RayJob through a CRD),
RBAC (pods only; forbidden; never secrets, from the API server's audit log), an API server
restart (stale, then recovery), a 410 Gone relist, and the whole pipeline: a dcgm-exporter
page or the kubelet's pod-resources API plus the API server -> attribution -> ofu -> points.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from otel_ofu.attribution.config import KubernetesApiSourceConfig
from otel_ofu.attribution.k8s_api import KubernetesApiError, PodWatcher
from otel_ofu.core.model import Batch
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.attribution import AttributionProcessor, AttributionProcessorConfig
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from tests.e2e_util import PageServer, Process, otel_ofu_command, read_points, require_alive, wait_for
from tests.kube_apiserver import (
    STRANGER_TOKEN,
    STRANGER_USER,
    WATCHER_TOKEN,
    WATCHER_USER,
    CuttableProxy,
    KubeApiServer,
)
from tests.test_attribution import (
    kubelet,  # noqa: F401 - the real pod-resources gRPC server fixture
    sample,
)
from tests.test_attribution import pod as kubelet_pod

DATA = Path(__file__).parent / "data"
PODS_ONLY = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
PRECISION = "ofu.dev/precision"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    server = KubeApiServer(tmp_path_factory.mktemp("kube")).start()
    server.grant(WATCHER_USER, "otel-ofu-pods", PODS_ONLY)
    yield server
    server.stop()


@pytest.fixture
def watchers():
    """Start PodWatchers; all are stopped at the end of the test."""
    started: list[PodWatcher] = []

    def start(cluster: KubeApiServer, node: str, *, token: str = WATCHER_TOKEN, user: str = WATCHER_USER,
              port: int | None = None, job_label: str = "", wait: bool = True, **settings) -> PodWatcher:
        kubeconfig = cluster.kubeconfig(token, user, port=port)
        config = build_config(KubernetesApiSourceConfig, {
            "enabled": True, "node_name": node, "kubeconfig": str(kubeconfig), "stale_after": "1s",
            "retry_initial_interval": "100ms", "retry_max_interval": "500ms", "request_timeout": "5s",
            "watch_timeout": "60s", **settings})
        watcher = PodWatcher(config, job_label=job_label, precision_key=PRECISION, telemetry=Telemetry())
        watcher.start()
        started.append(watcher)
        if wait:
            assert watcher.synced.wait(60), "the watcher never listed the node's pods"
        return watcher

    yield start
    for watcher in started:
        watcher.stop()


def owner(kind: str, name: str, api_version: str, uid: str = "") -> dict:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid or f"uid-{kind}-{name}".lower(),
            "controller": True, "blockOwnerDeletion": True}


def until(what: str, check, timeout: float = 60.0):
    return wait_for(what, check, timeout=timeout, interval=0.1)


# --- identity across the nodes of a cluster -------------------------------------------------------

def test_every_pod_of_a_job_on_every_node_gets_one_job_id(cluster, watchers):
    """A 16-pod PyTorchJob over 4 nodes is one job; so are a JobSet, an indexed Job, a Deployment."""
    ns, nodes = "train", [f"gpu-node-{i}" for i in range(4)]
    cluster.namespace(ns)
    pytorchjob = owner("PyTorchJob", "llama-70b", "kubeflow.org/v1", "6f1e2d3c-0000-4000-8000-00000000a001")
    for i in range(16):
        role = "master" if i == 0 else "worker"
        cluster.create_pod(ns, f"llama-70b-{role}-{i}", nodes[i % 4], owners=[pytorchjob], labels={
            "training.kubeflow.org/job-name": "llama-70b",
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/replica-type": role, "training.kubeflow.org/replica-index": str(i)},
            annotations={PRECISION: "fp8"})
    for j in range(2):
        child = owner("Job", f"gpt-workers-{j}", "batch/v1", f"6f1e2d3c-0000-4000-8000-00000000b00{j}")
        cluster.create_pod(ns, f"gpt-workers-{j}-0-x7", nodes[j], owners=[child], labels={
            "jobset.sigs.k8s.io/jobset-name": "gpt", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
            "batch.kubernetes.io/job-name": f"gpt-workers-{j}", "job-name": f"gpt-workers-{j}"})
    sweep = owner("Job", "sweep", "batch/v1", "6f1e2d3c-0000-4000-8000-00000000c001")
    for i in range(2):
        cluster.create_pod(ns, f"sweep-{i}-k2j4h", nodes[i + 2], owners=[sweep], labels={
            "batch.kubernetes.io/job-name": "sweep", "job-name": "sweep",
            "batch.kubernetes.io/job-completion-index": str(i)})
    replicaset = owner("ReplicaSet", "vllm-7d9c8b6f5", "apps/v1", "6f1e2d3c-0000-4000-8000-00000000d001")
    for i in range(2):
        cluster.create_pod(ns, f"vllm-7d9c8b6f5-q{i}w3e", nodes[i], owners=[replicaset],
                           labels={"app": "vllm", "pod-template-hash": "7d9c8b6f5"})
    cluster.create_pod(ns, "notebook", nodes[3])
    cluster.create_pod(ns, "elsewhere", "cpu-node-9", labels={"job-name": "sweep"})

    node_watchers = [watchers(cluster, node) for node in nodes]
    seen: dict[str, set[str]] = {}
    for watcher in node_watchers:
        with watcher._lock:
            records = list(watcher._pods.values())
        for record in records:
            seen.setdefault(record.job_id, set()).add(record.name)
            if record.job_id == "k8s:train/PyTorchJob/llama-70b":
                assert record.job.kind == "PyTorchJob" and record.precision == "fp8" and record.uid
    assert {job: len(pods) for job, pods in seen.items()} == {
        "k8s:train/PyTorchJob/llama-70b": 16, "k8s:train/JobSet/gpt": 2, "k8s:train/Job/sweep": 2,
        "k8s:train/Deployment/vllm": 2, "k8s:train/Pod/notebook": 1}
    assert [len(w) for w in node_watchers] == [6, 6, 5, 6]  # memory: the node's pods, nothing else
    assert all(w.pod(ns, "elsewhere") is None for w in node_watchers)
    assert node_watchers[0].telemetry.gauge("otel_ofu.attribution.kubernetes.pods", node="gpu-node-0") == 6
    assert node_watchers[0].job_id(ns, "llama-70b-master-0") == "k8s:train/PyTorchJob/llama-70b"
    assert node_watchers[0].job_id(ns, "no-such-pod") is None


def test_watch_sees_new_changed_and_deleted_pods(cluster, watchers):
    ns, node = "watch", "gpu-node-w"
    cluster.namespace(ns)
    cluster.create_pod(ns, "first", node)
    watcher = watchers(cluster, node)
    assert watcher.job_id(ns, "first") == "k8s:watch/Pod/first"
    cluster.create_pod(ns, "mnist-worker-0", node, labels={"volcano.sh/job-name": "mnist"},
                       owners=[owner("Job", "mnist", "batch.volcano.sh/v1alpha1")])
    until("the new pod", lambda: watcher.job_id(ns, "mnist-worker-0") == "k8s:watch/VolcanoJob/mnist")
    # a label change (here: the job label someone adds) is seen through MODIFIED
    cluster.patch_labels(ns, "first", {"leaderworkerset.sigs.k8s.io/name": "deepseek"})
    until("the relabelled pod", lambda: watcher.job_id(ns, "first") == "k8s:watch/LeaderWorkerSet/deepseek")
    uid = watcher.pod(ns, "first").uid
    cluster.delete_pod(ns, "first")
    until("the delete", lambda: watcher.pod(ns, "first") is None)
    assert watcher.pod_by_uid(uid) is None and len(watcher) == 1
    assert watcher.telemetry.counter("otel_ofu.attribution.kubernetes.lists", reason="start") == 1


# --- owner lookups and RBAC ---------------------------------------------------------------------

def requests_of(cluster: KubeApiServer, user: str, since: int) -> list[tuple[str, str]]:
    """(verb, resource) of every request ``user`` made, from the API server's audit log."""
    return [(e["verb"], (e.get("objectRef") or {}).get("resource", "") or e.get("requestURI", ""))
            for e in cluster.audit(user)[since:]]


def test_pods_only_rbac_is_enough_and_secrets_are_never_asked_for(cluster, watchers):
    ns, node = "rbac", "gpu-node-r"
    cluster.namespace(ns)
    cluster.create_pod(ns, "trainer-0", node, labels={"jobset.sigs.k8s.io/jobset-name": "t"})
    since = len(cluster.audit(WATCHER_USER))
    watcher = watchers(cluster, node)
    assert watcher.job_id(ns, "trainer-0") == "k8s:rbac/JobSet/t"
    cluster.create_pod(ns, "trainer-1", node, labels={"jobset.sigs.k8s.io/jobset-name": "t"})
    until("the watch", lambda: watcher.job_id(ns, "trainer-1"))
    watcher.stop()
    # a watch's audit event is written when it ends
    made = until("the list and the ended watch in the audit log", lambda: (
        lambda m: m if {("list", "pods"), ("watch", "pods")} <= set(m) else None)(
            requests_of(cluster, WATCHER_USER, since)))
    assert set(made) <= {("list", "pods"), ("watch", "pods")}, made
    everything = [e for e in cluster.audit(WATCHER_USER)]
    assert not [e for e in everything if "secret" in e.get("requestURI", "")]
    assert all(e["responseStatus"]["code"] < 400 for e in everything[since:])


def test_forbidden_is_logged_with_the_rbac_hint_then_recovers_when_granted(cluster, watchers, caplog):
    ns, node = "denied", "gpu-node-d"
    cluster.namespace(ns)
    cluster.create_pod(ns, "p", node)
    with caplog.at_level(logging.WARNING, logger="otel_ofu.attribution.k8s_api"):
        watcher = watchers(cluster, node, token=STRANGER_TOKEN, user=STRANGER_USER, wait=False)
        until("stale", lambda: watcher.stale, timeout=30)
    assert not watcher.synced.is_set() and watcher.pod(ns, "p") is None
    assert watcher.telemetry.counter("otel_ofu.attribution.kubernetes.errors", reason="forbidden") >= 2
    assert watcher.telemetry.gauge("otel_ofu.attribution.kubernetes.stale", node=node) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors  # once per outage, not once per retry
    assert "403" in errors[0] and "get, list and watch on pods" in errors[0] and "#rbac" in errors[0]
    assert "stranger" in errors[0]  # the API server's own message names the user
    cluster.grant(STRANGER_USER, "stranger-pods", PODS_ONLY)
    assert watcher.synced.wait(60)
    assert watcher.job_id(ns, "p") == "k8s:denied/Pod/p" and not watcher.stale


def test_owner_lookups_follow_a_replicaset_to_its_rollout_only_with_rbac(cluster, watchers, caplog):
    ns, node = "rollouts", "gpu-node-o"
    cluster.namespace(ns)
    rs = cluster.api("POST", f"/apis/apps/v1/namespaces/{ns}/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "canary-5f6d", "ownerReferences": [owner("Rollout", "canary", "argoproj.io/v1alpha1")]},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "canary"}},
                 "template": {"metadata": {"labels": {"app": "canary"}},
                              "spec": {"containers": [{"name": "main", "image": "registry.example/srv:1"}]}}}})
    rs_ref = owner("ReplicaSet", "canary-5f6d", "apps/v1", rs["metadata"]["uid"])
    cluster.create_pod(ns, "canary-5f6d-abcde", node, labels={"app": "canary"}, owners=[rs_ref])
    since = len(cluster.audit(WATCHER_USER))
    with caplog.at_level(logging.ERROR, logger="otel_ofu.attribution.k8s_api"):
        denied = watchers(cluster, node, owner_lookups=["ReplicaSet"])
    record = denied.pod(ns, "canary-5f6d-abcde")
    assert (record.job.kind, record.job_id) == ("ReplicaSet", "k8s:rollouts/ReplicaSet/canary-5f6d")
    assert any("owner_lookups lists ReplicaSet" in r.getMessage() for r in caplog.records)
    denied.stop()
    cluster.grant(WATCHER_USER, "otel-ofu-replicasets",
                  [{"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["get"]}])
    allowed = watchers(cluster, node, owner_lookups=["ReplicaSet"])
    record = allowed.pod(ns, "canary-5f6d-abcde")
    assert (record.job.kind, record.job_id, record.job.rule) == (
        "Rollout.argoproj.io", "k8s:rollouts/Rollout.argoproj.io/canary", "owner ReplicaSet->Rollout")
    allowed.stop()
    made = set(requests_of(cluster, WATCHER_USER, since))
    assert made <= {("list", "pods"), ("watch", "pods"), ("get", "replicasets"), ("get", "/apis/apps/v1")}, made
    assert ("get", "replicasets") in made


def test_rayjob_through_a_raycluster_custom_resource(cluster, watchers):
    """KubeRay: pods -> RayCluster (a CRD, read for owner_lookups) -> RayJob; the submitter pod agrees."""
    ns, node = "ray", "gpu-node-y"
    cluster.namespace(ns)
    cluster.api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "rayclusters.ray.io"},
        "spec": {"group": "ray.io", "scope": "Namespaced",
                 "names": {"plural": "rayclusters", "singular": "raycluster", "kind": "RayCluster",
                           "listKind": "RayClusterList"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}})

    def served():
        try:
            return any(r["name"] == "rayclusters" for r in cluster.api("GET", "/apis/ray.io/v1")["resources"])
        except OSError:
            return False

    until("the RayCluster CRD to be served", served)
    raycluster = until("creating a RayCluster", lambda: _try(lambda: cluster.api(
        "POST", f"/apis/ray.io/v1/namespaces/{ns}/rayclusters", {
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "rl-x7k2p", "labels": {"ray.io/originated-from-crd": "RayJob",
                                                         "ray.io/originated-from-cr-name": "rl"},
                         "ownerReferences": [owner("RayJob", "rl", "ray.io/v1")]},
            "spec": {"rayVersion": "2.53.0"}})))
    cluster_ref = owner("RayCluster", "rl-x7k2p", "ray.io/v1", raycluster["metadata"]["uid"])
    for name, kind in (("rl-x7k2p-head-abcde", "head"), ("rl-x7k2p-gpu-worker-fghij", "worker")):
        cluster.create_pod(ns, name, node, owners=[cluster_ref],
                           labels={"ray.io/cluster": "rl-x7k2p", "ray.io/node-type": kind, "ray.io/is-ray-node": "yes"})
    cluster.create_pod(ns, "rl-submitter-k8s7d", node, labels={"batch.kubernetes.io/job-name": "rl", "job-name": "rl",
                                                               "ray.io/originated-from-crd": "RayJob",
                                                               "ray.io/originated-from-cr-name": "rl"},
                       owners=[owner("Job", "rl", "batch/v1")])
    cluster.grant(WATCHER_USER, "otel-ofu-rayclusters",
                  [{"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get"]}])
    watcher = watchers(cluster, node, owner_lookups=["RayCluster"])
    jobs = {(r.name, r.job.kind, r.job_id) for r in (watcher.pod(ns, n) for n in (
        "rl-x7k2p-head-abcde", "rl-x7k2p-gpu-worker-fghij", "rl-submitter-k8s7d"))}
    assert jobs == {("rl-x7k2p-head-abcde", "RayJob", "k8s:ray/RayJob/rl"),
                    ("rl-x7k2p-gpu-worker-fghij", "RayJob", "k8s:ray/RayJob/rl"),
                    ("rl-submitter-k8s7d", "RayJob", "k8s:ray/RayJob/rl")}


def _try(call):
    try:
        return call()
    except OSError:
        return None


# --- the API server goes away -----------------------------------------------------------------------

def test_restart_marks_stale_keeps_serving_then_recovers(cluster, watchers, caplog):
    ns, node = "restart", "gpu-node-s"
    cluster.namespace(ns)
    cluster.create_pod(ns, "before", node, labels={"volcano.sh/job-name": "v"})
    watcher = watchers(cluster, node)
    with caplog.at_level(logging.INFO, logger="otel_ofu.attribution.k8s_api"):
        cluster.stop_apiserver()
        until("stale", lambda: watcher.stale, timeout=60)
        assert watcher.telemetry.gauge("otel_ofu.attribution.kubernetes.stale", node=node) == 1
        assert watcher.job_id(ns, "before") == "k8s:restart/VolcanoJob/v"  # the last known state still serves
        cluster.start_apiserver()
        cluster.create_pod(ns, "after", node)
        until("the pod created after the restart", lambda: watcher.job_id(ns, "after"), timeout=90)
    assert not watcher.stale and watcher.telemetry.gauge("otel_ofu.attribution.kubernetes.stale", node=node) == 0
    assert watcher.job_id(ns, "before") == "k8s:restart/VolcanoJob/v"
    messages = [r.getMessage() for r in caplog.records]
    assert sum("failed" in m for m in messages) == 1, messages
    assert any("the node's pods are stale" in m for m in messages) and any("answers again" in m for m in messages)


def test_watch_too_old_after_a_partition_relists(cluster, watchers):
    """Cut off while pods change and the API server restarts: the old resourceVersion is gone (410)."""
    ns, node = "partition", "gpu-node-p"
    cluster.namespace(ns)
    cluster.create_pod(ns, "old", node)
    proxy = CuttableProxy(cluster.port)
    try:
        watcher = watchers(cluster, node, port=proxy.port)
        proxy.cut()
        until("stale", lambda: watcher.stale, timeout=60)
        cluster.delete_pod(ns, "old")
        cluster.create_pod(ns, "new", node, labels={"leaderworkerset.sigs.k8s.io/name": "lws"})
        cluster.stop_apiserver()  # a fresh watch cache starts past the watcher's resourceVersion
        cluster.start_apiserver()
        assert watcher.pod(ns, "old") is not None  # still the last known state
        proxy.restore()
        until("the relist", lambda: watcher.job_id(ns, "new") == "k8s:partition/LeaderWorkerSet/lws", timeout=90)
        assert watcher.pod(ns, "old") is None and len(watcher) == 1
        assert watcher.telemetry.counter("otel_ofu.attribution.kubernetes.lists", reason="expired") == 1
        assert not watcher.stale
    finally:
        proxy.close()


# --- the attribution processor and the whole pipeline -------------------------------------------------

GPUS = [f"GPU-{i:08x}-1111-2222-3333-444455556666" for i in range(9)]


def test_kubelet_pod_resources_plus_api_names_one_job_with_its_precision(cluster, kubelet):  # noqa: F811
    """The kubelet says which pod holds which GPU; the API says whose job that pod is."""
    ns, node = "nlp", "gpu-node-k"
    cluster.namespace(ns)
    job = owner("PyTorchJob", "llama", "kubeflow.org/v1")
    for i in range(2):
        cluster.create_pod(ns, f"llama-worker-{i}", node, owners=[job], annotations={PRECISION: "fp8"},
                           labels={"training.kubeflow.org/job-name": "llama", "team": "nlp", "cost-center": "42"})
    vllm_rs = owner("ReplicaSet", "vllm-7d9c8b6f5", "apps/v1")
    cluster.create_pod(ns, "vllm-7d9c8b6f5-q2w3e", node, owners=[vllm_rs],
                       labels={"app": "vllm", "pod-template-hash": "7d9c8b6f5", "team": "serving"})
    kubelet.pods = [kubelet_pod("llama-worker-0", ns, ("pytorch", "nvidia.com/gpu", GPUS[0:4])),
                    kubelet_pod("llama-worker-1", ns, ("pytorch", "nvidia.com/gpu", GPUS[4:8])),
                    kubelet_pod("vllm-7d9c8b6f5-q2w3e", ns, ("vllm", "nvidia.com/gpu", GPUS[8:9]))]
    config = build_config(AttributionProcessorConfig, {
        "kubelet": {"enabled": True, "socket": kubelet.socket, "timeout": "5s"},
        "kubernetes_api": {"enabled": True, "node_name": node, "copy_labels": ["team"],
                           "kubeconfig": str(cluster.kubeconfig(WATCHER_TOKEN, WATCHER_USER))}})
    attribution = AttributionProcessor(config, Context("attribution", Telemetry()))
    attribution.start()
    try:
        assert attribution.pods.synced.wait(60)
        attribution.refresh()
        batch = Batch(samples=[sample(uuid, index=i) for i, uuid in enumerate(GPUS)])
        ofu = OfuProcessor(build_config(OfuProcessorConfig, {}), Context("ofu"))
        points = [p for p in ofu.process(attribution.process(batch)).points if p.name == "gpu.ofu"]
    finally:
        attribution.shutdown()
    by_gpu = {dict(p.resource)["hw.id"]: p for p in points}
    llama = [by_gpu[u] for u in GPUS[:8]]
    assert {dict(p.resource)["ofu.job.id"] for p in llama} == {"k8s:nlp/PyTorchJob/llama"}  # 8 GPUs, 2 pods, 1 job
    assert {dict(p.resource)["ofu.precision"] for p in llama} == {"fp8"}
    assert {dict(p.resource)["ofu.job.source"] for p in llama} == {"k8s_api+kubelet"}
    first = dict(llama[0].resource)
    assert first["ofu.job.kind"] == "PyTorchJob" and first["k8s.pod.label.team"] == "nlp"
    assert "k8s.pod.label.cost-center" not in first  # not in copy_labels
    assert first["k8s.pod.uid"] == attribution.pods.pod(ns, "llama-worker-0").uid
    vllm = by_gpu[GPUS[8]]
    assert dict(vllm.resource)["ofu.job.id"] == "k8s:nlp/Deployment/vllm"
    assert dict(vllm.resource)["ofu.job.kind"] == "Deployment"
    assert dict(vllm.resource)["ofu.precision"] == "unknown"  # nothing declared: no guess
    assert attribution.pods.job_id(ns, "llama-worker-1") == "k8s:nlp/PyTorchJob/llama"  # the same answer for other code


def test_a_gpu_process_cgroup_joins_its_pod_through_the_api(cluster, watchers, tmp_path):
    """Without the kubelet source, a process's cgroup pod uid is enough: the API names the pod and job."""
    ns, node = "uid", "gpu-node-u"
    cluster.namespace(ns)
    created = cluster.create_pod(ns, "gpt-workers-0-0-abcde", node,
                                 labels={"jobset.sigs.k8s.io/jobset-name": "gpt"}, annotations={PRECISION: "bf16"})
    uid = created["metadata"]["uid"]
    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/"
                                 "cri-containerd-0123456789abcdef.scope\n")
    (proc / "environ").write_bytes(b"OFU_PRECISION=fp8\0")  # the pod's annotation wins
    config = build_config(AttributionProcessorConfig, {
        "processes": {"enabled": True, "proc_root": str(tmp_path / "proc")},
        "kubernetes_api": {"enabled": True, "node_name": node,
                           "kubeconfig": str(cluster.kubeconfig(WATCHER_TOKEN, WATCHER_USER))}})
    attribution = AttributionProcessor(config, Context("attribution", Telemetry()))
    attribution.start()
    try:
        assert attribution.pods.synced.wait(60)
        (out,) = attribution.process(Batch(samples=[sample(GPUS[0], attributes={"process.pid": 4242})])).samples
    finally:
        attribution.shutdown()
    assert out.job_id == "k8s:uid/JobSet/gpt" and out.precision == "bf16"
    assert out.resource["k8s.pod.name"] == "gpt-workers-0-0-abcde" and out.resource["k8s.pod.uid"] == uid
    assert out.resource["ofu.job.source"] == "k8s_api+process"


def test_dcgm_exporter_page_and_the_api_server_give_exported_points_their_job(cluster, tmp_path):
    """otel-ofu run: a real dcgm-exporter page (pod labels) -> attribution (API server) -> ofu -> file."""
    ns, node = "ml-research", "gpu-node-h100-01"
    cluster.namespace(ns)
    cluster.create_pod(ns, "llama-70b-pretrain-0", node, owners=[owner("PyTorchJob", "llama-70b-pretrain",
                                                                       "kubeflow.org/v1")],
                       labels={"training.kubeflow.org/job-name": "llama-70b-pretrain", "team": "research"},
                       annotations={PRECISION: "bf16"})
    exporter = PageServer({"/metrics": (DATA / "dcgm-exporter" / "h100.prom").read_bytes()})  # a recorded page
    out = tmp_path / "points.jsonl"
    config = tmp_path / "otel-ofu.yaml"
    config.write_text(yaml.safe_dump({
        "receivers": {"dcgm_exporter": {"endpoint": f"{exporter.url}/metrics",
                                        "collection_interval": "1s"}},
        "processors": {"attribution": {"kubernetes_api": {
            "enabled": True, "kubeconfig": str(cluster.kubeconfig(WATCHER_TOKEN, WATCHER_USER)),
            "copy_labels": ["team"]}}, "ofu": {}},
        "exporters": {"file": {"path": str(out)}},
        "service": {"pipelines": {"metrics": {"receivers": ["dcgm_exporter"], "processors": ["attribution", "ofu"],
                                              "exporters": ["file"]}}}}))
    run = Process("otel-ofu", otel_ofu_command(config), tmp_path / "otel-ofu.log", env={"K8S_NODE_NAME": node})

    def attributed():
        require_alive(run)
        return [p for p in read_points(out) if p.name == "gpu.ofu"
                and dict(p.resource).get("ofu.job.id") == "k8s:ml-research/PyTorchJob/llama-70b-pretrain"]

    try:
        points = wait_for("points carrying the PyTorchJob's id", attributed, timeout=120, diagnostics=run.tail)
    finally:
        assert run.stop() == 0, run.tail()
        exporter.close()
    point = points[-1]
    assert dict(point.resource)["ofu.precision"] == "bf16"
    resource = dict(point.resource)
    assert resource["k8s.pod.name"] == "llama-70b-pretrain-0" and resource["ofu.job.kind"] == "PyTorchJob"
    assert resource["k8s.pod.label.team"] == "research"
    # the page's second GPU has no pod, on a page that maps pods: idle (none, as docs/metrics.md says), and
    # nothing invented
    idle = [p for p in read_points(out) if p.name == "gpu.power.usage" and dict(p.resource)["hw.id"].endswith("5c61")]
    assert idle and {dict(p.resource)["ofu.job.id"] for p in idle} == {"none"}
    assert not any(k.startswith("k8s.") for p in idle for k in dict(p.resource))


# --- start-up errors (no API server needed) -----------------------------------------------------------

def test_start_without_node_name_or_client_config_says_what_to_set(monkeypatch, tmp_path):
    monkeypatch.delenv("K8S_NODE_NAME", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = KubernetesApiSourceConfig(enabled=True)  # not validated: validate says the same (test_config_checks)
    with pytest.raises(KubernetesApiError, match="K8S_NODE_NAME.*spec.nodeName"):
        PodWatcher(config).start()
    monkeypatch.setenv("K8S_NODE_NAME", "gpu-node-1")
    with pytest.raises(KubernetesApiError, match="in-cluster config .*set kubernetes_api.kubeconfig"):
        PodWatcher(config).start()
    missing = build_config(KubernetesApiSourceConfig, {"kubeconfig": str(tmp_path / "nope.yaml")})
    with pytest.raises(KubernetesApiError, match="nope.yaml"):
        PodWatcher(missing).start()
