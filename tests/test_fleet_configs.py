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
    # Each series has one source: the jobs tier takes what it reads and passes on only what it makes.
    for config in (rendered, shipped):
        assert config["receivers"]["otlp"]["passthrough"] is False
        assert config["processors"]["jobs"]["passthrough"] is False
    assert rendered["service"]["pipelines"]["metrics"]["processors"] == ["jobs"]
    # Both keep the jobs' state on the instance's own volume, next to the sending queue.
    assert Path(rendered["processors"]["jobs"]["storage"]).parent == Path("/var/lib/otel-ofu")
    assert shipped["processors"]["jobs"]["storage"].endswith("/jobs")


def test_the_gateway_forwards_exactly_what_the_jobs_tier_decodes() -> None:
    """filter/jobs_inputs drops every metric but the names the jobs tier's otlp receiver decodes."""
    decode = yaml.safe_load((CONFIGS / "fleet-jobs.yaml").read_text())["receivers"]["otlp"]["decode"]
    for relay in (yaml.safe_load((CONFIGS / "otelcol-gateway.yaml").read_text()),
                  yaml.safe_load(one(fleet_objects(), "ConfigMap", "gateway")["data"]["relay.yaml"])):
        (condition,) = relay["processors"]["filter/jobs_inputs"]["metrics"]["metric"]
        assert condition == "not (" + " or ".join(f'name == "{name}"' for name in decode) + ")"


def test_the_jobs_tier_decodes_all_its_jobs_processor_reads() -> None:
    """Nothing else reaches it (the gateway forwards these names only, the receiver passes nothing through):
    a metric the jobs processor reads but the lists lack would silently never be counted."""
    from otel_ofu.jobs.config import JobsConfig
    from otel_ofu.pipeline.component import Context
    from otel_ofu.pipeline.config import build_config
    from otel_ofu.processors.jobs import JobsProcessor

    shipped = yaml.safe_load((CONFIGS / "fleet-jobs.yaml").read_text())
    rendered = yaml.safe_load(one(fleet_objects(), "ConfigMap", "jobs")["data"]["config.yaml"])
    for config in (shipped, rendered):
        settings = {k: v for k, v in config["processors"]["jobs"].items() if k != "storage"}
        processor = JobsProcessor(build_config(JobsConfig, settings), Context("jobs"))
        assert set(config["receivers"]["otlp"]["decode"]) == processor.inputs


def test_the_node_tier_sends_its_gpus_to_the_backend_and_the_gateway() -> None:
    """The GPUs' series leave the node agents for the backend; the gateway lane carries the jobs' inputs."""
    node = yaml.safe_load((CONFIGS / "fleet-node.yaml").read_text())
    pipelines = node["service"]["pipelines"]
    assert pipelines["metrics"]["exporters"] == ["otlp/backend", "otlp/gateway"]
    assert pipelines["metrics/self"]["exporters"] == ["otlp/backend"]
    rendered = yaml.safe_load(one(fleet_objects(), "ConfigMap", "agent")["data"]["config.yaml"])["service"]
    assert rendered["pipelines"]["metrics"]["exporters"] == ["prometheus", "otlp", "otlp/gateway"]
    assert rendered["pipelines"]["metrics/self"]["exporters"] == ["prometheus", "otlp"]


def test_every_hop_of_the_fleet_sends_one_request_at_a_time() -> None:
    """Issue 31 (Done when): a backlog (the backend or a jobs instance down, restarting) drains oldest first. With
    several requests in flight it arrives out of order: Prometheus refuses a series' point older than its last
    ("out of order sample", the whole remote write request dropped), and the jobs processor skips a GPU's window
    at or before its last one (tests/test_fleet_e2e.py::
    test_the_documented_fleet_loses_no_point_through_outages_and_a_killed_jobs_instance saw both)."""
    node = yaml.safe_load((CONFIGS / "fleet-node.yaml").read_text())["exporters"]
    jobs = yaml.safe_load((CONFIGS / "fleet-jobs.yaml").read_text())["exporters"]
    gateway = yaml.safe_load((CONFIGS / "otelcol-gateway.yaml").read_text())["exporters"]
    agent = yaml.safe_load(one(fleet_objects(), "ConfigMap", "agent")["data"]["config.yaml"])["exporters"]
    chart_jobs = yaml.safe_load(one(fleet_objects(), "ConfigMap", "jobs")["data"]["config.yaml"])["exporters"]
    relay = yaml.safe_load(one(fleet_objects(), "ConfigMap", "gateway")["data"]["relay.yaml"])["exporters"]
    queues = {"fleet-node.yaml otlp/backend": node["otlp/backend"]["sending_queue"],
              "fleet-node.yaml otlp/gateway": node["otlp/gateway"]["sending_queue"],
              "fleet-jobs.yaml otlp/backend": jobs["otlp/backend"]["sending_queue"],
              "otelcol-gateway.yaml": gateway["load_balancing/jobs"]["protocol"]["otlp"]["sending_queue"],
              "chart agent otlp": agent["otlp"]["sending_queue"],
              "chart agent otlp/gateway": agent["otlp/gateway"]["sending_queue"],
              "chart jobs otlp": chart_jobs["otlp"]["sending_queue"],
              "chart gateway": relay["load_balancing/jobs"]["protocol"]["otlp"]["sending_queue"]}
    assert {where: queue.get("num_consumers") for where, queue in queues.items()} == dict.fromkeys(queues, 1)
