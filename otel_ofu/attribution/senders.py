"""Whether a training job's report may speak for the pod it names: the sender's address against the pod's.

A report names its job through its resource (``k8s.pod.name``, ``ofu.job.id``, ...), which the
sender writes. Anyone who reaches the agent's OTLP port could name any pod and so forge a job's
MFU. The Kubernetes API source knows the addresses of its node's pods (``status.podIPs``), and
the ``otlp`` receiver knows the address a request came from (``Batch.peer``): a report naming a
pod of this node is taken only from that pod's address, one carrying a job id only from a pod of
that job, and a pod that names no pod is itself.

What cannot be checked, and is taken as it names itself: a pod on the host network (it shares
the node's addresses, and the node picks which one a connection comes from), a pod without an
address yet, a report naming no pod from an address that is no pod's (a Slurm job, a process),
and anything from a ``trusted`` address. docs/deploy.md#threat-model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from otel_ofu.attribution import K8S_NAMESPACE, K8S_POD_NAME, K8S_POD_UID
from otel_ofu.attribution.k8s_api import PodRecord, PodWatcher

# Why a report was refused (the ``reason`` of otel_ofu.attribution.reports.refused).
UNKNOWN_POD = "unknown_pod"  # it names a pod this node does not run
OTHER_ADDRESS = "other_address"  # it names a pod (or a job's pods) of this node, from another address
OTHER_JOB = "other_job"  # it came from a pod of this node and carries another job's id


@dataclass(frozen=True)
class Verdict:
    """A report's sender checked: refused (with the reason and what the report claimed), or taken;
    ``sender`` is the pod of this node the report came from, when its address says so."""

    refused: str | None = None
    message: str = ""
    sender: PodRecord | None = None


def check_sender(peer: str, resource: Mapping[str, Any], job_id: str | None, pods: PodWatcher) -> Verdict:
    """Whether a report from ``peer`` (its address) naming ``resource`` (and ``job_id``, when it
    carries one) may be taken, from what ``pods`` knows of this node's pods."""
    at_peer = pods.pods_at(peer)
    sender = at_peer[0] if len(at_peer) == 1 else None  # two: an address being reused, who it is is unclear
    namespace, name = str(resource.get(K8S_NAMESPACE) or ""), str(resource.get(K8S_POD_NAME) or "")
    uid = str(resource.get(K8S_POD_UID) or "")
    if uid or (namespace and name):
        named = pods.pod_by_uid(uid) if uid else pods.pod(namespace, name)
        claimed = f"pod {namespace}/{name}" if namespace and name else f"the pod with uid {uid}"
        if named is not None and namespace and name and (named.namespace, named.name) != (namespace, name):
            named, claimed = None, f"pod {namespace}/{name} with uid {uid}"  # the uid is another pod's
        if named is None:
            listed = "" if pods.synced.is_set() else " (its pods are not listed yet)"
            return Verdict(UNKNOWN_POD, f"names {claimed}, which is not a pod of node {pods.node}{listed}: a pod "
                                        "reports to the agent on its own node")
        if not named.ips:
            return Verdict()  # the host network, or no address yet: nothing to check against
        if peer in named.ips:
            return Verdict(sender=named)
        return Verdict(OTHER_ADDRESS, f"names {claimed} (address {', '.join(named.ips)}) but came from {peer}"
                                      f"{_whose(sender)}")
    if job_id is not None:
        if sender is not None:
            if sender.job_id == job_id:
                return Verdict(sender=sender)
            return Verdict(OTHER_JOB, f"carries ofu.job.id {job_id} but came from pod {sender.namespace}/"
                                      f"{sender.name}, of job {sender.job_id}")
        holders = sorted(f"{r.namespace}/{r.name}" for r in pods.pods() if r.job_id == job_id and r.ips)
        if holders:
            return Verdict(OTHER_ADDRESS, f"carries ofu.job.id {job_id}, the job of pod {', '.join(holders[:3])} on "
                                          f"node {pods.node}, but came from {peer}, an address of none of them")
        return Verdict()
    return Verdict(sender=sender)


def _whose(sender: PodRecord | None) -> str:
    return "" if sender is None else f", the address of pod {sender.namespace}/{sender.name}"
