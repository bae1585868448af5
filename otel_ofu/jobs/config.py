"""The jobs settings (the ``jobs`` processor's and the report's): windows, timeouts, clocks, audit, prices."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from otel_ofu.core.metrics import MFU_REPORT_METRIC, TFLOPS_REPORT_METRICS
from otel_ofu.core.model import JOB_KIND, NO_JOB
from otel_ofu.jobs.aggregate import window_label
from otel_ofu.jobs.audit import AuditConfig
from otel_ofu.jobs.cost import CostConfig
from otel_ofu.jobs.regression import RegressionConfig
from otel_ofu.jobs.stall import StallConfig
from otel_ofu.pipeline.config import Duration, require, require_directory


def _default_copy_attributes() -> list[str]:
    # The job's kind (ofu.job.kind) as its GPUs' series carry it, then where and whose it is.
    return [JOB_KIND, "k8s.namespace.name", "slurm.job.user", "slurm.job.account", "slurm.job.partition",
            "slurm.job.name"]



DEFAULT_MAX_GAP_S = 120.0  # JobsConfig.max_gap's default
JOULES_PER_KWH = 3.6e6


@dataclass
class CarbonConfig:
    """Emissions per job (job.emissions, grams of CO2-equivalent) from its energy (docs/method.md#energy-per-job)."""

    # The carbon intensity of the GPUs' electricity, g CO2e per kWh (your grid's or provider's figure, e.g.
    # a yearly average); unset: no job.emissions.
    grams_per_kwh: float | None = None

    def validate(self) -> None:
        if self.grams_per_kwh is not None:
            require(0 <= self.grams_per_kwh <= 5000, "grams_per_kwh",
                    f"expected g CO2e per kWh within [0, 5000], got {self.grams_per_kwh}")

    def grams(self, joules: float) -> float | None:
        """The emissions of ``joules`` of energy; None when no intensity is set."""
        return None if self.grams_per_kwh is None else joules / JOULES_PER_KWH * self.grams_per_kwh


@dataclass
class JobsConfig:
    # Rolling windows for job.ofu / job.mfu.reported (attribute ofu.window), besides "life".
    windows: list[Duration] = field(default_factory=lambda: [Duration(300), Duration(3600)])
    # Evaluation step: bins of data time; one set of job metrics per job per bin.
    resolution: Duration = field(default_factory=lambda: Duration(60))
    # A job has ended when each host that ran it has sent data this much newer than the job's
    # last point there (each host's own clock), or has been silent this long (see silence_timeout).
    job_timeout: Duration = field(default_factory=lambda: Duration(300))
    # A job whose hosts all went silent (nothing arrives from them: node gone, or a network
    # partition whose backlog may still come) ends after this long without any of their data; at
    # least job_timeout. Raise it if your Collectors keep a persistent queue through longer outages.
    silence_timeout: Duration = field(default_factory=lambda: Duration(900))
    # A point stamped further than this ahead of this process's clock is not counted (skipped,
    # reason "future"): a node with a broken clock must not move anyone's time.
    max_future: Duration = field(default_factory=lambda: Duration(600))
    # The window a GPU's first point covers (set it to the collection interval) ...
    default_interval: Duration = field(default_factory=lambda: Duration(10))
    # ... and a gap between two points longer than this is a gap, not GPU time we saw.
    max_gap: Duration = field(default_factory=lambda: Duration(DEFAULT_MAX_GAP_S))
    mfu_metric: str = MFU_REPORT_METRIC  # the metric a job reports its own MFU in (a fraction)
    # Metrics a job reports achieved TFLOP/s per GPU in; divided by the dense peak of the job's
    # GPUs at the job's precision (docs/audit.md, Units).
    tflops_metrics: list[str] = field(default_factory=lambda: list(TFLOPS_REPORT_METRICS))
    # Reports of a job no GPU has reported for yet, kept (all jobs together) until it does or
    # until job_timeout of data time has passed.
    max_pending_reports: int = 10000
    # Job ids that mean "no job": their GPUs count as GPUs without a job.
    ignore_jobs: list[str] = field(default_factory=lambda: [NO_JOB, "unknown", ""])
    # Count a GPU several jobs share (ofu.job.shared) for each of them by its share (gpu.job.share: by
    # their processes' use where measured, else evenly; docs/sharing.md); false: for none (no job's).
    include_shared: bool = True
    # Attributes copied from the job's first point onto the job's resource.
    copy_attributes: list[str] = field(default_factory=_default_copy_attributes)
    audit: AuditConfig = field(default_factory=AuditConfig)
    regression: RegressionConfig = field(default_factory=RegressionConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    carbon: CarbonConfig = field(default_factory=CarbonConfig)
    stall: StallConfig = field(default_factory=StallConfig)
    # A directory for this processor's own state (otel_ofu.jobs.state): jobs survive a restart or a
    # crash; at shutdown jobs are then kept, not ended (docs/fleet.md). Unset: in memory only.
    storage: str | None = None
    # With storage: a snapshot of the state at most this often ...
    checkpoint_interval: Duration = field(default_factory=lambda: Duration(60))
    max_journal_bytes: int = 64 * 1024 * 1024  # ... or when the journal since the last one is this large
    # Pass what arrives (the GPUs' points, reports, everything else) on to the exporters with the
    # job metrics; false: only the job metrics and events it makes, where the per-GPU data is
    # served elsewhere already (the Helm chart's jobs instance: the node agents serve it).
    passthrough: bool = True

    def validate(self) -> None:
        require(self.resolution > 0, "resolution", "must be positive")
        require(bool(self.windows), "windows", "at least one window is required")
        labels = [window_label(w) for w in self.windows]
        require(len(set(labels)) == len(labels), "windows", "windows must differ")
        for i, w in enumerate(self.windows):
            require(w >= self.resolution, f"windows[{i}]", f"must be at least resolution ({self.resolution:g}s)")
        require(self.job_timeout >= self.resolution, "job_timeout", "must be at least resolution")
        require(self.silence_timeout >= self.job_timeout, "silence_timeout",
                f"must be at least job_timeout ({self.job_timeout:g}s)")
        require(self.max_future > 0, "max_future", "must be positive")
        require(self.default_interval > 0, "default_interval", "must be positive")
        # Named on the key that was set: max_gap usually keeps its default and is then not in the file.
        require(self.max_gap >= self.default_interval,
                "max_gap" if self.max_gap != DEFAULT_MAX_GAP_S else "default_interval",
                f"default_interval ({self.default_interval:g}s) is longer than max_gap ({self.max_gap:g}s), the "
                "longest gap between a GPU's points that still counts as one stretch of work: give the sources' "
                "interval (dcgm-exporter's -c counts milliseconds: -c 10000 is 10s), or raise max_gap")
        require(bool(self.mfu_metric), "mfu_metric", "must name a metric")
        if self.storage is not None:
            if require(bool(self.storage.strip()), "storage", "must be a directory path"):
                require_directory("storage", self.storage, "the jobs state")
        require(self.checkpoint_interval > 0, "checkpoint_interval", "must be positive")
        require(self.max_journal_bytes >= 1024 * 1024, "max_journal_bytes", "must be at least 1 MiB")
        for i, name in enumerate(self.tflops_metrics):
            require(bool(name), f"tflops_metrics[{i}]", "must name a metric")
            require(name != self.mfu_metric, f"tflops_metrics[{i}]", f"{name} is already mfu_metric (a fraction)")
        require(self.max_pending_reports >= 0, "max_pending_reports", "must not be negative")
        require(self.stall.after >= self.resolution, "stall.after",
                f"must be at least resolution ({self.resolution:g}s)")

    def state_key(self) -> JobsConfig:
        """The settings a saved state depends on (not where or how often it is saved, nor the prices or the carbon
        intensity: a new one counts from when it is set, the jobs go on)."""
        return replace(self, storage=None, checkpoint_interval=Duration(60), max_journal_bytes=0, passthrough=True,
                       cost=CostConfig(), carbon=CarbonConfig())

    @property
    def retention_s(self) -> float:
        """How far back the series must reach: the longest window plus two bins of slack."""
        longest = max([*self.windows, self.audit.window, self.resolution])
        return float(longest) + 2 * float(self.resolution)
