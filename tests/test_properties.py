"""Properties that hold for any input, not just the examples (hypothesis).

- An OTLP request decoded into points by the ``otlp`` receiver's decode path, encoded by the
  exporters' encoder and decoded again gives the same points: nothing a jobs tier forwards is
  changed by the round trip (and the real SDK's request is one such input).
- OFU stays in [0, 1.2] for any counters: whatever a source sends (blanks, NaN, negative,
  huge, strings, a clock in the wrong unit), a window gives an OFU in range or a named reason.
"""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE

from otel_ofu.core import specs
from otel_ofu.core.metrics import METRICS
from otel_ofu.core.model import Batch, GpuSample, MetricPoint
from otel_ofu.core.ofu import OfuResult, compute_ofu
from otel_ofu.core.values import NoValue
from otel_ofu.otlp import codec
from otel_ofu.otlp import join as otlp_join
from otel_ofu.pipeline.component import Context
from otel_ofu.processors import jobs as _jobs_registers_job_metrics  # noqa: F401 (job.ofu in METRICS)
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig

SDK_CAPTURE = Path(__file__).parent / "data" / "real" / "otlp" / "sdk-training-reporter.http-protobuf.bin"
NAMES = ("gpu.ofu", "job.ofu", "training.mfu", "training.tflops_per_gpu", "a.b", "x")
# One unit and kind per name, as the OpenTelemetry data model has it (a metric's identity): for
# otel-ofu's own metrics the declared ones (core/metrics.py; job.ofu once the jobs processor's module
# registered it, whichever test file was collected first), which its encoder writes.
DECLARED = {name: (METRICS[name].unit, METRICS[name].kind) if name in METRICS else (unit, kind)
            for name, unit, kind in [("gpu.ofu", "", ""), ("job.ofu", "", "gauge"), ("training.mfu", "", ""),
                                     ("training.tflops_per_gpu", "", ""), ("a.b", "By", "sum"), ("x", "1", "gauge")]}
OFU_LIMIT = 1.2

# --- OTLP: decode, encode, decode ------------------------------------------------------------

keys = st.sampled_from(["host.name", "hw.id", "gpu.index", "k8s.pod.name", "ofu.job.id", "rank", "flag", "n"])
attribute_values = st.one_of(
    st.text(max_size=12), st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1),
    st.floats(allow_nan=False), st.booleans())


attribute_sets = st.lists(st.tuples(keys, attribute_values), max_size=4)
point_values = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                         st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1))
points = st.fixed_dictionaries({
    "time": st.integers(min_value=1, max_value=2 ** 63 - 1), "start": st.integers(min_value=0, max_value=2 ** 62),
    "value": point_values, "attributes": attribute_sets})
metrics = st.fixed_dictionaries({"name": st.sampled_from(NAMES), "points": st.lists(points, min_size=1, max_size=4)})
resources = st.fixed_dictionaries({"attributes": attribute_sets, "metrics": st.lists(metrics, max_size=4)})


def build_request(spec: list[dict]) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    for r in spec:
        rm = request.resource_metrics.add()
        rm.resource.attributes.extend(KeyValue(key=k, value=codec._any_value(v)) for k, v in r["attributes"])
        scope = rm.scope_metrics.add()
        for m in r["metrics"]:
            unit, kind = DECLARED[m["name"]]
            metric = scope.metrics.add(name=m["name"], unit=unit)
            if kind == "gauge":
                data = metric.gauge
            else:
                data = metric.sum
                data.is_monotonic = True
                data.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
            for p in m["points"]:
                dp = data.data_points.add(time_unix_nano=p["time"], start_time_unix_nano=p["start"])
                if isinstance(p["value"], int):
                    dp.as_int = p["value"]
                else:
                    dp.as_double = p["value"]
                dp.attributes.extend(KeyValue(key=k, value=codec._any_value(v)) for k, v in p["attributes"])
    return request


def decoded(body: bytes) -> list[MetricPoint]:
    """The points the otlp receiver's decode path reads from a request's bytes."""
    return otlp_join.split(ExportMetricsServiceRequest.FromString(body), wire=body, decode=frozenset(NAMES)).points


