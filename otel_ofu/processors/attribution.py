"""The ``attribution`` processor: names the job holding each GPU and the precision it runs in.

Place it before ``ofu`` (receiver -> attribution -> ofu -> ...): it sets ``sample.job_id``
(exported as ``ofu.job.id``), ``sample.precision`` and resource attributes (``k8s.*``,
``slurm.job.*``) on GPU samples. Sources, each optional: the kubelet pod-resources API,
GPU processes through /proc (cgroup and environment), dcgm-exporter labels already on the
sample, the Kubernetes API (which job a pod belongs to, its precision and labels; a watch on
its own thread), and static rules. Lookups run on a background thread every ``refresh_interval``; the
hot path reads the last snapshot, plus one /proc read for a pid it has not seen before.
docs/components/processors/attribution.md describes sources, precedence, attributes and limits.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from otel_ofu.attribution import (
    DRA_MIG_PROFILE,
    HPC_JOB_ID,
    JOB_KIND,
    JOB_RUN,
    JOB_SHARED,
    JOB_SOURCE,
    K8S_CONTAINER,
    K8S_NAMESPACE,
    K8S_POD_ANNOTATION_PREFIX,
    K8S_POD_LABEL_PREFIX,
    K8S_POD_NAME,
    K8S_POD_UID,
    K8S_RESOURCECLAIM_NAME,
    K8S_RESOURCECLAIM_NAMESPACE,
    PER_JOB_ATTRIBUTES,
    PROCESS_PID,
    SLURM_JOB_ID,
    slurm_job_id,
)
from otel_ofu.attribution.claims import SHARED_SEPARATOR, Claim, k8s_key, merge
from otel_ofu.attribution.config import UNSET_JOBS, AttributionProcessorConfig
from otel_ofu.attribution.k8s_api import PodRecord, PodWatcher
from otel_ofu.attribution.k8s_dra import DeviceRef, DraGpu, DraWatcher
from otel_ofu.attribution.k8s_identity import job_id, labelled_pod_job
from otel_ofu.attribution.kubelet import DraHolder, KubeletClient, NodeAllocations, PodContainer
from otel_ofu.attribution.limits import JobLimiter
from otel_ofu.attribution.procfs import ProcessInfo, parse_pids, read_process
from otel_ofu.attribution.reports import REPORT_SOURCE, resource_claim, resource_pid
from otel_ofu.attribution.rules import RuleResult, evaluate
from otel_ofu.attribution.senders import check_sender
from otel_ofu.attribution.slurm import ENV_KEYS, slurm_attributes
from otel_ofu.core import specs
from otel_ofu.core.metrics import MetricInfo, register
from otel_ofu.core.model import (
    GPU_INDEX,
    GPU_MIG_INSTANCE,
    GPU_MIG_PROFILE,
    HOST_NAME,
    HW_ID,
    HW_MODEL,
    HW_VENDOR,
    JOB_ID,
    NO_JOB,
    Batch,
    GpuKey,
    GpuSample,
    MetricPoint,
    attrs,
    gpu_key,
    job_id_of,
)
from otel_ofu.pipeline.component import Context, Factory, Processor

OVERFLOW_METRIC = register(MetricInfo(
    "otel_ofu.attribution.overflow", "{sample}", "sum",
    "Samples whose job was over attribution's max_jobs and got the overflow job id instead."))
JOBS_METRIC = register(MetricInfo(
    "otel_ofu.attribution.jobs", "{job}", "gauge", "Distinct job ids attribution currently holds a slot for."))
REPORTS_METRIC = register(MetricInfo(
    "otel_ofu.attribution.reports", "{point}", "sum",
    "Points a training process reported about itself (report_metrics: MFU, TFLOP/s), by outcome: attributed "
    "(named from its pod, Slurm job or process), kept (it carried ofu.job.id), no_identity (nothing names its job), "
    "refused (sent from another address than the pod it names: otel_ofu.attribution.reports.refused)."))
REFUSED_METRIC = register(MetricInfo(
    "otel_ofu.attribution.reports.refused", "{point}", "sum",
    "Reports dropped because their sender may not speak for the pod or job they name (report_sender), by reason: "
    "unknown_pod (a pod this node does not run), other_address (a pod of this node, or its job, from another "
    "address), other_job (a pod of this node naming another job)."))
REFRESH_ERRORS_METRIC = register(MetricInfo(
    "otel_ofu.attribution.refresh.errors", "{error}", "sum",
    "Failed attribution lookups, by source (kubelet, pids); the last good answer is used for cache_ttl."))


PidProvider = Callable[[], dict[str, list[int]]]
MAX_POD_LABEL_HOSTS = 65536  # hosts remembered as labelling GPUs with pods (a large gateway's nodes)


@dataclass
class _Cached:
    """A source's last good answer and when it came (monotonic seconds)."""

    value: Any
    at: float | None = None
    failing: bool = False


