"""deploy/grafana: the dashboards import into Grafana unchanged and hold together.

Structure is checked with Grafana's own dashboard models (the Grafana Foundation SDK, generated
from Grafana's schema): a dashboard that round-trips through them loses no key, so no field is
misspelled or misplaced. Then our own rules: unique panel ids, the data source variable on
every panel and query, a description and a unit on every panel, every variable used, only
core panel types, and only metric names the exporter serves or the recording rules record.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e_util import ROOT
from tests.promql_names import read_names, served_names
from tools import dashboards
from tools.grafana_queries import panels, variable_query, variables

FILES = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
CORE_PANELS = {"timeseries", "stat", "table", "heatmap", "bargauge", "histogram", "text", "state-timeline"}
# Keys Grafana keeps that the SDK's schema models do not list: a query variable's display
# text, and the Prometheus data source's annotation options.
SCHEMA_EXTRAS = {"definition", "step", "titleFormat", "textFormat", "tagKeys", "useValueForTime"}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(params=FILES, ids=lambda p: p.stem)
def dashboard(request) -> dict:
    return load(request.param)


def test_four_dashboards_generated_and_up_to_date():
    assert [p.name for p in FILES] == sorted(dashboards.DASHBOARDS)
    assert dashboards.main(["--check"]) == 0, "run python -m tools.dashboards"


def _lost_keys(original, round_tripped, path=""):
    if isinstance(original, dict):
        out = []
        for key, value in original.items():
            if key not in round_tripped:
                out.append(f"{path}/{key}")
            else:
                out += _lost_keys(value, round_tripped[key], f"{path}/{key}")
        return out
    if isinstance(original, list):
        assert len(original) == len(round_tripped), path
        return [lost for i, (a, b) in enumerate(zip(original, round_tripped))
                for lost in _lost_keys(a, b, f"{path}[{i}]")]
    assert original == round_tripped, f"{path}: {original!r} became {round_tripped!r}"
    return []


def grafana_round_trip(document: dict) -> dict:
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    plugins.register_default_plugins()  # panel options and Prometheus queries decode into their own models
    return json.loads(json.dumps(Dashboard.from_json(document), cls=JSONEncoder))


def test_grafana_schema_models_keep_every_key(dashboard):
    lost = [k for k in _lost_keys(dashboard, grafana_round_trip(dashboard))
            if k.rsplit("/", 1)[-1] not in SCHEMA_EXTRAS]
    assert not lost, f"not in Grafana's dashboard schema: {lost}"


def test_the_schema_check_catches_a_misspelled_key():
    document = load(FILES[0])
    panel = next(p for p in document["panels"] if p["type"] == "stat")
    panel["options"]["colourMode"] = panel["options"].pop("colorMode")
    panel["targets"][0]["exp"] = panel["targets"][0].pop("expr")
    lost = _lost_keys(document, grafana_round_trip(document))
    assert any(k.endswith("/colourMode") for k in lost) and any(k.endswith("/exp") for k in lost)


def test_current_schema_and_a_prometheus_data_source_variable(dashboard):
    assert 39 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"].startswith("otel-ofu-") and len(dashboard["uid"]) <= 40
    first = variables(dashboard)[0]
    assert (first["name"], first["type"], first["query"]) == ("datasource", "datasource", "prometheus")
    names = [v["name"] for v in variables(dashboard)]
    assert len(names) == len(set(names))


def test_panel_ids_are_unique_and_panels_are_core(dashboard):
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert {p["type"] for p in panels(dashboard)} <= CORE_PANELS


def test_every_panel_has_the_data_source_a_description_and_a_unit(dashboard):
    for panel in panels(dashboard):
        title = panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"]), title
        assert len(panel.get("description", "")) >= 60, f"{title}: say what the number means and how it is computed"
        assert panel["fieldConfig"]["defaults"].get("unit"), title
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), title
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), title


def test_percent_panels_use_fractions_and_hour_panels_gpu_hours(dashboard):
    for panel in panels(dashboard):
        unit, title = panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        if panel["type"] == "heatmap" and "Distribution" in title:
            assert panel["options"]["yAxis"]["unit"] == "percentunit", title  # bands of OFU, counted in GPUs
        elif "OFU" in title and "without" not in title and "GPUs" not in title:
            assert unit == "percentunit", title  # OFU is a 0..1 fraction of peak
        if "hours" in title.lower():
            assert unit == "suffix: GPU h", title
        if "FLOP/s" in title:
            assert unit == "flops", title


def test_every_variable_is_used(dashboard):
    texts = [t["expr"] for p in panels(dashboard) for t in p["targets"]]
    texts += [variable_query(v) for v in variables(dashboard) if v["type"] == "query"]
    texts += [a.get("expr", "") for a in dashboard["annotations"]["list"]]
    texts += [json.dumps(p.get("datasource")) for p in panels(dashboard)]
    for variable in variables(dashboard):
        pattern = re.compile(r"\$(\{)?" + variable["name"] + r"\b")
        users = [t for t in texts if pattern.search(t)]
        own = variable_query(variable) if variable["type"] == "query" else ""
        assert any(t != own for t in users), f"${variable['name']} is used by no query"


def test_all_matches_series_without_the_label(dashboard):
    """"All" must be the regex .* : Grafana's default (a|b|c) drops series that lack the label (no cluster label)."""
    for variable in variables(dashboard):
        if variable.get("includeAll"):
            assert variable["allValue"] == ".*", variable["name"]


