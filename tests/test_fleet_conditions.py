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

from otel_ofu.core import specs
from otel_ofu.otlp import codec as otlp
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.config import parse_service_config
from otel_ofu.pipeline.service import Service
from tests.otlp_shapes import H100, Gpu, dcgm_exporter_request
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
    assert job_events(events) == {("ofu.job.start", "k8s:research/Pod/train-a"): 1,
                                  ("ofu.job.end", "k8s:research/Pod/train-a"): 1,
                                  ("ofu.job.start", "k8s:research/Pod/train-b"): 1,
                                  ("ofu.job.end", "k8s:research/Pod/train-b"): 1}
    ends = {dict(e.attributes)["ofu.job.id"]: dict(e.attributes) for e in events if e.name == "ofu.job.end"}
    assert {a["ofu.job.end_reason"] for a in ends.values()} == {"timeout"}
    assert ends["k8s:research/Pod/train-a"]["ofu.job.duration_s"] == 10 * 60  # its first window covers 30 s
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
    assert ends["k8s:research/Pod/train-a"]["ofu.job.gpu_hours"] * 3600 == ends["k8s:research/Pod/train-b"][
        "ofu.job.gpu_hours"] * 3600 == 15 * 60  # every window counted once


def gpu_points(points, name: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for p in points:
        if p.name == name:
            out.setdefault(dict(p.resource)["hw.id"], []).append(p)
    return out


def without(request, metric_name: str):
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            names = [m.name for m in sm.metrics]
            if metric_name in names:
                del sm.metrics[names.index(metric_name)]
    return request


# --- item 2: a GPU without TPA keeps its clock ---------------------------------------------------

def test_a_gpu_without_tpa_is_a_no_value_window_and_its_clock_is_forwarded(tmp_path):
    pipeline = Pipeline(tmp_path)
    t0 = time.time() - 60
    try:
        # Profiling off on node-p (no DCGM_FI_PROF_PIPE_TENSOR_ACTIVE at all); node-q as usual.
        pipeline.grpc(without(dcgm_exporter_request([pod_gpu(0, "GPU-p", "train-p")], int(t0 * 1e9), host="node-p"),
                              "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"))
        request = dcgm_exporter_request([pod_gpu(0, "GPU-q", "train-q")], int(t0 * 1e9), host="node-q")
        # A clock series of no GPU (no gpu or UUID label): nothing joins it, so it passes through.
        clock = next(m for m in request.resource_metrics[0].scope_metrics[0].metrics
                     if m.name == "DCGM_FI_DEV_SM_CLOCK")
        clock.gauge.data_points.add(time_unix_nano=int(t0 * 1e9), as_double=1234.0)
        pipeline.http(request)
    finally:
        points, _ = pipeline.stop()
    assert "GPU-p" not in gpu_points(points, "gpu.ofu") and "GPU-q" in gpu_points(points, "gpu.ofu")
    (dropped,) = gpu_points(points, "gpu.ofu.dropped")["GPU-p"]
    assert dict(dropped.attributes)["ofu.drop.reason"] == "missing" and dropped.value == 1
    (clock_p,) = gpu_points(points, "gpu.sm.clock.frequency")["GPU-p"]
    assert clock_p.value == 1500e6 and dict(clock_p.resource)["ofu.job.id"] == "k8s:research/Pod/train-p"
    forwarded = [p for p in points if p.name == "DCGM_FI_DEV_SM_CLOCK"]
    assert [(p.value, p.attributes) for p in forwarded] == [(1234.0, ())]
    assert {dict(p.attributes)["UUID"] for p in points if p.name == "DCGM_FI_DEV_POWER_USAGE"} == {"GPU-p", "GPU-q"}


# --- item 6: duplicates are one sample -----------------------------------------------------------

def test_a_duplicated_scrape_is_one_sample_and_a_resent_blank_window_counts_once(tmp_path):
    pipeline = Pipeline(tmp_path)
    t0 = int((time.time() - 60) * 1e9)
    try:
        twice = dcgm_exporter_request([pod_gpu(0, "GPU-d", "train-d")], t0, host="node-d")
        twice.resource_metrics.add().CopyFrom(twice.resource_metrics[0])  # the same scrape twice in one request
        pipeline.grpc(twice)
        blank = without(dcgm_exporter_request([pod_gpu(0, "GPU-e", "train-e")], t0, host="node-e"),
                        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
        pipeline.grpc(blank)
        pipeline.grpc(blank)  # a Collector retry after a lost response: the same windows again
    finally:
        points, _ = pipeline.stop()
    assert [p.value for p in gpu_points(points, "gpu.ofu.raw")["GPU-d"]] == [0.5 * 1500 / 1830]
    assert "GPU-d" not in gpu_points(points, "gpu.ofu.dropped")
    assert [p.value for p in gpu_points(points, "gpu.ofu.dropped")["GPU-e"]] == [1, 1]


# --- item 8: labels that are not strings, a blank in percent -----------------------------------

def test_non_string_labels_and_a_blank_tpa_in_percent(tmp_path):
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    pipeline = Pipeline(tmp_path)
    t0 = int((time.time() - 60) * 1e9)
    try:
        request = dcgm_exporter_request([pod_gpu(3, "GPU-i", "train-i"), pod_gpu(4, "GPU-j", "train-j")], t0,
                                        host="node-i")
        for metric in request.resource_metrics[0].scope_metrics[0].metrics:
            for dp in metric.gauge.data_points:  # a Collector transform made the GPU index an int
                for kv in dp.attributes:
                    if kv.key == "gpu":
                        kv.value.CopyFrom(AnyValue(int_value=int(kv.value.string_value)))
            if metric.name == "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE":
                metric.unit = "%"  # TPA in percent: 50 is 0.5
                metric.gauge.data_points[0].as_double = 50.0
                metric.gauge.data_points[1].as_int = 0x7FFFFFF0 + 2  # DCGM INT32 blank: not supported
        pipeline.grpc(request)
    finally:
        points, _ = pipeline.stop()
    (ofu_i,) = gpu_points(points, "gpu.ofu.raw")["GPU-i"]
    assert ofu_i.value == 0.5 * 1500 / 1830 and dict(ofu_i.resource)["gpu.index"] == "3"
    (dropped,) = gpu_points(points, "gpu.ofu.dropped")["GPU-j"]
    assert dict(dropped.attributes)["ofu.drop.reason"] == "not_supported"
    assert dict(dropped.resource)["gpu.index"] == "4"


# --- item 4: MIG instances stand for their slices -------------------------------------------------

def test_seven_1g_instances_add_up_to_one_gpu_not_seven(tmp_path):
    """Seven 1g.10gb instances of one H100 at TPA 1 and f_ref: together the GPU's peak, per instance 1/7."""
    processors = {"attribution": {"rules": [{"match": {"host": "node-m"}, "job_id": "mig-job", "precision": "bf16"}]},
                  "ofu": {"tile_correction": {"enabled": False}}, "jobs": {"default_interval": f"{STEP_S}s"}}
    pipeline = Pipeline(tmp_path, processors)
    base = time.time() - 600
    instances = [Gpu(0, "GPU-mig", 1.0, 1830.0, labels=(("GPU_I_ID", str(i)), ("GPU_I_PROFILE", "1g.10gb")))
                 for i in range(1, 8)]
    try:
        for t in range(STEP_S, 4 * 60 + 1, STEP_S):
            pipeline.grpc(dcgm_exporter_request(instances, int((base + t) * 1e9), host="node-m"))
    finally:
        points, events = pipeline.stop()
    peak = specs.find_spec(H100).peak("bf16").flops  # 989.4 TFLOP/s dense
    at_60 = int((base + 60) * 1e9)
    achieved = [p.value for p in points if p.name == "gpu.flops.achieved" and p.time_unix_nano == at_60]
    assert len(achieved) == 7 and all(abs(v - peak / 7) / peak < 1e-12 for v in achieved)
    rate = [p.value for p in points if p.name == "job.flops.achieved" and dict(p.attributes)["ofu.window"] == "5m"]
    assert rate and abs(rate[-1] - peak) / peak < 1e-9  # the job holds one GPU's worth, not 6,926 TFLOP/s
    (end,) = [dict(e.attributes) for e in events if e.name == "ofu.job.end"]
    assert abs(end["ofu.job.flops"] - peak * 4 * 60) / (peak * 4 * 60) < 1e-9
    flops_total = [p.value for p in points if p.name == "job.flops"]
    assert flops_total and all(v <= peak * 4 * 60 * (1 + 1e-9) for v in flops_total)