class AttributionProcessor(Processor):
    def __init__(self, config: AttributionProcessorConfig, context: Context, *,
                 pid_provider: PidProvider | None = None, clock: Callable[[], float] = time.monotonic):
        super().__init__(config, context)
        self.pid_provider = pid_provider  # seam: tests inject {gpu uuid: [pids]}
        self._clock = clock
        self._kubelet: KubeletClient | None = None
        # The Kubernetes API source: also the place other code asks for a pod's job id.
        self.pods: PodWatcher | None = None
        self._nvml: Any = None
        self._kube = _Cached(NodeAllocations())  # the kubelet's last answer
        # The GPUs of DRA: the Kubernetes API source's ResourceSlices and ResourceClaims (with pods).
        self.dra: DraWatcher | None = None
        # Who holds each GPU, from the kubelet and DRA, rebuilt at each refresh (read by the hot
        # path as one object): GPU or MIG UUID, or "<parent uuid>/<MIG profile>" -> holders.
        self._holders: dict[str, list[PodContainer]] = {}
        # The GPUs the node's sources know exist (kubelet allocatable, DRA devices), same keys:
        # one of these that nobody holds is idle (ofu.job.id none), with the source that says so.
        self._node_gpus: dict[str, str] = {}
        self._dra_unmapped_logged = False
        # Hosts whose samples have carried pod labels (dcgm-exporter in Kubernetes mode maps every
        # GPU a pod holds): there a GPU sample without them is idle. Least recently seen first.
        self._pod_label_hosts: OrderedDict[str, None] = OrderedDict()
        self._provider_pids = _Cached({})  # uuid -> [pid]
        self._lock = threading.Lock()  # guards _sample_pids and _procs
        self._sample_pids: dict[GpuKey, tuple[list[int], float]] = {}  # by GPU: dmon/CSV GPUs have no UUID
        self._procs: dict[int, ProcessInfo | None] = {}
        self._env_keys = (*ENV_KEYS, config.precision_env)
        key = config.precision_key  # the pod annotation, pod label and attribute naming a job's precision
        self._precision_names = (K8S_POD_ANNOTATION_PREFIX + key, K8S_POD_LABEL_PREFIX + key, key) if key else ()
        self._limiter = JobLimiter(config.max_jobs, int(config.job_idle_timeout * 1e9), config.overflow_job_id)
        self._report_names = frozenset(config.report_metrics)
        # Slurm job ids GPUs know only through dcgm-exporter's hpc_job (job id as given, not
        # slurm:<id>): a report naming that Slurm job gets the same id. Least recently seen first.
        self._hpc_only: OrderedDict[str, None] = OrderedDict()
        # Hosts whose /proc this processor reads: a report's process.pid is looked up only there.
        self._local_hosts = {socket.gethostname()}
        self._no_identity_logged: set[tuple[str, str]] = set()
        self._trusted_senders = config.report_sender.networks()
        self._refused_logged: set[tuple[str, str]] = set()
        self._last_overflow_ns: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle and refresh (background) ----------------------------------------------

    def start(self) -> None:
        cfg = self.config
        if cfg.kubernetes_api.enabled:
            self.pods = PodWatcher(cfg.kubernetes_api, job_label=cfg.k8s_job_label, precision_key=cfg.precision_key,
                                   telemetry=self.context.telemetry, name=self.context.component_id)
            self.pods.start()
            if cfg.dra.drivers:
                self.dra = DraWatcher(cfg.kubernetes_api, cfg.dra.drivers, self.pods.session,
                                      telemetry=self.context.telemetry, name=self.context.component_id)
                self.dra.start()
        if cfg.kubelet.enabled or cfg.processes.enabled or self.dra is not None:
            self._thread = threading.Thread(target=self._run, name=self.context.component_id, daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:  # a source call in flight ends by its own timeout, or is left behind
            self._thread.join(timeout=self.time_left(30))
            if self._thread.is_alive():
                self.log.warning("a kubelet, NVML or /proc lookup was still running at the shutdown deadline "
                                 "(service.shutdown_timeout): not waited for")
        deadline = time.monotonic() + self.time_left(30)
        if self.dra is not None:
            self.dra.stop(deadline)
        if self.pods is not None:
            self.pods.stop(deadline)
        if self._kubelet is not None:
            self._kubelet.close()
        if self._nvml is not None:
            self._nvml.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:
                self.log.exception("attribution refresh failed; retrying next interval")
            self._stop.wait(self.config.refresh_interval)

    def refresh(self) -> None:
        """One poll of every enabled source; replaces the snapshots the hot path reads."""
        cfg = self.config
        if cfg.kubelet.enabled:
            if self._kubelet is None:
                self._kubelet = KubeletClient(cfg.kubelet.socket, float(cfg.kubelet.timeout),
                                              cfg.kubelet.resource_names, cfg.dra.drivers)
            self._poll("kubelet", self._kube, self._kubelet.allocations, NodeAllocations)
        if self.dra is not None and self.pods is not None and cfg.dra.resource_claims:
            self.dra.claims.sync(self._node_claims())
        self._holders, self._node_gpus = self._gpu_holders()
        if cfg.processes.enabled:
            provider = self.pid_provider
            if provider is None and "nvml" in cfg.processes.pid_sources:
                from otel_ofu.attribution.nvml import NvmlPids

                provider = self._nvml = self._nvml or NvmlPids()
            if provider is not None:
                self._poll("pids", self._provider_pids,
                           lambda: {str(k).strip().lower(): list(v) for k, v in provider().items()})
            self._refresh_processes()

    def _poll(self, source: str, cache: _Cached, fetch: Callable[[], Any], empty: Callable[[], Any] = dict) -> None:
        now = self._clock()
        try:
            cache.value, cache.at = fetch(), now
            if cache.failing:
                self.log.info("attribution source %s answers again", source)
            cache.failing = False
        except Exception as exc:
            self.context.telemetry.add(REFRESH_ERRORS_METRIC.name, 1, source=source)
            if not cache.failing:
                self.log.warning("attribution source %s failed (%s); using its last answer for %.0fs", source,
                                 exc, self.config.cache_ttl)
            cache.failing = True
            if cache.at is None or now - cache.at > self.config.cache_ttl:
                cache.value = empty()  # no stale attributes past the TTL

    # --- who holds each GPU: device plugin and DRA (background) ----------------------------------

    def _node_claims(self) -> dict[tuple[str, str], frozenset[str]]:
        """The ResourceClaims this node's pods use -> the pods using each."""
        assert self.pods is not None
        wanted: dict[tuple[str, str], set[str]] = {}
        for record in self.pods.pods():
            for claim, _ in record.claims:
                wanted.setdefault((record.namespace, claim), set()).add(record.name)
        return {k: frozenset(v) for k, v in wanted.items()}

    def _gpu_holders(self) -> tuple[dict[str, list[PodContainer]], dict[str, str]]:
        """Holders of every GPU from the kubelet (device plugin and DRA) and the API's claims, and
        the GPUs the node is known to have (key -> the source that knows it)."""
        allocations: NodeAllocations = self._kube.value
        holders: dict[str, list[PodContainer]] = {k: list(v) for k, v in allocations.by_uuid.items()}
        known = dict.fromkeys(allocations.allocatable or (), "kubelet")

        def add(gpu: DraGpu, holder: PodContainer) -> None:
            for key in _dra_keys(gpu, self.dra):
                found = holders.setdefault(key, [])
                if holder not in found:
                    found.append(holder)

        unmapped = []
        for (driver, pool, device), dra_holders in allocations.dra.items():
            ref = DeviceRef(driver, pool, device)
            gpu = self.dra.gpu(ref) if self.dra is not None else None
            if gpu is None:
                unmapped.append(f"{driver} pool {pool} device {device}")
                continue
            for dra_holder in dra_holders:
                if not self._admin_access(dra_holder, ref):
                    add(gpu, dra_holder.holder)
        if unmapped and not self._dra_unmapped_logged and (self.dra is None or self.dra.synced.is_set()):
            self._dra_unmapped_logged = True
            why = ("the kubernetes_api source is off: enable it (RBAC get/list/watch on resourceslices) to read "
                   "the DRA driver's ResourceSlices" if self.dra is None else
                   "no ResourceSlice of this node names their GPU (is the DRA driver running here?)")
            self.log.warning("kubelet pod-resources reports GPUs allocated by DRA (%s) that cannot be mapped to a "
                             "GPU UUID: %s (docs/kubernetes-attribution.md#dra)", ", ".join(unmapped[:3]), why)
        if self.dra is not None:
            for gpu in self.dra.slices.devices().values():
                for key in _dra_keys(gpu, self.dra):
                    known.setdefault(key, "k8s_api")
            if self.pods is not None and self.config.dra.resource_claims:
                for (namespace, claim), containers in self._claim_holders().items():
                    allocation = self.dra.claims.claim(namespace, claim)
                    for ref in allocation.devices if allocation is not None else ():
                        gpu = self.dra.gpu(ref)
                        if gpu is not None:
                            for holder in containers:
                                add(gpu, holder)
        return holders, known

    def _admin_access(self, holder: DraHolder, ref: DeviceRef) -> bool:
        """The kubelet lists a container's DRA devices without saying how they were allocated: its
        claim, as the API source read it, says whether this one is admin access (not a holder)."""
        if self.dra is None:
            return False
        allocation = self.dra.claims.claim(holder.claim_namespace, holder.claim_name)
        return allocation is not None and ref in allocation.admin_devices

    def _claim_holders(self) -> dict[tuple[str, str], list[PodContainer]]:
        """The containers of this node's pods using each claim, as the pods and the claim say
        (a claim reserved for other pods only is not theirs yet)."""
        assert self.pods is not None and self.dra is not None
        out: dict[tuple[str, str], list[PodContainer]] = {}
        for record in self.pods.pods():
            for claim, containers in record.claims:
                allocation = self.dra.claims.claim(record.namespace, claim)
                if allocation is None or (allocation.reserved_for and record.name not in allocation.reserved_for):
                    continue
                found = out.setdefault((record.namespace, claim), [])
                found += [PodContainer(record.namespace, record.name, c) for c in containers or ("",)]
        return out

    def _refresh_processes(self) -> None:
        """Re-read every pid some GPU still has: exited processes drop out here."""
        now = self._clock()
        with self._lock:
            ttl = self.config.processes.pid_ttl
            self._sample_pids = {u: e for u, e in self._sample_pids.items() if now - e[1] <= ttl}
            wanted = {pid for pids, _ in self._sample_pids.values() for pid in pids}
        wanted |= {pid for pids in self._provider_pids.value.values() for pid in pids}
        fresh = {pid: read_process(self.config.processes.proc_root, pid, self._env_keys) for pid in sorted(wanted)}
        with self._lock:
            self._procs = fresh

    # --- hot path ------------------------------------------------------------------------

    def process(self, batch: Batch) -> Batch:
        if self.config.sample_labels:  # hosts whose page labels GPUs with pods, before any GPU is named
            for sample in batch.samples:
                if sample.resource.get(K8S_POD_NAME):
                    self._note_pod_label_host(sample.host)
        overflowed: set[str] = set()
        samples_over = 0
        latest = 0
        renamed: dict[tuple[GpuKey, str], str] = {}  # (GPU, job id before) -> job id after
        for sample in batch.samples:
            before = sample.job_id or NO_JOB
            original = self.annotate(sample)
            if sample.job_id is not None and sample.job_id != before:
                renamed[(sample.gpu_key(), before)] = sample.job_id
            if original is not None:
                overflowed.add(original)
                samples_over += 1
                latest = max(latest, sample.time_unix_nano)
        if overflowed:
            self.context.telemetry.add(OVERFLOW_METRIC.name, samples_over)
            gap = self.config.job_idle_timeout * 1e9
            if self._last_overflow_ns is None or latest - self._last_overflow_ns > gap:
                self.log.warning("attribution: max_jobs=%d reached; %d job(s) mapped to ofu.job.id=%r (e.g. %s). "
                                 "Raise max_jobs or lower job_idle_timeout. Logged once per burst.",
                                 self.config.max_jobs, len(overflowed), self.config.overflow_job_id,
                                 ", ".join(sorted(overflowed)[:3]))
            self._last_overflow_ns = latest
        self.context.telemetry.set(JOBS_METRIC.name, len(self._limiter))
        points = batch.points
        if renamed and points:
            points = [_renamed(p, renamed) for p in points]
        if self._report_names and any(p.name in self._report_names for p in points):
            annotated = (self.annotate_report(p, batch.peer) if p.name in self._report_names else p for p in points)
            points = [p for p in annotated if p is not None]
        if points is not batch.points:
            batch = Batch(samples=batch.samples, points=points, passthrough=batch.passthrough, events=batch.events,
                          peer=batch.peer)
        return batch

    # --- what training processes report about themselves ---------------------------------

    def annotate_report(self, point: MetricPoint, peer: str | None = None) -> MetricPoint | None:
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
            verdict = check_sender(peer, dict(point.resource), carried, self.pods)
            if verdict.refused is not None:
                self._refuse(point, peer, verdict.refused, verdict.message)
                return None
            sender = verdict.sender
        if carried is not None:
            self.context.telemetry.add(REPORTS_METRIC.name, 1, outcome="kept")
            return point
        resource = dict(point.resource)
        if sender is not None:
            claim: Claim | None = Claim(("k8s", sender.namespace, sender.name), REPORT_SOURCE,
                                        {K8S_NAMESPACE: sender.namespace, K8S_POD_NAME: sender.name})
        else:
            claim = resource_claim(resource) or self._pid_claim(resource)
        if claim is None:
            self.context.telemetry.add(REPORTS_METRIC.name, 1, outcome="no_identity")
            self._log_no_identity(point, resource)
            return point
        if claim.key[0] == "slurm" and claim.key[1] in self._hpc_only:
            claim.job_id = claim.key[1]
        if self.pods is not None:
            claim = self._with_pod(claim)
        resource[JOB_ID] = self._job_id(claim)
        for key, value in claim.resource.items():
            resource.setdefault(key, value)
        if claim.run:
            resource[JOB_RUN] = claim.run
        resource[JOB_SOURCE] = "+".join(sorted(set(claim.source.split("+"))))
        self.context.telemetry.add(REPORTS_METRIC.name, 1, outcome="attributed")
        attributes = tuple(item for item in point.attributes if item[0] != JOB_ID)
        return dataclasses.replace(point, resource=attrs(resource), attributes=attributes)

    def _trusted(self, peer: str) -> bool:
        if not self._trusted_senders:
            return False
        address = ipaddress.ip_address(peer)
        return any(address in network for network in self._trusted_senders)

    def _refuse(self, point: MetricPoint, peer: str, reason: str, message: str) -> None:
        """Count a report whose sender may not send it, and say so once per sender and claim."""
        self.context.telemetry.add(REPORTS_METRIC.name, 1, outcome="refused")
        self.context.telemetry.add(REFUSED_METRIC.name, 1, reason=reason)
        key = (peer, message)
        if key in self._refused_logged:
            return
        if len(self._refused_logged) >= 1024:
            self._refused_logged.clear()
        self._refused_logged.add(key)
        self.log.warning("attribution: refused a %s report from %s: it %s. A report is taken only from the pod it "
                         "names (docs/deploy.md#threat-model; a Collector that forwards reports: "
                         "report_sender.trusted). Counted in otel_ofu_attribution_reports_refused_total{reason=%s}; "
                         "logged once per sender and claim.", point.name, peer, message, reason)

    def _pid_claim(self, resource: dict[str, Any]) -> Claim | None:
        """The Slurm job or pod of a reporting process on this node, from /proc (processes source)."""
        pid = resource_pid(resource)
        if pid is None or not self.config.processes.enabled or str(resource.get(HOST_NAME)) not in self._local_hosts:
            return None
        info = self._process(pid)
        if info is None:
            return None
        slurm = slurm_attributes(info)
        if slurm:
            return Claim(("slurm", slurm[SLURM_JOB_ID]), "slurm", slurm)
        if info.cgroup.pod_uid:
            return Claim(("k8s-uid", info.cgroup.pod_uid), "process", {K8S_POD_UID: info.cgroup.pod_uid})
        return None

    def _log_no_identity(self, point: MetricPoint, resource: dict[str, Any]) -> None:
        key = (str(resource.get("service.name", "")), str(resource.get(HOST_NAME, "")))
        if key in self._no_identity_logged:
            return
        if len(self._no_identity_logged) >= 1024:
            self._no_identity_logged.clear()
        self._no_identity_logged.add(key)
        self.log.warning("attribution: %s from service.name=%r host.name=%r names no job: its resource has no "
                         "k8s.pod.name + k8s.namespace.name, slurm.job.id or (with the processes source) a "
                         "process.pid on this node, nor ofu.job.id (docs/audit.md). Logged once per reporter.",
                         point.name, key[0] or None, key[1] or None)

    def _note_hpc_only(self, claims: list[Claim]) -> None:
        if len(claims) != 1 or claims[0].key[0] != "hpc":
            return
        hpc = claims[0].key[1]
        self._hpc_only[hpc] = None
        self._hpc_only.move_to_end(hpc)
        while len(self._hpc_only) > self.config.max_jobs:
            self._hpc_only.popitem(last=False)

    def annotate(self, sample: GpuSample) -> str | None:
        """Set job, precision and attributes on one sample; returns the job id if it overflowed.

        The sample's dicts are replaced, never mutated: pipelines share them (shallow copies).
        """
        cfg = self.config
        uuid = str(sample.uuid).strip().lower()
        resource, attributes = dict(sample.resource), dict(sample.attributes)
        pids = self._pids(uuid, sample.gpu_key(), resource, attributes)
        claims, loose_precisions = self._claims(uuid, resource, pids)
        self._note_hpc_only(claims)
        for claim in claims:  # named first: naming a pod from its labels adds its kind
            self._job_id(claim)
        if cfg.processes.enabled and len(self._local_hosts) < 64:
            self._local_hosts.add(str(sample.host))
        claim_resource = _merged_resource(claims)
        # What rules and precision labels look at: the sample's resource attributes, then the
        # claims' attributes, then the point attributes (later ones win). Built as a dict only
        # for rules; the precision labels read the same layers directly (no merge per sample).
        layers = (attributes, claim_resource, sample.resource)
        rule = evaluate(cfg.rules, uuid, sample.host, _view(layers, sample)) if cfg.rules else _NO_RULE

        existing = sample.job_id if sample.job_id not in UNSET_JOBS and sample.job_id is not None else None
        job = source = None
        from_claims = False
        if rule.job_id and rule.job_override:
            job, source = rule.job_id, "rule"
        elif existing and not cfg.override:
            job, source = existing, "sample"
        elif len(claims) == 1:  # the usual case: one job holds the GPU
            job, from_claims = self._job_id(claims[0]), True
            source = "+".join(sorted(set(claims[0].source.split("+"))))
            if claims[0].run:
                resource[JOB_RUN] = claims[0].run
        elif claims:
            ids = sorted({self._job_id(c) for c in claims})
            job, from_claims = SHARED_SEPARATOR.join(ids), True
            source = "+".join(sorted({s for c in claims for s in c.source.split("+")}))
            if len(ids) > 1:
                resource[JOB_SHARED] = True
        elif rule.job_id:
            job, source = rule.job_id, "rule"
        elif existing:
            job, source = existing, "sample"
        else:
            idle = self._known_idle(uuid, resource) or self._unlabelled_on_labelled_host(sample.host)
            if idle is not None:
                job, source = NO_JOB, idle

        if from_claims:
            for key, value in claim_resource.items():
                if cfg.override or key not in resource:
                    resource[key] = value

        metadata = {p for c in claims for p in c.precisions} | loose_precisions | self._label_precisions(layers, sample)
        sample.precision = self._precision(sample.precision, metadata, rule.precision, rule.precision_override)

        overflow = None
        if job is not None:
            if job != NO_JOB and not self._limiter.admit(job, sample.time_unix_nano):
                overflow, job = job, cfg.overflow_job_id
                for key in PER_JOB_ATTRIBUTES:
                    resource.pop(key, None)
            resource[JOB_SOURCE] = source
            sample.job_id = job
        sample.resource, sample.attributes = resource, attributes
        return overflow

    def _precision(self, existing: str | None, metadata: set[str], rule: str | None, rule_override: bool) -> str | None:
        known = specs.normalize_precision(existing)
        if rule and rule_override:
            return rule
        if known != specs.UNKNOWN_PRECISION and not self.config.override:
            return existing
        if len(metadata) == 1:
            return next(iter(metadata))
        if len(metadata) > 1:
            return specs.UNKNOWN_PRECISION  # the GPU's jobs disagree: DCGM cannot tell which
        if rule:
            return rule
        return existing

    def _pids(self, uuid: str, key: GpuKey, resource: dict[str, Any], attributes: dict[str, Any]) -> list[int]:
        pcfg = self.config.processes
        raw = attributes.get(PROCESS_PID, resource.get(PROCESS_PID))
        if not pcfg.keep_pid_attribute:
            attributes.pop(PROCESS_PID, None)
            resource.pop(PROCESS_PID, None)
        if not pcfg.enabled:
            return []
        now = self._clock()
        reported = parse_pids(raw) if "samples" in pcfg.pid_sources else None
        with self._lock:
            if reported is not None:
                self._sample_pids[key] = (reported, now)
                pids = set(reported)
            else:
                entry = self._sample_pids.get(key)
                pids = set(entry[0]) if entry and now - entry[1] <= pcfg.pid_ttl else set()
        pids.update(self._provider_pids.value.get(uuid, ()))
        return sorted(pids)

    def _process(self, pid: int) -> ProcessInfo | None:
        with self._lock:
            if pid in self._procs:
                return self._procs[pid]
        info = read_process(self.config.processes.proc_root, pid, self._env_keys)  # first sight: one small read
        with self._lock:
            self._procs[pid] = info
        return info

    def _claims(self, uuid: str, resource: dict[str, Any], pids: list[int]) -> tuple[list[Claim], set[str]]:
        cfg = self.config
        claims: list[Claim] = []
        if cfg.sample_labels:
            k8s = {k: str(v) for k, v in resource.items() if k.startswith("k8s.") and v not in (None, "")}
            key = k8s_key(k8s)
            if key and not _other_mig_profile(resource):
                claims.append(Claim(key, "scrape", k8s))
                claims += self._claim_consumers(k8s)
            hpc = resource.get(HPC_JOB_ID)
            if hpc:
                claims.append(Claim(("hpc", str(hpc)), "hpc_job", {HPC_JOB_ID: str(hpc)}, job_id=str(hpc)))
        holders = self._holders_of(uuid, resource)
        if holders:
            claims += _pod_claims(holders)
        loose: set[str] = set()
        for pid in pids:
            info = self._process(pid)
            if info is None:
                continue
            precision = specs.normalize_precision(info.environ.get(cfg.precision_env))
            precisions = {precision} if precision != specs.UNKNOWN_PRECISION else set()
            slurm = slurm_attributes(info)
            if slurm:
                claims.append(Claim(("slurm", slurm[SLURM_JOB_ID]), "slurm", slurm, precisions))
            elif info.cgroup.pod_uid:
                claims.append(Claim(("k8s-uid", info.cgroup.pod_uid), "process", {K8S_POD_UID: info.cgroup.pod_uid},
                                    precisions))
            else:
                loose |= precisions
        if self.pods is not None:
            claims = [self._with_pod(claim) for claim in claims]
        return merge(claims), loose

    def _claim_consumers(self, k8s: dict[str, str]) -> list[Claim]:
        """The pods a DRA claim named on the sample (dcgm-exporter's dra_claim_* labels) is
        reserved for: more than one is a GPU shared between them."""
        name, namespace = k8s.get(K8S_RESOURCECLAIM_NAME), k8s.get(K8S_RESOURCECLAIM_NAMESPACE)
        if not name or not namespace or self.dra is None:
            return []
        allocation = self.dra.claims.claim(namespace, name)
        if allocation is None:
            return []
        return [Claim(("k8s", namespace, pod), "k8s_api", {K8S_NAMESPACE: namespace, K8S_POD_NAME: pod})
                for pod in allocation.reserved_for if pod != k8s.get(K8S_POD_NAME)]

    def _holders_of(self, uuid: str, resource: dict[str, Any]) -> list[PodContainer] | None:
        """The kubelet's and DRA's holders of a GPU, or of a MIG instance by its own UUID or
        (for DRA) by its parent and profile."""
        holders = self._holders
        if resource.get(GPU_MIG_INSTANCE) not in (None, ""):
            mig_uuid = str(resource.get("gpu.mig.uuid") or "").lower()
            found = holders.get(mig_uuid) if mig_uuid else None
            if found is None and resource.get(GPU_MIG_PROFILE):
                found = holders.get(f"{uuid}/{resource[GPU_MIG_PROFILE]}")
            if found is not None:
                return found
        return holders.get(uuid)

    def _known_idle(self, uuid: str, resource: dict[str, Any]) -> str | None:
        """The source that knows this GPU exists on the node and that nobody holds it, else None."""
        keys = [uuid]
        if resource.get(GPU_MIG_INSTANCE) not in (None, ""):
            keys = [str(resource.get("gpu.mig.uuid") or "").lower(), f"{uuid}/{resource.get(GPU_MIG_PROFILE) or ''}"]
        return next((self._node_gpus[k] for k in keys if k in self._node_gpus), None)

    def _note_pod_label_host(self, host: str) -> None:
        hosts = self._pod_label_hosts
        if host in hosts:
            hosts.move_to_end(host)
            return
        hosts[host] = None
        while len(hosts) > MAX_POD_LABEL_HOSTS:
            hosts.popitem(last=False)

    def _unlabelled_on_labelled_host(self, host: str) -> str | None:
        """"scrape" when this host's samples carry pod labels for the GPUs pods hold (see
        _pod_label_hosts), so one without them is idle; else None (nothing says)."""
        return "scrape" if self.config.sample_labels and host in self._pod_label_hosts else None

    def _with_pod(self, claim: Claim) -> Claim:
        """A pod's claim completed from the Kubernetes API: its job, declared precision, uid, labels.

        A pod known only by its uid (a cgroup) gets its name, so it joins the kubelet's claim.
        """
        pods = self.pods
        record: PodRecord | None = None
        if claim.key[0] == "k8s":
            record = pods.pod(claim.key[1], claim.key[2])
        elif claim.key[0] == "k8s-uid":
            record = pods.pod_by_uid(claim.key[1])
        if record is None:
            return claim
        resource = {**claim.resource, K8S_NAMESPACE: record.namespace, K8S_POD_NAME: record.name, **record.labels}
        if record.uid:
            resource[K8S_POD_UID] = record.uid
        if record.job.kind:
            resource[JOB_KIND] = record.job.kind
        # The pod's own declaration wins over its processes' environment.
        precisions = {record.precision} if record.precision else claim.precisions
        source = "+".join(sorted({*claim.source.split("+"), "k8s_api"}))
        return Claim(("k8s", record.namespace, record.name), source, resource, precisions, record.job_id,
                     record.job.run)

    def _job_id(self, claim: Claim) -> str:
        """The claim's job id; a pod the Kubernetes API did not name is named from what the
        sample carries: its pod labels (dcgm-exporter's --kubernetes-enable-pod-labels, or
        k8s.pod.label.* from upstream), by the same rules as the API's pods, else the pod."""
        if claim.job_id:
            return claim.job_id
        kind = claim.key[0]
        if kind == "slurm":
            return slurm_job_id(claim.key[1])
        if kind == "k8s-uid":
            return f"k8s-uid:{claim.key[1]}"
        namespace, pod = claim.key[1], claim.key[2]
        job = labelled_pod_job(namespace, pod, claim.resource, self.config.k8s_job_label)
        if job.kind:
            claim.resource.setdefault(JOB_KIND, job.kind)
        claim.run = claim.run or job.run
        claim.job_id = job_id(namespace, job)
        return claim.job_id

    def _label_precisions(self, layers: tuple[dict[str, Any], ...], sample: GpuSample) -> set[str]:
        out = set()
        for name in self._precision_names:
            precision = specs.normalize_precision(_str(_lookup(layers, sample, name)))
            if precision != specs.UNKNOWN_PRECISION:
                out.add(precision)
        return out


def _renamed(point: MetricPoint, renamed: dict[tuple[GpuKey, str], str]) -> MetricPoint:
    """A receiver's own per-GPU point (e.g. the sim's truth) follows its GPU's new job id."""
    new = renamed.get((gpu_key(point.resource), job_id_of(point) or NO_JOB))
    if new is None:
        return point
    attributes = {k: v for k, v in point.attributes if k != JOB_ID}
    return dataclasses.replace(point, resource=attrs({**dict(point.resource), JOB_ID: new}),
                               attributes=attrs(attributes))


def _str(value: object) -> str | None:
    return None if value is None else str(value)


_NO_RULE = RuleResult()


_BASE_KEYS = frozenset({HOST_NAME, HW_ID, HW_MODEL, HW_VENDOR, GPU_INDEX})


def _base_attributes(sample: GpuSample) -> dict[str, Any]:
    """The resource attributes every GPU sample has (see GpuSample.resource_attributes)."""
    return {HOST_NAME: sample.host, HW_ID: sample.uuid, HW_MODEL: sample.model, HW_VENDOR: "nvidia",
            GPU_INDEX: str(sample.gpu_index)}


def _lookup(layers: tuple[dict[str, Any], ...], sample: GpuSample, name: str) -> Any:
    """``_view(layers, sample).get(name)`` without building the view: the first layer that has it."""
    for layer in layers:
        if name in layer:
            return layer[name]
    return _base_attributes(sample)[name] if name in _BASE_KEYS else None


def _view(layers: tuple[dict[str, Any], ...], sample: GpuSample) -> dict[str, Any]:
    """The layers as one dict, the first layer winning, over the sample's own attributes.

    As rules saw it before: the sample's resource attributes (None values left out), then
    the claims' attributes, then the point attributes.
    """
    attributes, claim_resource, resource = layers
    own = {k: v for k, v in {**_base_attributes(sample), **resource}.items() if v is not None}
    return {**own, **claim_resource, **attributes}


def _other_mig_profile(resource: dict[str, Any]) -> bool:
    """dcgm-exporter labels every MIG instance of a GPU with every pod holding a DRA MIG device
    of it: a pod whose device has another profile than this instance does not hold it."""
    own, held = resource.get(GPU_MIG_PROFILE), resource.get(DRA_MIG_PROFILE)
    return resource.get(GPU_MIG_INSTANCE) not in (None, "") and bool(own) and bool(held) and own != held


def _dra_keys(gpu: DraGpu, dra: DraWatcher | None) -> list[str]:
    """The keys a DRA device is held under: a GPU's UUID; a MIG device's own UUID, and its
    parent and profile when it is the node's only MIG device of that profile on that GPU."""
    if not gpu.mig:
        return [gpu.uuid]
    keys = [gpu.uuid] if gpu.uuid else []
    if dra is not None and dra.slices.only_mig(gpu.parent_uuid, gpu.profile) is gpu:
        keys.append(f"{gpu.parent_uuid}/{gpu.profile}")
    return keys


def _pod_claims(holders: Iterable[PodContainer]) -> list[Claim]:
    """One claim per pod; a pod's containers sharing the GPU are listed together."""
    containers: dict[tuple[str, str], list[str]] = {}
    for holder in holders:
        names = containers.setdefault((holder.namespace, holder.pod), [])
        if holder.container and holder.container not in names:
            names.append(holder.container)
    out = []
    for (namespace, pod), names in containers.items():
        resource = {K8S_NAMESPACE: namespace, K8S_POD_NAME: pod}
        if names:
            resource[K8S_CONTAINER] = SHARED_SEPARATOR.join(sorted(names))
        out.append(Claim(("k8s", namespace, pod), "kubelet", resource))
    return out


def _merged_resource(claims: list[Claim]) -> dict[str, str]:
    """Attributes of all claims; where jobs differ, their values sorted and comma-joined."""
    if len(claims) == 1:
        return {key: str(value) for key, value in claims[0].resource.items()}
    values: dict[str, set[str]] = {}
    for claim in claims:
        for key, value in claim.resource.items():
            values.setdefault(key, set()).add(str(value))
    return {key: SHARED_SEPARATOR.join(sorted(vals)) for key, vals in values.items()}


FACTORY = Factory("attribution", AttributionProcessorConfig, AttributionProcessor,
                  "names each GPU's job (Kubernetes, Slurm, rules) and precision", consumes="samples",
                  produces="samples")
