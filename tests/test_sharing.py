"""A GPU several pods or jobs share is counted once: its time, useful compute (FLOPs) and loss account
are split among them, by what each used where a source says it (issue 32, docs/sharing.md).

Each shape from its real source: a dcgm-exporter page served over HTTP as --kubernetes-virtual-gpus
renders it with per-process metrics (tests/data/real/dcgm-exporter/4.5.3-4.8.2_h100_virtual-gpus.prom,
derived from dcgm-exporter's kubernetes.go and process_metrics.go; its README row), the kubelet's
pod-resources proto on a real gRPC server (time-slicing and MIG replicas), NVML's per-process
utilization through the NVML fake (pynvml's nvmlDeviceGetProcessUtilization and its real
c_nvmlProcessUtilizationSample_t) with the processes' Slurm jobs from /proc fixtures. DRA claims
shared between pods and MIG devices created on demand run against the real kube-apiserver in
tests/test_k8s_dra.py. The property test: over any fleet and window, the jobs' shares of a device add
up to it (1e-9), through attribution, the ofu processor and the jobs processor, however the jobs tier
is sharded.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_ofu.attribution.nvml import NvmlPids
from otel_ofu.core import specs
from otel_ofu.core.model import Batch, GpuSample, MetricPoint, gpu_key, job_id_of
from otel_ofu.exporters.file import FileExporter, FileExporterConfig
from otel_ofu.jobs.book import JobBook
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.attribution import AttributionProcessor, AttributionProcessorConfig
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.dcgm_exporter import DcgmExporterReceiver, DcgmExporterReceiverConfig
from otel_ofu.report.build import build_report
from tests.e2e_util import PageServer, wait_for
from tests.fakes.nvml import FakeNvml, FakeNvmlGpu
from tests.test_attribution import PROC, kubelet, pod  # noqa: F401 (kubelet: the gRPC server fixture)

H100 = "NVIDIA H100 80GB HBM3"
INTERVAL = 30  # seconds between a GPU's windows (dcgm-exporter's default collect interval)
T0 = 1_800_000_000
PAGE = Path(__file__).parent / "data" / "real" / "dcgm-exporter" / "4.5.3-4.8.2_h100_virtual-gpus.prom"
NO_JOB = {"none", "unknown", ""}


def attribution(config: dict | None = None, **kw) -> AttributionProcessor:
    return AttributionProcessor(build_config(AttributionProcessorConfig, config or {}),
                                Context("attribution", Telemetry()), **kw)


def ofu_points(proc: AttributionProcessor, windows: list[list[GpuSample]]) -> tuple[list[list[GpuSample]],
                                                                                   list[MetricPoint]]:
    """Each window's samples through attribution then the ofu processor: the attributed samples of each
    window, and all points."""
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu", Telemetry()))
    attributed, points = [], []
    for samples in windows:
        out = proc.process(Batch(samples=samples))
        attributed.append(out.samples)
        points += ofu.process(out).points
    return attributed, points


@dataclasses.dataclass
class Account:
    """What the jobs processor credited: each job's GPU-seconds, FLOP and loss GPU-seconds by part."""

    seconds: dict[str, float]
    flop: dict[str, float]
    loss: dict[str, dict[str, float]]
    unattributed: float


def jobs_account(points: list[MetricPoint], shards: list[int] | None = None) -> Account:
    """The points through JobBooks as the fleet gateway routes them (a job's points to one instance; ``shards``
    picks each job's instance in order of appearance), each book taking its points in time order."""
    config = build_config(JobsConfig, {"default_interval": f"{INTERVAL}s"})
    routes: dict[object, int] = {}
    books: dict[int, list[MetricPoint]] = defaultdict(list)
    for point in points:
        job = job_id_of(point)
        key = job if job not in NO_JOB and job is not None else point.resource
        if key not in routes:
            routes[key] = shards[len(routes) % len(shards)] if shards else 0
        books[routes[key]].append(point)
    account = Account(defaultdict(float), defaultdict(float), defaultdict(lambda: defaultdict(float)), 0.0)
    for shard in books.values():
        book = JobBook(config)
        by_time: dict[int, list[MetricPoint]] = defaultdict(list)
        for point in shard:
            by_time[point.time_unix_nano].append(point)
        ended = []
        for t in sorted(by_time):
            ended += book.observe(by_time[t]).ended
        ended += book.close_all().ended
        for summary in ended:
            account.seconds[summary.job_id] += summary.totals.gpu_seconds
            account.flop[summary.job_id] += summary.totals.flop
            for part, seconds in summary.loss.part_seconds.items():
                account.loss[summary.job_id][part] += seconds
        account.unattributed += book.unattributed.gpu_seconds
    return account


