"""The data that flows through a pipeline: GPU samples in, metric points out.

Receivers produce :class:`GpuSample` (one GPU, one counter window, raw readings that may be
blank) and, for things that are not GPU counters, :class:`MetricPoint`. Processors turn
samples into points; exporters only ever see points (plus opaque pass-through data that a
receiver chose to forward untouched, e.g. OTLP metrics this project does not interpret).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Attribute names (core/attributes.py registers each one with its meaning: docs/metrics.md).
HOST_NAME = "host.name"
HW_ID = "hw.id"  # GPU UUID (OpenTelemetry hardware semantic conventions)
HW_MODEL = "hw.model"
HW_VENDOR = "hw.vendor"
GPU_INDEX = "gpu.index"
GPU_MIG_INSTANCE = "gpu.mig.instance_id"
GPU_MIG_PROFILE = "gpu.mig.profile"
GPU_MIG_SLICES = "gpu.mig.slices"  # the GPU instance's compute slices (of the GPU's 7 on A100 .. B200)
JOB_ID = "ofu.job.id"
PRECISION = "ofu.precision"
JOB_SHARED = "ofu.job.shared"  # true when several jobs hold the GPU
JOB_SOURCE = "ofu.job.source"  # which source named the job: kubelet, process, slurm, scrape, hpc_job, rule, sample
# the Kubernetes workload kind behind ofu.job.id (PyTorchJob, JobSet, Job, Deployment, Pod, ...);
# set by attribution's kubernetes_api source; a bounded set, kept on overflow
JOB_KIND = "ofu.job.kind"
# the incarnation of the job named by ofu.job.id: the UID of its workload object (Kubernetes);
# a job deleted and created again under one name is a new run (a new job to the jobs processor)
JOB_RUN = "ofu.job.run"
# how a shared device's split among its jobs was made (gpu.job.share's point attribute): sm_util (each
# job's processes' SM utilization), even (nothing measured each job's use), mig_profile (MIG devices of
# one profile whose instance is not known; docs/sharing.md)
SHARE_BASIS = "ofu.share.basis"
FREF_SOURCE = "ofu.fref.source"
DROP_REASON = "ofu.drop.reason"
LOSS_PART = "ofu.loss.part"  # a part of the loss account (otel_ofu.core.loss): engine_idle, clock, ...
LINK = "ofu.link"  # which interconnect a gpu.link.throughput point measures: pcie or nvlink
LOSS_CAUSE = "ofu.loss.cause"  # why: the clock part's event reason, memory-bound or not for the non-tensor part
COST_CURRENCY = "ofu.cost.currency"  # the currency of a cost point (job.cost, fleet.cost): the jobs processor's cost
# how gpu.energy was found: counter (the GPU's energy counter's increase) or power_x_time (power x window time,
# where the source has no counter)
ENERGY_BASIS = "ofu.energy.basis"
ENERGY_COUNTER = "counter"
ENERGY_POWER_X_TIME = "power_x_time"
ENERGY_USE = "ofu.energy.use"  # fleet.energy's part: jobs | unallocated

NO_JOB = "none"

Attributes = tuple[tuple[str, Any], ...]

# The job identity attribution adds to a resource, next to what the resource already said (a
# GPU's host, hw.id, index, MIG instance, its pod; a training process's pod or pid).
JOB_RESOURCE_KEYS = frozenset({JOB_ID, JOB_RUN, JOB_KIND, PRECISION, JOB_SHARED, JOB_SOURCE})


GpuKey = tuple[str, str, str]  # (host, UUID or "#<index>", MIG instance or "")


def gpu_key(resource: Attributes | dict[str, Any]) -> GpuKey:
    """Which GPU a resource is about: host + UUID (else the index) + MIG instance. The one notion
    of "the same GPU": the exporters, the jobs tier, the ofu processor, the console and the report
    all use it.

    Why not the UUID alone: dmon and CSV recordings have none (every GPU would be one), and
    MIG instances share their parent's UUID. Why not the index alone: two hosts both have a
    GPU 0. Why nothing else: everything that changes when the GPU moves to another job (the
    job id, its pod, container, Slurm job, precision) is an attribute of the GPU's time, not
    part of which GPU it is. Accepts a resource as attribute tuples or as a dict.
    """
    r = resource if isinstance(resource, dict) else dict(resource)
    uuid = str(r.get(HW_ID) or "").strip()
    ident = uuid.lower() if uuid else f"#{r.get(GPU_INDEX, '')}"
    return str(r.get(HOST_NAME) or ""), ident, str(r.get(GPU_MIG_INSTANCE) or "")


def names_a_gpu(resource: Attributes) -> bool:
    """Whether a resource is a GPU's (it has a UUID or an index), not a job's or a process's."""
    for key, _ in resource:
        if key == HW_ID or key == GPU_INDEX:
            return True
    return False


def gpu_label(key: GpuKey) -> str:
    """``host GPU 3`` / ``host GPU-8f2e.. MIG 2``: a GPU key for people."""
    host, ident, mig = key
    gpu = f"GPU {ident[1:]}" if ident.startswith("#") else ident
    return " ".join(part for part in (host, gpu, f"MIG {mig}" if mig else "") if part)


