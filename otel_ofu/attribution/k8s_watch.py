"""List, then watch, one kind of Kubernetes object on a background thread (client-go's reflector).

The Kubernetes API source keeps several such views of its node: the pods (k8s_api.PodWatcher)
and, with DRA, the node's ResourceSlices (k8s_dra). Each is a :class:`ListWatch` over a
:class:`Store`: list (the first from the API server's watch cache, ``resourceVersion=0``, cheap
for a fleet of node agents starting at once; later ones consistent, in pages), then watch from
the list's ``resourceVersion`` with bookmarks, relist on 410 Gone, and back off (capped,
jittered) on errors while the store keeps serving the last known objects. Health is tracked per
view: failures count and are logged once per outage, and after ``stale_after`` without an
answer the view is marked stale (a gauge and a warning).

:class:`ApiSession` is the one client of a source: the kubeconfig or in-cluster configuration
(the official ``kubernetes`` client, imported only when the source is enabled), the node's
name, and plain ``GET``s for the objects read one by one.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from otel_ofu.attribution.config import (
    NO_NODE_NAME,
    KubernetesApiSourceConfig,
    client_configuration,
    node_name,
)
from otel_ofu.core.metrics import MetricInfo, register
from otel_ofu.delivery.retry import Backoff
from otel_ofu.pipeline.config import ConfigError
from otel_ofu.pipeline.telemetry import Telemetry

LIST_PAGE = 500  # objects per list page; a node has at most a few hundred pods
DOCS = "docs/kubernetes-attribution.md"

log = logging.getLogger("otel_ofu.attribution.k8s_api")

STALE_METRIC = register(MetricInfo(
    "otel_ofu.attribution.kubernetes.stale", "{state}", "gauge",
    "1 while a watch of the Kubernetes API source (the node's pods; with DRA, attribute resource="
    "resourceslices) has failed for longer than kubernetes_api.stale_after (the last known objects "
    "are still used), else 0.", emitted_by=("processors/attribution",)))
LISTS_METRIC = register(MetricInfo(
    "otel_ofu.attribution.kubernetes.lists", "{list}", "sum",
    "Full lists of this node's pods (with DRA, of its ResourceSlices: attribute resource), by reason: "
    "start, expired (the watch got 410 Gone).", emitted_by=("processors/attribution",)))
ERRORS_METRIC = register(MetricInfo(
    "otel_ofu.attribution.kubernetes.errors", "{error}", "sum",
    "Failed Kubernetes API requests (pod list/watch, owner lookups, DRA ResourceSlices and "
    "ResourceClaims), by reason: unreachable, unauthorized, forbidden, http_<code>, invalid.",
    emitted_by=("processors/attribution",)))


class KubernetesApiError(ConfigError):
    """The source cannot start: no node name, no usable client configuration (a config problem)."""


def reason_of(exc: BaseException) -> str:
    """A failed request as a bounded label: unauthorized, forbidden, http_<code>, invalid, unreachable."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status > 0:
        return {401: "unauthorized", 403: "forbidden"}.get(status, f"http_{status}")
    if isinstance(exc, (ValueError, KeyError, TypeError)):
        return "invalid"
    return "unreachable"


def describe(exc: BaseException) -> str:
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


