"""otlp.encode_request (points written straight to the wire format) against protobuf's own encoder."""

from __future__ import annotations

import math

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from otel_ofu import __version__
from otel_ofu.core.metrics import METRICS
from otel_ofu.core.model import MetricPoint, attrs
from otel_ofu.otlp import codec as otlp

T0 = 1_767_225_600_000_000_000


def _any(value: object) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def reference(points: list[MetricPoint]) -> ExportMetricsServiceRequest:
    """The request built message by message with protobuf (the encoder this one replaced)."""
    by_resource: dict = {}
    for point in points:
        by_resource.setdefault(point.resource, {}).setdefault(point.name, []).append(point)
    request = ExportMetricsServiceRequest()
    for resource, metrics in by_resource.items():
        rm = request.resource_metrics.add()
        rm.resource.attributes.extend([KeyValue(key=k, value=_any(v)) for k, v in resource])
        sm = rm.scope_metrics.add()
        sm.scope.name = otlp.SCOPE_NAME
        sm.scope.version = __version__
        for name, pts in metrics.items():
            info = METRICS.get(name)
            metric = sm.metrics.add(name=name, unit=info.unit if info else pts[0].unit,
                                    description=info.description if info else "")
            if pts[0].monotonic:
                metric.sum.aggregation_temporality = otlp.CUMULATIVE
                metric.sum.is_monotonic = True
                container = metric.sum.data_points
            else:
                container = metric.gauge.data_points
            for p in pts:
                dp = container.add(time_unix_nano=p.time_unix_nano, as_double=float(p.value))
                if p.start_time_unix_nano:
                    dp.start_time_unix_nano = p.start_time_unix_nano
                dp.attributes.extend([KeyValue(key=k, value=_any(v)) for k, v in p.attributes])
    return request


def varied_points() -> list[MetricPoint]:
    gpu = attrs({"host.name": "node-1", "hw.id": "GPU-1", "gpu.index": "0", "hw.vendor": "nvidia"})
    other = attrs({"host.name": "nöde-2 ✓", "gpu.index": 3, "flag": True, "off": False, "ratio": 0.5,
                   "neg": -7, "big": 2**62, "zero": 0, "empty": "", "x" * 300: "y" * 5000})
    job = attrs({"ofu.job.id": "k8s:ns/pod", "ofu.precision": "bf16"})
    odd = attrs({"one": 1, "one_f": 1.0, "true": True, "": "no key", "nan": math.nan, "list": "[1, 2]",
                 "zero": 0.0, "minus_zero": -0.0, "zero_i": 0, "false": False})
    return [
        MetricPoint("gpu.ofu", 0.41, T0, gpu, job),
        MetricPoint("gpu.ofu.raw", 0.42, T0, gpu, job),
        MetricPoint("gpu.ofu", 0.0, T0 + 10, gpu, job),
        MetricPoint("gpu.sm.clock.frequency", 1.8e9, T0, other, odd, "Hz"),
        MetricPoint("gpu.ofu.dropped", 3, T0, other, attrs({"ofu.drop.reason": "blank"}), "{window}",
                    monotonic=True, start_time_unix_nano=T0 - 10),
        MetricPoint("not.registered", -1.5, 0, (), (), "By"),
        MetricPoint("no.unit", math.inf, T0, gpu, (), ""),
        MetricPoint("gpu.ofu", 0.5, T0, attrs({"host.name": "node-1", "hw.id": "GPU-1", "gpu.index": "0",
                                               "hw.vendor": "nvidia"}), job),  # an equal resource: grouped
    ]


def test_encoded_request_equals_the_message_built_one():
    points = varied_points()
    encoded = otlp.encode_request(points)
    expected = reference(points)
    assert ExportMetricsServiceRequest.FromString(encoded) == expected
    assert encoded == expected.SerializeToString()  # field order too: byte for byte
    assert otlp.to_request(points) == expected
    assert len(expected.resource_metrics) == 3


@pytest.mark.parametrize("n", [0, 1, 200])
def test_sizes_and_repeats(n):
    points = [MetricPoint("gpu.ofu", i / 7, T0 + i, attrs({"hw.id": f"GPU-{i % 3}"}), attrs({"i": i}))
              for i in range(n)]
    for _ in range(2):  # the second time from the caches
        assert otlp.encode_request(points) == reference(points).SerializeToString()


def test_equal_values_of_other_types_are_not_confused_by_the_caches():
    for first, second in ((1, True), (True, 1.0), (0.0, -0.0), (-0.0, 0), (False, 0)):
        points = [MetricPoint("gpu.ofu", 1.0, T0, attrs({"v": first}), attrs({"v": first})),
                  MetricPoint("gpu.ofu", 1.0, T0, attrs({"w": 1}), attrs({"v": second}))]
        assert otlp.encode_request(points) == reference(points).SerializeToString()


