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

import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from otel_ofu.attribution import K8S_POD_LABEL_PREFIX
from otel_ofu.attribution.config import KubernetesApiSourceConfig
from otel_ofu.attribution.k8s_identity import PodJob, api_group, controller_of, job_id, job_identity
from otel_ofu.core import specs
from otel_ofu.core.metrics import MetricInfo, register
from otel_ofu.delivery.retry import Backoff
from otel_ofu.pipeline.config import ConfigError
from otel_ofu.pipeline.telemetry import Telemetry

NODE_NAME_ENV = "K8S_NODE_NAME"
LIST_PAGE = 500  # pods per list page; a node has at most a few hundred
DOCS = "docs/kubernetes-attribution.md"

log = logging.getLogger(__name__)

PODS_METRIC = register(MetricInfo(
    "otel_ofu.attribution.kubernetes.pods", "{pod}", "gauge",
    "Pods of this node the Kubernetes API source holds (job identity, precision, labels).",
    emitted_by=("processors/attribution",)))
STALE_METRIC = register(MetricInfo(
    "otel_ofu.attribution.kubernetes.stale", "{state}", "gauge",
    "1 while the pod watch has failed for longer than kubernetes_api.stale_after (the last known pods "
    "are still used), else 0.", emitted_by=("processors/attribution",)))
LISTS_METRIC = register(MetricInfo(
    "otel_ofu.attribution.kubernetes.lists", "{list}", "sum",
    "Full lists of this node's pods, by reason: start, expired (the watch got 410 Gone).",
    emitted_by=("processors/attribution",)))
ERRORS_METRIC = register(MetricInfo(
    "otel_ofu.attribution.kubernetes.errors", "{error}", "sum",
    "Failed Kubernetes API requests (pod list/watch, owner lookups), by reason: unreachable, "
    "unauthorized, forbidden, http_<code>, invalid.", emitted_by=("processors/attribution",)))


class KubernetesApiError(ConfigError):
    """The source cannot start: no node name, no usable client configuration (a config problem)."""


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
    return PodRecord(str(namespace), str(name), str(meta.get("uid") or ""), job, job_id(str(namespace), job),
                     None if precision == specs.UNKNOWN_PRECISION else precision, copied)


def declared_precision(pod: Mapping[str, Any], key: str) -> str | None:
    """The precision a pod declares: its annotation ``key``, else its label ``key``."""
    if not key:
        return None
    meta = pod.get("metadata") or {}
    return (meta.get("annotations") or {}).get(key) or (meta.get("labels") or {}).get(key) or None


