"""The ``sim`` receiver: a simulated fleet, the embedded default that needs no GPU.

It paces :class:`otel_ofu.sim.Fleet` against the wall clock times ``time_acceleration``,
so an hour of fleet time can pass in seconds; timestamps are simulated time. Besides the
GPU samples it emits the ground truth (``sim.gpu.mfu.true`` per GPU) and what each job's
framework would report about itself (``training.mfu`` per job).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from otel_ofu.core import specs
from otel_ofu.core.metrics import RATIO
from otel_ofu.core.model import JOB_ID, PRECISION, Batch, MetricPoint, attrs
from otel_ofu.pipeline.component import Context, Factory, PollingReceiver
from otel_ofu.pipeline.config import Duration, invalid, require
from otel_ofu.sim import fleet as sim

MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 64
Scenario = Literal["steady", "moe_inflated", "regression", "mixed_precision", "idle", "power_capped", "checkpoint",
                   "input_bound", "memory_bound", "ragged_vocab", "hung"]


@dataclass
class SimPhaseConfig:
    """One phase of a mixed_precision job; the phases repeat in order."""

    precision: str  # the phase's precision (fp4, fp8, bf16, ...)
    mfu: float  # true MFU during the phase
    duration: Duration  # how long the phase lasts


@dataclass
class SimProfileConfig:
    """What a job's kernels do with the time the engine is busy: the three shares add up to 1."""

    tensor: float  # tensor pipes busy
    non_tensor: float  # SMs busy on other work (elementwise, softmax, communication kernels)
    sm_idle: float  # kernels running on idle SMs (launch gaps, small grids, tails)

    def validate(self) -> None:
        require(self.tensor > 0 and self.non_tensor >= 0 and self.sm_idle >= 0, "tensor",
                "shares are >= 0, the tensor share > 0")
        require(abs(self.tensor + self.non_tensor + self.sm_idle - 1.0) < 1e-6, "tensor",
                f"the shares add up to 1, got {self.tensor + self.non_tensor + self.sm_idle:g}")


@dataclass
class SimThrottleConfig:
    """A node whose SM clock is held down whenever its GPUs work, with the clock event reason it reports."""

    node: int  # the node (0-based)
    clock_mhz: float  # the SM clock it is held at
    # The reason its GPUs report (DCGM 112): hw_thermal, hw_slowdown, hw_power_brake, sw_thermal,
    # sw_power_cap, sync_boost or app_clocks.
    reason: str = "hw_thermal"

    def validate(self) -> None:
        require(self.node >= 0, "node", "must be >= 0")
        require(100 <= self.clock_mhz <= 5000, "clock_mhz", f"expected MHz within [100, 5000], got {self.clock_mhz}")
        require(self.reason in sim.THROTTLE_REASONS, "reason",
                f"unknown reason {self.reason!r} (known: {', '.join(sim.THROTTLE_REASONS)})")


