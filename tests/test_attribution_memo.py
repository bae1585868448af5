"""The attribution processor keeps each device's answer while nothing it was made of changes (BENCHMARKS.md
section 11: resolving every GPU every window was about a sixth of a processing stage's CPU), and that
changes no result: with the memo and without it, any sequence of batches gives the same samples (job id,
resource, attributes, precision, share, basis) and points, whatever changes between them: the samples'
pod and Slurm labels, their own job ids, precisions, attributes and uses, the hosts whose pages label pods,
the kubelet's answer (a real gRPC server speaking its pod-resources proto), the rules and settings, and the
series bound's overflow and idle timers. The Kubernetes API's pods and DRA slices and claims change under
a real kube-apiserver in tests/test_k8s_dra.py::test_the_memo_changes_no_answer_while_pods_slices_and_claims_change.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_ofu.core.model import Batch, GpuSample, MetricPoint
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.attribution import OVERFLOW_METRIC, AttributionProcessor, AttributionProcessorConfig
from tests.test_attribution import PROC, Clock, kubelet, pod  # noqa: F401 (kubelet: the gRPC server fixture)
from tests.test_sharing import PODS

H100 = "NVIDIA H100 80GB HBM3"
INTERVAL_NS = 30 * 10**9
T0 = 1_800_000_000 * 10**9
GPUS = [(host, index) for host in ("node-1", "node-2") for index in range(2)]

# What a sample may carry beyond its pods: each an option a GPU's window draws.
RESOURCE_EXTRAS = (
    {},
    {"gpu.pci_bus_id": "00000000:18:00.0"},
    {"hpc.job.id": "4242"},  # dcgm-exporter's hpc_job
    {"hpc.job.id": "4343"},
    {"k8s.pod.label.ofu.dev/precision": "fp8"},
    {"process.pid": "1001"},  # the pid of tests/data/proc's pod process (cgroup v1)
    {"gpu.mig.instance_id": "1", "gpu.mig.profile": "1g.10gb", "dra.mig.profile": "1g.10gb"},
    {"gpu.mig.instance_id": "2", "gpu.mig.profile": "1g.10gb", "dra.mig.profile": "3g.40gb"},
    {"gpu.index.spelled": 1},  # not a str: resolved every time
)
ATTRIBUTE_EXTRAS = ({}, {"process.pid": "2001"}, {"ofu.dev/precision": "bf16"})
RULES = (
    [],
    [{"match": {"host": "node-2"}, "job_id": "rule-job"}],
    [{"match": {"attributes": {"k8s.namespace.name": "n*"}}, "precision": "fp8"}],
    [{"match": {"uuid": "gpu-node-1-*"}, "job_id": "pinned", "override": True}],
)

HOLDERS = st.lists(st.tuples(st.integers(0, len(PODS) - 1), st.none() | st.integers(0, 100)), max_size=3,
                   unique_by=lambda h: h[0])
# What a GPU's window is: which pods' copies it has (dcgm-exporter --kubernetes-virtual-gpus), each with its
# use or none, what else its resource and attributes carry, its own job id and precision.
WINDOW_FIELDS = {
    "holders": HOLDERS,
    "resource": st.sampled_from(RESOURCE_EXTRAS),
    "attributes": st.sampled_from(ATTRIBUTE_EXTRAS),
    "job_id": st.sampled_from([None, None, "unknown", "own-job"]),
    "precision": st.sampled_from([None, None, "bf16", "fp8"]),
}
WINDOW = st.fixed_dictionaries(WINDOW_FIELDS)


def _one_change(window: dict) -> st.SearchStrategy[list[dict]]:
    """The window and one that differs from it in one thing only: the pods' uses, its last pod, a field."""
    held = window["holders"]
    uses = st.lists(st.none() | st.integers(0, 100), min_size=3, max_size=3).map(
        lambda drawn: {"holders": [(which, use) for (which, _), use in zip(held, drawn)]})
    last = st.integers(0, len(PODS) - 1).map(  # another pod in its place, with its use
        lambda which: {"holders": [h for h in held[:-1] if h[0] != which] + [(which, held[-1][1] if held else None)]})
    fields = [st.builds(lambda v, k=name: {k: v}, strategy) for name, strategy in WINDOW_FIELDS.items()]
    return st.one_of(uses, uses, last, last, *fields).map(lambda change: [window, {**window, **change}])


