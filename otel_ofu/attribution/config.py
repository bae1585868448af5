"""The ``attribution`` processor's config (docs/components/processors/attribution.md lists every key)."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from otel_ofu.attribution.kubelet import DEFAULT_DRA_DRIVERS, DEFAULT_RESOURCE_NAMES, DEFAULT_SOCKET
from otel_ofu.attribution.rules import RuleConfig
from otel_ofu.core.metrics import TRAINING_REPORT_METRICS
from otel_ofu.core.model import NO_JOB
from otel_ofu.pipeline.config import Duration, invalid, require, warn

# Job ids that mean "no job known": attribution may fill these in without ``override``.
UNSET_JOBS = frozenset({"", NO_JOB, "unknown"})


@dataclass
class KubeletSourceConfig:
    """The kubelet pod-resources API: the pod, namespace and container holding each GPU."""

    enabled: bool = False  # use the kubelet's pod-resources API (the socket mounted from the host)
    socket: str = DEFAULT_SOCKET  # its unix socket
    timeout: Duration = field(default_factory=lambda: Duration(2.0))  # bound on one List call
    # Device-plugin resource names (globs) whose devices are GPUs.
    resource_names: list[str] = field(default_factory=lambda: list(DEFAULT_RESOURCE_NAMES))

    def validate(self) -> None:
        require(self.timeout > 0, "timeout", "must be positive")
        require(bool(self.socket), "socket", "must not be empty")
        require(bool(self.resource_names), "resource_names", "give at least one resource name")


NODE_NAME_ENV = "K8S_NODE_NAME"
NO_NODE_NAME = (f"no node name: set it, or the {NODE_NAME_ENV} environment variable from the downward API "
                "(fieldRef fieldPath: spec.nodeName)")


def node_name(config: KubernetesApiSourceConfig) -> str:
    """The node whose pods are watched: node_name, else the K8S_NODE_NAME environment variable."""
    return config.node_name or os.environ.get(NODE_NAME_ENV, "")


def client_configuration(config: KubernetesApiSourceConfig) -> Any:
    """The API client's configuration from the kubeconfig (its context), or the pod's service account
    (in-cluster); ValueError says why it cannot be loaded. Validation and start load it the same way."""
    from kubernetes import client
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    try:
        if config.kubeconfig:
            kube_config.load_kube_config(config_file=config.kubeconfig, context=config.context or None,
                                         client_configuration=configuration, persist_config=False)
        else:
            kube_config.load_incluster_config(client_configuration=configuration)
    except (kube_config.ConfigException, OSError) as exc:
        where = (f"kubeconfig {config.kubeconfig}" if config.kubeconfig else
                 "in-cluster config (not running in a pod? set kubernetes_api.kubeconfig)")
        raise ValueError(f"cannot load the {where}: {exc}") from None
    return configuration


@dataclass
class KubernetesApiSourceConfig:
    """The pods of this node from the Kubernetes API: job identity, precision annotation, labels
    (docs/kubernetes-attribution.md)."""

    enabled: bool = False  # watch this node's pods (read-only RBAC on pods)
    # The node whose pods are watched; "" = the K8S_NODE_NAME environment variable (set it from
    # the downward API, fieldPath spec.nodeName).
    node_name: str = ""
    # A kubeconfig file; "" = the in-cluster config (the pod's service account, its token
    # re-read as the kubelet rotates it).
    kubeconfig: str = ""
    context: str = ""  # kubeconfig context; "" = its current context
    # Pod labels copied as k8s.pod.label.<key> resource attributes: regular expressions matched
    # against the whole key, like dcgm-exporter's --kubernetes-pod-label-allowlist-regex.
    copy_labels: list[str] = field(default_factory=list)
    # Owner kinds read from the API to follow the owner chain when the job's name cannot be
    # derived from the pod (e.g. RayCluster -> RayJob); "Kind" or "Kind.group". Each needs RBAC
    # get on that resource.
    owner_lookups: list[str] = field(default_factory=list)
    # Failing this long marks the source stale (the last known pods are still used).
    stale_after: Duration = field(default_factory=lambda: Duration(60.0))
    # Server-side length of one watch request: between this and twice it (randomized).
    watch_timeout: Duration = field(default_factory=lambda: Duration(300.0))
    request_timeout: Duration = field(default_factory=lambda: Duration(10.0))  # bound on one connect, list or get
    # Backoff between retries of failed requests, doubling per failure:
    retry_initial_interval: Duration = field(default_factory=lambda: Duration(1.0))  # the first delay
    retry_max_interval: Duration = field(default_factory=lambda: Duration(30.0))  # the longest delay

    def validate(self) -> None:
        for i, pattern in enumerate(self.copy_labels):
            try:
                re.compile(pattern)
            except re.error as exc:
                invalid(f"copy_labels[{i}]", f"not a regular expression ({exc}): {pattern!r}")
        for i, kind in enumerate(self.owner_lookups):
            require(bool(re.fullmatch(r"[A-Za-z][A-Za-z0-9]*(\.[a-z0-9.-]+)?", kind)), f"owner_lookups[{i}]",
                    f"expected a kind such as RayCluster or Job.batch, got {kind!r}")
        if self.enabled:  # what the source checks when it starts (otel-ofu run), in this environment
            require(bool(node_name(self)), "node_name", NO_NODE_NAME)
            try:
                client_configuration(self)
            except ValueError as exc:
                if self.kubeconfig:
                    invalid("kubeconfig", str(exc))
                else:  # where it runs, not the config: a pod has its service account
                    warn("kubeconfig", f"{exc} (otel-ofu run refuses to start here; in a pod it reads the pod's "
                                       "service account)")
        require(self.stale_after > 0, "stale_after", "must be positive")
        require(self.watch_timeout >= 1, "watch_timeout", "must be at least 1s")
        require(self.request_timeout > 0, "request_timeout", "must be positive")
        require(self.retry_initial_interval > 0, "retry_initial_interval", "must be positive")
        require(self.retry_max_interval >= self.retry_initial_interval, "retry_max_interval",
                "must not be below retry_initial_interval")


@dataclass
class DraConfig:
    """GPUs allocated by Dynamic Resource Allocation, resource.k8s.io/v1 (docs/kubernetes-attribution.md#dra)."""

    # DRA drivers whose devices are GPUs (NVIDIA's DRA driver for GPUs); [] turns DRA off. The
    # kubelet source reads their devices from the pod-resources API; the kubernetes_api source
    # watches their ResourceSlices of this node, which say which GPU each device is.
    drivers: list[str] = field(default_factory=lambda: list(DEFAULT_DRA_DRIVERS))
    # With the kubernetes_api source: read the ResourceClaims this node's pods use (get only).
    # Without the kubelet source they map GPUs to pods; they also give the consumers of a claim
    # that dcgm-exporter's dra_claim_* labels name (a claim shared by pods is a shared GPU).
    resource_claims: bool = True

    def validate(self) -> None:
        for i, driver in enumerate(self.drivers):
            require(bool(re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", driver or "")), f"drivers[{i}]",
                    f"expected a DRA driver name such as gpu.nvidia.com, got {driver!r}")


@dataclass
class ProcessSourceConfig:
    """The GPUs' processes: pod UID and Slurm job from /proc/PID/cgroup, Slurm details and the
    declared precision from /proc/PID/environ."""

    enabled: bool = False  # read each GPU process's cgroup and environment
    # The host's /proc (e.g. /host/proc in a container); NVML reports host pids.
    proc_root: str = "/proc"
    # Where GPU pids come from: ``process.pid`` on samples (an nvml receiver) and/or NVML here.
    pid_sources: list[Literal["samples", "nvml"]] = field(default_factory=lambda: ["samples"])
    pid_ttl: Duration = field(default_factory=lambda: Duration(60.0))  # forget a sample's pids unseen this long
    # With pid_sources nvml: each process's SM utilization since the last refresh (NVML
    # nvmlDeviceGetProcessUtilization), what a GPU several jobs share is split by (docs/sharing.md).
    utilization: bool = True
    # Keep process.pid on the samples; dropped by default, as pids on points multiply series.
    keep_pid_attribute: bool = False

    def validate(self) -> None:
        require(bool(self.proc_root), "proc_root", "must not be empty")
        require(self.pid_ttl > 0, "pid_ttl", "must be positive")


@dataclass
class ReportSenderConfig:
    """Who may send a training job's report: with the ``kubernetes_api`` source on, a report that
    arrived over the network (the ``otlp`` receiver) is taken only from the pod it names, by its
    address (its page's "Who may send a report"; the threat model: docs/deploy.md)."""

    # Check each report's sender address against the pod (or the job) it names; false takes every
    # report as it names itself.
    verify: bool = True
    # Addresses or networks (CIDR) whose reports are taken as they name themselves: a Collector or
    # proxy that forwards its node's reports.
    trusted: list[str] = field(default_factory=list)

    def validate(self) -> None:
        for i, text in enumerate(self.trusted):
            try:
                ipaddress.ip_network(str(text).strip(), strict=False)
            except ValueError:
                invalid(f"trusted[{i}]", f"expected an IP address or a network such as 10.0.0.0/8, got {text!r}")

    def networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(str(text).strip(), strict=False) for text in self.trusted]


@dataclass
class AttributionProcessorConfig:
    # How often the sources are polled (on a background thread; the hot path reads the last answer).
    refresh_interval: Duration = field(default_factory=lambda: Duration(10.0))
    # How long a failing source's last good answer is still used; after that it counts as empty.
    cache_ttl: Duration = field(default_factory=lambda: Duration(30.0))
    # Replace the job id / precision / k8s attributes a sample already carries (e.g. from the sim).
    override: bool = False
    kubelet: KubeletSourceConfig = field(default_factory=KubeletSourceConfig)
    processes: ProcessSourceConfig = field(default_factory=ProcessSourceConfig)
    kubernetes_api: KubernetesApiSourceConfig = field(default_factory=KubernetesApiSourceConfig)
    dra: DraConfig = field(default_factory=DraConfig)
    # Use k8s.* and hpc.job.id already on the sample (dcgm-exporter labels, upstream processors).
    sample_labels: bool = True
    # Pod annotation/label declaring the job's precision (from the Kubernetes API, or
    # k8s.pod.annotation.<key> / k8s.pod.label.<key> on the sample).
    precision_key: str = "ofu.dev/precision"
    precision_env: str = "OFU_PRECISION"  # process environment variable declaring it
    # Pod label naming the job across its pods, tried before every built-in rule of the
    # Kubernetes API source; "" = those rules (or, without that source, the pod name).
    k8s_job_label: str = ""
    rules: list[RuleConfig] = field(default_factory=list)  # job id and/or precision by UUID, host or attribute
    # Metrics a training process reports about itself (its MFU, TFLOP/s per GPU): a point of
    # one of these without ofu.job.id gets the job of the process that sent it, named from its
    # resource (pod, Slurm job, or pid on this node) like its GPUs (docs/audit.md).
    report_metrics: list[str] = field(default_factory=lambda: list(TRAINING_REPORT_METRICS))
    report_sender: ReportSenderConfig = field(default_factory=ReportSenderConfig)
    max_jobs: int = 1000  # distinct job ids at a time (the series bound)
    # A job not seen this long (data time) frees its slot.
    job_idle_timeout: Duration = field(default_factory=lambda: Duration(600.0))
    # The job id of jobs over max_jobs (they also lose their per-job attributes).
    overflow_job_id: str = "overflow"

    def validate(self) -> None:
        require(self.refresh_interval > 0, "refresh_interval", "must be positive")
        require(self.cache_ttl >= 0, "cache_ttl", "must not be negative")
        require(self.max_jobs >= 1, "max_jobs", "must be at least 1")
        require(self.job_idle_timeout > 0, "job_idle_timeout", "must be positive")
        require(self.overflow_job_id not in UNSET_JOBS, "overflow_job_id", "must name a job id")
        require(bool(self.precision_env), "precision_env", "must not be empty")
        for i, name in enumerate(self.report_metrics):
            require(isinstance(name, str) and bool(name.strip()), f"report_metrics[{i}]", "must name a metric")
