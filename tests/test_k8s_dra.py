"""GPUs allocated by Dynamic Resource Allocation (issue 24), against a real kube-apiserver v1.34.

The API server serves resource.k8s.io/v1: the NVIDIA DRA driver's ResourceSlice, allocated
ResourceClaims and the pods using them are created from tests/data/real/k8s/dra-nvidia*.yaml
(their sources are named there and in tests/data/real/README.md). The kubelet's pod-resources
server is a real gRPC server speaking the kubelet's proto, its ``dynamic_resources`` filled from
those claims as the kubelet fills them (``devices`` empty for those containers). Covered: every
GPU of a multi-pod PyTorchJob named with its one job id and declared precision; a claim shared by
two pods; a node with device-plugin GPUs too; idle GPUs; MIG devices by their own UUID and by
parent and profile; a slice republished with a new generation and another mapping; the fallback
from the API's claims without the kubelet socket; dcgm-exporter's dra_* labels; the chart's
rendered ClusterRole being enough and read-only (the API server's audit log); and
``otel-ofu run`` from a served dcgm-exporter page to ``gpu.ofu``.
"""

from __future__ import annotations

import copy
import logging
import math
import shutil
import tempfile
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml

from otel_ofu.attribution.k8s_dra import DeviceRef, claim_allocation
from otel_ofu.attribution.kubelet import dra_devices
from otel_ofu.attribution.proto import podresources_v1_pb2 as pb
from otel_ofu.attribution.proto import podresources_v1_pb2_grpc as pb_grpc
from otel_ofu.core.model import Batch
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.attribution import AttributionProcessor, AttributionProcessorConfig
from tests.e2e_util import PageServer, Process, otel_ofu_command, read_points, require_alive, wait_for
from tests.kube_apiserver import WATCHER_TOKEN, WATCHER_USER, KubeApiServer
from tests.test_attribution import Lister, sample

DATA = Path(__file__).parent / "data" / "real" / "k8s"
DRA = yaml.safe_load((DATA / "dra-nvidia.yaml").read_text())
MIG = yaml.safe_load((DATA / "dra-nvidia-mig.yaml").read_text())
ADMIN = yaml.safe_load((DATA / "dra-nvidia-admin-access.yaml").read_text())
DYNAMIC_MIG = yaml.safe_load((DATA / "dra-nvidia-dynamic-mig.yaml").read_text())
PODS_AND_DRA = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]}]
RESOURCE = "/apis/resource.k8s.io/v1"


# --- loading the corpus into the API server --------------------------------------------------------

def create(cluster: KubeApiServer, obj: dict) -> dict:
    """Create an object as its controller would, then set its status (a separate subresource)."""
    obj = copy.deepcopy(obj)
    status = obj.pop("status", None)
    kind, meta = obj["kind"], obj["metadata"]
    path = {"Pod": f"/api/v1/namespaces/{meta.get('namespace')}/pods",
            "ResourceClaim": f"{RESOURCE}/namespaces/{meta.get('namespace')}/resourceclaims",
            "ResourceSlice": f"{RESOURCE}/resourceslices"}[kind]
    created = cluster.api("POST", path, obj)
    if status:
        created["status"] = {**created.get("status", {}), **status}
        if kind == "ResourceClaim":
            for entry in created["status"].get("reservedFor", ()):
                entry["uid"] = entry.get("uid") or cluster.api(
                    "GET", f"/api/v1/namespaces/{meta['namespace']}/pods/{entry['name']}")["metadata"]["uid"]
        created = cluster.api("PUT", f"{path}/{meta['name']}/status", created)
    return created


def load(cluster: KubeApiServer, corpus: dict, namespaces: set[str]) -> dict[str, dict]:
    """Slices, pods (status later: the claims are reserved for them), claims; the objects by name."""
    for ns in {o["metadata"]["namespace"] for o in corpus["pods"]} - namespaces:
        cluster.namespace(ns, (corpus.get("namespace_labels") or {}).get(ns))
        namespaces.add(ns)
    out = {}
    for obj in corpus["slices"]:
        out[obj["metadata"]["name"]] = create(cluster, obj)
    pods = [create(cluster, {k: v for k, v in p.items() if k != "status"}) for p in corpus["pods"]]
    for obj in corpus["claims"]:
        out[obj["metadata"]["name"]] = create(cluster, obj)
    for created, given in zip(pods, corpus["pods"], strict=True):
        if given.get("status"):
            created["status"] = {**created.get("status", {}), **given["status"]}
            created = cluster.api("PUT", f"/api/v1/namespaces/{given['metadata']['namespace']}/pods/"
                                         f"{given['metadata']['name']}/status", created)
        out[given["metadata"]["name"]] = created
    return out