VARIANTS = WINDOW.flatmap(_one_change)  # each GPU's two windows, one field apart
STEP = st.fixed_dictionaries({
    # each GPU's window: one of the GPU's variants (the same labels as before, or others), or -1: absent
    "windows": st.lists(st.sampled_from([0, 0, 1, -1]), min_size=len(GPUS), max_size=len(GPUS)),
    # whether the kubelet's answer changes: to the pods (indexes into PODS) holding each GPU by the device
    # plugin
    "kubelet_changes": st.sampled_from([False, False, False, True]),
    "kubelet": st.lists(st.lists(st.integers(0, len(PODS) - 1), unique=True, max_size=2), min_size=len(GPUS),
                        max_size=len(GPUS)),
    "allocatable": st.booleans(),  # it lists the GPUs it offers (then one nobody holds is idle)
    # windows since the last step (3: past pid_ttl; 30: past job_idle_timeout)
    "gap": st.sampled_from([1, 1, 1, 3, 30]),
})
CONFIG = st.fixed_dictionaries({
    "override": st.booleans(),
    "rules": st.sampled_from(RULES),
    "max_jobs": st.integers(1, 5),
    "job_idle_timeout": st.just("10m"),
    "processes": st.sampled_from([{}, {}, {"keep_pid_attribute": True},
                                  {"enabled": True, "proc_root": str(PROC), "pid_sources": ["samples"]}]),
})


def uuid_of(host: str, index: int) -> str:
    return f"GPU-{host}-{index}"


def window_samples(t: int, host: str, index: int, window: dict) -> list[GpuSample]:
    """A GPU's window: a copy per pod holding it as dcgm-exporter labels them, or the GPU alone."""
    base = GpuSample(t, 30, host, index, uuid_of(host, index), H100, 0.5, 1755, job_id=window["job_id"],
                     precision=window["precision"], resource=dict(window["resource"]),
                     attributes=dict(window["attributes"]))
    out = []
    for which, use in window["holders"]:
        namespace, name, job = PODS[which]
        resource = {**window["resource"], "k8s.namespace.name": namespace, "k8s.pod.name": name}
        if job:
            resource["k8s.pod.label.batch.kubernetes.io/job-name"] = job
        out.append(dataclasses.replace(base, resource=resource, holder_use=use))
    return out or [base]


def kubelet_pods(holders: list[list[int]]) -> list:
    """The kubelet's List answer: each pod with the GPUs it holds by the device plugin."""
    held: dict[int, list[str]] = {}
    for (host, index), pods in zip(GPUS, holders, strict=True):
        for which in pods:
            held.setdefault(which, []).append(uuid_of(host, index))
    return [pod(PODS[which][1], PODS[which][0], ("main", "nvidia.com/gpu", uuids)) for which, uuids in held.items()]


def seen(batch: Batch) -> tuple[list[tuple], list[MetricPoint]]:
    """Everything of a processed batch a consumer reads: each sample's identity and what attribution set."""
    return [(s.time_unix_nano, s.host, s.uuid, s.gpu_index, s.job_id, s.precision, s.resource, s.attributes,
             s.share, s.share_basis, s.holder_use) for s in batch.samples], list(batch.points)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(config=CONFIG, variants=st.lists(VARIANTS, min_size=len(GPUS), max_size=len(GPUS)),
       steps=st.lists(STEP, min_size=1, max_size=8))
