"""The ``attribution`` processor's config (README.md, section Attribution describes every key)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from otel_ofu.attribution.kubelet import DEFAULT_RESOURCE_NAMES, DEFAULT_SOCKET
from otel_ofu.attribution.rules import RuleConfig
from otel_ofu.core.model import NO_JOB
from otel_ofu.pipeline.config import Duration, require

# Job ids that mean "no job known": attribution may fill these in without ``override``.
UNSET_JOBS = frozenset({"", NO_JOB, "unknown"})


@dataclass
class KubeletSourceConfig:
    enabled: bool = False
    socket: str = DEFAULT_SOCKET
    timeout: Duration = field(default_factory=lambda: Duration(2.0))
    # Device-plugin resource names (globs) whose devices are GPUs.
    resource_names: list[str] = field(default_factory=lambda: list(DEFAULT_RESOURCE_NAMES))

    def validate(self) -> None:
        require(self.timeout > 0, "timeout", "must be positive")
        require(bool(self.socket), "socket", "must not be empty")
        require(bool(self.resource_names), "resource_names", "give at least one resource name")


@dataclass
class ProcessSourceConfig:
    enabled: bool = False
    proc_root: str = "/proc"  # the host's /proc (e.g. /host/proc in a container)
    # Where GPU pids come from: ``process.pid`` on samples (an nvml receiver) and/or NVML here.
    pid_sources: list[Literal["samples", "nvml"]] = field(default_factory=lambda: ["samples"])
    pid_ttl: Duration = field(default_factory=lambda: Duration(60.0))  # forget a sample's pids unseen this long
    keep_pid_attribute: bool = False  # pids on points multiply series; dropped by default

    def validate(self) -> None:
        require(bool(self.proc_root), "proc_root", "must not be empty")
        require(self.pid_ttl > 0, "pid_ttl", "must be positive")


@dataclass
class AttributionProcessorConfig:
    refresh_interval: Duration = field(default_factory=lambda: Duration(10.0))
    # How long a failing source's last good answer is still used; after that it counts as empty.
    cache_ttl: Duration = field(default_factory=lambda: Duration(30.0))
    # Replace the job id / precision / k8s attributes a sample already carries (e.g. from the sim).
    override: bool = False
    kubelet: KubeletSourceConfig = field(default_factory=KubeletSourceConfig)
    processes: ProcessSourceConfig = field(default_factory=ProcessSourceConfig)
    # Use k8s.* and hpc.job.id already on the sample (dcgm-exporter labels, upstream processors).
    sample_labels: bool = True
    # Pod label/annotation (k8s.pod.label.<key> / k8s.pod.annotation.<key> on the sample) and
    # process environment variable that declare the job's precision.
    precision_key: str = "ofu.dev/precision"
    precision_env: str = "OFU_PRECISION"
    # Pod label naming the job across its pods (e.g. batch.kubernetes.io/job-name); "" = pod name.
    k8s_job_label: str = ""
    rules: list[RuleConfig] = field(default_factory=list)
    max_jobs: int = 1000
    job_idle_timeout: Duration = field(default_factory=lambda: Duration(600.0))
    overflow_job_id: str = "overflow"

    def validate(self) -> None:
        require(self.refresh_interval > 0, "refresh_interval", "must be positive")
        require(self.cache_ttl >= 0, "cache_ttl", "must not be negative")
        require(self.max_jobs >= 1, "max_jobs", "must be at least 1")
        require(self.job_idle_timeout > 0, "job_idle_timeout", "must be positive")
        require(self.overflow_job_id not in UNSET_JOBS, "overflow_job_id", "must name a job id")
        require(bool(self.precision_env), "precision_env", "must not be empty")