def device_points(samples: list[GpuSample]) -> dict[tuple, dict[str, object]]:
    """A device window's own FLOP/s and loss parts, worked out from one unshared sample of it."""
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu", Telemetry()))
    out: dict[tuple, dict[str, object]] = {}
    for sample in samples:
        plain = dataclasses.replace(sample, job_id="device", resource={k: v for k, v in sample.resource.items()
                                                                       if not k.startswith("k8s.")},
                                    holder_use=None, precision=sample.precision)
        points = ofu.process(Batch(samples=[plain])).points
        key = (gpu_key(points[0].resource), sample.time_unix_nano)
        out[key] = {"flops": next((p.value for p in points if p.name == "gpu.flops.achieved"), None),
                    "loss": {dict(p.attributes)["ofu.loss.part"]: p.value for p in points if p.name == "gpu.ofu.loss"}}
    return out


# --- dcgm-exporter --kubernetes-virtual-gpus: a served page -------------------------------------------


def test_a_gpu_dcgm_exporter_repeats_per_pod_is_counted_once_and_split_by_each_pods_use(tmp_path):
    """The issue's measurement: a GPU two pods share, copied per pod by dcgm-exporter (vgpu 0 and 1, the same
    values), beside an unshared GPU with the same activity. Before, each copy was a whole GPU: the shared GPU's
    jobs got 2 x its GPU time and 2 x its useful compute. Now its jobs' GPU-seconds, FLOPs and loss GPU-seconds
    add up to the unshared GPU's, split 72:24 by the pods' own SM utilization (per-process rows, #594)."""
    with PageServer({"/metrics": PAGE.read_bytes()}) as server:
        config = build_config(DcgmExporterReceiverConfig, {"endpoint": f"{server.url}/metrics"})
        receiver = DcgmExporterReceiver(config, Context("dcgm_exporter", Telemetry()), lambda batch: None)
        try:
            scraped = receiver.poll().samples
        finally:
            receiver.shutdown()
    assert [(s.gpu_index, s.resource.get("k8s.pod.name"), s.holder_use) for s in scraped] == [
        (0, "bert-ft-0", 72), (0, "embed-api-5d8f7c6b9-q2w4e", 24), (1, "bert-ft-1", 95), (2, None, None)]
    steps = 4  # the page scraped every INTERVAL (the data time is ours: the receiver stamps the scrape's)
    windows = [[dataclasses.replace(s, time_unix_nano=(T0 + INTERVAL * k) * 10**9, precision="bf16")
                for s in scraped] for k in range(steps)]
    attributed, points = ofu_points(attribution(), windows)
    shared = [s for s in attributed[0] if s.gpu_index == 0]
    assert [(s.job_id, s.share, s.share_basis) for s in shared] == [
        ("k8s:nlp/Pod/bert-ft-0", 0.75, "sm_util"), ("k8s:serving/Pod/embed-api-5d8f7c6b9-q2w4e", 0.25, "sm_util")]
    account = jobs_account(points)
    alone = account.seconds["k8s:nlp/Pod/bert-ft-1"]
    assert alone == steps * INTERVAL
    pods = ("k8s:nlp/Pod/bert-ft-0", "k8s:serving/Pod/embed-api-5d8f7c6b9-q2w4e")
    assert [account.seconds[p] for p in pods] == pytest.approx([0.75 * alone, 0.25 * alone], abs=1e-9)
    flop_alone = account.flop["k8s:nlp/Pod/bert-ft-1"]
    peak = specs.find_spec(H100).peak("bf16").flops
    assert flop_alone == pytest.approx(0.478081 * peak * alone, rel=2e-6)  # the page's OFU: its expected.json
    assert math.fsum(account.flop[p] for p in pods) == pytest.approx(flop_alone, rel=1e-12)  # counted once
    for part, seconds in account.loss["k8s:nlp/Pod/bert-ft-1"].items():
        assert math.fsum(account.loss[p][part] for p in pods) == pytest.approx(seconds, rel=1e-12), part
    flops_points = [p for p in points if p.name == "gpu.flops.achieved" and dict(p.resource)["gpu.index"] == "0"]
    assert {job_id_of(p): p.value for p in flops_points[:2]} == pytest.approx(
        {p: share * flop_alone / alone for p, share in zip(pods, (0.75, 0.25))}, rel=1e-9)
    # Recorded by the file exporter, read back by otel-ofu report: the same split, the GPU once.
    path = tmp_path / "shared.jsonl"
    exporter = FileExporter(FileExporterConfig(path=str(path)), Context("file", Telemetry()))
    exporter.start()
    exporter.export(Batch(points=points))
    exporter.shutdown()
    report = build_report(path)
    seconds = {job.summary.job_id: job.summary.totals.gpu_seconds for job in report.jobs}
    assert [seconds[p] for p in pods] == pytest.approx([0.75 * alone, 0.25 * alone], abs=1e-9)
    assert report.gpu_count == 3


