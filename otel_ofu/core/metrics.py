"""Every metric otel-ofu emits: name, unit, kind and meaning, in one place.

docs/metrics.md and the component pages are generated from this registry; exporters
take units and descriptions from here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# The unit of every ratio (a fraction of 1), as the OpenTelemetry semantic conventions write it: an
# annotation, so that Prometheus-compatible backends add no suffix (docs/backends.md). Components
# that make a ratio's points give them this unit, the one the registry declares and the encoder
# writes (tests/test_metric_units.py).
RATIO = "{ratio}"


@dataclass(frozen=True)
class MetricInfo:
    name: str
    unit: str
    kind: str  # "gauge" | "sum" (cumulative, monotonic)
    description: str
    # Components that emit it, as "<section>/<type>" (e.g. "processors/ofu"), for the generated
    # reference (docs/components); a metric defined in a component's own module needs none.
    emitted_by: tuple[str, ...] = ()
    # The points of one resource at one time are its whole set of series (a window's loss parts): a
    # series missing from a newer time has ended, so an exporter that serves each series' latest value
    # (prometheus) drops it then instead of serving its old value beside the new set.
    whole_set: bool = False


_METRICS = (
    MetricInfo("gpu.ofu", RATIO, "gauge",
               "Overall FLOP Utilization: TPA x f_SM / f_ref x c_tile, a fraction of the dense peak at the "
               "precision in use."),
    MetricInfo("gpu.ofu.raw", RATIO, "gauge", "OFU before the tile-quantization correction: TPA x f_SM / f_ref."),
    MetricInfo("gpu.ofu.reference_clock", "Hz", "gauge",
               "f_ref used for this point: the clock the GPU's tensor peak is quoted at."),
    MetricInfo("gpu.flops.achieved", "{flop}/s", "gauge",
               "OFU x dense peak FLOP/s at the job's precision x the GPU's share (a MIG instance: its slices / 7) x "
               "the job's share of a GPU several jobs hold (gpu.job.share); only when the precision and the share "
               "are known."),
    MetricInfo("gpu.job.share", RATIO, "gauge",
               "The part of a GPU (or MIG instance) several jobs hold that this point set's job held in the window: "
               "its share of the GPU's time, FLOPs, loss and energy; the shares of one GPU's jobs add up to 1. "
               "ofu.share.basis says how it was split (docs/sharing.md). None on a GPU one job holds (all of it)."),
    MetricInfo("gpu.energy", "J", "gauge",
               "The energy the GPU used in the window ending at the point's time (since its previous sample): the "
               "increase of its energy counter (DCGM 156 or 1611, NVML total energy), or power x the window's time "
               "where the source has no counter (ofu.energy.basis says which). A MIG instance's is its slices' share "
               "of the device's (gpu.mig.share), a shared GPU's job's its share (gpu.job.share): the parts add up to "
               "the device's. None, never 0, where the counter is blank or on a GPU's first sample "
               "(docs/method.md#energy-per-job)."),
    MetricInfo("gpu.mig.share", RATIO, "gauge",
               "A MIG instance's fraction of its physical GPU: its compute slices over the GPU's (a 3g.40gb of an "
               "H100: 3/7), beside its gpu.ofu; none for a whole GPU (1) or an instance of unknown size. The "
               "recording rules weigh an instance's GPU time by it, so a GPU split into instances counts once."),
    MetricInfo("gpu.tensor.activity", RATIO, "gauge",
               "Input: tensor pipe activity (DCGM 1004 / GPM ANY_TENSOR_UTIL), average over the window."),
    MetricInfo("gpu.sm.clock.frequency", "Hz", "gauge",
               "Input: SM clock, mean of the point samples in the window (DCGM 100)."),
    MetricInfo("gpu.sm.clock.max", "Hz", "gauge", "Input: maximum SM clock the device reports (DCGM 113)."),
    MetricInfo("gpu.power.usage", "W", "gauge", "Input: board power draw (DCGM 155)."),
    MetricInfo("gpu.clock.event_reasons", "{bitmask}", "gauge",
               "Input: clock event (throttle) reason bitmask (DCGM 112): 0x1 idle, 0x4 SW power cap, "
               "0x8 HW slowdown, 0x20/0x40 thermal, 0x80 power brake."),
    MetricInfo("gpu.ofu.loss", RATIO, "gauge",
               "The loss account: the share of the dense peak lost to each part (ofu.loss.part: engine_idle, "
               "sm_idle, non_tensor, clock, padding, or steps merged where a counter is missing); the parts add up "
               "to 1 - gpu.ofu. The clock part carries its event reason, the non-tensor part whether it was "
               "memory-bound (ofu.loss.cause); with the clock event time per reason (DCGM 1420-1424) the clock "
               "part is one point per reason, by its share of the throttled time, adding up to the part. "
               "docs/method.md#where-the-flops-go-the-loss-account.",
               whole_set=True),
    MetricInfo("gpu.sm.activity", RATIO, "gauge", "Input: SM activity ratio (DCGM 1002), when the source has it."),
    MetricInfo("gpu.graphics_engine.activity", RATIO, "gauge",
               "Input: graphics/compute engine activity ratio (DCGM 1001 GR_ENGINE_ACTIVE, GPM GRAPHICS_UTIL), when "
               "the source has it."),
    MetricInfo("gpu.dram.activity", RATIO, "gauge",
               "Input: DRAM activity ratio (DCGM 1005 DRAM_ACTIVE, GPM DRAM_BW_UTIL), when the source has it."),
    MetricInfo("gpu.link.throughput", "By/s", "gauge",
               "Input: interconnect traffic over the window, transmitted and received together, per link kind "
               "(ofu.link: pcie from DCGM 1009/1010, nvlink from DCGM 1011/1012, or NVML GPM's PCI and NVLink "
               "rates), when the source reads both directions; the jobs processor's stalled finding reads it."),
    MetricInfo("gpu.ofu.dropped", "{window}", "sum",
               "GPU windows that produced no OFU, by reason (ofu.drop.reason): blank, not_supported, "
               "nan, out_of_range, zero_clock, ... Never reported as 0 OFU."),
    MetricInfo("sim.gpu.mfu.true", RATIO, "gauge",
               "Simulator only: the ground-truth MFU of the simulated job on this GPU over the window."),
    MetricInfo("training.mfu", RATIO, "gauge",
               "MFU as the training job reports it about itself, a fraction (unit % is read as percent); "
               "the MFU audit compares it with OFU (docs/audit.md). The simulator emits it as a framework would."),
    MetricInfo("training.tflops_per_gpu", "T{flop}/s", "gauge",
               "Achieved model TFLOP/s per GPU as the training job reports it (what Megatron-LM and torchtitan "
               "log); the MFU audit divides it by the dense peak at the job's precision."),
    MetricInfo("otel_ofu.ofu.dropped", "{window}", "sum",
               "Self-telemetry: GPU windows the ofu processor could not turn into OFU, by reason."),
    MetricInfo("otel_ofu.pipeline.dropped", "{item}", "sum",
               "Self-telemetry: items a pipeline lost to a failing processor or exporter, by pipeline, reason "
               "and exporter."),
)

class Registry(dict):
    """The metric registry: a dict of MetricInfo by name whose ``revision`` counts its changes.

    Why: what is built from a definition (an encoder's template, holding the description and
    unit) is kept per GPU, and checked against the registry on every use; one revision compare
    replaces a look-up per point.
    """

    revision = 0

    def __setitem__(self, key: str, value: MetricInfo) -> None:
        super().__setitem__(key, value)
        self.revision += 1

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self.revision += 1

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self.revision += 1

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.revision += 1
        return super().setdefault(key, default)

    def pop(self, key: str, *default: Any) -> Any:
        self.revision += 1
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, MetricInfo]:
        self.revision += 1
        return super().popitem()

    def clear(self) -> None:
        super().clear()
        self.revision += 1


METRICS: Registry = Registry({m.name: m for m in _METRICS})

# What a training job reports about itself (docs/audit.md), by default: its MFU as a fraction,
# and achieved TFLOP/s per GPU under otel-ofu's name and under Megatron-LM's own OpenTelemetry
# name (megatron/core/telemetry/training_metrics.py). Receivers decode them into points,
# attribution gives them the reporting process's job, the jobs processor audits them.
MFU_REPORT_METRIC = "training.mfu"
TFLOPS_REPORT_METRICS: tuple[str, ...] = ("training.tflops_per_gpu", "megatron.training.throughput_tflops")
TRAINING_REPORT_METRICS: tuple[str, ...] = (MFU_REPORT_METRIC, *TFLOPS_REPORT_METRICS)

# PCIe and NVLink traffic per GPU window (ofu.link): the ofu processor emits it, the jobs processor's stalled
# finding reads it (otel_ofu.jobs.stall).
LINK_THROUGHPUT_METRIC = "gpu.link.throughput"

# What the ofu processor emits per GPU: another otel-ofu's ``otlp`` receiver decodes these into
# points by default (a jobs tier behind node agents), instead of passing them through as bytes.
GPU_METRICS: tuple[str, ...] = (
    "gpu.ofu", "gpu.ofu.raw", "gpu.ofu.reference_clock", "gpu.flops.achieved", "gpu.ofu.loss", "gpu.tensor.activity",
    "gpu.sm.clock.frequency", "gpu.sm.clock.max", "gpu.power.usage", "gpu.clock.event_reasons", "gpu.sm.activity",
    "gpu.graphics_engine.activity", "gpu.dram.activity", "gpu.ofu.dropped", "gpu.job.share", "gpu.energy",
    "gpu.link.throughput",
)
# The outputs of the OFU computation among them (the rest are its inputs, re-emitted).
OFU_OUTPUT_METRICS: frozenset[str] = frozenset({
    "gpu.ofu", "gpu.ofu.raw", "gpu.ofu.reference_clock", "gpu.flops.achieved", "gpu.mig.share", "gpu.job.share",
    "gpu.ofu.loss", "gpu.ofu.dropped"})


def register(info: MetricInfo) -> MetricInfo:
    """Add a metric defined by another module (self-telemetry, per-job metrics)."""
    METRICS[info.name] = info
    return info


RECEIVER_ACCEPTED = register(MetricInfo(
    "otel_ofu.receiver.accepted", "{item}", "sum",
    "Self-telemetry: items (GPU windows, metric points, events) each receiver handed to its pipelines, "
    "by receiver.")).name

RECEIVER_STATUS = register(MetricInfo(
    "otel_ofu.receiver.status", "{state}", "gauge",
    "1 for the state each receiver is in, 0 for the states it left (attributes receiver and state): ok; "
    "starting (nothing read yet: a source never seen); scrape_failed or empty (dcgm_exporter, prometheus: an "
    "endpoint is unreachable, or answers with nothing to read; otel_ofu.scrape.up says which); finished or failed "
    "(a replay at its end); the GPU receivers' own states (dcgm_missing, hostengine_unreachable, "
    "profiling_not_supported, profiling_no_permission, profiling_in_use, profiling_paused, nvml_missing, "
    "gpm_unsupported, gpu_lost, ...; per-GPU states carry attribute gpu). See "
    "docs/components/receivers/dcgm.md, Failure states.")).name

# Self-telemetry of the otlp/otlphttp exporters' sending queue (otel_ofu.delivery); attribute
# ``exporter`` is the exporter id, ``signal`` metrics|logs, ``reason`` why (docs/components/exporters/otlp.md).
register(MetricInfo("otel_ofu.exporter.queue.size", "{sizer_unit}", "gauge",
                    "What the export requests accepted and not yet sent or dropped take (waiting and in flight), "
                    "in sending_queue.sizer units: requests, items or bytes."))
register(MetricInfo("otel_ofu.exporter.queue.capacity", "{sizer_unit}", "gauge",
                    "sending_queue.queue_size, in sending_queue.sizer units: the most the queue holds."))
register(MetricInfo("otel_ofu.exporter.sent", "{item}", "sum",
                    "Data points (signal=metrics) or log records (signal=logs) the backend accepted."))
register(MetricInfo("otel_ofu.exporter.retried", "{request}", "sum",
                    "Send attempts that failed retryably and were retried, by reason (UNAVAILABLE, http_503, ...)."))
register(MetricInfo("otel_ofu.exporter.dropped", "{item}", "sum",
                    "Data points or log records given up on, by reason: queue_full, permanent_error, "
                    "retries_exhausted, retry_disabled, rejected, sample_refused (the backend refused these samples: "
                    "a duplicate, out-of-order or too old sample; the rest of their batch was sent), shutdown, "
                    "storage_error; the file exporter's: "
                    "write_error (writes kept failing beyond max_pending_megabytes), shutdown (never written)."))


# Which components emit the metrics defined here (the generated reference lists them on each
# component's page; metrics defined in a component's own module are found there).
_OFU_OUTPUTS = ("gpu.ofu", "gpu.ofu.raw", "gpu.ofu.reference_clock", "gpu.flops.achieved", "gpu.mig.share",
                "gpu.job.share", "gpu.ofu.loss", "gpu.tensor.activity", "gpu.sm.clock.frequency", "gpu.sm.clock.max",
                "gpu.power.usage",
                "gpu.clock.event_reasons", "gpu.sm.activity", "gpu.graphics_engine.activity", "gpu.dram.activity",
                "gpu.link.throughput", "gpu.ofu.dropped", "otel_ofu.ofu.dropped", "gpu.energy")
_EMITTED_BY: dict[str, tuple[str, ...]] = {
    **{name: ("processors/ofu",) for name in _OFU_OUTPUTS},
    "sim.gpu.mfu.true": ("receivers/sim",),
    "otel_ofu.receiver.status": tuple(f"receivers/{r}" for r in ("dcgm", "dcgm_exporter", "nvml", "otlp",
                                                                   "prometheus", "replay", "selftelemetry", "sim")),
    "training.mfu": ("receivers/sim", "receivers/prometheus"),
    "training.tflops_per_gpu": ("receivers/prometheus",),
    **{name: ("exporters/otlp", "exporters/otlphttp") for name in METRICS if name.startswith("otel_ofu.exporter.")},
    "otel_ofu.exporter.dropped": ("exporters/otlp", "exporters/otlphttp", "exporters/file"),
}
for _name, _by in _EMITTED_BY.items():
    if _name in METRICS:
        METRICS[_name] = replace(METRICS[_name], emitted_by=_by)
