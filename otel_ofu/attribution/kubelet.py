"""The kubelet pod-resources API v1: which pod and container each GPU is allocated to.

``List`` on the kubelet's unix socket answers pods -> containers -> devices, where the NVIDIA
device plugin's device ids are GPU UUIDs (``GPU-...``), MIG device UUIDs (``MIG-...``), or,
with time-slicing, ``<uuid>::<replica>``. A plugin run with ``deviceIDStrategy=index`` reports
indexes instead, which this module refuses to use (indexes disagree between tools).
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_RESOURCE_NAMES = ("nvidia.com/gpu*", "nvidia.com/mig-*")
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # the kubelet's own client limit for this API

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodContainer:
    namespace: str
    pod: str
    container: str


def device_uuid(device_id: str) -> str | None:
    """A device id as a lower-case GPU/MIG UUID, without a time-slicing ``::N`` suffix; None for
    ids that are not UUIDs (index strategy)."""
    uuid = device_id.split("::", 1)[0].strip().lower()
    return uuid if uuid.startswith(("gpu-", "mig-")) else None


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
                if not any(fnmatch.fnmatchcase(devices.resource_name, p) for p in patterns):
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


class KubeletClient:
    """A lazily connected client; ``list_gpu_pods`` is one bounded RPC (``timeout`` seconds)."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 2.0,
                 resource_names: Iterable[str] = DEFAULT_RESOURCE_NAMES):
        self.socket_path = socket_path
        self.timeout = timeout
        self.resource_names = tuple(resource_names)
        self._channel: Any = None
        self._stub: Any = None
        self._warned_ignored = False

    def _connect(self) -> None:
        import grpc  # heavy; only when the kubelet source is enabled

        from otel_ofu.attribution.proto import podresources_v1_pb2_grpc

        target = "unix://" + self.socket_path if self.socket_path.startswith("/") else "unix:" + self.socket_path
        self._channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        self._stub = podresources_v1_pb2_grpc.PodResourcesListerStub(self._channel)

    def list_gpu_pods(self) -> dict[str, list[PodContainer]]:
        from otel_ofu.attribution.proto import podresources_v1_pb2

        if self._stub is None:
            self._connect()
        response = self._stub.List(podresources_v1_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        ignored: set[str] = set()
        result = gpu_pods(response, self.resource_names, ignored)
        if ignored and not self._warned_ignored:
            self._warned_ignored = True
            log.warning("kubelet pod-resources reports GPU device ids that are not UUIDs (%s): the device plugin "
                        "uses the index id strategy, and indexes are never matched; set the NVIDIA device "
                        "plugin's deviceIDStrategy to uuid", ", ".join(sorted(ignored)[:4]))
        return result

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