def test_a_page_that_copies_the_devices_utilization_to_every_pod_splits_evenly():
    """dcgm-exporter before #594 copies DCGM_FI_DEV_GPU_UTIL per pod with the device's value, and has no
    device row beside: that says nothing of each pod's own use, so the split is even, and said so."""
    text = "\n".join(line for line in PAGE.read_text().splitlines()
                     if not (line.startswith("DCGM_FI_DEV_GPU_UTIL") and "pod_uid" in line)
                     and not (line.startswith("DCGM_FI_DEV_GPU_UTIL") and 'pod="' not in line))
    copies = [line.replace("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_UTIL").rsplit(" ", 1)[0] + " 97"
              for line in text.splitlines() if line.startswith("DCGM_FI_DEV_SM_CLOCK") and 'gpu="0"' in line]
    from otel_ofu.receivers.dcgm_exporter import parse_metrics

    samples = parse_metrics(text + "\n" + "\n".join(copies) + "\n", time_unix_nano=T0 * 10**9, window_s=30)
    assert all(s.holder_use is None for s in samples)
    out = attribution().process(Batch(samples=samples)).samples
    assert [(s.share, s.share_basis) for s in out if s.gpu_index == 0] == [(0.5, "even"), (0.5, "even")]


# --- the kubelet: time-slicing replicas of a GPU and of a MIG instance -----------------------------------


