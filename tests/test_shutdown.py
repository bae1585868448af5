"""Stopping otel-ofu as a user does (SIGTERM to `otel-ofu run`): bounded, and says what it lost.

Issue 11, item 3: with the backend down and the sending queue off, the final flush (job-end
metrics, then events) retried for the full ``max_elapsed_time`` each before the exporters were
told to stop, so Kubernetes killed the process. Now ``service.shutdown_timeout`` bounds it.
Also: a corrupt queue file must not stop the process from starting (no crash loop).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from otlp_backends import GrpcBackend, free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
SHUTDOWN_TIMEOUT_S = 3


def _config(tmp_path: Path, port: int, exporter: str, service_extra: str = "") -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(f"""
receivers:
  sim:
    nodes: 1
    gpus_per_node: 2
    seed: 3
    time_acceleration: 60
    collection_interval: 10s
    jobs:
      - {{id: train-1, scenario: steady, gpus: 2, node: 0, mfu: 0.4, precision: bf16}}
processors:
  ofu: {{}}
  jobs:
    windows: [5m]
    job_timeout: 5m
exporters:
{exporter}
service:
{service_extra}
  pipelines:
    metrics:
      receivers: [sim]
      processors: [ofu, jobs]
      exporters: [otlp]
""")
    return config


def _start(config: Path, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
    return subprocess.Popen([sys.executable, "-m", "otel_ofu", "run", "--config", str(config)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))  # noqa: SIM115


def test_sigterm_with_backend_down_and_no_queue_stops_within_shutdown_timeout(tmp_path):
    port = free_port()  # nothing listens: the backend is down for the whole run
    exporter = f"""  otlp:
    endpoint: 127.0.0.1:{port}
    tls: {{insecure: true}}
    retry_on_failure: {{initial_interval: 1s, max_interval: 5s, max_elapsed_time: 300s}}
    sending_queue: {{enabled: false}}"""
    config = _config(tmp_path, port, exporter, f"  shutdown_timeout: {SHUTDOWN_TIMEOUT_S}s")
    log = tmp_path / "run.log"
    proc = _start(config, log)
    try:
        assert wait_until(lambda: "sending failed" in log.read_text() or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, log.read_text()
        stopping = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # A behaviour bound, not a speed target: shutdown_timeout is honoured (before the fix,
        # each of the flush's exports retried for max_elapsed_time, 300 s).
        assert proc.wait(timeout=SHUTDOWN_TIMEOUT_S + 30) == 0, log.read_text()[-3000:]
        took = time.monotonic() - stopping
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert took < SHUTDOWN_TIMEOUT_S + 30
    assert "job train-1 ended (shutdown)" in text  # the final flush ran
    assert "not sent before the shutdown deadline" in text or "shut down before they could be sent" in text, text
    summary = [line for line in text.splitlines() if "shut down without delivering" in line]
    assert summary and "metrics items" in summary[0] and "logs items" in summary[0], text[-3000:]


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_corrupt_queue_file_is_moved_aside_and_a_fresh_queue_started(tmp_path, damage):
    storage = tmp_path / "queue"
    storage.mkdir()
    queue_file = storage / "otlp.sqlite3"
    if damage == "garbage":
        queue_file.write_bytes(b"this is not a database" * 500)
    else:  # a real queue file cut short, as a full disk or a torn copy leaves it
        db = sqlite3.connect(queue_file)
        db.execute("CREATE TABLE queue (id INTEGER PRIMARY KEY AUTOINCREMENT, signal TEXT NOT NULL, "
                   "items INTEGER NOT NULL, payload BLOB NOT NULL, enqueued_unix_nano INTEGER NOT NULL)")
        for _n in range(200):
            db.execute("INSERT INTO queue (signal, items, payload, enqueued_unix_nano) VALUES ('metrics', 1, ?, 0)",
                       (os.urandom(3000),))
        db.commit()
        db.close()
        size = queue_file.stat().st_size
        with open(queue_file, "r+b") as handle:
            handle.truncate(size // 3)
            handle.seek(4096)
            handle.write(os.urandom(8192))
    backend = GrpcBackend().start()
    exporter = f"""  otlp:
    endpoint: {backend.endpoint}
    tls: {{insecure: true}}
    sending_queue: {{storage: {storage}}}"""
    log = tmp_path / "run.log"
    proc = _start(_config(tmp_path, backend.port, exporter), log)
    try:
        # Before the fix: "file is not a database" / "malformed" at start, exit 1, forever.
        assert wait_until(lambda: backend.point_counts() or proc.poll() is not None, timeout=60), log.read_text()
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        backend.stop()
    text = log.read_text()
    moved = sorted(storage.glob("otlp.sqlite3.corrupt-*"))
    assert moved, sorted(p.name for p in storage.iterdir())
    assert f"sending queue file {queue_file} cannot be read" in text and str(moved[0]) in text
    assert sqlite3.connect(queue_file).execute("SELECT COUNT(*) FROM queue").fetchone()[0] == 0  # fresh, drained


def test_a_healthy_queue_that_cannot_be_opened_is_kept_and_its_batches_sent_later(tmp_path):
    """A queue file that is fine but cannot be opened now (here: writes fail with EFBIG under
    RLIMIT_FSIZE, as on a full disk) is not "corrupt": before the fix it was moved aside as such and
    its batches were never sent. Now the run refuses to start, says why, and a later run sends them."""
    storage = tmp_path / "queue"
    queue_file = storage / "otlp.sqlite3"
    port = free_port()
    exporter = f"""  otlp:
    endpoint: 127.0.0.1:{port}
    tls: {{insecure: true}}
    retry_on_failure: {{initial_interval: 1s, max_interval: 1s, max_elapsed_time: 0s}}
    sending_queue: {{storage: {storage}, drain_timeout: 1s}}"""
    config = _config(tmp_path, port, exporter)
    log = tmp_path / "run.log"
    # 1. The backend is down: batches wait in the queue file, and stay there after a clean stop.
    proc = _start(config, log)
    try:
        assert wait_until(lambda: queue_file.exists() and _queued(queue_file) >= 3 or proc.poll() is not None,
                          timeout=60), log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    queued = _queued(queue_file)
    assert queued >= 3

    # 2. The file cannot be written now (WAL and shared-memory files cannot grow).
    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, resource.RLIM_INFINITY))

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
    done = subprocess.run([sys.executable, "-m", "otel_ofu", "run", "--config", str(config)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, preexec_fn=limit_file_size)
    assert not list(storage.glob("*.corrupt-*")), done.stderr[-3000:]  # before the fix: moved aside
    assert done.returncode == 1, done.stderr[-3000:]
    assert f"sending queue file {queue_file} cannot be opened" in done.stderr and "disk I/O error" in done.stderr, \
        done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert _queued(queue_file) == queued

    # 3. Once it can be opened again, the batches of the first run are sent.
    backend = GrpcBackend(port=port).start()
    proc = _start(config, log)
    try:
        assert wait_until(lambda: len(backend.metrics) >= queued or proc.poll() is not None, timeout=60), \
            log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        backend.stop()
    assert f"batches from a previous run are queued in {queue_file}" in log.read_text()


def _queued(queue_file: Path) -> int:
    """Batches in a queue file, read as another process would (a snapshot; the writer may be running)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{queue_file}?mode=ro", uri=True, timeout=5)) as db:
            return db.execute("SELECT COUNT(*) FROM queue").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


