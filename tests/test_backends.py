"""The roads into a Prometheus-compatible backend (docs/backends.md).

Names first: otel-ofu declares units so that every road's standard Prometheus translation names
its metrics as the dashboards and rules read them.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from otel_ofu.cli import main as cli
from otel_ofu.core import metrics
from otel_ofu.pipeline import registry
from tests.e2e_util import (
    ROOT,
    Process,
    collector_binary,
    otel_ofu_command,
    prometheus3_binary,
    require_alive,
    victoriametrics_binary,
    wait_for,
)
from tools import backends
from tools import grafana_queries as gq
from tools.backends import ALERTS
from tools.demo_prometheus import RULES, PrometheusServer
from tools.ports import free_ports


def test_no_metric_is_declared_unit_1_so_no_road_adds_ratio():
    """A gauge of unit "1" becomes NAME_ratio on Prometheus 3's OTLP receiver, VictoriaMetrics'
    Prometheus naming and the Collector's exporters: dashboards reading NAME find nothing there."""
    registry.factories()  # the components register their metrics on import
    unit_1 = sorted(name for name, info in metrics.METRICS.items() if info.unit == "1")
    assert not unit_1, f"declare a ratio {{ratio}} (a count {{item}}, a state {{state}}): {unit_1}"


# --- every road, for real: one demo run into each backend (tools/backends.py) --------------------

DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
OTHER_ROADS = [road for road in backends.ROADS if road not in ("exporter", "collector_scrape")]
# Labels a road adds about the transport, not the GPU: left out when answers are compared.
TRANSPORT_LABELS = {"__name__", "job", "instance", "scope_name", "scope_version", "otel_scope_name",
                    "otel_scope_version", "otel_scope_schema_url", "service_name", "service_version",
                    "service_namespace"}
PREFER = {"job": "moe-236b"}


@pytest.fixture(scope="module")
def roads(tmp_path_factory) -> backends.Roads:
    binaries = backends.Binaries(prometheus3_binary(), victoriametrics_binary(), collector_binary())
    with backends.demo_on_roads(tmp_path_factory.mktemp("roads"), binaries) as found:
        yield found


def answers(api, expr: str, target: dict, window: gq.TimeRange) -> dict[frozenset, list[float]]:
    """A query's result as {labels without transport labels: values} (one value, or one per step)."""
    if target.get("instant"):
        series = api.query(expr, window.end)
        return {_key(s["metric"]): [float(s["value"][1])] for s in series}
    series = api.query_range(expr, window.start, window.end, window.step)
    return {_key(s["metric"]): [float(v) for _, v in s["values"]] for s in series}


def _key(labels: dict[str, str]) -> frozenset:
    return frozenset((k, v) for k, v in labels.items() if k not in TRANSPORT_LABELS)


@dataclass(frozen=True)
class Agreement:
    """How close a road's answers must be to the exporter road's.

    Prometheus 3 roads: the same engine on the same points: the same values.
    VictoriaMetrics: MetricsQL, not PromQL: a window can count a series' last point a step longer
    when the series ends (a GPU's previous precision), and rate() does not extrapolate to the
    window's edges; so the same series, and over the hour the same answers within 2 %.
    """

    rel: float  # per value (Prometheus) or per hour total or mean (VictoriaMetrics)
    per_step: bool  # compare every step of a range query, else each series' mean
    rate_rel: float | None  # for rate(): per value, or None: only which series answer


# MetricsQL's increase() also takes the point before its window: when a GPU's windows stop being
# dropped, VictoriaMetrics counts it "without OFU" a minute or two longer (19 GPU minutes vs 21 in
# the demo's hour).
VICTORIAMETRICS_RULE_REL = {"cluster_namespace_model_reason:gpus_without_ofu:count": 0.15}
AGREEMENT = {"collector_remote_write": Agreement(1e-6, True, 1e-6), "prometheus_otlp": Agreement(1e-6, True, 1e-6),
             "victoriametrics_otlp": Agreement(2e-2, False, None)}


