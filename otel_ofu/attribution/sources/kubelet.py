"""The ``kubelet`` source: which pods hold each GPU by the device plugin, from the kubelet's
pod-resources API (:mod:`otel_ofu.attribution.kubelet`), and which GPUs nobody holds.

It also hands the kubelet's DRA entries (``dynamic_resources``) to the DRA source, which knows
which GPU each DRA device is. The kubelet lists one device for every container holding it: a
time-sliced or MPS replica (``<uuid>::<n>``) of one GPU held by two pods is one device with two
holders, never two devices.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from otel_ofu.attribution.claims import Claim
from otel_ofu.attribution.config import KubeletSourceConfig
from otel_ofu.attribution.kubelet import KubeletClient, NodeAllocations, PodContainer
from otel_ofu.attribution.sources import Device, Polled, Source, pod_claims
from otel_ofu.pipeline.telemetry import Telemetry


class KubeletSource(Source):
    name = "kubelet"

    def __init__(self, config: KubeletSourceConfig, dra_drivers: list[str], *, ttl: float, telemetry: Telemetry,
                 log: logging.Logger, clock: Callable[[], float] | None = None):
        self.config = config
        self.dra_drivers = dra_drivers
        self.client: KubeletClient | None = None
        self.log = log
        self.dra_mapped = False  # a DRA source maps the kubelet's DRA devices to GPUs (the kubernetes_api source)
        self._unmapped_logged = False
        kw = {"clock": clock} if clock is not None else {}
        self._answer = Polled("kubelet", NodeAllocations, ttl, telemetry, log, **kw)

    @property
    def allocations(self) -> NodeAllocations:
        """The kubelet's last answer (empty while it has not answered, and past cache_ttl of failures)."""
        return self._answer.value

    def refresh(self) -> None:
        if self.client is None:
            self.client = KubeletClient(self.config.socket, float(self.config.timeout), self.config.resource_names,
                                        self.dra_drivers)
        self._answer.poll(self.client.allocations)
        dra = self.allocations.dra
        if dra and not self.dra_mapped and not self._unmapped_logged:
            self._unmapped_logged = True
            self.log.warning("kubelet pod-resources reports GPUs allocated by DRA (%s) that cannot be mapped to a GPU "
                             "UUID: the kubernetes_api source is off: enable it (RBAC get/list/watch on "
                             "resourceslices) to read the DRA driver's ResourceSlices (docs/kubernetes-attribution.md"
                             "#dra)", ", ".join(f"{d} pool {p} device {n}" for d, p, n in list(dra)[:3]))

    def version(self) -> int:
        return self._answer.generation

    def holders(self, device: Device) -> list[PodContainer] | None:
        """The containers holding the device: a GPU by its UUID, a MIG instance by its own UUID (else
        its parent's, which a MIG-mode GPU never has)."""
        by_uuid = self.allocations.by_uuid
        if device.mig and device.mig_uuid in by_uuid:
            return by_uuid[device.mig_uuid]
        return by_uuid.get(device.uuid)

    def claims(self, device: Device) -> list[Claim]:
        holders = self.holders(device)
        return pod_claims(holders) if holders else []

    def idle(self, device: Device) -> str | None:
        allocatable = self.allocations.allocatable
        if not allocatable:
            return None
        return self.name if (device.mig_uuid if device.mig else device.uuid) in allocatable else None

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