@dataclass
class SimJobConfig:
    """A simulated job (docs/components/receivers/sim.md lists the scenarios)."""

    scenario: Scenario  # what the job does (the table of scenarios below)
    gpus: int = 1  # GPUs the job holds
    id: str = ""  # its ofu.job.id; "" = "<scenario>-<n>"
    node: int | None = None  # place it on this node (0-based); unset: the first free GPUs
    # True MFU in the steady phase; unset: the scenario's (steady 0.45, moe_inflated 0.26, ...).
    mfu: float | None = None
    precision: str | None = None  # unset: the scenario's (bf16; mixed_precision: its phases)
    start: Duration = field(default_factory=lambda: Duration(0))  # when it starts, after the simulation's start
    duration: Duration | None = None  # how long it runs; unset: the whole simulation
    # The MFU the job reports about itself / its true MFU; unset: the scenario's (moe_inflated
    # 2.1, else 1).
    reported_mfu_factor: float | None = None
    # The regression scenario:
    regress_at: Duration = field(default_factory=lambda: Duration(1200))  # when the job turns slow, into the job
    regress_factor: float = 2.5  # how many times slower it runs
    recover_at: Duration | None = field(default_factory=lambda: Duration(3000))  # when it recovers; unset: never

    # The checkpoint scenario:
    checkpoint_every: Duration = field(default_factory=lambda: Duration(900))  # how often the job checkpoints
    checkpoint_length: Duration = field(default_factory=lambda: Duration(60))  # how long a checkpoint dip lasts

    # The hung scenario: when its collectives stop completing, into the job (it never recovers; end it with
    # duration).
    hang_at: Duration = field(default_factory=lambda: Duration(1200))

    # power_capped: the SM clock cap, MHz; unset: the scenario's 1455.
    power_cap_mhz: float | None = None
    # mixed_precision: the phases, repeated; [] = NVFP4, FP8, BF16 ten minutes each.
    phases: list[SimPhaseConfig] = field(default_factory=list)
    # A profiler (Nsight) holding DCGM's lock on the job's first GPU (its TPA reads as DCGM's
    # blank, so that GPU has no OFU meanwhile):
    profiler_at: Duration | None = None  # when it attaches, into the job; unset: never
    profiler_length: Duration = field(default_factory=lambda: Duration(600))  # how long it holds the lock
    # Its kernels (the loss account it makes); unset: the scenario's (steady 0.5/0.4/0.1).
    profile: SimProfileConfig | None = None
    # DRAM activity while its non-tensor kernels run; unset: the scenario's (0.35; memory_bound 0.95).
    non_tensor_dram: float | None = None

    def validate(self) -> None:
        require(self.gpus >= 1, "gpus", "must be at least 1")
        require(self.non_tensor_dram is None or 0 <= self.non_tensor_dram <= 1, "non_tensor_dram",
                f"must be within [0, 1], got {self.non_tensor_dram}")
        require(self.mfu is None or 0 <= self.mfu <= 1, "mfu", f"must be within [0, 1], got {self.mfu}")
        require(self.precision is None or specs.normalize_precision(self.precision) != specs.UNKNOWN_PRECISION,
                "precision", f"unknown precision {self.precision!r} (known: {', '.join(specs.PRECISIONS)})")
        require(self.regress_factor >= 1, "regress_factor", "must be >= 1")
        require(self.profiler_length > 0, "profiler_length", "must be positive")
        require(self.checkpoint_length < self.checkpoint_every, "checkpoint_length", "must be shorter than "
                "checkpoint_every")
        for i, phase in enumerate(self.phases):
            require(specs.normalize_precision(phase.precision) != specs.UNKNOWN_PRECISION, f"phases[{i}].precision",
                    f"unknown precision {phase.precision!r}")
            require(0 <= phase.mfu <= 1 and phase.duration > 0, f"phases[{i}]", "mfu within [0, 1], duration > 0")

    def to_spec(self, default_id: str) -> sim.JobSpec:
        defaults = dict(sim.SCENARIO_DEFAULTS[self.scenario])
        phases = [(specs.normalize_precision(p.precision), p.mfu, float(p.duration)) for p in self.phases]
        return sim.JobSpec(
            id=self.id or default_id, scenario=self.scenario, gpus=self.gpus, node=self.node,
            mfu=self.mfu if self.mfu is not None else defaults["mfu"],
            precision=specs.normalize_precision(self.precision or defaults["precision"]),
            start=float(self.start), duration=float(self.duration) if self.duration is not None else None,
            reported_mfu_factor=(self.reported_mfu_factor if self.reported_mfu_factor is not None
                                 else defaults.get("reported_mfu_factor", 1.0)),
            regress_at=float(self.regress_at), regress_factor=self.regress_factor,
            recover_at=float(self.recover_at) if self.recover_at is not None else None,
            checkpoint_every=float(self.checkpoint_every), checkpoint_length=float(self.checkpoint_length),
            power_cap_mhz=self.power_cap_mhz if self.power_cap_mhz is not None else defaults.get("power_cap_mhz"),
            phases=phases or list(defaults.get("phases", [])),
            profiler_at=float(self.profiler_at) if self.profiler_at is not None else None,
            profiler_length=float(self.profiler_length), hang_at=float(self.hang_at),
            profile=((self.profile.tensor, self.profile.non_tensor, self.profile.sm_idle) if self.profile
                     else defaults.get("profile", sim.JobSpec.profile)),
            non_tensor_dram=(self.non_tensor_dram if self.non_tensor_dram is not None
                             else defaults.get("non_tensor_dram", sim.JobSpec.non_tensor_dram)),
        )