def test_every_name_a_panel_reads_is_served_or_recorded(dashboard):
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "otel-ofu.rules.yml").read_text())["groups"]
    known = served_names() | {r["record"] for g in rules for r in g["rules"]}
    texts = [(p["title"], t["expr"]) for p in panels(dashboard) for t in p["targets"]]
    texts += [(v["name"], variable_query(v)) for v in variables(dashboard) if v["type"] == "query"]
    texts += [(a["name"], a["expr"]) for a in dashboard["annotations"]["list"] if "expr" in a]
    for where, expr in texts:
        unknown = read_names(expr) - known
        assert not unknown, f"{where}: {sorted(unknown)}"


def test_the_fleet_table_links_to_the_job_view():
    fleet = load(ROOT / "deploy" / "grafana" / "otel-ofu-fleet.json")
    job_uid = load(ROOT / "deploy" / "grafana" / "otel-ofu-job.json")["uid"]
    table = next(p for p in panels(fleet) if p["type"] == "table")
    links = [link for o in table["fieldConfig"]["overrides"] for prop in o["properties"] if prop["id"] == "links"
             for link in prop["value"]]
    assert links and all(f"/d/{job_uid}/" in link["url"] and "var-job=${__value.raw}" in link["url"]
                         for link in links)
    job_column = next(o for o in table["fieldConfig"]["overrides"] if o["matcher"]["options"] == "Job")
    assert any(p["id"] == "links" for p in job_column["properties"])


# Panels that show loss parts: the recording rules of parts (shares, gauges: the clock's may be below 0) and the
# jobs processor's counters of GPU-hours lost by part (never below 0: a gain has a counter of its own).
LOSS_SHARE_SOURCES = (dashboards.FLEET_PARTS, dashboards.JOB_PARTS)
LOSS_PART_SOURCES = (*LOSS_SHARE_SOURCES, dashboards.JOB_LOST_COUNTER)


def test_every_loss_panel_shows_a_clock_gain_as_a_series_of_its_own():
    """Issue 31 item 6: where a panel shows loss parts, the clock's gain (a boost above f_ref) is its own series
    named as a gain, and the parts' series keep only losses: no "-0.02 GPU h lost". From the shares, the gain is
    the clock part below 0; from the jobs processor's counters, its gain counter (job_ofu_gain_gpu_hours_total),
    the loss counter read as it is: it never falls, so it needs no sign filter."""
    seen = counters = 0
    for path in FILES:
        for panel in panels(load(path)):
            reading = [t["expr"] for t in panel["targets"] if any(s in t["expr"] for s in LOSS_PART_SOURCES)]
            if not reading:
                continue
            seen += 1
            gains = [t["expr"] for t in panel["targets"] if dashboards.CLOCK_GAIN in t["expr"]]
            assert len(gains) == 1, panel["title"]
            if dashboards.JOB_LOST_COUNTER in gains[0] + "".join(reading):
                counters += 1
                assert dashboards.JOB_GAINED_COUNTER in gains[0], panel["title"]
                assert not any("<" in e or ">" in e for e in [*reading, *gains]), panel["title"]
            else:
                assert all(">= 0" in e for e in reading if e not in gains), panel["title"]
    assert seen >= 4  # the fleet's stacked parts and GPU hours by part, the job's stacked parts and its table
    assert counters >= 1  # the job's table of largest losses


