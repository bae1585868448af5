"""The attribution processor: kubelet pod-resources over a real gRPC server, /proc fixture
trees (cgroup v1/v2, Slurm), shared GPUs, rules, precision, job end and the series bound."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from otel_ofu.attribution.claims import Claim, merge
from otel_ofu.attribution.kubelet import device_uuid
from otel_ofu.attribution.nvml import NvmlPids
from otel_ofu.attribution.procfs import parse_cgroup, parse_pids, read_process
from otel_ofu.attribution.proto import podresources_v1_pb2 as pb
from otel_ofu.attribution.proto import podresources_v1_pb2_grpc as pb_grpc
from otel_ofu.core.model import Batch, GpuSample, MetricPoint, attrs, job_id_of
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import ConfigError, FieldError, build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.attribution import AttributionProcessor, AttributionProcessorConfig
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig

PROC = Path(__file__).parent / "data" / "proc"
ROOT = Path(__file__).parent.parent
UID1 = "5f1c6a2e-8d0b-4f57-9a3e-2b7c1d9e4f60"  # pid 1001 (cgroup v1)
UID2 = "a1b2c3d4-e5f6-4789-8abc-def012345678"  # pid 2001 (cgroup v2, systemd)
GPU_A, GPU_B, GPU_C = "GPU-aaaaaaaa-0000-0000-0000-000000000001", "GPU-bbbbbbbb-0000-0000-0000-000000000002", \
    "GPU-cccccccc-0000-0000-0000-000000000003"
MIG_A = "MIG-dddddddd-0000-0000-0000-000000000004"


def sample(uuid: str = GPU_A, *, index: int = 0, t: int = 10**18, **kw) -> GpuSample:
    base = dict(time_unix_nano=t, window_s=10, host="node-1", gpu_index=index, uuid=uuid,
                model="NVIDIA H100 80GB HBM3", tensor_active=0.5, sm_clock_mhz=1830, max_sm_clock_mhz=1980)
    base.update(kw)
    return GpuSample(**base)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(cfg: dict | None = None, **kw) -> AttributionProcessor:
    config = build_config(AttributionProcessorConfig, cfg or {})
    return AttributionProcessor(config, Context("attribution", Telemetry()), **kw)


def run(proc: AttributionProcessor, *samples: GpuSample) -> list[GpuSample]:
    return proc.process(Batch(samples=list(samples))).samples


# --- a real pod-resources server --------------------------------------------------------

def pod(name: str, namespace: str, *containers: tuple[str, str, list[str]]) -> pb.PodResources:
    return pb.PodResources(name=name, namespace=namespace, containers=[
        pb.ContainerResources(name=c, devices=[pb.ContainerDevices(resource_name=r, device_ids=ids)], cpu_ids=[2, 3])
        for c, r, ids in containers])


class Lister(pb_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.pods: list[pb.PodResources] = []
        self.allocatable: list[pb.ContainerDevices] | None = None  # None: answer as a kubelet without the call
        self.calls = 0

    def List(self, request, context):  # noqa: N802 (the generated servicer's name)
        self.calls += 1
        return pb.ListPodResourcesResponse(pod_resources=self.pods)

    def GetAllocatableResources(self, request, context):  # noqa: N802
        if self.allocatable is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method GetAllocatableResources")
        return pb.AllocatableResourcesResponse(devices=self.allocatable, cpu_ids=[0, 1, 2, 3])


@pytest.fixture
def kubelet():
    """A gRPC server speaking PodResourcesLister on a unix socket, as the kubelet does."""
    folder = tempfile.mkdtemp(prefix="ofu-k-")  # short: unix socket paths are limited to ~107 bytes
    socket = f"{folder}/kubelet.sock"
    lister = Lister()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    assert server.add_insecure_port(f"unix://{socket}")
    server.start()
    lister.socket = socket
    lister.server = server
    yield lister
    server.stop(grace=None)
    shutil.rmtree(folder, ignore_errors=True)


def kube_cfg(socket: str, **extra) -> dict:
    return {"kubelet": {"enabled": True, "socket": socket, "timeout": "5s"}, **extra}


def test_kubelet_names_pod_namespace_and_container(kubelet):
    kubelet.pods = [
        pod("trainer-0", "llm", ("pytorch", "nvidia.com/gpu", [GPU_A]), ("sidecar", "cpu", [])),
        pod("web", "default", ("nginx", "example.com/nic", ["nic0"])),
    ]
    proc = make(kube_cfg(kubelet.socket))
    proc.refresh()
    a, b = run(proc, sample(GPU_A), sample(GPU_B, index=1))
    assert kubelet.calls == 1
    assert a.job_id == "k8s:llm/Pod/trainer-0"
    assert {k: a.resource[k] for k in ("k8s.pod.name", "k8s.namespace.name", "k8s.container.name")} == {
        "k8s.pod.name": "trainer-0", "k8s.namespace.name": "llm", "k8s.container.name": "pytorch"}
    assert a.resource["ofu.job.source"] == "kubelet" and "ofu.job.shared" not in a.resource
    assert b.job_id is None and not any(k.startswith("k8s.") for k in b.resource)
    proc.shutdown()


def test_lookups_happen_on_refresh_not_per_sample(kubelet):
    kubelet.pods = [pod("p", "ns", ("c", "nvidia.com/gpu", [GPU_A]))]
    proc = make(kube_cfg(kubelet.socket))
    proc.refresh()
    for _ in range(5):
        run(proc, sample(GPU_A), sample(GPU_B))
    assert kubelet.calls == 1


def test_uuid_case_mig_and_time_slicing_replicas_share_a_gpu(kubelet):
    kubelet.pods = [
        pod("a", "team", ("main", "nvidia.com/gpu", [GPU_A.upper() + "::0"])),
        pod("b", "team", ("main", "nvidia.com/gpu.shared", [GPU_A + "::3"])),
        pod("m", "team", ("main", "nvidia.com/mig-1g.10gb", [MIG_A])),
    ]
    proc = make(kube_cfg(kubelet.socket))
    proc.refresh()
    a, b, mig = run(proc, sample(GPU_A.lower()), sample(MIG_A, index="0:1"))
    assert (a.job_id, b.job_id) == ("k8s:team/Pod/a", "k8s:team/Pod/b")  # one sample per job, each its half
    assert all(s.resource["ofu.job.shared"] is True and (s.share, s.share_basis) == (0.5, "even") for s in (a, b))
    assert (a.resource["k8s.pod.name"], b.resource["k8s.pod.name"]) == ("a", "b")
    assert a.resource["k8s.namespace.name"] == "team"
    assert mig.job_id == "k8s:team/Pod/m" and "ofu.job.shared" not in mig.resource and mig.share is None


def test_index_device_ids_are_never_matched(kubelet, caplog):
    kubelet.pods = [pod("p", "ns", ("c", "nvidia.com/gpu", ["0", "1"]))]
    proc = make(kube_cfg(kubelet.socket))
    with caplog.at_level(logging.WARNING):
        proc.refresh()
        proc.refresh()
    (out,) = run(proc, sample(GPU_A, index=0))
    assert out.job_id is None
    assert sum("index id strategy" in r.getMessage() for r in caplog.records) == 1


def test_pod_end_removes_its_attributes(kubelet):
    kubelet.pods = [pod("trainer-0", "llm", ("pytorch", "nvidia.com/gpu", [GPU_A]))]
    proc = make(kube_cfg(kubelet.socket))
    proc.refresh()
    assert run(proc, sample(GPU_A))[0].job_id == "k8s:llm/Pod/trainer-0"
    kubelet.pods = [pod("next-job", "llm", ("pytorch", "nvidia.com/gpu", [GPU_B]))]
    proc.refresh()
    a, b = run(proc, sample(GPU_A), sample(GPU_B))
    assert a.job_id is None and not any(k.startswith("k8s.") for k in a.resource)
    assert "ofu.job.source" not in a.resource
    assert b.job_id == "k8s:llm/Pod/next-job"


def test_kubelet_outage_keeps_last_answer_for_cache_ttl_only(kubelet, caplog):
    kubelet.pods = [pod("trainer-0", "llm", ("pytorch", "nvidia.com/gpu", [GPU_A]))]
    clock = Clock()
    proc = make(kube_cfg(kubelet.socket, cache_ttl="30s"), clock=clock)
    proc.refresh()
    kubelet.server.stop(grace=None)
    clock.now += 20
    with caplog.at_level(logging.WARNING):
        proc.refresh()
    assert run(proc, sample(GPU_A))[0].job_id == "k8s:llm/Pod/trainer-0"  # within the TTL
    clock.now += 20
    proc.refresh()
    assert run(proc, sample(GPU_A))[0].job_id is None  # past it: nothing stale
    assert proc.context.telemetry.counter("otel_ofu.attribution.refresh.errors", source="kubelet") == 2
    assert sum("source kubelet failed" in r.getMessage() for r in caplog.records) == 1


def test_background_thread_refreshes_without_blocking_start(kubelet):
    kubelet.pods = [pod("p", "ns", ("c", "nvidia.com/gpu", [GPU_A]))]
    proc = make(kube_cfg(kubelet.socket, refresh_interval="100ms"))
    done = threading.Event()
    original = proc.refresh

    def refresh():
        original()
        done.set()

    proc.refresh = refresh
    proc.start()
    try:
        assert done.wait(30)
        assert run(proc, sample(GPU_A))[0].job_id == "k8s:ns/Pod/p"
    finally:
        proc.shutdown()
    assert not proc._thread.is_alive()


def test_device_uuid():
    assert device_uuid("GPU-ABC::2") == "gpu-abc"
    assert device_uuid("MIG-xyz") == "mig-xyz"
    assert device_uuid("3") is None


# --- /proc: cgroups and environments ------------------------------------------------------

def test_cgroup_v1_kubepods():
    info = parse_cgroup((PROC / "1001" / "cgroup").read_text())
    assert info.pod_uid == UID1
    assert info.container_id == "3b8a5f0e4c2d1a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b"
    assert info.slurm_job_id is None


def test_cgroup_v2_systemd_kubepods_uid_underscores():
    info = parse_cgroup((PROC / "2001" / "cgroup").read_text())
    assert info.pod_uid == UID2
    assert info.container_id == "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0"


@pytest.mark.parametrize(("pid", "job", "uid", "step"), [(3001, "4242", "1000", "0"), (4001, "777", None, "batch")])
def test_cgroup_slurm_v1_and_v2(pid, job, uid, step):
    info = parse_cgroup((PROC / str(pid) / "cgroup").read_text())
    assert (info.slurm_job_id, info.slurm_uid, info.slurm_step, info.pod_uid) == (job, uid, step, None)


def test_environ_keeps_only_wanted_keys_and_missing_process_is_none():
    info = read_process(PROC, 1001, ["OFU_PRECISION", "SLURM_JOB_ID"])
    assert info.environ == {"OFU_PRECISION": "fp8"}  # not API_TOKEN, not PATH
    assert read_process(PROC, 4001, ["SLURM_JOB_ID"]).environ == {}
    assert read_process(PROC, 999999, ["X"]) is None


def test_parse_pids():
    assert parse_pids(None) is None
    assert parse_pids(12) == [12]
    assert parse_pids("12, 34") == [12, 34]
    assert parse_pids([1, "2", "x", 0]) == [1, 2]
    assert parse_pids([]) == []


def proc_cfg(root: Path | str = PROC, **extra) -> dict:
    return {"processes": {"enabled": True, "proc_root": str(root), **extra.pop("processes", {})}, **extra}


def test_process_in_pod_gives_uid_and_env_precision_and_pid_is_dropped():
    proc = make(proc_cfg())
    (out,) = run(proc, sample(GPU_A, attributes={"process.pid": [1001]}))
    assert out.job_id == f"k8s-uid:{UID1}"
    assert out.resource["k8s.pod.uid"] == UID1
    assert out.precision == "fp8"
    assert "process.pid" not in out.attributes and "process.pid" not in out.resource


def test_kubelet_and_cgroup_merge_into_one_pod_not_a_shared_gpu(kubelet):
    kubelet.pods = [pod("trainer-0", "llm", ("pytorch", "nvidia.com/gpu", [GPU_A]))]
    proc = make(kube_cfg(kubelet.socket) | proc_cfg())
    proc.refresh()
    (out,) = run(proc, sample(GPU_A, resource={"process.pid": "2001"}))
    assert out.job_id == "k8s:llm/Pod/trainer-0"
    assert out.resource["k8s.pod.uid"] == UID2 and out.resource["k8s.pod.name"] == "trainer-0"
    assert "ofu.job.shared" not in out.resource
    assert out.resource["ofu.job.source"] == "kubelet+process"


def test_slurm_job_from_environment_with_one_namespace():
    proc = make(proc_cfg())
    (out,) = run(proc, sample(GPU_A, attributes={"process.pid": 3001}))
    assert out.job_id == "slurm:4242"
    assert {k: v for k, v in out.resource.items() if k.startswith("slurm.")} == {
        "slurm.job.id": "4242", "slurm.job.user": "alice", "slurm.job.account": "llm",
        "slurm.job.partition": "h100", "slurm.job.name": "pretrain-70b"}
    assert out.precision == "bf16"
    assert out.resource["ofu.job.source"] == "slurm"


def test_slurm_cgroup_v2_alone_names_the_job():
    (out,) = run(make(proc_cfg()), sample(GPU_A, attributes={"process.pid": 4001}))
    assert out.job_id == "slurm:777" and out.resource["slurm.job.id"] == "777"
    assert "slurm.job.user" not in out.resource and out.precision is None


def test_two_slurm_jobs_on_one_gpu_are_marked_shared_with_unknown_precision():
    first, second = run(make(proc_cfg()), sample(GPU_A, attributes={"process.pid": [3002, 3001]}))
    assert (first.job_id, second.job_id) == ("slurm:4242", "slurm:4243")  # one sample per job, each its half
    assert all(s.resource["ofu.job.shared"] is True and s.share == 0.5 for s in (first, second))
    assert (first.resource["slurm.job.user"], second.resource["slurm.job.user"]) == ("alice", "bob")
    assert first.resource["slurm.job.partition"] == second.resource["slurm.job.partition"] == "h100"
    assert first.precision == second.precision == "unknown"  # bf16 and fp8 jobs: DCGM cannot tell whose work


def test_gpus_matched_by_uuid_when_indexes_disagree():
    # Slurm's CUDA_VISIBLE_DEVICES=0 for job 4242, but its GPU is DCGM index 5 (GPU_B).
    proc = make(proc_cfg(), pid_provider=lambda: {GPU_B.upper(): [3001]})
    proc.refresh()
    at_zero, at_five = run(proc, sample(GPU_A, index=0), sample(GPU_B, index=5))
    assert at_zero.job_id is None and "slurm.job.id" not in at_zero.resource
    assert at_five.job_id == "slurm:4242"


def test_process_exit_removes_attributes(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PROC, root)
    clock = Clock()
    pids = {GPU_B: [3001]}
    proc = make(proc_cfg(root), pid_provider=lambda: dict(pids), clock=clock)
    proc.refresh()
    a, b = run(proc, sample(GPU_A, attributes={"process.pid": [1001]}), sample(GPU_B))
    assert a.job_id == f"k8s-uid:{UID1}" and b.job_id == "slurm:4242"
    shutil.rmtree(root / "1001")
    shutil.rmtree(root / "3001")
    proc.refresh()
    # The receiver may still be reporting the last pids it saw: they are dead in /proc.
    a, b = run(proc, sample(GPU_A), sample(GPU_B))
    assert a.job_id is None and "k8s.pod.uid" not in a.resource
    assert b.job_id is None and not any(k.startswith("slurm.") for k in b.resource)


def test_sample_pids_are_forgotten_after_pid_ttl():
    clock = Clock()
    proc = make(proc_cfg(processes={"pid_ttl": "60s"}), clock=clock)
    run(proc, sample(GPU_A, attributes={"process.pid": [3001]}))
    clock.now += 30
    assert run(proc, sample(GPU_A))[0].job_id == "slurm:4242"  # pids remembered between reports
    clock.now += 61
    proc.refresh()
    assert run(proc, sample(GPU_A))[0].job_id is None


def test_empty_pid_list_means_gpu_has_no_processes_now():
    proc = make(proc_cfg())
    run(proc, sample(GPU_A, attributes={"process.pid": [3001]}))
    assert run(proc, sample(GPU_A, attributes={"process.pid": []}))[0].job_id is None


def test_nvml_pid_provider_keys_by_uuid():
    class P:
        def __init__(self, pid):
            self.pid = pid

    class FakeNvml:
        NVMLError = RuntimeError
        inits = shutdowns = 0

        def nvmlInit(self):  # noqa: N802
            FakeNvml.inits += 1

        def nvmlShutdown(self):  # noqa: N802
            FakeNvml.shutdowns += 1

        def nvmlDeviceGetCount(self):  # noqa: N802
            return 2

        def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
            return i

        def nvmlDeviceGetUUID(self, h):  # noqa: N802
            return [GPU_A.encode(), GPU_B][h]

        def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
            return [P(3001), P(3001)] if h == 0 else [P(1001)]

    provider = NvmlPids(FakeNvml())
    assert provider() == {GPU_A.lower(): [3001], GPU_B.lower(): [1001]}
    provider()
    provider.close()
    assert (FakeNvml.inits, FakeNvml.shutdowns) == (1, 1)


# --- labels already on the sample, rules, precision ----------------------------------------

def test_dcgm_exporter_pod_labels_and_job_label():
    """Pod labels on the sample name the job by the API source's rules; k8s_job_label comes first."""
    res = {"k8s.pod.name": "llama-worker-3", "k8s.namespace.name": "llm",
           "k8s.pod.label.batch.kubernetes.io/job-name": "llama-pretrain",
           "k8s.pod.label.batch.kubernetes.io/controller-uid": "c0ffee"}
    plain, labelled = make(), make({"k8s_job_label": "batch.kubernetes.io/job-name"})
    out = run(plain, sample(resource=dict(res)))[0]
    assert out.job_id == "k8s:llm/Job/llama-pretrain"
    assert (out.resource["ofu.job.kind"], out.resource["ofu.job.run"]) == ("Job", "c0ffee")
    out = run(labelled, sample(resource=dict(res)))[0]
    assert out.job_id == "k8s:llm/llama-pretrain" and out.resource["ofu.job.source"] == "scrape"
    bare = {"k8s.pod.name": "notebook", "k8s.namespace.name": "llm", "k8s.pod.uid": "u-1"}
    out = run(plain, sample(resource=bare))[0]
    assert (out.job_id, out.resource["ofu.job.kind"], out.resource["ofu.job.run"]) == (
        "k8s:llm/Pod/notebook", "Pod", "u-1")