def kubelet_answer(corpus: dict, objects: dict[str, dict]) -> list[pb.PodResources]:
    """The kubelet's List answer for the corpus's pods: per container using a claim, the claim and
    its allocated devices (kubelet cm/dra: ClaimInfo per container; the driver's CDI device
    k8s.gpu.nvidia.com/claim=<claim uid>-<device>); device-plugin GPUs in ``devices``."""
    claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in corpus["claims"]}
    held = {tuple(v[:2]): uuid for uuid, v in (corpus.get("device_plugin") or {}).get("held", {}).items()}
    out = []
    for given in corpus["pods"]:
        meta, spec = given["metadata"], given["spec"]
        generated = {s["name"]: s["resourceClaimName"] for s in (given.get("status") or {}).get(
            "resourceClaimStatuses", ())}
        containers = []
        for container in spec["containers"]:
            dynamic = []
            for ref in (container.get("resources") or {}).get("claims", ()):
                entry = next(e for e in spec["resourceClaims"] if e["name"] == ref["name"])
                name = entry.get("resourceClaimName") or generated[entry["name"]]
                claim = claims[(meta["namespace"], name)]
                uid = objects[name]["metadata"]["uid"]
                dynamic.append(pb.DynamicResource(
                    claim_name=name, claim_namespace=meta["namespace"],
                    claim_resources=[pb.ClaimResource(
                        cdi_devices=[pb.CDIDevice(name=f"k8s.gpu.nvidia.com/claim={uid}-{r['device']}")],
                        driver_name=r["driver"], pool_name=r["pool"], device_name=r["device"])
                        for r in claim["status"]["allocation"]["devices"]["results"]]))
            devices = []
            if (meta["namespace"], meta["name"]) in held:
                devices = [pb.ContainerDevices(resource_name="nvidia.com/gpu",
                                               device_ids=[held[(meta["namespace"], meta["name"])]])]
            containers.append(pb.ContainerResources(name=container["name"], devices=devices, cpu_ids=[4, 5],
                                                    dynamic_resources=dynamic))
        out.append(pb.PodResources(name=meta["name"], namespace=meta["namespace"], containers=containers))
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    server = KubeApiServer(tmp_path_factory.mktemp("kube")).start()
    server.grant(WATCHER_USER, "otel-ofu-dra", PODS_AND_DRA)
    namespaces: set[str] = set()
    server.objects = {**load(server, DRA, namespaces), **load(server, MIG, namespaces)}
    yield server
    server.stop()


@pytest.fixture
def kubelet():
    folder = tempfile.mkdtemp(prefix="ofu-k-")
    lister = Lister()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    lister.socket = f"{folder}/kubelet.sock"
    assert server.add_insecure_port(f"unix://{lister.socket}")
    server.start()
    yield lister
    server.stop(grace=None)
    shutil.rmtree(folder, ignore_errors=True)


def attribution(cluster: KubeApiServer, node: str, socket: str | None = None, *, memo_off: bool = False,
                kubernetes_api_extra: dict | None = None, **extra) -> AttributionProcessor:
    config = build_config(AttributionProcessorConfig, {
        **({"kubelet": {"enabled": True, "socket": socket, "timeout": "5s"}} if socket else {}),
        "kubernetes_api": {"enabled": True, "node_name": node, "request_timeout": "5s",
                           "retry_initial_interval": "100ms", "retry_max_interval": "500ms",
                           "kubeconfig": str(cluster.kubeconfig(WATCHER_TOKEN, WATCHER_USER)),
                           **(kubernetes_api_extra or {})}, **extra})
    proc = AttributionProcessor(config, Context("attribution", Telemetry()), memo=not memo_off)
    proc.start()
    assert proc.pods.synced.wait(60) and proc.dra.synced.wait(60)
    return proc


def jobs_of(proc: AttributionProcessor, samples) -> dict[str, tuple]:
    """Each GPU's job, precision, run and shared flag; a GPU several jobs hold (one sample each, issue 32):
    their ids comma-joined, as the corpus writes them, its shares adding up to the GPU."""
    proc.refresh()
    out = proc.process(Batch(samples=list(samples))).samples
    held: dict[str, list] = {}
    for s in out:
        held.setdefault(s.uuid, []).append(s)
    found = {}
    for uuid, holders in held.items():
        s = holders[0]
        if len(holders) == 1:
            assert s.share is None, uuid
            found[uuid] = (s.job_id, s.precision, s.resource.get("ofu.job.run"), s.resource.get("ofu.job.shared"))
            continue
        assert math.fsum(h.share for h in holders) == pytest.approx(1.0, abs=1e-9), uuid  # counted once
        assert all(h.resource["ofu.job.shared"] is True and h.precision == s.precision for h in holders), uuid
        found[uuid] = (",".join(sorted(h.job_id for h in holders)), s.precision, None, True)
    return found


