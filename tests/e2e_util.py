"""Helpers for the end-to-end tests that run a real Collector or Prometheus next to otel-ofu.

Missing tools skip the test with a message saying how to enable it, except under CI (the
``CI`` environment variable set), where they fail: CI must run these tests.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TypeVar

import pytest

from otel_ofu.core.model import MetricPoint
from otel_ofu.otlp import codec as otlp
from tools.ports import free_ports, port_open  # noqa: F401 (the tests import them from here)

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class GetServer:
    """A GET endpoint over real HTTP on 127.0.0.1, in a thread: ``respond(path, headers)`` gives the status,
    content type and body of each request. ``url`` is the base URL; use it as a context manager, or close()."""

    def __init__(self, respond: Callable[[str, Message], tuple[int, str, bytes]]):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                status, content_type, body = respond(self.path, self.headers)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> GetServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PageServer(GetServer):
    """Prometheus text pages over real HTTP, by path (404 for any other): a dcgm-exporter's or a
    training job's /metrics. ``url`` is the base URL; use it as a context manager, or close().
    A page given as a function is made anew for each request (counters that move scrape by scrape)."""

    def __init__(self, pages: dict[str, bytes | Callable[[], bytes]]):
        self.pages = dict(pages)
        super().__init__(self._page)

    def _page(self, path: str, headers: Message) -> tuple[int, str, bytes]:
        body = self.pages.get(path)
        if callable(body):
            body = body()
        return (200, PROMETHEUS_TEXT, body) if body is not None else (404, PROMETHEUS_TEXT, b"not found\n")

    def set(self, path: str, body: bytes | Callable[[], bytes]) -> None:
        """Serve ``body`` at ``path`` from the next request on (a page that changes between scrapes)."""
        self.pages[path] = body


def unavailable(message: str) -> None:
    """Skip locally; fail under CI."""
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set, so this is a failure, not a skip)")
    pytest.skip(message)


_built: dict[str, str] = {}


def built_tool(name: str, env: str, script: str, how: str, timeout: float = 3600) -> str:
    """$``env``, else the binary ``collector/<script>`` builds from Go modules (or finds in its cache):
    the last line of its stdout. Unavailable (skip, or fail under CI) with ``how`` when it cannot."""
    if os.environ.get(env):
        return os.environ[env]
    if script in _built:
        return _built[script]
    how = f"{how}, or set {env}"
    try:
        done = subprocess.run([str(ROOT / "collector" / script)], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        unavailable(f"{name} unavailable ({exc}): {how}")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not os.access(lines[-1], os.X_OK):
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        unavailable(f"{name} unavailable: {how}\n{tail}")
    _built[script] = lines[-1]
    return lines[-1]


def collector_binary() -> str:
    """otelcol-ofu built (or found in the cache) by collector/build.sh; $OTELCOL overrides."""
    return built_tool("otelcol-ofu", "OTELCOL", "build.sh", "run collector/build.sh (needs Go) to build the "
                      "otelcol-ofu Collector")


def prometheus3_binary() -> str:
    """Prometheus 3 (promtool beside it) built by collector/build-prometheus3.sh; $PROMETHEUS3 overrides."""
    return built_tool("Prometheus 3", "PROMETHEUS3", "build-prometheus3.sh", "run collector/build-prometheus3.sh "
                      "(needs Go) to build Prometheus 3 from Go modules")


def victoriametrics_binary() -> str:
    """VictoriaMetrics (vmalert beside it) built by collector/build-victoriametrics.sh; $VICTORIAMETRICS overrides."""
    return built_tool("VictoriaMetrics", "VICTORIAMETRICS", "build-victoriametrics.sh", "run "
                      "collector/build-victoriametrics.sh (needs Go) to build VictoriaMetrics and vmalert")


def prometheus_binary() -> str:
    found = os.environ.get("PROMETHEUS") or shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None)
    if not found:
        unavailable("prometheus not installed: run collector/install-prometheus.sh (Debian's package), "
                    "or set PROMETHEUS")
    return str(found)


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 120.0, interval: float = 0.2,
             diagnostics: Callable[[], str] = lambda: "") -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{diagnostics()}")
        time.sleep(interval)


def require_alive(*processes: Process) -> None:
    """Fail at once, with the logs, when a child process has exited (instead of waiting out a deadline)."""
    dead = [p for p in processes if not p.alive()]
    if dead:
        pytest.fail("exited early: " + ", ".join(f"{p.name} (rc {p.proc.returncode})" for p in dead) + "\n"
                    + "\n".join(p.tail() for p in processes))


def read_points(path: Path) -> list[MetricPoint]:
    """Gauge and sum points of an OTLP JSON-lines file (ours or the Collector's), skipping a partial last line."""
    if not path.exists():
        return []
    out: list[MetricPoint] = []
    for line in path.read_text().splitlines():
        if not line.strip().startswith('{"resourceMetrics"'):
            continue
        try:
            out += otlp.from_request(otlp.from_json_line(line))
        except ValueError:
            continue  # a line being written
    return out


class Process:
    """A child process with its output in a log file, stopped gently at the end.

    ``inherit=False``: only ``env`` and what runs Python at all (PATH, LANG, TMPDIR), as a
    container gets only its own environment: nothing of the test's shell leaks in.
    """

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str] | None = None,
                 inherit: bool = True):
        self.name, self.log = name, log
        self._file = open(log, "wb")
        base = os.environ if inherit else {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TMPDIR")}
        self.proc = subprocess.Popen(args, stdout=self._file, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**base, **(env or {})})

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} log ({self.log}) ---\n" + "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._file.close()
        return self.proc.returncode


def otel_ofu_command(config: Path) -> list[str]:
    return [sys.executable, "-m", "otel_ofu", "run", "--config", str(config)]
