"""A real Kubernetes API server for tests: Debian's etcd plus kube-apiserver built from Go modules.

kube-apiserver comes from collector/build-kube-apiserver.sh (cached by content hash; $KUBE_APISERVER
overrides), etcd from the ``etcd-server`` package ($ETCD overrides). The server runs with RBAC,
a token file (an admin in system:masters, the ``otel-ofu`` user tests grant roles to, and a
``stranger`` with no roles), self-signed certificates and an audit log of every request the
``otel-ofu`` user makes, so tests can say exactly what it asked for. No controller manager or
scheduler runs: pods are created with ``spec.nodeName`` set, owner references and all, as the
workload controllers would create them.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests import certs
from tests.e2e_util import Process, built_tool, free_ports, port_open, unavailable, wait_for
from tests.pod_network import Forwarder

ADMIN_TOKEN = "admin-token-0123456789"
WATCHER_USER, WATCHER_TOKEN = "otel-ofu", "otel-ofu-token-0123456789"
STRANGER_USER, STRANGER_TOKEN = "stranger", "stranger-token-0123456789"

AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                "rules": [{"level": "Metadata", "users": [WATCHER_USER, STRANGER_USER]}, {"level": "None"}]}


def apiserver_binary() -> str:
    return built_tool("kube-apiserver", "KUBE_APISERVER", "build-kube-apiserver.sh",
                      "run collector/build-kube-apiserver.sh (needs Go; ~5 min once, then cached)")


def etcd_binary() -> str:
    found = os.environ.get("ETCD") or shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK)
                                                               else None)
    if not found:
        unavailable("etcd not installed: apt-get install etcd-server (Debian's etcd), or set ETCD")
    return str(found)


class KubeApiServer:
    """etcd + kube-apiserver on free loopback ports, in ``workdir``; restartable, same port and data."""

    def __init__(self, workdir: Path):
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.etcd_port, self.peer_port, self.port = free_ports(3)
        self.certs = certs.make(self._subdir("certs"))
        self.url = f"https://127.0.0.1:{self.port}"
        self.audit_log = self.dir / "audit.log"
        tokens = self.dir / "tokens.csv"
        tokens.write_text(f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"\n'
                          f"{WATCHER_TOKEN},{WATCHER_USER},otel-ofu-uid\n"
                          f"{STRANGER_TOKEN},{STRANGER_USER},stranger-uid\n")
        policy = self.dir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self._args = [
            apiserver_binary(), f"--etcd-servers=http://127.0.0.1:{self.etcd_port}", "--bind-address=127.0.0.1",
            f"--secure-port={self.port}", f"--tls-cert-file={self.certs.server_cert}",
            f"--tls-private-key-file={self.certs.server_key}", f"--token-auth-file={tokens}",
            f"--service-account-key-file={self.certs.client_cert}",
            f"--service-account-signing-key-file={self.certs.client_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=RBAC", "--service-cluster-ip-range=10.96.0.0/24",
            "--disable-admission-plugins=ServiceAccount", "--endpoint-reconciler-type=none",
            f"--cert-dir={self._subdir('apiserver-certs')}", f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}", "--audit-log-mode=blocking", "--enable-priority-and-fairness=false",
            # on SIGTERM, end open watches within 2s instead of waiting for them (the HTTP server waits)
            "--shutdown-watch-termination-grace-period=2s",
        ]
        self.etcd: Process | None = None
        self.apiserver: Process | None = None
        self._starts = 0

    def _subdir(self, name: str) -> Path:
        path = self.dir / name
        path.mkdir(exist_ok=True)
        return path

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> KubeApiServer:
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.etcd = Process("etcd", [
            etcd_binary(), "--name=default", f"--data-dir={self._subdir('etcd')}",
            f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}", f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}", f"--initial-cluster=default={peer}"], self.dir / "etcd.log")
        wait_for("etcd to listen", lambda: port_open(self.etcd_port) or self._check(self.etcd), timeout=60,
                 diagnostics=self.etcd.tail)
        self.start_apiserver()
        return self

    def start_apiserver(self) -> None:
        self._starts += 1
        self.apiserver = Process("kube-apiserver", self._args, self.dir / f"apiserver-{self._starts}.log")
        wait_for("kube-apiserver /readyz", lambda: self._ready() or self._check(self.apiserver), timeout=180,
                 interval=0.5, diagnostics=self.apiserver.tail)

    def stop_apiserver(self) -> None:
        if self.apiserver is not None:
            self.apiserver.stop(timeout=60)

    def stop(self) -> None:
        self.stop_apiserver()
        if self.etcd is not None:
            self.etcd.stop()

    def _check(self, process: Process) -> bool:
        if not process.alive():
            raise AssertionError(f"{process.name} exited (rc {process.proc.returncode})\n{process.tail()}")
        return False

    def _ready(self) -> bool:
        try:
            with self._request("GET", "/readyz") as response:
                return response.status == 200
        except OSError:
            return False

    # --- clients ---------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.certs.ca))

    def _request(self, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN,
                 content_type: str = "application/json"):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Content-Type": content_type, "Accept": "application/json"})
        return urllib.request.urlopen(request, context=self.ssl_context(), timeout=30)

    def api(self, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN) -> dict[str, Any]:
        """One request as the admin (or ``token``); the decoded JSON reply."""
        with self._request(method, path, body, token) as response:
            return json.loads(response.read() or b"{}")

    def kubeconfig(self, token: str, name: str, port: int | None = None) -> Path:
        """A kubeconfig file as a user would have one: the server (or a proxy's port), its CA, a token."""
        path = self.dir / f"kubeconfig-{name}-{port or self.port}.yaml"
        server = f"https://127.0.0.1:{port or self.port}"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(self.certs.ca)}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": "test", "user": name}}]}))
        return path

    # --- objects ---------------------------------------------------------------------------------

    def namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": name, "labels": labels or {}}})

    def create_pod(self, namespace: str, name: str, node: str, *, labels: dict | None = None,
                   annotations: dict | None = None, owners: list[dict] | None = None,
                   host_network: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
        if annotations:
            meta["annotations"] = annotations
        if owners:
            meta["ownerReferences"] = owners
        spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "main", "image": "registry.example/train:1"}]}
        if host_network:
            spec["hostNetwork"] = True
        return self.api("POST", f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})

    def set_pod_ips(self, namespace: str, name: str, ips: list[str], phase: str = "Running") -> None:
        """What the kubelet writes once the pod's sandbox has its network: status.podIP(s) and the phase."""
        status = {"phase": phase, "podIP": ips[0], "podIPs": [{"ip": ip} for ip in ips]}
        with self._request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status},
                           content_type="application/merge-patch+json"):
            pass

    def patch_labels(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        with self._request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", {"metadata": {"labels": labels}},
                           content_type="application/merge-patch+json"):
            pass

    def delete_pod(self, namespace: str, name: str) -> None:
        """Gone at once (grace period 0): no kubelet runs here to confirm a graceful delete."""
        self.api("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}",
                 {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})

    def grant(self, user: str, name: str, rules: list[dict]) -> None:
        """A ClusterRole with ``rules`` bound to ``user`` (the chart's node agent gets the same)."""
        self.api("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
            "rules": rules})
        self.api("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})

    def audit(self, user: str) -> list[dict[str, Any]]:
        """Every request ``user`` made (audit events at stage ResponseComplete or Panic)."""
        if not self.audit_log.exists():
            return []
        events = [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]
        return [e for e in events if e.get("user", {}).get("username") == user
                and e.get("stage") in ("ResponseComplete", "Panic")]


class CuttableProxy(Forwarder):
    """A TCP forwarder to the API server whose connections the test can cut (a network partition).

    While cut, open connections are closed and new ones are accepted and closed at once, as a
    load balancer in front of a control plane that went away does.
    """

    def __init__(self, upstream_port: int):
        super().__init__(("127.0.0.1", upstream_port))

