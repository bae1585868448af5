"""Settings shared by the components that listen (the ``otlp`` receiver, the ``prometheus``
exporter): ``host:port`` endpoints, server TLS and mTLS, the loopback check, and the one error a
listener that cannot bind raises (:func:`listen_error`). The Collector's confignet/configtls, in
small; :class:`WatchedFiles`, which tells when a credential file was rotated so that it is read
again without a restart; and the one spelling of a peer's IP address.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from otel_ofu.pipeline.component import StartError
from otel_ofu.pipeline.config import invalid, require, require_file

# What an operator reads for the usual reasons a listener cannot bind.
_BIND_FAILURES = {
    errno.EADDRINUSE: "address already in use (another process listens there: another otel-ofu, a Collector; "
                      "stop it or choose another port)",
    errno.EACCES: "permission denied (a port below 1024 needs root or CAP_NET_BIND_SERVICE)",
    errno.EADDRNOTAVAIL: "address not available (no interface of this host has that address)",
}


@dataclass
class ServerTlsConfig:
    """TLS is on when cert_file and key_file are set; client_ca_file adds mTLS."""

    cert_file: str = ""  # the server's certificate (PEM); set with key_file to serve TLS
    key_file: str = ""  # the server certificate's key (PEM)
    client_ca_file: str = ""  # set: clients must present a certificate signed by this CA (mTLS)

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)

    def validate(self) -> None:
        require(bool(self.cert_file) == bool(self.key_file), "cert_file" if not self.cert_file else "key_file",
                "a TLS server needs both cert_file and key_file")
        require(not self.client_ca_file or self.enabled, "client_ca_file",
                "mTLS needs the server's own cert_file and key_file too")
        readable = True
        for key in ("cert_file", "key_file", "client_ca_file"):
            path = getattr(self, key)
            if path:
                readable &= require_file(key, path)
        if readable and self.enabled and self.key_file:  # as the server loads them when it starts
            try:
                server_ssl_context(self)
            except (OSError, ssl.SSLError) as exc:
                invalid("cert_file", f"cannot load the certificate, key and client CA as a TLS server does: {exc}")


def server_ssl_context(tls: ServerTlsConfig) -> ssl.SSLContext:
    """The server side of TLS from ``tls``'s files (TLS 1.2 at least; mTLS with client_ca_file)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(Path(tls.cert_file).expanduser()), str(Path(tls.key_file).expanduser()))
    if tls.client_ca_file:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(str(Path(tls.client_ca_file).expanduser()))
    return context


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` -> (host, port). An empty host (``:4317``) means all interfaces."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdecimal() or int(port) > 65535:
        raise ValueError(f"expected host:port, got {text!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host, int(port)


class ListenError(StartError):
    """A component cannot listen on its endpoint; the message is the one line ``run`` prints."""


def listen_error(component: str, endpoint: str, exc: OSError, protocol: str = "") -> ListenError:
    """``otlp receiver: cannot listen on 127.0.0.1:4317 (OTLP/gRPC): address already in use (...)``."""
    if isinstance(exc, socket.gaierror):
        why = f"cannot resolve the host ({exc.strerror or exc})"
    else:
        why = _BIND_FAILURES.get(exc.errno or 0) or exc.strerror or str(exc)
    return ListenError(f"{component}: cannot listen on {endpoint}{f' ({protocol})' if protocol else ''}: {why}")


def check_listen(host: str, port: int) -> None:
    """Bind ``host:port`` as a server would (SO_REUSEADDR) and let go: the OSError its bind would raise.

    For servers whose own failure says less (gRPC raises "Failed to bind" and logs its own
    error line): asked first, the operator reads why. Port 0 (any free port) always binds.
    """
    if port == 0:
        return
    family, kind, proto, _, address = socket.getaddrinfo(host or "0.0.0.0", port, socket.AF_UNSPEC,
                                                         socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def canonical_ip(text: str | None) -> str | None:
    """An IP address as one spelling (IPv6 compressed, an IPv4-mapped IPv6 address as IPv4), or None.

    A dual-stack listener sees an IPv4 client as ``::ffff:10.0.0.5``; the Kubernetes API names
    the pod ``10.0.0.5``: both are ``10.0.0.5`` here.
    """
    try:
        address = ipaddress.ip_address((text or "").strip().strip("[]").split("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.compressed


def grpc_peer_ip(peer: str | None) -> str | None:
    """The IP address of a gRPC peer string (``ipv4:10.0.0.5:41234``, ``ipv6:[::1]:41234``), or None
    (a unix socket, or no peer)."""
    kind, _, rest = (peer or "").partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, _ = rest.rpartition(":")
    return canonical_ip(host)


class WatchedFiles:
    """Credential files (a bearer token, TLS certificates and keys) that may be rotated in place.

    ``changed()`` says whether any of them changed (inode, size or modification time, following
    symlinks, so a Kubernetes secret's ``..data`` swap counts) since the last call that said so;
    it looks at most every ``interval`` seconds, so calling it per request or handshake is cheap.
    """

    def __init__(self, paths: list[str], interval: float = 1.0):
        self.paths = [str(Path(p).expanduser()) for p in paths if p]
        self.interval = interval
        self._checked_at = time.monotonic()
        self._signature = self._read_signature()
        self._lock = threading.Lock()

    def _read_signature(self) -> tuple:
        out = []
        for path in self.paths:
            try:
                st = os.stat(path)
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)  # mid-rotation: compared like any other state
        return tuple(out)

    def changed(self) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._checked_at < self.interval:
                return False
            self._checked_at = now
            signature = self._read_signature()
            if signature == self._signature:
                return False
            self._signature = signature
            return True