def test_time_sliced_replicas_of_a_gpu_and_of_a_mig_instance_are_split_evenly(kubelet):  # noqa: F811
    """The device plugin lists one device per replica (<uuid>::<n>, MIG-<uuid>::<n>); the kubelet names each
    pod holding one. Each device is one, its pods' jobs share it evenly (nothing measured their use): the
    MIG instance's FLOPs are OFU x peak x its slices' share x the job's share."""
    gpu, mig = "GPU-aaaaaaaa-0000-0000-0000-000000000001", "MIG-dddddddd-0000-0000-0000-000000000004"
    kubelet.pods = [pod("a", "team", ("main", "nvidia.com/gpu", [gpu + "::0"])),
                    pod("b", "team", ("main", "nvidia.com/gpu", [gpu + "::1"])),
                    pod("c", "team", ("main", "nvidia.com/gpu", [gpu + "::2"])),
                    pod("m1", "team", ("main", "nvidia.com/mig-3g.40gb", [mig + "::0"])),
                    pod("m2", "team", ("main", "nvidia.com/mig-3g.40gb", [mig + "::1"]))]
    proc = attribution({"kubelet": {"enabled": True, "socket": kubelet.socket, "timeout": "5s"}})
    proc.refresh()

    def window(k: int) -> list[GpuSample]:
        t = (T0 + INTERVAL * k) * 10**9
        whole = GpuSample(t, INTERVAL, "node-1", 0, gpu, H100, 0.6, 1755, precision="bf16")
        instance = GpuSample(t, INTERVAL, "node-1", 1, "GPU-eeeeeeee-0000-0000-0000-000000000005", H100, 0.4, 1755,
                             precision="bf16", resource={"gpu.mig.instance_id": "1", "gpu.mig.uuid": mig,
                                                         "gpu.mig.slices": "3"})
        return [whole, instance]

    attributed, points = ofu_points(proc, [window(k) for k in range(3)])
    assert [(s.job_id, round(s.share, 12)) for s in attributed[0]] == [
        ("k8s:team/Pod/a", round(1 / 3, 12)), ("k8s:team/Pod/b", round(1 / 3, 12)),
        ("k8s:team/Pod/c", round(1 / 3, 12)), ("k8s:team/Pod/m1", 0.5), ("k8s:team/Pod/m2", 0.5)]
    assert math.fsum(s.share for s in attributed[0][:3]) == 1.0
    account = jobs_account(points, shards=[0, 1, 2])
    assert math.fsum(account.seconds[j] for j in ("k8s:team/Pod/a", "k8s:team/Pod/b", "k8s:team/Pod/c")) == \
        pytest.approx(3 * INTERVAL, abs=1e-9)
    assert account.seconds["k8s:team/Pod/m1"] == account.seconds["k8s:team/Pod/m2"] == pytest.approx(1.5 * INTERVAL)
    peak = specs.find_spec(H100).peak("bf16").flops
    (instance_ofu,) = {p.value for p in points if p.name == "gpu.ofu" and dict(p.resource).get("gpu.mig.uuid")}
    m1_flops = [p.value for p in points if p.name == "gpu.flops.achieved" and job_id_of(p) == "k8s:team/Pod/m1"]
    assert m1_flops == [pytest.approx(instance_ofu * peak * 3 / 7 * 0.5, rel=1e-12)] * 3


# --- NVML per-process utilization: two Slurm jobs on one GPU ----------------------------------------------


def nvml_gpu(samples: list[tuple[int, int, int]]) -> FakeNvmlGpu:
    """The GPU of tests/data/proc's two Slurm jobs (pids 3001: job 4242, 3002: job 4243), as NVML lists it."""
    return FakeNvmlGpu(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000001", processes=[
        (3001, 8 << 30, 0xFFFFFFFF, 0xFFFFFFFF), (3002, 4 << 30, 0xFFFFFFFF, 0xFFFFFFFF)],
        process_utilization=samples)


def test_two_slurm_jobs_on_one_gpu_are_split_by_their_processes_sm_use_from_nvml():
    """Slurm GPU shards: two jobs' processes on one GPU. NVML's per-process samples since the last refresh
    (pid 3001: 60 % then 64 %, pid 3002: 20 %) split it 62:20; the next refresh, no sample since (NOT_FOUND: no
    process used it), splits it evenly, said so. Each job's GPU time is its share of the GPU's, together the
    GPU's."""
    api = FakeNvml([nvml_gpu([(3001, 1_000, 60), (3002, 1_000, 20), (3001, 2_000, 64)])])
    proc = attribution({"processes": {"enabled": True, "proc_root": str(PROC), "pid_sources": ["nvml"]}},
                       pid_provider=NvmlPids(api))
    proc.refresh()
    gpu = api.gpus[0]

    def window(k: int) -> list[GpuSample]:
        return [GpuSample((T0 + INTERVAL * k) * 10**9, INTERVAL, "node-1", 0, gpu.uuid, H100, 0.5, 1755,
                          precision="bf16")]

    first, first_points = ofu_points(proc, [window(0)])
    assert [(s.job_id, s.share, s.share_basis) for s in first[0]] == [
        ("slurm:4242", pytest.approx(62 / 82, abs=1e-12), "sm_util"),
        ("slurm:4243", pytest.approx(20 / 82, abs=1e-12), "sm_util")]
    assert math.fsum(s.share for s in first[0]) == 1.0
    proc.refresh()  # nothing since: NVML_ERROR_NOT_FOUND
    second, second_points = ofu_points(proc, [window(1)])
    assert [(s.share, s.share_basis) for s in second[0]] == [(0.5, "even"), (0.5, "even")]
    account = jobs_account(first_points + second_points, shards=[0, 1])
    assert account.seconds["slurm:4242"] == pytest.approx(INTERVAL * (62 / 82 + 0.5), abs=1e-9)
    assert account.seconds["slurm:4242"] + account.seconds["slurm:4243"] == pytest.approx(2 * INTERVAL, abs=1e-9)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from tests.kube_apiserver import WATCHER_USER, KubeApiServer

    server = KubeApiServer(tmp_path_factory.mktemp("kube")).start()
    server.grant(WATCHER_USER, "otel-ofu-pods", [{"apiGroups": [""], "resources": ["pods"],
                                                  "verbs": ["get", "list", "watch"]}])
    yield server
    server.stop()