def gpu_samples(corpus: dict) -> list:
    return [sample(uuid, index=i, host=corpus["node"]) for i, uuid in enumerate(corpus["expect"])]


def expected(corpus: dict, uuids=None) -> dict[str, tuple]:
    return {u: (e["job_id"], e.get("precision"), e.get("run"), True if e.get("shared") else None)
            for u, e in corpus["expect"].items() if uuids is None or u in uuids}


# --- the kubelet's dynamic_resources (no API server) ------------------------------------------------

def test_dynamic_resources_are_read_for_the_configured_drivers_only():
    container = pb.ContainerResources(name="ctr", dynamic_resources=[pb.DynamicResource(
        claim_name="c", claim_namespace="ns", claim_resources=[
            pb.ClaimResource(driver_name="gpu.nvidia.com", pool_name="node-7", device_name="gpu-3"),
            pb.ClaimResource(driver_name="gpu.nvidia.com", pool_name="node-7", device_name="gpu-3", share_id="s1"),
            pb.ClaimResource(driver_name="dra.net", pool_name="node-7", device_name="eth1")])])
    response = pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(name="p", namespace="ns",
                                                                          containers=[container])])
    found = dra_devices(response, ["gpu.nvidia.com"])
    assert list(found) == [("gpu.nvidia.com", "node-7", "gpu-3")]
    assert [(h.holder.pod, h.claim_name, h.share_id) for h in found[("gpu.nvidia.com", "node-7", "gpu-3")]] == [
        ("p", "c", ""), ("p", "c", "s1")]
    assert dra_devices(response, []) == {}



def test_an_allocation_result_with_admin_access_is_not_a_device_the_claim_holds():
    claims = {c["metadata"]["name"]: claim_allocation(c) for c in ADMIN["claims"]}
    monitor, job = claims["gpu-monitor-p6w2d-gpus-z7c4n"], claims["bert-worker-0-gpus-m2x8k"]
    assert monitor.devices == () and monitor.reserved_for == ("gpu-monitor-p6w2d",)
    assert monitor.admin_devices == {DeviceRef("gpu.nvidia.com", "gpu-node-adm", f"gpu-{i}") for i in range(4)}
    assert [d.device for d in job.devices] == ["gpu-0", "gpu-1"] and job.admin_devices == frozenset()

# --- against the API server ---------------------------------------------------------------------------

def test_every_gpu_of_a_node_with_dra_and_the_device_plugin_gets_its_job(cluster, kubelet):
    """The PyTorchJob's two pods hold four GPUs through claims: one job id, its precision, its run;
    one claim, two pods: shared; the device plugin's GPU: its Job; the rest: idle."""
    kubelet.pods = kubelet_answer(DRA, cluster.objects)
    kubelet.allocatable = [pb.ContainerDevices(resource_name="nvidia.com/gpu",
                                               device_ids=DRA["device_plugin"]["allocatable"])]
    assert all(not c.devices for p in kubelet.pods if p.name.startswith("llama") for c in p.containers)
    proc = attribution(cluster, DRA["node"], kubelet.socket)
    try:
        assert jobs_of(proc, gpu_samples(DRA)) == expected(DRA)
    finally:
        proc.shutdown()



def test_an_admin_access_claim_holds_no_gpu_and_shares_none(cluster, kubelet):
    """Issue 31 item 19: a monitoring DaemonSet's claim with adminAccess on every GPU of the node (the API
    server takes it in a namespace labelled for admin access) beside a PyTorchJob's claim on two of them.
    The kubelet lists the monitoring pod's devices like any other; the claim's allocation results say
    they are admin access: the job's GPUs stay its own, not shared (with include_shared false a shared
    GPU gives its job no GPU time), and the others stay idle. The same without the kubelet socket."""
    objects = load(cluster, ADMIN, set())
    results = objects["gpu-monitor-p6w2d-gpus-z7c4n"]["status"]["allocation"]["devices"]["results"]
    assert [r.get("adminAccess") for r in results] == [True] * 4  # kept by the API server as written
    kubelet.pods = kubelet_answer(ADMIN, objects)
    assert {p.name for p in kubelet.pods for c in p.containers if c.dynamic_resources} == {
        "bert-worker-0", "gpu-monitor-p6w2d"}
    for socket in (kubelet.socket, None):
        proc = attribution(cluster, ADMIN["node"], socket)
        try:
            assert jobs_of(proc, gpu_samples(ADMIN)) == expected(ADMIN)
        finally:
            proc.shutdown()

