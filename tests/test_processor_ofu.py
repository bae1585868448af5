"""The ofu processor: points for good samples, counted reasons for bad ones, warnings once."""

import logging
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ofu.core.model import Batch, GpuSample
from otel_ofu.core.values import DCGM_FP64_BLANK
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig


def sample(**kw):
    base = dict(time_unix_nano=1_000, window_s=10, host="n0", gpu_index=0, uuid="GPU-0", model="NVIDIA H100 80GB HBM3",
                tensor_active=0.5, sm_clock_mhz=1830, max_sm_clock_mhz=1980, power_w=650, clock_event_reasons=0,
                job_id="job-a", precision="bf16")
    base.update(kw)
    return GpuSample(**base)


def processor(**cfg):
    return OfuProcessor(build_config(OfuProcessorConfig, cfg), Context("ofu"))


def points_by_name(batch):
    out = {}
    for p in batch.points:
        out.setdefault(p.name, []).append(p)
    return out


def test_good_sample_gives_ofu_raw_inputs_and_attributes():
    out = points_by_name(processor().process(Batch(samples=[sample()])))
    ofu, raw = out["gpu.ofu"][0], out["gpu.ofu.raw"][0]
    assert raw.value == pytest.approx(0.5)
    assert ofu.value < raw.value
    attrs, resource = dict(ofu.attributes), dict(ofu.resource)
    assert attrs == {"ofu.fref.source": "spec"}
    # The GPU's job identity is on its resource, for every point of the GPU (inputs included).
    assert resource["ofu.job.id"] == "job-a" and resource["ofu.precision"] == "bf16"
    assert {p.resource for points in out.values() for p in points} == {ofu.resource}
    assert resource["hw.id"] == "GPU-0" and resource["host.name"] == "n0" and resource["gpu.index"] == "0"
    assert resource["hw.model"] == "NVIDIA H100 80GB HBM3"
    assert out["gpu.sm.clock.frequency"][0].value == 1830e6 and out["gpu.sm.clock.frequency"][0].unit == "Hz"
    assert out["gpu.tensor.activity"][0].value == 0.5
    assert out["gpu.ofu.reference_clock"][0].value == 1830e6
    assert out["gpu.flops.achieved"][0].value == pytest.approx(ofu.value * 989.4e12, rel=1e-3)


def test_unknown_precision_has_no_achieved_flops():
    out = points_by_name(processor().process(Batch(samples=[sample(precision=None)])))
    assert "gpu.flops.achieved" not in out
    assert dict(out["gpu.ofu"][0].resource)["ofu.precision"] == "unknown"


@pytest.mark.parametrize(("kw", "reason"), [
    ({"tensor_active": DCGM_FP64_BLANK}, "blank"),
    ({"tensor_active": float("nan")}, "nan"),
    ({"tensor_active": -1}, "negative"),
    ({"tensor_active": 1.3}, "out_of_range"),
    ({"sm_clock_mhz": 0}, "zero_clock"),
    ({"tensor_active": None}, "missing"),
    ({"model": "Mystery GPU", "max_sm_clock_mhz": None}, "no_reference_clock"),
])
def test_bad_samples_are_dropped_with_their_reason_never_zero(kw, reason):
    proc = processor()
    out = points_by_name(proc.process(Batch(samples=[sample(**kw), sample(**kw, time_unix_nano=2_000)])))
    assert "gpu.ofu" not in out and "gpu.ofu.raw" not in out
    dropped = out["gpu.ofu.dropped"]
    assert [p.value for p in dropped] == [1, 2] and all(p.monotonic for p in dropped)
    assert dict(dropped[0].attributes) == {"ofu.drop.reason": reason}
    assert proc.context.telemetry.counter("otel_ofu.ofu.dropped", reason=reason) == 2


def test_a_bad_sample_does_not_stop_the_good_ones():
    out = points_by_name(processor().process(Batch(samples=[sample(tensor_active="garbage"), sample(uuid="GPU-1")])))
    assert [dict(p.resource)["hw.id"] for p in out["gpu.ofu"]] == ["GPU-1"]