def test_hpc_job_label_as_given_and_joined_with_slurm():
    (out,) = run(make(), sample(resource={"hpc.job.id": "run-17"}))
    assert out.job_id == "run-17" and out.resource["ofu.job.source"] == "hpc_job"
    (out,) = run(make(proc_cfg()), sample(resource={"hpc.job.id": "4242"}, attributes={"process.pid": 3001}))
    assert out.job_id == "slurm:4242" and "ofu.job.shared" not in out.resource


def test_points_of_a_renamed_gpu_follow_its_job():
    truth = MetricPoint("sim.gpu.mfu.true", 0.0, 10**18, sample(GPU_A).resource_attributes(),
                        attrs({"ofu.job.id": "none"}))
    other = MetricPoint("sim.gpu.mfu.true", 0.4, 10**18, sample(GPU_B).resource_attributes(),
                        attrs({"ofu.job.id": "j"}))
    proc = make({"rules": [{"match": {"uuid": GPU_A}, "job_id": "pool"}]})
    out = proc.process(Batch(samples=[sample(GPU_A, job_id="none")], points=[truth, other]))
    assert [job_id_of(p) for p in out.points] == ["pool", "j"]
    assert dict(out.points[0].resource)["ofu.job.id"] == "pool"
    assert "ofu.job.id" not in dict(out.points[0].attributes)  # moved to the resource, not duplicated
    assert dict(truth.attributes)["ofu.job.id"] == "none"  # the input point is not mutated


