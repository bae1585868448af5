"""The ``scrape`` source: the pod or HPC job a sample's own labels name (``sample_labels``).

dcgm-exporter in Kubernetes mode labels each GPU series with the pod holding it (``pod``,
``namespace``, ``container``, ``pod_uid``: the ``k8s.*`` resource attributes), with DRA its claim
(``dra_claim_*``: every pod the claim is reserved for holds the GPU), and on Slurm the ``hpc_job``
(``hpc.job.id``). A host whose samples carry pod labels maps every GPU a pod holds, so there a GPU
sample without them is idle.
"""

from __future__ import annotations

from collections import OrderedDict

from otel_ofu.attribution import (
    DRA_MIG_PROFILE,
    HPC_JOB_ID,
    K8S_POD_NAME,
    K8S_RESOURCECLAIM_NAME,
    K8S_RESOURCECLAIM_NAMESPACE,
)
from otel_ofu.attribution.claims import Claim, k8s_key
from otel_ofu.attribution.sources import Copy, Device, Source
from otel_ofu.attribution.sources.dra import DraSource
from otel_ofu.core.model import GPU_MIG_INSTANCE, GPU_MIG_PROFILE, GpuSample

MAX_POD_LABEL_HOSTS = 65536  # hosts remembered as labelling GPUs with pods (a large gateway's nodes)


class SampleLabelSource(Source):
    name = "scrape"

    def __init__(self, dra: DraSource | None = None):
        self.dra = dra
        # Hosts whose samples have carried pod labels (dcgm-exporter in Kubernetes mode maps every
        # GPU a pod holds): there a GPU sample without them is idle. Least recently seen first.
        self._pod_label_hosts: OrderedDict[str, None] = OrderedDict()
        self._generation = 0  # counts the hosts noted and forgotten (what idle() answers from)

    def note(self, samples: list[GpuSample]) -> None:
        """Hosts whose page labels GPUs with pods, before any GPU of the batch is named."""
        hosts = self._pod_label_hosts
        for sample in samples:
            if not sample.resource.get(K8S_POD_NAME):
                continue
            host = sample.host
            if host in hosts:
                hosts.move_to_end(host)
                continue
            hosts[host] = None
            while len(hosts) > MAX_POD_LABEL_HOSTS:
                hosts.popitem(last=False)
            self._generation += 1

    def version(self) -> int:
        """Changes when a host is noted or forgotten; the pods and jobs it names are the sample's own
        (the DRA source answers for the claims it completes them with)."""
        return self._generation

    def claims(self, device: Device) -> list[Claim]:
        """The pod (or HPC job) each copy of the device names, with its pod's use when the copy gives it:
        a GPU dcgm-exporter repeats per pod (--kubernetes-virtual-gpus) is held by every pod it names."""
        claims: list[Claim] = []
        seen: set[tuple[str, ...]] = set()  # two copies naming one pod (two replicas it holds) are one holder
        pods = measured = 0  # copies naming a pod, and those that give its use
        for copy in device.copies or (Copy(device.resource),):
            resource = copy.resource
            k8s = {k: str(v) for k, v in resource.items() if k.startswith("k8s.") and v not in (None, "")}
            key = k8s_key(k8s)
            if key:
                pods += 1
                measured += copy.use is not None
            if key and key not in seen and not _other_mig_profile(resource):
                seen.add(key)
                claims.append(Claim(key, self.name, k8s, use=copy.use))
                name, namespace = k8s.get(K8S_RESOURCECLAIM_NAME), k8s.get(K8S_RESOURCECLAIM_NAMESPACE)
                if name and namespace and self.dra is not None:
                    claims += self.dra.consumers(namespace, name, k8s.get(K8S_POD_NAME))
            hpc = resource.get(HPC_JOB_ID)
            if hpc:
                claims.append(Claim(("hpc", str(hpc)), "hpc_job", {HPC_JOB_ID: str(hpc)}, job_id=str(hpc)))
        if pods and measured == pods:
            device.measured = True  # dcgm-exporter gives every pod of the GPU its use (0 when idle)
        return claims

    def idle(self, device: Device) -> str | None:
        """"scrape" when this host's samples carry pod labels for the GPUs pods hold, so one without
        them is idle; else None (nothing says)."""
        return self.name if device.host in self._pod_label_hosts else None


def _other_mig_profile(resource: dict) -> bool:
    """dcgm-exporter labels every MIG instance of a GPU with every pod holding a DRA MIG device
    of it: a pod whose device has another profile than this instance does not hold it."""
    own, held = resource.get(GPU_MIG_PROFILE), resource.get(DRA_MIG_PROFILE)
    return resource.get(GPU_MIG_INSTANCE) not in (None, "") and bool(own) and bool(held) and own != held
