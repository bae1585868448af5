"""A job reports its MFU with the OpenTelemetry SDK alone: no otel-ofu in the training image (issue 31, item 10).

docs/audit.md's snippet ("Without otel-ofu in the image") runs as written, in a virtual environment
holding only the packages its ``pip install`` line names (and their dependencies; the versions
this checkout's environment has, from pip's cache or PyPI), with the environment docs/audit.md's
pod spec gives a training container: its pod from the downward API, the agent's node-local
Service (here: the agent's port) and the token of the chart's Secret. A real ``otel-ofu run``,
configured as the chart's agent takes reports (a bearer token required) plus the jobs processor,
scrapes a dcgm-exporter page of the pod's GPUs and audits the report.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from otel_ofu.core.model import job_id_of
from tests.deploy_util import doc_blocks, resolve_env
from tests.e2e_util import (
    ROOT,
    PageServer,
    Process,
    free_ports,
    otel_ofu_command,
    read_points,
    require_alive,
    unavailable,
    wait_for,
)
from tests.test_mfu_audit_e2e import dcgm_page, page_ofu, pod_labels

AUDIT_DOC = ROOT / "docs" / "audit.md"
SNIPPET_HEADING = "### Without otel-ofu in the image: the OpenTelemetry SDK alone"
POD_SPEC_HEADING = "### Identity: who is reporting"
TOKEN = "a-random-token-the-chart-made-0123456789"
POD, NAMESPACE, JOB = "trainer-0-b7x2k", "llm", "k8s:llm/Pod/trainer-0-b7x2k"
PAGE = dcgm_page("gpu-node-3", [("GPU-44444444-0000-4000-8000-000000000000", pod_labels(POD)),
                                ("GPU-44444444-0000-4000-8000-000000000001", pod_labels(POD))])
DRIVER = '''
import pathlib, sys, time

stop = pathlib.Path(sys.argv[1])
while not stop.exists():  # "training steps", until the test has seen the report
    mfu_values.append(float(sys.argv[2]))
    time.sleep(0.05)
provider.shutdown()
'''


def sdk_only_venv(where: Path, packages: list[str]) -> Path:
    """A fresh virtual environment with ``packages`` (pinned to this environment's versions) and their
    dependencies only; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, capture_output=True, timeout=300)
    python = where / "bin" / "python"
    pinned = [f"{name}=={importlib.metadata.version(name)}" for name in packages]
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *pinned], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        unavailable(f"pip could not install {' '.join(pinned)} (PyPI or pip's cache needed):\n{done.stderr[-2000:]}")
    return python


def test_the_documented_sdk_snippet_reports_mfu_that_the_audit_reads(tmp_path: Path) -> None:
    setup, usage = doc_blocks(AUDIT_DOC, SNIPPET_HEADING, "python")
    # The names the usage lines call are the ones the setup defines (the driver below uses them).
    assert "mfu_values.append(mfu)" in usage and "provider.shutdown()" in usage
    section = AUDIT_DOC.read_text().split(SNIPPET_HEADING)[1]
    packages = re.search(r"`pip install ([^`]+)`", section).group(1).split()
    assert packages == ["opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-grpc"]

    python = sdk_only_venv(tmp_path / "venv", packages)
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    nothing_else = subprocess.run([str(python), "-c", "import otel_ofu"], capture_output=True, cwd=tmp_path,
                                  env=clean, timeout=60)
    assert nothing_else.returncode != 0, "the training environment must not hold otel-ofu"

    # The training container's env, from the documented pod spec.
    (pod_spec,) = doc_blocks(AUDIT_DOC, POD_SPEC_HEADING, "yaml")
    documented = yaml.safe_load(pod_spec)["env"]
    endpoint = next(item for item in documented if item["name"] == "OTEL_EXPORTER_OTLP_ENDPOINT")
    assert endpoint["value"] == "http://ofu-otel-ofu-agent-otlp.gpu-monitoring.svc:4317"  # release ofu's Service
    grpc_port, = free_ports(1)
    endpoint["value"] = f"http://127.0.0.1:{grpc_port}"  # the Service, on this machine: the agent's port
    env = resolve_env(documented, {"metadata.name": POD, "metadata.namespace": NAMESPACE},
                      {("ofu-otel-ofu-otlp-token", "token"): TOKEN})
    assert env["OTEL_EXPORTER_OTLP_HEADERS"] == f"authorization=Bearer%20{TOKEN}"

    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    out = tmp_path / "out.jsonl"
    config = tmp_path / "otel-ofu.yaml"
    ofu = page_ofu(PAGE)
    with PageServer({"/metrics": PAGE}) as page:
        config.write_text(yaml.safe_dump({
            "receivers": {
                "dcgm_exporter": {"endpoint": f"{page.url}/metrics", "collection_interval": "1s",
                                  "exporter_collect_interval": "1s"},
                # As the chart's agent takes reports: a token required, reports only.
                "otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"}},
                         "auth": {"bearer_token_file": str(token)}, "passthrough": False},
            },
            "processors": {
                "attribution": {"rules": [{"match": {"uuid": "*"}, "precision": "bf16"}]},
                "ofu": {},
                "jobs": {"resolution": "1s", "windows": ["5s"], "default_interval": "1s", "job_timeout": "60s",
                         "audit": {"window": "5s", "sustain": "3s", "clear_after": "3s"}},
            },
            "exporters": {"file": {"path": str(out)}},
            "service": {"pipelines": {"metrics": {"receivers": ["dcgm_exporter", "otlp"],
                                                  "processors": ["attribution", "ofu", "jobs"],
                                                  "exporters": ["file"]}}},
        }))
        agent = Process("otel-ofu", otel_ofu_command(config), tmp_path / "otel-ofu.log")
        stop = tmp_path / "stop"
        script = tmp_path / "train.py"
        script.write_text(setup + DRIVER)
        training = Process("training", [str(python), str(script), str(stop), f"{2 * ofu}"], tmp_path / "train.log",
                           env={**clean, **env, "OTEL_METRIC_EXPORT_INTERVAL": "1000"}, inherit=False)

        def audited() -> float | None:
            require_alive(agent, training)
            reported = [p.value for p in read_points(out) if p.name == "job.mfu.reported" and job_id_of(p) == JOB
                        and dict(p.attributes).get("ofu.window") == "5s"]
            return reported[-1] if reported else None

        try:
            reported = wait_for("the job's reported MFU, audited against its GPUs", audited, timeout=120,
                                diagnostics=lambda: agent.tail() + "\n" + training.tail())
            stop.write_text("")  # the training ends: its provider sends the last values and stops
            wait_for("the training process to end", lambda: None if training.alive() else True, timeout=60,
                     diagnostics=training.tail)
        finally:
            codes = {p.name: p.stop() for p in (training, agent)}
    assert codes == {"training": 0, "otel-ofu": 0}, training.tail() + agent.tail()
    assert reported == pytest.approx(2 * ofu, rel=1e-6)
    reports = [p for p in read_points(out) if p.name == "training.mfu"]
    assert reports and {job_id_of(p) for p in reports} == {JOB}
    assert {dict(p.resource)["k8s.pod.name"] for p in reports} == {POD}
