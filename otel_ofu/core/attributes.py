"""Every resource and point attribute otel-ofu sets: name, where it sits, meaning, who sets it.

The attribute half of the registry beside ``metrics.py``: docs/metrics.md's attribute tables, the metric
table's attribute column and each component page's attribute list are generated from it
(``python -m otel_ofu.cli.docs``), and tests/test_docs.py checks that every attribute name the
code defines or sets is here. Names the code uses live in ``model.py`` (GPU and job identity),
``otel_ofu.attribution`` (Kubernetes and Slurm) and ``otel_ofu.jobs.findings`` (findings).
"""

from __future__ import annotations

from dataclasses import dataclass

RESOURCE = "resource"
POINT = "point"


@dataclass(frozen=True)
class AttributeInfo:
    name: str
    on: str  # RESOURCE (the entity the points are about) or POINT (one data point)
    description: str
    # Components that set it, as "<section>/<type>" (docs/components); () for none in particular.
    set_by: tuple[str, ...] = ()
    # Point attributes: the metrics that carry it. Resource attributes: () (every point of the entity).
    metrics: tuple[str, ...] = ()


# Receivers that read GPU counters and name each GPU.
GPU_RECEIVERS = ("receivers/dcgm", "receivers/nvml", "receivers/dcgm_exporter", "receivers/otlp",
                 "receivers/replay", "receivers/sim")
_LABEL_SOURCES = ("receivers/dcgm_exporter", "receivers/otlp", "receivers/replay", "processors/attribution")
_OFU_POINTS = ("gpu.ofu", "gpu.ofu.raw", "gpu.ofu.reference_clock", "gpu.flops.achieved")
_JOB_WINDOW_METRICS = ("job.ofu", "job.mfu.reported", "job.flops.achieved", "job.ofu.loss")
_COST_METRICS = ("job.cost", "job.cost.gained", "fleet.cost", "fleet.cost.gained")
_LOSS_METRICS = ("gpu.ofu.loss", "job.ofu.loss", "job.ofu.loss.gpu_hours", "job.ofu.gain.gpu_hours", "fleet.gpu_hours",
                 "fleet.gpu_hours.gained", *_COST_METRICS)
_RECEIVER_METRICS = ("otel_ofu.receiver.accepted", "otel_ofu.receiver.status", "otel_ofu.receiver.requests",
                     "otel_ofu.receiver.samples", "otel_ofu.receiver.decoded")
_REASON_METRICS = ("otel_ofu.ofu.dropped", "otel_ofu.ofu.skipped", "otel_ofu.pipeline.dropped",
                   "otel_ofu.exporter.retried", "otel_ofu.exporter.dropped", "otel_ofu.exporter.write_failed",
                   "otel_ofu.scrape.errors",
                   "otel_ofu.jobs.skipped", "otel_ofu.attribution.kubernetes.lists",
                   "otel_ofu.attribution.kubernetes.errors", "otel_ofu.attribution.reports.refused")
_EXPORTER_METRICS = ("otel_ofu.exporter.queue.size", "otel_ofu.exporter.queue.capacity", "otel_ofu.exporter.sent",
                     "otel_ofu.exporter.retried", "otel_ofu.exporter.dropped", "otel_ofu.exporter.write_failed",
                     "otel_ofu.exporter.pending")