def test_gpus_without_uuid_are_told_apart_by_host_and_index():
    """dmon and CSV GPUs have no UUID: a rule renaming GPU 0's job must not rename GPU 1's points."""
    gpus = [sample("", index=i, job_id="none") for i in (0, 1)]
    truth = [MetricPoint("sim.gpu.mfu.true", 0.1, 10**18, g.resource_attributes(), attrs({"ofu.job.id": "none"}))
             for g in gpus]
    proc = make({"rules": [{"match": {"attributes": {"gpu.index": "0"}}, "job_id": "pool"}]})
    out = proc.process(Batch(samples=gpus, points=truth))
    assert [s.job_id for s in out.samples] == ["pool", "none"]
    assert [job_id_of(p) for p in out.points] == ["pool", "none"]


def test_existing_job_id_kept_unless_override():
    cfg = proc_cfg()
    (kept,) = run(make(cfg), sample(job_id="llama-70b", precision="bf16", attributes={"process.pid": 1001}))
    assert (kept.job_id, kept.precision, kept.resource["ofu.job.source"]) == ("llama-70b", "bf16", "sample")
    assert "k8s.pod.uid" not in kept.resource  # attributes always describe the job named
    (over,) = run(make(cfg | {"override": True}), sample(job_id="llama-70b", precision="bf16",
                                                           attributes={"process.pid": 1001}))
    assert (over.job_id, over.precision) == (f"k8s-uid:{UID1}", "fp8")
    (idle,) = run(make(cfg), sample(job_id="none", attributes={"process.pid": 3001}))
    assert idle.job_id == "slurm:4242"  # the sim's "none" is no job, not a job id


