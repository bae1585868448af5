"""The hot paths' caches: bounded, emptied by the memory limiter, and never the source of a result."""

from __future__ import annotations

import gc

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu.core.model import Batch, MetricPoint, attrs
from otel_ofu.jobs.facts import gpu_facts_cache
from otel_ofu.otlp import codec
from otel_ofu.otlp import join as otlp_join
from otel_ofu.otlp.join import point_bytes, scrapes, series
from otel_ofu.pipeline import caches
from otel_ofu.pipeline.caches import Cache
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.memory import MemoryLimiter
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from tests.otlp_shapes import Gpu, dcgm_exporter_request

T0 = 1_767_225_600_000_000_000


def test_a_cache_starts_over_when_full_and_shares_equal_values():
    cache = Cache("test", 3)
    assert cache.put("a", 1) == 1
    cache.put("b", 2)
    cache.put("c", 3)
    assert len(cache) == 3
    cache.put("d", 4)  # full: emptied, then d
    assert dict(cache) == {"d": 4}
    first = "".join(["shared", "-part"])
    second = "".join(["shared", "-part"])
    assert first is not second
    assert cache.shared(first) is first and cache.shared(second) is first


def test_release_all_empties_every_live_cache_and_calls_the_releasers():
    one, two = Cache("one", 10), Cache("two", 10)
    one.put(1, "x")
    two.put(2, "y")
    two.put(3, "z")
    called = []
    caches.on_release(lambda: called.append(True))
    assert caches.entries() >= 3
    assert caches.release_all() >= 3
    assert len(one) == len(two) == 0 and caches.entries() == 0 and called
    del one
    gc.collect()
    assert caches.entries() == 0  # a dead cache is simply gone from the registry
    Cache("three", 10).put(4, "w")  # registering prunes the dead references


def _gpu_points(t: int) -> list[MetricPoint]:
    job = attrs({"ofu.job.id": "job-1", "ofu.precision": "bf16"})
    out = []
    for i in range(4):
        gpu = attrs({"host.name": "node-1", "hw.id": f"GPU-{i}", "gpu.index": str(i)})
        out += [MetricPoint("gpu.ofu", 0.4 + i / 100, t, gpu, job), MetricPoint("gpu.ofu.raw", 0.41, t, gpu, job)]
    return out


def test_results_are_the_same_before_and_after_the_caches_are_emptied():
    """Encoding (templates, encoded resources) and decoding a dcgm-exporter request (label sets,
    shapes) give the same bytes and points whether the caches are warm, emptied, or warm again."""
    points = _gpu_points(T0)
    warm = codec.encode_request(points)
    assert codec.encode_request(points) == warm and caches.entries() > 0
    caches.release_all()
    assert codec.encode_request(points) == warm

    gpus = [Gpu(i, f"GPU-{i}", 0.3 + i / 10, 1500.0 + i) for i in range(4)]
    body = dcgm_exporter_request(gpus, T0, host="node-1").SerializeToString()

    def decoded() -> list:
        out = []
        for wire in (None, body):  # the message path, and the byte path
            request = ExportMetricsServiceRequest.FromString(body)  # a split takes the inputs out of it
            samples, rest = otlp_join.split_request(request, wire=wire)
            out += [(s.uuid, s.tensor_active, s.sm_clock_mhz, s.model) for s in samples] + [len(rest)]
        return out

    first = decoded()
    assert decoded() == first
    caches.release_all()
    assert decoded() == first and len(first) > 4


def test_the_memory_limiter_empties_the_caches_before_it_refuses():
    """What the caches hold is given back before a request is refused: a process that is over its
    soft limit only because of full caches takes data again (BENCHMARKS.md, the overload run)."""
    cache = Cache("churn", 1_000_000)
    for i in range(5000):
        cache.put(("resource", i), ("encoded", i))
    limiter = MemoryLimiter(soft_bytes=4000, hard_bytes=10_000, measure=caches.entries)
    assert limiter.over_limit() is None  # 5000 entries "used": over the soft limit, emptied, then under
    assert len(cache) == 0
    keep = list(range(4500))  # memory that is not a cache: the limiter still refuses
    limiter = MemoryLimiter(soft_bytes=4000, hard_bytes=10_000, measure=lambda: len(keep))
    assert limiter.over_limit() == "soft"


def test_the_hot_paths_keep_their_entries_in_registered_caches():
    """Each cache named in docs/state.md is a registered Cache, so release_all reaches it."""
    for cache in (codec._templates, codec._resource_fields, codec._decoded_attributes, series.resources,
                  point_bytes.key_values, gpu_facts_cache, otlp_join._scrapes(frozenset()).nodes, scrapes._parts,
                  scrapes._structs):
        assert isinstance(cache, Cache) and cache.max_entries > 0
    caches.release_all()
    assert all(len(c) == 0 for c in (codec._templates, series.resources, gpu_facts_cache))


def test_scrape_shapes_and_the_ofu_processors_gpus_are_emptied_and_rebuilt_alike():
    """A dcgm-exporter scrape read by its node's shape, then OFU: the shapes (otlp receiver) and each GPU's
    resource and calibration (ofu processor) are registered caches; emptied, the next scrape gives the same."""
    processor = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    gpus = [Gpu(i, f"GPU-{i}", 0.3 + i / 10, 1500.0 + i) for i in range(4)]
    store = otlp_join._scrapes(frozenset())

    def window(k: int) -> tuple[list, list]:
        body = dcgm_exporter_request(gpus, T0 + k * 10**10, host="node-1").SerializeToString()
        found = otlp_join.split_wire(body)
        points = processor.process(Batch(samples=found.samples)).points
        return [repr(p) for p in points], [(r.field, r.points) for r in found.passthrough]

    window(0)  # learns the node's shape
    read = store.read
    by_shape = []
    store.read = lambda *args: by_shape.append(read(*args)) or by_shape[-1]  # type: ignore[method-assign]
    first = window(1)
    assert by_shape[-1] is not None and len(store) and len(processor._gpus)
    caches.release_all()
    assert not len(store) and not len(processor._gpus)
    assert window(1) == first  # through the message path again, then learned again
    assert window(1) == first and by_shape[-1] is not None
