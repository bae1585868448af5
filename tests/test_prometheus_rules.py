"""deploy/prometheus: promtool accepts every rules file, its unit tests pass and cover every
alert, the PrometheusRule manifests carry the same rules, and every name the rules read exists.

promtool comes with Debian's prometheus package (collector/install-prometheus.sh); without it
these tests skip locally and fail under CI.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e_util import ROOT, prometheus3_binary, prometheus_binary, unavailable
from tests.promql_names import read_names, served_names
from tools import prometheus_rule
from tools.demo_prometheus import promtool_binary

RULES = ROOT / "deploy" / "prometheus"
RULE_FILES = sorted(RULES.glob("*.yml"))
TEST_FILES = sorted((RULES / "tests").glob("*.test.yml"))


@pytest.fixture(scope="module")
def promtool() -> str:
    found = promtool_binary(prometheus_binary())
    if not found:
        unavailable("promtool not installed: run collector/install-prometheus.sh (Debian's prometheus package)")
    return str(found)


def groups_of(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["groups"]


def all_rules() -> list[dict]:
    return [rule for path in RULE_FILES for group in groups_of(path) for rule in group["rules"]]


def test_the_rule_files_are_the_ones_documented():
    assert [p.name for p in RULE_FILES] == ["otel-ofu-promql.alerts.yml", "otel-ofu.alerts.yml", "otel-ofu.rules.yml"]
    assert (ROOT / "docs" / "dashboards.md").read_text().count("otel-ofu.rules.yml") >= 1


def test_promtool_check_rules_accepts_every_file(promtool):
    done = subprocess.run([promtool, "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(RULE_FILES)


@pytest.mark.parametrize("version", ["debian", "prometheus3"])
def test_promtool_unit_tests_pass(promtool, version):
    """On Debian's Prometheus 2 and on Prometheus 3 (whose range windows leave out their first instant)."""
    tool = promtool if version == "debian" else str(Path(prometheus3_binary()).with_name("promtool"))
    done = subprocess.run([tool, "test", "rules", *map(str, TEST_FILES)], capture_output=True, text=True,
                          cwd=RULES / "tests")
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_fail_when_an_alert_breaks(promtool, tmp_path):
    """The unit tests can fail: a threshold moved so the power-capped GPU no longer alerts is caught."""
    broken = tmp_path / "rules"
    broken.mkdir()
    for path in RULE_FILES:
        text = path.read_text()
        if path.name == "otel-ofu.alerts.yml":
            assert ") < 0.85" in text
            text = text.replace(") < 0.85", ") < 0.5")
        (broken / path.name).write_text(text)
    (broken / "tests").mkdir()
    for path in TEST_FILES:
        (broken / "tests" / path.name).write_text(path.read_text())
    done = subprocess.run([promtool, "test", "rules", *(p.name for p in TEST_FILES)], capture_output=True,
                          text=True, cwd=broken / "tests")
    assert done.returncode != 0 and "OfuGpuClockCapped" in done.stdout + done.stderr


def test_every_alert_has_a_test_that_fires_it_and_one_that_stays_quiet():
    alerts = {rule["alert"] for rule in all_rules() if "alert" in rule}
    fired, quiet = set(), set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert alerts == fired, f"alerts no test fires: {sorted(alerts - fired)}"
    assert alerts == quiet, f"alerts no test keeps quiet: {sorted(alerts - quiet)}"


def test_every_alert_says_what_and_how_bad():
    for rule in all_rules():
        if "alert" not in rule:
            continue
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_recording_rule_names_follow_level_metric_operations():
    for rule in all_rules():
        if "record" in rule:
            level, metric, operations = rule["record"].split(":")
            assert level and metric and operations, rule["record"]


def test_every_name_the_rules_read_is_served_or_recorded():
    known = served_names() | {rule["record"] for rule in all_rules() if "record" in rule} | {"up"}
    for rule in all_rules():
        unknown = read_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('alert') or rule.get('record')}: {sorted(unknown)}"


def test_prometheusrule_manifests_carry_the_same_rules(promtool, tmp_path):
    assert prometheus_rule.main(["--check"]) == 0, "run python -m tools.prometheus_rule"
    for file_name, (name, sources) in prometheus_rule.MANIFESTS.items():
        manifest = yaml.safe_load((RULES / "kubernetes" / file_name).read_text())
        assert manifest["apiVersion"] == "monitoring.coreos.com/v1" and manifest["kind"] == "PrometheusRule"
        assert manifest["metadata"]["name"] == name
        assert manifest["spec"]["groups"] == [g for source in sources for g in groups_of(RULES / source)]
        # The operator's spec is a rules file: promtool checks it as one.
        spec = tmp_path / f"{name}.yml"
        spec.write_text(yaml.safe_dump(manifest["spec"]))
        done = subprocess.run([promtool, "check", "rules", str(spec)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_links_its_runbook_section():
    """runbook_url (the monitoring mixins' annotation) points at the alert's own section of docs/runbooks.md."""
    from tests.test_docs import anchors

    runbooks = ROOT / "docs" / "runbooks.md"
    sections = anchors(runbooks)
    for rule in all_rules():
        if "alert" in rule:
            url = rule["annotations"].get("runbook_url", "")
            assert url == f"docs/runbooks.md#{rule['alert'].lower()}", rule["alert"]
            assert url.partition("#")[2] in sections, f"{rule['alert']}: no section {url} in docs/runbooks.md"


def test_the_findings_alerts_do_not_quote_the_jobs_processors_default_thresholds():
    """OfuJobRegression and OfuJobMfuGap forward what the jobs processor decided with its own settings:
    a text quoting the defaults (drop ratio 1.5, 5 minutes, 10 pp, 1.3x) tells a fleet that changed
    them the wrong numbers. They name the settings instead."""
    from otel_ofu.jobs.audit import AuditConfig
    from otel_ofu.jobs.regression import RegressionConfig

    audit, regression = AuditConfig(), RegressionConfig()
    texts = {rule["alert"]: rule["annotations"]["description"] for rule in all_rules()
             if rule.get("alert") in ("OfuJobRegression", "OfuJobMfuGap")}
    assert "regression.drop_ratio" in texts["OfuJobRegression"]
    assert f"/ {regression.drop_ratio:g}" not in texts["OfuJobRegression"]
    assert "audit.min_gap_pp" in texts["OfuJobMfuGap"] and "audit.min_ratio" in texts["OfuJobMfuGap"]
    assert f"{audit.min_gap_pp:g} pp" not in texts["OfuJobMfuGap"]
    assert f"{audit.min_ratio:g}x" not in texts["OfuJobMfuGap"]