class _Unanswering:
    """A server that accepts connections and never answers (a hung kubelet or API server): every
    request to it waits for its client's own timeout."""

    def __init__(self, family: int, address):
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.bind(address)
        self.socket.listen(16)
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.accepted.append(connection)

    def close(self) -> None:
        self.socket.close()
        for connection in self.accepted:
            connection.close()


def test_sigterm_with_hung_attribution_sources_stops_within_shutdown_timeout(tmp_path):
    """A kubelet and an API server that accept connections and never answer, with request timeouts
    longer than the shutdown budget. Before, stopping waited up to 30 s for the attribution
    thread (blocked in the kubelet call) and then up to 30 s more for the pod watcher (blocked in
    its list), whatever service.shutdown_timeout said."""
    kubelet = _Unanswering(socket.AF_UNIX, str(tmp_path / "kubelet.sock"))
    api = _Unanswering(socket.AF_INET, ("127.0.0.1", 0))
    kubeconfig = tmp_path / "kubeconfig"
    server = f"https://127.0.0.1:{api.socket.getsockname()[1]}"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
""")
    config = tmp_path / "config.yaml"
    config.write_text(f"""
receivers:
  sim: {{nodes: 1, gpus_per_node: 2, time_acceleration: 60, collection_interval: 10s}}
processors:
  attribution:
    refresh_interval: 1s
    kubelet: {{enabled: true, socket: {tmp_path / "kubelet.sock"}, timeout: 120s}}
    kubernetes_api: {{enabled: true, node_name: gpu-node-1, kubeconfig: {kubeconfig}, request_timeout: 120s}}
  ofu: {{}}
exporters:
  file: {{path: {tmp_path / "out.jsonl"}}}
service:
  shutdown_timeout: {SHUTDOWN_TIMEOUT_S}s
  pipelines:
    metrics: {{receivers: [sim], processors: [attribution, ofu], exporters: [file]}}
""")
    log = tmp_path / "run.log"
    proc = _start(config, log)
    try:
        # Both requests are in flight (each server took its connection) and will not end by themselves.
        assert wait_until(lambda: (kubelet.accepted and api.accepted) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        # A behaviour bound with a generous margin, not a speed target: before the fix about 60 s.
        assert proc.wait(timeout=SHUTDOWN_TIMEOUT_S + 20) == 0, log.read_text()[-3000:]
    except subprocess.TimeoutExpired:
        pytest.fail(f"still stopping {SHUTDOWN_TIMEOUT_S + 20} s after SIGTERM (shutdown_timeout "
                    f"{SHUTDOWN_TIMEOUT_S}s):\n{log.read_text()[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
        kubelet.close()
        api.close()