def attrs(mapping: dict[str, Any]) -> Attributes:
    """A hashable, order-independent attribute set (None values are left out)."""
    items = sorted(mapping.items())  # keys are unique: only keys are compared
    for _, value in items:
        if value is None:
            return tuple([item for item in items if item[1] is not None])
    return tuple(items)


@dataclass(slots=True)
class GpuSample:
    """One GPU's counters for one window, as read: values may be None, NaN or DCGM blanks."""

    time_unix_nano: int  # end of the window
    window_s: float  # the TPA averaging window
    host: str
    gpu_index: int | str
    uuid: str
    model: str
    tensor_active: object  # TPA, ratio 0..1, window average (DCGM 1004)
    sm_clock_mhz: object  # mean of the clock samples in the window (DCGM 100)
    sm_clock_samples: int = 1
    max_sm_clock_mhz: object = None  # DCGM 113
    power_w: object = None  # DCGM 155
    clock_event_reasons: object = None  # DCGM 112 bitmask
    sm_active: object = None  # DCGM 1002
    gr_active: object = None  # DCGM 1001 GR_ENGINE_ACTIVE (GPM GRAPHICS_UTIL), ratio 0..1
    dram_active: object = None  # DCGM 1005 DRAM_ACTIVE (GPM DRAM_BW_UTIL), ratio 0..1
    # GR, SM and DRAM travel on as they came (the otlp join leaves them in the pass-through): the
    # ofu processor does not re-emit them under its own names.
    ratios_forwarded: bool = False
    source: str = ""
    job_id: str | None = None
    precision: str | None = None
    resource: dict[str, Any] = field(default_factory=dict)  # extra resource attributes (k8s, MIG, slurm)
    attributes: dict[str, Any] = field(default_factory=dict)  # extra point attributes
    # A device several jobs hold in the window is one sample per job (attribution): the part of the
    # device this one's job held (the jobs' shares sum to 1) and how it was made (SHARE_BASIS); None:
    # the whole device (docs/sharing.md).
    share: float | None = None
    share_basis: str = ""
    # This sample's pod's own use of the device, as a per-pod copy of a shared GPU's series says it
    # (dcgm-exporter's per-pod DCGM_FI_DEV_GPU_UTIL: the SM utilization of the pod's processes, percent);
    # attribution weighs the device's split by it. Raw, may be blank.
    holder_use: object = None
    # The ledger's counters (issue 34), raw as read, each None where the source has none:
    # cumulative energy since the driver loaded, in mJ (DCGM 156; 1611 in J converted to mJ; NVML
    # nvmlDeviceGetTotalEnergyConsumption): energy per window is the difference of two samples.
    energy_mj: object = None
    # Cumulative nanoseconds the clock was held down, per reason (DCGM 1420-1424, ``..._NS``), keyed by
    # the cause names of otel_ofu.core.loss (sw_power_cap, sync_boost, sw_thermal, hw_thermal,
    # hw_power_brake); splits the loss account's clock part by each reason's share of the window.
    clock_event_ns: dict[str, object] | None = None
    # Interconnect traffic over the window, bytes per second (DCGM 1009/1010 PCIe, 1011/1012 NVLink;
    # NVML GPM PCI and NVLink tx/rx): what tells a stalled job (busy engine, idle links) from a working one.
    pcie_tx_bytes_per_s: object = None
    pcie_rx_bytes_per_s: object = None
    nvlink_tx_bytes_per_s: object = None
    nvlink_rx_bytes_per_s: object = None

    def gpu_key(self) -> GpuKey:
        """:func:`gpu_key` of this sample's GPU, without building its resource."""
        uuid = str(self.uuid or "").strip()
        return (str(self.host or ""), uuid.lower() if uuid else f"#{self.gpu_index}",
                str(self.resource.get(GPU_MIG_INSTANCE) or ""))

    def resource_attributes(self, job: dict[str, Any] | None = None) -> Attributes:
        """The GPU's identity and extra resource attributes, plus ``job`` (its job identity) when given."""
        if job is None:
            return attrs({HOST_NAME: self.host, HW_ID: self.uuid, HW_MODEL: self.model, HW_VENDOR: "nvidia",
                          GPU_INDEX: str(self.gpu_index), **self.resource})
        return attrs({HOST_NAME: self.host, HW_ID: self.uuid, HW_MODEL: self.model, HW_VENDOR: "nvidia",
                      GPU_INDEX: str(self.gpu_index), **self.resource, **job})


@dataclass(slots=True)
class MetricPoint:
    """One data point of one metric. Gauges unless ``monotonic`` (a cumulative sum)."""

    name: str
    value: float
    time_unix_nano: int
    resource: Attributes
    attributes: Attributes = ()
    unit: str = "1"
    monotonic: bool = False
    start_time_unix_nano: int = 0


