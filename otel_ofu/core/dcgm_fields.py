"""DCGM field IDs and dcgm-exporter labels: the one mapping from DCGM-shaped data to samples.

Used by every receiver that sees DCGM-shaped data (the ``dcgm`` receiver, a dcgm-exporter
scrape, ``dcgmi dmon`` / CSV replay, OTLP from a Collector's Prometheus receiver), so the
same field or label means the same thing wherever it arrives. IDs are stable, names are not:
:data:`FIELDS` holds every name each field read here has had (DCGM 4.0 and 4.6 renamed several,
dcgm-exporter names a metric after its counters CSV, so a page may carry any of them; REFERENCE.md
sections 2, 6 and 11), the lowercase names of dcgm-exporter's ``etc/1.x-compatibility-metrics.csv``
among them, and each is read as its field wherever a name is read.

DCGM 4.6.1 added base-unit fields beside the old ones (go-dcgm ``pkg/dcgm/dcgm_fields.h``,
1600-1612): the SM clock in Hz (1603) for field 100 in MHz, and so on. They are read by
name and by id everywhere, and converted in one place, :func:`in_legacy_units`, to the units
of the field they replace, which is what samples carry. When a source carries both (a
counters CSV listing 100 and 1603), the base-unit field is used and the old one ignored,
never both: DCGM marks the old fields deprecated in its favour, so a source that adds it
means it, and the reading does not change the day the old field leaves a default list.
The ``dcgm`` receiver watches the base-unit fields where its DCGM bindings know them (4.6.1+)
and falls back to the old ids, which DCGM retains "for backward compatibility" (dcgm_fields.h),
when they are unknown or the host engine refuses them (an older remote nv-hostengine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from otel_ofu.core.model import GPU_MIG_INSTANCE, GPU_MIG_PROFILE, GpuSample
from otel_ofu.core.values import clean

SM_CLOCK = 100
APP_SM_CLOCK = 110
CLOCKS_EVENT_REASONS = 112
MAX_SM_CLOCK = 113
POWER_USAGE = 155
GPU_UTIL = 203  # percent; dcgm-exporter --kubernetes-virtual-gpus repeats it per pod as the pod's own SM use
TOTAL_ENERGY_CONSUMPTION = 156
GR_ENGINE_ACTIVE = 1001
SM_ACTIVE = 1002
SM_OCCUPANCY = 1003
PIPE_TENSOR_ACTIVE = 1004
DRAM_ACTIVE = 1005
PCIE_TX_BYTES = 1009  # bytes per second over the watch interval (DCGM_FT_INT64)
PCIE_RX_BYTES = 1010
NVLINK_TX_BYTES = 1011
NVLINK_RX_BYTES = 1012
PIPE_TENSOR_HMMA_ACTIVE = 1014
SM_CYCLES_ELAPSED_TOTAL = 1084
MMA_CYCLES_ACTIVE_TOTAL = 1086
# Nanoseconds the clock was held down per reason since the driver loaded (DCGM_FT_INT64; NVML's
# NVML_FI_DEV_CLOCKS_EVENT_REASON_* field values behind them, dcgmlib/src/dcgm_fields.cpp).
CLOCKS_EVENT_REASON_SW_POWER_CAP_NS = 1420
CLOCKS_EVENT_REASON_SYNC_BOOST_NS = 1421
CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS = 1422
CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS = 1423
CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS = 1424
# Base-unit fields (DCGM 4.6.1; go-dcgm pkg/dcgm/dcgm_fields.h and base_unit_fields_test.go).
SM_CLOCK_HERTZ = 1603
SM_APP_CLOCK_HERTZ = 1606
SM_MAX_CLOCK_HERTZ = 1608
GPU_ENERGY_JOULES_TOTAL = 1611


@dataclass(frozen=True, slots=True)
class Field:
    """A DCGM field read here: every name it has had, the unit of its values, and for a base-unit
    field the field whose reading it gives in other units (``replaces``, ``to_replaced``: the factor
    from this field's unit to that one's)."""

    id: int
    names: tuple[str, ...]  # the first is the name up to DCGM 4.5 (what dcgm-exporter's shipped CSVs say)
    unit: str  # "MHz", "Hz", "W", "mJ", "J", "1" (a ratio 0..1), "bitmask", "cycles", "ns", "By/s"
    replaces: int | None = None
    to_replaced: float = 1.0


# Every name each field has had; a field's id never changed, its name did, and a rename kept the
# unit (DCGM 4.6's ``..._UTIL_RATIO`` names are the same 0..1 ratios). Values in other units came
# as new fields with ids of their own (the base-unit fields, 4.6.1), so a name gives its unit.
# Sources, read at each tag: NVIDIA/DCGM dcgmlib/dcgm_fields.h (v3.3.9: CLOCK_THROTTLE_REASONS;
# v4.0.0: CLOCKS_EVENT_REASONS, the old name kept as an alias; v4.6.0 (72fa3fe): 1001-1005, 1014
# and 155 renamed "per DCGM Field Naming Standard", the old names kept at the header's end as
# deprecated aliases; 1084 and 1086 new), NVIDIA/go-dcgm b7fa315 (DCGM 4.6.1: pkg/dcgm/dcgm_fields.h
# 1600-1612, pkg/dcgm/const_fields.go, which resolves every name in a counters CSV) and
# pkg/dcgm/legacy_fields.csv (dcgm-exporter's 1.x compatibility names, lowercase). dcgm-exporter
# names each metric after its counters CSV's first column (internal/pkg/counters/counter_config.go:
# FieldName: record[0]), so a page carries whichever of these names its CSV used.
FIELDS: tuple[Field, ...] = (
    Field(SM_CLOCK, ("DCGM_FI_DEV_SM_CLOCK", "dcgm_sm_clock"), "MHz"),
    Field(APP_SM_CLOCK, ("DCGM_FI_DEV_APP_SM_CLOCK",), "MHz"),
    Field(CLOCKS_EVENT_REASONS, ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"), "bitmask"),
    Field(MAX_SM_CLOCK, ("DCGM_FI_DEV_MAX_SM_CLOCK",), "MHz"),
    Field(POWER_USAGE, ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS", "dcgm_power_usage"), "W"),
    Field(TOTAL_ENERGY_CONSUMPTION, ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "dcgm_total_energy_consumption"), "mJ"),
    # Read for one thing only: dcgm-exporter's per-pod copy of it on a shared GPU is the pod's processes' SM
    # utilization (NVIDIA/dcgm-exporter#594), what a shared GPU is split by (receivers/dcgm_exporter.py).
    Field(GPU_UTIL, ("DCGM_FI_DEV_GPU_UTIL", "dcgm_gpu_utilization"), "%"),
    Field(GR_ENGINE_ACTIVE, ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
                             "dcgm_fi_prof_gr_engine_active"), "1"),
    Field(SM_ACTIVE, ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO", "dcgm_fi_prof_sm_active"), "1"),
    # Known by every name so that a page's fields are told apart; nothing OFU or its loss account makes reads it.
    Field(SM_OCCUPANCY, ("DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO", "dcgm_fi_prof_sm_occupancy"),
          "1"),
    Field(PIPE_TENSOR_ACTIVE, ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
                               "dcgm_fi_prof_pipe_tensor_active"), "1"),
    Field(DRAM_ACTIVE, ("DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO", "dcgm_fi_prof_dram_active"), "1"),
    Field(PIPE_TENSOR_HMMA_ACTIVE, ("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", "DCGM_FI_PROF_HMMA_UTIL_RATIO"), "1"),
    # The interconnect's traffic over the watch interval, bytes per second (dcgm-exporter's
    # etc/default-counters.csv: "The rate of data transmitted over the PCIe bus ... in bytes per second";
    # the 1.x compatibility CSV names the PCIe ones in lowercase). DCGM 4.6 kept these names.
    Field(PCIE_TX_BYTES, ("DCGM_FI_PROF_PCIE_TX_BYTES", "dcgm_fi_prof_pcie_tx_bytes"), "By/s"),
    Field(PCIE_RX_BYTES, ("DCGM_FI_PROF_PCIE_RX_BYTES", "dcgm_fi_prof_pcie_rx_bytes"), "By/s"),
    Field(NVLINK_TX_BYTES, ("DCGM_FI_PROF_NVLINK_TX_BYTES",), "By/s"),
    Field(NVLINK_RX_BYTES, ("DCGM_FI_PROF_NVLINK_RX_BYTES",), "By/s"),
    Field(SM_CYCLES_ELAPSED_TOTAL, ("DCGM_FI_PROF_SM_CYCLES_ELAPSED_TOTAL",), "cycles"),
    Field(MMA_CYCLES_ACTIVE_TOTAL, ("DCGM_FI_PROF_MMA_CYCLES_ACTIVE_TOTAL",), "cycles"),
    # Cumulative ns per clock event reason (DCGM 3.3+; no other name in DCGM 4.6 or go-dcgm's 4.6.1 header).
    Field(CLOCKS_EVENT_REASON_SW_POWER_CAP_NS, ("DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS",), "ns"),
    Field(CLOCKS_EVENT_REASON_SYNC_BOOST_NS, ("DCGM_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST_NS",), "ns"),
    Field(CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS, ("DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS",), "ns"),
    Field(CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS, ("DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS",), "ns"),
    Field(CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS,
          ("DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS",), "ns"),
    Field(SM_CLOCK_HERTZ, ("DCGM_FI_DEV_SM_CLOCK_HERTZ",), "Hz", SM_CLOCK, 1e-6),
    Field(SM_APP_CLOCK_HERTZ, ("DCGM_FI_DEV_SM_APP_CLOCK_HERTZ",), "Hz", APP_SM_CLOCK, 1e-6),
    Field(SM_MAX_CLOCK_HERTZ, ("DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ",), "Hz", MAX_SM_CLOCK, 1e-6),
    Field(GPU_ENERGY_JOULES_TOTAL, ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",), "J", TOTAL_ENERGY_CONSUMPTION, 1e3),
)
FIELDS_BY_ID: dict[int, Field] = {f.id: f for f in FIELDS}
# Field id -> every name it has had (the table above, by id).
FIELD_NAMES: dict[int, tuple[str, ...]] = {f.id: f.names for f in FIELDS}
FIELD_IDS_BY_NAME: dict[str, int] = {name: f.id for f in FIELDS for name in f.names}

# Each clock event reason's ns counter -> the cause it names in the loss account (otel_ofu.core.loss
# CLOCK_REASONS: the bit of field 112 the same reason sets).
CLOCK_EVENT_NS_FIELDS: dict[int, str] = {
    CLOCKS_EVENT_REASON_SW_POWER_CAP_NS: "sw_power_cap", CLOCKS_EVENT_REASON_SYNC_BOOST_NS: "sync_boost",
    CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS: "sw_thermal", CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS: "hw_thermal",
    CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS: "hw_power_brake",
}
# The interconnect fields -> the GpuSample attribute each fills.
TRAFFIC_FIELDS: dict[int, str] = {
    PCIE_TX_BYTES: "pcie_tx_bytes_per_s", PCIE_RX_BYTES: "pcie_rx_bytes_per_s",
    NVLINK_TX_BYTES: "nvlink_tx_bytes_per_s", NVLINK_RX_BYTES: "nvlink_rx_bytes_per_s",
}

# DCGM field types, for the blank rule (values.clean(field_type=...)): dcgmlib/src/dcgm_fields.cpp
# registers each of these as DCGM_FT_INT64.
FIELD_TYPES: dict[int, str] = {SM_CYCLES_ELAPSED_TOTAL: "int64", MMA_CYCLES_ACTIVE_TOTAL: "int64",
                               CLOCKS_EVENT_REASONS: "int64", TOTAL_ENERGY_CONSUMPTION: "int64",
                               **{fid: "int64" for fid in (*CLOCK_EVENT_NS_FIELDS, *TRAFFIC_FIELDS)}}

# The unit table's base-unit fields: field -> (the field it replaces, factor from its unit to that one's).
BASE_UNIT_FIELDS: dict[int, tuple[int, float]] = {
    f.id: (f.replaces, f.to_replaced) for f in FIELDS if f.replaces is not None}
REPLACED_BY: dict[int, int] = {legacy: base for base, (legacy, _) in BASE_UNIT_FIELDS.items()}


def legacy_value(base_field: int, value: object) -> object:
    """A base-unit field's reading in the units of the field it replaces; no value left as read.

    Judged as a possible blank before scaling (a blank scaled is no longer a blank), against
    the FP64 sentinel (2**47), which no clock in Hz or energy in J reaches, where the INT32
    one (2.1e9) is below a 2.2 GHz clock in Hz.
    """
    number, _ = clean(value, "fp64")
    return value if number is None else number * BASE_UNIT_FIELDS[base_field][1]


def in_legacy_units(fields: dict[int, object]) -> dict[int, object]:
    """``{field id: value}`` with every base-unit field as the field it replaces, in that unit.

    A base-unit field present replaces the old one (module docstring); the others are kept.
    """
    if not fields.keys() & BASE_UNIT_FIELDS.keys():
        return fields
    out = dict(fields)
    for base, (legacy, _) in BASE_UNIT_FIELDS.items():
        if base in out:
            out[legacy] = legacy_value(base, out.pop(base))
    return out


def series_in_legacy_units(series: dict[int, list[tuple[int, object]]]) -> dict[int, list[tuple[int, object]]]:
    """:func:`in_legacy_units` for ``{field id: [(timestamp, value), ...]}`` (the dcgm receiver's reads)."""
    if not series.keys() & BASE_UNIT_FIELDS.keys():
        return series
    out = dict(series)
    for base, (legacy, _) in BASE_UNIT_FIELDS.items():
        if base in out:
            out[legacy] = [(t, legacy_value(base, v)) for t, v in out.pop(base)]
    return out


# `dcgmi dmon` column headers are the fields' short names (dcgmlib/src/dcgm_fields.cpp,
# DcgmFieldsPopulateOneFieldWithFormatting): a recorded dmon table names its columns only so.
DMON_SHORT_NAMES: dict[str, int] = {
    "SMCLK": SM_CLOCK, "SACLK": APP_SM_CLOCK, "DVCCTR": CLOCKS_EVENT_REASONS, "SMMAX": MAX_SM_CLOCK,
    "POWER": POWER_USAGE, "GRACT": GR_ENGINE_ACTIVE, "SMACT": SM_ACTIVE, "TENSO": PIPE_TENSOR_ACTIVE,
    "DRAMA": DRAM_ACTIVE, "THMMA": PIPE_TENSOR_HMMA_ACTIVE, "TOTEC": TOTAL_ENERGY_CONSUMPTION,
    "PCITX": PCIE_TX_BYTES, "PCIRX": PCIE_RX_BYTES, "NVLTX": NVLINK_TX_BYTES, "NVLRX": NVLINK_RX_BYTES,
    "CLKPCNS": CLOCKS_EVENT_REASON_SW_POWER_CAP_NS, "CLKBSTNS": CLOCKS_EVENT_REASON_SYNC_BOOST_NS,
    "CLKSWTHNS": CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS, "CLKHWTHNS": CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS,
    "CLKEPBSNS": CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS,
}

# dcgm-exporter labels -> resource attributes (semantic-convention names). Old spellings
# (--use-old-namespace, pre-2026 Hostname) are accepted beside the new ones.
_K8S_LABELS = {
    "pod": "k8s.pod.name", "pod_name": "k8s.pod.name",
    "namespace": "k8s.namespace.name", "pod_namespace": "k8s.namespace.name",
    "container": "k8s.container.name", "container_name": "k8s.container.name",
    "pod_uid": "k8s.pod.uid",
}

# dcgm-exporter's DRA labels (--kubernetes-enable-dra; internal/pkg/transformation/const.go):
# the claim, and the driver/pool/device triplet that names the device (MIG: its UUID, profile).
_DRA_LABELS = {
    "dra_claim_name": "k8s.resourceclaim.name", "dra_claim_namespace": "k8s.resourceclaim.namespace",
    "dra_driver_name": "dra.driver.name", "dra_pool_name": "dra.pool.name", "dra_device_name": "dra.device.name",
    "dra_mig_profile": "dra.mig.profile", "dra_mig_device_uuid": "dra.mig.uuid",
}

# Pod labels dcgm-exporter copies onto a pod's series with --kubernetes-enable-pod-labels, each
# key written with every character outside [a-zA-Z0-9_] as "_" (its utils.SanitizeLabelName):
# the keys attribution's job rules read (otel_ofu.attribution.k8s_identity.JOB_RULE_LABELS, kept
# equal by a test) and the default precision key come back as k8s.pod.label.<key>, so a job's
# pods name their job from the page alone (docs/quickstart.md).
POD_LABEL_KEYS = (
    "trainer.kubeflow.org/trainjob-name", "jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/jobset-uid",
    "training.kubeflow.org/job-name", "training.kubeflow.org/operator-name", "group-name", "pytorch-job-name",
    "tf-job-name", "mpi-job-name", "leaderworkerset.sigs.k8s.io/name", "volcano.sh/job-name",
    "ray.io/originated-from-cr-name", "ray.io/originated-from-crd", "batch.kubernetes.io/job-name", "job-name",
    "batch.kubernetes.io/controller-uid", "controller-uid", "pod-template-hash", "ofu.dev/precision",
)
_POD_LABELS = {re.sub(r"[^a-zA-Z0-9_]", "_", key): key for key in POD_LABEL_KEYS}
POD_LABEL_PREFIX = "k8s.pod.label."

# Every dcgm-exporter label identity_from_labels reads, plus ``device``: lets a caller tell
# these from other attributes (e.g. labels a Collector promoted to resource attributes).
EXPORTER_LABELS: frozenset[str] = frozenset({
    "gpu", "UUID", "uuid", "modelName", "model_name", "Hostname", "hostname", "device", "pci_bus_id", "GPU_I_ID",
    "GPU_I_PROFILE", "DCGM_FI_DRIVER_VERSION", "hpc_job", *_K8S_LABELS, *_DRA_LABELS, *_POD_LABELS,
})


def field_id(name_or_id: str | int) -> int | None:
    """A field id from its number or any of its names; None when unknown."""
    if isinstance(name_or_id, int):
        return name_or_id
    text = name_or_id.strip()
    if text.isdecimal():
        return int(text)
    return FIELD_IDS_BY_NAME.get(text)


def identity_from_labels(labels: dict[str, str]) -> dict[str, Any]:
    """GPU identity and resource attributes from dcgm-exporter labels.

    Returns keys ``host``, ``gpu_index``, ``uuid``, ``model``, ``job_id`` (from ``hpc_job``)
    and ``resource`` (MIG and Kubernetes attributes); missing labels give empty strings.
    """
    resource: dict[str, Any] = {}
    for label, attribute in _K8S_LABELS.items():
        value = labels.get(label)
        if value:
            resource.setdefault(attribute, value)
    if resource:  # a pod's series: its DRA claim and the pod labels the job rules read
        for label, attribute in _DRA_LABELS.items():
            if labels.get(label):
                resource[attribute] = labels[label]
        for label, key in _POD_LABELS.items():
            if labels.get(label):
                resource[POD_LABEL_PREFIX + key] = labels[label]
    if labels.get("GPU_I_ID", "") != "":
        resource[GPU_MIG_INSTANCE] = labels["GPU_I_ID"]
    if labels.get("GPU_I_PROFILE"):
        resource[GPU_MIG_PROFILE] = labels["GPU_I_PROFILE"]
    if labels.get("pci_bus_id"):
        resource["gpu.pci_bus_id"] = labels["pci_bus_id"]
    if labels.get("DCGM_FI_DRIVER_VERSION"):
        resource["gpu.driver.version"] = labels["DCGM_FI_DRIVER_VERSION"]
    hpc_job = labels.get("hpc_job") or None
    if hpc_job:
        resource["hpc.job.id"] = hpc_job
    return {
        "host": labels.get("Hostname") or labels.get("hostname") or "",
        "gpu_index": labels.get("gpu", ""),
        "uuid": labels.get("UUID") or labels.get("uuid") or "",
        "model": labels.get("modelName") or labels.get("model_name") or "",
        "job_id": hpc_job,
        "resource": resource,
    }


def sample_from_fields(fields: dict[int, object], *, time_unix_nano: int, window_s: float, host: str,
                       gpu_index: int | str, uuid: str, model: str, source: str, sm_clock_samples: int = 1,
                       **extra: Any) -> GpuSample:
    """A GpuSample from ``{field_id: raw value}``; absent fields stay None (no value).

    Base-unit fields count as the fields they replace (:func:`in_legacy_units`): energy in J (1611)
    as mJ (156). The ledger's counters (energy, ns per clock event reason, interconnect bytes per
    second) stay raw too; ``clock_event_ns`` holds the reasons present, None when none is.
    """
    fields = in_legacy_units(fields)
    for fid, name in TRAFFIC_FIELDS.items():
        if fid in fields:
            extra.setdefault(name, fields[fid])
    reasons = {cause: fields[fid] for fid, cause in CLOCK_EVENT_NS_FIELDS.items() if fid in fields}
    if reasons:
        extra.setdefault("clock_event_ns", reasons)
    if TOTAL_ENERGY_CONSUMPTION in fields:
        extra.setdefault("energy_mj", fields[TOTAL_ENERGY_CONSUMPTION])
    return GpuSample(
        time_unix_nano=time_unix_nano, window_s=window_s, host=host, gpu_index=gpu_index, uuid=uuid, model=model,
        tensor_active=fields.get(PIPE_TENSOR_ACTIVE), sm_clock_mhz=fields.get(SM_CLOCK),
        sm_clock_samples=sm_clock_samples, max_sm_clock_mhz=fields.get(MAX_SM_CLOCK),
        power_w=fields.get(POWER_USAGE), clock_event_reasons=fields.get(CLOCKS_EVENT_REASONS),
        sm_active=fields.get(SM_ACTIVE), gr_active=fields.get(GR_ENGINE_ACTIVE), dram_active=fields.get(DRAM_ACTIVE),
        source=source, **extra,
    )
