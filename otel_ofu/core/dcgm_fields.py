"""DCGM field IDs and dcgm-exporter labels: the one mapping from DCGM-shaped data to samples.

Used by every receiver that sees DCGM-shaped data (the ``dcgm`` receiver, a dcgm-exporter
scrape, ``dcgmi dmon`` / CSV replay, OTLP from a Collector's Prometheus receiver), so the
same field or label means the same thing wherever it arrives. IDs are stable; DCGM 4.6
renamed several macros, so both names are accepted (REFERENCE.md sections 2 and 6).
"""

from __future__ import annotations

from typing import Any

from otel_ofu.core.model import GPU_MIG_INSTANCE, GPU_MIG_PROFILE, GpuSample

SM_CLOCK = 100
APP_SM_CLOCK = 110
CLOCKS_EVENT_REASONS = 112
MAX_SM_CLOCK = 113
POWER_USAGE = 155
GR_ENGINE_ACTIVE = 1001
SM_ACTIVE = 1002
PIPE_TENSOR_ACTIVE = 1004
DRAM_ACTIVE = 1005
PIPE_TENSOR_HMMA_ACTIVE = 1014
SM_CYCLES_ELAPSED_TOTAL = 1084
MMA_CYCLES_ACTIVE_TOTAL = 1086

# Field id -> every name it has had (the first is the dcgm-exporter / pre-4.6 name).
FIELD_NAMES: dict[int, tuple[str, ...]] = {
    SM_CLOCK: ("DCGM_FI_DEV_SM_CLOCK",),
    APP_SM_CLOCK: ("DCGM_FI_DEV_APP_SM_CLOCK",),
    CLOCKS_EVENT_REASONS: ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    MAX_SM_CLOCK: ("DCGM_FI_DEV_MAX_SM_CLOCK",),
    POWER_USAGE: ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS"),
    GR_ENGINE_ACTIVE: ("DCGM_FI_PROF_GR_ENGINE_ACTIVE",),
    SM_ACTIVE: ("DCGM_FI_PROF_SM_ACTIVE",),
    PIPE_TENSOR_ACTIVE: ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO"),
    DRAM_ACTIVE: ("DCGM_FI_PROF_DRAM_ACTIVE",),
    PIPE_TENSOR_HMMA_ACTIVE: ("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",),
    SM_CYCLES_ELAPSED_TOTAL: ("DCGM_FI_PROF_SM_CYCLES_ELAPSED_TOTAL",),
    MMA_CYCLES_ACTIVE_TOTAL: ("DCGM_FI_PROF_MMA_CYCLES_ACTIVE_TOTAL",),
}
FIELD_IDS_BY_NAME: dict[str, int] = {name: fid for fid, names in FIELD_NAMES.items() for name in names}

# DCGM field types, for the blank rule (values.clean(field_type=...)).
FIELD_TYPES: dict[int, str] = {SM_CYCLES_ELAPSED_TOTAL: "int64", MMA_CYCLES_ACTIVE_TOTAL: "int64",
                               CLOCKS_EVENT_REASONS: "int64"}

# `dcgmi dmon` column headers are the fields' short names (dcgmlib/src/dcgm_fields.cpp,
# DcgmFieldsPopulateOneFieldWithFormatting): a recorded dmon table names its columns only so.
DMON_SHORT_NAMES: dict[str, int] = {
    "SMCLK": SM_CLOCK, "SACLK": APP_SM_CLOCK, "DVCCTR": CLOCKS_EVENT_REASONS, "SMMAX": MAX_SM_CLOCK,
    "POWER": POWER_USAGE, "GRACT": GR_ENGINE_ACTIVE, "SMACT": SM_ACTIVE, "TENSO": PIPE_TENSOR_ACTIVE,
    "DRAMA": DRAM_ACTIVE, "THMMA": PIPE_TENSOR_HMMA_ACTIVE,
}

# dcgm-exporter labels -> resource attributes (semantic-convention names). Old spellings
# (--use-old-namespace, pre-2026 Hostname) are accepted beside the new ones.
_K8S_LABELS = {
    "pod": "k8s.pod.name", "pod_name": "k8s.pod.name",
    "namespace": "k8s.namespace.name", "pod_namespace": "k8s.namespace.name",
    "container": "k8s.container.name", "container_name": "k8s.container.name",
    "pod_uid": "k8s.pod.uid",
}

# Every dcgm-exporter label identity_from_labels reads, plus ``device``: lets a caller tell
# these from other attributes (e.g. labels a Collector promoted to resource attributes).
EXPORTER_LABELS: frozenset[str] = frozenset({
    "gpu", "UUID", "uuid", "modelName", "model_name", "Hostname", "hostname", "device", "pci_bus_id", "GPU_I_ID",
    "GPU_I_PROFILE", "DCGM_FI_DRIVER_VERSION", "hpc_job", *_K8S_LABELS,
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
    """A GpuSample from ``{field_id: raw value}``; absent fields stay None (no value)."""
    return GpuSample(
        time_unix_nano=time_unix_nano, window_s=window_s, host=host, gpu_index=gpu_index, uuid=uuid, model=model,
        tensor_active=fields.get(PIPE_TENSOR_ACTIVE), sm_clock_mhz=fields.get(SM_CLOCK),
        sm_clock_samples=sm_clock_samples, max_sm_clock_mhz=fields.get(MAX_SM_CLOCK),
        power_w=fields.get(POWER_USAGE), clock_event_reasons=fields.get(CLOCKS_EVENT_REASONS),
        sm_active=fields.get(SM_ACTIVE), source=source, **extra,
    )
