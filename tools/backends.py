"""The roads otel-ofu's metrics take into a Prometheus-compatible backend, each run for real.

One demo run (tools/demo_prometheus.py) feeds every road at once, so the backends hold the same
hour of the same fleet:

- ``exporter``: otel-ofu's ``prometheus`` exporter, scraped (its exposition recorded after each
  export and backfilled, as in tools/demo_prometheus.py), into Prometheus 3;
- ``collector_remote_write``: OTLP to a Collector (collector-config/otelcol-backend-prometheus.yaml)
  whose ``prometheus_remote_write`` exporter writes into Prometheus 3;
- ``collector_scrape``: the same Collector's ``prometheus`` exporter
  (collector-config/otelcol-backend-scrape.yaml), scraped at the end: its names and labels only
  (a scrape holds each series' latest point, not the hour);
- ``prometheus_otlp``: OTLP/HTTP straight into Prometheus 3's OTLP receiver, configured by
  deploy/backends/prometheus-otlp.yml;
- ``victoriametrics_otlp``: OTLP/HTTP straight into VictoriaMetrics with :data:`VICTORIAMETRICS_FLAGS`,
  its rules evaluated by vmalert (``-replay`` over the demo's hour).

docs/backends.md is the table of what each road produces and the settings; tests/test_backends.py
checks it against these servers.
"""

from __future__ import annotations

import contextlib
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml

from tools.demo_prometheus import (
    LOOKBACK,
    RULES,
    DemoData,
    Prometheus,
    PrometheusError,
    PrometheusServer,
    _stop,
    _wait,
    backfill_rules,
    exposition_in_prometheus,
    run_demo,
)
from tools.ports import free_ports

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS_OTLP_CONFIG = ROOT / "deploy" / "backends" / "prometheus-otlp.yml"
COLLECTOR_REMOTE_WRITE = ROOT / "collector-config" / "otelcol-backend-prometheus.yaml"
COLLECTOR_SCRAPE = ROOT / "collector-config" / "otelcol-backend-scrape.yaml"
# The alerts that read raw series (the PromQL fallbacks read recording rules: not in one replay).
ALERTS = ROOT / "deploy" / "prometheus" / "otel-ofu.alerts.yml"
# Prometheus 3 takes OTLP only with this flag (and serves it at /api/v1/otlp/v1/metrics).
PROMETHEUS_OTLP_FLAGS = ("--web.enable-otlp-receiver",)
# VictoriaMetrics: Prometheus names and labels for OTLP (gpu_ofu, host_name) instead of the OTLP
# ones (gpu.ofu, host.name); every resource attribute is a label by default.
VICTORIAMETRICS_FLAGS = ("-opentelemetry.usePrometheusNaming",)
ROADS = ("exporter", "collector_remote_write", "collector_scrape", "prometheus_otlp", "victoriametrics_otlp")


@dataclass(frozen=True)
class Binaries:
    prometheus: str  # Prometheus 3 (collector/build-prometheus3.sh), promtool beside it
    victoriametrics: str  # collector/build-victoriametrics.sh, vmalert beside it
    otelcol: str  # collector/build.sh

    @property
    def promtool(self) -> str:
        return str(Path(self.prometheus).with_name("promtool"))

    @property
    def vmalert(self) -> str:
        return str(Path(self.victoriametrics).with_name("vmalert"))


# The demo sends an hour of fleet time in seconds of wall time, beside self-telemetry stamped
# now: its first points arrive up to an hour behind the newest. A live fleet's are seconds behind.
TEST_OUT_OF_ORDER_WINDOW = "2h"


def prometheus_config(shipped: Path | None = None) -> str:
    """A test Prometheus's config: ``shipped`` (or nothing) with rules every 1m and the demo's
    out-of-order window."""
    config = yaml.safe_load(shipped.read_text()) if shipped else {}
    config.setdefault("global", {})["evaluation_interval"] = "1m"
    config.setdefault("storage", {}).setdefault("tsdb", {})["out_of_order_time_window"] = TEST_OUT_OF_ORDER_WINDOW
    return yaml.safe_dump(config)


