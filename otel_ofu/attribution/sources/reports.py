"""Reports: the job of what a training process says about itself (its MFU, TFLOP/s per GPU).

A report names its process by its own resource (a pod, a Slurm job, or a pid on this node:
:mod:`otel_ofu.attribution.reports`); that goes through the same naming as a GPU's claims, so a
report from any rank names the whole job (docs/audit.md). With the Kubernetes API source, the
report is taken only from the pod it names (:mod:`otel_ofu.attribution.senders`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
from typing import Any

from otel_ofu.attribution import JOB_RUN, JOB_SOURCE, K8S_NAMESPACE, K8S_POD_NAME
from otel_ofu.attribution.claims import Claim
from otel_ofu.attribution.config import UNSET_JOBS, AttributionProcessorConfig
from otel_ofu.attribution.reports import REPORT_SOURCE, resource_claim, resource_pid
from otel_ofu.attribution.resolver import Resolver
from otel_ofu.attribution.senders import check_sender
from otel_ofu.attribution.sources.kubernetes_api import PodSource
from otel_ofu.attribution.sources.processes import ProcessSource
from otel_ofu.core.metrics import MetricInfo, register
from otel_ofu.core.model import HOST_NAME, JOB_ID, MetricPoint, attrs, job_id_of
from otel_ofu.pipeline.telemetry import Telemetry

REPORTS_METRIC = register(MetricInfo(
    "otel_ofu.attribution.reports", "{point}", "sum",
    "Points a training process reported about itself (report_metrics: MFU, TFLOP/s), by outcome: attributed "
    "(named from its pod, Slurm job or process), kept (it carried ofu.job.id), no_identity (nothing names its job), "
    "refused (sent from another address than the pod it names: otel_ofu.attribution.reports.refused).",
    emitted_by=("processors/attribution",)))
REFUSED_METRIC = register(MetricInfo(
    "otel_ofu.attribution.reports.refused", "{point}", "sum",
    "Reports dropped because their sender may not speak for the pod or job they name (report_sender), by reason: "
    "unknown_pod (a pod this node does not run), other_address (a pod of this node, or its job, from another "
    "address), other_job (a pod of this node naming another job).",
    emitted_by=("processors/attribution",)))
MAX_LOGGED = 1024  # distinct reporters and refusals remembered as said (then it starts over)


class ReportSource:
    """Names the job of a training process's report, as the resolver names a GPU's."""

    def __init__(self, config: AttributionProcessorConfig, resolver: Resolver, pods: PodSource | None,
                 processes: ProcessSource, telemetry: Telemetry, log: logging.Logger):
        self.config, self.resolver, self.pods, self.processes = config, resolver, pods, processes
        self.telemetry, self.log = telemetry, log
        self.names = frozenset(config.report_metrics)
        self._trusted_senders = config.report_sender.networks()
        self._no_identity_logged: set[tuple[str, str]] = set()
        self._refused_logged: set[tuple[str, str]] = set()

    def annotate(self, point: MetricPoint, peer: str | None = None) -> MetricPoint | None:
        """Give a training process's report (MFU, TFLOP/s) the ``ofu.job.id`` its GPUs get.

        The process is named by its own resource: a pod, a Slurm job, or a pid on this node
        (through its cgroup and environment). Those go through the same sources and rules of
        naming as GPU claims (the Kubernetes API, ``k8s_job_label``, ``slurm:<id>``), so a
        report from any rank names the whole job. A point that already carries a job id keeps it.

        ``peer``: the address the report came from. With the Kubernetes API source, a report
        that its sender may not send (another pod's, from another address) is counted, logged
        and dropped: None (:mod:`otel_ofu.attribution.senders`); one from a pod of this node
        naming no pod is that pod's.
        """
        carried = job_id_of(point)
        carried = carried if carried not in UNSET_JOBS else None
        sender = None
        if peer is not None and self.pods is not None and self.config.report_sender.verify and not self._trusted(peer):
            verdict = check_sender(peer, dict(point.resource), carried, self.pods.watcher)
            if verdict.refused is not None:
                self._refuse(point, peer, verdict.refused, verdict.message)
                return None
            sender = verdict.sender
        if carried is not None:
            self.telemetry.add(REPORTS_METRIC.name, 1, outcome="kept")
            return point
        resource = dict(point.resource)
        if sender is not None:
            claim: Claim | None = Claim(("k8s", sender.namespace, sender.name), REPORT_SOURCE,
                                        {K8S_NAMESPACE: sender.namespace, K8S_POD_NAME: sender.name})
        else:
            claim = resource_claim(resource) or self._pid_claim(resource)
        if claim is None:
            self.telemetry.add(REPORTS_METRIC.name, 1, outcome="no_identity")
            self._log_no_identity(point, resource)
            return point
        if claim.key[0] == "slurm" and claim.key[1] in self.resolver.hpc_only:
            claim.job_id = claim.key[1]
        claim = self.resolver.complete(claim)
        resource[JOB_ID] = self.resolver.job_id(claim)
        for key, value in claim.resource.items():
            resource.setdefault(key, value)
        if claim.run:
            resource[JOB_RUN] = claim.run
        resource[JOB_SOURCE] = "+".join(sorted(set(claim.source.split("+"))))
        self.telemetry.add(REPORTS_METRIC.name, 1, outcome="attributed")
        attributes = tuple(item for item in point.attributes if item[0] != JOB_ID)
        return dataclasses.replace(point, resource=attrs(resource), attributes=attributes)

    def _trusted(self, peer: str) -> bool:
        if not self._trusted_senders:
            return False
        address = ipaddress.ip_address(peer)
        return any(address in network for network in self._trusted_senders)

    def _refuse(self, point: MetricPoint, peer: str, reason: str, message: str) -> None:
        """Count a report whose sender may not send it, and say so once per sender and claim."""
        self.telemetry.add(REPORTS_METRIC.name, 1, outcome="refused")
        self.telemetry.add(REFUSED_METRIC.name, 1, reason=reason)
        key = (peer, message)
        if key in self._refused_logged:
            return
        if len(self._refused_logged) >= MAX_LOGGED:
            self._refused_logged.clear()
        self._refused_logged.add(key)
        self.log.warning("attribution: refused a %s report from %s: it %s. A report is taken only from the pod it "
                         "names (docs/deploy.md#threat-model; a Collector that forwards reports: "
                         "report_sender.trusted). Counted in otel_ofu_attribution_reports_refused_total{reason=%s}; "
                         "logged once per sender and claim.", point.name, peer, message, reason)

    def _pid_claim(self, resource: dict[str, Any]) -> Claim | None:
        """The Slurm job or pod of a reporting process on this node, from /proc (processes source)."""
        pid = resource_pid(resource)
        if (pid is None or not self.config.processes.enabled
                or str(resource.get(HOST_NAME)) not in self.processes.local_hosts):
            return None
        return self.processes.claim_of(pid)

    def _log_no_identity(self, point: MetricPoint, resource: dict[str, Any]) -> None:
        key = (str(resource.get("service.name", "")), str(resource.get(HOST_NAME, "")))
        if key in self._no_identity_logged:
            return
        if len(self._no_identity_logged) >= MAX_LOGGED:
            self._no_identity_logged.clear()
        self._no_identity_logged.add(key)
        self.log.warning("attribution: %s from service.name=%r host.name=%r names no job: its resource has no "
                         "k8s.pod.name + k8s.namespace.name, slurm.job.id or (with the processes source) a "
                         "process.pid on this node, nor ofu.job.id (docs/audit.md). Logged once per reporter.",
                         point.name, key[0] or None, key[1] or None)
