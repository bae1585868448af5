"""The DRA source: which pods hold each GPU through ResourceClaims (Dynamic Resource Allocation).

A DRA device is named by driver, pool and device (:mod:`otel_ofu.attribution.k8s_dra`); the node's
ResourceSlices say which GPU or MIG device it is. Holders come from the kubelet's
``dynamic_resources`` (the kubelet source's answer) and, with ``dra.resource_claims``, from the
claims the node's pods use (``status.allocation`` and ``reservedFor``). A device allocated with
admin access holds nothing (a monitoring pod's claim). A claim several pods use, and a device
several claims share (``share_id``), give the device several holders: it is shared, never counted
once per holder.
"""

from __future__ import annotations

import logging

from otel_ofu.attribution import K8S_NAMESPACE, K8S_POD_NAME
from otel_ofu.attribution.claims import Claim
from otel_ofu.attribution.k8s_api import PodWatcher
from otel_ofu.attribution.k8s_dra import DeviceRef, DraGpu, DraWatcher
from otel_ofu.attribution.kubelet import DraHolder, PodContainer
from otel_ofu.attribution.sources import SHARE_MIG_PROFILE, Device, Source, pod_claims
from otel_ofu.attribution.sources.kubelet import KubeletSource


class DraSource(Source):
    name = "k8s_api"

    def __init__(self, watcher: DraWatcher, pods: PodWatcher, kubelet: KubeletSource | None, *,
                 resource_claims: bool, log: logging.Logger):
        self.watcher, self.pods, self.kubelet = watcher, pods, kubelet
        self.resource_claims = resource_claims
        self.log = log
        # Rebuilt at each refresh, read by the hot path as one object each: GPU or MIG UUID, or
        # "<parent uuid>/<MIG profile>" -> the containers holding it; the node's DRA GPUs, same keys.
        self._holders: dict[str, list[PodContainer]] = {}
        self._known: frozenset[str] = frozenset()
        # Held MIG devices no UUID names on a sample (created on demand, or one of several of a profile):
        # (parent uuid, profile) -> each such device's holders.
        self._by_profile: dict[tuple[str, str], dict[DeviceRef, list[PodContainer]]] = {}
        self._generation = 0  # counts the refreshes that changed those
        self._unmapped_logged = False

    # --- background ---------------------------------------------------------------------------------

    def refresh(self) -> None:
        if self.resource_claims:
            self.watcher.claims.sync(self._node_claims())
        holders: dict[str, list[PodContainer]] = {}
        by_profile: dict[tuple[str, str], dict[DeviceRef, list[PodContainer]]] = {}

        def add(gpu: DraGpu, holder: PodContainer, ref: DeviceRef) -> None:
            for key in self._keys(gpu):
                found = holders.setdefault(key, [])
                if holder not in found:
                    found.append(holder)
            if gpu.mig:
                found = by_profile.setdefault((gpu.parent_uuid, gpu.profile), {}).setdefault(ref, [])
                if holder not in found:
                    found.append(holder)

        unmapped = []
        allocations = self.kubelet.allocations.dra if self.kubelet is not None else {}
        for (driver, pool, device), dra_holders in allocations.items():
            ref = DeviceRef(driver, pool, device)
            gpu = self.watcher.gpu(ref)
            if gpu is None:
                unmapped.append(f"{driver} pool {pool} device {device}")
                continue
            for dra_holder in dra_holders:
                if not self._admin_access(dra_holder, ref):
                    add(gpu, dra_holder.holder, ref)
        if unmapped and not self._unmapped_logged and self.watcher.synced.is_set():
            self._unmapped_logged = True
            self.log.warning("kubelet pod-resources reports GPUs allocated by DRA (%s) that cannot be mapped to a "
                             "GPU UUID: no ResourceSlice of this node names their GPU (is the DRA driver running "
                             "here?) (docs/kubernetes-attribution.md#dra)", ", ".join(unmapped[:3]))
        known = {key for gpu in self.watcher.slices.devices().values() for key in self._keys(gpu)}
        if self.resource_claims:
            for (namespace, claim), containers in self._claim_holders().items():
                allocation = self.watcher.claims.claim(namespace, claim)
                for ref in allocation.devices if allocation is not None else ():
                    gpu = self.watcher.gpu(ref)
                    if gpu is not None:
                        for holder in containers:
                            add(gpu, holder, ref)
        changed = (holders, known, by_profile) != (self._holders, self._known, self._by_profile)
        self._holders, self._known, self._by_profile = holders, frozenset(known), by_profile
        if changed:
            self._generation += 1

    def version(self) -> tuple[int, int]:
        """Changes when a refresh changes the holders or GPUs it answers from, or a claim it reads
        (consumers) is read anew with another answer."""
        return self._generation, self.watcher.claims.generation

    def _node_claims(self) -> dict[tuple[str, str], frozenset[str]]:
        """The ResourceClaims this node's pods use -> the pods using each."""
        wanted: dict[tuple[str, str], set[str]] = {}
        for record in self.pods.pods():
            for claim, _ in record.claims:
                wanted.setdefault((record.namespace, claim), set()).add(record.name)
        return {k: frozenset(v) for k, v in wanted.items()}

    def _claim_holders(self) -> dict[tuple[str, str], list[PodContainer]]:
        """The containers of this node's pods using each claim, as the pods and the claim say
        (a claim reserved for other pods only is not theirs yet)."""
        out: dict[tuple[str, str], list[PodContainer]] = {}
        for record in self.pods.pods():
            for claim, containers in record.claims:
                allocation = self.watcher.claims.claim(record.namespace, claim)
                if allocation is None or (allocation.reserved_for and record.name not in allocation.reserved_for):
                    continue
                found = out.setdefault((record.namespace, claim), [])
                found += [PodContainer(record.namespace, record.name, c) for c in containers or ("",)]
        return out

    def _admin_access(self, holder: DraHolder, ref: DeviceRef) -> bool:
        """The kubelet lists a container's DRA devices without saying how they were allocated: its
        claim, as the API source read it, says whether this one is admin access (not a holder)."""
        allocation = self.watcher.claims.claim(holder.claim_namespace, holder.claim_name)
        return allocation is not None and ref in allocation.admin_devices

    def _keys(self, gpu: DraGpu) -> list[str]:
        """The keys a DRA device is held under: a GPU's UUID; a MIG device's own UUID, and its
        parent and profile when it is the node's only MIG device of that profile on that GPU."""
        if not gpu.mig:
            return [gpu.uuid]
        keys = [gpu.uuid] if gpu.uuid else []
        if self.watcher.slices.only_mig(gpu.parent_uuid, gpu.profile) is gpu:
            keys.append(f"{gpu.parent_uuid}/{gpu.profile}")
        return keys

    # --- hot path -------------------------------------------------------------------------------------

    def holders(self, device: Device) -> list[PodContainer] | None:
        """A GPU's holders by its UUID; a MIG instance's by its own UUID or by its parent and profile."""
        holders = self._holders
        if device.mig:
            found = holders.get(device.mig_uuid) if device.mig_uuid else None
            if found is None and device.mig_profile:
                found = holders.get(f"{device.uuid}/{device.mig_profile}")
            if found is not None:
                return found
        return holders.get(device.uuid)

    def claims(self, device: Device) -> list[Claim]:
        holders = self.holders(device)
        if holders:
            return pod_claims(holders)
        return self._profile_claims(device) if device.mig and device.mig_profile else []

    def _profile_claims(self, device: Device) -> list[Claim]:
        """A MIG instance known by its parent and profile only, when its GPU's instances of that profile
        are exactly the held DRA devices of that profile (MIG devices created on demand, DynamicMIG: the
        slices name none of them by UUID, and an instance exists only while a claim holds it): which one
        is whose is not known, so each holder gets an even part of each (n holders of n instances: one
        instance's worth each, its GPU time exact, its OFU the instances' mean; ofu.share.basis
        mig_profile). Another number of instances: none (never a guess)."""
        held = self._by_profile.get((device.uuid, device.mig_profile))
        if not held or device.same_profile != len(held):
            return []
        claims = []
        for containers in held.values():
            own = pod_claims(containers)
            for claim in own:
                claim.use = 1.0 / (len(held) * len(own))
            claims += own
        device.measured, device.basis = True, SHARE_MIG_PROFILE
        return claims

    def idle(self, device: Device) -> str | None:
        keys = [device.mig_uuid, f"{device.uuid}/{device.mig_profile}"] if device.mig else [device.uuid]
        return self.name if any(k in self._known for k in keys) else None

    def consumers(self, namespace: str, claim: str, but: str | None) -> list[Claim]:
        """The pods a ResourceClaim is reserved for (dcgm-exporter's dra_claim_* labels name the claim),
        but pod ``but``: more than one is a GPU shared between them."""
        allocation = self.watcher.claims.claim(namespace, claim)
        if allocation is None:
            return []
        return [Claim(("k8s", namespace, pod), "k8s_api", {K8S_NAMESPACE: namespace, K8S_POD_NAME: pod})
                for pod in allocation.reserved_for if pod != but]

    def close(self) -> None:
        """The watcher is stopped with the pods' (see the processor's shutdown)."""
