"""Every dashboard query against the demo's data in a real Prometheus.

The demo (collector-config/demo.yaml) runs accelerated through the prometheus exporter; its
samples and the backfilled recording rules are loaded into Debian's Prometheus
(tools/demo_prometheus.py). Each dashboard's queries then run as Grafana would, once with
every template variable set to a value from the data and once with "All": every query parses,
every panel returns series, and the fleet OFU panel agrees with `otel-ofu report` on the same
recording. Skipped locally without prometheus/promtool; failing under CI.
"""

from __future__ import annotations

import json

import pytest

from otel_ofu.report.build import build_report, report_json
from otel_ofu.report.command import _jobs_config
from tests.e2e_util import ROOT, prometheus_binary, unavailable
from tools import grafana_queries as gq
from tools.demo_prometheus import DemoData, PrometheusError, demo_in_prometheus, promtool_binary

DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
# Values to pick where the data has them: a job with a finding open, reported MFU and a known precision.
PREFER = {"job": "moe-236b", "namespace": "pretraining"}
# Targets the demo cannot fill, and why. Every panel still has to return series.
NO_DEMO_DATA = {
    "otel_ofu_pipeline_dropped_total": "no processor or exporter fails in the demo",
    "otel_ofu_scrape_up": "the demo's sim receiver scrapes no endpoint",
    'ofu_finding_kind="stalled"': "the demo has no hung job (the simulator's hung scenario is in "
                                  "tests/test_stalled.py; the Stalled GPUs panel's all-jobs line reads 0 here, and "
                                  "tests/test_dashboards.py::test_the_stalled_queries_count_a_stalled_jobs_gpus_once "
                                  "runs its queries on a stalled job)",
    '"clock boost (gained)"': "no model's GPUs of the demo boost above f_ref as a whole (some jobs' do, a little: "
                              "the job view's gain has data)",
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> DemoData:
    prometheus = prometheus_binary()
    promtool = promtool_binary(prometheus)
    if not promtool:
        unavailable("promtool not installed: run collector/install-prometheus.sh")
    with demo_in_prometheus(tmp_path_factory.mktemp("demo"), prometheus, promtool) as data:
        yield data


def time_range(dashboard: dict, demo: DemoData) -> gq.TimeRange:
    """The span each dashboard's data covers: fleet time, or wall time for the self-telemetry.

    Fleet views end two minutes before the demo's end: its last minute is the shutdown, when
    every job ends and its findings close (as when a real fleet's agents stop).
    """
    if dashboard["uid"] == "otel-ofu-self":
        return gq.TimeRange(demo.self_start, demo.self_end, 1.0, "2s")
    return gq.TimeRange(demo.start, demo.end - 120, 60.0, "1m")


@pytest.mark.parametrize("use_all", [False, True], ids=["a-value-each", "all"])
@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_query_parses_and_every_panel_returns_series(demo, path, use_all):
    dashboard = json.loads(path.read_text())
    window = time_range(dashboard, demo)
    values = gq.resolve_variables(demo.prometheus, dashboard, window, PREFER, use_all=use_all)
    if not use_all:
        assert all(v != gq.ALL for v in values.values())
    empty_panels, empty_targets = [], []
    for panel in gq.panels(dashboard):
        try:
            results = gq.run_panel(demo.prometheus, panel, values, window)
        except PrometheusError as exc:
            pytest.fail(f"{path.name} / {panel['title']}: {exc}")
        if not any(r.series for r in results):
            empty_panels.append(panel["title"])
        empty_targets += [f"{panel['title']}: {r.expr}" for r in results
                          if not r.series and not any(name in r.expr for name in NO_DEMO_DATA)]
    assert not empty_panels, f"panels without data: {empty_panels}"
    assert not empty_targets, f"queries without data: {empty_targets}"
    for name, series in gq.run_annotations(demo.prometheus, dashboard, values, window):
        assert series, f"annotation {name} found nothing"


def test_job_view_annotates_the_findings(demo):
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "otel-ofu-job.json").read_text())
    window = time_range(dashboard, demo)
    found = {}
    for job in ("moe-236b", "sft-debug-flag", "llama-70b-pretrain"):
        values = gq.resolve_variables(demo.prometheus, dashboard, window, {"job": job}, use_all=True)
        ((_, series),) = gq.run_annotations(demo.prometheus, dashboard, values, window)
        found[job] = {s["metric"]["ofu_finding_kind"] for s in series}
    assert found == {"moe-236b": {"mfu_gap"}, "sft-debug-flag": {"regression"}, "llama-70b-pretrain": set()}


