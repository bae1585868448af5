"""Which OTLP metrics the join reads, what each feeds (TPA, SM clock, max SM clock, the loss account's
ratios, the ledger's counters: energy, PCIe/NVLink traffic, clock event time per reason), and in which
unit; and the metrics by which it knows a GPU source that gives no OFU.

Only these metrics are read point by point; every other metric passes through. Two shapes
of DCGM data arrive (REFERENCE.md sections 6 and 7): a Collector's Prometheus receiver
forwarding dcgm-exporter's gauges, named after the DCGM fields (any name a field has had:
otel_ofu.core.dcgm_fields.FIELDS), and Google's dcgmreceiver.
"""

from __future__ import annotations

from typing import Any

from otel_ofu.core import dcgm_fields
from otel_ofu.core.values import rescale

# Google dcgmreceiver names since 2024-09 (GoogleCloudPlatform/opentelemetry-operations-collector,
# components/otelopscol/receiver/dcgmreceiver: metadata.yaml, and scraper.go for the field behind each).
DCGMRECEIVER_PIPE = "gpu.dcgm.pipe.utilization"  # 1004 with gpu.pipe=tensor (1006-1008: fp64, fp32, fp16)
DCGMRECEIVER_CLOCK = "gpu.dcgm.clock.frequency"  # 100, in Hz
DCGMRECEIVER_GR = "gpu.dcgm.utilization"  # 1001 (without profiling: 203 GPU_UTIL / 100, and then no TPA either)
DCGMRECEIVER_SM = "gpu.dcgm.sm.utilization"  # 1002
DCGMRECEIVER_DRAM = "gpu.dcgm.memory.bandwidth_utilization"  # 1005 (without profiling: 204 MEM_COPY_UTIL / 100)
DCGMRECEIVER_ENERGY = "gpu.dcgm.energy_consumption"  # 156, in J (a cumulative sum): the ledger's energy, as mJ
DCGMRECEIVER_PIPE_ATTR = "gpu.pipe"
DCGMRECEIVER_RESOURCE = ("gpu.model", "gpu.number", "gpu.uuid")

# Which input each metric name feeds. Only these metrics are read point by point. The
# base-unit fields (DCGM 4.6.1: clocks in Hz) feed readings of their own, converted by
# dcgm_fields and preferred to the old field's when a GPU has both (windows.samples_of).
TPA, CLOCK, MAX_CLOCK = "tpa", "clock", "max_clock"
CLOCK_BASE_UNIT, MAX_CLOCK_BASE_UNIT = "clock_base_unit", "max_clock_base_unit"
_FIELD_OF_KIND = {CLOCK_BASE_UNIT: dcgm_fields.SM_CLOCK_HERTZ, MAX_CLOCK_BASE_UNIT: dcgm_fields.SM_MAX_CLOCK_HERTZ}
PROMETHEUS_INPUTS: dict[str, str] = {
    **{name: TPA for name in dcgm_fields.FIELD_NAMES[dcgm_fields.PIPE_TENSOR_ACTIVE]},
    **{name: CLOCK for name in dcgm_fields.FIELD_NAMES[dcgm_fields.SM_CLOCK]},
    **{name: MAX_CLOCK for name in dcgm_fields.FIELD_NAMES[dcgm_fields.MAX_SM_CLOCK]},
    **{name: kind for kind, fid in _FIELD_OF_KIND.items() for name in dcgm_fields.FIELD_NAMES[fid]},
}
DCGMRECEIVER_INPUTS = {DCGMRECEIVER_PIPE: TPA, DCGMRECEIVER_CLOCK: CLOCK}
INPUT_METRICS: frozenset[str] = frozenset(PROMETHEUS_INPUTS) | frozenset(DCGMRECEIVER_INPUTS)

# The loss account's ratios (core/loss.py): read into the samples like the inputs above, but
# kept in the pass-through as they came (dashboards downstream keep their DCGM series); the
# ofu processor does not re-emit them (GpuSample.ratios_forwarded).
GR, SM, DRAM = "gr", "sm", "dram"
RATIO_KINDS = frozenset({TPA, GR, SM, DRAM})
KEPT_INPUTS: dict[str, str] = {
    **{name: GR for name in dcgm_fields.FIELD_NAMES[dcgm_fields.GR_ENGINE_ACTIVE]},
    **{name: SM for name in dcgm_fields.FIELD_NAMES[dcgm_fields.SM_ACTIVE]},
    **{name: DRAM for name in dcgm_fields.FIELD_NAMES[dcgm_fields.DRAM_ACTIVE]},
}

# The ledger's counters (issue 34): read into the samples like the ratios and kept in the pass-through
# as they came; each kind is the name of its Entity list. Energy in J (1611) is its own kind, preferred
# to the mJ field (156) when a GPU has both, as the clocks' base-unit fields are.
ENERGY, ENERGY_BASE_UNIT = "energy", "energy_base_unit"
TRAFFIC_KINDS: dict[str, str] = {  # kind -> the GpuSample attribute it fills
    "pcie_tx": "pcie_tx_bytes_per_s", "pcie_rx": "pcie_rx_bytes_per_s",
    "nvlink_tx": "nvlink_tx_bytes_per_s", "nvlink_rx": "nvlink_rx_bytes_per_s",
}
EVENT_NS_KINDS: dict[str, str] = {  # kind -> the clock event reason's cause (GpuSample.clock_event_ns key)
    f"event_ns_{cause}": cause for cause in dcgm_fields.CLOCK_EVENT_NS_FIELDS.values()}
COUNTER_KINDS: tuple[str, ...] = (ENERGY, ENERGY_BASE_UNIT, *TRAFFIC_KINDS, *EVENT_NS_KINDS)
_TRAFFIC_FIELD_KINDS = {fid: kind for kind, attribute in TRAFFIC_KINDS.items()
                        for fid, name in dcgm_fields.TRAFFIC_FIELDS.items() if name == attribute}
