"""otel_ofu.training: the resource a training process reports under, and what each export carries.

Collected with the OpenTelemetry SDK's own InMemoryMetricReader; the OTLP path to a running
otel-ofu is tests/test_mfu_audit_e2e.py.
"""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_ofu.training import MfuReporter, start_mfu_reporter, training_resource
from otel_ofu.training.report import _resource


def collected(reader: InMemoryMetricReader) -> dict[str, list[float]]:
    data = reader.get_metrics_data()
    out: dict[str, list[float]] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(p.value for p in metric.data.data_points)
    return out


@pytest.fixture
def reporter():
    reader = InMemoryMetricReader()
    made = MfuReporter(reader, _resource(None, {}), every_n_steps=10)
    yield made, reader
    made.shutdown()


def test_kubernetes_identity_from_the_downward_api_and_the_service_account(tmp_path):
    namespace = tmp_path / "namespace"
    namespace.write_text("llm\n")
    got = training_resource({"K8S_POD_NAME": "trainer-1", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}, namespace)
    assert got["k8s.pod.name"] == "trainer-1" and got["k8s.namespace.name"] == "llm"
    assert isinstance(got["process.pid"], int) and got["host.name"]


def test_slurm_identity_and_a_bare_host():
    got = training_resource({"SLURM_JOBID": "4242", "SLURM_JOB_NAME": "pretrain"})
    assert got["slurm.job.id"] == "4242" and got["slurm.job.name"] == "pretrain"
    bare = training_resource({})
    assert not any(k.startswith(("k8s.", "slurm.")) for k in bare) and {"host.name", "process.pid"} <= set(bare)


def test_kubernetes_without_a_pod_name_says_what_to_set(caplog):
    with caplog.at_level(logging.WARNING, "otel_ofu.training"):
        training_resource({"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert "K8S_POD_NAME" in caplog.text


def test_otel_resource_attributes_win_over_detection_and_arguments_over_both(monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=from-env,team=llm")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    got = dict(_resource({"team": "vision"}, {"K8S_POD_NAME": "detected", "K8S_NAMESPACE": "ns"}).attributes)
    assert got["k8s.pod.name"] == "from-env" and got["k8s.namespace.name"] == "ns" and got["team"] == "vision"
    assert got["service.name"] == "training"  # not the SDK's unknown_service placeholder
    monkeypatch.setenv("OTEL_SERVICE_NAME", "llama-pretrain")
    assert _resource(None, {}).attributes["service.name"] == "llama-pretrain"


def test_every_n_steps_and_each_export_carries_the_mean_since_the_last(reporter):
    made, reader = reporter
    assert [made.report(step, mfu=0.1 * step) for step in (9, 10, 15, 20)] == [False, True, False, True]
    assert collected(reader) == {"training.mfu": [pytest.approx(1.5)]}  # (1.0 + 2.0) / 2
    assert collected(reader) == {}  # nothing reported since: nothing sent, never the old value again
    made.report(None, tflops_per_gpu=400.0)
    assert collected(reader) == {"training.tflops_per_gpu": [400.0]}


def test_bad_values_are_skipped_with_one_warning(reporter, caplog):
    made, reader = reporter
    with caplog.at_level(logging.WARNING, "otel_ofu.training"):
        assert not made.report(10, mfu=float("nan"))
        assert not made.report(20, mfu=-1.0)
        assert made.report(30, mfu=1.7)  # above 1: a FLOP formula counting too much, which the audit is for
    assert caplog.text.count("not reported") == 1
    assert collected(reader) == {"training.mfu": [1.7]}


def test_settings_are_checked():
    with pytest.raises(ValueError, match="every_n_steps"):
        MfuReporter(InMemoryMetricReader(), _resource(None, {}), every_n_steps=0)
    with pytest.raises(ValueError, match="protocol"):
        start_mfu_reporter(protocol="carrier-pigeon")
    with pytest.raises(ValueError, match="export_interval_s"):
        start_mfu_reporter(export_interval_s=0)


def test_the_recipes_in_docs_audit_are_valid_python_and_yaml():
    """The recipes cannot run here (no frameworks), but a typo in one would not survive this."""
    import ast
    import re
    import textwrap
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parent.parent / "docs" / "audit.md").read_text()
    blocks = re.findall(r"```(python|yaml)\n(.*?)```", text, flags=re.S)
    assert sum(kind == "python" for kind, _ in blocks) >= 5
    for kind, body in blocks:
        body = textwrap.dedent(body)
        if kind == "python":
            tree = ast.parse(body)
            imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                        and n.module == "otel_ofu.training" for a in n.names}
            assert imported <= {"start_mfu_reporter", "MfuReporter"}
        else:
            assert isinstance(yaml.safe_load(body), dict)


def test_by_default_reports_go_to_the_agent_on_this_node():
    """K8S_NODE_IP (the downward API's status.hostIP) reaches the chart's agent on its host port."""
    from otel_ofu.training.report import AGENT_GRPC_PORT, AGENT_HTTP_PORT, default_endpoint

    node = {"K8S_NODE_IP": "10.0.0.11"}
    assert default_endpoint("grpc", node) == f"http://10.0.0.11:{AGENT_GRPC_PORT}"
    assert default_endpoint("http/protobuf", node) == f"http://10.0.0.11:{AGENT_HTTP_PORT}"
    assert default_endpoint("grpc", {"K8S_NODE_IP": "fd00::11"}) == f"http://[fd00::11]:{AGENT_GRPC_PORT}"
    # The standard variable wins (the SDK reads it); with neither, the SDK's localhost.
    assert default_endpoint("grpc", {**node, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}) is None
    assert default_endpoint("grpc", {**node, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4317"}) is None
    assert default_endpoint("grpc", {}) is None
