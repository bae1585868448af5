"""Stopping otel-ofu as a user does (SIGTERM to `otel-ofu run`): bounded, and says what it lost.

Issue 11, item 3: with the backend down and the sending queue off, the final flush (job-end
metrics, then events) retried for the full ``max_elapsed_time`` each before the exporters were
told to stop, so Kubernetes killed the process. Now ``service.shutdown_timeout`` bounds it.
Also: a corrupt queue file must not stop the process from starting (no crash loop).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
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