class VictoriaMetrics:
    """A VictoriaMetrics single-node process on its own port and data folder."""

    def __init__(self, binary: str, workdir: Path, flags: tuple[str, ...] = VICTORIAMETRICS_FLAGS) -> None:
        self.binary, self.workdir, self.flags = binary, workdir, flags
        workdir.mkdir(parents=True, exist_ok=True)
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = Prometheus(self.url)
        self.process: subprocess.Popen | None = None

    def start(self) -> VictoriaMetrics:
        log_file = self.workdir / "victoria-metrics.log"
        with open(log_file, "ab") as out:
            # The test's own: no data hidden as "too recent" (the demo ends now), no cached answers
            # over data written into the past, and a series' last point seen for as long as the
            # Prometheus roads' lookback (VictoriaMetrics otherwise guesses it from the points' spacing).
            self.process = subprocess.Popen(
                [self.binary, f"-httpListenAddr=127.0.0.1:{self.port}", f"-storageDataPath={self.workdir / 'data'}",
                 "-retentionPeriod=100y", "-search.latencyOffset=0s", "-search.disableCache",
                 f"-search.minStalenessInterval={LOOKBACK}", f"-search.maxStalenessInterval={LOOKBACK}",
                 *self.flags],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir)
        _wait("victoria-metrics to be ready", self.ready, 60, self.process, log_file)
        return self

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def flush(self) -> None:
        """Make what was written searchable now (it is otherwise within a few seconds)."""
        with urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=30):
            pass

    def replay_rules(self, vmalert: str, start: float, end: float, rules: tuple[Path, ...] = (RULES, ALERTS)) -> None:
        """vmalert evaluates the rules over [start, end] (``-replay``) and writes them back: recorded
        series, and ALERTS for the alerting rules."""
        def rfc3339(t: float) -> str:
            return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        done = subprocess.run(
            [vmalert, *(f"-rule={r}" for r in rules), f"-datasource.url={self.url}", f"-remoteWrite.url={self.url}",
             f"-replay.timeFrom={rfc3339(start - 10)}", f"-replay.timeTo={rfc3339(end + 60)}",
             "-replay.disableProgressBar", "-replay.rulesDelay=0s", "-evaluationInterval=1m"],
            capture_output=True, text=True, timeout=600, cwd=self.workdir)
        if done.returncode != 0:
            raise PrometheusError(f"vmalert -replay failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        self.flush()

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)
            self.process = None


class Collector:
    """The otelcol-ofu Collector running the shipped backend configs together: their exporters side
    by side in one metrics pipeline (the Collector's own merge of several --config files would
    replace one pipeline's exporter list by the other's). Environment variables set as given."""

    def __init__(self, binary: str, workdir: Path, configs: list[Path], env: dict[str, str]) -> None:
        self.binary, self.workdir, self.configs, self.env = binary, workdir, configs, env
        self.process: subprocess.Popen | None = None

    def config(self) -> dict:
        merged: dict = {}
        for path in self.configs:
            config = yaml.safe_load(path.read_text())
            before = merged.get("service", {}).get("pipelines", {}).get("metrics", {})
            for section, body in config.items():
                merged.setdefault(section, {}).update(body)
            pipeline = merged["service"]["pipelines"]["metrics"]
            for key in ("processors", "exporters"):
                pipeline[key] = list(dict.fromkeys([*before.get(key, []), *pipeline.get(key, [])]))
        return merged

    def start(self) -> Collector:
        import os

        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "otelcol.yaml").write_text(yaml.safe_dump(self.config()))
        log_file = self.workdir / "otelcol.log"
        with open(log_file, "ab") as out:
            self.process = subprocess.Popen(
                [self.binary, f"--config=file:{self.workdir / 'otelcol.yaml'}"], stdout=out,
                stderr=subprocess.STDOUT, cwd=self.workdir, env={**os.environ, **self.env})
        return self

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)
            self.process = None


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def rules_server(binary: str, workdir: Path, live: PrometheusServer, promtool: str, start: float,
                 end: float) -> PrometheusServer:
    """A Prometheus that reads ``live``'s series (remote read) and holds the recording rules over
    [start, end]. Rule blocks cannot go into ``live`` itself: a Prometheus that starts with blocks
    drops the samples of its write-ahead log older than their end (what OTLP or remote write put
    there)."""
    config = yaml.safe_load(prometheus_config())
    config["remote_read"] = [{"url": f"{live.api.url}/api/v1/read", "read_recent": True}]
    server = PrometheusServer(binary, workdir, config=yaml.safe_dump(config)).start()
    backfill_rules(server, promtool, start, end)
    return server


@dataclass
class Roads:
    """Each road's backend with the demo's hour (and the recording rules, where shipped settings apply)."""

    demo: dict[str, DemoData]  # road -> data and rules, for the roads that carry the hour (ROADS less collector_scrape)
    live: dict[str, Prometheus]  # road -> the backend it wrote into, as a user's Grafana would query it
    collector_scrape: str  # the Collector's prometheus exporter's page at the demo's end
    # The OTLP roads without their settings, as a user who only points otel-ofu at them gets:
    prometheus_otlp_defaults: Prometheus
    victoriametrics_otlp_defaults: Prometheus


def _wait_port(port: int, process: subprocess.Popen | None, log_file: Path) -> None:
    from tools.ports import port_open

    _wait(f"port {port}", lambda: port_open(port), 60, process, log_file)


