"""The ``ofu`` processor: GPU samples in, clock-normalized, tile-corrected OFU points out.

Place attribution processors (which set job and precision) before it: the precision picks
f_ref, the correction factor and the peak for achieved FLOP/s. A sample that cannot give
OFU (blank TPA, clock 0, unknown model without a max clock, ...) produces no ``gpu.ofu``
point; it is counted in ``gpu.ofu.dropped`` with its reason instead: once per window (a
window sent twice counts once), in a series that is forgotten after ``dropped_max_stale``
without drops and then starts again with a new start time (docs/state.md).

OFU that arrives already computed (another otel-ofu's output, decoded by the ``otlp``
receiver) is used as it is: a GPU whose ``gpu.ofu`` points arrive is not computed again from
DCGM inputs that may come for it too (counted in ``otel_ofu.ofu.skipped``), so its GPU time
is never counted twice. With ``recompute: true`` the arriving OFU points are dropped instead
and OFU is computed here from the inputs they came with (``gpu.tensor.activity``,
``gpu.sm.clock.frequency``, ...) with this processor's settings.
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from otel_ofu.core import specs
from otel_ofu.core.counters import CounterTracker
from otel_ofu.core.loss import CLOCK, MEMORY_BOUND_DRAM, causes_of, loss_shares, split_clock, split_layout
from otel_ofu.core.metrics import LINK_THROUGHPUT_METRIC, OFU_OUTPUT_METRICS, RATIO, MetricInfo, register
from otel_ofu.core.model import (
    DROP_REASON,
    ENERGY_BASIS,
    ENERGY_COUNTER,
    ENERGY_POWER_X_TIME,
    FREF_SOURCE,
    GPU_INDEX,
    HOST_NAME,
    HW_ID,
    HW_MODEL,
    HW_VENDOR,
    JOB_ID,
    LINK,
    LOSS_CAUSE,
    LOSS_PART,
    PRECISION,
    SHARE_BASIS,
    Attributes,
    Batch,
    GpuKey,
    GpuSample,
    MetricPoint,
    PointLayout,
    PointRow,
    attrs,
    gpu_key,
)
from otel_ofu.core.ofu import ANY_MODEL, FREF_MAX_CLOCK, Calibration, OfuResult, calibration, ofu_with
from otel_ofu.core.tiles import ARCH_TILES
from otel_ofu.core.values import TPA_TOLERANCE, NoValue, clean, clean_clock, clean_ratio
from otel_ofu.pipeline.caches import Cache
from otel_ofu.pipeline.component import Context, Factory, Processor
from otel_ofu.pipeline.config import Duration, require

UNKNOWN_JOB = "unknown"
_ATTRIBUTES_CACHE_SIZE = 4096  # distinct (job, precision, attributes) sets kept
_RESOURCES_CACHE_SIZE = 1 << 17  # GPU resources kept (a 100,000-GPU processing stage's), about 1 KB each
_WARNED_MODELS_SIZE = 256  # distinct unknown model strings warned about (then it starts over)
# GpuSample.source of a sample made again from another otel-ofu's points (recompute): its energy came with
# them as gpu.energy (passed on), so none is worked out here from its re-emitted power.
RECOMPUTED_SOURCE = "otel-ofu"
_SWEEP_INTERVAL_S = 60.0  # how often stale drop counters (and clock event counters) are looked for
# A GPU with no sample for this long has left: its clock event counters are forgotten (its next reading is a
# first one, whose window keeps the bitmask's cause).
CLOCK_EVENTS_MAX_STALE_S = 600.0


def _iso(time_unix_nano: int) -> str:
    """A point's time as people read it (UTC, ISO 8601), for log lines."""
    return datetime.fromtimestamp(time_unix_nano / 1e9, UTC).isoformat(timespec="milliseconds")


def _input_without_value(sample: GpuSample, reason: NoValue) -> str:
    """Which input a dropped window lacks, by its DCGM name, for the log line."""
    if reason is NoValue.NO_REFERENCE_CLOCK:
        return f"f_ref of model {sample.model!r}:"
    if clean_ratio(sample.tensor_active)[1] is not None:
        return "tensor activity (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, field 1004):"
    return "SM clock (DCGM_FI_DEV_SM_CLOCK, field 100, or DCGM_FI_DEV_SM_CLOCK_HERTZ, 1603):"


def reference_clock_fix(model: str | None) -> str:
    """What to set for a GPU model without f_ref (not in the spec table, no reported max clock; ``None``
    or "": unnamed), as this processor and ``otel-ofu doctor`` say it."""
    return (f"set reference_clocks: {{{(model or ANY_MODEL)!r}: <MHz at which its dense tensor peak is quoted>}} "
            "on the ofu processor (docs/gpus.md)")


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


@dataclass(slots=True)
class _DropCounter:
    """One ``gpu.ofu.dropped`` series: a GPU resource and a reason."""

    count: int
    start_ns: int  # the series' start time (a forgotten series starts again: a counter reset)
    last_ns: int  # the data time of the last window counted: the same window again is not counted twice
    seen: float  # this process's monotonic clock at the last drop


SKIPPED = register(MetricInfo(
    "otel_ofu.ofu.skipped", "{window}", "sum",
    "Self-telemetry: GPU windows the ofu processor did not compute because the GPU's OFU arrives already "
    "computed (reason already_computed), or arriving OFU points it replaced (reason recomputed).")).name