@pytest.mark.parametrize(("gain_sign", "gained"), [("", -0.125), ("-", 0.125)], ids=["stacked", "amount"])
def test_the_lost_and_gained_queries_split_a_clock_gain_from_the_losses_in_prometheus(tmp_path, gain_sign, gained):
    """The two queries every loss panel runs (tools.dashboards.lost_and_gained), evaluated by promtool on a GPU
    boosting above f_ref: the losses without the negative clock part, the gain alone under its own name."""
    from tests.e2e_util import prometheus_binary, unavailable
    from tools.demo_prometheus import promtool_binary

    promtool = promtool_binary(prometheus_binary())
    if not promtool:
        unavailable("promtool not installed: run collector/install-prometheus.sh (Debian's prometheus package)")
    lost, gain = (t["expr"] for t in dashboards.lost_and_gained("sum by (ofu_loss_part) (parts)",
                                                                gain_sign=gain_sign))
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": 'parts{hw_id="a", ofu_loss_part="clock"}', "values": "-0.125x5"},
                         {"series": 'parts{hw_id="a", ofu_loss_part="padding"}', "values": "0.0625x5"},
                         {"series": 'parts{hw_id="b", ofu_loss_part="padding"}', "values": "0.0625x5"}],
        "promql_expr_test": [
            {"expr": lost, "eval_time": "3m", "exp_samples": [{"labels": '{ofu_loss_part="padding"}', "value": 0.125}]},
            {"expr": gain, "eval_time": "3m",
             "exp_samples": [{"labels": f'{{ofu_loss_part="{dashboards.CLOCK_GAIN}"}}', "value": gained}]},
        ]}]}
    path = tmp_path / "gain.test.yml"
    path.write_text(yaml.safe_dump(test))
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_counter_queries_read_what_each_part_lost_and_the_gain_apart(tmp_path):
    """The job table's two queries (tools.dashboards.lost_and_gained_counters), evaluated by promtool on the jobs
    processor's counters of a job whose clock both throttled and boosted, seen by two jobs-tier instances: each
    part's GPU hours lost (the clock's too, never net of the gain), and the gain alone under its own name."""
    from tests.e2e_util import prometheus_binary, unavailable
    from tools.demo_prometheus import promtool_binary

    promtool = promtool_binary(prometheus_binary())
    if not promtool:
        unavailable("promtool not installed: run collector/install-prometheus.sh (Debian's prometheus package)")
    lost, gain = (t["expr"] for t in dashboards.lost_and_gained_counters('ofu_job_id="j"'))
    series = []
    for instance in ("a", "b"):  # the same job's counters from two instances: read once (max), not added
        series += [
            {"series": f'job_ofu_loss_gpu_hours_total{{instance="{instance}", ofu_job_id="j", '
                       'ofu_loss_part="clock"}', "values": "0.25+0.25x4"},
            {"series": f'job_ofu_loss_gpu_hours_total{{instance="{instance}", ofu_job_id="j", '
                       'ofu_loss_part="padding"}', "values": "0.0625+0.0625x4"},
            {"series": f'job_ofu_gain_gpu_hours_total{{instance="{instance}", ofu_job_id="j", '
                       'ofu_loss_part="clock"}', "values": "0.125+0.125x4"}]
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [
            {"expr": lost, "eval_time": "3m",
             "exp_samples": [{"labels": '{ofu_loss_part="clock"}', "value": 1.0},
                             {"labels": '{ofu_loss_part="padding"}', "value": 0.25}]},
            {"expr": gain, "eval_time": "3m",
             "exp_samples": [{"labels": f'{{ofu_loss_part="{dashboards.CLOCK_GAIN}"}}', "value": 0.5}]},
        ]}]}
    path = tmp_path / "counters.test.yml"
    path.write_text(yaml.safe_dump(test))
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _ledger_panel(title: str) -> dict:
    return next(p for p in panels(load(ROOT / "deploy" / "grafana" / "otel-ofu-fleet.json")) if p["title"] == title)


