"""The pods of this node from the Kubernetes API: which job each belongs to, its precision, labels.

The kubelet pod-resources API says which pod holds which GPU but nothing about the pod; this
source watches the pods of one node (field selector ``spec.nodeName``) like the kubelet,
dcgm-exporter and the Collector's ``k8sattributes`` processor do, with the official
``kubernetes`` client: list, then watch from the list's ``resourceVersion`` with bookmarks,
relist on 410 Gone, and back off (capped, jittered) on errors while keeping the last known
pods. ``PodWatcher.job_id(namespace, pod)`` is the one mapping from a pod to its job id, for the
attribution processor and anything else that sees ``k8s.pod.name`` / ``k8s.namespace.name``.

Memory holds one small record per pod of the node (deleted pods are dropped), plus the owner
objects read for ``owner_lookups``. docs/kubernetes-attribution.md is the user's description.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from otel_ofu.attribution import K8S_POD_LABEL_PREFIX
from otel_ofu.attribution.config import NODE_NAME_ENV, KubernetesApiSourceConfig
from otel_ofu.attribution.k8s_dra import pod_claims
from otel_ofu.attribution.k8s_identity import PodJob, api_group, controller_of, job_id, job_identity
from otel_ofu.attribution.k8s_watch import (
    DOCS,
    ERRORS_METRIC,
    ApiSession,
    KubernetesApiError,
    ListWatch,
    WatchSpec,
    describe,
    reason_of,
)
from otel_ofu.core import specs
from otel_ofu.core.metrics import MetricInfo, register
from otel_ofu.pipeline.endpoints import canonical_ip
from otel_ofu.pipeline.telemetry import Telemetry

__all__ = ["NODE_NAME_ENV", "KubernetesApiError", "PodRecord", "PodWatcher", "pod_record"]

log = logging.getLogger(__name__)

PODS_METRIC = register(MetricInfo(
    "otel_ofu.attribution.kubernetes.pods", "{pod}", "gauge",
    "Pods of this node the Kubernetes API source holds (job identity, precision, labels).",
    emitted_by=("processors/attribution",)))


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What attribution keeps about one pod (not the pod: a few strings)."""

    namespace: str
    name: str
    uid: str
    job: PodJob
    job_id: str
    precision: str | None  # normalised, known precisions only
    labels: Mapping[str, str] = field(default_factory=dict)  # copied labels as k8s.pod.label.<key>
    # DRA: the ResourceClaims the pod uses and the containers using each (k8s_dra.pod_claims)
    claims: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The pod's own IP addresses (status.podIPs) while it may run: what a report it sends comes
    # from. Empty for a pod on the host network (it shares the node's addresses with every such
    # pod), one without an address yet, and one that has ended (its address may be reused).
    ips: tuple[str, ...] = ()
    host_network: bool = False


def pod_record(pod: Mapping[str, Any], *, job_label: str = "", precision_key: str = "",
               copy_labels: Sequence[re.Pattern[str]] = (),
               lookup: Callable[[str, Mapping[str, Any]], Mapping[str, Any] | None] | None = None
               ) -> PodRecord | None:
    """A pod object (a dict in the API's JSON shape) as a record; None without namespace or name."""
    meta = pod.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    if not namespace or not name:
        return None
    labels: Mapping[str, str] = meta.get("labels") or {}
    job = job_identity(pod, job_label, lookup)
    precision = specs.normalize_precision(declared_precision(pod, precision_key))
    copied = {K8S_POD_LABEL_PREFIX + k: str(v) for k, v in labels.items()
              if any(p.fullmatch(k) for p in copy_labels)}
    host_network = bool((pod.get("spec") or {}).get("hostNetwork"))
    return PodRecord(str(namespace), str(name), str(meta.get("uid") or ""), job, job_id(str(namespace), job),
                     None if precision == specs.UNKNOWN_PRECISION else precision, copied, pod_claims(pod),
                     () if host_network else pod_ips(pod), host_network)