RULES = [
    {"match": {"uuid": GPU_C.lower()}, "job_id": "reserved-eval"},
    {"match": {"host": "dgx-*"}, "job_id": "dgx-pool", "precision": "fp16"},
    {"match": {"attributes": {"k8s.namespace.name": "fp8-*"}}, "precision": "fp8"},
]


def test_rules_by_uuid_host_glob_and_attribute():
    proc = make({"rules": RULES})
    by_uuid, by_host, by_attr, none = run(
        proc, sample(GPU_C), sample(GPU_A, host="dgx-07"),
        sample(GPU_B, host="node-9", resource={"k8s.pod.name": "p", "k8s.namespace.name": "fp8-train"}), sample(GPU_A))
    assert (by_uuid.job_id, by_uuid.precision, by_uuid.resource["ofu.job.source"]) == ("reserved-eval", None, "rule")
    assert (by_host.job_id, by_host.precision) == ("dgx-pool", "fp16")
    assert (by_attr.job_id, by_attr.precision) == ("k8s:fp8-train/Pod/p", "fp8")
    assert (none.job_id, none.precision) == (None, None)


def test_rules_yield_to_schedulers_unless_override(kubelet):
    kubelet.pods = [pod("p", "ns", ("c", "nvidia.com/gpu", [GPU_C]))]
    proc = make(kube_cfg(kubelet.socket, rules=RULES[:1]))
    proc.refresh()
    assert run(proc, sample(GPU_C))[0].job_id == "k8s:ns/Pod/p"
    forced = make(kube_cfg(kubelet.socket, rules=[{**RULES[0], "override": True}]))
    forced.refresh()
    out = run(forced, sample(GPU_C))[0]
    assert out.job_id == "reserved-eval" and "k8s.pod.name" not in out.resource


