"""The attribution processor naming a training process's own reports (MFU, TFLOP/s) with its job.

The end-to-end tests (tests/test_mfu_audit_e2e.py) run the Kubernetes API source for real;
here: pods named by the resource, Slurm ids, pids through the /proc fixture tree, what is kept.
"""

from __future__ import annotations

import logging
import socket

from otel_ofu.core.model import Batch, MetricPoint, attrs, job_id_of
from tests.test_attribution import GPU_A, GPU_B, UID1, make, proc_cfg, run, sample

HOST = socket.gethostname()


def report(resource: dict, name: str = "training.mfu", attributes: dict | None = None) -> MetricPoint:
    base = {"service.name": "trainer", "telemetry.sdk.language": "python"}
    return MetricPoint(name, 0.5, 10**18, attrs({**base, **resource}), attrs(attributes or {}))


def annotate(proc, *points: MetricPoint, samples=()) -> list[MetricPoint]:
    return proc.process(Batch(samples=list(samples), points=list(points))).points


def outcome(proc, name: str) -> float:
    return proc.context.telemetry.counter("otel_ofu.attribution.reports", outcome=name)


def test_a_pod_report_gets_the_id_its_gpus_get_from_dcgm_exporter_labels():
    gpus = [sample(GPU_A, resource={"k8s.pod.name": "trainer-0", "k8s.namespace.name": "llm"}),
            sample(GPU_B, index=1, resource={"k8s.pod.name": "trainer-0", "k8s.namespace.name": "llm"})]
    proc = make()
    out = proc.process(Batch(samples=gpus, points=[report({"k8s.pod.name": "trainer-0",
                                                              "k8s.namespace.name": "llm", "process.pid": 7})]))
    (point,) = out.points
    assert {s.job_id for s in out.samples} == {job_id_of(point)} == {"k8s:llm/Pod/trainer-0"}
    resource = dict(point.resource)
    assert resource["ofu.job.source"] == "report" and resource["process.pid"] == 7  # the rank stays apart
    assert outcome(proc, "attributed") == 1


def test_a_pod_label_on_the_report_names_the_job_like_the_gpus():
    label = {"k8s.pod.label.batch.kubernetes.io/job-name": "llama"}
    proc = make({"k8s_job_label": "batch.kubernetes.io/job-name"})
    (gpu,) = run(proc, sample(resource={"k8s.pod.name": "llama-0-x", "k8s.namespace.name": "llm", **label}))
    (point,) = annotate(proc, report({"k8s.pod.name": "llama-1-y", "k8s.namespace.name": "llm", **label}))
    assert gpu.job_id == job_id_of(point) == "k8s:llm/llama"


def test_a_slurm_report_is_slurm_id_unless_its_gpus_know_the_job_only_as_hpc_job():
    proc = make()
    (point,) = annotate(proc, report({"slurm.job.id": "4242", "host.name": "n1"}))
    assert job_id_of(point) == "slurm:4242"  # as GPUs named by their processes (cgroup, SLURM_JOB_ID)
    (gpu,) = run(proc, sample(resource={"hpc.job.id": "4242"}))
    (point,) = annotate(proc, report({"slurm.job.id": "4242", "host.name": "n1"}))
    assert gpu.job_id == job_id_of(point) == "4242"  # dcgm-exporter's hpc_job mapping: the id as given


def test_a_pid_on_this_node_is_named_by_its_cgroup_and_environment():
    proc = make(proc_cfg())
    slurm, pod, bare = annotate(proc, report({"host.name": HOST, "process.pid": 3001}),
                                report({"host.name": HOST, "process.pid": 1001}),
                                report({"host.name": HOST, "process.pid": 5001}))
    assert job_id_of(slurm) == "slurm:4242" and dict(slurm.resource)["slurm.job.user"] == "alice"
    assert job_id_of(pod) == f"k8s-uid:{UID1}"
    assert job_id_of(bare) is None and outcome(proc, "no_identity") == 1


def test_a_pid_is_looked_up_only_on_a_host_whose_proc_this_reads():
    proc = make(proc_cfg())
    (elsewhere,) = annotate(proc, report({"host.name": "other-node", "process.pid": 3001}))
    assert job_id_of(elsewhere) is None
    (gpu,) = run(proc, sample(host="gpu-node-7", attributes={"process.pid": 3002}))  # GPUs of this node
    (here,) = annotate(proc, report({"host.name": "gpu-node-7", "process.pid": 3001}))
    assert gpu.job_id == "slurm:4243" and job_id_of(here) == "slurm:4242"
    (off,) = annotate(make(), report({"host.name": HOST, "process.pid": 3001}))  # processes source off
    assert job_id_of(off) is None


def test_a_report_that_names_its_job_keeps_it_and_other_metrics_are_left_alone():
    proc = make()
    named = report({"ofu.job.id": "llama-70b", "k8s.pod.name": "p", "k8s.namespace.name": "ns"})
    loss = report({"k8s.pod.name": "p", "k8s.namespace.name": "ns"}, name="training.loss")
    out = annotate(proc, named, loss)
    assert out == [named, loss] and outcome(proc, "kept") == 1
    (custom,) = annotate(make({"report_metrics": ["training.loss"]}), loss)
    assert job_id_of(custom) == "k8s:ns/Pod/p"


def test_a_report_naming_nothing_is_counted_and_logged_once(caplog):
    proc = make()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            (point,) = annotate(proc, report({"host.name": "laptop"}, name="megatron.training.throughput_tflops"))
    assert job_id_of(point) is None and outcome(proc, "no_identity") == 3
    warned = [r for r in caplog.records if "names no job" in r.getMessage()]
    assert len(warned) == 1 and "laptop" in warned[0].getMessage()


def test_a_slurm_jobs_report_before_any_of_its_gpus_counts_for_that_job():
    """The job's first report comes before the first scrape of its GPUs, which dcgm-exporter names
    by its hpc_job label: attribution -> ofu -> jobs must still count the report for the job its
    GPUs name (issue 22: it was held as slurm:4242 while the GPUs were 4242, never matched)."""
    from otel_ofu.jobs.config import JobsConfig
    from otel_ofu.pipeline.component import Context
    from otel_ofu.pipeline.config import build_config
    from otel_ofu.pipeline.telemetry import Telemetry
    from otel_ofu.processors.jobs import JobsProcessor
    from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig

    t0 = 1_800_000_000
    clock = [float(t0)]
    attribution, ofu = make(), OfuProcessor(OfuProcessorConfig(), Context("ofu", Telemetry()))
    jobs = JobsProcessor(build_config(JobsConfig, {"windows": ["5m"]}), Context("jobs", Telemetry()),
                         clock=lambda: clock[0])

    def step(t: int, points=(), samples=()) -> None:
        clock[0] = float(t)
        jobs.process(ofu.process(attribution.process(Batch(samples=list(samples), points=list(points)))))

    first = MetricPoint("training.mfu", 0.3, (t0 + 5) * 10**9,
                        attrs({"service.name": "megatron", "slurm.job.id": "4242", "host.name": "n1"}))
    step(t0 + 5, points=[first])
    for t in range(t0 + 10, t0 + 601, 10):
        step(t, samples=[sample(GPU_A, t=t * 10**9, host="n1", resource={"hpc.job.id": "4242"})])
    tracker = jobs.book.jobs["4242"]
    assert tracker.mfu_seconds > 0 and tracker.mfu_life == 0.3
    assert jobs.context.telemetry.counter("otel_ofu.jobs.skipped", reason="mfu_without_job") == 0
