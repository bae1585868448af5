"""The prometheus receiver: a training job's own /metrics page, served by a real local HTTP server."""

from __future__ import annotations

import pytest

from otel_ofu.core.model import Batch, job_id_of
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.receivers.prometheus import PrometheusReceiver, PrometheusReceiverConfig, parse_reports
from tests.e2e_util import PageServer
from tests.test_attribution import make as make_attribution

# A page with the reporter's resource in target_info (as the OpenTelemetry exporters write it),
# unit 1 as the _ratio suffix (the Collector's and Prometheus 3's translation; the real
# OpenTelemetry Python exporter is tested below), plus a page's own gauges.
OTEL_PAGE = """# HELP target_info Target metadata
# TYPE target_info gauge
target_info{service_name="training",k8s_pod_name="llama-1",k8s_namespace_name="llm",process_pid="4711"} 1
# HELP training_mfu_ratio MFU the training job computes for itself
# TYPE training_mfu_ratio gauge
training_mfu_ratio{rank="0"} 0.52
training_mfu_ratio{rank="1"} NaN
# TYPE megatron_training_throughput_tflops gauge
megatron_training_throughput_tflops{k8s_pod_name="llama-0"} 512.5
# TYPE training_loss gauge
training_loss 2.3
# TYPE training_mfu_total counter
training_mfu_total 7
"""


@pytest.fixture
def page():
    with PageServer({"/metrics": OTEL_PAGE.encode()}) as server:
        yield server.url


def make(config: dict) -> PrometheusReceiver:
    cfg = build_config(PrometheusReceiverConfig, config)
    return PrometheusReceiver(cfg, Context("prometheus", Telemetry()), lambda batch: None)


def test_reports_and_their_identity_from_target_info_and_labels(page):
    batch = make({"endpoint": page}).poll()
    mfu, tflops = sorted(batch.points, key=lambda p: p.name, reverse=True)
    assert (mfu.name, mfu.value, mfu.unit) == ("training.mfu", 0.52, "{ratio}")  # the metric's declared unit
    assert dict(mfu.resource) == {"service.name": "training", "k8s.pod.name": "llama-1",
                                  "k8s.namespace.name": "llm", "process.pid": 4711}
    assert dict(mfu.attributes) == {"rank": "0"}  # the NaN rank is no value; rank keeps ranks apart
    assert (tflops.name, tflops.value) == ("megatron.training.throughput_tflops", 512.5)
    assert dict(tflops.resource)["k8s.pod.name"] == "llama-0"  # the sample's own label wins over target_info
    assert {p.name for p in batch.points} == {"training.mfu", "megatron.training.throughput_tflops"}  # not loss


def test_configured_names_and_resource_win(page):
    batch = make({"endpoint": page, "metrics": {"training_loss": "training.mfu"},
                  "resource": {"k8s.pod.name": "llama-7", "slurm.job.id": "99"}}).poll()
    (point,) = batch.points
    assert point.value == 2.3 and dict(point.resource)["k8s.pod.name"] == "llama-7"


def test_scraped_reports_get_their_job_from_attribution(page):
    points = make({"endpoint": page}).poll().points
    out = make_attribution().process(Batch(points=points)).points
    assert sorted(job_id_of(p) for p in out) == ["k8s:llm/Pod/llama-0", "k8s:llm/Pod/llama-1"]


def test_a_dead_endpoint_is_counted_and_a_bad_page_is_malformed(page):
    receiver = make({"endpoints": [f"{page}/nothing-here", page.replace("http://", "") + "/metrics"]})
    batch = receiver.poll()
    assert len(batch.points) == 2  # the good endpoint still gives its points
    errors = receiver.context.telemetry.counters("otel_ofu.scrape.errors")
    assert [dict(a)["reason"] for a in errors] == ["http_404"]
    with pytest.raises(ValueError):
        parse_reports("training_mfu{{{ 1\n", metrics={"training_mfu": "training.mfu"}, time_unix_nano=1)


@pytest.mark.parametrize(("config", "key"), [
    ({}, "endpoint"),
    ({"endpoint": "ftp://x"}, "endpoint"),
    ({"endpoint": "x:1", "metrics": {}}, "metrics"),
    ({"endpoint": "x:1", "metrics": {"a": ""}}, "metrics.a"),
    ({"endpoint": "x:1", "collection_interval": "1s", "scrape_timeout": "2s"}, "scrape_timeout"),
])
def test_bad_config_names_the_key(config, key):
    with pytest.raises(FieldError) as err:
        build_config(PrometheusReceiverConfig, config)
    assert err.value.key == key


def test_reports_as_the_opentelemetry_prometheus_exporter_names_them():
    """The project's own reporter behind the real opentelemetry-exporter-prometheus, served by
    prometheus_client's own HTTP server: T{flop}/s becomes training_tflops_per_gpu_T_per_second."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.resources import Resource
    from prometheus_client import CollectorRegistry, start_http_server

    from otel_ofu.training.report import MfuReporter
    from tools.ports import free_ports

    registry = CollectorRegistry()
    reporter = MfuReporter(PrometheusMetricReader(registry=registry),
                           Resource.create({"service.name": "trainer", "k8s.pod.name": "llama-3",
                                            "k8s.namespace.name": "llm"}))
    (port,) = free_ports(1)
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        reporter.report(mfu=0.41, tflops_per_gpu=412.5)
        batch = make({"endpoint": f"127.0.0.1:{port}"}).poll()
    finally:
        server.shutdown()
        server.server_close()
        reporter.shutdown()
    values = {p.name: p.value for p in batch.points}
    assert values == {"training.mfu": 0.41, "training.tflops_per_gpu": 412.5}
    assert {dict(p.resource)["k8s.pod.name"] for p in batch.points} == {"llama-3"}  # from target_info


@pytest.mark.parametrize(("name", "unit", "written"), [
    # OpenTelemetry Python's exporter (opentelemetry/exporter/prometheus/_mapping.py map_unit): the
    # {flop} annotation dropped, T kept, /s -> _per_second; unit 1 -> no suffix.
    ("training.tflops_per_gpu", "T{flop}/s", "training_tflops_per_gpu_T_per_second"),
    ("training.mfu", "1", "training_mfu"),
    # Prometheus 3's OTLP translation and the Collector's prometheus exporter (prometheus/otlptranslator
    # at 51da773, metric_namer.go buildUnitSuffixes: a main unit with {} is dropped whole; gauges of
    # unit 1 get _ratio), with suffixes, escaped or UTF-8, and without suffixes.
    ("training.tflops_per_gpu", "T{flop}/s", "training_tflops_per_gpu_per_second"),
    ("training.tflops_per_gpu", "T{flop}/s", "training.tflops_per_gpu_per_second"),
    ("training.tflops_per_gpu", "T{flop}/s", "training.tflops_per_gpu"),
    ("training.mfu", "1", "training_mfu_ratio"),
    ("training.mfu", "1", "training.mfu_ratio"),
    ("training.mfu", "1", "training.mfu"),
])
def test_default_names_cover_every_translation(name, unit, written):
    from otel_ofu.receivers.prometheus import prometheus_names

    assert written in prometheus_names(name, unit)
    assert PrometheusReceiverConfig().metrics[written] == name
