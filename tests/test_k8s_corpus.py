"""Job identity of the Kubernetes corpus (tests/data/real/k8s/, sources in tests/data/real/README.md).

Each file holds pods as their controllers make them (PyTorchJob, JobSet, LeaderWorkerSet, RayJob,
Volcano, Kueue-admitted Job and Deployment, a Deployment named like the PyTorchJob), each with the
identity written beside it by hand: kind, name, ``ofu.job.id`` and ``ofu.job.run``. The pods are
loaded into the real kube-apiserver, and the node's PodWatcher must name each as expected; the
same rules on the pod objects alone, and on what a dcgm-exporter page carries of them (its pod
labels, sanitized), must agree.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from otel_ofu.attribution.k8s_identity import JOB_RULE_LABELS, job_id, job_identity, labelled_pod_job
from otel_ofu.core import dcgm_fields
from tests.kube_apiserver import WATCHER_TOKEN, WATCHER_USER, KubeApiServer

DATA = Path(__file__).parent / "data" / "real" / "k8s"
WORKLOADS = sorted(p for p in DATA.glob("*.yaml") if not p.name.startswith("dra-"))
ENTRIES = [(path.stem, entry) for path in WORKLOADS for entry in yaml.safe_load(path.read_text())]
NODE = "gpu-node-corpus"


def entry_id(case) -> str:
    stem, entry = case
    return f"{stem}:{entry['object']['metadata']['name']}"


def identity(job, namespace: str) -> dict:
    return {"kind": job.kind, "name": job.name, "job_id": job_id(namespace, job), "run": job.run}


@pytest.mark.parametrize("case", ENTRIES, ids=entry_id)
def test_each_pod_names_its_job_as_written_beside_it(case):
    _, entry = case
    pod = entry["object"]
    assert identity(job_identity(pod), pod["metadata"]["namespace"]) == entry["expect"]


@pytest.mark.parametrize("case", ENTRIES, ids=entry_id)
def test_a_pages_pod_labels_name_the_same_job(case):
    """What dcgm-exporter --kubernetes-enable-pod-labels carries of the pod (its labels, keys
    sanitized; no owner references) names the same job, where the labels can say it."""
    _, entry = case
    pod, expect = entry["object"], entry["expect"]
    meta = pod["metadata"]
    page_labels = {re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in (meta.get("labels") or {}).items()}
    labels = {"gpu": "0", "UUID": "GPU-00000000-0000-0000-0000-000000000000", "pod": meta["name"],
              "namespace": meta["namespace"], "container": "c", **page_labels}
    resource = dcgm_fields.identity_from_labels(labels)["resource"]
    job = labelled_pod_job(meta["namespace"], meta["name"], resource)
    if expect["kind"] == "RayCluster":
        pytest.skip("named by its owner reference, which a page does not carry")
    assert (job.kind, job.name, job_id(meta["namespace"], job)) == (expect["kind"], expect["name"], expect["job_id"])
    # The run needs the job object's UID: a page has it only where a label carries it (Job, JobSet).
    assert job.run == (expect["run"] if expect["kind"] in ("Job", "JobSet") else "")


def test_the_page_labels_read_are_the_labels_the_rules_read():
    assert set(dcgm_fields.POD_LABEL_KEYS) == {*JOB_RULE_LABELS, "ofu.dev/precision"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    server = KubeApiServer(tmp_path_factory.mktemp("kube")).start()
    server.grant(WATCHER_USER, "otel-ofu-pods", [{"apiGroups": [""], "resources": ["pods"],
                                                  "verbs": ["get", "list", "watch"]}])
    yield server
    server.stop()


def test_the_api_servers_pods_name_their_jobs(cluster):
    from otel_ofu.attribution.config import KubernetesApiSourceConfig
    from otel_ofu.attribution.k8s_api import PodWatcher
    from otel_ofu.pipeline.config import build_config

    for namespace in sorted({e["object"]["metadata"]["namespace"] for _, e in ENTRIES}):
        cluster.namespace(namespace)
    for _, entry in ENTRIES:
        meta = entry["object"]["metadata"]
        cluster.api("POST", f"/api/v1/namespaces/{meta['namespace']}/pods", entry["object"])
    config = build_config(KubernetesApiSourceConfig, {
        "enabled": True, "node_name": NODE, "kubeconfig": str(cluster.kubeconfig(WATCHER_TOKEN, WATCHER_USER))})
    watcher = PodWatcher(config)
    watcher.start()
    try:
        assert watcher.synced.wait(60)
        seen = {}
        for _, entry in ENTRIES:
            meta = entry["object"]["metadata"]
            record = watcher.pod(meta["namespace"], meta["name"])
            seen[meta["name"]] = identity(record.job, record.namespace)
    finally:
        watcher.stop()
    assert seen == {e["object"]["metadata"]["name"]: e["expect"] for _, e in ENTRIES}
    # the PyTorchJob and the Deployment of one name are two jobs; the re-created PyTorchJob one id, two runs
    assert seen["llama-70b-master-0"]["job_id"] != seen["llama-70b-6d8f7c9b54-x2kqp"]["job_id"]
    assert seen["llama-70b-worker-3"]["job_id"] == seen["llama-70b-worker-4"]["job_id"]
    assert seen["llama-70b-worker-3"]["run"] != seen["llama-70b-worker-4"]["run"]