# When no jobs are configured: this mix, repeated until the fleet is full.
DEFAULT_MIX: tuple[tuple[str, int], ...] = (
    ("steady", 4), ("moe_inflated", 4), ("regression", 2), ("checkpoint", 2), ("power_capped", 1), ("idle", 1),
    ("steady", 2),
)


@dataclass
class SimReceiverConfig:
    nodes: int = 2  # simulated nodes
    gpus_per_node: int = 8  # GPUs on each node
    # GPU model per node (cycled over the nodes): any model of the spec table (docs/gpus.md).
    models: list[str] = field(default_factory=lambda: ["NVIDIA H100 80GB HBM3"])
    host_prefix: str = "sim-node-"  # host.name of node n is <host_prefix><n>
    seed: int = 42  # noise and GPU UUIDs; the same seed gives the same fleet
    # Simulated seconds per wall second (120 = an hour in 30 s).
    time_acceleration: float = 1.0
    collection_interval: Duration = field(default_factory=lambda: Duration(10))  # the TPA window, simulated
    # SM clock sampling, simulated; a multiple of the 0.25 s time step.
    clock_sample_interval: Duration = field(default_factory=lambda: Duration(1))
    # averaged: every clock sample in the window; point: one clock sample per window, as the paper did.
    clock_sampling: Literal["averaged", "point"] = "averaged"
    start_time: str | None = None  # ISO 8601 start of simulated time; unset: when the receiver starts
    emit_truth: bool = True  # emit each job's true MFU as sim.gpu.mfu.true
    # The jobs; GPUs not given a job are idle. [] = a built-in mix filling the fleet (steady,
    # moe_inflated, regression, checkpoint, power_capped, idle).
    jobs: list[SimJobConfig] = field(default_factory=list)
    # Nodes whose SM clock is held down (cooling, power delivery): their jobs lose throughput to
    # the clock, and their GPUs report the reason.
    throttled_nodes: list[SimThrottleConfig] = field(default_factory=list)

    def validate(self) -> None:
        # Upper bounds: the fleet is built in memory (found by benchmarks/fuzz.py: nodes 2^47 hung validation).
        # The job checks below build the fleet's job list: only for a fleet of a size that can be built.
        sized = all([require(self.nodes >= 1, "nodes", "must be at least 1"),
                     require(self.gpus_per_node >= 1, "gpus_per_node", "must be at least 1"),
                     require(self.nodes <= MAX_NODES, "nodes", f"must be at most {MAX_NODES}"),
                     require(self.gpus_per_node <= MAX_GPUS_PER_NODE, "gpus_per_node",
                             f"must be at most {MAX_GPUS_PER_NODE}")])
        require(bool(self.models), "models", "at least one GPU model is required")
        for i, model in enumerate(self.models):
            require(specs.find_spec(model) is not None, f"models[{i}]",
                    f"unknown GPU model {model!r} (known: {', '.join(s.name for s in specs.GPU_SPECS)})")
        require(self.time_acceleration > 0, "time_acceleration", "must be positive")
        ticks = self.clock_sample_interval / sim.TICK_S
        require(ticks >= 1 and abs(ticks - round(ticks)) < 1e-9, "clock_sample_interval",
                f"must be a multiple of {sim.TICK_S}s, the simulation's time step")
        require(self.collection_interval >= self.clock_sample_interval, "collection_interval",
                "must be at least clock_sample_interval")
        if self.start_time is not None:
            try:
                datetime.fromisoformat(self.start_time)
            except ValueError:
                invalid("start_time", f"expected ISO 8601, got {self.start_time!r}")
        if not sized:
            return
        for i, job in enumerate(self.job_specs()):
            if job.node is not None:
                require(0 <= job.node < self.nodes, f"jobs[{i}].node", f"must be within [0, {self.nodes - 1}]")
        for i, throttle in enumerate(self.throttled_nodes):
            require(throttle.node < self.nodes, f"throttled_nodes[{i}].node", f"must be within [0, {self.nodes - 1}]")
        total = sum(j.gpus for j in self.job_specs())
        require(total <= self.nodes * self.gpus_per_node, "jobs",
                f"the jobs need {total} GPUs but the fleet has {self.nodes * self.gpus_per_node}")

    def job_specs(self) -> list[sim.JobSpec]:
        if self.jobs:
            return [job.to_spec(f"{job.scenario}-{i}") for i, job in enumerate(self.jobs)]
        out, size, i = [], self.nodes * self.gpus_per_node, 0
        while size > 0:
            scenario, gpus = DEFAULT_MIX[i % len(DEFAULT_MIX)]
            gpus = min(gpus, size)
            out.append(SimJobConfig(scenario=scenario, gpus=gpus).to_spec(f"{scenario}-{i}"))  # type: ignore[arg-type]
            size -= gpus
            i += 1
        return out