def test_without_the_kubelet_socket_the_api_claims_map_the_dra_gpus(cluster):
    """ResourceClaim.status.allocation plus reservedFor, read for this node's pods (get only)."""
    since = len(cluster.audit(WATCHER_USER))
    proc = attribution(cluster, DRA["node"])
    try:
        dra_uuids = [u for u in DRA["expect"] if u not in DRA["device_plugin"]["allocatable"]]
        assert jobs_of(proc, gpu_samples(DRA)) == {**expected(DRA, dra_uuids), **{
            u: (None, None, None, None) for u in DRA["device_plugin"]["allocatable"]}}  # the kubelet would know
    finally:
        proc.shutdown()
    gets = {(e["verb"], e["objectRef"]["name"]) for e in cluster.audit(WATCHER_USER)[since:]
            if (e.get("objectRef") or {}).get("resource") == "resourceclaims"}
    assert gets == {("get", c["metadata"]["name"]) for c in DRA["claims"]}  # only the node's pods' claims


def test_a_republished_slice_generation_replaces_the_mapping_without_a_restart(cluster, kubelet):
    """The driver restarts and numbers its GPUs the other way round: generation 2 maps gpu-0 to the
    former gpu-1's UUID. The old generation's slice, still there, must not map anything. The slice set
    replaced while the jobs run (issue 32): each window's GPUs are counted once, the PyTorchJob one GPU
    of the two in each, the claim's two pods the other, halved."""
    from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
    from tests.test_sharing import jobs_account

    kubelet.pods = kubelet_answer(DRA, cluster.objects)
    proc = attribution(cluster, DRA["node"], kubelet.socket)
    first, second = "GPU-3b1f6a2e-7c4d-4e8a-9f10-0a1b2c3d4e50", "GPU-3b1f6a2e-7c4d-4e8a-9f10-0a1b2c3d4e54"

    def window(t: int) -> list:
        return [sample(first, host=DRA["node"], t=t), sample(second, index=4, host=DRA["node"], t=t)]

    t0, t1 = 10**18, 10**18 + 30 * 10**9
    try:
        before = jobs_of(proc, window(t0))
        assert before[first][0] == "k8s:ml/PyTorchJob/llama" and before[second][3] is True
        held = [proc.process(Batch(samples=window(t0))).samples]
        republished = copy.deepcopy(DRA["slices"][0])
        republished["metadata"] = {"name": "gpu-node-dra-gpu.nvidia.com-r2d2x",
                                   "generateName": "gpu-node-dra-gpu.nvidia.com-"}
        republished["spec"]["pool"]["generation"] = 2
        devices = {d["name"]: d for d in republished["spec"]["devices"]}
        devices["gpu-0"]["attributes"]["uuid"], devices["gpu-4"]["attributes"]["uuid"] = (
            {"string": second}, {"string": first})
        create(cluster, republished)
        wait_for("the new generation", lambda: (
            lambda j: j if j[first][3] is True and j[second][0] == "k8s:ml/PyTorchJob/llama" else None)(
                jobs_of(proc, window(t1))),
            timeout=30, interval=0.2)
        held.append(proc.process(Batch(samples=window(t1))).samples)
    finally:
        proc.shutdown()
        cluster.api("DELETE", f"{RESOURCE}/resourceslices/gpu-node-dra-gpu.nvidia.com-r2d2x")
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu", Telemetry()))
    account = jobs_account([p for samples in held for p in ofu.process(Batch(samples=samples)).points])
    assert dict(account.seconds) == pytest.approx({
        "k8s:ml/PyTorchJob/llama": 60.0, "k8s:gpu-test3/Pod/pod1": 30.0, "k8s:gpu-test3/Pod/pod2": 30.0})


def test_mig_devices_by_their_own_uuid_or_by_parent_and_profile(cluster, kubelet):
    kubelet.pods = kubelet_answer(MIG, cluster.objects)
    proc = attribution(cluster, MIG["node"], kubelet.socket)
    parent = "GPU-8e1d2c3b-4a5f-4e6d-8c7b-9a0f1e2d3c40"
    try:
        by_uuid = [sample(parent, index=0, host=MIG["node"], resource={"gpu.mig.instance_id": str(i),
                                                                      "gpu.mig.uuid": mig})
                   for i, mig in enumerate(MIG["expect"]["by_uuid"], start=1)]
        proc.refresh()
        out = proc.process(Batch(samples=by_uuid)).samples
        assert {s.resource["gpu.mig.uuid"]: (s.job_id, s.precision) for s in out} == {
            u: (e["job_id"], e.get("precision")) for u, e in MIG["expect"]["by_uuid"].items()}
        # As a dcgm-exporter page has them: every instance of the GPU (one 3g.40gb, two 1g.10gb), by profile.
        profiles = [d["attributes"]["profile"]["string"] for d in MIG["slices"][0]["spec"]["devices"]]
        by_profile = [sample(parent, index=0, host=MIG["node"], resource={"gpu.mig.instance_id": str(i),
                                                                         "gpu.mig.profile": profile})
                      for i, profile in enumerate(profiles, start=1)]
        out = proc.process(Batch(samples=by_profile)).samples
        assert [(s.resource["gpu.mig.profile"], s.job_id, s.precision) for s in out] == [
            (p, MIG["expect"]["by_profile"][p]["job_id"], MIG["expect"]["by_profile"][p].get("precision"))
            for p in profiles]
    finally:
        proc.shutdown()


