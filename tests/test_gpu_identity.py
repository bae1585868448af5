"""GPUs without a UUID (dmon, CSV) and MIG instances are distinct entities through the whole
pipeline: attribution, ofu, jobs, the exporters and the report."""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from otel_ofu.cli.main import main
from otel_ofu.core.model import gpu_key, precision_of
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.config import parse_service_config
from otel_ofu.pipeline.service import Service
from tests.e2e_util import PageServer, free_ports, read_points, wait_for

ROOT = Path(__file__).resolve().parent.parent


def dmon_capture(gpus: int, iterations: int) -> str:
    """What `dcgmi dmon -e 1004,100,155 -d 1000` prints for a node of `gpus` busy GPUs."""
    lines = ["# dcgmi dmon -e 1004,100,155 -d 1000", "#Entity   TENSO        SMCLK        POWER",
             "ID                                   W"]
    for _ in range(iterations):
        lines += [f"GPU {g}     {0.2 + 0.2 * g:.3f}        1755         600.000" for g in range(gpus)]
    return "\n".join(lines) + "\n"


def test_a_four_gpu_dmon_capture_is_four_gpus_in_jobs_exporters_and_report(tmp_path, capsys):
    (tmp_path / "node7.dmon").write_text(dmon_capture(4, 90))
    config = tmp_path / "pipeline.yaml"
    config.write_text(f"""
receivers:
  replay: {{path: {tmp_path / 'node7.dmon'}, speed: max, model: NVIDIA H100 80GB HBM3, host_name: node7,
           start_time: "2026-03-02T10:00:00Z"}}
processors:
  attribution:
    rules: [{{match: {{host: node7}}, job_id: capture-job, precision: bf16-mixed}}]
  ofu: {{}}
  jobs: {{default_interval: 1s, resolution: 10s, windows: [10s, 1m], job_timeout: 10s}}
exporters:
  file: {{path: {tmp_path / 'out.jsonl'}}}
service:
  exit_when_done: true
  pipelines:
    metrics: {{receivers: [replay], processors: [attribution, ofu, jobs], exporters: [file]}}
""")
    done = subprocess.run([sys.executable, "-m", "otel_ofu", "run", "--config", str(config)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    points = read_points(tmp_path / "out.jsonl")
    ofu = [p for p in points if p.name == "gpu.ofu"]
    assert len({gpu_key(p.resource) for p in ofu}) == 4
    by_index = {dict(p.resource)["gpu.index"]: p for p in ofu}
    assert by_index["3"].value > by_index["0"].value  # each GPU keeps its own numbers
    assert {precision_of(p) for p in ofu} == {"bf16"}  # bf16-mixed, as Lightning says
    assert any(p.name == "gpu.flops.achieved" for p in points)
    gpus_metric = [p.value for p in points if p.name == "job.gpus"]
    assert gpus_metric and max(gpus_metric) == 4
    assert main(["report", str(tmp_path / "out.jsonl"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fleet"]["gpus"] == 4
    assert [(j["job_id"], j["gpus"]) for j in data["jobs"]] == [("capture-job", 4)]
    assert data["jobs"][0]["flops"] > 0


# A dcgm-exporter 4.x page with pod labels from the corpus (tests/data/real/README.md): the pod
# llama3-70b-worker-0 holds GPUs 0 and 2, GPU 1 is idle.
K8S_PAGE = ROOT / "tests" / "data" / "real" / "dcgm-exporter" / "4.5.3-4.8.2_h100_kubernetes.prom"
FIRST_POD = 'container="pytorch",namespace="training",pod="llama3-70b-worker-0"'
NEXT_POD = 'container="pytorch",namespace="training",pod="job-b-worker-0"'  # the next job's pod, same GPUs


def served_gpu_ofu(port: int) -> list[dict[str, str]]:
    """The label sets of the gpu_ofu series a scrape of the prometheus exporter returns."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [dict(s.labels) for family in text_string_to_metric_families(text) if family.name == "gpu_ofu"
            for s in family.samples]


def test_a_gpu_that_moves_to_another_pod_is_one_gpu_ofu_series_end_to_end():
    """dcgm-exporter page (served) -> dcgm_exporter receiver -> attribution -> ofu -> prometheus exporter
    (scraped over HTTP): after its GPUs move to the next job's pod, each GPU is one gpu_ofu series, not two."""
    page = K8S_PAGE.read_bytes()
    assert page.count(FIRST_POD.encode()) == 20  # every series of GPUs 0 and 2 (ten metrics) names the pod
    moved = page.replace(FIRST_POD.encode(), NEXT_POD.encode())
    [port] = free_ports(1)
    with PageServer({"/metrics": page}) as node:
        doc = {
            "receivers": {"dcgm_exporter": {"endpoint": f"{node.url}/metrics", "collection_interval": "200ms",
                                            "exporter_collect_interval": "1s"}},
            "processors": {"attribution": {}, "ofu": {}},
            "exporters": {"prometheus": {"endpoint": f"127.0.0.1:{port}"}},
            "service": {"pipelines": {"metrics": {"receivers": ["dcgm_exporter"],
                                                  "processors": ["attribution", "ofu"],
                                                  "exporters": ["prometheus"]}}},
        }
        service = Service(parse_service_config(doc, "pod-change.yaml", registry.factories()))
        service.start()
        try:
            before = wait_for("gpu_ofu of the three GPUs", lambda: (s if len(s := served_gpu_ofu(port)) == 3 else None),
                              timeout=60)
            node.set("/metrics", moved)
            wait_for("gpu_ofu of the GPUs in the next pod", lambda: any(
                s.get("k8s_pod_name") == "job-b-worker-0" for s in served_gpu_ofu(port)), timeout=60)
            time.sleep(1.0)  # several more scrapes of the moved page
            after = served_gpu_ofu(port)
        finally:
            service.shutdown()
    pods = {s["gpu_index"]: s.get("k8s_pod_name") for s in after}
    assert len(after) == 3 and pods == {"0": "job-b-worker-0", "1": None, "2": "job-b-worker-0"}, after
    jobs_before = {s["gpu_index"]: s.get("ofu_job_id") for s in before}
    jobs_after = {s["gpu_index"]: s.get("ofu_job_id") for s in after}
    assert jobs_after["0"] != jobs_before["0"] and jobs_after["0"] == jobs_after["2"]  # a new job, same GPUs


def test_only_the_core_says_which_gpu_a_resource_is_about():
    """One notion of "the same GPU" (core.model.gpu_key): no other module defines its own GPU key."""
    import ast

    own = []
    for path in sorted((ROOT / "otel_ofu").rglob("*.py")):
        if path == ROOT / "otel_ofu" / "core" / "model.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    "gpu_key" in node.name or "gpu_identity" in node.name):
                own.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert own == []
