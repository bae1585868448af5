"""Another otel-ofu's output over OTLP: decoded into points as it was sent, used as is, forwarded once."""

from __future__ import annotations

import logging
from collections import Counter

import grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu.core.metrics import GPU_METRICS, TRAINING_REPORT_METRICS
from otel_ofu.core.model import JOB_ID, PRECISION, Batch, MetricPoint, attrs
from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp import join as otlp_join
from otel_ofu.otlp.payload import metrics_payload
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.processors.jobs import JobsProcessor
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.otlp import DECODED, DEFAULT_DECODE, OtlpReceiver, OtlpReceiverConfig
from tests.otlp_shapes import Gpu, dcgm_exporter_request
from tools.fleet_sim import NodeTier

JOBS = [{"id": "train-a", "scenario": "steady", "gpus": 6, "precision": "bf16"},
        {"id": "moe-b", "scenario": "moe_inflated", "gpus": 4}]


def node_points(windows: int = 2) -> list[MetricPoint]:
    tier = NodeTier.of(nodes=3, gpus_per_node=4, jobs=JOBS)
    return [p for _ in range(windows) for points in tier.window().values() for p in points]


def foreign_request(t: int) -> ExportMetricsServiceRequest:
    """Something otel-ofu does not make: a Collector's dcgm-exporter scrape extra (no TPA)."""
    request = dcgm_exporter_request([Gpu(0, "GPU-x", 0.5, 1700.0)], t)
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            keep = [m for m in sm.metrics if m.name == "DCGM_FI_DEV_GPU_TEMP"]
            del sm.metrics[:]
            sm.metrics.extend(keep)
    return request


def key(p: MetricPoint) -> tuple:
    return (p.name, p.value, p.time_unix_nano, p.resource, p.attributes, p.unit, p.monotonic,
            p.start_time_unix_nano)


def test_default_decode_list_is_otel_ofus_per_gpu_metrics_and_what_jobs_report():
    assert set(DEFAULT_DECODE) == {*GPU_METRICS, *TRAINING_REPORT_METRICS}
    assert OtlpReceiverConfig().decode == list(DEFAULT_DECODE)


def test_what_a_node_sends_decodes_to_the_same_points_and_the_rest_passes_through():
    sent = node_points()
    body = otlp.encode_request(sent) + foreign_request(sent[0].time_unix_nano).SerializeToString()
    for wire in (body, None):
        found = otlp_join.split(ExportMetricsServiceRequest.FromString(body), wire=wire,
                                decode=frozenset(DEFAULT_DECODE))
        assert not found.samples
        assert Counter(map(key, found.points)) == Counter(map(key, sent))
        # Job identity arrives on the resource, as the node put it there.
        ofu = next(p for p in found.points if p.name == "gpu.ofu" and dict(p.resource)[JOB_ID] == "train-a")
        assert dict(ofu.resource)[PRECISION] == "bf16"
        names = [m.name for rm in otlp.passthrough_messages(found.passthrough) for sm in rm.scope_metrics
                 for m in sm.metrics]
        assert names == ["DCGM_FI_DEV_GPU_TEMP"]
        # Forwarded once: every point leaves as a point, the foreign metric as its bytes.
        payload, count = metrics_payload(found.points, found.passthrough)
        out = list(otlp.from_request(ExportMetricsServiceRequest.FromString(payload)))
        assert count == len(out) == len(sent) + 1
        assert Counter(map(key, [p for p in out if p.name != "DCGM_FI_DEV_GPU_TEMP"])) == Counter(map(key, sent))


def test_a_metric_not_in_the_list_passes_through_as_bytes():
    sent = node_points(1)
    found = otlp_join.split(ExportMetricsServiceRequest.FromString(otlp.encode_request(sent)),
                            decode=frozenset({"gpu.ofu"}))
    assert {p.name for p in found.points} == {"gpu.ofu"}
    passed = Counter(m.name for rm in otlp.passthrough_messages(found.passthrough) for sm in rm.scope_metrics
                     for m in sm.metrics for _ in m.gauge.data_points)
    assert passed == Counter(p.name for p in sent if p.name != "gpu.ofu")