def test_the_memo_changes_no_answer_over_any_sequence_of_batches(kubelet, config, variants, steps):  # noqa: F811
    """Two processors, one keeping each device's answer, one resolving every device every time, fed the
    same batches and the same kubelet answers: the same batches out (samples and points), the same
    overflows, the same Slurm jobs noted for the reports."""
    kubelet.pods, kubelet.allocatable = [], None
    cfg = build_config(AttributionProcessorConfig, {**config, "sample_labels": True,
                                                    "kubelet": {"enabled": True, "socket": kubelet.socket,
                                                                "timeout": "5s"}})
    clock = Clock()  # the processes source's pid_ttl and the kubelet's cache_ttl: as the data's time
    kept = AttributionProcessor(cfg, Context("attribution", Telemetry()), clock=clock)
    fresh = AttributionProcessor(cfg, Context("attribution", Telemetry()), clock=clock, memo=False)
    t = T0
    try:
        for step in steps:
            t += step["gap"] * INTERVAL_NS
            clock.now += step["gap"] * INTERVAL_NS / 1e9
            if step["kubelet_changes"]:
                kubelet.pods = kubelet_pods(step["kubelet"])
                kubelet.allocatable = [pod("x", "y", ("main", "nvidia.com/gpu", [uuid_of(*g) for g in GPUS]))
                                       .containers[0].devices[0]] if step["allocatable"] else None
            kept.refresh()
            fresh.refresh()
            samples = [s for gpu, own, which in zip(GPUS, variants, step["windows"], strict=True) if which >= 0
                       for s in window_samples(t, *gpu, own[which])]
            # a receiver's own per-GPU point (the sim's truth): follows its GPU's job
            points = [MetricPoint("sim.truth", 0.5, t, s.resource_attributes({"ofu.job.id": s.job_id or "none"}))
                      for s in samples[:2]]
            out_kept = kept.process(Batch(samples=copy.deepcopy(samples), points=list(points)))
            out_fresh = fresh.process(Batch(samples=copy.deepcopy(samples), points=list(points)))
            assert seen(out_kept) == seen(out_fresh)
        assert list(kept.resolver.hpc_only) == list(fresh.resolver.hpc_only)
        assert len(kept._limiter) == len(fresh._limiter)
        assert kept.context.telemetry.counter(OVERFLOW_METRIC.name) == fresh.context.telemetry.counter(
            OVERFLOW_METRIC.name)
    finally:
        kept.shutdown()
        fresh.shutdown()


# --- the memo is used, and let go when a source changes ------------------------------------------------------

def resolutions(proc: AttributionProcessor) -> list[str]:
    """The devices (UUIDs) the processor resolves from now on, in order."""
    made: list[str] = []
    resolve = proc.resolver.resolve

    def counted(device, sample):
        made.append(sample.uuid)
        return resolve(device, sample)

    proc.resolver.resolve = counted  # type: ignore[method-assign]
    return made


def test_an_unchanged_device_is_resolved_once_and_again_when_a_source_changes(kubelet):  # noqa: F811
    """The same labels window after window: resolved once. The kubelet answering again the same: still kept.
    The kubelet's answer changing, a host's page starting to label pods, a sample's labels or job id changing:
    resolved again. A value that is not a string (1 equals 1.0 and True): resolved every time."""
    cfg = build_config(AttributionProcessorConfig, {"sample_labels": True, "kubelet": {
        "enabled": True, "socket": kubelet.socket, "timeout": "5s"}})
    proc = AttributionProcessor(cfg, Context("attribution", Telemetry()))
    made = resolutions(proc)
    a, b = uuid_of("node-1", 0), uuid_of("node-1", 1)

    def window(k: int, **resource) -> list[GpuSample]:
        t = T0 + k * INTERVAL_NS
        return [GpuSample(t, 30, "node-1", 0, a, H100, 0.5, 1755, resource={"gpu.pci_bus_id": "18", **resource}),
                GpuSample(t, 30, "node-1", 1, b, H100, 0.5, 1755)]

    def jobs(samples: list[GpuSample]) -> list[str | None]:
        return [s.job_id for s in proc.process(Batch(samples=samples)).samples]

    try:
        kubelet.pods = [pod("b-0", "serving", ("main", "nvidia.com/gpu", [b]))]
        proc.refresh()
        assert jobs(window(0)) == [None, "k8s:serving/Pod/b-0"] and made == [a, b]
        assert jobs(window(1)) == [None, "k8s:serving/Pod/b-0"] and made == [a, b]  # kept
        proc.refresh()  # the same answer again
        assert jobs(window(2)) == [None, "k8s:serving/Pod/b-0"] and made == [a, b]
        kubelet.pods = [pod("c-0", "ml", ("main", "nvidia.com/gpu", [b]))]
        proc.refresh()
        assert jobs(window(3)) == [None, "k8s:ml/Pod/c-0"] and made == [a, b, a, b]
        labelled = window(4, **{"k8s.namespace.name": "nlp", "k8s.pod.name": "a-0"})
        assert jobs(labelled) == ["k8s:nlp/Pod/a-0", "k8s:ml/Pod/c-0"]
        assert made[4:] == [a, b]  # a's labels changed; node-1 now labels its pods' GPUs (b may be idle)
        assert jobs(window(5, **{"k8s.namespace.name": "nlp", "k8s.pod.name": "a-0"})) == [
            "k8s:nlp/Pod/a-0", "k8s:ml/Pod/c-0"] and made[6:] == []
        own = window(6, **{"k8s.namespace.name": "nlp", "k8s.pod.name": "a-0"})
        own[0].job_id = "given"
        assert jobs(own) == ["given", "k8s:ml/Pod/c-0"] and made[6:] == [a]
        for k in (7, 8):  # node-1 labels its pods' GPUs: one without a pod is idle
            assert jobs(window(k, **{"gpu.pci_bus_id": 18})) == ["none", "k8s:ml/Pod/c-0"]
        assert made[7:] == [a, a]  # an int is no str: never kept
    finally:
        proc.shutdown()


