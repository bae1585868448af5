"""The prometheus exporter: scraped over HTTP and parsed with prometheus_client's parser."""

from __future__ import annotations

import urllib.request

import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_DELTA, ResourceMetrics
from prometheus_client.parser import text_string_to_metric_families

from otel_ofu.core.model import Batch, MetricPoint
from otel_ofu.exporters.prometheus import (
    PrometheusExporter,
    PrometheusExporterConfig,
    label_name,
    prometheus_name,
    to_labels,
)
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.processors.jobs import JobsProcessor
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.sim import SimReceiverConfig, build_fleet, window_batch
from tests.otlp_shapes import Gpu, dcgm_exporter_request

T0 = 1_764_000_000_000_000_000
GPU_A = (("host.name", "node-1"), ("hw.id", "GPU-a"), ("hw.model", "NVIDIA H100 80GB HBM3"),
         ("k8s.pod.name", "trainer-0"))
GPU_B = (("host.name", "node-1"), ("hw.id", "GPU-b"), ("hw.model", "NVIDIA H100 80GB HBM3"))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def exporter():
    made: list[PrometheusExporter] = []

    def make(**config) -> PrometheusExporter:
        exp = PrometheusExporter(build_config(PrometheusExporterConfig, {"endpoint": "127.0.0.1:0", **config}),
                                 Context("prometheus"))
        exp.clock = FakeClock()
        exp.start()
        made.append(exp)
        return exp

    yield make
    for exp in made:
        exp.shutdown()