def test_pods_time_sharing_a_gpu_are_split_by_their_processes_sm_use(cluster, kubelet, tmp_path):  # noqa: F811
    """The chain dcgm-exporter's per-process metrics walk (#594: pidmapper.go), here: NVML lists the GPU's
    processes and each one's SM utilization; each pid's cgroup names its pod's UID (cgroup v2, systemd
    driver: kubepods-burstable-pod<uid with underscores>.slice); the Kubernetes API names the pod with that
    UID, which the kubelet lists as holding a time-sliced replica of the GPU. The pods' jobs split the GPU
    45:15 by their processes' use, and a process of a pod that holds no replica (a UID the API does not
    know on this node) makes the split even: its use says nothing of how the holders shared it."""
    from tests.kube_apiserver import WATCHER_TOKEN, WATCHER_USER

    cluster.namespace("share")
    uids = {name: cluster.create_pod("share", name, "node-s")["metadata"]["uid"] for name in ("p-a", "p-b")}
    gpu = "GPU-ffffffff-0000-0000-0000-000000000006"
    kubelet.pods = [pod("p-a", "share", ("main", "nvidia.com/gpu", [gpu + "::0"])),
                    pod("p-b", "share", ("main", "nvidia.com/gpu", [gpu + "::1"]))]
    proc_root = tmp_path / "proc"
    stranger = "0f0e0d0c-0b0a-4909-8807-060504030201"
    for pid, uid in ((7001, uids["p-a"]), (7002, uids["p-b"]), (7003, stranger)):
        (proc_root / str(pid)).mkdir(parents=True)
        (proc_root / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
            f"cri-containerd-{pid:064x}.scope\n")
    api = FakeNvml([FakeNvmlGpu(uuid=gpu, processes=[(7001, 8 << 30, 0xFFFFFFFF, 0xFFFFFFFF),
                                                     (7002, 4 << 30, 0xFFFFFFFF, 0xFFFFFFFF)])])
    proc = attribution({"refresh_interval": "1h", "dra": {"drivers": []},
                        "kubelet": {"enabled": True, "socket": kubelet.socket, "timeout": "5s"},
                        "processes": {"enabled": True, "proc_root": str(proc_root), "pid_sources": ["nvml"]},
                        "kubernetes_api": {"enabled": True, "node_name": "node-s", "request_timeout": "5s",
                                           "kubeconfig": str(cluster.kubeconfig(WATCHER_TOKEN, WATCHER_USER))}},
                       pid_provider=NvmlPids(api))
    proc.start()
    try:
        assert proc.pods.synced.wait(60)
        # The processor's thread's first refresh read NVML's samples up to now (a refresh reads those since the last)
        wait_for("the first refresh on the processor's thread", lambda: proc.processes._provider_use.at, timeout=30)
        api.gpus[0].process_utilization += [(7001, 1_000, 45), (7002, 1_000, 15)]  # since that refresh
        proc.refresh()
        sample = GpuSample(T0 * 10**9, INTERVAL, "node-s", 0, gpu, H100, 0.5, 1755)
        out = proc.process(Batch(samples=[sample])).samples
        assert [(s.job_id, s.share, s.share_basis, s.resource["k8s.pod.uid"]) for s in out] == [
            ("k8s:share/Pod/p-a", 0.75, "sm_util", uids["p-a"]), ("k8s:share/Pod/p-b", 0.25, "sm_util", uids["p-b"])]
        api.gpus[0].processes.append((7003, 1 << 30, 0xFFFFFFFF, 0xFFFFFFFF))
        api.gpus[0].process_utilization += [(7001, 2_000, 45), (7002, 2_000, 15), (7003, 2_000, 40)]
        proc.refresh()
        later = GpuSample((T0 + INTERVAL) * 10**9, INTERVAL, "node-s", 0, gpu, H100, 0.5, 1755)
        out = proc.process(Batch(samples=[later])).samples
        assert [(s.job_id, s.share, s.share_basis) for s in out] == [
            ("k8s:share/Pod/p-a", 0.5, "even"), ("k8s:share/Pod/p-b", 0.5, "even")]
    finally:
        proc.shutdown()