@pytest.mark.parametrize(("resource", "pid", "rules", "expected"), [
    ({"k8s.pod.annotation.ofu.dev/precision": "FP8"}, None, [], "fp8"),
    ({"k8s.pod.label.ofu.dev/precision": "bf16"}, None, [], "bf16"),
    ({}, 5001, [], "bf16"),  # env var of a bare process ("bfloat16")
    ({}, None, [{"match": {"host": "node-1"}, "precision": "fp8"}], "fp8"),
    ({"k8s.pod.label.ofu.dev/precision": "bf16"}, None, [{"match": {"host": "node-1"}, "precision": "fp8"}], "bf16"),
    ({"k8s.pod.label.ofu.dev/precision": "fp4"}, 1001, [], "unknown"),  # label fp4, env fp8: disagree
    ({"k8s.pod.label.ofu.dev/precision": "float128"}, None, [], None),  # unknown spelling stays unknown
    ({}, 2001, [], None),  # no metadata at all
])
def test_precision_sources(resource, pid, rules, expected):
    proc = make(proc_cfg(rules=rules))
    attributes = {"process.pid": pid} if pid else {}
    (out,) = run(proc, sample(resource=dict(resource), attributes=attributes))
    assert out.precision == expected


def test_precision_env_name_is_configurable():
    (out,) = run(make(proc_cfg(precision_env="SLURM_JOB_PARTITION")), sample(attributes={"process.pid": 3002}))
    assert out.precision is None  # "h100" is not a precision
    (out,) = run(make(proc_cfg(precision_env="MY_PREC")), sample(attributes={"process.pid": 3001}))
    assert out.precision is None  # OFU_PRECISION is no longer read