def test_mig_devices_created_on_demand_are_split_among_the_pods_holding_that_profile(cluster, kubelet):
    """Issue 32, NVIDIA/dcgm-exporter#714: with DynamicMIG the slices publish abstract MIG devices (a profile
    at a placement, no UUID) and the instance is made when a claim is prepared, so nothing maps a dcgm-exporter
    sample (GPU_I_PROFILE, GPU_I_ID) to its device. The one 3g.40gb on the GPU is its holder's; the two 1g.10gb
    held by two jobs' pods, two 1g.10gb instances on the GPU: which is whose is not known, so each job gets half
    of each (mig_profile), one instance's worth of GPU time each. A third 1g.10gb instance nobody holds makes
    them unknown again (never a guess). From the kubelet's dynamic_resources and from the claims alone."""
    from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
    from tests.test_sharing import jobs_account

    objects = load(cluster, DYNAMIC_MIG, set())
    kubelet.pods = kubelet_answer(DYNAMIC_MIG, objects)
    parent = DYNAMIC_MIG["expect"]["parent"]
    instances = DYNAMIC_MIG["expect"]["instances"]

    def page(t: int, extra: tuple = ()) -> list:
        return [sample(parent, index=0, host=DYNAMIC_MIG["node"], t=t, resource={
            "gpu.mig.instance_id": i["instance"], "gpu.mig.profile": i["profile"]}) for i in [*instances, *extra]]

    for socket in (kubelet.socket, None):
        proc = attribution(cluster, DYNAMIC_MIG["node"], socket)
        try:
            proc.refresh()
            ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu", Telemetry()))
            points, shares = [], {}
            for k in range(3):
                out = proc.process(Batch(samples=page(10**18 + k * 30 * 10**9))).samples
                for s in out:
                    shares.setdefault(s.resource["gpu.mig.instance_id"], {})[s.job_id] = (s.share, s.share_basis)
                points += ofu.process(Batch(samples=out)).points
            assert shares == {i["instance"]: {job: (None if share == 1.0 else share, "" if share == 1.0 else
                                                   "mig_profile") for job, share in i["jobs"].items()}
                              for i in instances}, socket
            account = jobs_account(points)
            assert {job: account.seconds[job] for job in account.seconds} == pytest.approx(
                {job: 3 * 30.0 for i in instances for job in i["jobs"]}), socket  # one instance each, 3 windows
            unheld = proc.process(Batch(samples=page(10**18 + 99 * 10**9, (
                {"instance": "11", "profile": "1g.10gb"},)))).samples
            assert {s.resource["gpu.mig.instance_id"]: s.job_id for s in unheld} == {
                "1": "k8s:dmig/Pod/train-c", "9": None, "10": None, "11": None}
        finally:
            proc.shutdown()


def test_dcgm_exporter_dra_labels_name_the_claims_pods(cluster):
    """dcgm-exporter --kubernetes-enable-dra repeats a shared GPU's series per pod, each with the
    claim: through the claim both pods hold it, so each series says shared, not one job each."""
    from otel_ofu.receivers.dcgm_exporter import parse_metrics

    uuid = "GPU-3b1f6a2e-7c4d-4e8a-9f10-0a1b2c3d4e54"
    lines = []
    for pod in ("pod1", "pod2"):
        labels = (f'gpu="4",UUID="{uuid}",pci_bus_id="00000000:9A:00.0",device="nvidia4",'
                  f'modelName="NVIDIA H100 80GB HBM3",hostname="gpu-node-dra",container="ctr",namespace="gpu-test3",'
                  f'pod="{pod}",dra_claim_name="single-gpu",dra_claim_namespace="gpu-test3",'
                  f'dra_driver_name="gpu.nvidia.com",dra_pool_name="gpu-node-dra",dra_device_name="gpu-4"')
        lines += [f"DCGM_FI_DEV_SM_CLOCK{{{labels}}} 1755", f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels}}} 0.400000"]
    samples = parse_metrics("\n".join(lines) + "\n", time_unix_nano=10**18, window_s=30)
    assert len(samples) == 2 and samples[0].resource["k8s.resourceclaim.name"] == "single-gpu"
    proc = attribution(cluster, DRA["node"])
    try:
        proc.refresh()
        out = proc.process(Batch(samples=samples)).samples
    finally:
        proc.shutdown()
    # The two copies are one GPU: one sample per pod, each half of it (issue 32: each copy was a whole GPU).
    assert sorted((s.job_id, s.share, s.resource["k8s.pod.name"]) for s in out) == [
        ("k8s:gpu-test3/Pod/pod1", 0.5, "pod1"), ("k8s:gpu-test3/Pod/pod2", 0.5, "pod2")]
    assert all(s.resource["ofu.job.shared"] is True and s.share_basis == "even" for s in out)