def build_fleet(config: SimReceiverConfig, start_unix_s: float) -> sim.Fleet:
    return sim.Fleet(nodes=config.nodes, gpus_per_node=config.gpus_per_node, models=config.models,
                     jobs=config.job_specs(), seed=config.seed, window_s=float(config.collection_interval),
                     clock_sample_s=float(config.clock_sample_interval), start_unix_s=start_unix_s,
                     host_prefix=config.host_prefix, clock_sampling=config.clock_sampling,
                     throttles={t.node: sim.Throttle(t.clock_mhz, t.reason) for t in config.throttled_nodes})


def window_batch(results: list[tuple[object, sim.WindowTruth]], emit_truth: bool) -> Batch:
    """A pipeline batch from one fleet window: samples, truth per GPU, reported MFU per job."""
    batch = Batch()
    reported: dict[str, list[float]] = {}
    precision_of: dict[str, str] = {}
    t = 0
    for sample, truth in results:
        batch.samples.append(sample)  # type: ignore[arg-type]
        t = sample.time_unix_nano  # type: ignore[attr-defined]
        job = sample.job_id  # type: ignore[attr-defined]
        precision = specs.normalize_precision(sample.precision)  # type: ignore[attr-defined]
        if emit_truth:  # on the GPU's resource with its job identity, as the ofu processor's points
            resource = sample.resource_attributes({JOB_ID: job, PRECISION: precision})  # type: ignore[attr-defined]
            batch.points.append(MetricPoint("sim.gpu.mfu.true", truth.true_mfu, t, resource, (), RATIO))
        if truth.reported_mfu is not None:
            reported.setdefault(job, []).append(truth.reported_mfu)
            precision_of[job] = precision
    for job, values in reported.items():
        # As a training process would send it: its own resource, naming its job.
        resource = attrs({"service.name": "training-framework", JOB_ID: job, PRECISION: precision_of[job]})
        batch.points.append(MetricPoint("training.mfu", sum(values) / len(values), t, resource, (), RATIO))
    return batch


class SimReceiver(PollingReceiver):
    def __init__(self, config: SimReceiverConfig, context: Context, consumer):
        super().__init__(config, context, consumer)
        self.fleet: sim.Fleet | None = None
        self._wall_start = 0.0
        self.windows_emitted = 0

    def interval(self) -> float:
        """Sleep until the next simulated window is due: one wake-up per window, not a poll.

        The wait is on the stop Event, so shutdown interrupts it however long it is.
        """
        window_wall_s = float(self.config.collection_interval) / self.config.time_acceleration
        if self.fleet is None:  # on_start failed: retry a window later
            return window_wall_s
        due_wall_s = (self.fleet.t + float(self.config.collection_interval)) / self.config.time_acceleration
        return min(max(due_wall_s - (time.monotonic() - self._wall_start), 0.0), window_wall_s)

    def on_start(self) -> None:
        start = (datetime.fromisoformat(self.config.start_time).timestamp() if self.config.start_time
                 else time.time())
        self.fleet = build_fleet(self.config, start)
        self._wall_start = time.monotonic()
        self.log.info("simulating %d nodes x %d GPUs, %d jobs, x%g time", self.config.nodes,
                      self.config.gpus_per_node, len(self.fleet.jobs), self.config.time_acceleration)

    def poll(self) -> Batch | None:
        assert self.fleet is not None
        due = (time.monotonic() - self._wall_start) * self.config.time_acceleration
        while self.fleet.t + float(self.config.collection_interval) <= due and not self.stopping.is_set():
            self.consumer(window_batch(self.fleet.step_window(), self.config.emit_truth))
            self.windows_emitted += 1
        return None


FACTORY = Factory("sim", SimReceiverConfig, SimReceiver, "a simulated GPU fleet (no GPU needed)",
                  output="samples")
