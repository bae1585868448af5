"""The fleet's shipped configs agree with what the Helm chart deploys (one topology, written twice)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.deploy_util import EXAMPLES, one, template
from tests.e2e_util import ROOT

CONFIGS = ROOT / "collector-config"


def fleet_objects() -> list[dict]:
    return template(next(p for p in EXAMPLES if p.stem == "fleet"))


def test_the_chart_gateway_runs_the_shipped_gateway_pipelines() -> None:
    shipped = yaml.safe_load((CONFIGS / "otelcol-gateway.yaml").read_text())
    rendered = yaml.safe_load(one(fleet_objects(), "ConfigMap", "gateway")["data"]["relay.yaml"])
    assert rendered["service"]["pipelines"] == shipped["service"]["pipelines"]
    assert rendered["service"]["extensions"] == shipped["service"]["extensions"]
    for name, processor in shipped["processors"].items():
        if name == "batch":  # a deploy-time timeout in the shipped file
            assert rendered["processors"][name] == {"timeout": "1s"}
            continue
        assert rendered["processors"][name] == processor, name
    assert rendered["processors"].keys() == shipped["processors"].keys()
    assert rendered["exporters"].keys() == shipped["exporters"].keys()
    for name, exporter in shipped["exporters"].items():
        ours = {k: v for k, v in exporter.items() if k != "resolver"}
        theirs = {k: v for k, v in rendered["exporters"][name].items() if k != "resolver"}
        theirs["protocol"]["otlp"].pop("headers", None)  # the chart adds the jobs tier's token
        assert theirs == ours, name


def test_the_chart_jobs_tier_runs_the_shipped_jobs_pipeline() -> None:
    shipped = yaml.safe_load((CONFIGS / "fleet-jobs.yaml").read_text())
    rendered = yaml.safe_load(one(fleet_objects(), "ConfigMap", "jobs")["data"]["config.yaml"])
    assert rendered["receivers"]["otlp"]["decode"] == shipped["receivers"]["otlp"]["decode"]
    assert rendered["receivers"]["otlp"]["passthrough"] is shipped["receivers"]["otlp"]["passthrough"] is True
    assert rendered["service"]["pipelines"]["metrics"]["processors"] == ["jobs"]
    # Both keep the jobs' state on the instance's own volume, next to the sending queue.
    assert Path(rendered["processors"]["jobs"]["storage"]).parent == Path("/var/lib/otel-ofu")
    assert shipped["processors"]["jobs"]["storage"].endswith("/jobs")