def test_the_memo_changes_no_answer_while_pods_slices_and_claims_change(cluster, kubelet):
    """Attribution keeps each device's answer while its samples and every source are the same
    (tests/test_attribution_memo.py): against the real API server, whatever changes between two batches
    (a pod's declared precision or a copied label, the driver republishing its slice with the GPUs in
    another order, the kubelet listing other pods' DRA devices, the samples carrying dcgm-exporter's
    dra_claim_* labels of the shared claim or not), the processor keeping answers and one resolving every
    device every time give the same samples."""
    import itertools

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from otel_ofu.attribution.k8s_dra import DraGpu

    node, shared = DRA["node"], "GPU-3b1f6a2e-7c4d-4e8a-9f10-0a1b2c3d4e54"
    pods = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in DRA["pods"]]
    uuids = [d["attributes"]["uuid"]["string"] for d in DRA["slices"][0]["spec"]["devices"]]
    procs = [attribution(cluster, node, kubelet.socket, refresh_interval="1h", memo_off=memo_off,
                         kubernetes_api_extra={"copy_labels": ["team"]}) for memo_off in (False, True)]
    generations = itertools.count(2)
    made_slices: list[str] = []

    def pod_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{namespace}/pods/{name}"

    def set_meta(namespace: str, name: str, kind: str, key: str, value: str | None) -> None:
        obj = cluster.api("GET", pod_path(namespace, name))
        found = obj["metadata"].setdefault(kind, {})
        if value is None:
            found.pop(key, None)
        else:
            found[key] = value
        cluster.api("PUT", pod_path(namespace, name), obj)

    def window(t: int, labelled: bool) -> list:
        samples = [s for s in gpu_samples(DRA) if not (labelled and s.uuid == shared)]
        for s in samples:
            s.time_unix_nano = t
        if labelled:  # dcgm-exporter --kubernetes-enable-dra: the shared GPU's series once per pod
            samples += [sample(shared, index=4, host=node, t=t, resource={
                "k8s.namespace.name": "gpu-test3", "k8s.pod.name": pod, "k8s.container.name": "ctr",
                "k8s.resourceclaim.name": "single-gpu", "k8s.resourceclaim.namespace": "gpu-test3"})
                for pod in ("pod1", "pod2")]
        return samples

    steps = st.lists(st.fixed_dictionaries({
        "change": st.sampled_from(["none", "precision", "label", "slice", "kubelet"]),
        "pod": st.sampled_from(pods),
        "value": st.sampled_from([None, "bf16", "fp8", "fp16"]),
        "order": st.permutations(range(len(uuids))),
        "held": st.lists(st.booleans(), min_size=len(DRA["pods"]), max_size=len(DRA["pods"])),
        "labelled": st.booleans(),
    }), min_size=2, max_size=5)

    def change(step: dict) -> None:
        """One change of the sources' state, seen by both processors' watches before it returns."""
        (namespace, name), value, order = step["pod"], step["value"], step["order"]
        if step["change"] == "precision":
            set_meta(namespace, name, "annotations", "ofu.dev/precision", value)
            wait_for("the pod's precision", lambda: all(
                p.pods.pod(namespace, name).precision == value for p in procs), timeout=30)
        elif step["change"] == "label":
            set_meta(namespace, name, "labels", "team", value)
            wait_for("the pod's label", lambda: all(
                p.pods.pod(namespace, name).labels.get("k8s.pod.label.team") == value for p in procs), timeout=30)
        elif step["change"] == "slice":
            republished = copy.deepcopy(DRA["slices"][0])
            republished["metadata"] = {"name": f"gpu-node-dra-gpu.nvidia.com-m{len(made_slices)}"}
            republished["spec"]["pool"]["generation"] = next(generations)
            for device, i in zip(republished["spec"]["devices"], order, strict=True):
                device["attributes"]["uuid"] = {"string": uuids[i]}
            create(cluster, republished)
            made_slices.append(republished["metadata"]["name"])
            refs = [DeviceRef("gpu.nvidia.com", node, d["name"]) for d in republished["spec"]["devices"]]
            wait_for("the republished slice", lambda: all(
                p.dra.slices.gpu(ref) == DraGpu(uuids[i].lower()) for p in procs
                for ref, i in zip(refs, order, strict=True)), timeout=30)
        elif step["change"] == "kubelet":
            kubelet.pods = [p for p, held in zip(kubelet_answer(DRA, cluster.objects), step["held"], strict=True)
                            if held]

    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(steps=steps)
    def same_answers(steps: list[dict]) -> None:
        t = 10**18
        for step in steps:
            change(step)
            for proc in procs:
                proc.refresh()
            kept, fresh = (proc.process(Batch(samples=window(t, step["labelled"]))).samples for proc in procs)
            assert [(s.uuid, s.job_id, s.precision, s.resource, s.attributes, s.share, s.share_basis) for s in kept] \
                == [(s.uuid, s.job_id, s.precision, s.resource, s.attributes, s.share, s.share_basis) for s in fresh]
            t += 30 * 10**9

    kubelet.pods = kubelet_answer(DRA, cluster.objects)
    try:
        same_answers()
    finally:
        for proc in procs:
            proc.shutdown()
        for name in made_slices:
            cluster.api("DELETE", f"{RESOURCE}/resourceslices/{name}")
        for given_pod in DRA["pods"]:  # as the corpus has them, for the tests after this one
            meta = given_pod["metadata"]
            obj = cluster.api("GET", pod_path(meta["namespace"], meta["name"]))
            obj["metadata"]["labels"] = dict(meta.get("labels") or {})
            obj["metadata"]["annotations"] = dict(meta.get("annotations") or {})
            cluster.api("PUT", pod_path(meta["namespace"], meta["name"]), obj)


