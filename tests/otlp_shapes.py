"""OTLP requests shaped like what a Collector sends otel-ofu (shared by the receiver and e2e tests).

- :func:`dcgm_exporter_request`: the Collector's Prometheus receiver after scraping
  dcgm-exporter: gauges named after DCGM fields, dcgm-exporter labels on the data points,
  the scrape target in the resource, every point stamped with the scrape time.
- :func:`dcgmreceiver_request`: Google's dcgmreceiver: one resource per GPU, pipe
  utilization by ``gpu.pipe``, the clock in Hz, per-field timestamps a few ms apart.
- :func:`scraped_page_request`: any Prometheus page as the Collector's Prometheus receiver
  forwards a scrape of it (the shape of tests/data/real/otlp/collector-prometheus-receiver.json).
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

H100 = "NVIDIA H100 80GB HBM3"
H100_FREF_MHZ = 1830.0  # specs: the clock H100 SXM's dense tensor peak is quoted at


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    tpa: float
    clock_mhz: float
    power_w: float = 300.0
    model: str = H100
    labels: tuple[tuple[str, str], ...] = ()  # more dcgm-exporter labels: pod, namespace, GPU_I_PROFILE, ...


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=float(value)))


def dcgm_exporter_request(gpus: list[Gpu], t_ns: int, host: str = "node-1",
                          request: ExportMetricsServiceRequest | None = None) -> ExportMetricsServiceRequest:
    request = request or ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    rm.resource.attributes.extend([_kv("service.name", "dcgm-exporter"), _kv("service.instance.id", f"{host}:9400"),
                                   _kv("server.address", host), _kv("server.port", "9400"), _kv("url.scheme", "http")])
    sm = rm.scope_metrics.add()
    sm.scope.name = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver"
    values = {
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": lambda g: g.tpa,
        "DCGM_FI_DEV_SM_CLOCK": lambda g: g.clock_mhz,
        "DCGM_FI_DEV_POWER_USAGE": lambda g: g.power_w,
        "DCGM_FI_DEV_GPU_TEMP": lambda g: 41.0,
    }
    for name, value_of in values.items():
        metric = sm.metrics.add(name=name, description=f"{name} help")
        for g in gpus:
            dp = metric.gauge.data_points.add(time_unix_nano=t_ns, as_double=float(value_of(g)))
            dp.attributes.extend([_kv("gpu", str(g.index)), _kv("UUID", g.uuid),
                                  _kv("pci_bus_id", f"00000000:{g.index:02d}:00.0"), _kv("device", f"nvidia{g.index}"),
                                  _kv("modelName", g.model), _kv("Hostname", host),
                                  _kv("DCGM_FI_DRIVER_VERSION", "570.86.15"), *(_kv(k, v) for k, v in g.labels)])
    return request


def dcgmreceiver_request(gpus: list[Gpu], t_ns: int, host: str = "node-2") -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    for g in gpus:
        rm = request.resource_metrics.add()
        rm.resource.attributes.extend([_kv("gpu.model", g.model), _kv("gpu.number", str(g.index)),
                                       _kv("gpu.uuid", g.uuid), _kv("host.name", host),
                                       _kv("cloud.region", "us-central1")])
        sm = rm.scope_metrics.add()
        sm.scope.name = "github.com/GoogleCloudPlatform/opentelemetry-operations-collector/receiver/dcgmreceiver"
        pipe = sm.metrics.add(name="gpu.dcgm.pipe.utilization", unit="1")
        for name, value in (("tensor", g.tpa), ("fp32", 0.125), ("fp16", 0.0625)):
            dp = pipe.gauge.data_points.add(time_unix_nano=t_ns, as_double=value)
            dp.attributes.append(_kv("gpu.pipe", name))
        clock = sm.metrics.add(name="gpu.dcgm.clock.frequency", unit="Hz")
        clock.gauge.data_points.add(time_unix_nano=t_ns + 3_000_000, as_double=g.clock_mhz * 1e6)
        smu = sm.metrics.add(name="gpu.dcgm.sm.utilization", unit="1")
        smu.gauge.data_points.add(time_unix_nano=t_ns, as_double=0.75)
    return request


def scraped_page_request(page: str, t_ns: int, job: str, target: str) -> ExportMetricsServiceRequest:
    """A Prometheus text page as the Collector's Prometheus receiver forwards one scrape of it: the
    target in the resource (a loopback target has no server.address), one scope, every sample a
    point stamped with the scrape time and labelled with its labels; counters as cumulative sums."""
    from prometheus_client.parser import text_string_to_metric_families

    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    host, port = target.rsplit(":", 1)
    rm.resource.attributes.extend([_kv("service.name", job), _kv("service.instance.id", target),
                                   *([_kv("server.address", host)] if host not in ("127.0.0.1", "localhost") else []),
                                   _kv("server.port", port), _kv("url.scheme", "http")])
    sm = rm.scope_metrics.add()
    sm.scope.name = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver"
    for family in text_string_to_metric_families(page):
        metric = sm.metrics.add(name=family.name, description=family.documentation)
        data = metric.gauge
        if family.type == "counter":
            data = metric.sum
            metric.sum.aggregation_temporality = 2
            metric.sum.is_monotonic = True
        for sample in family.samples:
            dp = data.data_points.add(time_unix_nano=t_ns, as_double=float(sample.value))
            dp.attributes.extend(_kv(k, v) for k, v in sorted(sample.labels.items()))
    return request