# A GPU whose computed OFU arrived is not computed here for this long (data time) after its last such point.
ARRIVING_OFU_HOLD_S = 300.0
_ARRIVING_OFU_MAX_GPUS = 1_000_000  # bound on GPUs remembered (older ones are forgotten first)

# The inputs the ofu processor re-emits, by metric name: GpuSample field and the factor back to its unit.
_INPUT_FIELDS: dict[str, tuple[str, float]] = {
    "gpu.tensor.activity": ("tensor_active", 1.0), "gpu.sm.clock.frequency": ("sm_clock_mhz", 1e-6),
    "gpu.sm.clock.max": ("max_sm_clock_mhz", 1e-6), "gpu.power.usage": ("power_w", 1.0),
    "gpu.clock.event_reasons": ("clock_event_reasons", 1.0), "gpu.sm.activity": ("sm_active", 1.0),
    "gpu.graphics_engine.activity": ("gr_active", 1.0), "gpu.dram.activity": ("dram_active", 1.0),
}
# The inputs as the ofu processor emits them (emit_inputs), in the order a GPU's points list them: name,
# unit, and the link (ofu.link) of a gpu.link.throughput point.
LINK_METRIC = LINK_THROUGHPUT_METRIC
_INPUT_POINTS: tuple[tuple[str, str, str | None], ...] = (
    ("gpu.tensor.activity", RATIO, None), ("gpu.sm.clock.frequency", "Hz", None), ("gpu.sm.clock.max", "Hz", None),
    ("gpu.power.usage", "W", None), ("gpu.clock.event_reasons", "{bitmask}", None), ("gpu.sm.activity", RATIO, None),
    ("gpu.graphics_engine.activity", RATIO, None), ("gpu.dram.activity", RATIO, None),
    (LINK_METRIC, "By/s", "pcie"), (LINK_METRIC, "By/s", "nvlink"))


def _input_attributes(point_attrs: Attributes, link: str | None) -> Attributes:
    """An input point's attributes: the GPU window's, and which link a gpu.link.throughput point measures."""
    return point_attrs if link is None else attrs({**dict(point_attrs), LINK: link})
_IDENTITY_KEYS = frozenset({HOST_NAME, HW_ID, HW_MODEL, HW_VENDOR, GPU_INDEX, JOB_ID, PRECISION})


@dataclass
class TileCorrectionConfig:
    """The tile-quantization correction c_tile (docs/method.md#tile-correction)."""

    enabled: bool = True  # apply c_tile to gpu.ofu (gpu.ofu.raw is always emitted too)
    # Overrides of the built-in factors: "hopper/fp8": 0.97, "hopper": 0.97 or "*": 0.97, the
    # most specific wins.
    factors: dict[str, float] = field(default_factory=dict)
    # A job's own factor, by ofu.job.id (exact or a shell glob; the first match in order wins):
    # for a job whose GEMM shapes pad far more than the fleet's (a ragged vocabulary), computed
    # from its shapes with otel_ofu.core.tiles. Beats factors.
    jobs: dict[str, float] = field(default_factory=dict)

    def validate(self) -> None:
        for job, value in self.jobs.items():
            require(bool(job), "jobs", "a job id or glob must not be empty")
            require(0.5 <= value <= 1.0, f"jobs.{job}", f"a correction factor is in [0.5, 1.0], got {value}")
        for key, value in self.factors.items():
            arch, _, precision = key.partition("/")
            require(arch == "*" or arch in ARCH_TILES, f"factors.{key}",
                    f"unknown architecture '{arch}' (known: {', '.join(ARCH_TILES)}, or '*')")
            require(not precision or precision in specs.PRECISIONS, f"factors.{key}",
                    f"unknown precision '{precision}' (known: {', '.join(specs.PRECISIONS)})")
            require(0.5 <= value <= 1.0, f"factors.{key}", f"a correction factor is in [0.5, 1.0], got {value}")


@dataclass
class LossConfig:
    """The loss account: where each window's dense peak went (docs/method.md#where-the-flops-go-the-loss-account)."""

    # Emit gpu.ofu.loss beside gpu.ofu: one point per part (ofu.loss.part), adding up to 1 - OFU.
    enabled: bool = True
    # DRAM_ACTIVE at or above this makes the non-tensor part memory-bound (its ofu.loss.cause).
    memory_bound_dram: float = MEMORY_BOUND_DRAM

    def validate(self) -> None:
        require(0 < self.memory_bound_dram <= 1, "memory_bound_dram",
                f"must be within (0, 1], got {self.memory_bound_dram}")


@dataclass
class EnergyConfig:
    """gpu.energy: the energy each GPU window used (docs/method.md#energy-per-job)."""

    enabled: bool = True  # emit gpu.energy where the source has an energy counter or a power reading
    # Where the source has no energy counter (DCGM 156/1611, NVML total energy): the power reading x the
    # time since the GPU's previous sample (ofu.energy.basis power_x_time); false: no energy without a counter.
    power_x_time: bool = True
    # A power reading stands for at most this long: after a longer gap since the GPU's previous sample its
    # window gets no power_x_time energy (a counter's increase covers any gap).
    max_power_gap: Duration = field(default_factory=lambda: Duration(120))
    # A GPU's last counter reading is forgotten after this long (data time) without a sample of it: it
    # left, and its next reading (if it comes back) is a first one, which gives no energy.
    forget_after: Duration = field(default_factory=lambda: Duration(3600))

    def validate(self) -> None:
        require(self.max_power_gap > 0, "max_power_gap", "must be positive")
        require(self.forget_after > 0, "forget_after", "must be positive")


