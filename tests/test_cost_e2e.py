"""What GPU time cost, end to end (issue 34 item 1): two served dcgm-exporter pages with pod labels, an H100 node
and a B200 node at different prices -> dcgm_exporter receiver -> attribution -> ofu -> jobs (cost) -> file.

The H100 page is tests/data/real/dcgm-exporter/4.5.3-4.8.2_h100_kubernetes.prom (dcgm-exporter 4.x's labels and
pod labels: its README names the sources); the B200 node's page is the same capture with the model, host, UUIDs
and pod changed, as a B200 node's dcgm-exporter writes them (only modelName, Hostname and the values differ).
Each page's GPU 1 has no pod: GPU time of no job, at its node's price.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from otel_ofu.core.model import job_id_of
from otel_ofu.otlp import codec as otlp
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.config import parse_service_config
from otel_ofu.pipeline.service import Service
from tests.e2e_util import PageServer, read_points, wait_for

ROOT = Path(__file__).resolve().parent.parent
H100_PAGE = (ROOT / "tests" / "data" / "real" / "dcgm-exporter" / "4.5.3-4.8.2_h100_kubernetes.prom").read_bytes()
B200_PAGE = (H100_PAGE.replace(b"NVIDIA H100 80GB HBM3", b"NVIDIA B200").replace(b"dgx-h100-017", b"dgx-b200-003")
             .replace(b"GPU-1f3c9a52-7d04-4e8b-a1c6-0b5e2d7f9a3", b"GPU-7b21e0c4-93d5-4f6a-8e17-5c9d0a2b4e6")
             .replace(b'pod="llama3-70b-worker-0"', b'pod="vit-finetune-0"'))
PRICES = {"NVIDIA H100 80GB HBM3": 2.99, "NVIDIA B200": 5.49}


def _job_end_events(path: Path) -> dict[str, dict]:
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith('{"resourceLogs"'):
            for event in otlp.events_from_request(otlp.from_json_line(line)):
                if event.name == "ofu.job.end":
                    attributes = dict(event.attributes)
                    out[str(attributes["ofu.job.id"])] = attributes
    return out


def test_each_jobs_cost_is_its_gpu_hours_times_its_nodes_price_end_to_end(tmp_path):
    assert B200_PAGE.count(b"NVIDIA B200") == H100_PAGE.count(b"NVIDIA H100 80GB HBM3") > 0
    out = tmp_path / "out.jsonl"
    with PageServer({"/metrics": H100_PAGE}) as h100, PageServer({"/metrics": B200_PAGE}) as b200:
        doc = {
            "receivers": {"dcgm_exporter": {"endpoints": [f"{h100.url}/metrics", f"{b200.url}/metrics"],
                                            "collection_interval": "200ms", "exporter_collect_interval": "1s"}},
            "processors": {"attribution": {}, "ofu": {},
                           "jobs": {"resolution": "1s", "windows": ["5s"], "default_interval": "1s",
                                    "max_gap": "5s", "job_timeout": "60s",
                                    "cost": {"currency": "USD", "per_gpu_hour": {"*H100*": 2.99, "b200": 5.49}}}},
            "exporters": {"file": {"path": str(out)}},
            "service": {"pipelines": {"metrics": {"receivers": ["dcgm_exporter"],
                                                  "processors": ["attribution", "ofu", "jobs"],
                                                  "exporters": ["file"]}}},
        }
        service = Service(parse_service_config(doc, "cost.yaml", registry.factories()))
        service.start()
        try:
            def priced_jobs() -> set[str] | None:
                stamps: dict[str, set[int]] = {}
                for p in read_points(out):
                    if p.name == "job.cost":
                        stamps.setdefault(str(job_id_of(p)), set()).add(p.time_unix_nano)
                return set(stamps) if len(stamps) == 2 and all(len(s) >= 3 for s in stamps.values()) else None

            jobs = wait_for("job.cost of both pods' jobs, three bins each", priced_jobs, timeout=90)
        finally:
            service.shutdown()  # the jobs end: each job's end event with its cost
    points = read_points(out)
    models = {str(job_id_of(p)): dict(p.resource)["hw.model"] for p in points
              if p.name == "gpu.ofu" and job_id_of(p) not in (None, "none")}
    assert set(models) == jobs and sorted(models.values()) == sorted(PRICES)
    for job in jobs:  # each stamp: the parts less the gain are the job's GPU-hours x its node's price
        mine = [p for p in points if job_id_of(p) == job]
        for stamp in sorted({p.time_unix_nano for p in mine if p.name == "job.cost"}):
            at = [p for p in mine if p.time_unix_nano == stamp]
            (seconds,) = [p.value for p in at if p.name == "job.gpu_seconds"]
            spent = math.fsum(p.value for p in at if p.name == "job.cost")
            gained = math.fsum(p.value for p in at if p.name == "job.cost.gained")
            assert spent - gained == pytest.approx(seconds / 3600 * PRICES[models[job]], rel=1e-9), (job, stamp)
            parts = {dict(p.attributes)["ofu.loss.part"] for p in at if p.name == "job.cost"}
            assert "useful" in parts and parts - {"useful"} == {dict(p.attributes)["ofu.loss.part"]
                                                               for p in at if p.name == "job.ofu.loss.gpu_hours"}
            assert {dict(p.attributes)["ofu.cost.currency"] for p in at if p.name == "job.cost"} == {"USD"}
    ended = _job_end_events(out)
    for job in jobs:  # over the whole job, its bins still open at the end too
        assert ended[job]["ofu.job.cost"] == pytest.approx(ended[job]["ofu.job.gpu_hours"] * PRICES[models[job]],
                                                           rel=1e-9)
        assert ended[job]["ofu.cost.currency"] == "USD"
    fleet = [p for p in points if p.name in ("fleet.cost", "fleet.cost.gained")]
    last = max(p.time_unix_nano for p in fleet)
    idle = [p.value for p in fleet if p.time_unix_nano == last and dict(p.attributes)["ofu.loss.part"] == "unallocated"]
    hours = [p.value for p in points if p.name == "fleet.gpu_hours" and p.time_unix_nano == last
             and dict(p.attributes)["ofu.loss.part"] == "unallocated"]
    # each node's GPU without a pod, at its own node's price: between the two
    assert idle and hours and 2.99 < idle[0] / hours[0] < 5.49
