"""TCP forwarders for tests: a pod's own address on this machine, and a link that can be cut.

In a cluster every pod has its own IP, and a server sees a pod's connection come from it. Here
every process is on 127.0.0.1, and a client connecting to any 127.x address still leaves from
127.0.0.1; the OpenTelemetry SDK's exporters cannot be told to leave from another. A
:class:`PodAddress` is a TCP forwarder: a client connects to it on 127.0.0.1, and it opens the
connection onward from the pod's address (bound before connecting), as the pod's own network
namespace would. Linux routes all of 127.0.0.0/8 to the loopback interface, so any 127.0.0.N
is a usable source address with no setup.

The same forwarder can be cut (:meth:`Forwarder.cut`): open connections are closed and new ones
accepted and closed at once, as a load balancer in front of a control plane that went away does
(tests/kube_apiserver.py's ``CuttableProxy``).
"""

from __future__ import annotations

import socket
import threading


class Forwarder:
    """Forwards connections made to ``port`` (on 127.0.0.1) to ``upstream``, from ``source_ip``
    when given; :meth:`cut` partitions the link until :meth:`restore`."""

    def __init__(self, upstream: tuple[str, int], source_ip: str | None = None):
        self.upstream, self.source_ip = upstream, source_ip
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name=f"forward-{source_ip or 'local'}-{upstream[1]}",
                         daemon=True).start()

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for sock in self._open:
                _close(sock)
            self._open.clear()

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)

    def __enter__(self) -> Forwarder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                _close(client)
                continue
            source = (self.source_ip, 0) if self.source_ip else None
            try:
                upstream = socket.create_connection(self.upstream, timeout=5, source_address=source)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


class PodAddress(Forwarder):
    """Forwards connections made to ``port`` (on 127.0.0.1) to ``upstream`` from ``source_ip``."""

    def __init__(self, source_ip: str, upstream: tuple[str, int]):
        super().__init__(upstream, source_ip)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
