"""A real Prometheus (Debian's package) scrapes otel-ofu's prometheus exporter; PromQL returns the OFU.

Skipped locally when prometheus is not installed (collector/install-prometheus.sh installs
it); failing instead when CI is set.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import yaml

from otel_ofu.pipeline import registry
from otel_ofu.pipeline.config import load_document, parse_service_config
from otel_ofu.pipeline.service import Service
from tests.e2e_util import ROOT, Process, free_ports, prometheus_binary, read_points, wait_for

GPUS = 8  # collector-config/prometheus.yaml: one simulated node of eight GPUs


def promql(port: int, query: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
    except OSError:
        return []
    return body["data"]["result"] if body.get("status") == "success" else []


def test_promql_returns_the_ofu_per_gpu_the_pipeline_computed(tmp_path, monkeypatch):
    prometheus = prometheus_binary()
    ofu_port, prom_port = free_ports(2)
    monkeypatch.setenv("OFU_PROMETHEUS_ENDPOINT", f"127.0.0.1:{ofu_port}")
    # The shipped config, a window per wall second, and a file exporter recording what was computed.
    doc = load_document(ROOT / "collector-config" / "prometheus.yaml")
    doc["receivers"]["sim"]["time_acceleration"] = 10
    computed_file = tmp_path / "computed.jsonl"
    doc["exporters"]["file"] = {"path": str(computed_file)}
    doc["service"]["pipelines"]["metrics"]["exporters"].append("file")
    service = Service(parse_service_config(doc, "prometheus.yaml", registry.factories()))

    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "otel-ofu", "static_configs": [{"targets": [f"127.0.0.1:{ofu_port}"]}]}],
    }))
    service.start()
    prom = Process("prometheus", [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                  f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                  f"--web.listen-address=127.0.0.1:{prom_port}"], tmp_path / "prometheus.log")
    try:
        result = wait_for("PromQL gpu_ofu to return every GPU", lambda: (
            r if len(r := promql(prom_port, "gpu_ofu")) == GPUS else None), timeout=180, interval=0.5,
            diagnostics=prom.tail)
    finally:
        prom.stop()
        service.shutdown()

    computed: dict[str, set[float]] = {}
    for point in read_points(computed_file):
        if point.name == "gpu.ofu":
            computed.setdefault(dict(point.resource)["hw.id"], set()).add(point.value)
    assert len(computed) == GPUS
    by_gpu = {series["metric"]["hw_id"]: series for series in result}
    assert by_gpu.keys() == computed.keys()
    for hw_id, series in by_gpu.items():
        labels = series["metric"]
        assert labels["__name__"] == "gpu_ofu" and labels["job"] == "otel-ofu"
        assert labels["host_name"] and labels["hw_model"] and labels["ofu_job_id"]
        # The value Prometheus stored is one the pipeline computed for this GPU, to the last bit.
        assert float(series["value"][1]) in computed[hw_id], (hw_id, series["value"], sorted(computed[hw_id]))
