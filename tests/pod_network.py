"""A pod's own address on this machine, for tests: connections that arrive from 127.0.0.N.

In a cluster every pod has its own IP, and a server sees a pod's connection come from it. Here
every process is on 127.0.0.1, and a client connecting to any 127.x address still leaves from
127.0.0.1; the OpenTelemetry SDK's exporters cannot be told to leave from another. A
:class:`PodAddress` is a TCP forwarder: a client connects to it on 127.0.0.1, and it opens the
connection onward from the pod's address (bound before connecting), as the pod's own network
namespace would. Linux routes all of 127.0.0.0/8 to the loopback interface, so any 127.0.0.N
is a usable source address with no setup.
"""

from __future__ import annotations

import socket
import threading


class PodAddress:
    """Forwards connections made to ``port`` (on 127.0.0.1) to ``upstream`` from ``source_ip``."""

    def __init__(self, source_ip: str, upstream: tuple[str, int]):
        self.source_ip, self.upstream = source_ip, upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name=f"pod-address-{source_ip}", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        _close(self._listener)
        with self._lock:
            for sock in self._open:
                _close(sock)
            self._open.clear()

    def __enter__(self) -> PodAddress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5, source_address=(self.source_ip, 0))
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


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