def _same(a: dict[frozenset, list[float]], b: dict[frozenset, list[float]], agreement: Agreement,
          rate: bool = False) -> str:
    """'' when a and b hold the same series and values (as ``agreement`` says), else what differs."""
    if a.keys() != b.keys():
        only_a, only_b = [dict(k) for k in a.keys() - b.keys()], [dict(k) for k in b.keys() - a.keys()]
        return f"series only on the exporter road: {only_a[:3]}, only here: {only_b[:3]}"
    rel = agreement.rate_rel if rate else agreement.rel
    if rel is None:
        return ""
    for key, values in a.items():
        other = b[key]
        if not agreement.per_step:
            values, other = [sum(values) / len(values)], [sum(other) / len(other)]
        if len(values) != len(other):
            return f"{dict(key)}: {len(values)} values vs {len(other)}"
        for i, (x, y) in enumerate(zip(values, other, strict=True)):
            if not math.isclose(x, y, rel_tol=rel, abs_tol=1e-9):
                return f"{dict(key)}: value {i} of {len(values)}: {x} vs {y}"
    return ""


# Recording rules computed with rate(): a query that reads one is a rate too (MetricsQL's rate does not extrapolate).
RATE_RULES = {r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
              if "record" in r and "rate(" in r["expr"]}


def reads_a_rate(expr: str) -> bool:
    return "rate(" in expr or any(name in expr for name in RATE_RULES)


def windows(dashboard: dict, demo) -> gq.TimeRange:
    if dashboard["uid"] == "otel-ofu-self":
        return gq.TimeRange(math.floor(demo.self_start), math.ceil(demo.self_end), 1.0, "2s")
    start = math.ceil(demo.start / 60) * 60  # on the step, so every engine evaluates at the same times
    return gq.TimeRange(start, start + math.floor((demo.end - 120 - start) / 60) * 60, 60.0, "1m")


@pytest.mark.parametrize("road", OTHER_ROADS)
@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_dashboard_query_answers_alike_on_every_road(roads, road, path):
    """Each panel's query returns the same series and values (within rounding) as on the exporter road."""
    dashboard = json.loads(path.read_text())
    reference, here = roads.demo["exporter"], roads.demo[road]
    window = windows(dashboard, reference)
    values = gq.resolve_variables(reference.prometheus, dashboard, window, PREFER, use_all=True)
    differ, compared = [], 0
    for panel in gq.panels(dashboard):
        for target in panel.get("targets", []):
            expr = gq.substitute(target["expr"], values, window)
            expected = answers(reference.prometheus, expr, target, window)
            found = answers(here.prometheus, expr, target, window)
            compared += bool(expected)
            if problem := _same(expected, found, AGREEMENT[road], reads_a_rate(expr)):
                differ.append(f"{panel['title']}: {expr[:90]}\n    {problem}")
    assert compared, "the exporter road answered nothing"
    assert not differ, f"{len(differ)} queries answer otherwise on {road}:\n" + "\n".join(differ)


@pytest.mark.parametrize("road", OTHER_ROADS)
def test_every_recording_rule_answers_alike_on_every_road(roads, road):
    reference, here = roads.demo["exporter"], roads.demo[road]
    window = gq.TimeRange(math.ceil(reference.start / 60) * 60 + 300, math.floor(reference.end / 60) * 60 - 120, 60.0,
                          "1m")
    rules = [r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "record" in r]
    agreement, differ = AGREEMENT[road], []
    for name in rules:
        expected = answers(reference.prometheus, name, {}, window)
        found = answers(here.prometheus, name, {}, window)
        assert expected, f"{name}: nothing on the exporter road"
        if not agreement.per_step and expected.keys() == found.keys():
            # The same series: then the hour's total over all of them (GPU hours, wasted GPU hours, ...).
            expected, found = ({frozenset(): [sum(map(sum, x.values()))]} for x in (expected, found))
        rule_agreement = agreement
        if road == "victoriametrics_otlp" and name in VICTORIAMETRICS_RULE_REL:
            rule_agreement = Agreement(VICTORIAMETRICS_RULE_REL[name], False, None)
        if problem := _same(expected, found, rule_agreement):
            differ.append(f"{name}: {problem}")
    assert not differ, "\n".join(differ)


def firing(api, alert: dict, demo) -> set[str]:
    """The ofu_job_id values ``alert`` fires for during the demo: its expression true at every 1m
    evaluation for its ``for`` duration, as the rule manager decides."""
    hold = int(str(alert.get("for", "0m")).removesuffix("m"))
    series = api.query_range(alert["expr"], math.ceil(demo.start / 60) * 60, math.floor(demo.end / 60) * 60, 60)
    out = set()
    for s in series:
        times = [float(t) for t, _ in s["values"]]
        run = 1
        for before, t in zip(times, times[1:], strict=False):
            run = run + 1 if t - before == 60 else 1
            if run > hold:
                out.add(s["metric"].get("ofu_job_id", ""))
    return out