class ApiSession:
    """The source's one API client: configuration, the node's name, plain GETs."""

    def __init__(self, config: KubernetesApiSourceConfig, name: str = "kubernetes_api"):
        self.config = config
        self.name = name
        self.node = node_name(config)
        self.client: Any = None

    def open(self) -> None:
        if not self.node:
            raise KubernetesApiError(NO_NODE_NAME, component=self.name, key="kubernetes_api.node_name")
        from kubernetes import client

        try:
            configuration = client_configuration(self.config)
        except ValueError as exc:
            raise KubernetesApiError(str(exc), component=self.name, key="kubernetes_api.kubeconfig") from None
        configuration.retries = 0  # our own backoff retries; urllib3's would also log each attempt
        api = client.ApiClient(configuration)
        from otel_ofu import __version__

        api.user_agent = f"otel-ofu/{__version__}"
        self.client = api

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def get(self, path: str) -> dict[str, Any]:
        """``GET path`` as JSON; raises the client's ApiException on an HTTP error."""
        return self.request("GET", path)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST path`` (e.g. a SelfSubjectAccessReview, which writes nothing) as JSON."""
        return self.request("POST", path, body)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = self.client.param_serialize(method=method, resource_path=path, header_params=headers, body=body,
                                              auth_settings=["BearerToken"])
        response = self.client.call_api(*request, _request_timeout=float(self.config.request_timeout))
        data = response.read()
        if not 200 <= response.status < 300:
            raise ApiException(status=response.status, reason=response.reason,
                               body=data.decode("utf-8", "replace") if data else None)
        body = json.loads(data)
        if not isinstance(body, dict):
            raise ValueError(f"{method} {path}: expected a JSON object")
        return body


class Store(Protocol):
    """Where a ListWatch puts what it sees; its methods are called from the watch thread."""

    def replace(self, items: list[Mapping[str, Any]]) -> None: ...  # a complete list

    def apply(self, event: str, obj: Mapping[str, Any]) -> None: ...  # ADDED, MODIFIED or DELETED

    def __len__(self) -> int: ...


@dataclass
class WatchSpec:
    """What one ListWatch watches and how it reports."""

    what: str  # for people: "pods", "ResourceSlices"
    # list function of the kubernetes client (also called with watch=True by kubernetes.watch)
    list_call: Callable[..., Any]
    field_selector: str
    rbac_hint: str  # said when the API refuses: which rule the role needs
    # extra attributes on this view's self-telemetry (the pods' view has none, for continuity)
    attributes: dict[str, str] = field(default_factory=dict)
    # the gauge of how many objects the store holds, or "" for none
    size_metric: str = ""
    # said when the API server does not serve the resource at all (404), e.g. an older Kubernetes
    missing_hint: str = ""


class ListWatch:
    """Lists and watches one kind of object on a background thread into a Store.

    ``start()`` does not wait for the API: until the first list the store is empty, and
    ``synced`` is set after the first complete list.
    """

    def __init__(self, spec: WatchSpec, store: Store, config: KubernetesApiSourceConfig, *, node: str,
                 telemetry: Telemetry, name: str, clock: Callable[[], float] = time.monotonic):
        self.spec, self.store, self.config = spec, store, config
        self.node, self.telemetry, self.name = node, telemetry, name
        self._clock = clock
        self._resource_version: str | None = None
        self._healthy = False
        self._outage_logged = False
        self._last_ok: float | None = None  # when the API last answered (monotonic)
        self._started_at = clock()
        self._stale = False
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self.on_list: Callable[[], None] | None = None  # called after each complete list

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._started_at = self._clock()
        self._set_stale(False)
        self._set_size()
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-watch-{self.spec.what.lower()}",
                                        daemon=True)
        self._thread.start()

    def stop(self, deadline: float) -> None:
        """Stop the thread by ``deadline`` (monotonic seconds), unblocking an open watch."""
        self._stop.set()
        while self._thread is not None and self._thread.is_alive() and time.monotonic() < deadline:
            watch = self._watch
            if watch is not None:
                watch.stop()  # unblocks a read waiting for the next event (once the stream is open)
            self._thread.join(timeout=0.1)

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
                    log.info("%s: watch of %s expired (%s); listing them again", self.name, self.spec.what,
                             describe(exc))
                    self._resource_version, reason = None, "expired"
                    continue
                self.failed(exc, "list" if self._resource_version is None else "watch")
                if backoff is None:  # the first failure after a good spell is retried at once
                    backoff = Backoff(float(self.config.retry_initial_interval), float(self.config.retry_max_interval))
                    continue
                self._sleep(backoff.next())

    def _list(self, reason: str) -> None:
        """All objects. As client-go's reflector: the first list may come from the API server's
        watch cache (resourceVersion "0"); a list after 410 Gone is a consistent read, in pages."""
        items: list[Mapping[str, Any]] = []
        token: str | None = None
        version = "0" if reason == "start" else None
        while True:
            response = self.spec.list_call(
                field_selector=self.spec.field_selector, limit=LIST_PAGE, _continue=token,
                resource_version=None if token else version,
                _preload_content=False, _request_timeout=float(self.config.request_timeout))
            try:
                body = json.loads(response.data)
            finally:
                response.release_conn()
            items += body.get("items") or ()
            meta = body.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                break
        self.store.replace(items)
        self._resource_version = str(meta["resourceVersion"])
        self.telemetry.add(LISTS_METRIC.name, 1, reason=reason, **self.spec.attributes)
        self._answered()
        if self.on_list is not None:
            self.on_list()
        if not self.synced.is_set():
            log.info("%s: watching the %s of node %s (%d now)", self.name, self.spec.what, self.node, len(self.store))
        self.synced.set()

    def _watch_once(self) -> None:
        from kubernetes import watch

        def request(**kwargs: Any) -> Any:
            response = self.spec.list_call(**kwargs)
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
                    request, field_selector=self.spec.field_selector, resource_version=self._resource_version,
                    allow_watch_bookmarks=True, timeout_seconds=server_timeout,
                    _request_timeout=(float(self.config.request_timeout), read_timeout)):
                if self._stop.is_set():
                    break
                kind, obj = event.get("type", ""), event.get("raw_object") or {}
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.store.apply(kind, obj)
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self._resource_version = str(version)
                self._answered()
        finally:
            self._watch = None

    # --- health -----------------------------------------------------------------------------------

    def _set_size(self) -> None:
        if self.spec.size_metric:
            self.telemetry.set(self.spec.size_metric, len(self.store), node=self.node)

    def _answered(self) -> None:
        self._last_ok = self._clock()
        self._healthy = True
        if self._outage_logged:
            self._outage_logged = False
            log.info("%s: the Kubernetes API answers again (%s)", self.name, self.spec.what)
        if self._stale:
            self._set_stale(False)
        self._set_size()

    def failed(self, exc: BaseException, what: str) -> None:
        reason = reason_of(exc)
        self.telemetry.add(ERRORS_METRIC.name, 1, reason=reason)
        if not self._outage_logged:  # once per outage
            self._outage_logged = True
            denied = reason in ("forbidden", "unauthorized")
            hint = f"; {self.spec.rbac_hint} ({DOCS}#rbac)" if denied else ""
            if reason == "http_404" and self.spec.missing_hint:
                hint = f"; {self.spec.missing_hint}"
            logger = log.error if denied else log.warning
            logger("%s: %s of node %s's %s failed (%s)%s; retrying with backoff and serving the last known %s",
                   self.name, what, self.node, self.spec.what, describe(exc), hint, self.spec.what)
        self._healthy = False
        self._check_stale()

    def _check_stale(self) -> None:
        now = self._clock()
        since = self._last_ok if self._last_ok is not None else self._started_at
        if not self._healthy and now - since > self.config.stale_after:
            if not self._stale:
                log.warning("%s: no answer from the Kubernetes API for over %.0fs: the node's %s are stale (the "
                            "last known %d are still used)", self.name, self.config.stale_after, self.spec.what,
                            len(self.store))
            self._set_stale(True)

    def _set_stale(self, stale: bool) -> None:
        self._stale = stale
        self.telemetry.set(STALE_METRIC.name, 1.0 if stale else 0.0, node=self.node, **self.spec.attributes)

    def _sleep(self, seconds: float) -> None:
        """Wait out a backoff delay, turning stale on time rather than at the next attempt."""
        deadline = self._clock() + seconds
        while not self._stop.is_set():
            now = self._clock()
            if now >= deadline:
                return
            self._check_stale()
            self._stop.wait(min(deadline - now, 0.5))