def test_fleet_ofu_panel_matches_the_report_within_half_a_point(demo):
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "otel-ofu-fleet.json").read_text())
    window = gq.TimeRange(demo.start - 10, demo.end, 60.0, "1m")  # the whole recording
    values = gq.resolve_variables(demo.prometheus, dashboard, window, use_all=True)
    panel = next(p for p in gq.panels(dashboard) if p["title"] == "Fleet OFU")
    (result,) = gq.run_panel(demo.prometheus, panel, values, window)
    shown = float(result.series[0]["value"][1])
    report = report_json(build_report(demo.recording, _jobs_config(str(ROOT / "collector-config" / "demo.yaml"))))
    assert shown == pytest.approx(report["fleet"]["ofu_mean"], abs=0.005)
    assert abs(shown - report["fleet"]["job_ofu_mean"]) > 0.01  # the panel counts idle GPUs too, as it says


def test_gpus_without_ofu_shows_the_profiled_gpu_while_the_profiler_runs(demo):
    """demo.yaml: rank 0 of gpt-mixed-precision is profiled from 25 to 40 minutes in: blank TPA, no OFU."""
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "otel-ofu-fleet.json").read_text())
    panel = next(p for p in gq.panels(dashboard) if p["title"] == "GPUs without OFU")
    values = gq.resolve_variables(demo.prometheus, dashboard, time_range(dashboard, demo), use_all=True)
    counts = {}
    for minute in (20, 32, 50):
        at = gq.TimeRange(demo.start, demo.start + minute * 60, 60.0, "1m")
        (result,) = gq.run_panel(demo.prometheus, panel, values, at)
        counts[minute] = float(result.series[0]["value"][1])
    assert counts == {20: 0.0, 32: 1.0, 50: 0.0}


def test_the_recorded_exposition_stamps_each_point_in_the_millisecond_otlp_gives_it(tmp_path):
    """The demo's recorded exposition (the exporter road in tests/test_backends.py) must stamp a point
    in the millisecond Prometheus stores for the same point sent over OTLP: its nanoseconds cut to
    whole milliseconds (Prometheus' OTLP translator divides by 1e6). The exporter serves seconds as a
    float; a point in a millisecond's last half microsecond was recorded a millisecond later, and a
    2 s rate on the self-telemetry dashboard then differed between the roads (once in some runs)."""
    from otel_ofu.core.model import Batch, MetricPoint
    from otel_ofu.exporters.prometheus import PrometheusExporter, PrometheusExporterConfig
    from otel_ofu.pipeline.component import Context
    from otel_ofu.pipeline.config import build_config
    from tools.demo_prometheus import ExpositionRecorder

    exporter = PrometheusExporter(build_config(PrometheusExporterConfig, {
        "endpoint": "127.0.0.1:0", "send_timestamps": True, "metric_expiration": "1h"}), Context("prometheus"))
    exporter.clock = lambda: 1_796_159_225.0
    recorder = ExpositionRecorder()
    times = {"a": 1_796_159_224_123_999_600, "b": 1_796_159_224_124_000_000, "c": 1_796_159_224_124_000_400,
             "d": 1_796_159_224_124_999_999}
    for host, nanos in times.items():
        batch = Batch(points=[MetricPoint("gpu.ofu", 0.5, nanos, (("host.name", host),))])
        exporter.export(batch)
        recorder.record(exporter, batch)
    recorder.write(tmp_path / "demo.om")
    stamps = {line.split('host_name="')[1][0]: line.rsplit(" ", 1)[1]
              for line in (tmp_path / "demo.om").read_text().splitlines() if line.startswith("gpu_ofu{")}
    assert stamps == {host: f"{nanos // 10**9}.{nanos // 10**6 % 1000:03d}" for host, nanos in times.items()}