@pytest.mark.parametrize("road", ["exporter", *OTHER_ROADS])
def test_the_regression_alert_fires_for_the_regressed_job_on_every_road(roads, road):
    """demo.yaml: sft-debug-flag runs 2.5x slower from 20m to 50m; OfuJobRegression fires for it alone."""
    (alert,) = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]
                if r.get("alert") == "OfuJobRegression"]
    assert firing(roads.demo[road].prometheus, alert, roads.demo[road]) == {"sft-debug-flag"}


def test_vmalert_fires_the_regression_alert_on_victoriametrics(roads):
    """vmalert itself (its -replay over the hour) raised the alert: ALERTS in VictoriaMetrics."""
    demo = roads.demo["victoriametrics_otlp"]
    found = demo.prometheus.query_range('ALERTS{alertname="OfuJobRegression", alertstate="firing"}',
                                        demo.start, demo.end, 60)
    assert {s["metric"]["ofu_job_id"] for s in found} == {"sft-debug-flag"}


# --- the table in docs/backends.md, cell by cell ------------------------------------------------

DOC = ROOT / "docs" / "backends.md"
# The table's columns -> where the test finds that road's series.
COLUMNS = {
    "otel-ofu `prometheus`": lambda roads: roads.live["exporter"],
    "Collector `prometheus`": lambda roads: roads.collector_scrape,
    "Collector `prometheus_remote_write`": lambda roads: roads.live["collector_remote_write"],
    "Prometheus 3 OTLP, defaults": lambda roads: roads.prometheus_otlp_defaults,
    "Prometheus 3 OTLP, settings": lambda roads: roads.live["prometheus_otlp"],
    "VictoriaMetrics OTLP, defaults": lambda roads: roads.victoriametrics_otlp_defaults,
    "VictoriaMetrics OTLP, settings": lambda roads: roads.live["victoriametrics_otlp"],
}


def roads_table() -> tuple[list[str], list[list[str]]]:
    text = DOC.read_text()
    body = text[text.index("<!-- roads-table"):text.index("<!-- /roads-table -->")]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in body.splitlines() if line.startswith("|") and not line.startswith("|---")]
    return rows[0], rows[1:]


def held(source, demo) -> dict[str, list[dict[str, str]]]:
    """Series labels by name: from a backend's API over the demo's span, or a scraped page."""
    if isinstance(source, str):
        out: dict[str, list[dict[str, str]]] = {}
        for family in text_string_to_metric_families(source):
            for sample in family.samples:
                out.setdefault(sample.name, []).append(dict(sample.labels))
        return out
    return backends.series_names(source, demo.start - 60, max(demo.end, demo.self_end) + 60)


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_roads_table_is_what_each_road_produces(roads):
    header, rows = roads_table()
    assert header[1:] == list(COLUMNS), "docs/backends.md's road columns changed: update COLUMNS"
    demo = roads.demo["exporter"]
    wrong = []
    for column, source in COLUMNS.items():
        series = held(source(roads), demo)
        at = header.index(column)
        gpu_name = ticked(rows[0][at])[0]  # the first row is gpu.ofu
        self_name = next(ticked(r[at])[0] for r in rows if "otel_ofu.receiver.accepted" in r[0])
        for row in rows:
            cell, what = row[at], row[0]
            if what.startswith("resource"):
                name = gpu_name if "on `gpu.ofu`" in what else self_name
                labels = set().union(*(s.keys() for s in series.get(name, [])))
                if cell.startswith("none"):
                    ok = not any(a.replace(".", "_") in labels or a in labels for a in ticked(what)[:3]) \
                        and "target_info" in series
                elif cell.endswith("only"):
                    ok = set(ticked(cell)) <= labels and not any(a.replace(".", "_") in labels for a in ticked(what))
                else:
                    ok = set(ticked(cell)) <= labels
                if not ok:
                    wrong.append(f"{column} / {what}: table says {cell!r}, labels of {name}: {sorted(labels)}")
            elif ticked(cell)[0] not in series:
                near = sorted(n for n in series if ticked(what)[0].split(".")[-1] in n)
                wrong.append(f"{column} / {what}: table says {cell!r}, the road has {near}")
    assert not wrong, "\n".join(wrong)


