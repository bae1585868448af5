"""GPUs handed out by Dynamic Resource Allocation (resource.k8s.io/v1): which GPU a DRA device is.

The kubelet (pod-resources ``dynamic_resources``), a ResourceClaim's ``status.allocation`` and
dcgm-exporter's ``dra_*`` labels name a DRA device by driver, pool and device name
(``gpu.nvidia.com``, ``node-7``, ``gpu-3``), never by GPU UUID. The UUID is in the driver's
ResourceSlices for the node: device ``gpu-3`` has the attribute ``uuid``; a MIG device has its
own ``uuid`` (when created), ``parentUUID`` and ``profile`` (NVIDIA's DRA driver,
cmd/gpu-kubelet-plugin/deviceinfo.go and mig.go; v25.3 to v25.12 and main agree on these names).

:class:`SliceStore` keeps the node's ResourceSlices of the configured drivers (a
:class:`~otel_ofu.attribution.k8s_watch.ListWatch` with the field selector ``spec.nodeName``,
and ``spec.driver`` when one driver is configured). A pool is published as one or more slices
with a ``generation``; only the slices of a pool's newest generation count, so a pool
republished with another device-to-UUID mapping replaces the old mapping at once, and slices
of the old generation still being deleted never map a device to a stale GPU.

:class:`ClaimReader` reads the ResourceClaims this node's pods use, one ``get`` each (no
cluster-wide watch): which devices a claim was allocated, and which pods it is reserved for.
It serves two paths: without the kubelet socket, the node's pods' claims are the mapping from
GPU to pod; and a dcgm-exporter page's ``dra_claim_*`` labels name the claim, whose consumers
(several pods: a shared GPU) the claim says.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from otel_ofu.attribution.config import KubernetesApiSourceConfig
from otel_ofu.attribution.k8s_watch import (
    DOCS,
    ERRORS_METRIC,
    ApiSession,
    ListWatch,
    WatchSpec,
    describe,
    reason_of,
)
from otel_ofu.core.metrics import MetricInfo, register
from otel_ofu.pipeline.telemetry import Telemetry

log = logging.getLogger("otel_ofu.attribution.k8s_api")

GROUP_VERSION = "resource.k8s.io/v1"  # GA in Kubernetes 1.34; v1beta1/v1beta2 are not read
NVIDIA_GPU_DRIVER = "gpu.nvidia.com"
# Device attributes of NVIDIA's DRA driver (unqualified names are the driver's own domain).
ATTR_UUID, ATTR_PARENT_UUID, ATTR_PROFILE, ATTR_TYPE = "uuid", "parentUUID", "profile", "type"

DEVICES_METRIC = register(MetricInfo(
    "otel_ofu.attribution.kubernetes.dra.devices", "{device}", "gauge",
    "DRA devices of this node (in the newest generation of each pool of the configured drivers' "
    "ResourceSlices) that name a GPU or MIG UUID.", emitted_by=("processors/attribution",)))
CLAIMS_METRIC = register(MetricInfo(
    "otel_ofu.attribution.kubernetes.dra.claims", "{claim}", "gauge",
    "ResourceClaims of this node's pods the Kubernetes API source holds (read one by one, get only).",
    emitted_by=("processors/attribution",)))


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """A DRA device as the kubelet, a claim and dcgm-exporter name it."""

    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class DraGpu:
    """What a DRA device is: a GPU (uuid) or a MIG device (its uuid if created, parent, profile)."""

    uuid: str  # lower case; "" for a MIG device not created yet
    parent_uuid: str = ""  # MIG: the physical GPU's UUID, lower case
    profile: str = ""  # MIG: e.g. 1g.10gb

    @property
    def mig(self) -> bool:
        return bool(self.parent_uuid)


def _attribute(attributes: Mapping[str, Any], name: str, driver: str) -> str:
    """A string attribute by its short name or qualified with the driver's domain."""
    value = attributes.get(name)
    if value is None:
        value = attributes.get(f"{driver}/{name}")
    if isinstance(value, Mapping):
        value = value.get("string")
    return str(value).strip() if isinstance(value, str) else ""