# --- the series bound -----------------------------------------------------------------

def test_max_jobs_overflow_logs_once_per_burst_and_strips_per_job_attributes(caplog):
    proc = make({"max_jobs": 2, "job_idle_timeout": "10m"})
    t0 = 10**18

    def batch(t, *jobs):
        return run(proc, *(sample(f"GPU-{i:08d}-0000-0000-0000-000000000000", t=t,
                                  resource={"k8s.pod.name": j, "k8s.namespace.name": "ns"})
                           for i, j in enumerate(jobs)))

    with caplog.at_level(logging.WARNING):
        first = batch(t0, "a", "b", "c", "d")
        second = batch(t0 + 10 * 10**9, "a", "b", "c", "e")
    assert [s.job_id for s in first] == ["k8s:ns/Pod/a", "k8s:ns/Pod/b", "overflow", "overflow"]
    assert [s.job_id for s in second] == ["k8s:ns/Pod/a", "k8s:ns/Pod/b", "overflow", "overflow"]
    over = first[2]
    assert "k8s.pod.name" not in over.resource and over.resource["k8s.namespace.name"] == "ns"
    warnings = [r for r in caplog.records if "max_jobs=2" in r.getMessage()]
    assert len(warnings) == 1
    assert proc.context.telemetry.counter("otel_ofu.attribution.overflow") == 4
    assert proc.context.telemetry.gauge("otel_ofu.attribution.jobs") == 2

    # a and b end; after job_idle_timeout their slots go to the next jobs, and a new burst logs again.
    later = t0 + 11 * 60 * 10**9
    with caplog.at_level(logging.WARNING):
        third = batch(later, "c", "d", "f")
    assert [s.job_id for s in third] == ["k8s:ns/Pod/c", "k8s:ns/Pod/d", "overflow"]
    assert len([r for r in caplog.records if "max_jobs=2" in r.getMessage()]) == 2


