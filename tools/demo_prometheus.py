"""The demo fleet's output in a real Prometheus, at the demo's own (simulated) times.

The demo (collector-config/demo.yaml: a simulated fleet with an MoE job whose MFU is
inflated, a 2.5x regression, a checkpointing job, a power-capped job, mixed precision and an
idle reservation) runs with time acceleration through the ``prometheus`` exporter; a real
Prometheus scrapes it often enough to keep every window. The exporter serves its points with
their timestamps (``send_timestamps: true``), so Prometheus stores the fleet's hour at the
fleet's times, not squeezed into the seconds it took: ``avg_over_time(...[5m])`` means five
minutes of fleet time, as it would on a real fleet. The simulation is set to start one span
before the wall clock, so the data ends about "now" and the TSDB head accepts all of it.

The file exporter records the same run, so ``otel-ofu report`` can be compared with what
Prometheus answers. Used by the dashboard tests and ``python -m tools.render_dashboards``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEMO_CONFIG = ROOT / "collector-config" / "demo.yaml"
CLUSTER = "demo"  # the target label standing in for the cluster label remote write / federation adds

log = logging.getLogger("tools.demo_prometheus")


class PrometheusError(RuntimeError):
    """Prometheus refused a query or could not be started."""


def prometheus_binary() -> str | None:
    """$PROMETHEUS, else prometheus on PATH (collector/install-prometheus.sh installs it)."""
    found = os.environ.get("PROMETHEUS") or shutil.which("prometheus")
    if not found and os.access("/usr/bin/prometheus", os.X_OK):
        found = "/usr/bin/prometheus"
    return found


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class Prometheus:
    """A running Prometheus's HTTP API."""

    url: str

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        url = f"{self.url}{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType')}: {body.get('error')} (query {params})")
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """An instant query: [{"metric": labels, "value": [t, "v"]}, ...] (vectors and scalars)."""
        data = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self._get("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{step:g}"})
        return data["result"]

    def label_values(self, label: str, match: str, start: float, end: float) -> list[str]:
        return self._get(f"/api/v1/label/{label}/values", {"match[]": match, "start": f"{start:.3f}",
                                                             "end": f"{end:.3f}"})

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False


@dataclass
class DemoData:
    prometheus: Prometheus
    start: float  # data time of the fleet's first window end (unix seconds)
    end: float  # data time of its last window end
    recording: Path  # the file exporter's OTLP JSON lines of the same run
    self_start: float  # wall time span of the self-telemetry (stamped when it is taken)
    self_end: float


def _demo_document(port: int, recording: Path, start_time: float, acceleration: float) -> dict[str, Any]:
    from otel_ofu.config import load_document

    doc = load_document(DEMO_CONFIG)
    sim = doc["receivers"]["sim"]
    sim["time_acceleration"] = acceleration
    sim["start_time"] = datetime.fromtimestamp(start_time, UTC).isoformat()
    doc["receivers"]["selftelemetry"] = {"collection_interval": "1s"}
    doc["exporters"] = {
        "prometheus": {"endpoint": f"127.0.0.1:{port}", "send_timestamps": True, "metric_expiration": "1h"},
        "file": {"path": str(recording)},
    }
    pipelines = doc["service"]["pipelines"]
    pipelines["metrics"]["exporters"] = ["prometheus", "file"]
    pipelines["metrics/self"] = {"receivers": ["selftelemetry"], "exporters": ["prometheus"]}
    return doc


def _wait(what: str, check, timeout: float, process: subprocess.Popen | None = None, log_file: Path | None = None):
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if process is not None and process.poll() is not None:
            tail = log_file.read_text(errors="replace")[-3000:] if log_file else ""
            raise PrometheusError(f"prometheus exited (rc {process.returncode}) while waiting for {what}\n{tail}")
        if time.monotonic() > deadline:
            raise PrometheusError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def demo_in_prometheus(workdir: Path, prometheus_bin: str, *, span_s: float = 3600.0, acceleration: float = 150.0,
                       scrape_interval_ms: int = 40) -> Iterator[DemoData]:
    """Run the demo for ``span_s`` of fleet time into a fresh Prometheus; yield it for queries.

    ``scrape_interval_ms`` x ``acceleration`` must stay below the demo's 10 s windows (here
    6 s), so every window is scraped at least once; a window scraped twice is one sample.
    """
    from otel_ofu import registry
    from otel_ofu.config import parse_service_config
    from otel_ofu.service import Service

    workdir.mkdir(parents=True, exist_ok=True)
    exporter_port, prometheus_port = _free_ports(2)
    recording = workdir / "demo.jsonl"
    window_s = 10.0
    wall_s = span_s / acceleration
    start_time = math.floor(time.time() - span_s - wall_s)
    doc = _demo_document(exporter_port, recording, start_time, acceleration)
    service = Service(parse_service_config(doc, str(DEMO_CONFIG), registry.factories()))

    interval = f"{scrape_interval_ms}ms"
    (workdir / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": "1m"},
        "scrape_configs": [{"job_name": "otel-ofu", "scrape_interval": interval, "scrape_timeout": interval,
                            "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"],
                                                "labels": {"cluster": CLUSTER}}]}],
    }))
    log_file = workdir / "prometheus.log"
    with open(log_file, "wb") as out:
        process = subprocess.Popen(
            [prometheus_bin, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}", "--storage.tsdb.retention.time=30d",
             "--query.lookback-delta=5m"],
            stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    api = Prometheus(f"http://127.0.0.1:{prometheus_port}")
    try:
        _wait("prometheus to be ready", api.ready, 60, process, log_file)
        self_start = time.time()
        service.start()
        sim = service.receivers["sim"]
        try:
            _wait("the simulated span", lambda: sim.fleet is not None and sim.fleet.t >= span_s,
                  wall_s * 4 + 60, process, log_file)
            time.sleep(0.5)  # a few more scrapes of the last windows
        finally:
            service.shutdown()
        self_end = time.time()
        time.sleep(0.5)
        yield DemoData(api, start_time + window_s, start_time + span_s, recording, self_start, self_end)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