@dataclass(slots=True)
class Event:
    """Something that happened (a job started or ended, a finding): exported as an OTLP log."""

    name: str  # the log's event.name attribute, e.g. "ofu.job.end"
    time_unix_nano: int
    resource: Attributes
    attributes: Attributes = ()
    body: str = ""
    severity: str = "INFO"  # INFO | WARN | ERROR


@dataclass(slots=True)
class PointLayout:
    """What a resource's points of one time share but their values: each point's metric name, unit and
    attribute set, in order. Made once per kind of GPU window (the ofu processor keeps them) and shared."""

    points: tuple[tuple[str, str, Attributes], ...]  # (name, unit, attributes) per point


@dataclass(slots=True)
class PointRow:
    """One resource's gauge points of one time (no start time) as a layout and the values in its order.

    Why: a GPU's window is a dozen points that differ from the previous window's only in their
    time and values. Made as one object instead of a dozen, and written by the OTLP encoder
    straight from a template of its layout; :meth:`points` makes the MetricPoints for every
    consumer that reads points (``Batch.points`` does, when first read).
    """

    layout: PointLayout
    resource: Attributes
    time_unix_nano: int
    values: list[float]

    def points(self) -> list[MetricPoint]:
        t, resource = self.time_unix_nano, self.resource
        return [MetricPoint(name, value, t, resource, attributes, unit)
                for (name, unit, attributes), value in zip(self.layout.points, self.values)]

    def __len__(self) -> int:
        return len(self.values)


class Batch:
    """What one receiver hands to a pipeline in one call.

    ``points`` is a list of MetricPoints. A processor may hand on points in rows
    (:meth:`with_rows`: MetricPoints and :class:`PointRow`s mixed, in order): they become
    MetricPoints, in the same order, when ``points`` is first read, so a consumer that only
    serializes them (the OTLP exporters, :meth:`points_and_rows`) never builds them.
    """

    __slots__ = ("samples", "_points", "passthrough", "events", "_rows", "peer")

    def __init__(self, samples: list[GpuSample] | None = None, points: list[MetricPoint] | None = None,
                 passthrough: list[Any] | None = None, events: list[Event] | None = None, peer: str | None = None):
        self.samples = [] if samples is None else samples
        self._points: list = [] if points is None else points
        self.passthrough = [] if passthrough is None else passthrough  # opaque, e.g. OTLP ResourceMetrics
        self.events = [] if events is None else events
        self._rows = False  # whether _points holds PointRows
        # The IP address of the connection the batch arrived on (a push receiver's sender), None when
        # it did not arrive over the network: what attribution checks a report's sender against.
        self.peer = peer

    @classmethod
    def with_rows(cls, samples: list[GpuSample], points_and_rows: list[MetricPoint | PointRow],
                  passthrough: list[Any], events: list[Event]) -> Batch:
        batch = cls(samples, points_and_rows, passthrough, events)
        batch._rows = True
        return batch

    @property
    def points(self) -> list[MetricPoint]:
        if self._rows:
            expanded: list[MetricPoint] = []
            for item in self._points:
                if type(item) is PointRow:
                    expanded += item.points()
                else:
                    expanded.append(item)
            self._points = expanded
            self._rows = False
        return self._points

    @points.setter
    def points(self, points: list[MetricPoint]) -> None:
        self._points = points
        self._rows = False

    def points_and_rows(self) -> list[MetricPoint | PointRow]:
        """The points as held: MetricPoints and PointRows, in order (nothing is made)."""
        return self._points

    def point_count(self) -> int:
        """How many points ``points`` holds, without making them."""
        if not self._rows:
            return len(self._points)
        return sum(len(item) if type(item) is PointRow else 1 for item in self._points)

    def __len__(self) -> int:
        return len(self.samples) + self.point_count() + len(self.passthrough) + len(self.events)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batch):
            return NotImplemented
        return (self.samples, self.points, self.passthrough, self.events) == (
            other.samples, other.points, other.passthrough, other.events)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it was

    def __repr__(self) -> str:
        return (f"Batch(samples={self.samples!r}, points={self.points!r}, passthrough={self.passthrough!r}, "
                f"events={self.events!r})")


def attribute_of(point: MetricPoint | Event, key: str) -> Any:
    """A job-identity attribute of a point: from its resource, else from its point attributes.

    Why both: otel-ofu puts ``ofu.job.id`` and ``ofu.precision`` on the resource; recordings
    and peers from before version 0.2 carried them as point attributes.
    """
    for k, v in point.resource:
        if k == key:
            return v
    for k, v in point.attributes:
        if k == key:
            return v
    return None


def job_id_of(point: MetricPoint | Event) -> str | None:
    job = attribute_of(point, JOB_ID)
    return None if job is None else str(job)


def precision_of(point: MetricPoint | Event) -> str | None:
    precision = attribute_of(point, PRECISION)
    return None if precision is None else str(precision)


def without_job_identity(resource: Attributes) -> Attributes:
    """A resource without the job identity attribution added (:data:`JOB_RESOURCE_KEYS`): the
    same reporting process before and after its job was named. Not a GPU's identity: see
    :func:`gpu_key`."""
    return tuple(item for item in resource if item[0] not in JOB_RESOURCE_KEYS)