# --- config, claims merge, end to end ---------------------------------------------------

def test_config_errors_name_the_key():
    with pytest.raises(FieldError, match="rules"):
        build_config(AttributionProcessorConfig, {"rules": [{"match": {}, "job_id": "x"}]})
    with pytest.raises(FieldError, match="precision"):
        build_config(AttributionProcessorConfig, {"rules": [{"match": {"host": "h"}, "precision": "fp7"}]})
    with pytest.raises(FieldError, match="max_jobs"):
        build_config(AttributionProcessorConfig, {"max_jobs": 0})
    with pytest.raises(FieldError, match="pid_sources"):
        build_config(AttributionProcessorConfig, {"processes": {"pid_sources": ["ps"]}})


def test_uid_only_claims_never_invent_sharing():
    named = [Claim(("k8s", "ns", "a"), "kubelet", {"k8s.pod.name": "a"}),
             Claim(("k8s", "ns", "b"), "kubelet", {"k8s.pod.name": "b"})]
    orphan = Claim(("k8s-uid", UID1), "process", {"k8s.pod.uid": UID1}, {"fp8"})
    assert sorted(c.key for c in merge([*named, orphan])) == [("k8s", "ns", "a"), ("k8s", "ns", "b")]


def test_end_to_end_attribution_then_ofu(kubelet):
    kubelet.pods = [pod("trainer-0", "llm", ("pytorch", "nvidia.com/gpu", [GPU_A]))]
    attribution = make(kube_cfg(kubelet.socket) | proc_cfg())
    attribution.refresh()
    ofu = OfuProcessor(build_config(OfuProcessorConfig, {}), Context("ofu"))
    batch = Batch(samples=[sample(GPU_A, index=0, attributes={"process.pid": 1001}),
                           sample(GPU_B, index=1, attributes={"process.pid": [3001]}),
                           sample(GPU_C, index=2)])
    points = [p for p in ofu.process(attribution.process(batch)).points if p.name == "gpu.ofu"]
    by_gpu = {dict(p.resource)["hw.id"]: p for p in points}
    k8s, slurm, unknown = by_gpu[GPU_A], by_gpu[GPU_B], by_gpu[GPU_C]
    assert dict(k8s.resource)["ofu.job.id"] == "k8s:llm/Pod/trainer-0"
    assert dict(k8s.resource)["ofu.precision"] == "fp8"
    assert {k: v for k, v in k8s.resource if k.startswith("k8s.")} == {
        "k8s.pod.name": "trainer-0", "k8s.namespace.name": "llm", "k8s.container.name": "pytorch",
        "k8s.pod.uid": UID1}
    assert dict(slurm.resource)["ofu.job.id"] == "slurm:4242"
    assert dict(slurm.resource)["slurm.job.account"] == "llm"
    assert dict(slurm.resource)["ofu.precision"] == "bf16"
    assert dict(unknown.resource)["ofu.job.id"] == "unknown"
    assert dict(unknown.resource)["ofu.precision"] == "unknown"
    assert all("process.pid" not in dict(p.attributes) for p in points)
    # Job identity is on the resource only, never duplicated as point attributes.
    assert all(not {"ofu.job.id", "ofu.precision", "ofu.job.source"} & dict(p.attributes).keys() for p in points)