def scrape(exp: PrometheusExporter) -> dict[str, dict]:
    """name -> {"type": ..., "samples": {(sample name, labels): (value, timestamp)}}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{exp.port}/metrics", timeout=20) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = {"type": family.type, "samples": {
            (s.name, tuple(sorted(s.labels.items()))): (s.value, s.timestamp) for s in family.samples}}
    return out


def job(name: str) -> tuple:
    return (("ofu.job.id", name), ("ofu.precision", "bf16"))


def test_names_units_and_labels_as_the_collector_converts_them():
    assert prometheus_name("gpu.ofu", "1", counter=False) == "gpu_ofu"
    assert prometheus_name("gpu.ofu", "1", counter=False, ratio_suffix=True) == "gpu_ofu_ratio"
    assert prometheus_name("gpu.sm.clock.frequency", "Hz", counter=False) == "gpu_sm_clock_frequency_hertz"
    assert prometheus_name("gpu.power.usage", "W", counter=False) == "gpu_power_usage_watts"
    assert prometheus_name("gpu.flops.achieved", "{flop}/s", counter=False) == "gpu_flops_achieved_per_second"
    assert prometheus_name("gpu.ofu.dropped", "{window}", counter=True) == "gpu_ofu_dropped"  # + _total on samples
    assert prometheus_name("requests.total", "", counter=True) == "requests"
    assert prometheus_name("latency.seconds", "s", counter=False) == "latency_seconds"  # no double suffix
    assert prometheus_name("job.gpu_seconds", "s", counter=True) == "job_gpu_seconds"  # "_" separates tokens too
    assert prometheus_name("job.wasted_gpu_hours", "h", counter=True) == "job_wasted_gpu_hours"
    assert prometheus_name("gpu.power.usage", "W", counter=False, add_suffixes=False) == "gpu_power_usage"
    assert prometheus_name("9lives", "", counter=False, namespace="") == "_9lives"
    assert prometheus_name("gpu.ofu", "1", counter=False, namespace="fleet") == "fleet_gpu_ofu"
    assert prometheus_name("DCGM_FI_DEV_SM_CLOCK", "", counter=False) == "DCGM_FI_DEV_SM_CLOCK"
    assert label_name("k8s.pod.name") == "k8s_pod_name"
    assert label_name("0day") == "key_0day" and label_name("_x") == "key_x" and label_name("__x") == "__x"
    assert to_labels((("a.b", "x"), ("a_b", "y"), ("on", True))) == (("a_b", "x;y"), ("on", "true"))


def test_scrape_serves_latest_points_with_converted_names_and_no_timestamps(exporter):
    exp = exporter()
    exp.export(Batch(points=[
        MetricPoint("gpu.ofu", 0.25, T0, GPU_A, job("llama")),
        MetricPoint("gpu.ofu", 0.5, T0, GPU_B, job("llama")),
        MetricPoint("gpu.sm.clock.frequency", 1.755e9, T0, GPU_A, job("llama"), "Hz"),
        MetricPoint("gpu.power.usage", 512.0, T0, GPU_A, job("llama"), "W"),
        MetricPoint("gpu.ofu.dropped", 3, T0, GPU_B, (("ofu.drop.reason", "blank"),), "{window}", monotonic=True),
    ]))
    # A later point replaces a series' value; a late-arriving older one does not.
    exp.export(Batch(points=[MetricPoint("gpu.ofu", 0.3, T0 + 10**10, GPU_A, job("llama"))]))
    exp.export(Batch(points=[MetricPoint("gpu.ofu", 0.1, T0 - 10**10, GPU_A, job("llama"))]))
    got = scrape(exp)
    labels_a = (("host_name", "node-1"), ("hw_id", "GPU-a"), ("hw_model", "NVIDIA H100 80GB HBM3"),
                ("k8s_pod_name", "trainer-0"), ("ofu_job_id", "llama"), ("ofu_precision", "bf16"))
    assert got["gpu_ofu"]["type"] == "gauge"
    assert got["gpu_ofu"]["samples"][("gpu_ofu", labels_a)] == (0.3, None)
    assert len(got["gpu_ofu"]["samples"]) == 2
    assert got["gpu_sm_clock_frequency_hertz"]["samples"][("gpu_sm_clock_frequency_hertz", labels_a)][0] == 1.755e9
    assert got["gpu_power_usage_watts"]["samples"][("gpu_power_usage_watts", labels_a)][0] == 512.0
    dropped = got["gpu_ofu_dropped"]
    assert dropped["type"] == "counter"
    [(name, labels)] = dropped["samples"]
    assert name == "gpu_ofu_dropped_total" and dict(labels)["ofu_drop_reason"] == "blank"


def test_send_timestamps_and_const_labels(exporter):
    exp = exporter(send_timestamps=True, const_labels={"cluster": "eu-1"})
    exp.export(Batch(points=[MetricPoint("gpu.ofu", 0.25, T0 + 5 * 10**8, GPU_B, job("x"))]))
    [(key, (value, stamp))] = scrape(exp)["gpu_ofu"]["samples"].items()
    assert dict(key[1])["cluster"] == "eu-1"
    assert float(stamp) == pytest.approx((T0 + 5 * 10**8) / 1e9)


def test_metric_expiration_removes_a_finished_jobs_series(exporter):
    exp = exporter(metric_expiration="5m")
    exp.export(Batch(points=[MetricPoint("gpu.ofu", 0.4, T0, GPU_A, job("finished")),
                             MetricPoint("gpu.ofu", 0.5, T0, GPU_B, job("running"))]))
    exp.clock.now += 240
    exp.export(Batch(points=[MetricPoint("gpu.ofu", 0.6, T0 + 240 * 10**9, GPU_B, job("running"))]))
    assert len(scrape(exp)["gpu_ofu"]["samples"]) == 2  # 4 min old: still there
    exp.clock.now += 61
    samples = scrape(exp)["gpu_ofu"]["samples"]
    assert [dict(labels)["ofu_job_id"] for _, labels in samples] == ["running"]
    exp.clock.now += 301
    assert "gpu_ofu" not in scrape(exp)
    assert exp.snapshot() == {}


def test_without_resource_conversion_job_instance_and_target_info(exporter):
    exp = exporter(resource_to_telemetry_conversion={"enabled": False})
    # Job identity on the resource (as the ofu processor puts it) stays a label: job_labels.
    resource = (("host.name", "node-1"), ("service.instance.id", "node-1"), ("service.name", "otel-ofu"), *job("x"))
    exp.export(Batch(points=[MetricPoint("gpu.ofu", 0.25, T0, resource)]))
    got = scrape(exp)
    [(_, labels)] = got["gpu_ofu"]["samples"]
    assert dict(labels) == {"job": "otel-ofu", "instance": "node-1", "ofu_job_id": "x", "ofu_precision": "bf16"}
    [(_, info_labels)] = got["target_info"]["samples"]
    assert dict(info_labels) == {"job": "otel-ofu", "instance": "node-1", "host_name": "node-1",
                                 "ofu_job_id": "x", "ofu_precision": "bf16"}

    plain = exporter(resource_to_telemetry_conversion={"enabled": False}, job_labels=[])
    plain.export(Batch(points=[MetricPoint("gpu.ofu", 0.25, T0, resource)]))
    [(_, labels)] = scrape(plain)["gpu_ofu"]["samples"]
    assert dict(labels) == {"job": "otel-ofu", "instance": "node-1"}


def test_a_job_change_on_a_gpu_drops_the_previous_jobs_series_at_once(exporter):
    exp = exporter()
    old_job, new_job, other_gpu = (*GPU_B, *job("old")), (*GPU_B, *job("new")), (*GPU_A, *job("old"))
    exp.export(Batch(points=[MetricPoint("gpu.ofu", 0.4, T0, old_job), MetricPoint("gpu.ofu", 0.3, T0, other_gpu),
                             MetricPoint("gpu.tensor.activity", 0.5, T0, old_job)]))
    exp.export(Batch(points=[MetricPoint("gpu.ofu", 0.2, T0 + 10**10, new_job)]))
    got = scrape(exp)
    by_gpu = {(dict(labels)["hw_id"], dict(labels)["ofu_job_id"]) for _, labels in got["gpu_ofu"]["samples"]}
    assert by_gpu == {("GPU-b", "new"), ("GPU-a", "old")}  # GPU-a still holds "old"
    assert "gpu_tensor_activity" not in got  # every series of GPU-b's old job went with it
    # A late point of the job the GPU has left does not bring its series back.
    exp.export(Batch(points=[MetricPoint("gpu.ofu", 0.4, T0 + 5 * 10**9, old_job)]))
    assert {dict(labels)["ofu_job_id"] for _, labels in scrape(exp)["gpu_ofu"]["samples"]} == {"new", "old"}
    assert len(scrape(exp)["gpu_ofu"]["samples"]) == 2
    # Per-job series (no GPU on the resource) are not GPUs: several jobs live side by side.
    exp.export(Batch(points=[MetricPoint("job.ofu", 0.2, T0, (("ofu.job.id", "a"),)),
                             MetricPoint("job.ofu", 0.3, T0 + 1, (("ofu.job.id", "b"),))]))
    assert len(scrape(exp)["job_ofu"]["samples"]) == 2


def test_passthrough_gauges_and_cumulative_sums_are_served(exporter):
    exp = exporter()
    [rm] = dcgm_exporter_request([Gpu(0, "GPU-a", 0.5, 1500.0, power_w=321.0)], T0).resource_metrics
    sm = rm.scope_metrics[0]
    energy = sm.metrics.add(name="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", unit="mJ")
    energy.sum.is_monotonic = True
    energy.sum.aggregation_temporality = 2  # cumulative
    energy.sum.data_points.add(time_unix_nano=T0, as_int=123456)
    delta = sm.metrics.add(name="requests.delta")
    delta.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_DELTA
    delta.sum.data_points.add(time_unix_nano=T0, as_int=5)
    sm.metrics.add(name="latency").histogram.data_points.add(time_unix_nano=T0, count=1)
    exp.export(Batch(passthrough=[rm, "not a ResourceMetrics"]))
    got = scrape(exp)
    [(key, (value, _))] = got["DCGM_FI_DEV_POWER_USAGE"]["samples"].items()
    assert value == 321.0 and dict(key[1])["UUID"] == "GPU-a" and dict(key[1])["service_name"] == "dcgm-exporter"
    assert got["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_mJ"]["type"] == "counter"
    assert "requests_delta" not in got and "latency" not in got
    off = exporter(passthrough=False)
    off.export(Batch(passthrough=[ResourceMetrics(), rm]))
    assert scrape(off) == {}


def test_ofu_pipeline_output_round_trips(exporter):
    # What the ofu processor emits for a simulated node is what a scrape returns, per GPU.
    config = build_config(SimReceiverConfig, {"nodes": 1, "gpus_per_node": 4, "jobs": [
        {"id": "train", "scenario": "steady", "gpus": 4, "node": 0}]})
    fleet = build_fleet(config, 1_764_000_000.0)
    batch = OfuProcessor(OfuProcessorConfig(), Context("ofu")).process(window_batch(fleet.step_window(), False))
    exp = exporter()
    exp.export(batch)
    served = {dict(labels)["hw_id"]: value for (_, labels), (value, _) in scrape(exp)["gpu_ofu"]["samples"].items()}
    computed = {dict(p.resource)["hw.id"]: p.value for p in batch.points if p.name == "gpu.ofu"}
    assert len(computed) == 4 and served == computed


def test_config_defaults_and_errors():
    config = build_config(PrometheusExporterConfig, {})
    assert config.endpoint == "127.0.0.1:9464"
    assert float(config.metric_expiration) == 300.0
    assert config.resource_to_telemetry_conversion.enabled is True
    assert config.send_timestamps is False
    with pytest.raises(FieldError, match="endpoint"):
        build_config(PrometheusExporterConfig, {"endpoint": "9464"})
    with pytest.raises(FieldError, match="namespace"):
        build_config(PrometheusExporterConfig, {"namespace": "my-ns"})


def test_series_of_gone_pods_expire_without_any_scrape(exporter):
    """Prometheus down for days: nothing scrapes, yet 200 pods' series do not pile up (issue 11, item 5)."""
    exp = exporter(metric_expiration="5m", resource_to_telemetry_conversion={"enabled": False})
    for pod in range(200):
        exp.clock.now += 10
        resource = (("host.name", "node-1"), ("hw.id", f"GPU-{pod % 8}"), ("k8s.pod.name", f"pod-{pod}"))
        exp.export(Batch(points=[MetricPoint("gpu.ofu", 0.4, T0 + pod * 10**10, resource, job(f"job-{pod}"))]))
    series = sum(len(family.series) for family in exp._families.values())
    bound = 31 + 6  # five minutes of pods, one every 10 s, plus up to a minute before the next expiry
    assert series <= bound and len(exp._targets) <= bound and len(exp._series_of) <= bound
    assert len(exp._gpu_jobs) <= 8


