"""Makes the corpus' OTLP captures with the real programs (tests/data/real/README.md, "made").

    python -m tests.corpus_captures collector   # needs $OTELCOL or collector/build.sh
    python -m tests.corpus_captures sdk
    python -m tests.corpus_captures pages       # needs $OTELCOL (with its prometheus exporter), $PROMETHEUS3

``collector``: the OpenTelemetry Collector (otelcol-ofu) with its prometheus receiver scrapes
each dcgm-exporter page of the corpus, served over HTTP, one scrape job per page (named after
it), and its file exporter writes what it would forward; the first batch of each job is kept.
``sdk``: the project's training reporter (the OpenTelemetry SDK's OTLP/HTTP protobuf metric
exporter) sends one export to a local HTTP server; the request body is kept as it arrived.
``pages``: the Prometheus pages three translators write for that export: OpenTelemetry
Python's Prometheus exporter (behind the same reporter, served by prometheus_client), the
Collector's prometheus exporter (its otlp receiver given the SDK's request), and Prometheus
3's OTLP receiver (the request posted to /api/v1/otlp/v1/metrics, read back from /federate).
The tests read the kept files, and remake the Collector's when it is at hand.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from tests.e2e_util import PageServer, Process, collector_binary
from tools.ports import free_ports

REAL = Path(__file__).parent / "data" / "real"
PAGES = sorted((REAL / "dcgm-exporter").glob("*.prom"))
COLLECTOR_CAPTURE = REAL / "otlp" / "collector-prometheus-receiver.json"
SDK_CAPTURE = REAL / "otlp" / "sdk-training-reporter.http-protobuf.bin"
PAGES_DIR = REAL / "prometheus"
REPORT_ENV = {"K8S_POD_NAME": "llama3-70b-worker-0", "K8S_NAMESPACE": "training"}
REPORT_RESOURCE = {"host.name": "dgx-h100-017", "process.pid": 4242, "service.instance.id": "corpus-trainer-0"}
REPORT = {"mfu": 0.41, "tflops_per_gpu": 405.7}

def collector_config(receiver: dict, exporter: dict) -> str:
    """A Collector config of one metrics pipeline, receiver -> exporter, without a self-telemetry listener."""
    return yaml.safe_dump({
        "receivers": receiver, "exporters": exporter,
        "service": {"telemetry": {"metrics": {"level": "none"}},
                    "pipelines": {"metrics": {"receivers": list(receiver), "exporters": list(exporter)}}}})


def collector_capture(otelcol: str, pages: list[Path], workdir: Path, timeout_s: float = 60.0) -> list[str]:
    """One OTLP JSON request per page: the first batch the Collector wrote for its scrape job."""
    out = workdir / "out.json"
    with PageServer({f"/{page.stem}/metrics": page.read_bytes() for page in pages}) as server:
        jobs = [{"job_name": page.stem, "scrape_interval": "1s", "metrics_path": f"/{page.stem}/metrics",
                 "static_configs": [{"targets": [f"127.0.0.1:{server.port}"]}]} for page in pages]
        config = workdir / "otelcol.yaml"
        config.write_text(collector_config({"prometheus": {"config": {"scrape_configs": jobs}}},
                                           {"file": {"path": str(out)}}))
        proc = Process("otelcol", [otelcol, f"--config=file:{config}"], workdir / "otelcol.log")
        try:
            found: dict[str, str] = {}
            deadline = time.monotonic() + timeout_s
            while len(found) < len(pages) and time.monotonic() < deadline and proc.alive():
                time.sleep(0.5)
                found = _first_batch_by_job(out)
        finally:
            proc.stop()
    if len(found) < len(pages):
        raise RuntimeError(f"the Collector forwarded {sorted(found)} of {len(pages)} pages\n{proc.tail()}")
    return [found[page.stem] for page in pages]


def _first_batch_by_job(out: Path) -> dict[str, str]:
    """Each scrape job's first request in the file exporter's output, as one JSON line."""
    found: dict[str, str] = {}
    if not out.exists():
        return found
    for line in out.read_text().splitlines():
        try:
            request = json.loads(line)
        except ValueError:
            continue  # a line being written
        for rm in request.get("resourceMetrics", []):
            job = next((a["value"].get("stringValue") for a in rm.get("resource", {}).get("attributes", [])
                        if a["key"] == "service.name"), None)
            if job and job not in found:
                found[job] = json.dumps({"resourceMetrics": [rm]}, separators=(",", ":"))
    return found


def sdk_capture() -> bytes:
    """The body of one OTLP/HTTP export by the training reporter (the SDK's own exporter)."""
    from otel_ofu.training.report import start_mfu_reporter

    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    (port,) = free_ports(1)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reporter = start_mfu_reporter(endpoint=f"http://127.0.0.1:{port}/v1/metrics", protocol="http/protobuf",
                                      export_interval_s=3600, environ=REPORT_ENV, resource=REPORT_RESOURCE)
        reporter.report(**REPORT)
        reporter.flush()
        reporter.shutdown()
    finally:
        server.shutdown()
        server.server_close()
    if not bodies:
        raise RuntimeError("the reporter sent nothing")
    return bodies[0]


def python_exporter_page() -> bytes:
    """The page opentelemetry-exporter-prometheus serves for the reporter (prometheus_client's HTTP server)."""
    import urllib.request

    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    from otel_ofu.training.report import MfuReporter, _resource

    registry = CollectorRegistry()
    reporter = MfuReporter(PrometheusMetricReader(registry=registry), _resource(REPORT_RESOURCE, REPORT_ENV))
    (port,) = free_ports(1)
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        reporter.report(**REPORT)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return _only_report_families(response.read())
    finally:
        server.shutdown()
        server.server_close()
        reporter.shutdown()


def _only_report_families(page: bytes) -> bytes:
    """The page without prometheus_client's own process_* and python_* families (they change per run)."""
    keep: list[str] = []
    for line in page.decode().splitlines():
        name = line.split()[2] if line.startswith("# ") and len(line.split()) > 2 else line.split("{")[0].split(" ")[0]
        if not name.startswith(("process_", "python_")):
            keep.append(line)
    return ("\n".join(keep) + "\n").encode()


def collector_exporter_page(otelcol: str, body: bytes, workdir: Path) -> bytes:
    """The Collector's prometheus exporter's page after its otlp receiver got ``body``."""
    otlp_port, page_port = free_ports(2)
    config = workdir / "otelcol-prometheus.yaml"
    config.write_text(collector_config({"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{otlp_port}"}}}},
                                       {"prometheus": {"endpoint": f"127.0.0.1:{page_port}"}}))
    proc = Process("otelcol", [otelcol, f"--config=file:{config}"], workdir / "otelcol-prometheus.log")
    try:
        _post_until_taken(f"http://127.0.0.1:{otlp_port}/v1/metrics", body, proc)
        return _get(f"http://127.0.0.1:{page_port}/metrics")
    finally:
        proc.stop()