def test_nvml_per_process_utilization_reads_only_new_samples_and_says_none_when_not_found():
    api = FakeNvml([nvml_gpu([(3001, 1_000, 30), (3002, 1_500, 10)])])
    pids = NvmlPids(api)
    assert pids() == {"gpu-aaaaaaaa-0000-0000-0000-000000000001": [3001, 3002]}
    assert pids.utilization() == {"gpu-aaaaaaaa-0000-0000-0000-000000000001": {3001: 30.0, 3002: 10.0}}
    assert pids.utilization() == {"gpu-aaaaaaaa-0000-0000-0000-000000000001": {}}  # NOT_FOUND: no process used it
    api.gpus[0].process_utilization.append((3002, 2_000, 50))
    assert pids.utilization() == {"gpu-aaaaaaaa-0000-0000-0000-000000000001": {3002: 50.0}}


# --- conservation, over any fleet -----------------------------------------------------------------------------

# Pods that may hold a GPU: (namespace, name, the job-name label: a-0 and a-1 are one Job's pods).
PODS = (("nlp", "a-0", "a"), ("nlp", "a-1", "a"), ("serving", "b-0", ""), ("ml", "c-0", ""))


def copies_of(t: int, host: str, index: int, tpa: float, holders: list[tuple[int, int | None]]) -> list[GpuSample]:
    """A GPU window as dcgm-exporter --kubernetes-virtual-gpus serves it: a copy per pod holding it (with its
    use when measured), or the GPU alone when none does."""
    base = GpuSample(t, INTERVAL, host, index, f"GPU-{host}-{index}", H100, tpa, 1755, gr_active=min(1.0, tpa + 0.3),
                     sm_active=min(1.0, tpa + 0.2), precision="bf16")
    if not holders:
        return [base]
    out = []
    for which, use in holders:
        namespace, name, job = PODS[which]
        resource = {"k8s.namespace.name": namespace, "k8s.pod.name": name}
        if job:
            resource["k8s.pod.label.batch.kubernetes.io/job-name"] = job
        out.append(dataclasses.replace(base, resource=resource, holder_use=use))
    return out


def job_of(which: int) -> str:
    namespace, name, job = PODS[which]
    return f"k8s:{namespace}/Job/{job}" if job else f"k8s:{namespace}/Pod/{name}"


def expected_shares(holders: list[tuple[int, int | None]]) -> dict[str, float]:
    """The split docs/sharing.md states: by the pods' uses (summed per job) when every copy has one and they
    are not all 0, else even between the jobs."""
    jobs = sorted({job_of(w) for w, _ in holders})
    uses: dict[str, float] = defaultdict(float)
    for which, use in holders:
        uses[job_of(which)] += use or 0
    if all(use is not None for _, use in holders) and sum(uses.values()) > 0:
        return {job: uses[job] / sum(uses.values()) for job in jobs}
    return {job: 1 / len(jobs) for job in jobs}