def test_without_rbac_on_resourceslices_it_says_what_to_grant(cluster, caplog, tmp_path):
    from tests.kube_apiserver import STRANGER_TOKEN, STRANGER_USER

    cluster.grant(STRANGER_USER, "stranger-pods", PODS_AND_DRA[:1])
    config = build_config(AttributionProcessorConfig, {"kubernetes_api": {
        "enabled": True, "node_name": DRA["node"], "request_timeout": "5s", "retry_initial_interval": "100ms",
        "retry_max_interval": "500ms", "kubeconfig": str(cluster.kubeconfig(STRANGER_TOKEN, STRANGER_USER))}})
    proc = AttributionProcessor(config, Context("attribution", Telemetry()))
    with caplog.at_level(logging.ERROR, logger="otel_ofu.attribution.k8s_api"):
        proc.start()
        try:
            assert proc.pods.synced.wait(60)
            wait_for("the refusal", lambda: any("resourceslices" in r.getMessage() for r in caplog.records),
                     timeout=30)
        finally:
            proc.shutdown()
    message = next(r.getMessage() for r in caplog.records if "resourceslices" in r.getMessage())
    assert "403" in message and "get, list and watch on resourceslices.resource.k8s.io" in message
    assert "#rbac" in message


# --- the chart's RBAC and the whole pipeline -----------------------------------------------------------

def test_the_charts_clusterrole_is_enough_and_read_only(tmp_path):
    """The ClusterRole the chart renders for the agent, applied to a fresh API server as the agent's
    only role: everything DRA needs works, and every request is a read."""
    from tests.deploy_util import one, template

    role = one(template(), "ClusterRole", "agent")
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert verbs <= {"get", "list", "watch"}, verbs
    server = KubeApiServer(tmp_path / "kube").start()
    try:
        server.grant(WATCHER_USER, "otel-ofu-chart-agent", role["rules"])
        load(server, DRA, set())  # no kubelet: the claims alone map the GPUs
        since = len(server.audit(WATCHER_USER))
        proc = attribution(server, DRA["node"])
        try:
            jobs = jobs_of(proc, gpu_samples(DRA))
        finally:
            proc.shutdown()
        assert jobs["GPU-3b1f6a2e-7c4d-4e8a-9f10-0a1b2c3d4e50"][0] == "k8s:ml/PyTorchJob/llama"
        made = wait_for("the ended watches in the audit log", lambda: (
            lambda events: events if {e["objectRef"].get("resource") for e in events if e["verb"] == "watch"}
            >= {"pods", "resourceslices"} else None)(server.audit(WATCHER_USER)[since:]), timeout=30)
        refused = [(e["verb"], e["requestURI"]) for e in made if e["responseStatus"]["code"] >= 400]
        assert not refused
        assert {e["verb"] for e in made} <= {"get", "list", "watch"}
    finally:
        server.stop()