def test_sample_config_validates():
    from otel_ofu.pipeline.service import load_config

    try:
        config = load_config(str(ROOT / "collector-config" / "attribution.yaml"))
    except ConfigError as exc:  # pragma: no cover - shows the message
        pytest.fail(str(exc))
    # The GPUs' pipeline, beside the self-telemetry one every shipped config has.
    assert sorted(p.name for p in config.pipelines) == ["metrics", "metrics/self"]
    spec = next(p for p in config.pipelines if p.name == "metrics")
    assert spec.processors == ["attribution", "ofu"]


# --- idle is none, unknown is "nothing says" (issue 23 item 8) -------------------------------------

def page_points(text: str, cfg: dict | None = None) -> dict[str, str]:
    """A dcgm-exporter page through the receiver's parser, attribution and ofu: GPU -> ofu.job.id."""
    from otel_ofu.receivers.dcgm_exporter import parse_metrics

    samples = parse_metrics(text, time_unix_nano=10**18, window_s=30)
    ofu = OfuProcessor(build_config(OfuProcessorConfig, {}), Context("ofu"))
    points = ofu.process(make(cfg).process(Batch(samples=samples))).points
    return {dict(p.resource)["hw.id"]: dict(p.resource)["ofu.job.id"] for p in points}


def test_an_idle_gpu_on_a_dcgm_exporter_page_that_maps_pods_is_none():
    """dcgm-exporter in Kubernetes mode labels every GPU a pod holds: on such a page the other GPU is
    idle (none, as docs/metrics.md says), not unknown; a page that maps no pod says nothing."""
    page = (ROOT / "tests" / "data" / "dcgm-exporter" / "h100.prom").read_text()
    jobs = page_points(page)
    assert jobs == {"GPU-3b1c5e2a-8f0d-4c61-9a7e-1d2f3a4b5c60": "k8s:ml-research/Pod/llama-70b-pretrain-0",
                    "GPU-3b1c5e2a-8f0d-4c61-9a7e-1d2f3a4b5c61": "none"}
    unmapped = "\n".join(line for line in page.splitlines() if 'pod="' not in line)  # no pod on any GPU
    assert set(page_points(unmapped).values()) == {"unknown"}


def test_the_kubelet_knows_its_idle_gpus_when_it_lists_allocatable_devices(kubelet):
    kubelet.pods = [pod("trainer-0", "llm", ("pytorch", "nvidia.com/gpu", [GPU_A]))]
    proc = make(kube_cfg(kubelet.socket))
    proc.refresh()
    held, idle = run(proc, sample(GPU_A), sample(GPU_B, index=1))
    assert held.job_id == "k8s:llm/Pod/trainer-0" and idle.job_id is None  # no allocatable list: nothing says
    kubelet.allocatable = [pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[GPU_A, GPU_B])]
    proc.refresh()
    held, idle, elsewhere = run(proc, sample(GPU_A), sample(GPU_B, index=1), sample(GPU_C, index=2))
    assert (idle.job_id, idle.resource["ofu.job.source"]) == ("none", "kubelet")
    assert elsewhere.job_id is None  # not this kubelet's GPU: it cannot say
    assert "none" not in {s.job_id for s in run(proc, sample(GPU_A))}


def test_a_pages_pod_labels_make_a_jobs_pods_one_job():
    """Issue 23 item 7: with dcgm-exporter's --kubernetes-enable-pod-labels the page carries each pod's
    labels (keys sanitized): a Job's two pods are one job, a Deployment's pod its Deployment's."""
    page = (ROOT / "tests" / "data" / "dcgm-exporter" / "h100.prom").read_text()
    pods = {'pod="llama-70b-pretrain-0"': ('pod="sweep-0-x7k2p",batch_kubernetes_io_job_name="sweep",job_name="sweep",'
                                           'batch_kubernetes_io_controller_uid="c-42"'),
            'DCGM_FI_DRIVER_VERSION="570.124.06"}': ('DCGM_FI_DRIVER_VERSION="570.124.06",container="vllm",'
                                                     'namespace="ml-research",pod="vllm-7d9c8b6f5-q2w3e",'
                                                     'pod_template_hash="7d9c8b6f5",app="vllm"}')}
    for old, new in pods.items():
        page = page.replace(old, new)
    jobs = page_points(page)
    assert jobs == {"GPU-3b1c5e2a-8f0d-4c61-9a7e-1d2f3a4b5c60": "k8s:ml-research/Job/sweep",
                    "GPU-3b1c5e2a-8f0d-4c61-9a7e-1d2f3a4b5c61": "k8s:ml-research/Deployment/vllm"}
