"""The kubelet pod-resources API v1: which pod and container each GPU is allocated to.

``List`` on the kubelet's unix socket answers pods -> containers -> devices. Devices of the
NVIDIA device plugin are GPU UUIDs (``GPU-...``), MIG device UUIDs (``MIG-...``), or, with
time-slicing, ``<uuid>::<replica>``; a plugin run with ``deviceIDStrategy=index`` reports
indexes instead, which this module refuses to use (indexes disagree between tools).

Devices allocated by Dynamic Resource Allocation are not in ``devices`` (empty for such a
container) but in ``dynamic_resources``: the claim (name, namespace) and, per device, the
driver, pool and device name (``gpu.nvidia.com``, ``node-7``, ``gpu-3``), with a ``share_id``
when one device is shared between claims (Kubernetes 1.35). No GPU UUID is there: the
driver's ResourceSlices say which GPU a device is (otel_ofu.attribution.k8s_dra).

``GetAllocatableResources`` lists every device the device plugins offer on the node, so a GPU
in it that no container holds is known idle (``ofu.job.id=none``), not unknown.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_RESOURCE_NAMES = ("nvidia.com/gpu*", "nvidia.com/mig-*")
DEFAULT_DRA_DRIVERS = ("gpu.nvidia.com",)
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # the kubelet's own client limit for this API

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodContainer:
    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class DraHolder:
    """A container holding a DRA device through a claim."""

    holder: PodContainer
    claim_namespace: str
    claim_name: str
    share_id: str = ""  # set when the device is shared between claims (consumable capacity)


@dataclass
class NodeAllocations:
    """One answer of the kubelet: who holds which GPU, by device plugin and by DRA."""

    by_uuid: dict[str, list[PodContainer]] = field(default_factory=dict)  # device plugin: lower-case UUID
    # DRA: (driver, pool, device) -> holders, for the configured drivers
    dra: dict[tuple[str, str, str], list[DraHolder]] = field(default_factory=dict)
    # UUIDs the device plugins offer on this node (GetAllocatableResources); None when not known
    allocatable: frozenset[str] | None = None


def device_uuid(device_id: str) -> str | None:
    """A device id as a lower-case GPU/MIG UUID, without a time-slicing ``::N`` suffix; None for
    ids that are not UUIDs (index strategy)."""
    uuid = device_id.split("::", 1)[0].strip().lower()
    return uuid if uuid.startswith(("gpu-", "mig-")) else None


def _matches(resource_name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(resource_name, p) for p in patterns)


def gpu_pods(response: Any, resource_names: Iterable[str] = DEFAULT_RESOURCE_NAMES,
             ignored: set[str] | None = None) -> dict[str, list[PodContainer]]:
    """GPU UUID (lower case) -> the pods' containers holding it, from a ListPodResourcesResponse.

    Non-UUID device ids are skipped and added to ``ignored`` so the caller can say so once.
    """
    patterns = tuple(resource_names)
    out: dict[str, list[PodContainer]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not _matches(devices.resource_name, patterns):
                    continue
                for device_id in devices.device_ids:
                    uuid = device_uuid(device_id)
                    if uuid is None:
                        if ignored is not None:
                            ignored.add(device_id)
                        continue
                    holder = PodContainer(pod.namespace, pod.name, container.name)
                    holders = out.setdefault(uuid, [])
                    if holder not in holders:
                        holders.append(holder)
    return out


def dra_devices(response: Any, drivers: Iterable[str] = DEFAULT_DRA_DRIVERS) -> dict[tuple[str, str, str],
                                                                                   list[DraHolder]]:
    """(driver, pool, device) -> the containers holding it through claims, for ``drivers``."""
    wanted = frozenset(drivers)
    out: dict[tuple[str, str, str], list[DraHolder]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for resource in container.dynamic_resources:
                for claimed in resource.claim_resources:
                    if claimed.driver_name not in wanted or not claimed.pool_name or not claimed.device_name:
                        continue
                    holder = DraHolder(PodContainer(pod.namespace, pod.name, container.name), resource.claim_namespace,
                                       resource.claim_name, claimed.share_id if claimed.HasField("share_id") else "")
                    holders = out.setdefault((claimed.driver_name, claimed.pool_name, claimed.device_name), [])
                    if holder not in holders:
                        holders.append(holder)
    return out


def allocatable_uuids(response: Any, resource_names: Iterable[str] = DEFAULT_RESOURCE_NAMES) -> frozenset[str]:
    """The GPU/MIG UUIDs of an AllocatableResourcesResponse (device plugin resources only)."""
    patterns = tuple(resource_names)
    return frozenset(uuid for devices in response.devices if _matches(devices.resource_name, patterns)
                     for device_id in devices.device_ids if (uuid := device_uuid(device_id)) is not None)


class KubeletClient:
    """A lazily connected client; ``allocations`` is two bounded RPCs (``timeout`` seconds each)."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 2.0,
                 resource_names: Iterable[str] = DEFAULT_RESOURCE_NAMES,
                 dra_drivers: Iterable[str] = DEFAULT_DRA_DRIVERS):
        self.socket_path = socket_path
        self.timeout = timeout
        self.resource_names = tuple(resource_names)
        self.dra_drivers = tuple(dra_drivers)
        self._channel: Any = None
        self._stub: Any = None
        self._warned_ignored = False
        self._warned_unsupported = False

    def _connect(self) -> None:
        import grpc  # heavy; only when the kubelet source is enabled

        from otel_ofu.attribution.proto import podresources_v1_pb2_grpc

        target = "unix://" + self.socket_path if self.socket_path.startswith("/") else "unix:" + self.socket_path
        self._channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        self._stub = podresources_v1_pb2_grpc.PodResourcesListerStub(self._channel)

    def list_gpu_pods(self) -> dict[str, list[PodContainer]]:
        """Device-plugin GPUs only (see :meth:`allocations` for all)."""
        return self.allocations().by_uuid

    def allocations(self) -> NodeAllocations:
        from otel_ofu.attribution.proto import podresources_v1_pb2

        if self._stub is None:
            self._connect()
        response = self._stub.List(podresources_v1_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        ignored: set[str] = set()
        result = NodeAllocations(gpu_pods(response, self.resource_names, ignored),
                                 dra_devices(response, self.dra_drivers) if self.dra_drivers else {})
        if ignored and not self._warned_ignored:
            self._warned_ignored = True
            log.warning("kubelet pod-resources reports GPU device ids that are not UUIDs (%s): the device plugin "
                        "uses the index id strategy, and indexes are never matched; set the NVIDIA device "
                        "plugin's deviceIDStrategy to uuid", ", ".join(sorted(ignored)[:4]))
        result.allocatable = self._allocatable()
        return result

    def _allocatable(self) -> frozenset[str] | None:
        import grpc

        from otel_ofu.attribution.proto import podresources_v1_pb2

        try:
            response = self._stub.GetAllocatableResources(podresources_v1_pb2.AllocatableResourcesRequest(),
                                                          timeout=self.timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # a kubelet older than 1.23, or the gate off
                if not self._warned_unsupported:
                    self._warned_unsupported = True
                    log.info("kubelet pod-resources has no GetAllocatableResources: GPUs no pod holds stay "
                             "ofu.job.id=unknown instead of none")
                return None
            raise
        return allocatable_uuids(response, self.resource_names)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