@contextlib.contextmanager
def demo_on_roads(workdir: Path, binaries: Binaries, *, span_s: float = 3600.0,
                  acceleration: float = 600.0) -> Iterator[Roads]:
    """Run the demo once into every road (module docstring) and yield the loaded backends."""
    with contextlib.ExitStack() as stack:
        def running(server):
            stack.callback(server.stop)
            return server.start()

        otlp = running(PrometheusServer(binaries.prometheus, workdir / "prometheus-otlp",
                                        config=prometheus_config(PROMETHEUS_OTLP_CONFIG), flags=PROMETHEUS_OTLP_FLAGS))
        otlp_defaults = running(PrometheusServer(binaries.prometheus, workdir / "prometheus-otlp-defaults",
                                                 config=prometheus_config(), flags=PROMETHEUS_OTLP_FLAGS))
        remote_write = running(PrometheusServer(binaries.prometheus, workdir / "prometheus-remote-write",
                                                config=prometheus_config(),
                                                flags=("--web.enable-remote-write-receiver",)))
        victoria = running(VictoriaMetrics(binaries.victoriametrics, workdir / "victoriametrics"))
        victoria_defaults = running(VictoriaMetrics(binaries.victoriametrics, workdir / "victoriametrics-defaults",
                                                    flags=()))
        grpc_port, scrape_port = free_ports(2)
        collector = running(Collector(
            binaries.otelcol, workdir / "otelcol", [COLLECTOR_REMOTE_WRITE, COLLECTOR_SCRAPE],
            {"OFU_BACKEND_GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
             "OFU_PROMETHEUS_WRITE_URL": f"{remote_write.api.url}/api/v1/write",
             "OFU_COLLECTOR_PROMETHEUS_ENDPOINT": f"127.0.0.1:{scrape_port}"}))
        _wait_port(grpc_port, collector.process, collector.workdir / "otelcol.log")
        # Retry long enough, and queue enough, that a busy machine loses nothing.
        delivery = {"retry_on_failure": {"max_elapsed_time": "120s"}, "sending_queue": {"queue_size": 100000}}
        # Neither OTLP backend takes logs: the events are not sent there (docs/backends.md).
        metrics_only = {"logs_endpoint": "none", **delivery}
        exporters = {
            "otlphttp/prometheus": {"endpoint": f"{otlp.api.url}/api/v1/otlp", **metrics_only},
            "otlphttp/prometheus_defaults": {"endpoint": f"{otlp_defaults.api.url}/api/v1/otlp", **metrics_only},
            "otlphttp/victoriametrics": {"endpoint": f"{victoria.url}/opentelemetry", **metrics_only},
            "otlphttp/victoriametrics_defaults": {"endpoint": f"{victoria_defaults.url}/opentelemetry", **metrics_only},
            "otlp/collector": {"endpoint": f"http://127.0.0.1:{grpc_port}", **delivery},
        }
        openmetrics, start, end, self_start, self_end = run_demo(workdir / "demo", span_s=span_s,
                                                                 acceleration=acceleration, exporters=exporters)
        last = max(end, self_end)
        page = scrape(f"http://127.0.0.1:{scrape_port}/metrics")
        collector.stop()  # flushes its remote write
        victoria_defaults.flush()
        otlp_rules = rules_server(binaries.prometheus, workdir / "prometheus-otlp-rules", otlp, binaries.promtool,
                                  start, last)
        stack.callback(otlp_rules.stop)
        remote_write_rules = rules_server(binaries.prometheus, workdir / "prometheus-remote-write-rules", remote_write,
                                          binaries.promtool, start, last)
        stack.callback(remote_write_rules.stop)
        victoria.flush()
        victoria.replay_rules(binaries.vmalert, start, last)
        exporter = stack.enter_context(exposition_in_prometheus(
            workdir / "prometheus-exporter", binaries.prometheus, binaries.promtool, openmetrics, start, last))
        recording = workdir / "demo" / "demo.jsonl"
        data = {name: DemoData(api, start, end, recording, self_start, self_end) for name, api in (
            ("exporter", exporter.api), ("collector_remote_write", remote_write_rules.api),
            ("prometheus_otlp", otlp_rules.api), ("victoriametrics_otlp", victoria.api))}
        live = {"exporter": exporter.api, "collector_remote_write": remote_write.api, "prometheus_otlp": otlp.api,
                "victoriametrics_otlp": victoria.api}
        yield Roads(data, live, page, otlp_defaults.api, victoria_defaults.api)


def series_names(api: Prometheus, start: float, end: float) -> dict[str, list[dict[str, str]]]:
    """Every series' labels by metric name over [start, end] (/api/v1/series)."""
    window = {"start": f"{start:.3f}", "end": f"{end:.3f}"}
    names = api._get("/api/v1/label/__name__/values", window)
    return {name: api._get("/api/v1/series", {"match[]": f'{{__name__="{name}"}}', **window}) for name in names}