_ATTRIBUTES = (
    # --- the GPU (resource of every point about one GPU or MIG instance) ---
    AttributeInfo("host.name", RESOURCE, "The host the GPU is in (the node name).", GPU_RECEIVERS),
    AttributeInfo("hw.id", RESOURCE, "The GPU's UUID, as the OpenTelemetry hardware conventions require; a MIG "
                  "instance keeps its physical GPU's UUID. Empty for dmon recordings, which print none.",
                  GPU_RECEIVERS),
    AttributeInfo("hw.model", RESOURCE, "The GPU model as the driver prints it (\"NVIDIA H100 80GB HBM3\"): picks "
                  "the spec table's row, so f_ref and the peak (docs/gpus.md).", GPU_RECEIVERS),
    AttributeInfo("hw.vendor", RESOURCE, "`nvidia`.", ("processors/ofu",)),
    AttributeInfo("gpu.index", RESOURCE, "The driver's index of the GPU on its host (DCGM GPU id, NVML index, "
                  "dcgm-exporter's `gpu` label).", GPU_RECEIVERS),
    AttributeInfo("gpu.mig.instance_id", RESOURCE, "MIG: the GPU instance id (dcgm-exporter's `GPU_I_ID`); each "
                  "instance is its own entity.", ("receivers/dcgm", "receivers/nvml", *_LABEL_SOURCES[:3])),
    AttributeInfo("gpu.mig.profile", RESOURCE, "MIG: the instance's profile (`2g.20gb` from dcgm-exporter's "
                  "`GPU_I_PROFILE`, `profile-<id>` from DCGM).", ("receivers/dcgm", *_LABEL_SOURCES[:3])),
    AttributeInfo("gpu.mig.slices", RESOURCE, "MIG: the instance's compute slices (of the GPU's 7): its share of "
                  "the GPU's peak in FLOP figures (docs/mig.md).", ("receivers/dcgm", "receivers/nvml")),
    AttributeInfo("gpu.mig.uuid", RESOURCE, "MIG: the instance's own UUID (`MIG-...`).", ("receivers/nvml",)),
    AttributeInfo("gpu.pci_bus_id", RESOURCE, "The GPU's PCI bus id.", ("receivers/dcgm", *_LABEL_SOURCES[:3])),
    AttributeInfo("gpu.driver.version", RESOURCE, "The NVIDIA driver version (dcgm-exporter's "
                  "`DCGM_FI_DRIVER_VERSION` label).", _LABEL_SOURCES[:3]),
    AttributeInfo("dcgm.entity", RESOURCE, "dmon recordings: the row's DCGM entity (`GPU-I 3`, `GPU-CI 5`) of a "
                  "MIG row.", ("receivers/replay",)),
    # --- the GPU's job (resource) ---
    AttributeInfo("ofu.job.id", RESOURCE, "The job holding the GPU (docs/components/processors/attribution.md, "
                  "ofu.job.id format; a Kubernetes job is `k8s:<namespace>/<kind>/<name>`, its stable name across "
                  "runs). `none`: an idle GPU, one a source that sees the node's allocations says nobody holds (the "
                  "kubelet's allocatable devices, the node's DRA ResourceSlices, a dcgm-exporter page that labels "
                  "the GPUs pods hold). `unknown`: nothing says (no source names it, or none can answer). Also the "
                  "resource of the jobs processor's per-job points.",
                  ("processors/attribution", "processors/ofu", "processors/jobs", "receivers/sim",
                   "receivers/dcgm_exporter")),
    AttributeInfo("ofu.precision", RESOURCE, "The precision the job computes in: `tf32`, `fp16`, `bf16`, `fp8`, "
                  "`fp4`, `int8`, `fp64` or `unknown` (the counters cannot tell; it picks the peak).",
                  ("processors/attribution", "processors/ofu", "receivers/sim")),
    AttributeInfo("ofu.job.source", RESOURCE, "Which source named the job: `kubelet`, `k8s_api`, `process`, "
                  "`slurm`, `scrape`, `hpc_job`, `rule`, `sample`, `report`, or several joined by `+`.",
                  ("processors/attribution",)),
    AttributeInfo("ofu.job.shared", RESOURCE, "`true` when several jobs hold the GPU (pods on time-sliced or MPS "
                  "replicas of it, one DRA claim in several pods, several Slurm jobs): each job gets a point set of "
                  "its own with its share in gpu.job.share (docs/sharing.md). Older recordings and peers comma-join "
                  "the jobs' ids in one ofu.job.id instead (read as an even split).",
                  ("processors/attribution",)),
    AttributeInfo("ofu.job.kind", RESOURCE, "The Kubernetes workload kind behind ofu.job.id (PyTorchJob, JobSet, "
                  "Job, Deployment, Pod, ...); a bounded set, kept on overflow. The jobs processor copies it onto "
                  "the job's own series (copy_attributes).", ("processors/attribution", "processors/jobs")),
    AttributeInfo("ofu.job.run", RESOURCE, "The incarnation of the job ofu.job.id names: the UID of its Kubernetes "
                  "workload object, when the pods know it (docs/kubernetes-attribution.md, Runs). A job deleted and "
                  "created again under one name keeps its id and gets a new run: the jobs processor counts it as a "
                  "new job (start event, totals and regression baseline of its own). Absent when unknown.",
                  ("processors/attribution", "processors/jobs")),
    # --- who runs the job (resource) ---
    AttributeInfo("k8s.pod.name", RESOURCE, "The pod holding the GPU (or reporting its MFU).", _LABEL_SOURCES),
    AttributeInfo("k8s.namespace.name", RESOURCE, "The pod's namespace.", _LABEL_SOURCES),
    AttributeInfo("k8s.resourceclaim.name", RESOURCE, "DRA: the ResourceClaim holding the GPU (dcgm-exporter's "
                  "`dra_claim_name`); its consumers name the job (docs/kubernetes-attribution.md#dra).",
                  _LABEL_SOURCES),
    AttributeInfo("k8s.resourceclaim.namespace", RESOURCE, "DRA: the ResourceClaim's namespace "
                  "(`dra_claim_namespace`).", _LABEL_SOURCES),
    AttributeInfo("dra.driver.name", RESOURCE, "DRA: the driver of the device (`dra_driver_name`, e.g. "
                  "`gpu.nvidia.com`).", _LABEL_SOURCES[:3]),
    AttributeInfo("dra.pool.name", RESOURCE, "DRA: the device's pool (`dra_pool_name`, usually the node).",
                  _LABEL_SOURCES[:3]),
    AttributeInfo("dra.device.name", RESOURCE, "DRA: the device's name in its pool (`dra_device_name`, e.g. "
                  "`gpu-3`).", _LABEL_SOURCES[:3]),
    AttributeInfo("dra.mig.profile", RESOURCE, "DRA: the MIG profile of the device the pod holds (`dra_mig_profile`).",
                  _LABEL_SOURCES[:3]),
    AttributeInfo("dra.mig.uuid", RESOURCE, "DRA: the MIG device's UUID (`dra_mig_device_uuid`).",
                  _LABEL_SOURCES[:3]),
    AttributeInfo("k8s.container.name", RESOURCE, "The container holding the GPU.", _LABEL_SOURCES),
    AttributeInfo("k8s.pod.uid", RESOURCE, "The pod's UID (from its processes' cgroup, dcgm-exporter's "
                  "`pod_uid`, or the Kubernetes API).", _LABEL_SOURCES),
    AttributeInfo("k8s.pod.label.<key>", RESOURCE, "A pod label: copied by the Kubernetes API source "
                  "(`copy_labels`), or set upstream (a Collector's k8sattributes processor).",
                  ("processors/attribution",)),
    AttributeInfo("k8s.pod.annotation.<key>", RESOURCE, "A pod annotation set upstream; attribution reads the "
                  "precision from `precision_key`.", ()),
    AttributeInfo("k8s.node.name", RESOURCE, "The node a training process runs on (a job's own report).",
                  ("receivers/prometheus",)),
    AttributeInfo("nemo.run.id", RESOURCE, "NeMo's run id, read from a job's `target_info` with its report.",
                  ("receivers/prometheus",)),
    AttributeInfo("slurm.job.id", RESOURCE, "The Slurm job holding the GPU (cgroup path or SLURM_JOB_ID).",
                  ("processors/attribution", "receivers/prometheus")),
    AttributeInfo("slurm.job.user", RESOURCE, "SLURM_JOB_USER of the job's processes.", ("processors/attribution",)),
    AttributeInfo("slurm.job.account", RESOURCE, "SLURM_JOB_ACCOUNT.", ("processors/attribution",)),
    AttributeInfo("slurm.job.partition", RESOURCE, "SLURM_JOB_PARTITION.", ("processors/attribution",)),
    AttributeInfo("slurm.job.name", RESOURCE, "SLURM_JOB_NAME.", ("processors/attribution", "receivers/prometheus")),
    AttributeInfo("hpc.job.id", RESOURCE, "dcgm-exporter's `hpc_job` label (its HPC job mapping).", _LABEL_SOURCES),
    # --- otel-ofu itself (resource of its self-telemetry) ---
    AttributeInfo("service.name", RESOURCE, "`otel-ofu` on self-telemetry, receiver status points and "
                  "fleet.gpu_hours (and .gained).",
                  ("receivers/selftelemetry", "receivers/dcgm", "receivers/nvml", "processors/jobs")),
    AttributeInfo("service.version", RESOURCE, "otel-ofu's version, on self-telemetry.", ("receivers/selftelemetry",)),
    AttributeInfo("service.instance.id", RESOURCE, "`<host>:<pid>` of the otel-ofu process, on self-telemetry and "
                  "fleet.gpu_hours and fleet.cost (and .gained; each jobs instance its own series).",
                  ("receivers/selftelemetry", "processors/jobs")),
    # --- how a value was made (point) ---
    AttributeInfo("ofu.fref.source", POINT, "Where f_ref came from: `spec` (the spec table), `config` (the ofu "
                  "processor's reference_clocks) or `max_sm_clock` (an unknown model's reported max clock).",
                  ("processors/ofu",), _OFU_POINTS),
    AttributeInfo("ofu.link", POINT, "The interconnect a `gpu.link.throughput` point measures: `pcie` or `nvlink`.",
                  ("processors/ofu",), ("gpu.link.throughput",)),
    AttributeInfo("ofu.loss.part", POINT, "A part of the loss account: `engine_idle`, `sm_idle`, `non_tensor`, "
                  "`clock`, `padding`; steps merged where a counter is missing (`sm_idle+non_tensor` without "
                  "SM_ACTIVE, `engine_idle+sm_idle` without GR_ENGINE_ACTIVE, `engine_idle+sm_idle+non_tensor` with "
                  "neither) (docs/method.md#where-the-flops-go-the-loss-account). Per job and fleet also `unknown` "
                  "(OFU that came without its account); the fleet's GPU-hours also `useful` (OFU) and `unallocated` "
                  "(no job); a job's cost also `useful`.", ("processors/ofu", "processors/jobs"), _LOSS_METRICS),
    AttributeInfo("ofu.cost.currency", POINT, "The currency of a cost point (the jobs processor's cost.currency: "
                  "`USD`, `EUR`, ...): the unit of its value (docs/jobs.md#cost).", ("processors/jobs",),
                  _COST_METRICS),
    AttributeInfo("ofu.loss.cause", POINT, "Why, for two parts: the clock part's most severe clock event reason "
                  "(`hw_power_brake`, `hw_thermal`, `hw_slowdown`, `sw_thermal`, `sw_power_cap`, `sync_boost`, "
                  "`app_clocks`, `display_clocks`, `idle`, `other`, `none`, `unknown`), and for the part holding the "
                  "non-tensor step `memory_bound`, `not_memory_bound` (DRAM_ACTIVE at or above the threshold or not) "
                  "or `unknown`. Absent on the other parts. Per job: the cause behind most of that part's loss in the "
                  "window. Where the clock event time per reason is read (DCGM 1420-1424), the clock part comes as one "
                  "point per reason that held the clock down (`sw_power_cap`, `sync_boost`, `sw_thermal`, "
                  "`hw_thermal`, `hw_power_brake`), by its share of the throttled time, adding up to the clock part; "
                  "per job the clock part is always one point per cause, its gain as `boost` (below 0).",
                  ("processors/ofu", "processors/jobs"), _LOSS_METRICS[:2]),
    AttributeInfo("ofu.share.basis", POINT, "How a shared GPU's split among its jobs was made (gpu.job.share): "
                  "`sm_util` (each job's processes' SM utilization: NVML per-process utilization, dcgm-exporter's "
                  "per-pod DCGM_FI_DEV_GPU_UTIL), `even` (nothing measured each job's use, or none used it), "
                  "`mig_profile` (MIG devices of one profile on one GPU whose instance is not known: each job an even "
                  "part of each; docs/sharing.md).", ("processors/ofu",), ("gpu.job.share",)),
    AttributeInfo("ofu.energy.basis", POINT, "How gpu.energy was found: `counter` (the increase of the GPU's energy "
                  "counter: DCGM 156 or 1611, NVML total energy) or `power_x_time` (the power reading x the window's "
                  "time, where the source has no counter: an estimate; docs/method.md#energy-per-job).",
                  ("processors/ofu",), ("gpu.energy",)),
    AttributeInfo("ofu.energy.use", POINT, "Whose GPUs fleet.energy went to: `jobs` (GPU windows of a job) or "
                  "`unallocated` (GPUs of no job, ignored jobs, shared GPUs not counted).", ("processors/jobs",),
                  ("fleet.energy",)),
    AttributeInfo("ofu.drop.reason", POINT, "Why a GPU window has no OFU: `missing`, `blank`, `not_found`, "
                  "`not_supported`, `not_permissioned`, `nan`, `negative`, `out_of_range`, `zero_clock`, "
                  "`not_a_number`, `no_reference_clock` (docs/method.md#no-value-is-not-zero).",
                  ("processors/ofu",), ("gpu.ofu.dropped",)),
    AttributeInfo("process.pid", POINT, "The GPU's compute processes, sorted and comma-separated (`1771,2042`), "
                  "on the GPU's points (`gpu.*`); attribution reads it and removes it unless "
                  "`processes.keep_pid_attribute`. On a job's own report it is a resource attribute: the "
                  "reporting process (docs/audit.md).", ("receivers/nvml", "receivers/prometheus")),
    AttributeInfo("ofu.window", POINT, "The window a job figure covers: a rolling window (`5m`, `1h`: the jobs "
                  "processor's windows) or `life`.", ("processors/jobs",), _JOB_WINDOW_METRICS),
    AttributeInfo("ofu.finding.kind", POINT, "`mfu_gap` (the MFU audit), `regression` or `stalled` (GPUs busy with "
                  "nothing moving: docs/jobs.md#stalled-jobs).", ("processors/jobs",), ("job.finding",)),
    AttributeInfo("ofu.finding.cause", POINT, "The finding's likely cause: `flop_formula_overcount`, "
                  "`uncounted_padding_or_recompute`, `sustained_ofu_drop`, `engine_busy_no_work`.",
                  ("processors/jobs",), ("job.finding",)),
    # --- self-telemetry (point) ---
    AttributeInfo("receiver", POINT, "The receiver's component id (`otlp`, `dcgm/node`).", (), _RECEIVER_METRICS),
    AttributeInfo("state", POINT, "The GPU receiver's state (`ok`, `dcgm_missing`, `profiling_in_use`, "
                  "`gpu_lost`, ...: docs/components/receivers/dcgm.md#failure-states).", (),
                  ("otel_ofu.receiver.status",)),
    AttributeInfo("gpu", POINT, "The GPU (UUID, and MIG instance) a per-GPU receiver state is about.", (),
                  ("otel_ofu.receiver.status",)),
    AttributeInfo("protocol", POINT, "`grpc` or `http`.", (), ("otel_ofu.receiver.requests",)),
    AttributeInfo("outcome", POINT, "What became of a request (`accepted`, `malformed`, `too_large`, ...) or a "
                  "report (`attributed`, `kept`, `no_identity`, `refused`).", (),
                  ("otel_ofu.receiver.requests", "otel_ofu.attribution.reports")),
    AttributeInfo("reason", POINT, "Why something was dropped, skipped, retried or failed; the values are in "
                  "each metric's meaning.", (), _REASON_METRICS),
    AttributeInfo("pipeline", POINT, "The pipeline (`metrics`, `metrics/self`).", (), ("otel_ofu.pipeline.dropped",)),
    AttributeInfo("exporter", POINT, "The exporter's component id (`otlp/backup`).", (),
                  ("otel_ofu.pipeline.dropped", *_EXPORTER_METRICS)),
    AttributeInfo("signal", POINT, "`metrics` or `logs` (events).", (),
                  ("otel_ofu.exporter.sent", "otel_ofu.exporter.retried", "otel_ofu.exporter.dropped")),
    AttributeInfo("endpoint", POINT, "The scraped URL.", (), ("otel_ofu.scrape.errors", "otel_ofu.scrape.up")),
    AttributeInfo("file", POINT, "The recording's path.", (), ("otel_ofu.replay.errors",)),
    AttributeInfo("source", POINT, "The attribution source that failed (`kubelet`, `pids`).", (),
                  ("otel_ofu.attribution.refresh.errors",)),
    AttributeInfo("node", POINT, "The node whose pods the Kubernetes API source watches.", (),
                  ("otel_ofu.attribution.kubernetes.pods", "otel_ofu.attribution.kubernetes.stale")),
)

ATTRIBUTES: dict[str, AttributeInfo] = {a.name: a for a in _ATTRIBUTES}


def point_attributes(metric: str) -> list[str]:
    """The point attributes a metric carries, in registry order."""
    return [a.name for a in _ATTRIBUTES if a.on == POINT and metric in a.metrics]
