"""Where a GPU's job comes from: every source's claims on a device, merged, named and ranked.

The sources (:mod:`otel_ofu.attribution.sources`) each say which pods or jobs hold a device. The
resolver merges their claims by job identity first (the kubelet's pod name and a cgroup's pod UID
for one pod are one job, not a shared GPU; :mod:`otel_ofu.attribution.claims`), completes pods
from the Kubernetes API, names each job (``k8s:<ns>/<kind>/<name>``, ``slurm:<id>``, ...), and
decides by precedence (docs/components/processors/attribution.md#precedence):

1. a rule with ``override: true``;
2. the sample's own job id (unless the processor's ``override``);
3. the schedulers' claims (kubelet, DRA, the page's labels, processes);
4. a rule;
5. the sample's own job id even with ``override``;
6. idle (``none``) when a source knows the device and that nobody holds it.

The precision follows the same order, with job metadata (a pod's annotation, a process's
environment) in third place; jobs that disagree give ``unknown``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from otel_ofu.attribution import (
    JOB_KIND,
    JOB_RUN,
    JOB_SHARED,
    JOB_SOURCE,
    K8S_POD_ANNOTATION_PREFIX,
    K8S_POD_LABEL_PREFIX,
    slurm_job_id,
)
from otel_ofu.attribution.claims import SHARED_SEPARATOR, Claim, merge
from otel_ofu.attribution.config import UNSET_JOBS, AttributionProcessorConfig
from otel_ofu.attribution.k8s_identity import job_id, labelled_pod_job
from otel_ofu.attribution.rules import RuleResult, evaluate
from otel_ofu.attribution.sources import SHARE_EVEN, SHARE_SM_UTIL, Device, Source
from otel_ofu.attribution.sources.kubernetes_api import PodSource
from otel_ofu.core import specs
from otel_ofu.core.model import GPU_INDEX, HOST_NAME, HW_ID, HW_MODEL, HW_VENDOR, NO_JOB, GpuSample

_NO_RULE = RuleResult()
_BASE_KEYS = frozenset({HOST_NAME, HW_ID, HW_MODEL, HW_VENDOR, GPU_INDEX})


@dataclass
class Holder:
    """A job holding a device in the window: its id, the device's resource attributes with its own,
    and its part of the device (None: all of it; several jobs' shares add up to 1) and how that was made."""

    job: str
    resource: dict[str, Any]
    share: float | None = None
    basis: str = ""


@dataclass
class Resolution:
    """What the resolver decided for one device: its holders (none: nothing says) and its precision."""

    holders: list[Holder]
    precision: str | None
    hpc_only: str | None = None  # the Slurm job its only claim names through hpc_job alone (note_hpc_only)


class Resolver:
    """``sources``: asked for claims in this order (the first to give a pod's attribute gives it);
    ``idle_sources``: the first that knows a device exists and nobody holds it names it so; ``pods``:
    the Kubernetes API's, which complete the claims of the others."""

    def __init__(self, config: AttributionProcessorConfig, sources: Sequence[Source],
                 idle_sources: Sequence[Source] = (), pods: PodSource | None = None):
        self.config = config
        self.sources = list(sources)
        self.idle_sources = list(idle_sources)
        self.pods = pods
        key = config.precision_key  # the pod annotation, pod label and attribute naming a job's precision
        self._precision_names = (K8S_POD_ANNOTATION_PREFIX + key, K8S_POD_LABEL_PREFIX + key, key) if key else ()
        # Slurm job ids GPUs know only through dcgm-exporter's hpc_job (job id as given, not
        # slurm:<id>): a report naming that Slurm job gets the same id. Least recently seen first.
        self.hpc_only: OrderedDict[str, None] = OrderedDict()

    # --- claims -------------------------------------------------------------------------------------

    def claims(self, device: Device) -> list[Claim]:
        """Every source's claims on the device, completed from the Kubernetes API and merged by job."""
        claims = [claim for source in self.sources for claim in source.claims(device)]
        if self.pods is not None:
            claims = [self.pods.complete(claim) for claim in claims]
        merged = merge(claims)
        if device.measured and _used(merged) < _used(claims) * (1 - 1e-9):
            # A process that used the device could not be joined to one of its holders (a pod UID no source
            # names): the holders' uses do not say how it was shared.
            device.measured = False
        return merged

    def complete(self, claim: Claim) -> Claim:
        return self.pods.complete(claim) if self.pods is not None else claim

    def job_id(self, claim: Claim) -> str:
        """The claim's job id; a pod the Kubernetes API did not name is named from what the
        sample carries: its pod labels (dcgm-exporter's --kubernetes-enable-pod-labels, or
        k8s.pod.label.* from upstream), by the same rules as the API's pods, else the pod."""
        if claim.job_id:
            return claim.job_id
        kind = claim.key[0]
        if kind == "slurm":
            return slurm_job_id(claim.key[1])
        if kind == "k8s-uid":
            return f"k8s-uid:{claim.key[1]}"
        namespace, pod = claim.key[1], claim.key[2]
        job = labelled_pod_job(namespace, pod, claim.resource, self.config.k8s_job_label)
        if job.kind:
            claim.resource.setdefault(JOB_KIND, job.kind)
        claim.run = claim.run or job.run
        claim.job_id = job_id(namespace, job)
        return claim.job_id

    def version(self) -> tuple | None:
        """What changes whenever any source's answers may (Source.version), with the rules and settings
        fixed: a device's resolution made at one value holds while it is the same. None: a source
        cannot say."""
        versions = []
        for source in dict.fromkeys([*self.sources, *self.idle_sources, *([self.pods] if self.pods else [])]):
            version = source.version()
            if version is None:
                return None
            versions.append(version)
        return tuple(versions)

    def note_hpc_only(self, hpc: str | None) -> None:
        """A GPU knows its job only as ``hpc`` (dcgm-exporter's hpc_job): remembered for the reports."""
        if hpc is None:
            return
        self.hpc_only[hpc] = None
        self.hpc_only.move_to_end(hpc)
        while len(self.hpc_only) > self.config.max_jobs:
            self.hpc_only.popitem(last=False)

    # --- the decision ---------------------------------------------------------------------------------

    def resolve(self, device: Device, sample: GpuSample) -> Resolution:
        """The holders and the precision of one device (``sample`` is one of its samples)."""
        cfg = self.config
        claims = self.claims(device)
        hpc = claims[0].key[1] if len(claims) == 1 and claims[0].key[0] == "hpc" else None
        self.note_hpc_only(hpc)
        for claim in claims:  # named first: naming a pod from its labels adds its kind
            self.job_id(claim)
        resource, attributes = device.resource, device.attributes
        claim_resource = _merged_resource(claims)
        # What rules and precision labels look at: the sample's resource attributes, then the
        # claims' attributes, then the point attributes (later ones win). Built as a dict only
        # for rules; the precision labels read the same layers directly (no merge per sample).
        layers = (attributes, claim_resource, resource)
        rule = evaluate(cfg.rules, device.uuid, sample.host, _view(layers, sample)) if cfg.rules else _NO_RULE

        existing = sample.job_id if sample.job_id not in UNSET_JOBS and sample.job_id is not None else None
        holders: list[Holder] = []
        if rule.job_id and rule.job_override:
            holders = [_whole(rule.job_id, "rule", resource)]
        elif existing and not cfg.override:
            holders = [_whole(existing, "sample", resource)]
        elif claims:
            holders = self._holders(device, claims, claim_resource)
        elif rule.job_id:
            holders = [_whole(rule.job_id, "rule", resource)]
        elif existing:
            holders = [_whole(existing, "sample", resource)]
        else:
            idle = next((found for s in self.idle_sources if (found := s.idle(device)) is not None), None)
            if idle is not None:
                holders = [_whole(NO_JOB, idle, resource)]

        metadata = {p for c in claims for p in c.precisions} | device.precisions | self._label_precisions(layers,
                                                                                                          sample)
        precision = self._precision(sample.precision, metadata, rule.precision, rule.precision_override)
        return Resolution(holders, precision, hpc)

    def _holders(self, device: Device, claims: list[Claim], claim_resource: dict[str, str]) -> list[Holder]:
        """The jobs the claims name, each with its attributes; several: each its share of the device."""
        override = self.config.override
        by_job: dict[str, list[Claim]] = {}
        if len(claims) == 1:  # the usual case: one pod holds the GPU
            by_job[self.job_id(claims[0])] = claims
        else:
            for claim in claims:
                by_job.setdefault(self.job_id(claim), []).append(claim)
        if len(by_job) == 1:  # one job holds the GPU (one pod, or several of one job)
            (job, own), = by_job.items()
            resource = device.resource
            for key, value in claim_resource.items():
                if override or key not in resource:
                    resource[key] = value
            return [_holder(job, own, resource)]
        # Several jobs: one holder each, with its own pods' attributes (never another job's: the
        # attributes any claim sets are the holders', not the device's), and its share.
        theirs = {key for claim in claims for key in claim.resource}
        base = {k: v for k, v in device.resource.items() if k not in theirs}
        jobs = sorted(by_job)
        shares, basis = split(device, [by_job[job] for job in jobs])
        out = []
        for job, share in zip(jobs, shares, strict=True):
            resource = {**base, **_merged_resource(by_job[job]), JOB_SHARED: True}
            out.append(_holder(job, by_job[job], resource, share, basis))
        return out

    def _precision(self, existing: str | None, metadata: set[str], rule: str | None, rule_override: bool) -> str | None:
        known = specs.normalize_precision(existing)
        if rule and rule_override:
            return rule
        if known != specs.UNKNOWN_PRECISION and not self.config.override:
            return existing
        if len(metadata) == 1:
            return next(iter(metadata))
        if len(metadata) > 1:
            return specs.UNKNOWN_PRECISION  # the GPU's jobs disagree: DCGM cannot tell which
        if rule:
            return rule
        return existing

    def _label_precisions(self, layers: tuple[dict[str, Any], ...], sample: GpuSample) -> set[str]:
        out = set()
        for name in self._precision_names:
            value = _lookup(layers, sample, name)
            precision = specs.normalize_precision(None if value is None else str(value))
            if precision != specs.UNKNOWN_PRECISION:
                out.add(precision)
        return out


def split(device: Device, jobs: list[list[Claim]]) -> tuple[list[float], str]:
    """Each job's share of a device several hold (``jobs``: each job's claims), adding up to 1, and the
    basis: by their processes' use where a source measured every holder's (``sm_util``), else evenly."""
    count = len(jobs)
    if device.measured:
        uses = [math.fsum(c.use for c in claims if c.use is not None and math.isfinite(c.use) and c.use > 0)
                for claims in jobs]
        total = math.fsum(uses)
        if total > 0:
            return _exact([use / total for use in uses]), device.basis or SHARE_SM_UTIL
    return _exact([1.0 / count] * count), SHARE_EVEN


def _used(claims: list[Claim]) -> float:
    return math.fsum(c.use for c in claims if c.use is not None and math.isfinite(c.use) and c.use > 0)


def _exact(shares: list[float]) -> list[float]:
    """The shares with the last one what the others leave of 1, so they add up to 1 to the last bit."""
    if len(shares) > 1:
        shares[-1] = max(0.0, 1.0 - math.fsum(shares[:-1]))
    return shares


def _whole(job: str, source: str, resource: dict[str, Any]) -> Holder:
    resource[JOB_SOURCE] = source
    return Holder(job, resource)


def _holder(job: str, claims: list[Claim], resource: dict[str, Any], share: float | None = None,
            basis: str = "") -> Holder:
    """A job's holder from its claims: the sources that named it, its run when its pods agree on one."""
    first = claims[0]
    if len(claims) == 1:
        if first.run:
            resource[JOB_RUN] = first.run
        source = first.source
        resource[JOB_SOURCE] = source if "+" not in source else "+".join(sorted(set(source.split("+"))))
        return Holder(job, resource, share, basis)
    if first.run and all(c.run == first.run for c in claims):
        resource[JOB_RUN] = first.run
    resource[JOB_SOURCE] = "+".join(sorted({s for c in claims for s in c.source.split("+")}))
    return Holder(job, resource, share, basis)


def _base_attributes(sample: GpuSample) -> dict[str, Any]:
    """The resource attributes every GPU sample has (see GpuSample.resource_attributes)."""
    return {HOST_NAME: sample.host, HW_ID: sample.uuid, HW_MODEL: sample.model, HW_VENDOR: "nvidia",
            GPU_INDEX: str(sample.gpu_index)}


def _lookup(layers: tuple[dict[str, Any], ...], sample: GpuSample, name: str) -> Any:
    """``_view(layers, sample).get(name)`` without building the view: the first layer that has it."""
    for layer in layers:
        if name in layer:
            return layer[name]
    return _base_attributes(sample)[name] if name in _BASE_KEYS else None


def _view(layers: tuple[dict[str, Any], ...], sample: GpuSample) -> dict[str, Any]:
    """The layers as one dict, the first layer winning, over the sample's own attributes.

    As rules saw it before: the sample's resource attributes (None values left out), then
    the claims' attributes, then the point attributes.
    """
    attributes, claim_resource, resource = layers
    own = {k: v for k, v in {**_base_attributes(sample), **resource}.items() if v is not None}
    return {**own, **claim_resource, **attributes}


def _merged_resource(claims: list[Claim]) -> dict[str, str]:
    """Attributes of all claims; where jobs differ, their values sorted and comma-joined."""
    if len(claims) == 1:
        return {key: str(value) for key, value in claims[0].resource.items()}
    values: dict[str, set[str]] = {}
    for claim in claims:
        for key, value in claim.resource.items():
            values.setdefault(key, set()).add(str(value))
    return {key: SHARED_SEPARATOR.join(sorted(vals)) for key, vals in values.items()}