HOLDERS = st.lists(st.tuples(st.integers(0, len(PODS) - 1), st.none() | st.integers(0, 100)), max_size=4,
                   unique_by=lambda h: h[0])
FLEETS = st.integers(1, 3).flatmap(lambda gpus: st.integers(1, 6).flatmap(lambda steps: st.lists(
    st.lists(st.tuples(st.floats(0.0, 1.0, allow_nan=False), HOLDERS), min_size=gpus, max_size=gpus),
    min_size=steps, max_size=steps)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet=FLEETS, measured=st.booleans(), shards=st.lists(st.integers(0, 3), min_size=1, max_size=4))
def test_the_jobs_shares_of_a_device_add_up_to_it_over_any_fleet_and_window(fleet, measured, shards):
    """fleet[step][gpu] = (TPA, [(pod, its use or None)]). Whatever pods hold each GPU each window: the jobs'
    shares add up to 1 (1e-9), as stated; through the ofu processor and a jobs tier sharded as the gateway
    shards it, each job's GPU-seconds, FLOPs and loss GPU-seconds are its shares of its devices', and all GPU
    time together is the GPUs' own: nothing lost, nothing counted twice."""
    windows = []
    for step, gpus in enumerate(fleet):
        t = (T0 + INTERVAL * (step + 1)) * 10**9
        samples = []
        for index, (tpa, holders) in enumerate(gpus):
            if not measured:
                holders = [(which, None) for which, _ in holders]
            samples += copies_of(t, "node-1", index, tpa, holders)
        windows.append(samples)
    device = device_points([group[0] for samples in windows for group in _by_device(samples)])
    attributed, points = ofu_points(attribution(), windows)
    want_seconds: dict[str, float] = defaultdict(float)
    want_flop: dict[str, float] = defaultdict(float)
    want_loss: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for step, (gpus, out) in enumerate(zip(fleet, attributed, strict=True)):
        t = (T0 + INTERVAL * (step + 1)) * 10**9
        by_device = defaultdict(list)
        for sample in out:
            by_device[sample.gpu_key()].append(sample)
        assert len(by_device) == len(gpus)  # each GPU once, whatever its copies
        for index, (_, holders) in enumerate(gpus):
            held = by_device[("node-1", f"gpu-node-1-{index}", "")]
            assert math.fsum(1.0 if s.share is None else s.share for s in held) == pytest.approx(1.0, abs=1e-9)
            if not measured:
                holders = [(which, None) for which, _ in holders]
            if not holders:
                continue
            shares = expected_shares(holders)
            assert {s.job_id: 1.0 if s.share is None else s.share for s in held} == pytest.approx(shares, abs=1e-9)
            own = device[(("node-1", f"gpu-node-1-{index}", ""), t)]
            for job, share in shares.items():
                want_seconds[job] += INTERVAL * share
                want_flop[job] += own["flops"] * INTERVAL * share
                for part, value in own["loss"].items():
                    want_loss[job][part] += value * INTERVAL * share
    account = jobs_account(points, shards)
    assert dict(account.seconds) == pytest.approx(dict(want_seconds), abs=1e-6)
    assert dict(account.flop) == pytest.approx(dict(want_flop), rel=1e-9)
    for job, parts in want_loss.items():
        got = account.loss[job]
        assert {p: got.get(p, 0.0) for p in parts} == pytest.approx(dict(parts), abs=1e-6)
        assert set(got) - set(parts) <= {"useful"}
    total = sum(account.seconds.values()) + account.unattributed
    assert total == pytest.approx(len(fleet) * len(fleet[0]) * INTERVAL, abs=1e-6)


def _by_device(samples: list[GpuSample]) -> list[list[GpuSample]]:
    groups: dict[tuple, list[GpuSample]] = {}
    for sample in samples:
        groups.setdefault(sample.gpu_key(), []).append(sample)
    return list(groups.values())