def pod_ips(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The addresses of a pod that may still run (status.podIPs, else status.podIP), one spelling each."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return ()
    listed = [entry.get("ip") for entry in status.get("podIPs") or () if isinstance(entry, Mapping)]
    found = (canonical_ip(text) for text in (listed or [status.get("podIP")]))
    return tuple(dict.fromkeys(ip for ip in found if ip))


def declared_precision(pod: Mapping[str, Any], key: str) -> str | None:
    """The precision a pod declares: its annotation ``key``, else its label ``key``."""
    if not key:
        return None
    meta = pod.get("metadata") or {}
    return (meta.get("annotations") or {}).get(key) or (meta.get("labels") or {}).get(key) or None


class PodWatcher:
    """The pods of one node, listed and watched on a background thread; reads are thread-safe.

    ``start()`` does not wait for the API: until the first list, and for pods it has not seen,
    the lookups answer None and callers fall back to what they knew before.
    """

    def __init__(self, config: KubernetesApiSourceConfig, *, job_label: str = "", precision_key: str = "",
                 telemetry: Telemetry | None = None, clock: Callable[[], float] = time.monotonic,
                 name: str = "kubernetes_api", session: ApiSession | None = None):
        self.config = config
        self.session = session or ApiSession(config, name)
        self._own_session = session is None
        self.node = self.session.node
        self.job_label, self.precision_key = job_label, precision_key
        self.telemetry = telemetry or Telemetry()
        self.name = name
        self._clock = clock
        self._copy = [re.compile(p) for p in config.copy_labels]
        self._lookup_kinds = frozenset(config.owner_lookups)
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], PodRecord] = {}
        self._by_uid: dict[str, PodRecord] = {}
        self._by_ip: dict[str, list[PodRecord]] = {}
        self._owners: dict[str, Mapping[str, Any] | None] = {}  # owner uid -> its controller ref
        # Counts the changes of the pods' records (what pod() and pod_by_uid() answer), after each.
        self.generation = 0
        self._plurals: dict[str, dict[str, str]] = {}  # group/version -> {kind: resource name}
        self._warned_precision: set[str] = set()  # pod uids whose unknown precision was logged
        self._warned_kinds: set[str] = set()  # owner kinds whose lookup problem was logged
        self.watch: ListWatch | None = None
        self.synced = threading.Event()  # set after the first complete list (the watch's, once started)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._own_session:
            self.session.open()
        from kubernetes import client

        core = client.CoreV1Api(self.session.client)
        spec = WatchSpec("pods", core.list_pod_for_all_namespaces, f"spec.nodeName={self.node}",
                         "the service account needs get, list and watch on pods", size_metric=PODS_METRIC.name)
        self.watch = ListWatch(spec, self, self.config, node=self.node, telemetry=self.telemetry, name=self.name,
                               clock=self._clock)
        self.synced = self.watch.synced
        self.watch.start()

    def stop(self, deadline: float | None = None) -> None:
        if self.watch is not None:
            self.watch.stop(time.monotonic() + 30 if deadline is None else deadline)
        if self._own_session:
            self.session.close()

    # --- reads (any thread) ---------------------------------------------------------------------

    def pod(self, namespace: str, name: str) -> PodRecord | None:
        with self._lock:
            return self._pods.get((namespace, name))

    def pod_by_uid(self, uid: str) -> PodRecord | None:
        with self._lock:
            return self._by_uid.get(uid)

    def pods(self) -> list[PodRecord]:
        """Every pod of the node known now."""
        with self._lock:
            return list(self._pods.values())

    def pods_at(self, ip: str) -> list[PodRecord]:
        """The pods of the node with this address of their own (one, but for a moment of reuse)."""
        with self._lock:
            return list(self._by_ip.get(ip, ()))

    def job_id(self, namespace: str, pod: str) -> str | None:
        """``ofu.job.id`` of a pod of this node; None while the pod is unknown (not seen yet)."""
        record = self.pod(namespace, pod)
        return record.job_id if record is not None else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)

    @property
    def stale(self) -> bool:
        """True while the API has failed for longer than ``stale_after`` (the last state still serves)."""
        return self.watch is not None and self.watch.stale

    # --- the Store the watch fills (its thread) ---------------------------------------------------

    def replace(self, items: list[Mapping[str, Any]]) -> None:
        pods: dict[tuple[str, str], PodRecord] = {}
        for item in items:
            record = self._record(item)
            if record is not None:
                pods[(record.namespace, record.name)] = record
        with self._lock:
            changed = pods != self._pods
            self._pods = pods
            self._by_uid = {r.uid: r for r in pods.values() if r.uid}
            self._by_ip = {}
            for record in pods.values():
                self._index_ips(record)
            if changed:
                self.generation += 1
        self._warned_precision &= set(self._by_uid)
        self._prune_owners()

    def apply(self, event: str, obj: Mapping[str, Any]) -> None:
        if event in ("ADDED", "MODIFIED"):
            record = self._record(obj)
            if record is not None:
                with self._lock:
                    old = self._pods.get((record.namespace, record.name))
                    if old is not None:
                        self._unindex_ips(old)
                        if old.uid != record.uid:
                            self._by_uid.pop(old.uid, None)
                    self._pods[(record.namespace, record.name)] = record
                    if record.uid:
                        self._by_uid[record.uid] = record
                    self._index_ips(record)
                    if record != old:
                        self.generation += 1
        elif event == "DELETED":
            meta = obj.get("metadata") or {}
            with self._lock:
                old = self._pods.pop((meta.get("namespace"), meta.get("name")), None)
                if old is not None:
                    self._by_uid.pop(old.uid, None)
                    self._unindex_ips(old)
                    self._warned_precision.discard(old.uid)
                    self.generation += 1
            self._prune_owners()

    def _index_ips(self, record: PodRecord) -> None:
        for ip in record.ips:
            self._by_ip.setdefault(ip, []).append(record)

    def _unindex_ips(self, record: PodRecord) -> None:
        for ip in record.ips:
            held = [r for r in self._by_ip.get(ip, ()) if r is not record]
            if held:
                self._by_ip[ip] = held
            else:
                self._by_ip.pop(ip, None)

    def _record(self, pod: Mapping[str, Any]) -> PodRecord | None:
        record = pod_record(pod, job_label=self.job_label, precision_key=self.precision_key, copy_labels=self._copy,
                            lookup=self._lookup if self._lookup_kinds else None)
        if record is None:
            return None
        declared = declared_precision(pod, self.precision_key)
        if declared and record.precision is None and record.uid not in self._warned_precision:
            self._warned_precision.add(record.uid)
            log.warning("%s: pod %s/%s declares %s=%r, which is not a precision otel-ofu knows; its precision "
                        "stays unknown", self.name, record.namespace, record.name, self.precision_key, declared)
        return record

    # --- owner lookups -------------------------------------------------------------------------------

    def _wanted(self, owner: Mapping[str, Any]) -> bool:
        kind, group = str(owner.get("kind", "")), api_group(str(owner.get("apiVersion", "")))
        return kind in self._lookup_kinds or f"{kind}.{group}" in self._lookup_kinds

    def _lookup(self, namespace: str, owner: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The controller reference of a pod's owner, read from the API (cached by the owner's uid)."""
        if not self._wanted(owner):
            return None
        key = str(owner.get("uid") or f"{namespace}/{owner.get('kind')}/{owner.get('name')}")
        if key in self._owners:
            return self._owners[key]
        api_version, kind = str(owner.get("apiVersion", "")), str(owner["kind"])
        try:
            plural = self._plural(api_version, kind)
            if plural is None:
                parent = None
            else:
                base = "/api/v1" if "/" not in api_version else f"/apis/{api_version}"
                parent = controller_of(self.session.get(f"{base}/namespaces/{quote(namespace)}/{plural}/"
                                                 f"{quote(str(owner['name']))}"))
        except Exception as exc:  # noqa: BLE001 - a lookup that fails leaves the owner as the job
            reason = reason_of(exc)
            self.telemetry.add(ERRORS_METRIC.name, 1, reason=reason)
            if reason in ("forbidden", "unauthorized", "http_404"):
                self._owners[key] = None  # permanent for this owner: do not ask again
            if reason == "forbidden" and kind not in self._warned_kinds:
                self._warned_kinds.add(kind)
                log.error("%s: reading %s %s/%s was refused (%s): owner_lookups lists %s, so grant get on it "
                          "(%s#rbac) or remove it; its pods are named after the %s", self.name, kind, namespace,
                          owner["name"], describe(exc), kind, DOCS, kind)
            return None
        self._owners[key] = dict(parent) if parent is not None else None
        return self._owners[key]

    def _plural(self, api_version: str, kind: str) -> str | None:
        """The resource name of a kind (``RayCluster`` -> ``rayclusters``), from API discovery."""
        if api_version not in self._plurals:
            path = "/api/v1" if "/" not in api_version else f"/apis/{api_version}"
            resources = self.session.get(path).get("resources") or ()
            self._plurals[api_version] = {r["kind"]: r["name"] for r in resources
                                          if "/" not in r.get("name", "/") and r.get("namespaced")}
        plural = self._plurals[api_version].get(kind)
        if plural is None and kind not in self._warned_kinds:
            self._warned_kinds.add(kind)
            log.warning("%s: the API server serves no namespaced %s in %s; owner lookups stop there",
                        self.name, kind, api_version)
        return plural

    def _prune_owners(self) -> None:
        """Keep the owner cache node-sized: past twice the pods, start over."""
        if len(self._owners) > 2 * len(self._pods) + 16:
            self._owners.clear()  # read again as the remaining pods change
