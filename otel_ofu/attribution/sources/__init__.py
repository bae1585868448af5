"""Attribution's sources, one module each, behind one interface: which devices a source knows for
which pods or jobs, and with what weight.

Every source answers about one :class:`Device` at a time (a GPU or MIG instance in one window, as
its samples name it) from what its last :meth:`Source.refresh` read, off the hot path; the only I/O
on the hot path is a /proc read of a pid never seen before. The resolver
(:mod:`otel_ofu.attribution.resolver`) asks every source, merges their claims by job identity,
applies the precedence and splits a device its jobs share. Where does a GPU's job come from: there.

========================  ================================  ===============================================
source                    module                            what it knows about a device
========================  ================================  ===============================================
``kubelet``               :mod:`.kubelet`                   the pods holding it through the device plugin;
                                                            that it exists and nobody holds it (idle)
DRA                       :mod:`.dra`                       the pods holding it through ResourceClaims (the
                                                            kubelet's ``dynamic_resources`` or the claims'
                                                            allocation), the node's DRA GPUs (idle)
``scrape`` (labels)       :mod:`.labels`                    the pod (and its claim's other pods) or HPC job
                                                            dcgm-exporter's labels name on the sample, and
                                                            that an unlabelled GPU of a labelling host is idle
``process``, ``slurm``    :mod:`.processes`                 its processes' pod UIDs and Slurm jobs (cgroup,
                                                            environment) and the precision they declare
``k8s_api``               :mod:`.kubernetes_api`            completes a pod's claim: its job, run, precision
rules                     :mod:`otel_ofu.attribution.rules`  a job or precision by UUID, host or attribute
reports                   :mod:`.reports`                   the job of a training process's own report
========================  ================================  ===============================================
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.attribution import K8S_CONTAINER, K8S_NAMESPACE, K8S_POD_NAME
from otel_ofu.attribution.claims import SHARED_SEPARATOR, Claim
from otel_ofu.attribution.kubelet import PodContainer
from otel_ofu.core.metrics import MetricInfo, register
from otel_ofu.core.model import GPU_MIG_INSTANCE, GPU_MIG_PROFILE, GpuKey
from otel_ofu.pipeline.telemetry import Telemetry

REFRESH_ERRORS_METRIC = register(MetricInfo(
    "otel_ofu.attribution.refresh.errors", "{error}", "sum",
    "Failed attribution lookups, by source (kubelet, pids); the last good answer is used for cache_ttl.",
    emitted_by=("processors/attribution",)))

# How a shared device's split was made (ofu.share.basis, docs/sharing.md).
SHARE_SM_UTIL = "sm_util"  # each job's processes' SM utilization
SHARE_EVEN = "even"  # nothing measured each job's use (or none used it)
SHARE_MIG_PROFILE = "mig_profile"  # MIG devices of one profile whose instance is not known

MIG_UUID = "gpu.mig.uuid"  # a MIG instance's own UUID (the nvml receiver's), beside its parent's hw.id


@dataclass
class Copy:
    """One sample of a device in a window: a GPU's only one, or one of the per-pod copies of a shared
    GPU's series (dcgm-exporter repeats them per pod): its own resource and its pod's use, if given."""

    resource: dict[str, Any]
    use: float | None = None  # the SM utilization of its pod's processes, percent (GpuSample.holder_use)


@dataclass
class Device:
    """One GPU or MIG instance in one window, as attribution asks its sources about it.

    ``resource`` and ``attributes`` are the sample's, copied (the sample's own dicts are shared
    between pipelines and never changed); with several copies, ``resource`` holds what they all
    say alike and ``copies`` each one's own. ``pids``: its processes' (processes source);
    ``precisions``: precisions its processes declare without naming a job; ``measured``: a source
    measured every holder's use of it (a holder whose claim carries none used nothing).
    """

    uuid: str  # lower case; "" when the source names none (dmon, CSV)
    key: GpuKey
    host: str
    resource: dict[str, Any]
    attributes: dict[str, Any]
    pids: list[int] = field(default_factory=list)
    precisions: set[str] = field(default_factory=set)
    copies: list[Copy] = field(default_factory=list)
    measured: bool = False
    # How the holders' weights on their claims were made when measured (the resolver's ofu.share.basis);
    # "": their processes' SM use.
    basis: str = ""
    # A MIG instance: how many instances of its profile its GPU has in this window (the batch's samples).
    same_profile: int = 0

    @property
    def mig(self) -> bool:
        return self.resource.get(GPU_MIG_INSTANCE) not in (None, "")

    @property
    def mig_uuid(self) -> str:
        return str(self.resource.get(MIG_UUID) or "").lower()

    @property
    def mig_profile(self) -> str:
        return str(self.resource.get(GPU_MIG_PROFILE) or "")


class Source:
    """What a source may answer; each answers only what it knows (the defaults: nothing)."""

    name = ""

    def refresh(self) -> None:
        """Read what the hot path will answer from (the background thread, every refresh_interval)."""

    def claims(self, device: Device) -> list[Claim]:
        """The jobs (pods, Slurm jobs) this source says hold the device, each a claim with its weight."""
        return []

    def idle(self, device: Device) -> str | None:
        """This source's name when it knows the device exists and nobody holds it; else None."""
        return None

    def version(self) -> Hashable | None:
        """A value that changes whenever anything this source answers from changes (its snapshot, a
        watch's objects, the hosts it noted), so an answer made while it was equal holds; None: it cannot
        say (its answers may differ from one call to the next), and then no answer is kept
        (AttributionProcessor's memo)."""
        return None

    def close(self) -> None:
        """Release connections (the processor's shutdown)."""