def test_int64_range_is_checked_like_protobuf():
    point = MetricPoint("gpu.ofu", 1.0, T0, attrs({"too.big": 2**63}))
    with pytest.raises(ValueError):
        otlp.encode_request([point])


def test_a_gpus_resource_written_from_its_template_interval_after_interval():
    """The same resource and attribute objects with new times and values: the template's bytes are the new ones."""
    gpu = attrs({"host.name": "node-1", "hw.id": "GPU-1", "gpu.index": "0", "ofu.job.id": "job-1"})
    fref = attrs({"ofu.fref.source": "spec"})
    for interval, value in enumerate((0.41, 0.0, -1.5, math.inf, 1e300)):
        t = T0 + interval * 10**10
        points = [MetricPoint("gpu.ofu", value, t, gpu, fref), MetricPoint("gpu.ofu.raw", value / 2, t, gpu, fref),
                  MetricPoint("gpu.sm.clock.frequency", 1.8e9, t, gpu, (), "Hz")]
        assert otlp.encode_request(points) == reference(points).SerializeToString()
    # What the template does not hold is checked on every use: another unit, other attributes,
    # another set of metrics, a metric that is not one plain point: each written as it is.
    variants = [
        [MetricPoint("gpu.ofu", 0.5, T0, gpu, fref, "%")],
        [MetricPoint("gpu.ofu", 0.5, T0, gpu, attrs({"ofu.fref.source": "config"}))],
        [MetricPoint("gpu.ofu", 0.5, T0, gpu, fref), MetricPoint("gpu.ofu", 0.6, T0 + 1, gpu, fref)],
        [MetricPoint("gpu.ofu", 0.5, T0, gpu, fref, start_time_unix_nano=T0 - 5)],
        [MetricPoint("gpu.ofu", 0.5, 0, gpu, fref)],
        [MetricPoint("gpu.ofu.dropped", 2, T0, gpu, fref, "{window}", monotonic=True, start_time_unix_nano=T0 - 5)],
    ]
    for points in [*variants, *variants]:
        assert otlp.encode_request(points) == reference(points).SerializeToString()


def test_a_template_is_for_its_metric_names_in_their_order():
    """One resource, as many points each time but other metrics or another order: never another's template."""
    gpu = attrs({"host.name": "node-1", "hw.id": "GPU-1"})
    ofu = MetricPoint("gpu.ofu", 0.4, T0, gpu)
    raw = MetricPoint("gpu.ofu.raw", 0.5, T0, gpu)
    clock = MetricPoint("gpu.sm.clock.frequency", 1.8e9, T0, gpu, (), "Hz")
    for points in ([ofu, raw], [raw, ofu], [ofu, clock], [ofu, raw], [ofu, raw]):
        assert otlp.encode_request(points) == reference(points).SerializeToString()


def test_a_gauge_with_several_points_is_written_from_the_template_too():
    """The loss account: one gpu.ofu.loss point per part, each with its own attributes, every interval."""
    gpu = attrs({"host.name": "node-1", "hw.id": "GPU-1", "gpu.index": "0", "ofu.job.id": "job-1"})
    fref = attrs({"ofu.fref.source": "spec"})
    parts = [attrs({"ofu.loss.part": part, **({"ofu.loss.cause": cause} if cause else {})})
             for part, cause in (("engine_idle", None), ("sm_idle+non_tensor", "memory_bound"),
                                 ("clock", "sw_power_cap"), ("padding", None))]

    def window(t: int, value: float, loss_parts: list) -> list[MetricPoint]:
        return [MetricPoint("gpu.ofu", value, t, gpu, fref),
                *[MetricPoint("gpu.ofu.loss", value / (k + 2), t, gpu, a) for k, a in enumerate(loss_parts)],
                MetricPoint("gpu.sm.clock.frequency", 1.8e9, t, gpu, (), "Hz")]

    for interval, value in enumerate((0.41, 0.0, -1.5, 0.7)):
        points = window(T0 + interval * 10**10, value, parts)
        assert otlp.encode_request(points) == reference(points).SerializeToString()
    # Checked on every use: a part more or less, other parts, the parts in another order
    variants = [window(T0, 0.3, parts[:3]), window(T0, 0.3, [*parts, attrs({"ofu.loss.part": "x"})]),
                window(T0, 0.3, [parts[1], parts[0], *parts[2:]]),
                window(T0, 0.3, [attrs({"ofu.loss.part": "engine_idle"}), *parts[1:]])]
    for points in [*variants, *variants, window(T0, 0.5, parts)]:
        assert otlp.encode_request(points) == reference(points).SerializeToString()
    # a metric's points apart (another metric between them): written as they are, not from a template
    apart = [MetricPoint("gpu.ofu.loss", 0.1, T0, gpu, parts[0]), MetricPoint("gpu.ofu", 0.5, T0, gpu, fref),
             MetricPoint("gpu.ofu.loss", 0.2, T0, gpu, parts[1])]
    for _ in range(2):
        assert otlp.encode_request(apart) == reference(apart).SerializeToString()