def _promtool_test(tmp_path, series: list[dict], cases: list[dict]) -> None:
    from tests.e2e_util import prometheus_binary, unavailable
    from tools.demo_prometheus import promtool_binary

    promtool = promtool_binary(prometheus_binary())
    if not promtool:
        unavailable("promtool not installed: run collector/install-prometheus.sh (Debian's prometheus package)")
    test = {"rule_files": [], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": cases}]}
    path = tmp_path / "ledger.test.yml"
    path.write_text(yaml.safe_dump(test))
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _all_variables(expr: str) -> str:
    """A query as Grafana sends it with every variable at "All" (.*) and a one-hour range."""
    return re.sub(r"\$(cluster|namespace|gpu_model|precision)\b", ".*", expr).replace("$__range", "1h")


def test_the_stalled_queries_count_a_stalled_jobs_gpus_once(tmp_path):
    """Issue 34 item 5: the Ledger row's Stalled GPUs and Stalled GPU hours, evaluated by promtool (the demo has no
    hung job). Job h (4 GPUs, reported by two jobs-tier instances) is stalled from minute 3, job w (2 GPUs) works:
    4 stalled GPUs, not 8 nor 6, and h's stalled GPU hours once; before any stall the all-jobs line and the stat
    read 0 (the jobs processor reports jobs), and with no job series at all they read no value, never 0."""
    all_jobs, by_job = (_all_variables(t["expr"]) for t in _ledger_panel("Stalled GPUs")["targets"])
    hours = _all_variables(_ledger_panel("Stalled GPU hours")["targets"][0]["expr"])
    series = [{"series": 'job_gpus{instance="b", ofu_job_id="w"}', "values": "2x70"}]
    for instance in ("a", "b"):  # the same job from two instances: read once (max), not added
        series += [
            {"series": f'job_gpus{{instance="{instance}", ofu_job_id="h"}}', "values": "4x70"},
            {"series": f'job_finding{{instance="{instance}", ofu_job_id="h", ofu_finding_kind="stalled"}}',
             "values": "_x2 1x68"},
            # 0.0625 GPU-hours a minute from minute 3 (a round number; the jobs processor counts them)
            {"series": f'job_stalled_gpu_hours_total{{instance="{instance}", ofu_job_id="h"}}',
             "values": "_x2 0+0.0625x68"},
            {"series": f'job_finding{{instance="{instance}", ofu_job_id="w", ofu_finding_kind="mfu_gap"}}',
             "values": "1x70"}]
    _promtool_test(tmp_path, series, [
        {"expr": all_jobs, "eval_time": "1m", "exp_samples": [{"labels": "{}", "value": 0}]},
        {"expr": all_jobs, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 4}]},
        {"expr": by_job, "eval_time": "10m", "exp_samples": [{"labels": '{ofu_job_id="h"}', "value": 4}]},
        {"expr": by_job, "eval_time": "1m", "exp_samples": []},
        {"expr": hours, "eval_time": "1m", "exp_samples": [{"labels": "{}", "value": 0}]},
        # an hour of stall (60 x 0.0625) read once; the window's edges between samples, as on Prometheus 2 and 3
        {"expr": hours, "eval_time": "63m30s", "exp_samples": [{"labels": "{}", "value": 3.75}]},
    ])
    _promtool_test(tmp_path, [{"series": 'gpu_ofu{hw_id="a"}', "values": "0.5x10"}], [
        {"expr": all_jobs, "eval_time": "5m", "exp_samples": []},
        {"expr": hours, "eval_time": "5m", "exp_samples": []},
    ])