def test_unknown_model_is_marked_on_every_point_and_warned_once(caplog):
    proc = processor()
    with caplog.at_level(logging.WARNING):
        for t in range(5):
            batch = proc.process(Batch(samples=[sample(model="NVIDIA Future GPU", max_sm_clock_mhz=2000,
                                                       time_unix_nano=t)]))
            ofu = points_by_name(batch)["gpu.ofu"][0]
            assert dict(ofu.attributes)["ofu.fref.source"] == "max_sm_clock"
    assert sum("NVIDIA Future GPU" in r.getMessage() for r in caplog.records) == 1


def test_config_reference_clock_and_correction_overrides():
    proc = processor(reference_clocks={"NVIDIA Future GPU": 1500}, tile_correction={"factors": {"*": 0.9}})
    out = points_by_name(proc.process(Batch(samples=[sample(model="NVIDIA Future GPU", sm_clock_mhz=1500)])))
    assert out["gpu.ofu.raw"][0].value == pytest.approx(0.5)
    assert out["gpu.ofu"][0].value == pytest.approx(0.45)  # "*" applies to every GPU, known or not
    proc = processor(tile_correction={"factors": {"hopper/bf16": 0.9}})
    assert points_by_name(proc.process(Batch(samples=[sample()])))["gpu.ofu"][0].value == pytest.approx(0.45)
    proc = processor(tile_correction={"enabled": False})
    assert points_by_name(proc.process(Batch(samples=[sample()])))["gpu.ofu"][0].value == pytest.approx(0.5)


def loss_points(batch):
    return {dict(p.attributes)["ofu.loss.part"]: p for p in points_by_name(batch).get("gpu.ofu.loss", [])}


def test_the_loss_parts_come_beside_ofu_and_add_up_to_one_minus_it():
    # H100 SXM: GR 0.95, SM 0.85, TPA 0.6 at 1755 MHz (f_ref 1830), DRAM 0.7, power cap.
    batch = processor().process(Batch(samples=[sample(tensor_active=0.6, sm_clock_mhz=1755, gr_active=0.95,
                                                      sm_active=0.85, dram_active=0.7, clock_event_reasons=0x4 | 0x1,
                                                      attributes={"process.pid": "17"})]))
    out = points_by_name(batch)
    ofu, raw = out["gpu.ofu"][0], out["gpu.ofu.raw"][0]
    parts = loss_points(batch)
    assert list(parts) == ["engine_idle", "sm_idle", "non_tensor", "clock", "padding"]
    assert {k: p.value for k, p in parts.items()} == pytest.approx({
        "engine_idle": 0.05, "sm_idle": 0.10, "non_tensor": 0.25, "clock": 0.6 - raw.value,
        "padding": raw.value - ofu.value})
    assert sum(p.value for p in parts.values()) + ofu.value == pytest.approx(1.0, abs=1e-9)
    assert dict(parts["clock"].attributes) == {"ofu.loss.part": "clock", "ofu.loss.cause": "sw_power_cap",
                                               "process.pid": "17"}
    assert dict(parts["non_tensor"].attributes)["ofu.loss.cause"] == "memory_bound"
    assert "ofu.loss.cause" not in dict(parts["engine_idle"].attributes)
    assert all(p.resource is ofu.resource and p.time_unix_nano == ofu.time_unix_nano for p in parts.values())
    assert out["gpu.graphics_engine.activity"][0].value == 0.95 and out["gpu.dram.activity"][0].value == 0.7


def test_without_sm_active_the_loss_says_sm_idle_or_non_tensor_never_zero():
    parts = loss_points(processor().process(Batch(samples=[sample(gr_active=0.9, sm_active=DCGM_FP64_BLANK)])))
    assert list(parts) == ["engine_idle", "sm_idle+non_tensor", "clock", "padding"]
    assert parts["sm_idle+non_tensor"].value == pytest.approx(0.4)
    assert dict(parts["clock"].attributes)["ofu.loss.cause"] == "none"