def test_a_histogram_under_a_decoded_name_passes_through_and_is_logged_once(caplog):
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add(name="training.mfu")
    metric.histogram.data_points.add(time_unix_nano=1, count=1, sum=0.5)
    batches: list[Batch] = []
    receiver = OtlpReceiver(OtlpReceiverConfig(), Context("otlp"), batches.append)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            receiver.accept(ExportMetricsServiceRequest.FromString(request.SerializeToString()), "grpc")
    assert all(not b.points and len(b.passthrough) == 1 for b in batches)
    assert sum("training.mfu" in r.getMessage() for r in caplog.records) == 1


def test_decode_cannot_name_a_dcgm_input():
    try:
        build_config(OtlpReceiverConfig, {"decode": ["DCGM_FI_DEV_SM_CLOCK"]})
    except FieldError as exc:
        assert exc.key == "decode[0]" and "DCGM input" in str(exc)
    else:
        raise AssertionError("accepted")


def test_ofu_that_arrives_computed_is_not_computed_again_unless_configured():
    """A GPU's DCGM inputs and its already computed OFU in one batch: one gpu.ofu, not two."""
    t = 1_767_225_600_000_000_000
    request = dcgm_exporter_request([Gpu(0, "GPU-x", 0.5, 1830.0)], t, host="node-1")
    samples, _ = otlp_join.split_request(request)
    computed = OfuProcessor(OfuProcessorConfig(), Context("node")).sample_points(samples[0])
    # What a node agent computed for that GPU, with a job on it.
    arriving = [MetricPoint(p.name, p.value * (2 if p.name == "gpu.ofu" else 1), p.time_unix_nano,
                            attrs({**dict(p.resource), JOB_ID: "job-1"}), p.attributes, p.unit) for p in computed]
    as_is = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    out = as_is.process(Batch(samples=list(samples), points=list(arriving)))
    ofu = [p for p in out.points if p.name == "gpu.ofu"]
    assert [p.value for p in ofu] == [next(p.value for p in arriving if p.name == "gpu.ofu")]
    assert as_is.context.telemetry.counter("otel_ofu.ofu.skipped", reason="already_computed") == 1
    # recompute: the arriving OFU is replaced by OFU computed here from the inputs it came with.
    again = OfuProcessor(build_config(OfuProcessorConfig, {"recompute": True}), Context("ofu"))
    out = again.process(Batch(points=list(arriving)))
    by_name = Counter(p.name for p in out.points)
    assert by_name["gpu.ofu"] == 1 and by_name["gpu.tensor.activity"] == 1
    ofu = next(p for p in out.points if p.name == "gpu.ofu")
    assert abs(ofu.value - next(p.value for p in computed if p.name == "gpu.ofu")) < 1e-9
    assert dict(ofu.resource) == dict(arriving[0].resource)


def test_a_jobs_tier_over_grpc_gets_the_same_jobs_as_the_node_agents_own_pipeline():
    """Node output sent over real OTLP/gRPC to an otlp receiver + jobs processor == jobs run on the node."""
    tier = NodeTier.of(nodes=3, gpus_per_node=4, jobs=JOBS)
    windows = [[p for points in tier.window().values() for p in points] for _ in range(60)]
    local = JobsProcessor(_jobs_config(), Context("local"))
    remote = JobsProcessor(_jobs_config(), Context("jobs"))
    receiver = OtlpReceiver(build_config(OtlpReceiverConfig, {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}),
                            Context("otlp"), lambda batch: remote_out.append(remote.process(batch)))
    remote_out: list[Batch] = []
    receiver.start()
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}")
        export = channel.unary_unary("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export")
        local_out = []
        for points in windows:
            local_out.append(local.process(Batch(points=list(points))))
            export(otlp.encode_request(points), timeout=10)
        channel.close()
    finally:
        receiver.shutdown()
    assert receiver.context.telemetry.counter(DECODED.name, receiver="otlp") == sum(map(len, windows))

    def jobs(batches: list[Batch]) -> list[tuple]:
        return sorted((p.name, dict(p.resource)[JOB_ID], p.time_unix_nano, p.attributes, round(p.value, 12))
                      for b in batches for p in b.points if p.name.startswith("job."))

    assert jobs(local_out) and jobs(remote_out) == jobs(local_out)
    assert [e.name for b in remote_out for e in b.events] == [e.name for b in local_out for e in b.events]


def _jobs_config():
    from otel_ofu.jobs.config import JobsConfig

    return build_config(JobsConfig, {})
