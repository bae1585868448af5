"""Settings shared by the components that listen (the ``otlp`` receiver, the ``prometheus``
exporter): ``host:port`` endpoints, server TLS and mTLS, the loopback check. The Collector's
confignet/configtls, in small.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from otel_ofu.pipeline.config import require


@dataclass
class ServerTlsConfig:
    """TLS is on when cert_file and key_file are set; client_ca_file adds mTLS."""

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""  # set: clients must present a certificate signed by this CA (mTLS)

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)

    def validate(self) -> None:
        require(bool(self.cert_file) == bool(self.key_file), "cert_file" if not self.cert_file else "key_file",
                "a TLS server needs both cert_file and key_file")
        require(not self.client_ca_file or self.enabled, "client_ca_file",
                "mTLS needs the server's own cert_file and key_file too")
        for key in ("cert_file", "key_file", "client_ca_file"):
            path = getattr(self, key)
            require(not path or Path(path).expanduser().is_file(), key, f"file {path!r} does not exist")


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` -> (host, port). An empty host (``:4317``) means all interfaces."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected host:port, got {text!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