def test_no_ofu_no_loss_and_loss_can_be_turned_off():
    out = points_by_name(processor().process(Batch(samples=[sample(tensor_active=None, gr_active=0.9)])))
    assert "gpu.ofu.loss" not in out and "gpu.ofu.dropped" in out
    out = points_by_name(processor(loss={"enabled": False}).process(Batch(samples=[sample(gr_active=0.9)])))
    assert "gpu.ofu.loss" not in out and "gpu.ofu" in out


def test_the_memory_bound_threshold_is_a_setting():
    batch = Batch(samples=[sample(gr_active=0.9, sm_active=0.8, dram_active=0.4)])
    assert dict(loss_points(processor().process(batch))["non_tensor"].attributes)["ofu.loss.cause"] == \
        "not_memory_bound"
    proc = processor(loss={"memory_bound_dram": 0.3})
    assert dict(loss_points(proc.process(batch))["non_tensor"].attributes)["ofu.loss.cause"] == "memory_bound"


def test_a_jobs_own_tile_correction_shows_its_padding():
    proc = processor(tile_correction={"jobs": {"ragged-*": 0.85, "other": 0.9}})
    ragged = points_by_name(proc.process(Batch(samples=[sample(job_id="ragged-vocab")])))
    plain = points_by_name(proc.process(Batch(samples=[sample(job_id="steady", uuid="GPU-1")])))
    assert ragged["gpu.ofu"][0].value == pytest.approx(0.5 * 0.85)
    padding = {dict(p.attributes)["ofu.loss.part"]: p.value for p in ragged["gpu.ofu.loss"]}["padding"]
    assert padding == pytest.approx(0.5 * 0.15)
    from otel_ofu.core import tiles
    assert plain["gpu.ofu"][0].value == pytest.approx(0.5 * tiles.DEFAULT_CORRECTIONS["hopper"]["bf16"])


@pytest.mark.parametrize(("cfg", "key"), [
    ({"tile_correction": {"jobs": {"x": 0.2}}}, "tile_correction.jobs.x"),
    ({"loss": {"memory_bound_dram": 0}}, "loss.memory_bound_dram"),
    ({"tile_correction": {"factors": {"volta/bf16": 0.9}}}, "tile_correction.factors.volta/bf16"),
    ({"tile_correction": {"factors": {"hopper/fp12": 0.9}}}, "tile_correction.factors.hopper/fp12"),
    ({"tile_correction": {"factors": {"hopper": 1.5}}}, "tile_correction.factors.hopper"),
    ({"tpa_tolerance": 0.5}, "tpa_tolerance"),
    ({"reference_clocks": {"X": 5}}, "reference_clocks.X"),
])
def test_bad_processor_configs_name_the_key(cfg, key):
    with pytest.raises(FieldError) as info:
        build_config(OfuProcessorConfig, cfg)
    assert info.value.key == key


def test_points_already_in_the_batch_pass_through():
    from otel_ofu.core.model import MetricPoint
    extra = MetricPoint("training.mfu", 0.5, 1, (("ofu.job.id", "j"),))
    out = processor().process(Batch(samples=[sample()], points=[extra]))
    assert out.points[0] is extra


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_the_same_window_twice_is_counted_once():
    """A batch sent again (a Collector retry) or a scrape duplicated: one dropped window, not two."""
    proc = processor()
    first = points_by_name(proc.process(Batch(samples=[sample(tensor_active=None)])))
    again = points_by_name(proc.process(Batch(samples=[sample(tensor_active=None), sample(tensor_active=None)])))
    assert [p.value for p in first["gpu.ofu.dropped"] + again["gpu.ofu.dropped"]] == [1, 1, 1]
    assert proc.context.telemetry.counter("otel_ofu.ofu.dropped", reason="missing") == 1