def _reason(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status > 0:
        return {401: "unauthorized", 403: "forbidden"}.get(status, f"http_{status}")
    if isinstance(exc, (ValueError, KeyError, TypeError)):
        return "invalid"
    return "unreachable"


def _describe(exc: BaseException) -> str:
    """A one-line account of a failed request: the server's message when it sent a Status."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status > 0:
        message = ""
        try:
            message = json.loads(getattr(exc, "body", "") or "{}").get("message", "")
        except (ValueError, AttributeError):
            pass
        return f"HTTP {status} {getattr(exc, 'reason', '') or ''}".rstrip() + (f": {message}" if message else "")
    cause = getattr(exc, "reason", None)  # urllib3's MaxRetryError wraps the connection error
    if isinstance(cause, BaseException):
        exc = cause
    return f"{type(exc).__name__}: {exc}"


class PodWatcher:
    """Lists and watches the pods of one node on a background thread; reads are thread-safe.

    ``start()`` does not wait for the API: until the first list, and for pods it has not seen,
    the lookups answer None and callers fall back to what they knew before.
    """

    def __init__(self, config: KubernetesApiSourceConfig, *, job_label: str = "", precision_key: str = "",
                 telemetry: Telemetry | None = None, clock: Callable[[], float] = time.monotonic,
                 name: str = "kubernetes_api"):
        self.config = config
        self.node = config.node_name or os.environ.get(NODE_NAME_ENV, "")
        self.job_label, self.precision_key = job_label, precision_key
        self.telemetry = telemetry or Telemetry()
        self.name = name
        self._clock = clock
        self._copy = [re.compile(p) for p in config.copy_labels]
        self._lookup_kinds = frozenset(config.owner_lookups)
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], PodRecord] = {}
        self._by_uid: dict[str, PodRecord] = {}
        self._owners: dict[str, Mapping[str, Any] | None] = {}  # owner uid -> its controller ref
        self._plurals: dict[str, dict[str, str]] = {}  # group/version -> {kind: resource name}
        self._warned_precision: set[str] = set()  # pod uids whose unknown precision was logged
        self._warned_kinds: set[str] = set()  # owner kinds whose lookup problem was logged
        self._resource_version: str | None = None
        self._healthy = False
        self._outage_logged = False
        self._last_ok: float | None = None  # when the API last answered (monotonic)
        self._started_at = clock()
        self._stale = False
        self.synced = threading.Event()  # set after the first complete list
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self._client: Any = None
        self._core: Any = None

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if not self.node:
            raise KubernetesApiError(
                f"no node name: set it, or the {NODE_NAME_ENV} environment variable from the downward API "
                "(fieldRef fieldPath: spec.nodeName)", component=self.name, key="kubernetes_api.node_name")
        self._client = self._api_client()
        from kubernetes import client

        self._core = client.CoreV1Api(self._client)
        self._started_at = self._clock()
        self._set_stale(False)
        self.telemetry.set(PODS_METRIC.name, 0, node=self.node)
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + 30
        while self._thread is not None and self._thread.is_alive() and time.monotonic() < deadline:
            watch = self._watch
            if watch is not None:
                watch.stop()  # unblocks a read waiting for the next event (once the stream is open)
            self._thread.join(timeout=0.1)
        if self._client is not None:
            self._client.close()

    def _api_client(self) -> Any:
        from kubernetes import client, config

        configuration = client.Configuration()
        try:
            if self.config.kubeconfig:
                config.load_kube_config(config_file=self.config.kubeconfig, context=self.config.context or None,
                                        client_configuration=configuration, persist_config=False)
            else:
                config.load_incluster_config(client_configuration=configuration)
        except (config.ConfigException, OSError) as exc:
            where = (f"kubeconfig {self.config.kubeconfig}" if self.config.kubeconfig else
                     "in-cluster config (not running in a pod? set kubernetes_api.kubeconfig)")
            raise KubernetesApiError(f"cannot load the {where}: {exc}", component=self.name,
                                     key="kubernetes_api.kubeconfig") from None
        configuration.retries = 0  # our own backoff retries; urllib3's would also log each attempt
        api = client.ApiClient(configuration)
        from otel_ofu import __version__

        api.user_agent = f"otel-ofu/{__version__}"
        return api

    # --- reads (any thread) ---------------------------------------------------------------------

    def pod(self, namespace: str, name: str) -> PodRecord | None:
        with self._lock:
            return self._pods.get((namespace, name))

    def pod_by_uid(self, uid: str) -> PodRecord | None:
        with self._lock:
            return self._by_uid.get(uid)

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
        return self._stale

    # --- the list/watch loop (its own thread) ---------------------------------------------------

    def _run(self) -> None:
        backoff: Backoff | None = None
        reason = "start"
        while not self._stop.is_set():
            try:
                if self._resource_version is None:
                    self._list(reason)
                self._watch_once()
                backoff = None
            except Exception as exc:  # noqa: BLE001 - every failure is retried; the loop must not die
                if self._stop.is_set():
                    break
                if getattr(exc, "status", None) == 410 and self._resource_version is not None:
                    # the watch's resourceVersion is compacted away (a list's 410 backs off below)
                    log.info("%s: watch expired (%s); listing the node's pods again", self.name, _describe(exc))
                    self._resource_version, reason = None, "expired"
                    continue
                self._failed(exc, "list" if self._resource_version is None else "watch")
                if backoff is None:  # the first failure after a good spell is retried at once
                    backoff = Backoff(float(self.config.retry_initial_interval), float(self.config.retry_max_interval))
                    continue
                self._sleep(backoff.next())

    def _list(self, reason: str) -> None:
        """All pods of the node. As client-go's reflector: the first list may come from the API
        server's watch cache (resourceVersion "0", cheap for a fleet of node agents starting at
        once); a list after 410 Gone is a consistent read (no resourceVersion), in pages."""
        pods: dict[tuple[str, str], PodRecord] = {}
        token: str | None = None
        version = "0" if reason == "start" else None
        while True:
            response = self._core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node}", limit=LIST_PAGE, _continue=token,
                resource_version=None if token else version,
                _preload_content=False, _request_timeout=float(self.config.request_timeout))
            try:
                body = json.loads(response.data)
            finally:
                response.release_conn()
            for item in body.get("items") or ():
                record = self._record(item)
                if record is not None:
                    pods[(record.namespace, record.name)] = record
            meta = body.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                break
        with self._lock:
            self._pods = pods
            self._by_uid = {r.uid: r for r in pods.values() if r.uid}
        self._warned_precision &= set(self._by_uid)
        self._resource_version = str(meta["resourceVersion"])
        self._prune_owners()
        self.telemetry.add(LISTS_METRIC.name, 1, reason=reason)
        self._answered()
        if not self.synced.is_set():
            log.info("%s: watching the pods of node %s (%d now)", self.name, self.node, len(pods))
        self.synced.set()

    def _watch_once(self) -> None:
        from kubernetes import watch

        def request(**kwargs: Any) -> Any:
            response = self._core.list_pod_for_all_namespaces(**kwargs)
            self._answered()  # the stream is open: an idle watch is a healthy one
            return response

        # return_type "object": events arrive as the API's JSON dicts, no model classes.
        self._watch = watch.Watch(return_type="object")
        # Between watch_timeout and twice it, as client-go: node agents that reconnected together
        # (after a control-plane restart) do not all come back at the same moment again.
        server_timeout = int(float(self.config.watch_timeout) * (1 + random.random()))
        read_timeout = server_timeout + float(self.config.request_timeout)
        try:
            for event in self._watch.stream(
                    request, field_selector=f"spec.nodeName={self.node}", resource_version=self._resource_version,
                    allow_watch_bookmarks=True, timeout_seconds=server_timeout,
                    _request_timeout=(float(self.config.request_timeout), read_timeout)):
                if self._stop.is_set():
                    break
                self._event(event.get("type", ""), event.get("raw_object") or {})
        finally:
            self._watch = None

    def _event(self, kind: str, obj: Mapping[str, Any]) -> None:
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED"):
            record = self._record(obj)
            if record is not None:
                with self._lock:
                    old = self._pods.get((record.namespace, record.name))
                    if old is not None and old.uid != record.uid:
                        self._by_uid.pop(old.uid, None)
                    self._pods[(record.namespace, record.name)] = record
                    if record.uid:
                        self._by_uid[record.uid] = record
        elif kind == "DELETED":
            meta = obj.get("metadata") or {}
            with self._lock:
                old = self._pods.pop((meta.get("namespace"), meta.get("name")), None)
                if old is not None:
                    self._by_uid.pop(old.uid, None)
                    self._warned_precision.discard(old.uid)
            self._prune_owners()
        if version:
            self._resource_version = str(version)
        self._answered()

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

    # --- health -----------------------------------------------------------------------------------

    def _answered(self) -> None:
        self._last_ok = self._clock()
        self._healthy = True
        if self._outage_logged:
            self._outage_logged = False
            log.info("%s: the Kubernetes API answers again", self.name)
        if self._stale:
            self._set_stale(False)
        self.telemetry.set(PODS_METRIC.name, len(self), node=self.node)

    def _failed(self, exc: BaseException, what: str) -> None:
        reason = _reason(exc)
        self.telemetry.add(ERRORS_METRIC.name, 1, reason=reason)
        if not self._outage_logged:  # once per outage
            self._outage_logged = True
            hint = (f"; the service account needs get, list and watch on pods ({DOCS}#rbac)"
                    if reason in ("forbidden", "unauthorized") else "")
            logger = log.error if reason in ("forbidden", "unauthorized") else log.warning
            logger("%s: %s of node %s's pods failed (%s)%s; retrying with backoff and serving the last known "
                   "pods", self.name, what, self.node, _describe(exc), hint)
        self._healthy = False
        self._check_stale()

    def _check_stale(self) -> None:
        now = self._clock()
        since = self._last_ok if self._last_ok is not None else self._started_at
        if not self._healthy and now - since > self.config.stale_after:
            if not self._stale:
                log.warning("%s: no answer from the Kubernetes API for over %.0fs: pod metadata is stale (the last "
                            "known %d pods are still used)", self.name, self.config.stale_after, len(self))
            self._set_stale(True)

    def _set_stale(self, stale: bool) -> None:
        self._stale = stale
        self.telemetry.set(STALE_METRIC.name, 1.0 if stale else 0.0, node=self.node)

    def _sleep(self, seconds: float) -> None:
        """Wait out a backoff delay, turning stale on time rather than at the next attempt."""
        deadline = self._clock() + seconds
        while not self._stop.is_set():
            now = self._clock()
            if now >= deadline:
                return
            self._check_stale()
            self._stop.wait(min(deadline - now, 0.5))

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
                parent = controller_of(self._get(f"{base}/namespaces/{quote(namespace)}/{plural}/"
                                                 f"{quote(str(owner['name']))}"))
        except Exception as exc:  # noqa: BLE001 - a lookup that fails leaves the owner as the job
            reason = _reason(exc)
            self.telemetry.add(ERRORS_METRIC.name, 1, reason=reason)
            if reason in ("forbidden", "unauthorized", "http_404"):
                self._owners[key] = None  # permanent for this owner: do not ask again
            if reason == "forbidden" and kind not in self._warned_kinds:
                self._warned_kinds.add(kind)
                log.error("%s: reading %s %s/%s was refused (%s): owner_lookups lists %s, so grant get on it "
                          "(%s#rbac) or remove it; its pods are named after the %s", self.name, kind, namespace,
                          owner["name"], _describe(exc), kind, DOCS, kind)
            return None
        self._owners[key] = dict(parent) if parent is not None else None
        return self._owners[key]

    def _plural(self, api_version: str, kind: str) -> str | None:
        """The resource name of a kind (``RayCluster`` -> ``rayclusters``), from API discovery."""
        if api_version not in self._plurals:
            path = "/api/v1" if "/" not in api_version else f"/apis/{api_version}"
            resources = self._get(path).get("resources") or ()
            self._plurals[api_version] = {r["kind"]: r["name"] for r in resources
                                          if "/" not in r.get("name", "/") and r.get("namespaced")}
        plural = self._plurals[api_version].get(kind)
        if plural is None and kind not in self._warned_kinds:
            self._warned_kinds.add(kind)
            log.warning("%s: the API server serves no namespaced %s in %s; owner lookups stop there",
                        self.name, kind, api_version)
        return plural

    def _get(self, path: str) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        request = self._client.param_serialize(method="GET", resource_path=path,
                                               header_params={"Accept": "application/json"},
                                               auth_settings=["BearerToken"])
        response = self._client.call_api(*request, _request_timeout=float(self.config.request_timeout))
        data = response.read()
        if not 200 <= response.status < 300:
            raise ApiException(status=response.status, reason=response.reason,
                               body=data.decode("utf-8", "replace") if data else None)
        body = json.loads(data)
        if not isinstance(body, dict):
            raise ValueError(f"GET {path}: expected a JSON object")
        return body

    def _prune_owners(self) -> None:
        """Keep the owner cache node-sized: past twice the pods, start over."""
        if len(self._owners) > 2 * len(self) + 16:
            self._owners.clear()  # read again as the remaining pods change
