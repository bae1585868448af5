"""A simulated fleet as its node tier sends it: per node, the real ``ofu`` processor's output.

Why here: the fleet's consistency test and ``benchmarks/fleet.py`` feed the gateway and the jobs
tier what otel-ofu node agents send (per-GPU OFU with job identity on the resource, the jobs'
reported MFU), window by window and deterministically, without running one process per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from otel_ofu.core.model import MetricPoint
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.sim import SimReceiverConfig, build_fleet, window_batch


@dataclass
class NodeTier:
    """One ofu processor per simulated node (each node agent's own), fed one fleet window at a time."""

    sim: SimReceiverConfig
    start_unix_s: float = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    ofu: dict[str, OfuProcessor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.fleet = build_fleet(self.sim, self.start_unix_s)

    @classmethod
    def of(cls, **sim: object) -> NodeTier:
        return cls(build_config(SimReceiverConfig, dict(sim)))

    def window(self) -> dict[str, list[MetricPoint]]:
        """The next window: per host, the points its agent sends (its GPUs; the MFU of jobs whose first GPU it has)."""
        batch = window_batch(self.fleet.step_window(), emit_truth=False)
        out: dict[str, list[MetricPoint]] = {}
        first_host: dict[str, str] = {}
        by_host: dict[str, list] = {}
        for sample in batch.samples:
            by_host.setdefault(sample.host, []).append(sample)
            if sample.job_id is not None:
                first_host.setdefault(sample.job_id, sample.host)
        for host, samples in by_host.items():
            processor = self.ofu.get(host)
            if processor is None:
                processor = self.ofu[host] = OfuProcessor(OfuProcessorConfig(), Context(f"ofu@{host}"))
            out[host] = [p for s in samples for p in processor.sample_points(s)]
        for point in batch.points:  # training.mfu, one per job: sent by the node of the job's first GPU
            job = dict(point.resource).get("ofu.job.id")
            out.setdefault(first_host.get(str(job), next(iter(out))), []).append(point)
        return out