def prometheus3_federate_page(prometheus: str, body: bytes, workdir: Path) -> bytes:
    """What Prometheus 3 stored from ``body`` (its OTLP receiver, default translation), read from /federate."""
    import urllib.parse

    (port,) = free_ports(1)
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n")
    proc = Process("prometheus", [prometheus, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                                  f"--web.listen-address=127.0.0.1:{port}", "--web.enable-otlp-receiver"],
                   workdir / "prometheus.log")
    try:
        _post_until_taken(f"http://127.0.0.1:{port}/api/v1/otlp/v1/metrics", body, proc)
        query = urllib.parse.urlencode({"match[]": '{__name__=~"training.*"}'})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            page = _get(f"http://127.0.0.1:{port}/federate?{query}")
            if page.strip():
                return page
            time.sleep(0.5)
        raise RuntimeError(f"Prometheus stored nothing\n{proc.tail()}")
    finally:
        proc.stop()


def _post_until_taken(url: str, body: bytes, proc: Process, timeout_s: float = 30.0) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        request = urllib.request.Request(url, body, {"Content-Type": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(request, timeout=5):
                return
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline or not proc.alive():
                raise RuntimeError(f"{url} took no export\n{proc.tail()}") from None
            time.sleep(0.3)


def _get(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def main(argv: list[str]) -> int:
    what = argv[1] if len(argv) > 1 else ""
    if what == "collector":
        with tempfile.TemporaryDirectory() as tmp:
            lines = collector_capture(collector_binary(), PAGES, Path(tmp))
        COLLECTOR_CAPTURE.parent.mkdir(parents=True, exist_ok=True)
        COLLECTOR_CAPTURE.write_text("\n".join(lines) + "\n")
        print(COLLECTOR_CAPTURE)
    elif what == "pages":
        import os

        body = sdk_capture()  # afresh: Prometheus' /federate shows only the last 5 minutes (its lookback)
        PAGES_DIR.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            work, otelcol, prometheus = Path(tmp), os.environ["OTELCOL"], os.environ["PROMETHEUS3"]
            pages = {"opentelemetry-python-exporter.prom": python_exporter_page(),
                     "otelcol-prometheus-exporter.prom": collector_exporter_page(otelcol, body, work),
                     "prometheus-3-otlp-federate.prom": prometheus3_federate_page(prometheus, body, work)}
        for name, page in pages.items():
            (PAGES_DIR / name).write_bytes(page)
            print(PAGES_DIR / name)
    elif what == "sdk":
        SDK_CAPTURE.parent.mkdir(parents=True, exist_ok=True)
        SDK_CAPTURE.write_bytes(sdk_capture())
        print(SDK_CAPTURE)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
