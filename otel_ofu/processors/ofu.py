"""The ``ofu`` processor: GPU samples in, clock-normalized, tile-corrected OFU points out.

Place attribution processors (which set job and precision) before it: the precision picks
f_ref, the correction factor and the peak for achieved FLOP/s. A sample that cannot give
OFU (blank TPA, clock 0, unknown model without a max clock, ...) produces no ``gpu.ofu``
point; it is counted in ``gpu.ofu.dropped`` with its reason instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from otel_ofu import specs
from otel_ofu.component import Context, Factory, Processor
from otel_ofu.config import require
from otel_ofu.model import (
    DROP_REASON,
    FREF_SOURCE,
    JOB_ID,
    PRECISION,
    Attributes,
    Batch,
    GpuSample,
    MetricPoint,
    attrs,
)
from otel_ofu.ofu import FREF_MAX_CLOCK, OfuResult, compute_ofu
from otel_ofu.tiles import ARCH_TILES
from otel_ofu.values import TPA_TOLERANCE, NoValue, clean, clean_clock, clean_ratio

UNKNOWN_JOB = "unknown"


@dataclass
class TileCorrectionConfig:
    enabled: bool = True
    # "arch/precision", "arch" or "*" -> factor; overrides tiles.DEFAULT_CORRECTIONS.
    factors: dict[str, float] = field(default_factory=dict)

    def validate(self) -> None:
        for key, value in self.factors.items():
            arch, _, precision = key.partition("/")
            require(arch == "*" or arch in ARCH_TILES, f"factors.{key}",
                    f"unknown architecture '{arch}' (known: {', '.join(ARCH_TILES)}, or '*')")
            require(not precision or precision in specs.PRECISIONS, f"factors.{key}",
                    f"unknown precision '{precision}' (known: {', '.join(specs.PRECISIONS)})")
            require(0.5 <= value <= 1.0, f"factors.{key}", f"a correction factor is in [0.5, 1.0], got {value}")


@dataclass
class OfuProcessorConfig:
    tile_correction: TileCorrectionConfig = field(default_factory=TileCorrectionConfig)
    # Model string (as reported) -> f_ref in MHz, for GPUs missing from the spec table.
    reference_clocks: dict[str, float] = field(default_factory=dict)
    # TPA above 1 by more than this is bad data; up to it, it is clamped to 1.
    tpa_tolerance: float = TPA_TOLERANCE
    # Also emit the inputs (tensor activity, SM clock, power, ...) as their own metrics.
    emit_inputs: bool = True

    def validate(self) -> None:
        require(0 <= self.tpa_tolerance <= 0.2, "tpa_tolerance", f"must be within [0, 0.2], got {self.tpa_tolerance}")
        for model, mhz in self.reference_clocks.items():
            require(100 <= mhz <= 5000, f"reference_clocks.{model}", f"expected MHz within [100, 5000], got {mhz}")


class OfuProcessor(Processor):
    def __init__(self, config: OfuProcessorConfig, context: Context):
        super().__init__(config, context)
        self._warned_models: set[str] = set()
        self._dropped: dict[tuple[Attributes, str], int] = {}

    def process(self, batch: Batch) -> Batch:
        points = list(batch.points)
        for sample in batch.samples:
            points += self.sample_points(sample)
        return Batch(samples=batch.samples, points=points, passthrough=batch.passthrough, events=batch.events)

    def sample_points(self, sample: GpuSample) -> list[MetricPoint]:
        cfg = self.config
        precision = specs.normalize_precision(sample.precision)
        job = sample.job_id or UNKNOWN_JOB
        resource = sample.resource_attributes()
        base = {JOB_ID: job, PRECISION: precision, **sample.attributes}
        t = sample.time_unix_nano
        out: list[MetricPoint] = []

        result = compute_ofu(
            sample.tensor_active, sample.sm_clock_mhz, sample.model, precision, sample.max_sm_clock_mhz,
            tpa_tolerance=cfg.tpa_tolerance, fref_overrides=cfg.reference_clocks,
            correction_overrides=cfg.tile_correction.factors, apply_correction=cfg.tile_correction.enabled,
        )
        if isinstance(result, OfuResult):
            if result.fref_source == FREF_MAX_CLOCK and sample.model not in self._warned_models:
                self._warned_models.add(sample.model)
                self.log.warning("GPU model %r is not in the spec table: using its reported max SM clock (%.0f MHz) "
                                 "as f_ref; points carry %s=%s. Add it under reference_clocks to fix.",
                                 sample.model, result.fref_mhz, FREF_SOURCE, FREF_MAX_CLOCK)
            ofu_attrs = attrs({**base, FREF_SOURCE: result.fref_source})
            out += [
                MetricPoint("gpu.ofu", result.corrected, t, resource, ofu_attrs),
                MetricPoint("gpu.ofu.raw", result.raw, t, resource, ofu_attrs),
                MetricPoint("gpu.ofu.reference_clock", result.fref_mhz * 1e6, t, resource, ofu_attrs, "Hz"),
            ]
            if result.achieved_flops is not None:
                out.append(MetricPoint("gpu.flops.achieved", result.achieved_flops, t, resource, ofu_attrs,
                                       "{flop}/s"))
        else:
            out.append(self._drop(sample, result, resource, t))

        if cfg.emit_inputs:
            out += self._input_points(sample, resource, attrs(base), t)
        return out

    def _drop(self, sample: GpuSample, reason: NoValue, resource: Attributes, t: int) -> MetricPoint:
        key = (resource, reason.value)
        self._dropped[key] = count = self._dropped.get(key, 0) + 1
        self.context.telemetry.add("otel_ofu.ofu.dropped", 1, reason=reason.value)
        self.log.debug("no OFU for %s GPU %s at %d: %s", sample.host, sample.gpu_index, t, reason.value)
        return MetricPoint("gpu.ofu.dropped", count, t, resource, attrs({DROP_REASON: reason.value}), "{window}",
                           monotonic=True)

    def _input_points(self, sample: GpuSample, resource: Attributes, point_attrs: Attributes,
                      t: int) -> list[MetricPoint]:
        out = []
        readings = (
            ("gpu.tensor.activity", clean_ratio(sample.tensor_active, self.config.tpa_tolerance), 1.0, "1"),
            ("gpu.sm.clock.frequency", clean_clock(sample.sm_clock_mhz), 1e6, "Hz"),
            ("gpu.sm.clock.max", clean_clock(sample.max_sm_clock_mhz), 1e6, "Hz"),
            ("gpu.power.usage", clean(sample.power_w), 1.0, "W"),
            ("gpu.clock.event_reasons", clean(sample.clock_event_reasons), 1.0, "1"),
            ("gpu.sm.activity", clean_ratio(sample.sm_active, self.config.tpa_tolerance), 1.0, "1"),
        )
        for name, (value, _reason), scale, unit in readings:
            if value is not None:
                out.append(MetricPoint(name, value * scale, t, resource, point_attrs, unit))
        return out


FACTORY = Factory("ofu", OfuProcessorConfig, OfuProcessor, "computes gpu.ofu and gpu.ofu.raw from GPU samples")