def test_two_overlapping_runs_of_one_job_are_two_series_without_resource_conversion(exporter):
    """A job deleted and created again under one name is a new run (ofu.job.run, docs/jobs.md): while
    the old run's last GPUs still report and the new run's first ones start, the jobs processor keeps
    two jobs, and their series must stay two also when only job_labels become labels."""
    exp = exporter(resource_to_telemetry_conversion={"enabled": False})
    jobs = JobsProcessor(build_config(JobsConfig, {}), Context("jobs"))

    def gpu(uuid: str, run: str, t: int) -> MetricPoint:
        resource = (("host.name", "node-1"), ("hw.id", uuid), ("hw.model", "NVIDIA H100 80GB HBM3"),
                    ("k8s.namespace.name", "ml"), ("ofu.job.id", "k8s:ml/PyTorchJob/llama"),
                    ("ofu.job.kind", "PyTorchJob"), ("ofu.job.run", run), ("ofu.precision", "bf16"))
        return MetricPoint("gpu.ofu", 0.4 if run == "uid-1" else 0.2, T0 + t * 10**9, resource)

    for t in range(10, 181, 10):
        out = jobs.process(Batch(points=[gpu("GPU-a", "uid-1", t), gpu("GPU-b", "uid-2", t)]))
        exp.export(Batch(points=[p for p in out.points if p.name.startswith("job.")]))
    samples = scrape(exp)["job_gpus"]["samples"]
    runs = {(labels["ofu_job_id"], labels.get("ofu_job_run"), labels.get("ofu_job_kind"))
            for labels in (dict(key[1]) for key in samples)}
    assert runs == {("k8s:ml/PyTorchJob/llama", "uid-1", "PyTorchJob"),
                    ("k8s:ml/PyTorchJob/llama", "uid-2", "PyTorchJob")}
    ofu = {dict(key[1])["ofu_job_run"]: value for key, (value, _) in scrape(exp)["job_ofu"]["samples"].items()
           if dict(key[1])["ofu_window"] == "5m"}
    assert ofu == {"uid-1": pytest.approx(0.4), "uid-2": pytest.approx(0.2)}