def as_set(found: list[MetricPoint]) -> list[str]:
    """Points comparable as a multiset (a point of a gauge keeps no start time on the way)."""
    return sorted(repr((p.name, p.time_unix_nano, p.resource, p.attributes, p.unit, p.monotonic,
                        p.start_time_unix_nano if p.monotonic else 0, float(p.value))) for p in found)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.lists(resources, max_size=3))
def test_a_decoded_then_encoded_request_decodes_to_the_same_points(spec):
    body = build_request(spec).SerializeToString()
    first = decoded(body)
    again = decoded(codec.encode_request(first))
    assert as_set(again) == as_set(first)
    # and the decode path agrees with reading the request through protobuf objects
    assert as_set(first) == as_set([p for p in codec.from_request(ExportMetricsServiceRequest.FromString(body))])


def test_the_sdk_request_decodes_encodes_and_decodes_to_the_same_points():
    """The real SDK's export (tests/data/real/otlp): the report's points, their resource intact."""
    first = decoded(SDK_CAPTURE.read_bytes())
    assert {(p.name, p.value) for p in first} == {("training.mfu", 0.41), ("training.tflops_per_gpu", 405.7)}
    assert {dict(p.resource)["k8s.pod.name"] for p in first} == {"llama3-70b-worker-0"}
    assert as_set(decoded(codec.encode_request(first))) == as_set(first)


# --- OFU in [0, 1.2] -------------------------------------------------------------------------

BLANKS = [0x7FFFFFF0 + i for i in range(4)] + [2 ** 47 + i for i in range(4)] + \
         [0x7FFFFFFFFFFFFFF0 + i for i in range(4)]
readings = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(2 ** 64), max_value=2 ** 64),
    st.sampled_from(BLANKS), st.sampled_from(["", "N/A", "0.5", "1830", "nan", "x", "1e9"]), st.none(),
    st.floats(min_value=0, max_value=1.2), st.floats(min_value=100, max_value=3000))
models = st.one_of(st.sampled_from([s.name for s in specs.GPU_SPECS]), st.text(max_size=20), st.none())
precisions = st.sampled_from([*specs.PRECISIONS, specs.UNKNOWN_PRECISION])


@settings(max_examples=1000, deadline=None)
@given(tpa=readings, clock=readings, max_clock=readings, model=models, precision=precisions,
       fref=st.one_of(st.none(), st.floats(min_value=1e-3, max_value=1e5)),
       correction=st.one_of(st.none(), st.floats(min_value=0.5, max_value=1.5)))
def test_ofu_stays_within_bounds_for_any_counters(tpa, clock, max_clock, model, precision, fref, correction):
    result = compute_ofu(tpa, clock, model, precision, max_clock,
                         fref_overrides=None if fref is None else {"*": fref},
                         correction_overrides=None if correction is None else {"*": correction})
    if isinstance(result, OfuResult):
        assert 0.0 <= result.raw <= OFU_LIMIT and 0.0 <= result.corrected <= OFU_LIMIT
        assert not math.isnan(result.corrected)
    else:
        assert isinstance(result, NoValue)


@settings(max_examples=300, deadline=None)
@given(tpa=readings, clock=readings, max_clock=readings, model=models)
def test_the_ofu_processor_emits_ofu_in_bounds_or_a_drop(tpa, clock, max_clock, model):
    sample = GpuSample(1_767_225_600_000_000_000, 30.0, "h", 0, "GPU-1", model or "", tpa, clock, 1, max_clock)
    out = OfuProcessor(OfuProcessorConfig(), Context("ofu")).process(Batch(samples=[sample])).points
    ofu = [p.value for p in out if p.name in ("gpu.ofu", "gpu.ofu.raw")]
    dropped = [p for p in out if p.name == "gpu.ofu.dropped"]
    assert (len(ofu) == 2) != bool(dropped)  # an OFU, or a drop with its reason: never both, never neither
    assert all(0.0 <= v <= OFU_LIMIT for v in ofu)