def test_with_the_processes_source_every_device_is_resolved_every_window():
    """A device's pids are the window's (and remembered pid_ttl on the clock): nothing can be kept."""
    cfg = build_config(AttributionProcessorConfig, {"processes": {"enabled": True, "proc_root": str(PROC),
                                                                  "pid_sources": ["samples"]}})
    proc = AttributionProcessor(cfg, Context("attribution", Telemetry()))
    made = resolutions(proc)
    for k in range(3):
        sample = GpuSample(T0 + k * INTERVAL_NS, 30, "node-1", 0, uuid_of("node-1", 0), H100, 0.5, 1755,
                           attributes={"process.pid": "1001"})
        out = proc.process(Batch(samples=[sample])).samples
        assert out[0].resource["k8s.pod.uid"] == "5f1c6a2e-8d0b-4f57-9a3e-2b7c1d9e4f60"
    assert len(made) == 3


@pytest.mark.parametrize("value", [1, 1.0, True])
def test_equal_values_of_other_types_are_never_taken_for_each_other(value):
    """1, 1.0 and True are equal keys but different attribute values: each window's own goes out."""
    proc = AttributionProcessor(build_config(AttributionProcessorConfig, {}), Context("attribution", Telemetry()))
    out = []
    for k, spelled in enumerate(["1", value, 1, True, 1.0]):
        sample = GpuSample(T0 + k * INTERVAL_NS, 30, "node-1", 0, uuid_of("node-1", 0), H100, 0.5, 1755,
                           resource={"x": spelled})
        out.append(proc.process(Batch(samples=[sample])).samples[0].resource["x"])
    assert [(type(v), v) for v in out] == [(type(v), v) for v in ["1", value, 1, True, 1.0]]


def test_a_kept_answer_still_notes_the_slurm_job_a_gpu_knows_only_as_hpc_job():
    """A report names a Slurm job as its GPUs do: as given (4242) where they know it only through
    dcgm-exporter's hpc_job, remembered for the max_jobs most recently seen. A GPU whose answer is kept
    is still seen: with room for one job, the job of the GPU seen last is the one remembered."""
    from tests.test_attribution_reports import annotate, report

    proc = AttributionProcessor(build_config(AttributionProcessorConfig, {"max_jobs": 1}),
                                Context("attribution", Telemetry()))

    def gpu(k: int, index: int, job: str) -> GpuSample:
        return GpuSample(T0 + k * INTERVAL_NS, 30, "n1", index, uuid_of("n1", index), H100, 0.5, 1755,
                         resource={"hpc.job.id": job})

    proc.process(Batch(samples=[gpu(0, 0, "4242"), gpu(0, 1, "4343")]))
    out = proc.process(Batch(samples=[gpu(1, 0, "4242")])).samples  # the same GPU, the same labels: kept
    assert [s.job_id for s in out] == ["4242"]
    (point,) = annotate(proc, report({"slurm.job.id": "4242", "host.name": "n1"}))
    assert dict(point.resource)["ofu.job.id"] == "4242"