def test_a_windows_loss_parts_replace_the_gpus_and_the_jobs_previous_set(exporter):
    """Issue 31 item 5: a GPU's loss account changes shape from one window to the next (the clock's
    cause flips, DRAM crosses the memory-bound threshold, SM activity goes blank and two parts merge,
    the clock boosts above f_ref). What a scrape serves for the GPU is the newest window's parts alone,
    adding up to 1 - gpu_ofu; and a job's job_ofu_loss per window adds up to 1 - job_ofu, also when the
    dominant cause of a part changes. The old series used to stay until metric_expiration (5m)."""
    from otel_ofu.core.model import GpuSample

    exp = exporter()  # its clock stands still: nothing expires
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    jobs = JobsProcessor(build_config(JobsConfig, {}), Context("jobs"))
    phases = [  # (SM clock MHz, clock event reasons, SM activity, DRAM activity) for 3 minutes each
        (1500, 0x4, 0.8, 0.3),  # the power cap, not memory-bound: five parts
        (1200, 0x40, 0.8, 0.7),  # hardware thermal, memory-bound: the same parts, both causes new
        (1200, 0x40, None, 0.7),  # SM activity blank: sm_idle and non_tensor become one part
        (1980, 0x0, 0.8, 0.2),  # boost at f_ref... and above it below
        (2100, 0x0, 0.8, 0.2),
    ]
    t = 0
    for clock, reasons, sm, dram in phases:
        for _ in range(18):
            t += 10
            sample = GpuSample(T0 + t * 10**9, 10.0, "node-1", 0, "GPU-a", "NVIDIA H100 80GB HBM3", 0.5, clock,
                               clock_event_reasons=reasons, sm_active=sm, gr_active=0.9, dram_active=dram,
                               job_id="train", precision="bf16")
            exp.export(jobs.process(ofu.process(Batch(samples=[sample]))))
        got = scrape(exp)
        [(_, (gpu_ofu, _))] = got["gpu_ofu"]["samples"].items()
        parts = {dict(labels)["ofu_loss_part"]: value
                 for (_, labels), (value, _) in got["gpu_ofu_loss"]["samples"].items()}
        expected = 4 if sm is None else 5
        assert len(got["gpu_ofu_loss"]["samples"]) == len(parts) == expected, got["gpu_ofu_loss"]["samples"]
        assert sum(parts.values()) == pytest.approx(1 - gpu_ofu, abs=1e-12)
        job_ofu = {dict(labels)["ofu_window"]: value for (_, labels), (value, _) in got["job_ofu"]["samples"].items()}
        job_lost: dict[str, float] = {}
        for (_, labels), (value, _) in got["job_ofu_loss"]["samples"].items():
            window = dict(labels)["ofu_window"]
            job_lost[window] = job_lost.get(window, 0.0) + value
        assert set(job_lost) == set(job_ofu) == {"5m", "1h", "life"}
        for window, lost in job_lost.items():
            assert lost + job_ofu[window] == pytest.approx(1.0, abs=1e-9), window
    assert parts["clock"] < 0  # the last phase boosts above f_ref: a gain, and still adds up
