"""The ``k8s_api`` source: what the Kubernetes API says about the pods other sources name.

It names no holder itself: it completes a pod's claim (from the kubelet, a page's labels, a
process's cgroup UID) with the pod's job (:mod:`otel_ofu.attribution.k8s_identity`), run, declared
precision, UID and copied labels, so all pods of one job get one ``ofu.job.id``
(docs/kubernetes-attribution.md). Its watch of the node's pods (:class:`~otel_ofu.attribution.k8s_api.PodWatcher`)
is also what the DRA source and the report-sender check read.
"""

from __future__ import annotations

from otel_ofu.attribution import JOB_KIND, K8S_NAMESPACE, K8S_POD_NAME, K8S_POD_UID
from otel_ofu.attribution.claims import Claim
from otel_ofu.attribution.k8s_api import PodRecord, PodWatcher
from otel_ofu.attribution.sources import Source


class PodSource(Source):
    name = "k8s_api"

    def __init__(self, watcher: PodWatcher):
        self.watcher = watcher

    def version(self) -> int:
        return self.watcher.generation

    def complete(self, claim: Claim) -> Claim:
        """A pod's claim completed from the API: its job, declared precision, uid, labels.

        A pod known only by its uid (a cgroup) gets its name, so it joins the kubelet's claim.
        """
        record: PodRecord | None = None
        if claim.key[0] == "k8s":
            record = self.watcher.pod(claim.key[1], claim.key[2])
        elif claim.key[0] == "k8s-uid":
            record = self.watcher.pod_by_uid(claim.key[1])
        if record is None:
            return claim
        resource = {**claim.resource, K8S_NAMESPACE: record.namespace, K8S_POD_NAME: record.name, **record.labels}
        if record.uid:
            resource[K8S_POD_UID] = record.uid
        if record.job.kind:
            resource[JOB_KIND] = record.job.kind
        # The pod's own declaration wins over its processes' environment.
        precisions = {record.precision} if record.precision else claim.precisions
        source = "+".join(sorted({*claim.source.split("+"), self.name}))
        return Claim(("k8s", record.namespace, record.name), source, resource, precisions, record.job_id,
                     record.job.run, claim.use)
