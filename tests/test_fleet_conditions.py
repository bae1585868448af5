"""Real fleet conditions end to end (issue 11): OTLP in through the real ``otlp`` receiver (gRPC and
HTTP), attribution -> ofu -> jobs, OTLP JSON out through the ``file`` exporter.

Clock skew, a point from the future, a backlog replayed after a partition, GPUs without TPA,
MIG instances, duplicated scrapes and labels that are not strings, each as a Collector sends it.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import grpc

from otel_ofu.otlp import codec as otlp
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.config import parse_service_config
from otel_ofu.pipeline.service import Service
from tests.otlp_shapes import Gpu, dcgm_exporter_request
from tests.test_receiver_otlp import grpc_export, http_post

STEP_S = 30  # dcgm-exporter's default collect interval: one scrape per GPU per step


class Pipeline:
    """otlp -> attribution -> ofu -> jobs -> file, on free ports; read back after stop()."""

    def __init__(self, tmp_path: Path, processors: dict | None = None):
        self.out = tmp_path / "out.jsonl"
        processors = processors or {"attribution": {}, "ofu": {}, "jobs": {"default_interval": f"{STEP_S}s"}}
        doc = {
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"},
                                                 "http": {"endpoint": "127.0.0.1:0"}}}},
            "processors": processors,
            "exporters": {"file": {"path": str(self.out)}},
            "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "processors": list(processors),
                                                  "exporters": ["file"]}}},
        }
        self.service = Service(parse_service_config(doc, "test", registry.factories()))
        self.service.start()
        self.receiver = self.service.receivers["otlp"]

    def grpc(self, request) -> None:
        code, details = grpc_export(f"127.0.0.1:{self.receiver.grpc_port}", request.SerializeToString())
        assert code == grpc.StatusCode.OK, details

    def http(self, request) -> None:
        status, body, _ = http_post(self.receiver.http_port, request.SerializeToString())
        assert status == 200, body

    def stop(self) -> tuple[list, list]:
        self.service.shutdown()
        points, events = [], []
        for line in self.out.read_text().splitlines():
            request = otlp.from_json_line(line)
            if line.startswith('{"resourceLogs"'):
                events += otlp.events_from_request(request)
            else:
                points += otlp.from_request(request)
        return points, events


def pod_gpu(index: int, uuid: str, pod: str | None, tpa: float = 0.5) -> Gpu:
    labels = (("pod", pod), ("namespace", "research"), ("container", "trainer")) if pod else ()
    return Gpu(index, uuid, tpa, 1500.0, labels=labels)


def job_events(events) -> Counter:
    return Counter((e.name, dict(e.attributes)["ofu.job.id"]) for e in events if e.name.startswith("ofu.job."))


def scrape(host: str, t_s: float, pod: str | None):
    return dcgm_exporter_request([pod_gpu(0, f"GPU-{host}", pod)], int(t_s * 1e9), host=host)


# --- item 1: time per host ------------------------------------------------------------------

def test_clock_skew_and_a_point_a_day_ahead_give_one_start_and_one_end_per_job(tmp_path):
    """node-a's clock is 6 minutes behind; node-b sends one scrape stamped a day ahead."""
    pipeline = Pipeline(tmp_path)
    base = time.time() - 1800  # 20 minutes of scrapes, all in the past of this process's clock
    try:
        for t in range(STEP_S, 20 * 60 + 1, STEP_S):
            running = t <= 10 * 60  # both jobs run ten minutes; the GPUs then idle, still scraped
            pipeline.grpc(scrape("node-a", base + t - 360, "train-a" if running else None))
            pipeline.http(scrape("node-b", base + t, "train-b" if running else None))
            if t == 5 * 60:
                pipeline.grpc(scrape("node-b", base + t + 86400, "train-b"))
    finally:
        points, events = pipeline.stop()
    assert job_events(events) == {("ofu.job.start", "k8s:research/train-a"): 1,
                                  ("ofu.job.end", "k8s:research/train-a"): 1,
                                  ("ofu.job.start", "k8s:research/train-b"): 1,
                                  ("ofu.job.end", "k8s:research/train-b"): 1}
    ends = {dict(e.attributes)["ofu.job.id"]: dict(e.attributes) for e in events if e.name == "ofu.job.end"}
    assert {a["ofu.job.end_reason"] for a in ends.values()} == {"timeout"}
    assert ends["k8s:research/train-a"]["ofu.job.duration_s"] == 10 * 60  # its first window covers 30 s
    # The scrape from the future still passed through as the GPU's OFU; only the job books skipped it.
    assert any(p.name == "gpu.ofu" and p.time_unix_nano > (base + 86000) * 1e9 for p in points)


def test_a_backlog_replayed_after_a_partition_does_not_end_the_job(tmp_path):
    """node-a is cut off for 8 minutes; its Collector then sends the backlog, oldest first."""
    pipeline = Pipeline(tmp_path)
    base = time.time() - 1800
    held = []
    try:
        for t in range(STEP_S, 20 * 60 + 1, STEP_S):
            running = t <= 15 * 60
            a = scrape("node-a", base + t, "train-a" if running else None)
            if 3 * 60 <= t < 11 * 60:
                held.append(a)
            else:
                for request in [*held, a]:
                    pipeline.http(request)
                held = []
            pipeline.grpc(scrape("node-b", base + t, "train-b" if running else None))
    finally:
        _, events = pipeline.stop()
    assert set(job_events(events).values()) == {1} and len(job_events(events)) == 4
    ends = {dict(e.attributes)["ofu.job.id"]: dict(e.attributes) for e in events if e.name == "ofu.job.end"}
    assert ends["k8s:research/train-a"]["ofu.job.gpu_hours"] * 3600 == ends["k8s:research/train-b"][
        "ofu.job.gpu_hours"] * 3600 == 15 * 60  # every window counted once
