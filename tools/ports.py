"""Local TCP ports for the servers that tests, benchmarks and tools start next to otel-ofu."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """Distinct free ports: all held open until all are chosen, so none is handed out twice."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_open(port: int) -> bool:
    """Whether something accepts connections on ``127.0.0.1:port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