def test_the_shipped_settings_are_the_ones_the_roads_ran_with():
    text = DOC.read_text()
    for flag in backends.VICTORIAMETRICS_FLAGS + backends.PROMETHEUS_OTLP_FLAGS:
        assert flag in text
    otlp = yaml.safe_load(backends.PROMETHEUS_OTLP_CONFIG.read_text())["otlp"]
    for key, value in otlp.items():
        assert f"{key}: {str(value).lower() if isinstance(value, bool) else value}" in text, key


# --- otel-ofu doctor --backend against the real servers, configured right and wrong -------------

def doctor(url: str, capsys) -> tuple[int, dict]:
    code = cli.main(["doctor", "--backend", url, "--lookback", "7200", "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("road", ["prometheus_otlp", "victoriametrics_otlp", "collector_remote_write"])
def test_doctor_passes_a_backend_with_the_settings(roads, road, capsys):
    code, report = doctor(roads.live[road].url, capsys)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert code == 0 and report["ok"], report
    assert statuses["names"] == statuses["labels"] == statuses["unit suffixes"] == "ok"
    assert statuses["job metrics"] == statuses["self-telemetry"] == "ok"
    # vmalert wrote the rules into VictoriaMetrics; the Prometheus roads' rules live beside them.
    assert statuses["recording rules"] == ("ok" if road == "victoriametrics_otlp" else "warn")


def test_doctor_says_to_promote_resource_attributes_on_prometheus_defaults(roads, capsys):
    code, report = doctor(roads.prometheus_otlp_defaults.url, capsys)
    (labels,) = [c for c in report["checks"] if c["name"] == "labels"]
    assert code == 1 and labels["status"] == "fail"
    assert "target_info" in labels["detail"] and "promote_all_resource_attributes: true" in labels["fix"]


def test_doctor_says_to_use_prometheus_naming_on_victoriametrics_defaults(roads, capsys):
    code, report = doctor(roads.victoriametrics_otlp_defaults.url, capsys)
    (names,) = [c for c in report["checks"] if c["name"] == "names"]
    assert code == 1 and names["status"] == "fail"
    assert "gpu.ofu" in names["detail"] and "-opentelemetry.usePrometheusNaming" in names["fix"]


def test_doctor_says_nothing_arrived_and_where_to_send(tmp_path, capsys):
    """A backend that holds no otel-ofu data: a real, empty Prometheus 3."""
    server = PrometheusServer(prometheus3_binary(), tmp_path / "empty", flags=backends.PROMETHEUS_OTLP_FLAGS)
    try:
        code, report = doctor(server.start().api.url, capsys)
    finally:
        server.stop()
    (names,) = [c for c in report["checks"] if c["name"] == "names"]
    assert code == 1 and "nothing from otel-ofu arrived" in names["detail"] and "/api/v1/otlp" in names["fix"]


def test_doctor_says_when_the_backend_cannot_be_reached(capsys):
    (port,) = free_ports(1)
    code, report = doctor(f"http://127.0.0.1:{port}", capsys)
    assert code == 1 and report["checks"][0]["status"] == "fail"


# --- job events (OTLP logs) and a backend that takes metrics only ------------------------------

def metrics_only_backend(kind: str, workdir):
    """Prometheus 3 (OTLP receiver, the shipped settings) or VictoriaMetrics (Prometheus naming), started,
    and the otlphttp base URL docs/backends.md gives for it."""
    if kind == "prometheus3":
        server = PrometheusServer(prometheus3_binary(), workdir, flags=backends.PROMETHEUS_OTLP_FLAGS,
                                  config=backends.prometheus_config(backends.PROMETHEUS_OTLP_CONFIG)).start()
        return server, server.api, f"{server.api.url}/api/v1/otlp"
    server = backends.VictoriaMetrics(victoriametrics_binary(), workdir).start()
    return server, server.api, f"{server.url}/opentelemetry"


def documented_exporter(kind: str) -> dict:
    """The otlphttp exporter docs/backends.md tells a user to configure for the backend (its snippet)."""
    section = DOC.read_text().split("## Sending OTLP to Prometheus 3 and VictoriaMetrics", 1)[1]
    snippet = yaml.safe_load(section.split("```yaml", 1)[1].split("```", 1)[0])
    return snippet["exporters"]["otlphttp/prometheus" if kind == "prometheus3" else "otlphttp/victoriametrics"]


def run_with_events(tmp_path, url: str, exporter_extra: dict) -> tuple[Process, Path]:
    """otel-ofu with one simulated job (so ofu.job.start and friends) and its self-telemetry, both into
    one otlphttp exporter at ``url``."""
    config = {
        "receivers": {"sim": {"nodes": 1, "gpus_per_node": 2, "collection_interval": "1s",
                              "jobs": [{"id": "llama", "scenario": "steady", "gpus": 2, "node": 0}]},
                      "selftelemetry": {"collection_interval": "1s"}},
        "processors": {"ofu": {}, "jobs": {"resolution": "1s", "windows": ["5s"], "default_interval": "1s",
                                           "job_timeout": "5s"}},
        "exporters": {"otlphttp/backend": {"endpoint": url, **exporter_extra}},
        "service": {"pipelines": {
            "metrics": {"receivers": ["sim"], "processors": ["ofu", "jobs"], "exporters": ["otlphttp/backend"]},
            "metrics/self": {"receivers": ["selftelemetry"], "exporters": ["otlphttp/backend"]}}},
    }
    path = tmp_path / "otel-ofu.yaml"
    path.write_text(yaml.safe_dump(config))
    log = tmp_path / "otel-ofu.log"
    return Process("otel-ofu", otel_ofu_command(path), log), log


def self_counter(api, name: str, **labels: str) -> float | None:
    """The newest value of otel-ofu's own counter, summed over the series with ``labels``; None: no such series."""
    match = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = api.query(f"sum(last_over_time({name}{{{match}}}[1h]))", time.time())
    return float(found[0]["value"][1]) if found else None


@pytest.mark.parametrize("kind", ["prometheus3", "victoriametrics"])
def test_events_to_a_metrics_only_backend_are_not_sent_when_told(kind, tmp_path):
    """The exporter as docs/backends.md configures it (logs_endpoint: none): the metrics and job metrics
    arrive, and no batch of events is dropped (otel_ofu_exporter_dropped_total, which OtelOfuDroppingData
    reads, never appears)."""
    server, api, url = metrics_only_backend(kind, tmp_path / kind)
    try:
        documented = documented_exporter(kind)
        assert url.endswith(urlparse(documented.pop("endpoint")).path)
        proc, log = run_with_events(tmp_path, url, documented)
        try:
            wait_for("job_ofu and otel-ofu's sent metrics in the backend", lambda: require_alive(proc) or (
                api.query('job_ofu{ofu_job_id="llama"}', time.time())
                and (self_counter(api, "otel_ofu_exporter_sent_total", signal="metrics") or 0) > 0),
                timeout=90, interval=1, diagnostics=proc.tail)
            # Several self-telemetry snapshots later (1 s each), still nothing dropped: events were made
            # (ofu.job.start at once), and not sent.
            time.sleep(4)
            assert "job llama first seen by this instance" in log.read_text()
            assert self_counter(api, "otel_ofu_exporter_dropped_total") is None, proc.tail()
        finally:
            code = proc.stop()
        assert code == 0, proc.tail()
        text = log.read_text()
        assert "logs_endpoint is none: events" in text and "permanent error" not in text
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["prometheus3", "victoriametrics"])
def test_events_refused_by_a_metrics_only_backend_say_what_to_set(kind, tmp_path):
    """Without the setting, the backend refuses the logs (Prometheus 3: 404, VictoriaMetrics: 400
    "unsupported path"): the batches are dropped and counted, and the error says what to set."""
    server, api, url = metrics_only_backend(kind, tmp_path / kind)
    try:
        proc, log = run_with_events(tmp_path, url, {})
        try:
            wait_for("the dropped events counted in the backend", lambda: require_alive(proc) or (
                self_counter(api, "otel_ofu_exporter_dropped_total", signal="logs") or 0) > 0,
                timeout=90, interval=1, diagnostics=proc.tail)
        finally:
            proc.stop()
        errors = [line for line in log.read_text().splitlines() if "dropping" in line and "logs items" in line]
        assert errors, proc.tail()
        assert f"takes no OTLP logs at {url}/v1/logs" in errors[0], errors[0]
        assert "logs_endpoint: none" in errors[0] and "a logs backend" in errors[0], errors[0]
    finally:
        server.stop()
