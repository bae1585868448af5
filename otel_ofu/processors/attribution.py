"""The ``attribution`` processor: names the job holding each GPU and the precision it runs in.

Place it before ``ofu`` (receiver -> attribution -> ofu -> ...): it sets ``sample.job_id``
(exported as ``ofu.job.id``), ``sample.precision`` and resource attributes (``k8s.*``,
``slurm.job.*``) on GPU samples. Sources, each optional: the kubelet pod-resources API,
GPU processes through /proc (cgroup and environment), dcgm-exporter labels already on the
sample, the Kubernetes API (which job a pod belongs to, its precision and labels; a watch on
its own thread), and static rules. Lookups run on a background thread every ``refresh_interval``; the
hot path reads the last snapshot, plus one /proc read for a pid it has not seen before.
docs/components/processors/attribution.md describes sources, precedence, attributes and limits.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from otel_ofu.attribution import PER_JOB_ATTRIBUTES
from otel_ofu.attribution.config import AttributionProcessorConfig
from otel_ofu.attribution.k8s_api import PodWatcher
from otel_ofu.attribution.k8s_dra import DraWatcher
from otel_ofu.attribution.limits import JobLimiter
from otel_ofu.attribution.resolver import Holder, Resolver
from otel_ofu.attribution.sources import Copy, Device, Polled, Source
from otel_ofu.attribution.sources.dra import DraSource
from otel_ofu.attribution.sources.kubelet import KubeletSource
from otel_ofu.attribution.sources.kubernetes_api import PodSource
from otel_ofu.attribution.sources.labels import SampleLabelSource
from otel_ofu.attribution.sources.processes import PidProvider, ProcessSource
from otel_ofu.attribution.sources.reports import ReportSource
from otel_ofu.core.metrics import MetricInfo, register
from otel_ofu.core.model import (
    GPU_MIG_INSTANCE,
    GPU_MIG_PROFILE,
    JOB_ID,
    NO_JOB,
    Batch,
    GpuKey,
    GpuSample,
    MetricPoint,
    attrs,
    gpu_key,
    job_id_of,
)
from otel_ofu.core.values import clean
from otel_ofu.pipeline.caches import Cache
from otel_ofu.pipeline.component import Context, Factory, Processor

OVERFLOW_METRIC = register(MetricInfo(
    "otel_ofu.attribution.overflow", "{sample}", "sum",
    "Samples whose job was over attribution's max_jobs and got the overflow job id instead."))
JOBS_METRIC = register(MetricInfo(
    "otel_ofu.attribution.jobs", "{job}", "gauge", "Distinct job ids attribution currently holds a slot for."))

MAX_ANSWERS = 1 << 17  # devices whose last answer is kept (a 100,000-GPU processing stage's), about 1 KB each


class AttributionProcessor(Processor):
    def __init__(self, config: AttributionProcessorConfig, context: Context, *,
                 pid_provider: PidProvider | None = None, clock: Callable[[], float] = time.monotonic,
                 memo: bool = True):
        super().__init__(config, context)
        self._clock = clock
        telemetry = context.telemetry
        # The Kubernetes API source (started in start()): also the place other code asks for a pod's job id.
        self.pods: PodWatcher | None = None
        self.dra: DraWatcher | None = None  # the GPUs of DRA: the API's ResourceSlices and ResourceClaims
        self.kubelet = KubeletSource(config.kubelet, config.dra.drivers, ttl=float(config.cache_ttl),
                                     telemetry=telemetry, log=self.log, clock=clock) if config.kubelet.enabled else None
        ttl = float(config.cache_ttl)
        self.processes = ProcessSource(config.processes, config.precision_env, provider=pid_provider, clock=clock,
                                       polled=Polled("pids", dict, ttl, telemetry, self.log, clock),
                                       used=Polled("process_utilization", dict, ttl, telemetry, self.log, clock))
        self.labels = SampleLabelSource() if config.sample_labels else None
        self._dra_source: DraSource | None = None
        claims, idle = self._sources()
        self.resolver = Resolver(config, claims, idle, pods=None)
        self.reports = ReportSource(config, self.resolver, None, self.processes, telemetry, self.log)
        self._limiter = JobLimiter(config.max_jobs, int(config.job_idle_timeout * 1e9), config.overflow_job_id)
        # Each device's last answer, kept while its samples and the sources are the same (annotate_device);
        # ``memo=False`` resolves every device every time (tests compare the two).
        self._memo = memo
        self._answers = Cache("attribution answers", MAX_ANSWERS)  # GPU key -> (version, signature, _Answer)
        self._last_overflow_ns: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sources(self) -> tuple[list[Source], list[Source]]:
        """The sources asked for claims, in order, and those that may say a GPU is idle, in order."""
        claims: list[Source] = [s for s in (self.labels, self.kubelet, self._dra_source, self.processes) if s]
        idle: list[Source] = [s for s in (self.kubelet, self._dra_source, self.labels) if s]
        return claims, idle

    # --- lifecycle and refresh (background) ----------------------------------------------

    def start(self) -> None:
        cfg = self.config
        if cfg.kubernetes_api.enabled:
            self.pods = PodWatcher(cfg.kubernetes_api, job_label=cfg.k8s_job_label, precision_key=cfg.precision_key,
                                   telemetry=self.context.telemetry, name=self.context.component_id)
            self.pods.start()
            pods = PodSource(self.pods)
            if cfg.dra.drivers:
                self.dra = DraWatcher(cfg.kubernetes_api, cfg.dra.drivers, self.pods.session,
                                      telemetry=self.context.telemetry, name=self.context.component_id)
                self.dra.start()
                self._dra_source = DraSource(self.dra, self.pods, self.kubelet, resource_claims=cfg.dra.resource_claims,
                                             log=self.log)
                if self.kubelet is not None:
                    self.kubelet.dra_mapped = True
                if self.labels is not None:
                    self.labels.dra = self._dra_source
            claims, idle = self._sources()
            self.resolver = Resolver(cfg, claims, idle, pods=pods)
            self.reports = ReportSource(cfg, self.resolver, pods, self.processes, self.context.telemetry, self.log)
            self._answers.clear()  # made by the resolver before: other sources
        if cfg.kubelet.enabled or cfg.processes.enabled or self.dra is not None:
            self._thread = threading.Thread(target=self._run, name=self.context.component_id, daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:  # a source call in flight ends by its own timeout, or is left behind
            self._thread.join(timeout=self.time_left(30))
            if self._thread.is_alive():
                self.log.warning("a kubelet, NVML or /proc lookup was still running at the shutdown deadline "
                                 "(service.shutdown_timeout): not waited for")
        deadline = time.monotonic() + self.time_left(30)
        if self.dra is not None:
            self.dra.stop(deadline)
        if self.pods is not None:
            self.pods.stop(deadline)
        for source in (self.kubelet, self.processes):
            if source is not None:
                source.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:
                self.log.exception("attribution refresh failed; retrying next interval")
            self._stop.wait(self.config.refresh_interval)

    def refresh(self) -> None:
        """One poll of every enabled source; replaces the snapshots the hot path reads."""
        if self.kubelet is not None:
            self.kubelet.refresh()
        if self._dra_source is not None:
            self._dra_source.refresh()
        if self.config.processes.enabled:
            self.processes.refresh()

    # --- hot path ------------------------------------------------------------------------

    def process(self, batch: Batch) -> Batch:
        if self.labels is not None:  # hosts whose page labels GPUs with pods, before any GPU is named
            self.labels.note(batch.samples)
        overflowed: set[str] = set()
        samples_over = 0
        latest = 0
        renamed: dict[tuple[GpuKey, str], str] = {}  # (GPU, job id before) -> job id after
        samples: list[GpuSample] = []
        reshaped = False  # a device came as several copies, or went out as several jobs' samples
        devices = _devices(batch.samples)
        profiles = _mig_profiles(devices)
        version = self.resolver.version() if self._memo else None  # once: the sources' state this batch
        for key, copies in devices:
            first = copies[0]
            before = first.job_id or NO_JOB
            out, over = self.annotate_device(copies, profiles.get(_profile_key(first), 0) if profiles else 0, key,
                                             version)
            if len(out) == 1 and out[0].job_id is not None and out[0].job_id != before:
                renamed[(key, before)] = out[0].job_id
            for original in over:
                overflowed.add(original)
                samples_over += 1
                latest = max(latest, first.time_unix_nano)
            samples += out
            reshaped = reshaped or len(copies) > 1 or len(out) > 1
        if overflowed:
            self.context.telemetry.add(OVERFLOW_METRIC.name, samples_over)
            gap = self.config.job_idle_timeout * 1e9
            if self._last_overflow_ns is None or latest - self._last_overflow_ns > gap:
                self.log.warning("attribution: max_jobs=%d reached; %d job(s) mapped to ofu.job.id=%r (e.g. %s). "
                                 "Raise max_jobs or lower job_idle_timeout. Logged once per burst.",
                                 self.config.max_jobs, len(overflowed), self.config.overflow_job_id,
                                 ", ".join(sorted(overflowed)[:3]))
            self._last_overflow_ns = latest
        self.context.telemetry.set(JOBS_METRIC.name, len(self._limiter))
        points = batch.points
        if renamed and points:
            points = [_renamed(p, renamed) for p in points]
        names = self.reports.names
        if names and any(p.name in names for p in points):
            annotated = (self.reports.annotate(p, batch.peer) if p.name in names else p for p in points)
            points = [p for p in annotated if p is not None]
        if points is not batch.points or reshaped:
            batch = Batch(samples=samples, points=points, passthrough=batch.passthrough, events=batch.events,
                          peer=batch.peer)
        return batch

    def annotate_device(self, copies: list[GpuSample], same_profile: int = 0, key: GpuKey | None = None,
                        version: Hashable | None = None) -> tuple[list[GpuSample], list[str]]:
        """One device's samples of one window (one, or a per-pod copy each) as one sample per job holding
        it, each with its share when several do; and the job ids that overflowed max_jobs. ``same_profile``:
        a MIG instance's GPU's instances of its profile in this window. ``version``: the resolver's
        (Resolver.version) when the device's answer may be kept and reused, else None.

        The first sample is annotated in place (its dicts replaced, never mutated: pipelines share
        them); the others are new samples.
        """
        sample = copies[0]
        key = key or sample.gpu_key()
        signature = _signature(copies, same_profile) if version is not None else None
        answer = None
        if signature is not None:
            kept = self._answers.get(key)
            if kept is not None and kept[0] == version and kept[1] == signature:  # the same inputs
                answer = kept[2]
                self.resolver.note_hpc_only(answer.hpc_only)  # as resolving it again would
        if answer is None:
            answer = self._resolve(copies, same_profile, key)
            if signature is not None and _keepable(signature):
                self._answers.put(key, (version, signature, answer))
        sample.precision = answer.precision
        if not answer.holders:
            sample.resource, sample.attributes = dict(answer.resource), dict(answer.attributes)
            return [sample], []
        attributes = dict(answer.attributes)
        out, over = [], []
        for holder in answer.holders:
            job, resource = holder.job, dict(holder.resource)
            if job != NO_JOB and not self._limiter.admit(job, sample.time_unix_nano):
                over.append(job)
                job = self.config.overflow_job_id
                for name in PER_JOB_ATTRIBUTES:
                    resource.pop(name, None)
            if not out:
                sample.job_id, sample.resource, sample.attributes = job, resource, attributes
                sample.share, sample.share_basis = holder.share, holder.basis
                out.append(sample)
            else:
                out.append(dataclasses.replace(sample, job_id=job, resource=resource, share=holder.share,
                                               share_basis=holder.basis))
        return out, over

    def _resolve(self, copies: list[GpuSample], same_profile: int, key: GpuKey) -> _Answer:
        """What the sources and rules say about the device: made of its samples and the sources' state alone
        (never the window's time: the limiter's admits are annotate_device's)."""
        sample = copies[0]
        if len(copies) == 1:  # nearly always
            resource = dict(sample.resource)
            found_copies = [Copy(resource, _use(sample.holder_use))]
        else:
            resource = _common(c.resource for c in copies)
            found_copies = [Copy(dict(c.resource), _use(c.holder_use)) for c in copies]
        device = Device(str(sample.uuid).strip().lower(), key, sample.host, resource, dict(sample.attributes),
                        copies=found_copies, same_profile=same_profile)
        self.processes.take_pids(device)
        found = self.resolver.resolve(device, sample)
        return _Answer(found.precision, device.resource, device.attributes, tuple(found.holders), found.hpc_only)


@dataclass(frozen=True, slots=True)
class _Answer:
    """A device's resolution as annotate_device hands it out: its precision, its resource with no holder,
    its point attributes, its holders (each job's resource, share and basis) and the resolver's Slurm note.
    Kept and handed out again: its dicts are copied onto the samples, never given away."""

    precision: str | None
    resource: dict[str, Any]
    attributes: dict[str, Any]
    holders: tuple[Holder, ...]
    hpc_only: str | None


def _signature(copies: list[GpuSample], same_profile: int) -> tuple:
    """Exactly what the resolver reads of a device's samples, comparable: the first sample's identity (its
    index's type too: 0 and "0" name one GPU apart), job id, precision and point attributes (Device,
    Resolver.resolve, rules), each copy's resource and its use as the number the resolver reads (_use: 0.0
    and -0.0 both count as none used), and the window's instances of its MIG profile."""
    first = copies[0]
    index = first.gpu_index
    head = (first.host, first.uuid, first.model, index, type(index), first.job_id, first.precision)
    if len(copies) == 1:  # nearly always
        use = first.holder_use
        resources: tuple = ((tuple(first.resource.items()), None if use is None else _use(use)),)
    else:
        resources = tuple((tuple(c.resource.items()), None if c.holder_use is None else _use(c.holder_use))
                          for c in copies)
    return head, tuple(first.attributes.items()), resources, same_profile


def _keepable(signature: tuple) -> bool:
    """Whether a signature may be kept: every name and value in it a str or None (the index an int or a
    str), so one equal to it holds the same values: nothing but a str equals a str, while 1, 1.0 and True
    are equal but different attribute values."""
    head, attributes, resources, _ = signature
    if not _TEXT.issuperset(map(type, head[:3])) or head[4] not in (int, str) or not _TEXT.issuperset(
            map(type, head[5:])):
        return False
    items = [*attributes, *(item for resource, _ in resources for item in resource)]
    return all(type(name) is str and type(value) in _TEXT for name, value in items)


_TEXT = frozenset({str, type(None)})


def _devices(samples: list[GpuSample]) -> list[tuple[GpuKey, list[GpuSample]]]:
    """The batch's samples by device and window (core.model.gpu_key and time), in order: a GPU
    dcgm-exporter repeats per pod is one device, counted once."""
    groups: dict[tuple[GpuKey, int], tuple[GpuKey, list[GpuSample]]] = {}
    for sample in samples:
        key = sample.gpu_key()
        found = groups.get((key, sample.time_unix_nano))
        if found is None:
            groups[(key, sample.time_unix_nano)] = (key, [sample])
        else:
            found[1].append(sample)
    return list(groups.values())


def _profile_key(sample: GpuSample) -> tuple | None:
    profile, instance = sample.resource.get(GPU_MIG_PROFILE), sample.resource.get(GPU_MIG_INSTANCE)
    if not profile or instance in (None, ""):
        return None
    return sample.host, str(sample.uuid).strip().lower(), str(profile), sample.time_unix_nano


def _mig_profiles(devices: list[tuple[GpuKey, list[GpuSample]]]) -> dict[tuple, int]:
    """How many MIG instances of each profile each GPU has in each window of the batch."""
    counts: dict[tuple, int] = {}
    for _, copies in devices:
        key = _profile_key(copies[0])
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    return counts


def _common(resources: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What every copy of a device says alike (its identity, MIG, driver), as a new dict."""
    it = iter(resources)
    common = dict(next(it))
    for resource in it:
        common = {k: v for k, v in common.items() if k in resource and resource[k] == v}
    return common


def _use(value: object) -> float | None:
    """A copy's holder use as a number, None when blank or not given (values.clean's rule)."""
    if value is None:
        return None
    number, _ = clean(value)
    return number


def _renamed(point: MetricPoint, renamed: dict[tuple[GpuKey, str], str]) -> MetricPoint:
    """A receiver's own per-GPU point (e.g. the sim's truth) follows its GPU's new job id."""
    new = renamed.get((gpu_key(point.resource), job_id_of(point) or NO_JOB))
    if new is None:
        return point
    attributes = {k: v for k, v in point.attributes if k != JOB_ID}
    return dataclasses.replace(point, resource=attrs({**dict(point.resource), JOB_ID: new}),
                               attributes=attrs(attributes))


FACTORY = Factory("attribution", AttributionProcessorConfig, AttributionProcessor,
                  "names each GPU's job (Kubernetes, Slurm, rules) and precision", consumes="samples",
                  produces="samples")