def test_drop_counters_of_gone_pods_are_forgotten_and_restart_as_a_reset():
    """200 pods with one blank window each leave no permanent series (issue 11, item 5)."""
    clock = FakeClock()
    proc = OfuProcessor(build_config(OfuProcessorConfig, {"dropped_max_stale": "10m"}), Context("ofu"), clock=clock)
    for pod in range(200):
        clock.now += 1
        proc.process(Batch(samples=[sample(tensor_active=None, time_unix_nano=int(clock.now * 1e9),
                                           resource={"k8s.pod.name": f"pod-{pod}"})]))
    assert len(proc._dropped) == 200
    clock.now += 601
    out = points_by_name(proc.process(Batch(samples=[sample(tensor_active=None, time_unix_nano=int(clock.now * 1e9),
                                                            resource={"k8s.pod.name": "pod-0"})])))
    assert len(proc._dropped) == 1  # only pod-0's series, started again
    (again,) = out["gpu.ofu.dropped"]
    assert again.value == 1 and again.start_time_unix_nano == int(clock.now * 1e9) - 10 * 10**9


def test_a_mig_instance_says_which_share_of_its_gpu_it_is():
    """gpu.mig.share weighs an instance in the recording rules: a 3g + 4g pair is 3/7 + 4/7 of one GPU."""
    mig = {"gpu.mig.instance_id": "1", "gpu.mig.profile": "3g.40gb"}
    out = points_by_name(processor().process(Batch(samples=[sample(resource=mig)])))
    (share,) = out["gpu.mig.share"]
    assert share.value == pytest.approx(3 / 7)
    assert share.resource == out["gpu.ofu"][0].resource  # the same series labels as its gpu_ofu
    whole = points_by_name(processor().process(Batch(samples=[sample()])))
    assert "gpu.mig.share" not in whole  # a whole GPU counts 1 without a series of its own


def test_a_mig_instance_of_unknown_size_has_no_share():
    """A MIG instance without profile or slices: its size is unknown, said by no share rather than a guess."""
    out = points_by_name(processor().process(Batch(samples=[sample(resource={"gpu.mig.instance_id": "4"})])))
    assert "gpu.ofu" in out and "gpu.mig.share" not in out


def test_a_gpus_first_point_after_its_job_changed_says_the_window_it_covers():
    """So that a jobs tier routing each job to its own instance counts the GPU's time once (docs/jobs.md#windows)."""
    proc = processor()

    def ofu_point(t: int, job: str, **resource):
        out = proc.process(Batch(samples=[sample(time_unix_nano=t * 10**9, job_id=job, resource=resource)]))
        [point] = points_by_name(out)["gpu.ofu"]
        return point

    assert ofu_point(10, "a").start_time_unix_nano == 0  # its first sample: nothing known before it
    assert ofu_point(20, "a").start_time_unix_nano == 0  # the usual point: a plain gauge point
    assert ofu_point(30, "b").start_time_unix_nano == 20 * 10**9  # another job: since its previous sample
    assert ofu_point(40, "b").start_time_unix_nano == 0
    assert ofu_point(50, "b", **{"k8s.pod.name": "b-1"}).start_time_unix_nano == 40 * 10**9  # another pod


# --- what the processor keeps per GPU gives what working it out afresh gives ------------------------------