def test_otel_ofu_run_names_every_dra_gpu_of_the_job_from_a_served_page(cluster, kubelet, tmp_path):
    """otel-ofu run: a dcgm-exporter page (no pod labels: dcgm-exporter without --kubernetes-enable-dra)
    -> attribution (kubelet dynamic_resources + the API's ResourceSlices) -> ofu -> gpu.ofu."""
    kubelet.pods = kubelet_answer(DRA, cluster.objects)
    lines = ["# TYPE DCGM_FI_DEV_SM_CLOCK gauge", "# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge"]
    for i, uuid in enumerate(DRA["expect"]):
        labels = (f'gpu="{i}",UUID="{uuid}",device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3",'
                  f'hostname="{DRA["node"]}"')
        lines += [f"DCGM_FI_DEV_SM_CLOCK{{{labels}}} 1830", f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels}}} 0.500000"]
    exporter = PageServer({"/metrics": ("\n".join(lines) + "\n").encode()})
    out = tmp_path / "points.jsonl"
    config = tmp_path / "otel-ofu.yaml"
    config.write_text(yaml.safe_dump({
        "receivers": {"dcgm_exporter": {"endpoint": f"{exporter.url}/metrics", "collection_interval": "1s"}},
        "processors": {"attribution": {
            "refresh_interval": "1s", "kubelet": {"enabled": True, "socket": kubelet.socket},
            "kubernetes_api": {"enabled": True, "kubeconfig": str(cluster.kubeconfig(WATCHER_TOKEN, WATCHER_USER))}},
            "ofu": {}},
        "exporters": {"file": {"path": str(out)}},
        "service": {"pipelines": {"metrics": {"receivers": ["dcgm_exporter"], "processors": ["attribution", "ofu"],
                                              "exporters": ["file"]}}}}))
    run = Process("otel-ofu", otel_ofu_command(config), tmp_path / "otel-ofu.log", env={"K8S_NODE_NAME": DRA["node"]})
    llama = {u for u, e in DRA["expect"].items() if e["job_id"] == "k8s:ml/PyTorchJob/llama"}

    def named():
        require_alive(run)
        points = {dict(p.resource)["hw.id"]: dict(p.resource) for p in read_points(out) if p.name == "gpu.ofu"}
        return points if all(points.get(u, {}).get("ofu.job.id") == "k8s:ml/PyTorchJob/llama" for u in llama) else None

    try:
        points = wait_for("gpu.ofu of the DRA GPUs carrying the PyTorchJob's id", named, timeout=120,
                          diagnostics=run.tail)
    finally:
        assert run.stop() == 0, run.tail()
        exporter.close()
    assert {points[u]["ofu.precision"] for u in llama} == {"fp8"}  # the pods' declared precision
    assert {points[u]["ofu.job.run"] for u in llama} == {"5d6e7f80-91a2-4b3c-8d4e-5f6a7b8c9d0e"}
    assert points["GPU-3b1f6a2e-7c4d-4e8a-9f10-0a1b2c3d4e55"]["ofu.job.id"] == "none"  # unallocated: still OFU
    assert points["GPU-3b1f6a2e-7c4d-4e8a-9f10-0a1b2c3d4e54"]["ofu.job.shared"] is True


def test_doctor_kubernetes_says_what_works_and_what_to_grant(cluster, tmp_path):
    import json
    import subprocess
    import sys

    from tests.kube_apiserver import STRANGER_TOKEN, STRANGER_USER

    def doctor(token: str, user: str, node: str) -> tuple[int, dict]:
        done = subprocess.run([sys.executable, "-m", "otel_ofu", "doctor", "--kubernetes", "--json",
                               "--kubeconfig", str(cluster.kubeconfig(token, user)), "--node", node],
                              capture_output=True, text=True, timeout=120)
        return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["checks"]}

    rc, checks = doctor(WATCHER_TOKEN, WATCHER_USER, DRA["node"])
    assert rc == 0 and all(c["status"] == "ok" for c in checks.values()), checks
    assert "name 6 GPU(s)" in checks["DRA gpu.nvidia.com"]["detail"]
    rc, checks = doctor(WATCHER_TOKEN, WATCHER_USER, "cpu-node-1")  # no DRA driver there
    assert rc == 0 and checks["DRA gpu.nvidia.com"]["status"] == "warn"
    assert "DRA driver" in checks["DRA gpu.nvidia.com"]["fix"]
    cluster.grant(STRANGER_USER, "stranger-doctor-pods", PODS_AND_DRA[:1])
    rc, checks = doctor(STRANGER_TOKEN, STRANGER_USER, DRA["node"])
    assert rc == 1
    assert checks["may list pods"]["status"] == "ok"
    refused = checks["may list resourceslices.resource.k8s.io"]
    assert refused["status"] == "fail" and "grant list on resourceslices.resource.k8s.io" in refused["fix"]
    assert checks["may get resourceclaims.resource.k8s.io"]["status"] == "fail"