def device_gpu(driver: str, device: Mapping[str, Any]) -> DraGpu | None:
    """The GPU a ResourceSlice device stands for; None for a device that names none."""
    attributes = device.get("attributes") or (device.get("basic") or {}).get("attributes") or {}
    if not isinstance(attributes, Mapping):
        return None
    uuid = _attribute(attributes, ATTR_UUID, driver).lower()
    parent = _attribute(attributes, ATTR_PARENT_UUID, driver).lower()
    kind = _attribute(attributes, ATTR_TYPE, driver)
    if parent or kind == "mig":
        if not parent:
            return None
        return DraGpu(uuid if uuid.startswith("mig-") else "", parent, _attribute(attributes, ATTR_PROFILE, driver))
    return DraGpu(uuid) if uuid.startswith("gpu-") else None


@dataclass
class _Slice:
    driver: str
    pool: str
    generation: int
    devices: dict[str, DraGpu]  # device name -> GPU


class SliceStore:
    """The node's ResourceSlices of the configured drivers: DRA device -> GPU (thread-safe reads)."""

    def __init__(self, drivers: Iterable[str]):
        self.drivers = frozenset(drivers)
        self._lock = threading.Lock()
        self._slices: dict[str, _Slice] = {}  # slice name -> slice
        self._current: dict[DeviceRef, DraGpu] = {}
        self._mig_by_profile: dict[tuple[str, str], DraGpu | None] = {}  # (parent, profile) -> the one, else None

    # --- reads ----------------------------------------------------------------------------------

    def gpu(self, ref: DeviceRef) -> DraGpu | None:
        with self._lock:
            return self._current.get(ref)

    def devices(self) -> dict[DeviceRef, DraGpu]:
        with self._lock:
            return dict(self._current)

    def only_mig(self, parent_uuid: str, profile: str) -> DraGpu | None:
        """The node's one MIG device of ``profile`` on that GPU; None when none or several."""
        with self._lock:
            return self._mig_by_profile.get((parent_uuid.lower(), profile))

    def __len__(self) -> int:
        with self._lock:
            return len(self._current)

    # --- the Store a ListWatch fills --------------------------------------------------------------

    def replace(self, items: list[Mapping[str, Any]]) -> None:
        slices = {}
        for item in items:
            parsed = self._parse(item)
            if parsed is not None:
                slices[parsed[0]] = parsed[1]
        with self._lock:
            self._slices = slices
            self._index()

    def apply(self, event: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if event == "DELETED":
            with self._lock:
                if self._slices.pop(name, None) is not None:
                    self._index()
            return
        parsed = self._parse(obj)
        with self._lock:
            if parsed is None:
                self._slices.pop(name, None)
            else:
                self._slices[parsed[0]] = parsed[1]
            self._index()

    def _parse(self, obj: Mapping[str, Any]) -> tuple[str, _Slice] | None:
        name = (obj.get("metadata") or {}).get("name")
        spec = obj.get("spec") or {}
        driver = str(spec.get("driver") or "")
        pool = spec.get("pool") or {}
        if not name or driver not in self.drivers or not pool.get("name"):
            return None
        devices = {}
        for device in spec.get("devices") or ():
            if isinstance(device, Mapping) and device.get("name"):
                gpu = device_gpu(driver, device)
                if gpu is not None:
                    devices[str(device["name"])] = gpu
        try:
            generation = int(pool.get("generation") or 0)
        except (TypeError, ValueError):
            generation = 0
        return str(name), _Slice(driver, str(pool["name"]), generation, devices)

    def _index(self) -> None:
        """Devices of each pool's newest generation only (the lock is held)."""
        newest: dict[tuple[str, str], int] = {}
        for s in self._slices.values():
            key = (s.driver, s.pool)
            newest[key] = max(newest.get(key, s.generation), s.generation)
        current: dict[DeviceRef, DraGpu] = {}
        migs: dict[tuple[str, str], DraGpu | None] = {}
        for s in self._slices.values():
            if s.generation != newest[(s.driver, s.pool)]:
                continue
            for device, gpu in s.devices.items():
                current[DeviceRef(s.driver, s.pool, device)] = gpu
                if gpu.mig:
                    key = (gpu.parent_uuid, gpu.profile)
                    migs[key] = gpu if key not in migs else None  # several: ambiguous
        self._current, self._mig_by_profile = current, migs


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    """What a ResourceClaim says: the devices allocated to it and the pods it is reserved for.

    A device allocated with admin access (``adminAccess: true`` on its allocation result: a
    monitoring DaemonSet's claim on every GPU of a node) is in ``admin_devices``, not ``devices``:
    such access ignores every ordinary claim on the device and uses none of it (Kubernetes'
    DeviceRequest.AdminAccess), so its pod holds no GPU time and makes no GPU shared.
    """

    namespace: str
    name: str
    uid: str
    devices: tuple[DeviceRef, ...]  # the devices its pods hold
    reserved_for: tuple[str, ...]  # pod names (reservedFor entries of resource "pods")
    allocated: bool
    admin_devices: frozenset[DeviceRef] = frozenset()  # allocated for administrative access only


def claim_allocation(obj: Mapping[str, Any]) -> ClaimAllocation | None:
    """A ResourceClaim object (resource.k8s.io/v1) as a ClaimAllocation; None without a name."""
    meta = obj.get("metadata") or {}
    if not meta.get("name") or not meta.get("namespace"):
        return None
    status = obj.get("status") or {}
    allocation = status.get("allocation") or {}
    devices: list[DeviceRef] = []
    admin: set[DeviceRef] = set()
    for result in (allocation.get("devices") or {}).get("results") or ():
        if isinstance(result, Mapping) and result.get("driver") and result.get("pool") and result.get("device"):
            ref = DeviceRef(str(result["driver"]), str(result["pool"]), str(result["device"]))
            if result.get("adminAccess") is True:
                admin.add(ref)
            else:
                devices.append(ref)
    pods = tuple(str(r["name"]) for r in status.get("reservedFor") or ()
                 if isinstance(r, Mapping) and r.get("resource") == "pods" and not r.get("apiGroup") and r.get("name"))
    return ClaimAllocation(str(meta["namespace"]), str(meta["name"]), str(meta.get("uid") or ""), tuple(devices), pods,
                           bool(allocation), frozenset(admin))


@dataclass
class _Read:
    claim: ClaimAllocation | None
    at: float
    wanted_by: frozenset[str] = field(default_factory=frozenset)  # pods that referenced it at the read


class ClaimReader:
    """ResourceClaims read one by one (``get``), kept while this node's pods use them.

    A claim is read again when the set of the node's pods using it changes (a new consumer of
    a shared claim), when it was not allocated yet, and at most every ``refresh`` seconds
    otherwise; a claim no pod of the node uses any more is forgotten.
    """

    def __init__(self, session: ApiSession, telemetry: Telemetry, *, name: str, refresh: float = 300.0,
                 clock: Callable[[], float] = time.monotonic):
        self.session, self.telemetry, self.name = session, telemetry, name
        self.refresh_s = refresh
        self._clock = clock
        self._lock = threading.Lock()
        self._reads: dict[tuple[str, str], _Read] = {}
        self.generation = 0  # counts the changes of what claim() answers, after each
        self._denied_logged = False
        self._missing_logged = False

    def claim(self, namespace: str, name: str) -> ClaimAllocation | None:
        """The claim as last read (no request here); None if not read or not found."""
        with self._lock:
            read = self._reads.get((namespace, name))
            return read.claim if read is not None else None

    def sync(self, wanted: Mapping[tuple[str, str], frozenset[str]]) -> None:
        """Read what ``wanted`` (claim -> the node's pods using it) needs; forget the rest."""
        now = self._clock()
        with self._lock:
            gone = [self._reads.pop(k) for k in [k for k in self._reads if k not in wanted]]
            if any(read.claim is not None for read in gone):
                self.generation += 1
            stale = [k for k, pods in wanted.items() if self._due(self._reads.get(k), pods, now)]
        for namespace, name in stale:
            claim = self._get(namespace, name)
            with self._lock:
                if claim is not False:
                    before = self._reads.get((namespace, name))
                    self._reads[(namespace, name)] = _Read(claim or None, now, wanted[(namespace, name)])
                    if (before.claim if before is not None else None) != (claim or None):
                        self.generation += 1
        self.telemetry.set(CLAIMS_METRIC.name, len(self._reads), node=self.session.node)

    def _due(self, read: _Read | None, pods: frozenset[str], now: float) -> bool:
        if read is None or read.wanted_by != pods:
            return True
        if read.claim is None or not read.claim.allocated:
            return now - read.at >= 10.0  # not there or not allocated yet: soon again
        return now - read.at >= self.refresh_s

    def _get(self, namespace: str, name: str) -> ClaimAllocation | None | bool:
        """The claim; None when it does not exist; False when the read failed (kept as it was)."""
        path = f"/apis/{GROUP_VERSION}/namespaces/{quote(namespace)}/resourceclaims/{quote(name)}"
        try:
            return claim_allocation(self.session.get(path))
        except Exception as exc:  # noqa: BLE001 - a failed read keeps the last answer
            reason = reason_of(exc)
            self.telemetry.add(ERRORS_METRIC.name, 1, reason=reason)
            if reason == "http_404":
                return None
            if reason in ("forbidden", "unauthorized"):
                if not self._denied_logged:
                    self._denied_logged = True
                    log.error("%s: reading ResourceClaim %s/%s was refused (%s): the service account needs get on "
                              "resourceclaims.resource.k8s.io (%s#rbac); GPUs allocated through claims are mapped "
                              "from the kubelet only", self.name, namespace, name, describe(exc), DOCS)
            elif not self._missing_logged:
                self._missing_logged = True
                log.warning("%s: reading ResourceClaim %s/%s failed (%s); retrying", self.name, namespace, name,
                            describe(exc))
            return False


def pod_claims(pod: Mapping[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The ResourceClaims a pod object uses: (claim name, the containers naming it), in pod order.

    ``spec.resourceClaims[]`` names a claim directly (``resourceClaimName``) or through a
    template, whose generated claim's name is in ``status.resourceClaimStatuses``; containers
    use a pod claim by its pod-level name in ``resources.claims``.
    """
    spec = pod.get("spec") or {}
    generated = {str(s.get("name")): str(s.get("resourceClaimName") or "")
                 for s in (pod.get("status") or {}).get("resourceClaimStatuses") or () if isinstance(s, Mapping)}
    users: dict[str, list[str]] = {}
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        if not isinstance(container, Mapping):
            continue
        for ref in ((container.get("resources") or {}).get("claims") or ()):
            if isinstance(ref, Mapping) and ref.get("name"):
                users.setdefault(str(ref["name"]), []).append(str(container.get("name") or ""))
    out = []
    for entry in spec.get("resourceClaims") or ():
        if not isinstance(entry, Mapping) or not entry.get("name"):
            continue
        claim = str(entry.get("resourceClaimName") or "") or generated.get(str(entry["name"]), "")
        if claim:
            out.append((claim, tuple(users.get(str(entry["name"]), ()))))
    return tuple(out)


class DraWatcher:
    """The DRA half of the Kubernetes API source: the node's ResourceSlices and its pods' claims."""

    def __init__(self, config: KubernetesApiSourceConfig, drivers: Iterable[str], session: ApiSession, *,
                 telemetry: Telemetry, name: str, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.drivers = tuple(drivers)
        self.session = session
        self.telemetry = telemetry
        self.name = name
        self.slices = SliceStore(self.drivers)
        self.claims = ClaimReader(session, telemetry, name=name, clock=clock)
        self._clock = clock
        self.watch: ListWatch | None = None

    def start(self) -> None:
        from kubernetes import client

        api = client.ResourceV1Api(self.session.client)
        selector = f"spec.nodeName={self.session.node}"
        if len(self.drivers) == 1:
            selector += f",spec.driver={self.drivers[0]}"
        spec = WatchSpec("ResourceSlices", api.list_resource_slice, selector,
                         "the service account needs get, list and watch on resourceslices.resource.k8s.io",
                         attributes={"resource": "resourceslices"}, size_metric=DEVICES_METRIC.name,
                         missing_hint=("the API server does not serve resource.k8s.io/v1 ResourceSlices (Kubernetes "
                                       "1.34 or later serves them): GPUs allocated by DRA are not mapped"))
        self.watch = ListWatch(spec, self.slices, self.config, node=self.session.node, telemetry=self.telemetry,
                               name=self.name, clock=self._clock)
        self.watch.start()

    def stop(self, deadline: float) -> None:
        if self.watch is not None:
            self.watch.stop(deadline)

    @property
    def synced(self) -> threading.Event:
        assert self.watch is not None
        return self.watch.synced

    def gpu(self, ref: DeviceRef) -> DraGpu | None:
        return self.slices.gpu(ref) if ref.driver in self.drivers else None
