"""A claim: one job's hold on one GPU as one source saw it, and how claims merge.

Sources disagree in what they know (the kubelet names pods but not their UIDs, cgroups give
UIDs but not names, the dcgm-exporter gives labels), so claims are merged by the job's
identity first and only then named; two names for one pod never look like a shared GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from otel_ofu.attribution import K8S_NAMESPACE, K8S_POD_NAME, K8S_POD_UID

SHARED_SEPARATOR = ","


@dataclass
class Claim:
    """``key`` identifies the job across sources, e.g. ("k8s", ns, pod) or ("slurm", id)."""

    key: tuple[str, ...]
    source: str
    resource: dict[str, str] = field(default_factory=dict)
    precisions: set[str] = field(default_factory=set)  # normalised, known precisions only
    job_id: str | None = None  # explicit id (hpc_job); otherwise derived from key and resource
    run: str = ""  # the job's incarnation (ofu.job.run), when known
    # Its use of the device in the window, where a source measures each holder's (its processes' SM
    # utilization, percent): what a shared device is split by. None: not measured.
    use: float | None = None

    def absorb(self, other: Claim) -> None:
        """Merge what another source knows about the same job (first value wins; uses add up: two
        processes of one pod use the device together)."""
        for k, v in other.resource.items():
            self.resource.setdefault(k, v)
        self.precisions |= other.precisions
        self.run = self.run or other.run
        if other.use is not None:
            self.use = other.use if self.use is None else self.use + other.use
        if other.source not in self.source.split("+"):
            self.source = "+".join(sorted({*self.source.split("+"), other.source}))


def k8s_key(resource: dict[str, str]) -> tuple[str, ...] | None:
    ns, pod, uid = resource.get(K8S_NAMESPACE), resource.get(K8S_POD_NAME), resource.get(K8S_POD_UID)
    if ns and pod:
        return ("k8s", ns, pod)
    if uid:
        return ("k8s-uid", uid)
    return None


def merge(claims: list[Claim]) -> list[Claim]:
    """Merge claims naming the same job: an hpc_job id joins the Slurm job with that id; a
    UID-only pod joins the named pod with that UID, or the only named pod without a UID when
    exactly one of each is on the GPU."""
    if len(claims) < 2:  # nothing to merge (each claim a caller passes is its own object)
        return list(claims)
    by_key: dict[tuple[str, ...], Claim] = {}
    for claim in claims:
        if claim.key in by_key:
            by_key[claim.key].absorb(claim)
        else:
            by_key[claim.key] = Claim(claim.key, claim.source, dict(claim.resource), set(claim.precisions),
                                      claim.job_id, claim.run, claim.use)
    for key in [k for k in by_key if k[0] == "hpc" and ("slurm", k[1]) in by_key]:
        by_key[("slurm", key[1])].absorb(by_key.pop(key))  # dcgm-exporter's hpc_job is the Slurm job id
    named = [c for c in by_key.values() if c.key[0] == "k8s"]
    uid_only = [c for c in by_key.values() if c.key[0] == "k8s-uid"]
    for orphan in uid_only:
        uid = orphan.key[1]
        target = next((c for c in named if c.resource.get(K8S_POD_UID) == uid), None)
        if target is None and len(named) == 1 and len(uid_only) == 1 and K8S_POD_UID not in named[0].resource:
            target = named[0]
        if target is not None:
            target.absorb(orphan)
            del by_key[orphan.key]
        elif named:
            # Named pods hold the GPU and this UID cannot be joined to one of them: its
            # processes belong to one of those pods (or a pod the kubelet did not give the GPU
            # to); counting it as another job would invent sharing.
            del by_key[orphan.key]
    return list(by_key.values())