class Polled:
    """A source's last good answer, kept ``ttl`` seconds while the source fails (then empty)."""

    def __init__(self, source: str, empty: Callable[[], Any], ttl: float, telemetry: Telemetry, log: logging.Logger,
                 clock: Callable[[], float] = time.monotonic):
        self.source, self._empty, self.ttl = source, empty, ttl
        self.telemetry, self.log, self._clock = telemetry, log, clock
        self.value: Any = empty()
        self.at: float | None = None
        self.failing = False
        self.generation = 0  # counts the changes of value (an equal answer is none)

    def poll(self, fetch: Callable[[], Any]) -> None:
        now = self._clock()
        try:
            self._set(fetch())
            self.at = now
            if self.failing:
                self.log.info("attribution source %s answers again", self.source)
            self.failing = False
        except Exception as exc:
            self.telemetry.add(REFRESH_ERRORS_METRIC.name, 1, source=self.source)
            if not self.failing:
                self.log.warning("attribution source %s failed (%s); using its last answer for %.0fs", self.source,
                                 exc, self.ttl)
            self.failing = True
            if self.at is None or now - self.at > self.ttl:
                self._set(self._empty())  # no stale attributes past the TTL

    def _set(self, value: Any) -> None:
        """The new answer, then its generation (a reader that sees the old generation may see either)."""
        changed = value != self.value
        self.value = value
        if changed:
            self.generation += 1


def pod_claims(holders: list[PodContainer], source: str = "kubelet") -> list[Claim]:
    """One claim per pod; a pod's containers holding the device are listed together."""
    containers: dict[tuple[str, str], list[str]] = {}
    for holder in holders:
        names = containers.setdefault((holder.namespace, holder.pod), [])
        if holder.container and holder.container not in names:
            names.append(holder.container)
    out = []
    for (namespace, pod), names in containers.items():
        resource = {K8S_NAMESPACE: namespace, K8S_POD_NAME: pod}
        if names:
            resource[K8S_CONTAINER] = SHARED_SEPARATOR.join(sorted(names))
        out.append(Claim(("k8s", namespace, pod), source, resource))
    return out
