"""What a point says about its GPU and job, worked out once per resource (a bounded cache)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from otel_ofu.attribution.claims import SHARED_SEPARATOR
from otel_ofu.core import specs
from otel_ofu.core.model import HW_MODEL, JOB_ID, JOB_RUN, JOB_SHARED, PRECISION, GpuKey, MetricPoint, gpu_key
from otel_ofu.jobs.clocks import source_of
from otel_ofu.pipeline.caches import Cache

# A job as the book keeps it: its id, and its run (ofu.job.run) after a NUL when known. A job
# deleted and created again under one id is a new run: a job of its own, with its own totals
# and baseline. A plain string, so a job without a run is keyed by its id as before.
JobKey = str
RUN_SEPARATOR = "\0"


def job_key(job_id: str, run: str = "") -> JobKey:
    return f"{job_id}{RUN_SEPARATOR}{run}" if run else job_id


def key_job_id(key: JobKey) -> str:
    """The job id of a book key (without its run)."""
    return key.partition(RUN_SEPARATOR)[0]


def job_of(point: MetricPoint) -> tuple[JobKey | None, dict[str, Any]]:
    """The point's job (its id, and its run when known: :func:`job_key`) and its attributes,
    resource and point attributes in one dict.

    Job identity is on the resource; point attributes win for other keys and are read for
    recordings made before job identity moved to the resource.
    """
    merged = {**dict(point.resource), **dict(point.attributes)}
    for key, value in point.resource:
        if key == JOB_ID or key == PRECISION or key == JOB_SHARED or key == JOB_RUN:
            merged[key] = value
    job = merged.get(JOB_ID)
    if job is None:
        return None, merged
    return job_key(str(job), str(merged.get(JOB_RUN) or "")), merged


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What a gpu.ofu point's resource and point attributes say about its GPU and job.

    Worked out once per pair of attribute tuples (:func:`gpu_facts`): a GPU sends the same
    resource every interval, and the receivers keep it as the same tuple object.
    """

    gpu: GpuKey  # which GPU (host, UUID or index, MIG instance): the same GPU across its jobs and pods
    source: Any  # whose clock stamped the point (see clocks.source_of)
    job: JobKey | None
    attributes: dict[str, Any]  # resource and point attributes in one dict (see job_of); never changed
    shared: bool  # ofu.job.shared is set
    # the jobs holding the GPU: a shared GPU's, from its comma-joined job id (no run: attribution
    # names none for a shared GPU); else job
    jobs: tuple[JobKey, ...]
    precision: Any  # as given
    normalized_precision: str
    peak: float | None  # the dense peak FLOP/s of the GPU's model at the precision
    share: float | None  # the part of the GPU the point stands for (a MIG instance's slices), None if unknown

    def flops(self, ofu: float) -> float | None:
        """The FLOP/s this GPU did at ``ofu``: OFU x the dense peak at the precision x its share (a MIG instance's)."""
        return ofu * self.peak * self.share if self.peak is not None and self.share is not None else None


GPU_FACTS_SIZE = 1 << 17  # (resource, attributes) pairs kept: a 100,000-GPU instance's GPUs
gpu_facts_cache: Cache = Cache("jobs GPU facts", GPU_FACTS_SIZE)  # ids -> (resource, attributes, facts)


def gpu_facts(point: MetricPoint) -> GpuFacts:
    """The :class:`GpuFacts` of a point, kept by the identity of its two tuples (bounded).

    By identity, not equality: (("k", 1),) and (("k", True),) are equal but name different jobs.
    Holding the tuples keeps their ids from being reused.
    """
    resource, attributes = point.resource, point.attributes
    key = (id(resource), id(attributes))
    found = gpu_facts_cache.get(key)
    if found is not None and found[0] is resource and found[1] is attributes:
        return found[2]
    gpu = gpu_key(resource)
    job, merged = job_of(point)
    precision = merged.get(PRECISION)
    model = merged.get(HW_MODEL)
    spec = specs.find_spec(model)
    peak = spec.peak(specs.normalize_precision(precision)) if spec else None
    shared = bool(merged.get(JOB_SHARED))
    jobs = () if job is None else tuple(key_job_id(job).split(SHARED_SEPARATOR)) if shared else (job,)
    facts = GpuFacts(gpu, source_of(resource, gpu), job, merged, shared, jobs, precision,
                      specs.normalize_precision(precision), peak.flops if peak else None,
                      specs.instance_share(model, merged) if merged else 1.0)
    gpu_facts_cache.put(key, (resource, attributes, facts))
    return facts