def test_a_template_follows_a_change_of_the_metric_registry(monkeypatch):
    """A metric's description or unit changed after a GPU's template was built: the next request carries the new."""
    from dataclasses import replace

    gpu = attrs({"host.name": "node-1", "hw.id": "GPU-7"})
    points = [MetricPoint("gpu.ofu", 0.4, T0, gpu), MetricPoint("gpu.ofu.raw", 0.5, T0, gpu)]
    assert otlp.encode_request(points) == reference(points).SerializeToString()  # the template is built
    monkeypatch.setitem(METRICS, "gpu.ofu", replace(METRICS["gpu.ofu"], description="changed"))
    encoded = otlp.encode_request(points)
    assert encoded == reference(points).SerializeToString()
    assert ExportMetricsServiceRequest.FromString(encoded).resource_metrics[0].scope_metrics[0].metrics[0] \
        .description == "changed"


# --- PointRows (a GPU window's points as a layout and values): written as their points would be ---------


def _row(resource, t: int, values: list[float], names=("gpu.ofu", "gpu.ofu.raw", "gpu.ofu.loss", "gpu.ofu.loss")):
    from otel_ofu.core.model import PointLayout, PointRow

    parts = [attrs({"ofu.loss.part": part}) for part in ("engine_idle", "clock")]
    layout = PointLayout(tuple((name, "1", parts.pop(0) if name == "gpu.ofu.loss" else ()) for name in names))
    return PointRow(layout, resource, t, values)


def test_rows_are_written_as_their_points_beside_plain_points_of_any_resource():
    """A row alone on its resource comes from its template; a row whose resource other points (or another
    row) share, one of time 0 and one whose metric's points lie apart are written through its points:
    every request equals protobuf's from the points the rows stand for, in their order."""
    from otel_ofu.core.model import Batch

    gpu_a = attrs({"host.name": "n", "hw.id": "GPU-A"})
    gpu_b = attrs({"host.name": "n", "hw.id": "GPU-B"})
    gpu_c = attrs({"host.name": "n", "hw.id": "GPU-C", "gpu.index": 2})
    for t in (T0, T0 + 10, T0 + 20):  # again: from the kept templates
        items = [
            MetricPoint("gpu.ofu", 0.1, t, gpu_b, (), "1"),
            _row(gpu_a, t, [0.4, 0.5, 0.3, 0.2]),
            _row(gpu_b, t, [0.6, 0.7, 0.1, 0.2]),  # shares gpu_b with the point before it
            _row(gpu_c, t, [0.1, 0.2, 0.3, 0.4]),
            _row(gpu_c, t + 1, [0.5, 0.6, 0.7, 0.8]),  # gpu_c again
            _row(attrs({"hw.id": "GPU-D"}), 0, [1.0, 2.0, 3.0, 4.0]),  # no time: not a plain gauge point
            _row(attrs({"hw.id": "GPU-E"}), t, [1.0, 2.0, 3.0], ("gpu.ofu", "gpu.ofu.raw", "gpu.ofu")),  # apart
            _row(attrs({"hw.id": "GPU-F"}), t, [0.25, 0.5, 0.75, 1]),  # an int value, as float() makes it
        ]
        batch = Batch.with_rows([], list(items), [], [])
        expected_points = [p for item in items for p in (item.points() if hasattr(item, "layout") else [item])]
        assert batch.point_count() == len(expected_points) == len(batch)
        body = otlp.encode_request(batch.points_and_rows())
        assert ExportMetricsServiceRequest.FromString(body) == reference(expected_points)
        assert batch.points == expected_points  # made when first read, in order
        assert otlp.encode_request(batch.points) == body


def test_a_batchs_points_set_replace_its_rows():
    from otel_ofu.core.model import Batch

    batch = Batch.with_rows([], [_row(attrs({"hw.id": "GPU-A"}), T0, [0.4, 0.5, 0.3, 0.2])], [], [])
    point = MetricPoint("gpu.ofu", 0.1, T0, (), (), "1")
    batch.points = [point]
    assert batch.points == [point] and batch.points_and_rows() == [point] and len(batch) == 1