@st.composite
def gpu_windows(draw) -> list[GpuSample]:
    """Windows of a few GPUs: models known and not, precisions, MIG instances, max clocks and their blanks."""
    out = []
    for t in range(draw(st.integers(1, 4))):
        for g in range(draw(st.integers(1, 3))):
            out.append(sample(
                time_unix_nano=1_000 + t, gpu_index=g, uuid=f"GPU-{g}",
                model=draw(st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Mystery GPU", ""])),
                tensor_active=draw(st.sampled_from([0.5, 1.02, None, float("nan"), DCGM_FP64_BLANK])),
                sm_clock_mhz=draw(st.sampled_from([1830.0, 0.0, None, 1410])),
                max_sm_clock_mhz=draw(st.sampled_from([None, 1980.0, 2100, "N/A", float("nan"), DCGM_FP64_BLANK,
                                                       True, 1, 1.0, 1980])),
                precision=draw(st.sampled_from([None, "bf16", "fp8", "tf32"])),
                job_id=draw(st.sampled_from([None, "job-a"])),
                resource=draw(st.sampled_from([{}, {"gpu.mig.profile": "3g.40gb", "gpu.mig.instance_id": "1"},
                                               {"gpu.mig.instance_id": "2"}, {"k8s.pod.name": "p"}]))))
    return out


@settings(max_examples=200, deadline=None)
@given(gpu_windows(), st.sampled_from([{}, {"reference_clocks": {"Mystery GPU": 1500}},
                                       {"reference_clocks": {"*": 1600}, "tile_correction": {"enabled": False}},
                                       {"tile_correction": {"factors": {"hopper": 0.9}}}]))
def test_what_is_kept_per_gpu_gives_what_a_fresh_processor_gives(samples, cfg):
    """Resources, MIG shares and calibrations are kept per GPU across batches; each window's points must be
    what a processor that never saw the GPU makes of it (same names, values, resources, attributes). But for
    what is kept on purpose: the drop counters' counts, the window a first point after a job change covers, and
    gpu.energy (a window's energy is the difference from the GPU's previous one)."""
    def comparable(points):
        return [repr(replace(p, value=0, start_time_unix_nano=0) if p.name == "gpu.ofu.dropped" else
                     replace(p, start_time_unix_nano=0) if p.name == "gpu.ofu" else p) for p in points
                if p.name != "gpu.energy"]

    kept = processor(**cfg)
    for s in samples:
        got = kept.process(Batch(samples=[s])).points
        fresh = processor(**cfg).process(Batch(samples=[s])).points
        assert comparable(got) == comparable(fresh)


@pytest.mark.parametrize("readings", [(1, True), (True, 1), (1980, 1980.0, "1980", 1980), (float("nan"), 1980.0)])
def test_a_gpus_calibration_follows_its_max_clock_reading_exactly(readings):
    """An unknown model's f_ref is its reported max SM clock: a reading equal but of another type (True and
    1, an int and its text) is worked out again, as a fresh processor would."""
    kept = processor()
    for t, max_clock in enumerate(readings):
        s = sample(time_unix_nano=1_000 + t, model="Mystery GPU", max_sm_clock_mhz=max_clock, precision=None)
        got = [repr(replace(p, value=0, start_time_unix_nano=0) if p.name == "gpu.ofu.dropped" else p)
               for p in kept.process(Batch(samples=[s])).points if p.name != "gpu.energy"]  # kept on purpose
        fresh = [repr(replace(p, value=0, start_time_unix_nano=0) if p.name == "gpu.ofu.dropped" else p)
                 for p in processor().process(Batch(samples=[s])).points]
        assert got == fresh, max_clock


@settings(max_examples=150, deadline=None)
@given(gpu_windows(), st.sampled_from([{}, {"reference_clocks": {"*": 1600}}, {"emit_inputs": False},
                                       {"loss": {"enabled": False}}]),
       st.lists(st.sampled_from([None, 0.2, 0.7, 1.0, float("nan")]), min_size=3, max_size=3))
def test_what_the_otlp_exporter_writes_of_the_gpus_rows_is_their_points(samples, cfg, ratios):
    """The processor hands on each GPU window as a PointRow (its points where gpu.ofu has a start time, and
    for a drop): the request the otlp exporters write from the rows equals protobuf's of the points they
    stand for, batch after batch (the templates kept), whatever the window's layout (MIG share, FLOP/s,
    loss parts, inputs present or not, drops, job changes)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from otel_ofu.otlp.payload import metrics_payload
    from tests.test_otlp_encode import reference

    gr, sm, dram = ratios
    proc = processor(**cfg)
    for _ in range(2):
        batch = proc.process(Batch(samples=[replace(s, gr_active=gr, sm_active=sm, dram_active=dram) for s in samples]))
        body, count = metrics_payload(batch.points_and_rows())
        assert count == len(batch.points)
        assert ExportMetricsServiceRequest.FromString(body) == reference(batch.points)