_EVENT_FIELD_KINDS = {fid: f"event_ns_{cause}" for fid, cause in dcgm_fields.CLOCK_EVENT_NS_FIELDS.items()}
KEPT_INPUTS.update({
    **{name: ENERGY for name in dcgm_fields.FIELD_NAMES[dcgm_fields.TOTAL_ENERGY_CONSUMPTION]},
    **{name: ENERGY_BASE_UNIT for name in dcgm_fields.FIELD_NAMES[dcgm_fields.GPU_ENERGY_JOULES_TOTAL]},
    **{name: kind for fid, kind in {**_TRAFFIC_FIELD_KINDS, **_EVENT_FIELD_KINDS}.items()
       for name in dcgm_fields.FIELD_NAMES[fid]},
})

# The same ratios as dcgmreceiver sends them: its GPU is its resource's, as for its TPA and clock.
DCGMRECEIVER_KEPT: dict[str, str] = {DCGMRECEIVER_GR: GR, DCGMRECEIVER_SM: SM, DCGMRECEIVER_DRAM: DRAM,
                                     DCGMRECEIVER_ENERGY: ENERGY_BASE_UNIT}
DCGMRECEIVER_READ: frozenset[str] = frozenset(DCGMRECEIVER_INPUTS) | frozenset(DCGMRECEIVER_KEPT)

# GPU sources whose metrics make no OFU, each known by the metrics it always sends (what a source
# lacks and how to change it: otel_ofu.gpu.missing_inputs). Noticed where a ResourceMetrics is read
# through protobuf objects, which every one holding such a metric is (otel_ofu.otlp.wire.Shape refuses it).
DCGMRECEIVER_V1 = "dcgmreceiver_v1"  # dcgmreceiver up to 2024-09 (metadata.yaml before f1f132c7): no SM clock
NVIDIA_SMI_EXPORTER = "nvidia_gpu_exporter"  # utkuozdemir/nvidia_gpu_exporter: nvidia-smi's fields, no tensor activity
NOTICED_METRICS: dict[str, str] = {
    **{name: DCGMRECEIVER_V1 for name in (
        "dcgm.gpu.utilization", "dcgm.gpu.memory.bytes_used", "dcgm.gpu.profiling.sm_utilization",
        "dcgm.gpu.profiling.sm_occupancy", "dcgm.gpu.profiling.pipe_utilization", "dcgm.gpu.profiling.dram_utilization",
        "dcgm.gpu.profiling.pcie_traffic_rate", "dcgm.gpu.profiling.nvlink_traffic_rate")},
    # Its metrics page (METRICS.md in utkuozdemir/nvidia_gpu_exporter): every per-GPU series joins
    # nvidia_smi_gpu_info by uuid; the clock and utilization are among nvidia-smi's query fields on every GPU.
    **{name: NVIDIA_SMI_EXPORTER for name in (
        "nvidia_smi_gpu_info", "nvidia_smi_clocks_current_sm_clock_hz", "nvidia_smi_utilization_gpu_ratio")},
}

# Every metric the join reads a point of: the inputs above and the ratios it keeps. A ResourceMetrics
# holding one is never read as pass-through alone (otel_ofu.otlp.wire.Shape refuses it), nor one
# holding a metric by which the join notices a source (NOTICED_METRICS).
READ_METRICS: frozenset[str] = INPUT_METRICS | frozenset(KEPT_INPUTS) | frozenset(DCGMRECEIVER_KEPT)
NOT_BY_SHAPE: frozenset[str] = READ_METRICS | frozenset(NOTICED_METRICS)

_COUNTER_KINDS = frozenset(COUNTER_KINDS)

FLAG_NO_RECORDED_VALUE = 1  # DataPointFlags: a Prometheus staleness marker, not a reading


def point_value(dp: Any) -> object:
    """A NumberDataPoint's value as it came."""
    # as_int keeps int64 DCGM blank sentinels exact (a float cannot tell +1 from +2).
    return dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int


def scales(unit: str, kind: str) -> bool:
    """Whether :func:`scale` changes readings of this unit and kind (False: they are taken as they are)."""
    if kind in _COUNTER_KINDS:
        return kind == ENERGY_BASE_UNIT
    return kind in _FIELD_OF_KIND or (unit == "%" if kind in RATIO_KINDS else unit in ("Hz", "kHz", "GHz"))


def scale(value: object, unit: str, kind: str) -> object:
    """Bring a reading to the sample's units: TPA and the other activity ratios as 0..1, clocks in MHz."""
    if not isinstance(value, (int, float)):
        return value
    if kind in _COUNTER_KINDS:  # counters and rates, raw as DCGM gives them; energy in J as mJ
        return dcgm_fields.legacy_value(dcgm_fields.GPU_ENERGY_JOULES_TOTAL, value) if kind == ENERGY_BASE_UNIT \
            else value
    if kind in _FIELD_OF_KIND:  # a DCGM base-unit field: its unit is its name's (dcgm_fields' table)
        return dcgm_fields.legacy_value(_FIELD_OF_KIND[kind], value)
    if kind in RATIO_KINDS:  # a blank in percent stays a blank, not 1/100 of one (then "out of range")
        return rescale(value, 0.01) if unit == "%" else value
    # dcgmreceiver reports Hz. A clock in Hz may exceed the INT32 blank sentinel (2.2 GHz),
    # so it is converted here and never judged as a possible DCGM blank.
    if unit == "Hz":
        return value / 1e6
    if unit == "kHz":
        return value / 1e3
    if unit == "GHz":
        return value * 1e3
    return value