@dataclass
class OfuProcessorConfig:
    tile_correction: TileCorrectionConfig = field(default_factory=TileCorrectionConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    energy: EnergyConfig = field(default_factory=EnergyConfig)
    # Model string (as reported) -> f_ref in MHz, for GPUs missing from the spec table; "*" for
    # every model the table does not know (and samples that name none).
    reference_clocks: dict[str, float] = field(default_factory=dict)
    # TPA above 1 by more than this is bad data (dropped, reason out_of_range); up to it, it is
    # clamped to 1.
    tpa_tolerance: float = TPA_TOLERANCE
    # Also emit the inputs (tensor activity, SM clock, max clock, power, clock event reasons, SM,
    # graphics engine and DRAM activity, PCIe and NVLink traffic) as their own metrics.
    emit_inputs: bool = True
    # A gpu.ofu.dropped series (GPU resource, reason) with no drop for this long is forgotten:
    # pods and jobs come and go, and their series must not stay in memory forever.
    dropped_max_stale: Duration = field(default_factory=lambda: Duration(3600))
    # OFU arriving already computed (gpu.ofu from another otel-ofu) is used as is; true: replace it
    # with OFU computed here from the inputs that came with it (docs/fleet.md).
    recompute: bool = False

    def validate(self) -> None:
        require(0 <= self.tpa_tolerance <= 0.2, "tpa_tolerance", f"must be within [0, 0.2], got {self.tpa_tolerance}")
        require(self.dropped_max_stale > 0, "dropped_max_stale", "must be positive")
        for model, mhz in self.reference_clocks.items():
            require(100 <= mhz <= 5000, f"reference_clocks.{model}", f"expected MHz within [100, 5000], got {mhz}")


_NEW: Any = object()


@dataclass(slots=True)
class _Gpu:
    """What every window of one GPU (with its job and precision) shares, worked out once (OfuProcessor._gpu)."""

    key: GpuKey  # which GPU it is (sample.gpu_key())
    resource: Attributes  # of its points: the GPU's identity and its job's
    share: float | None  # the fraction of the physical GPU it is (specs.instance_share)
    mig: bool  # a MIG instance (whose points carry gpu.mig.share)
    device: tuple[str, str]  # the physical device (host, UUID or index): whose energy counter it reads
    # The part of its device's energy that is its: 1 for a whole GPU, a MIG instance's slices' share, None for
    # an instance of unknown size (it gets none).
    energy_part: float | None
    # Its calibration (core.ofu.calibration; None: no f_ref) and the raw max SM clock reading it was
    # worked out with (None, nearly always): worked out again when another reading comes.
    calibration: Calibration | None | object = None
    max_clock: object = _NEW

    @classmethod
    def of(cls, sample: GpuSample, job: str, precision: str) -> _Gpu:
        share = specs.instance_share(sample.model, sample.resource) if sample.resource else 1.0
        mig = share is not None and bool(sample.resource) and specs.is_mig_instance(sample.resource)
        key = sample.gpu_key()
        part = (share if mig else None) if key[2] else 1.0
        return cls(key, sample.resource_attributes({JOB_ID: job, PRECISION: precision}), share, mig, key[:2], part)


class OfuProcessor(Processor):
    def __init__(self, config: OfuProcessorConfig, context: Context, *,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(config, context)
        self._clock = clock
        self._warned_models: set[str] = set()
        self._dropped: dict[tuple[Attributes, str], _DropCounter] = {}
        self._next_sweep = clock() + _SWEEP_INTERVAL_S
        # extra attributes -> (the inputs' attributes, the OFU points' by f_ref source)
        self._attributes_cache = Cache("ofu point attributes", _ATTRIBUTES_CACHE_SIZE)
        self._gpus = Cache("ofu gpus", _RESOURCES_CACHE_SIZE)  # see _gpu
        # GPU -> (time of its previous sample, that sample's resource): see _window_start.
        self._previous = Cache("ofu previous sample", _RESOURCES_CACHE_SIZE)
        self._arriving: dict[GpuKey, int] = {}  # GPU -> time of the last computed OFU that arrived for it
        self._job_factors = Cache("ofu job tile corrections", _ATTRIBUTES_CACHE_SIZE)  # job id -> (overrides,)
        # Energy, per device (host, UUID or index: a MIG instance's is its GPU's): the counter's last reading,
        # and its last window (time, joules or None, basis) so that the samples of one device and window (a
        # shared GPU's jobs, a GPU's MIG instances) take their parts of one increase. See _device_energy.
        self._energy_counter = CounterTracker()
        self._energy_windows: dict[tuple[str, str], tuple[int, float | None, str]] = {}
        self._energy_next_sweep = 0  # data time (ns) of the next look for devices that left
        # The clock event time per reason (DCGM 1420-1424): per GPU, each cause's last reading (core.counters),
        # and the time of its last window, that window's throttled ns per cause, and when it was seen.
        self._event_counters: dict[GpuKey, CounterTracker] = {}
        self._throttled: dict[GpuKey, tuple[int, dict[str, float] | None, float]] = {}
        self._next_event_sweep = clock() + _SWEEP_INTERVAL_S

    def process(self, batch: Batch) -> Batch:
        points = list(batch.points)
        samples = batch.samples
        if points:
            if self.config.recompute:
                points, arrived = self._recompute(points)
                samples = [*samples, *arrived]
            elif samples:
                samples = self._not_computed_elsewhere(points, samples)
        for sample in samples:
            out = self._sample_output(sample)
            if type(out) is PointRow:
                points.append(out)  # type: ignore[arg-type]
            else:
                points += out  # type: ignore[arg-type]
        # A GPU's window as one PointRow: made into points only for a consumer that reads them (core/model.py).
        return Batch.with_rows(batch.samples, points, batch.passthrough, batch.events)

    # --- OFU that arrives computed -----------------------------------------------------------

    def _not_computed_elsewhere(self, points: list[MetricPoint], samples: list[GpuSample]) -> list[GpuSample]:
        """The samples of GPUs whose OFU does not arrive computed (see the module docstring)."""
        arriving = self._arriving
        for point in points:
            if point.name == "gpu.ofu":
                key = gpu_key(point.resource)
                arriving[key] = max(arriving.get(key, 0), point.time_unix_nano)
        if not arriving:
            return samples
        if len(arriving) > _ARRIVING_OFU_MAX_GPUS:
            for key in sorted(arriving, key=arriving.__getitem__)[:len(arriving) - _ARRIVING_OFU_MAX_GPUS]:
                del arriving[key]
        hold = int(ARRIVING_OFU_HOLD_S * 1e9)
        kept = []
        for sample in samples:
            last = arriving.get(sample.gpu_key())
            if last is not None and sample.time_unix_nano <= last + hold:
                self.context.telemetry.add(SKIPPED, 1, reason="already_computed")
                continue
            kept.append(sample)
        return kept

    def _recompute(self, points: list[MetricPoint]) -> tuple[list[MetricPoint], list[GpuSample]]:
        """Arriving OFU dropped; its window's inputs (same resource and time) made into samples."""
        windows: dict[tuple[Attributes, int], dict[str, MetricPoint]] = {}
        kept: list[MetricPoint] = []
        for point in points:
            name = point.name
            if name in OFU_OUTPUT_METRICS or name in _INPUT_FIELDS:
                windows.setdefault((point.resource, point.time_unix_nano), {})[name] = point
            else:
                kept.append(point)
        samples = []
        for (resource, t), found in windows.items():
            if not (found.keys() & OFU_OUTPUT_METRICS or "gpu.tensor.activity" in found):
                kept += found.values()  # inputs alone, no OFU to replace: they pass as they came
                continue
            replaced = sum(1 for name in found if name in OFU_OUTPUT_METRICS)
            if replaced:
                self.context.telemetry.add(SKIPPED, replaced, reason="recomputed")
            samples.append(self._sample_of(resource, t, found))
            if not self.config.emit_inputs:  # re-emitted from the sample otherwise
                kept += [p for name, p in found.items() if name in _INPUT_FIELDS]
        return kept, samples

    @staticmethod
    def _sample_of(resource: Attributes, t: int, found: dict[str, MetricPoint]) -> GpuSample:
        """A GpuSample from otel-ofu's own per-GPU points of one window (inputs in their emitted units)."""
        r = dict(resource)
        index = str(r.get(GPU_INDEX, ""))
        values = {field: found[name].value * factor for name, (field, factor) in _INPUT_FIELDS.items()
                  if name in found}
        first = next(iter(found.values()))
        extra = {k: v for k, v in first.attributes if k != FREF_SOURCE and k != SHARE_BASIS}
        shared = found.get("gpu.job.share")
        return GpuSample(t, 0.0, str(r.get(HOST_NAME, "")), int(index) if index.isdecimal() else index,
                         str(r.get(HW_ID, "")), str(r.get(HW_MODEL, "")), values.get("tensor_active"),
                         values.get("sm_clock_mhz"), 1 if "sm_clock_mhz" in values else 0,
                         values.get("max_sm_clock_mhz"), values.get("power_w"), values.get("clock_event_reasons"),
                         values.get("sm_active"), values.get("gr_active"), values.get("dram_active"),
                         source=RECOMPUTED_SOURCE,
                         job_id=None if r.get(JOB_ID) is None else str(r[JOB_ID]),
                         precision=None if r.get(PRECISION) is None else str(r[PRECISION]),
                         resource={k: v for k, v in r.items() if k not in _IDENTITY_KEYS}, attributes=extra,
                         share=None if shared is None else shared.value,
                         share_basis="" if shared is None else str(dict(shared.attributes).get(SHARE_BASIS, "")))

    def sample_points(self, sample: GpuSample) -> list[MetricPoint]:
        """The points of one GPU sample: its OFU (or its drop counter), loss account and inputs."""
        out = self._sample_output(sample)
        return out.points() if type(out) is PointRow else out  # type: ignore[union-attr,return-value]

    def _sample_output(self, sample: GpuSample) -> PointRow | list[MetricPoint]:
        """The sample's points: a PointRow (nearly always), or MetricPoints (a drop counter, or a gpu.ofu with
        a start time: neither is a plain gauge point)."""
        cfg = self.config
        precision = specs.normalize_precision(sample.precision)
        job = sample.job_id or UNKNOWN_JOB
        # The GPU's identity and its job's, on the resource of every point of this GPU (a job
        # change is a new resource); point attributes only say how a value was made.
        gpu = self._gpu(sample, job, precision)
        resource, share = gpu.resource, gpu.share
        t = sample.time_unix_nano
        # Stepped for every window, with OFU or not, so that an increase never spans two windows.
        throttled = None if sample.clock_event_ns is None else self._throttled_time(sample, gpu.key)

        max_clock = sample.max_sm_clock_mhz
        known = gpu.max_clock
        if max_clock is not known and not (type(max_clock) is type(known) and max_clock == known):
            corrections = cfg.tile_correction.factors
            if cfg.tile_correction.jobs and sample.job_id:  # a job's own c_tile (the GPU's entry is per job)
                corrections = self._job_corrections(sample.job_id)
            gpu.calibration = calibration(sample.model, precision, clean_clock(max_clock)[0],
                                          fref_overrides=cfg.reference_clocks, correction_overrides=corrections,
                                          apply_correction=cfg.tile_correction.enabled)
            gpu.max_clock = max_clock
        cal: Calibration | None = gpu.calibration  # type: ignore[assignment]
        result = ofu_with(cal, sample.tensor_active, sample.sm_clock_mhz, cfg.tpa_tolerance, share)
        point_attrs, ofu_attrs_by_fref, loss_attrs, layouts = self._point_attributes(sample.attributes)
        energy = self._energy(sample, gpu) if cfg.energy.enabled and sample.source != RECOMPUTED_SOURCE else None
        if not isinstance(result, OfuResult):
            if result is NoValue.NO_REFERENCE_CLOCK and sample.model not in self._warned_models:
                self._warn_no_reference_clock(sample)
            out = [self._drop(sample, result, resource, t)]
            if energy is not None:  # a window without OFU used energy too
                out.append(MetricPoint("gpu.energy", energy[0], t, resource,
                                       attrs({**sample.attributes, ENERGY_BASIS: energy[1]}), "J"))
            if cfg.emit_inputs:
                inputs: list[float] = []
                present = self._input_values(sample, result, inputs)
                out += [MetricPoint(name, value, t, resource, _input_attributes(point_attrs, link), unit)
                        for (name, unit, link), value
                        in zip([item for k, item in enumerate(_INPUT_POINTS) if present >> k & 1], inputs)]
            return out

        if result.fref_source == FREF_MAX_CLOCK and sample.model not in self._warned_models:
            if len(self._warned_models) >= _WARNED_MODELS_SIZE:
                self._warned_models.clear()  # model strings come from senders: bounded, at worst warned again
            self._warned_models.add(sample.model)
            self.log.warning("GPU model %r is not in the spec table: using its reported max SM clock (%.0f MHz) "
                             "as f_ref; points carry %s=%s. Add it under reference_clocks to fix.",
                             sample.model, result.fref_mhz, FREF_SOURCE, FREF_MAX_CLOCK)
        # The values in the layout's order: gpu.ofu, gpu.ofu.raw, the reference clock, FLOP/s (when
        # known), the MIG share (an instance), the loss account's parts, the inputs present.
        values = [result.corrected, result.raw, result.fref_mhz * 1e6]
        flops = result.achieved_flops
        job_share = sample.share
        if flops is not None:
            values.append(flops if job_share is None else flops * job_share)  # a shared GPU's job: its part
        if gpu.mig:
            values.append(share)  # type: ignore[arg-type]
        if job_share is not None:
            values.append(job_share)
        if energy is not None:
            values.append(energy[0])
        loss = None
        if cfg.loss.enabled:
            names, shares, memory, clock = loss_shares(
                result.tpa, result.raw, result.corrected, sample.gr_active, sample.sm_active, sample.dram_active,
                sample.clock_event_reasons, cfg.tpa_tolerance, cfg.loss.memory_bound_dram)
            if throttled is not None:  # the clock part by each reason's share of the window's throttled time
                split = split_clock(shares[names.index(CLOCK)], throttled)
                if split is not None:
                    names, shares, clock = split_layout(names, shares, split)  # type: ignore[assignment]
            loss = (names, memory, clock)
            values += shares
        present = self._input_values(sample, result, values) if cfg.emit_inputs else 0
        layout_key = (result.fref_source, flops is not None, gpu.mig, None if job_share is None else sample.share_basis,
                      None if energy is None else energy[1], loss, present)
        layout = layouts.get(layout_key)
        if layout is None:
            layout = layouts[layout_key] = self._layout(sample, layout_key, ofu_attrs_by_fref, loss_attrs,
                                                        point_attrs)
        row = PointRow(layout, resource, t, values)
        start = self._window_start(sample, gpu, resource)
        if not start:
            return row
        points = row.points()
        points[0].start_time_unix_nano = start  # gpu.ofu's window start (see _window_start)
        return points

    @staticmethod
    def _layout(sample: GpuSample, key: tuple, ofu_attrs_by_fref: dict[str, Attributes],
                loss_attrs: dict[tuple, tuple[Attributes, ...]], point_attrs: Attributes) -> PointLayout:
        """The names, units and attributes of a GPU window's points (see :meth:`_sample_output`), for its key."""
        fref_source, flops, mig, share_basis, energy_basis, loss, present = key
        ofu_attrs = ofu_attrs_by_fref.get(fref_source)
        if ofu_attrs is None:
            ofu_attrs = ofu_attrs_by_fref[fref_source] = attrs({**sample.attributes, FREF_SOURCE: fref_source})
        points = [("gpu.ofu", RATIO, ofu_attrs), ("gpu.ofu.raw", RATIO, ofu_attrs),
                  ("gpu.ofu.reference_clock", "Hz", ofu_attrs)]
        if flops:
            points.append(("gpu.flops.achieved", "{flop}/s", ofu_attrs))
        if mig:
            # What the recording rules weigh the instance by: its fraction of the physical GPU.
            points.append(("gpu.mig.share", RATIO, ofu_attrs))
        if share_basis is not None:
            # A shared GPU's job: its part of the GPU (docs/sharing.md), and how the split was made.
            points.append(("gpu.job.share", RATIO, attrs({**dict(ofu_attrs), SHARE_BASIS: share_basis})))
        if energy_basis is not None:
            points.append(("gpu.energy", "J", attrs({**sample.attributes, ENERGY_BASIS: energy_basis})))
        if loss is not None:
            part_attrs = loss_attrs.get(loss)
            if part_attrs is None:
                names, memory, clock = loss
                part_attrs = loss_attrs[loss] = tuple(
                    attrs({**sample.attributes, LOSS_PART: part, LOSS_CAUSE: cause})
                    for part, cause in zip(names, causes_of(names, memory, clock)))
            points += [("gpu.ofu.loss", RATIO, part_attributes) for part_attributes in part_attrs]
        points += [(name, unit, _input_attributes(point_attrs, link))
                   for k, (name, unit, link) in enumerate(_INPUT_POINTS) if present >> k & 1]
        return PointLayout(tuple(points))

    def _energy(self, sample: GpuSample, gpu: _Gpu) -> tuple[float, str] | None:
        """The sample's energy in its window (J) and how it was found; None where there is none.

        The device's energy (:meth:`_device_energy`) times the part of it this sample stands for: a MIG
        instance its slices' share (gpu.mig.share; none for an instance of unknown size), a shared GPU's
        job its share (gpu.job.share). So a device's parts add up to it, as its time does.
        """
        known = self._energy_windows.get(gpu.device)
        if known is None or known[0] != sample.time_unix_nano:
            known = self._device_energy(sample, gpu.device, known)
        joules, part = known[1], gpu.energy_part
        if joules is None or part is None:
            return None
        if part != 1.0:
            joules *= part
        if sample.share is not None:
            joules *= sample.share
        return joules, known[2]

    def _device_energy(self, sample: GpuSample, device: tuple[str, str],
                       known: tuple[int, float | None, str] | None) -> tuple[int, float | None, str]:
        """The whole device's energy in the window ending at the sample's time, worked out once per device and
        window (``known``: its last window): the counter's increase (core.counters: none for a blank, first or
        late reading; a reset counts from 0), else, where the source has no counter, power x the time since
        the device's previous sample. Kept as the device's last window: (time, joules or None, basis)."""
        t = sample.time_unix_nano
        if known is not None and t < known[0]:
            return (t, None, known[2])  # late: its window is already counted
        settings = self.config.energy
        if t >= self._energy_next_sweep:
            self._forget_devices(t)
        joules: float | None = None
        if sample.energy_mj is not None:
            basis = ENERGY_COUNTER
            increase = self._energy_counter.increase(device, t, sample.energy_mj)
            if increase is not None:
                joules = increase / 1000.0
        else:
            basis = ENERGY_POWER_X_TIME
            power = clean(sample.power_w)[0] if settings.power_x_time and sample.power_w is not None else None
            if power is not None and known is not None:
                seconds = (t - known[0]) / 1e9
                if 0 < seconds <= float(settings.max_power_gap):
                    joules = power * seconds
        windows = self._energy_windows
        if len(windows) >= _RESOURCES_CACHE_SIZE and device not in windows:
            # Bounded as the caches are (starting over): at worst one window without energy per device.
            windows.clear()
            self._energy_counter = CounterTracker()
        known = windows[device] = (t, joules, basis)
        return known

    def _forget_devices(self, t: int) -> None:
        """Forget the devices without a sample for energy.forget_after (data time): they left."""
        cutoff = t - int(float(self.config.energy.forget_after) * 1e9)
        self._energy_counter.forget_before(cutoff)
        for device in [d for d, window in self._energy_windows.items() if window[0] < cutoff]:
            del self._energy_windows[device]
        self._energy_next_sweep = t + int(_SWEEP_INTERVAL_S * 1e9)

    def _throttled_time(self, sample: GpuSample, key: GpuKey) -> dict[str, float] | None:
        """The ns the GPU's clock was held down per reason in the sample's window: each reason's counter's increase
        since the GPU's previous window (core.counters: none for a first, blank, late or repeated reading); None
        when no reason has one. Another copy of the same window (a GPU several jobs share) gets the same answer."""
        t = sample.time_unix_nano
        now = self._clock()
        found = self._throttled.get(key)
        if found is not None and found[0] == t:
            return found[1]
        if now >= self._next_event_sweep:
            self._forget_left_gpus(now)
        tracker = self._event_counters.get(key)
        if tracker is None:
            tracker = self._event_counters[key] = CounterTracker("int64")
        increase = tracker.increase
        increases: dict[str, float] = {}
        for cause, raw in sample.clock_event_ns.items():  # type: ignore[union-attr]
            value = increase(cause, t, raw)
            if value is not None:
                increases[cause] = value
        answer = increases or None
        if found is None or t > found[0]:
            self._throttled[key] = (t, answer, now)
        return answer

    def _forget_left_gpus(self, now: float) -> None:
        """Forget the clock event counters of GPUs with no sample for CLOCK_EVENTS_MAX_STALE_S (they left)."""
        for key in [k for k, entry in self._throttled.items() if now - entry[2] > CLOCK_EVENTS_MAX_STALE_S]:
            del self._throttled[key]
            self._event_counters.pop(key, None)
        self._next_event_sweep = now + _SWEEP_INTERVAL_S

    def _warn_no_reference_clock(self, sample: GpuSample) -> None:
        """Once per model: no OFU without f_ref, and what to set (otherwise only a drop counter says why)."""
        self._warned_models.add(sample.model)
        where = f"e.g. {sample.host or '?'} GPU {sample.gpu_index}"
        if sample.source:
            where += f" from {sample.source}"
        if not sample.model:
            self.log.warning(
                "GPU samples without a model name (%s): f_ref is unknown, so they get no OFU (counted in "
                "gpu.ofu.dropped{ofu.drop.reason=%s}). Name the model at the source (dcgm-exporter's modelName "
                "label; the replay receiver's model setting or a model column), or set reference_clocks: "
                "{\"%s\": <MHz>} on the ofu processor for every unnamed or unknown model (docs/gpus.md).",
                where, NoValue.NO_REFERENCE_CLOCK.value, ANY_MODEL)
            return
        self.log.warning(
            "GPU model %r (%s) is not in the spec table and reports no max SM clock: its GPUs get no OFU (counted "
            "in gpu.ofu.dropped{ofu.drop.reason=%s}). %s.",
            sample.model, where, NoValue.NO_REFERENCE_CLOCK.value, _sentence(reference_clock_fix(sample.model)))

    def _window_start(self, sample: GpuSample, gpu: _Gpu, resource: Attributes) -> int:
        """The start of the window a GPU's gpu.ofu covers, when its job or pod changed since its previous
        sample, and always for a GPU several jobs share: that sample's time (0 otherwise, and for a GPU's
        first sample).

        Why: the jobs tier gets a GPU's points of each job on the instance that job is routed to; a
        GPU that leaves a job and comes back within max_gap would otherwise be counted for that job
        over the time it ran another one (docs/jobs.md, "Windows"). A shared GPU's jobs (one sample
        each at one time) come and go window by window. Only such points say it: the usual point
        stays a plain gauge point (cheaper to encode).
        """
        key = gpu.key
        t = sample.time_unix_nano
        shared = sample.share is not None
        previous = self._previous.get(key)  # (time, the resource then (None: shared), that window's start)
        if previous is not None and previous[0] == t:  # another job of the same shared window
            return previous[2] if shared else 0
        entry = (t, None if shared else resource, previous[0] if previous is not None and previous[0] < t else 0)
        if previous is None:
            self._previous.put(key, entry)
        else:
            self._previous[key] = entry  # replaced: the cache does not grow
        if previous is None or not previous[0] < t:
            return 0
        if shared or previous[1] is None:
            return previous[0]
        if previous[1] is resource or previous[1] == resource:
            return 0
        return previous[0]

    def _gpu(self, sample: GpuSample, job: str, precision: str) -> _Gpu:
        """What every window of the sample's GPU and job shares: one :class:`_Gpu` per GPU and job, kept.

        Why: building and sorting its resource costs more than the OFU math, and the exporter
        encodes a resource once per tuple object (otel_ofu.otlp.codec); its MIG share and
        calibration are the same every interval too. Kept only when every resource value is a
        string: 1, 1.0 and True are equal keys that encode differently.
        """
        extra = tuple(sample.resource.items())
        for _, value in extra:
            if type(value) is not str:
                return _Gpu.of(sample, job, precision)
        key = (sample.host, sample.uuid, sample.model, sample.gpu_index, job, precision, extra)
        try:
            found = self._gpus.get(key)
        except TypeError:  # an unhashable field (a receiver's odd index): built, not kept
            return _Gpu.of(sample, job, precision)
        if found is None:
            found = self._gpus.put(key, _Gpu.of(sample, job, precision))
        return found

    def _job_corrections(self, job: str) -> dict[str, float]:
        """The tile correction overrides for a job's GPUs: its own factor (tile_correction.jobs) else the fleet's."""
        found = self._job_factors.get(job)
        if found is None:
            settings = self.config.tile_correction
            factor = next((f for pattern, f in settings.jobs.items()
                           if pattern == job or fnmatch.fnmatchcase(job, pattern)), None)
            found = self._job_factors.put(job, (settings.factors if factor is None else {"*": factor},))
        return found[0]

    def _point_attributes(self, extra: dict) -> tuple[Attributes, dict[str, Attributes],
                                                      dict[tuple, tuple[Attributes, ...]], dict[tuple, PointLayout]]:
        """The inputs' point attributes, the OFU points' (by f_ref source), the loss points' (by layout
        and causes: one per part) and the layouts of the GPU windows' points, shared by many GPUs.

        Why: GPUs with the same extra attributes (usually none) carry the same attribute sets;
        one tuple object for all of them is sorted once and lets the exporter encode it once per
        batch. Cached only when every value is a string: 1, 1.0 and True are equal keys that
        encode differently.
        """
        if not extra:  # nearly always
            cached = self._attributes_cache.get(())
            if cached is not None:
                return cached
        items = tuple(extra.items())
        key = None
        for _, value in items:
            if type(value) is not str:
                break
        else:
            key = items
        if key is not None:
            cached = self._attributes_cache.get(key)
            if cached is not None:
                return cached
        entry: tuple[Attributes, dict[str, Attributes], dict[tuple, tuple[Attributes, ...]],
                     dict[tuple, PointLayout]] = (attrs(extra), {}, {}, {})
        if key is not None:
            self._attributes_cache.put(key, entry)
        return entry

    def _drop(self, sample: GpuSample, reason: NoValue, resource: Attributes, t: int) -> MetricPoint:
        """Count a window without OFU once: the same GPU, reason and window again (a batch sent twice) is not."""
        now = self._clock()
        if now >= self._next_sweep:
            self._forget_stale(now)
        key = (resource, reason.value)
        counter = self._dropped.get(key)
        if counter is None:
            counter = self._dropped[key] = _DropCounter(0, max(0, t - int(sample.window_s * 1e9)), -1, now)
        if counter.last_ns != t:
            counter.count += 1
            counter.last_ns = t
            self.context.telemetry.add("otel_ofu.ofu.dropped", 1, reason=reason.value)
            if self.log.isEnabledFor(logging.DEBUG):
                self.log.debug("no OFU for %s GPU %s (from %s) in the window ending %s: %s %s", sample.host,
                               sample.gpu_index, sample.source or "?", _iso(t), _input_without_value(sample, reason),
                               reason.value)
        counter.seen = now
        return MetricPoint("gpu.ofu.dropped", counter.count, t, resource, attrs({DROP_REASON: reason.value}),
                           "{window}", monotonic=True, start_time_unix_nano=counter.start_ns)

    def _forget_stale(self, now: float) -> None:
        """Drop counters with no drop for ``dropped_max_stale``: a later drop starts the series again."""
        stale = float(self.config.dropped_max_stale)
        for key in [k for k, c in self._dropped.items() if now - c.seen > stale]:
            del self._dropped[key]
        self._next_sweep = now + _SWEEP_INTERVAL_S

    def _input_values(self, sample: GpuSample, result: OfuResult | NoValue, values: list[float]) -> int:
        """The inputs re-emitted, cleaned, appended to ``values`` in :data:`_INPUT_POINTS`' order when they
        have a value; returns which did (bit k: ``_INPUT_POINTS[k]``)."""
        tolerance = self.config.tpa_tolerance
        if isinstance(result, OfuResult):  # TPA and clock already cleaned by compute_ofu, the same way
            tpa, clock = result.tpa, result.sm_clock_mhz
        else:
            tpa, clock = clean_ratio(sample.tensor_active, tolerance)[0], clean_clock(sample.sm_clock_mhz)[0]
        present = 0
        if tpa is not None:
            values.append(tpa * 1.0)
            present = 1
        if clock is not None:
            values.append(clock * 1e6)
            present |= 2
        # The other inputs are often absent (None, which cleans to no value): skip them early.
        if sample.max_sm_clock_mhz is not None:
            value = clean_clock(sample.max_sm_clock_mhz)[0]
            if value is not None:
                values.append(value * 1e6)
                present |= 4
        if sample.power_w is not None:
            value = clean(sample.power_w)[0]
            if value is not None:
                values.append(value * 1.0)
                present |= 8
        if sample.clock_event_reasons is not None:
            value = clean(sample.clock_event_reasons)[0]
            if value is not None:
                values.append(value * 1.0)
                present |= 16
        if not sample.ratios_forwarded:  # else GR, SM and DRAM went on as they came (the otlp join)
            if sample.sm_active is not None:
                value = clean_ratio(sample.sm_active, tolerance)[0]
                if value is not None:
                    values.append(value * 1.0)
                    present |= 32
            if sample.gr_active is not None:
                value = clean_ratio(sample.gr_active, tolerance)[0]
                if value is not None:
                    values.append(value * 1.0)
                    present |= 64
            if sample.dram_active is not None:
                value = clean_ratio(sample.dram_active, tolerance)[0]
                if value is not None:
                    values.append(value * 1.0)
                    present |= 128
        # Link traffic, tx + rx (the jobs processor's stalled finding): only with both directions read.
        if sample.pcie_tx_bytes_per_s is not None or sample.pcie_rx_bytes_per_s is not None:
            value = _traffic(sample.pcie_tx_bytes_per_s, sample.pcie_rx_bytes_per_s)
            if value is not None:
                values.append(value)
                present |= 256
        if sample.nvlink_tx_bytes_per_s is not None or sample.nvlink_rx_bytes_per_s is not None:
            value = _traffic(sample.nvlink_tx_bytes_per_s, sample.nvlink_rx_bytes_per_s)
            if value is not None:
                values.append(value)
                present |= 512
        return present


def _traffic(tx: object, rx: object) -> float | None:
    """Bytes per second both ways, or None when either direction has no value (blank, missing, negative)."""
    sent, received = clean(tx, "int64")[0], clean(rx, "int64")[0]  # DCGM 1009-1012 are int64: GB/s are no blank
    if sent is None or received is None or sent < 0 or received < 0:
        return None
    return float(sent) + float(received)


FACTORY = Factory("ofu", OfuProcessorConfig, OfuProcessor, "computes gpu.ofu and gpu.ofu.raw from GPU samples",
                  consumes="samples", produces="points")
