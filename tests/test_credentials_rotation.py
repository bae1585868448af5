"""Credential files rotated under a running receiver and exporter: used without a restart.

Secret managers (Kubernetes secrets, cert-manager, Vault agents) replace token and certificate
files in place. The otlp receiver and the otlp/otlphttp exporters notice (WatchedFiles, checked
at most once a second) and use the new files for the next request or connection.
"""

from __future__ import annotations

import os
import shutil
import ssl
from pathlib import Path

import grpc
import pytest
from otlp_backends import GrpcBackend, HttpBackend, gpu_points, triples, wait_until
from test_receiver_otlp import GPUS, T0, Live, grpc_export, http_post

from otel_ofu.core.model import Batch
from otel_ofu.exporters import otlp as otlp_exporter
from otel_ofu.exporters import otlphttp as otlphttp_exporter
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.pipeline.telemetry import Telemetry
from tests import certs
from tests.otlp_shapes import dcgm_exporter_request


def body(t0: int = T0) -> bytes:
    return dcgm_exporter_request(GPUS, t0).SerializeToString()


# --- the receiver ---------------------------------------------------------------------------


def _replace(target: Path, source: Path) -> None:
    """As a secret manager does: write beside, then rename over (atomic)."""
    tmp = target.with_name(target.name + ".new")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def test_a_rotated_token_file_takes_effect_without_a_restart(tmp_path):
    token = tmp_path / "token"
    token.write_text("first-token\n")
    item = Live({"auth": {"bearer_token_file": str(token)}})
    try:
        old, new = [("authorization", "Bearer first-token")], [("authorization", "Bearer second-token")]
        assert grpc_export(item.grpc_target, body(), metadata=old)[0] == grpc.StatusCode.OK
        (tmp_path / "rotated").write_text("second-token\n")
        _replace(token, tmp_path / "rotated")
        assert wait_until(lambda: grpc_export(item.grpc_target, body(), metadata=new)[0] == grpc.StatusCode.OK)
        assert grpc_export(item.grpc_target, body(), metadata=old)[0] == grpc.StatusCode.UNAUTHENTICATED
        assert http_post(item.receiver.http_port, body(), headers={"Authorization": "Bearer second-token"})[0] == 200
        assert http_post(item.receiver.http_port, body(), headers={"Authorization": "Bearer first-token"})[0] == 401
    finally:
        item.receiver.shutdown()


@pytest.fixture
def two_cert_sets(tmp_path):
    if not certs.available():
        pytest.skip("needs the cryptography package or the openssl command to make test certificates")
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    return certs.make(first), certs.make(second)


def test_rotated_server_certificates_take_effect_without_a_restart(tmp_path, two_cert_sets):
    old, new = two_cert_sets
    live_dir = tmp_path / "live"
    live_dir.mkdir()
    cert, key = live_dir / "server.pem", live_dir / "server.key"
    shutil.copyfile(old.server_cert, cert)
    shutil.copyfile(old.server_key, key)
    tls = {"cert_file": str(cert), "key_file": str(key)}
    item = Live({"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "tls": tls},
                               "http": {"endpoint": "127.0.0.1:0", "tls": tls}}})

    def grpc_ok(ca: Path) -> bool:
        creds = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
        return grpc_export(item.grpc_target, body(), credentials=creds)[0] == grpc.StatusCode.OK

    def http_ok(ca: Path) -> bool:
        try:
            return http_post(item.receiver.http_port, body(), context=ssl.create_default_context(cafile=str(ca)))[0] \
                == 200
        except (ssl.SSLError, OSError):
            return False

    try:
        assert grpc_ok(old.ca) and http_ok(old.ca)
        _replace(key, new.server_key)
        _replace(cert, new.server_cert)
        assert wait_until(lambda: grpc_ok(new.ca)) and wait_until(lambda: http_ok(new.ca))
        assert not http_ok(old.ca) and not grpc_ok(old.ca)  # the old certificate is no longer served
    finally:
        item.receiver.shutdown()


# --- the exporters ---------------------------------------------------------------------------


def make_exporter(protocol: str, endpoint: str, **extra):
    factory = otlp_exporter.FACTORY if protocol == "grpc" else otlphttp_exporter.FACTORY
    data = {"endpoint": endpoint, "compression": "none",
            "retry_on_failure": {"initial_interval": "50ms", "max_interval": "200ms", "max_elapsed_time": 0},
            "sending_queue": {"num_consumers": 1, "queue_size": 100}, **extra}
    exporter = factory.create(build_config(factory.config_type, data), Context("otlp/rot", Telemetry()))
    exporter.start()
    return exporter


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_exporter_sends_the_rotated_token(protocol, tmp_path):
    token = tmp_path / "token"
    token.write_text("first-token\n")
    backend = (GrpcBackend() if protocol == "grpc" else HttpBackend()).start()
    extra = {"tls": {"insecure": True}} if protocol == "grpc" else {}
    exporter = make_exporter(protocol, backend.endpoint, bearer_token_file=str(token), **extra)
    try:
        exporter.export(Batch(points=gpu_points(gpus=1, windows=1)))
        assert wait_until(lambda: len(backend.headers) == 1)
        assert backend.headers[0]["authorization"] == "Bearer first-token"
        (tmp_path / "rotated").write_text("second-token\n")
        _replace(token, tmp_path / "rotated")
        window = [1]

        def sent_with_new_token() -> bool:
            exporter.export(Batch(points=gpu_points(gpus=1, windows=1, t0=T0 + window[0] * 10**10)))
            window[0] += 1
            return wait_until(lambda: len(backend.headers) == window[0], timeout=30) and \
                backend.headers[-1]["authorization"] == "Bearer second-token"

        assert wait_until(sent_with_new_token, timeout=30, interval=0.3)
    finally:
        exporter.shutdown()
        backend.stop()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_exporter_trusts_a_rotated_ca_file(protocol, tmp_path, two_cert_sets):
    """The backend moves to a certificate from a new CA; the exporter's ca_file is rotated to match."""
    old, new = two_cert_sets
    ca = tmp_path / "ca.pem"
    shutil.copyfile(old.ca, ca)

    def start(cert_set, port=None):
        if protocol == "grpc":
            creds = grpc.ssl_server_credentials([(cert_set.server_key.read_bytes(),
                                                  cert_set.server_cert.read_bytes())])
            return GrpcBackend(port, credentials=creds).start()
        return HttpBackend(port, tls=(str(cert_set.server_cert), str(cert_set.server_key))).start()

    backend = start(old)
    endpoint = backend.endpoint if protocol == "http" else f"https://{backend.endpoint}"
    exporter = make_exporter(protocol, endpoint, tls={"ca_file": str(ca)})
    try:
        first = gpu_points(gpus=1, windows=1)
        exporter.export(Batch(points=first))
        assert wait_until(lambda: backend.point_counts() == triples(first))
        backend.stop()
        backend = start(new, backend.port)  # same address, certificate from the new CA
        _replace(ca, new.ca)
        second = gpu_points(gpus=1, windows=1, t0=T0 + 10**10)
        exporter.export(Batch(points=second))
        # Before: the exporter kept the old CA and retried the handshake forever.
        assert wait_until(lambda: backend.point_counts() == triples(second), timeout=60)
    finally:
        exporter.shutdown()
        backend.stop()
