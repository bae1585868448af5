"""GPUs without a UUID (dmon, CSV) and MIG instances are distinct entities through the whole
pipeline: attribution, ofu, jobs, the exporters and the report."""

import json
import subprocess
import sys
from pathlib import Path

from otel_ofu.cli.main import main
from otel_ofu.core.model import gpu_key, precision_of
from tests.e2e_util import read_points

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
