"""A simulated GPU fleet: pure, deterministic for a seed, stepped in simulated time.

What it models, per GPU, in ticks of 0.25 s of simulated time:

- the job's tensor pipe activity a(t) (fraction of SM cycles with a tensor pipe busy),
  from its scenario, with iteration jitter;
- what the rest of the time does, from the job's kernel profile (its ``profile``: the shares of
  engine-busy time with tensor pipes busy, with SMs busy on other work, and with kernels
  running on idle SMs): the engine is busy g = a / tensor share of the time, so a job that
  does less work per second (waiting for input, a regression on the host) leaves the engine
  idle longer; DRAM activity follows its kernels' memory intensity;
- the SM clock f(t): near max when idle-but-busy, pulled down under heavy tensor load
  (power), held at the cap by a power limit, with a random walk of tens of MHz;
- ground truth: useful FLOP/s = a x f x FLOP/clk x e, where e (< 1) is the job's tile and
  pipe efficiency from its GEMM shapes; true MFU = mean(a x f) x e / f_ref.

What it reports, per window, is what DCGM would: TPA = sum(a f) / sum(f) (cycle-weighted),
GR, SM and DRAM activity the same way (with a little sampling noise), the SM clock as point
samples at the sampling rate (it moves in 15 MHz steps), max clock, power, clock event reasons;
and the ledger's counters: the energy counter (power integrated over the ticks, mJ, as DCGM 156),
the time the clock was held down per reason (ns, as DCGM 1420-1424: a tick with a reason's bit
set adds its length to that reason's counter, so the counters agree with the bitmask), and PCIe
and NVLink bytes per second over the window (:func:`traffic`: a multi-GPU job's collectives on
NVLink, an input-bound job's input over PCIe, a checkpoint's writes). None of these draw from
the random streams above, so every other number is what it was without them.
The ``ofu`` processor never sees the truth (true MFU, and the true loss account of
:class:`WindowTruth`); tests compare against it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from otel_ofu.core import loss, specs, tiles
from otel_ofu.core.model import NO_JOB, GpuSample
from otel_ofu.core.values import DCGM_FP64_BLANK

SCENARIOS = ("steady", "moe_inflated", "regression", "mixed_precision", "idle", "power_capped", "checkpoint",
             "input_bound", "memory_bound", "ragged_vocab", "hung")

REASON_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
# A throttled node's clock event reasons by name (core/loss.py's table).
THROTTLE_REASONS: dict[str, int] = {name: bit for bit, name in loss.CLOCK_REASONS
                                    if name not in ("idle", "display_clocks")}
TENSOR_DRAM = 0.3  # DRAM activity while tensor pipes run (GEMMs stream their operands)
# A hung job (an NCCL collective that never completes): its ranks' kernels stay resident and spin on a
# few SMs (a collective's channels), touching little memory; the tensor pipes do nothing.
HUNG_SM = 0.10
HUNG_DRAM = 0.01
COUNTER_NOISE = 0.002  # sd of the sampling noise on the reported GR, SM and DRAM ratios
CLOCK_STEP_MHZ = 15.0
TICK_S = 0.25  # the simulation's time step; clock sampling intervals are multiples of it
CLOCK_WALK_AR = 0.97  # per sub-tick: the wander decorrelates over ~8 s
CLOCK_WALK_SD = 1.5  # MHz innovation per sub-tick: stationary sd ~6 MHz
# Interconnect bandwidth per direction, bytes per second (an HGX H100-class node: NVLink 4 at 450 GB/s each
# way, PCIe Gen5 x16 at ~64 GB/s): the scale of the simulated traffic, not a spec-table figure.
NVLINK_BYTES_PER_S = 450e9
PCIE_BYTES_PER_S = 64e9
# Each clock event reason's bit -> the cause whose held-down time DCGM counts (1420-1424).
TIMED_REASONS: tuple[tuple[int, str], ...] = tuple((bit, name) for bit, name in loss.CLOCK_REASONS
                                                   if name in loss.CLOCK_TIME_CAUSES)


@dataclass
class JobSpec:
    """A job of the simulated fleet. Times are simulated seconds from the fleet's start."""

    id: str
    scenario: str
    gpus: int = 1
    node: int | None = None
    mfu: float = 0.45  # true MFU in its steady phase, at the typical loaded clock
    precision: str = "bf16"
    start: float = 0.0
    duration: float | None = None
    reported_mfu_factor: float = 1.0  # what the framework reports / the truth (MoE: ~2.1)
    regress_at: float = 1200.0
    regress_factor: float = 2.5
    recover_at: float | None = 3000.0
    checkpoint_every: float = 900.0
    checkpoint_length: float = 60.0
    power_cap_mhz: float | None = None
    phases: list[tuple[str, float, float]] = field(default_factory=list)  # (precision, mfu, seconds)
    efficiency: float | None = None  # overrides the tile x pipe efficiency from shapes (benchmarks: one GEMM)
    # Its kernels: the shares of engine-busy time with tensor pipes busy, with SMs busy on other
    # work (elementwise, softmax, communication), and with kernels running on idle SMs (launch gaps).
    profile: tuple[float, float, float] = (0.50, 0.40, 0.10)
    non_tensor_dram: float = 0.35  # DRAM activity while its non-tensor kernels run (memory intensity)
    # A user's profiler (Nsight) takes DCGM's profiling lock on the job's first GPU for this span
    # (seconds into the job): DCGM publishes blanks for profiling fields, so that GPU has no OFU.
    profiler_at: float | None = None
    profiler_length: float = 600.0
    hang_at: float = 1200.0  # hung: when its collectives stop completing (seconds into the job); it never recovers


SCENARIO_DEFAULTS: dict[str, dict] = {
    "steady": {"mfu": 0.45, "precision": "bf16"},
    # all-to-all communication kernels: more non-tensor work and small grids
    "moe_inflated": {"mfu": 0.26, "precision": "bf16", "reported_mfu_factor": 2.1, "profile": (0.35, 0.50, 0.15)},
    "regression": {"mfu": 0.48, "precision": "bf16"},
    "mixed_precision": {"mfu": 0.42, "precision": "fp8", "profile": (0.55, 0.37, 0.08),
                        "phases": [("fp4", 0.35, 600.0), ("fp8", 0.42, 600.0), ("bf16", 0.50, 600.0)]},
    "idle": {"mfu": 0.0, "precision": "bf16"},
    "power_capped": {"mfu": 0.45, "precision": "bf16", "power_cap_mhz": 1455.0, "profile": (0.55, 0.37, 0.08)},
    "checkpoint": {"mfu": 0.44, "precision": "bf16"},
    # Losses built in, one each (docs/components/receivers/sim.md): the GPU waits for its input ...
    "input_bound": {"mfu": 0.18, "precision": "bf16", "profile": (0.55, 0.35, 0.10)},
    # ... its kernels stream memory (decode-style attention, elementwise chains) ...
    "memory_bound": {"mfu": 0.12, "precision": "bf16", "profile": (0.15, 0.80, 0.05), "non_tensor_dram": 0.95},
    # ... or its GEMMs fill tiles badly (RAGGED_VOCAB_GEMMS): a well-tuned job whose largest loss is padding
    "ragged_vocab": {"mfu": 0.70, "precision": "bf16", "profile": (0.90, 0.06, 0.04)},
    # Runs steady, then hangs at hang_at: engine busy, tensor pipes idle (jobs.stall's stalled finding).
    "hung": {"mfu": 0.45, "precision": "bf16"},
}

# The ragged_vocab job's GEMMs (M tokens x N out x K in): a 2,048-wide model with GPT-2's vocabulary
# of 50,257 (not a multiple of 128) and sequences packed to 2,050 tokens (two more than a tile
# multiple), so M, N and the SwiGLU width all end in a partial tile. Its own tile correction is
# tiles.job_correction(RAGGED_VOCAB_GEMMS, architecture, precision).
RAGGED_VOCAB_GEMMS: tuple[tuple[int, int, int], ...] = (
    (2050, 3 * 2048, 2048), (2050, 2048, 2048), (2050, 5461, 2048), (2050, 2048, 5461), (2050, 50257, 2048),
)


@dataclass(frozen=True)
class Throttle:
    """A node whose SMs are held at ``clock_mhz`` whenever they work, for ``reason``."""

    clock_mhz: float
    reason: str  # a name of THROTTLE_REASONS (hw_thermal, sw_power_cap, ...)


@dataclass
class _Gpu:
    host: str
    index: int
    uuid: str
    spec: specs.GpuSpec
    job: JobSpec | None
    efficiency: float  # tile x pipe efficiency of the job's GEMMs
    clock_walk: float = 0.0
    last_clock: float = 0.0
    load: float = 0.0  # activity as the power controller sees it: smoothed over ~2 s
    first_of_job: bool = False  # the GPU a profiler attaches to (JobSpec.profiler_at)
    throttle: Throttle | None = None  # its node's
    # accumulators for the current window
    sum_af: float = 0.0
    sum_f: float = 0.0
    sum_gf: float = 0.0  # graphics engine busy x clock
    sum_sf: float = 0.0  # SMs busy x clock
    sum_df: float = 0.0  # DRAM busy x clock
    sum_power: float = 0.0
    ticks: int = 0
    reasons: int = 0
    clock_samples: list[tuple[int, float]] = field(default_factory=list)
    precision_cycles: dict[str, float] = field(default_factory=dict)
    # the ledger's counters: cumulative since the fleet started (energy in mJ, held-down ns per cause), and
    # this window's interconnect bytes (pcie tx, pcie rx, nvlink tx, nvlink rx)
    energy_mj: float = 0.0
    event_ns: dict[str, int] = field(default_factory=lambda: {cause: 0 for cause in loss.CLOCK_TIME_CAUSES})
    traffic_bytes: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])


def job_state(job: JobSpec | None, t: float) -> tuple[float, str | None, bool]:
    """(nominal MFU, precision, running) of a job at simulated time t; pure scenario logic."""
    if job is None or t < job.start or (job.duration is not None and t >= job.start + job.duration):
        return 0.0, None, False
    elapsed = t - job.start
    if job.scenario == "idle":
        return 0.0, None, False
    if job.scenario == "regression":
        regressed = elapsed >= job.regress_at and (job.recover_at is None or elapsed < job.recover_at)
        return (job.mfu / job.regress_factor if regressed else job.mfu), job.precision, True
    if job.scenario == "hung" and hung(job, t):
        return 0.0, job.precision, True
    if job.scenario == "checkpoint":
        in_checkpoint = elapsed % job.checkpoint_every >= job.checkpoint_every - job.checkpoint_length
        return (0.01 if in_checkpoint else job.mfu), job.precision, True
    if job.scenario == "mixed_precision" and job.phases:
        cycle = sum(p[2] for p in job.phases)
        position = elapsed % cycle
        for precision, mfu, seconds in job.phases:
            if position < seconds:
                return mfu, precision, True
            position -= seconds
    return job.mfu, job.precision, True


def hung(job: JobSpec | None, t: float) -> bool:
    """Whether a hung job's collectives have stopped completing at simulated time t."""
    return job is not None and job.scenario == "hung" and t - job.start >= job.hang_at


def job_efficiency(job: JobSpec, spec: specs.GpuSpec, rng: random.Random) -> float:
    """Tile x pipe efficiency for a job: its own transformer shapes on the arch's tiles."""
    hidden = rng.choice((4096, 5120, 8192, 12288))
    tokens = rng.choice((4096, 8192, 6100))
    ffn = int(8 * hidden / 3)
    shapes = [(tokens, 3 * hidden, hidden), (tokens, hidden, hidden), (tokens, ffn, hidden), (tokens, hidden, ffn)]
    if job.scenario == "ragged_vocab":
        shapes = list(RAGGED_VOCAB_GEMMS)
    tile = tiles.ARCH_TILES[spec.architecture].get(specs.normalize_precision(job.precision),
                                                   tiles.ARCH_TILES[spec.architecture]["bf16"])
    tile_eff = tiles.flops_weighted_efficiency(shapes, tile)
    pipe = 1.0 / (1.0 + tiles.PIPE_EXCESS) * (1.0 + rng.uniform(-0.004, 0.004))
    return tile_eff * pipe


@dataclass
class WindowTruth:
    """Ground truth for one GPU window, kept beside the sample it belongs to."""

    true_mfu: float
    reported_mfu: float | None
    mean_clock_mhz: float | None = None  # the true time-mean SM clock of the window (clock-noise benchmark)
    # The true loss account (engine_idle, sm_idle, non_tensor, clock, padding: core/loss.py's
    # parts); with true_mfu they add up to 1.
    parts: dict[str, float] = field(default_factory=dict)
    clock_cause: str = loss.NO_REASON  # the clock event reason built in (its most severe bit)
    memory_bound: bool = False  # the window's true DRAM activity is at or above the memory-bound line


class Fleet:
    """N nodes x M GPUs running jobs; :meth:`step_window` advances one collection window."""

    def __init__(self, *, nodes: int, gpus_per_node: int, models: list[str], jobs: list[JobSpec], seed: int,
                 window_s: float, clock_sample_s: float, start_unix_s: float, host_prefix: str = "sim-node-",
                 clock_sampling: str = "averaged", throttles: dict[int, Throttle] | None = None):
        self.rng = random.Random(seed)
        self.counter_rng = random.Random(seed + 1)  # the ratios' sampling noise: the main stream stays as it was
        self.window_s = window_s
        self.clock_sample_s = clock_sample_s
        self.dt = TICK_S
        self.ticks_per_sample = max(1, round(clock_sample_s / TICK_S))
        self.start_unix_s = start_unix_s
        self.t = 0.0  # simulated seconds since start
        self.clock_sampling = clock_sampling
        self.jobs = jobs
        self.gpus: list[_Gpu] = []
        placement = self._place(nodes, gpus_per_node, jobs)
        efficiency: dict[tuple[str, str], float] = {}  # per job and GPU model: all its GPUs run the same GEMMs
        for node in range(nodes):
            spec = specs.find_spec(models[node % len(models)])
            if spec is None:
                raise ValueError(f"model {models[node % len(models)]!r} is not in the spec table")
            for index in range(gpus_per_node):
                job = placement.get((node, index))
                bits = self.rng.getrandbits(128)
                uuid = f"GPU-{bits >> 96:08x}-{(bits >> 80) & 0xFFFF:04x}-{(bits >> 64) & 0xFFFF:04x}-" \
                       f"{(bits >> 48) & 0xFFFF:04x}-{bits & 0xFFFFFFFFFFFF:012x}"
                if job is not None and (job.id, spec.key) not in efficiency:
                    efficiency[(job.id, spec.key)] = job_efficiency(job, spec, self.rng)
                eff = efficiency[(job.id, spec.key)] if job is not None else 1.0
                if job is not None and job.efficiency is not None:  # drawn anyway: same random stream
                    eff = job.efficiency
                first = job is not None and not any(g.job is job for g in self.gpus)
                self.gpus.append(_Gpu(f"{host_prefix}{node}", index, uuid, spec, job, eff, first_of_job=first,
                                      throttle=(throttles or {}).get(node)))

    @staticmethod
    def _place(nodes: int, gpus_per_node: int, jobs: list[JobSpec]) -> dict[tuple[int, int], JobSpec]:
        free = [(n, i) for n in range(nodes) for i in range(gpus_per_node)]
        placement = {}
        for job in jobs:
            candidates = [slot for slot in free if job.node is None or slot[0] == job.node]
            if len(candidates) < job.gpus:
                where = f"node {job.node}" if job.node is not None else "the fleet"
                raise ValueError(f"job {job.id!r} needs {job.gpus} GPUs but {where} has {len(candidates)} free")
            for slot in candidates[: job.gpus]:
                placement[slot] = job
                free.remove(slot)
        return placement

    def _tick(self, gpu: _Gpu, t: float) -> None:
        spec = gpu.spec
        mfu, precision, running = job_state(gpu.job, t)
        max_clock = spec.max_sm_clock_mhz
        loaded_clock = 0.9 * max_clock
        if running and mfu > 0:
            # a(t) such that the job does its scenario's useful work per second at the clock it
            # runs at (its step rate is set by the job, e.g. a CPU-side regression). A power-capped
            # job is compute-bound instead: its activity is what it would be at the typical
            # loaded clock, so throttling costs it throughput, as on real hardware.
            compute_bound = gpu.job is not None and (gpu.job.power_cap_mhz is not None or gpu.throttle is not None)
            clock_now = loaded_clock if compute_bound or not gpu.last_clock else gpu.last_clock
            activity = mfu * spec.tensor_ref_clock_mhz / (gpu.efficiency * clock_now)
            activity = min(1.0, activity * (1.0 + self.rng.gauss(0.0, 0.03)))
        else:
            activity = 0.0
        engine, sm_busy, dram = _kernel_time(gpu.job, activity) if running else (0.0, 0.0, 0.0)
        if running and hung(gpu.job, t):  # spinning in a collective: busy, nothing moves
            engine, sm_busy, dram = 1.0, HUNG_SM, HUNG_DRAM
        # Clock: idle GPUs park low; busy ones run near max, pulled down by tensor power draw,
        # wandering a few 15 MHz steps (stationary sd ~6 MHz; a power cap dithers twice as much).
        gpu.clock_walk = CLOCK_WALK_AR * gpu.clock_walk + self.rng.gauss(0.0, CLOCK_WALK_SD)
        gpu.load += (activity - gpu.load) * min(1.0, self.dt / 2.0)
        reasons = 0
        if not running:
            clock = 0.18 * max_clock + gpu.clock_walk * 0.2
            reasons |= REASON_IDLE
        else:
            clock = max_clock - (max_clock - loaded_clock) * min(1.0, gpu.load / 0.6) + gpu.clock_walk
            cap = gpu.job.power_cap_mhz if gpu.job else None
            if cap is not None and clock > cap and activity > 0.2:
                clock = cap + gpu.clock_walk * 2.0
                reasons |= REASON_SW_POWER_CAP
            if gpu.throttle is not None and clock > gpu.throttle.clock_mhz:
                clock = gpu.throttle.clock_mhz + gpu.clock_walk
                reasons |= THROTTLE_REASONS[gpu.throttle.reason]
            clock = min(clock, max_clock)
        clock = round(clock / CLOCK_STEP_MHZ) * CLOCK_STEP_MHZ  # the clock moves in steps
        gpu.sum_af += activity * clock
        gpu.sum_f += clock
        gpu.sum_gf += engine * clock
        gpu.sum_sf += sm_busy * clock
        gpu.sum_df += dram * clock
        if precision:
            gpu.precision_cycles[precision] = gpu.precision_cycles.get(precision, 0.0) + activity * clock
        power = spec.board_power_w * (0.12 + (0.25 if running else 0.0) + 0.6 * activity)
        gpu.sum_power += min(power, spec.board_power_w)
        gpu.energy_mj += min(power, spec.board_power_w) * self.dt * 1000.0
        tick_ns = round(self.dt * 1e9)
        for bit, cause in TIMED_REASONS:
            if reasons & bit:
                gpu.event_ns[cause] += tick_ns
        for k, rate in enumerate(traffic(gpu.job, t, running, activity, engine)):
            gpu.traffic_bytes[k] += rate * self.dt
        gpu.reasons |= reasons
        gpu.ticks += 1
        gpu.last_clock = clock

    def step_window(self) -> list[tuple[GpuSample, WindowTruth]]:
        """Advance one window of simulated time; a sample and its ground truth per GPU."""
        start_t = self.t
        window_ticks = max(1, round(self.window_s / self.dt))
        for gpu in self.gpus:
            gpu.sum_af = gpu.sum_f = gpu.sum_power = gpu.sum_gf = gpu.sum_sf = gpu.sum_df = 0.0
            gpu.ticks = gpu.reasons = 0
            gpu.clock_samples = []
            gpu.precision_cycles = {}
            gpu.traffic_bytes = [0.0, 0.0, 0.0, 0.0]
        for k in range(1, window_ticks + 1):
            t = start_t + k * self.dt
            take_sample = k % self.ticks_per_sample == 0
            t_ns = int((self.start_unix_s + t) * 1e9)
            for gpu in self.gpus:
                self._tick(gpu, t)
                if take_sample:
                    gpu.clock_samples.append((t_ns, gpu.last_clock))
        self.t = start_t + window_ticks * self.dt
        end_ns = int((self.start_unix_s + self.t) * 1e9)
        out = []
        for gpu in self.gpus:
            out.append(self._window_sample(gpu, end_ns, start_t))
        return out

    def _window_sample(self, gpu: _Gpu, end_ns: int, start_t: float) -> tuple[GpuSample, WindowTruth]:
        spec = gpu.spec
        samples = gpu.clock_samples
        if self.clock_sampling == "point" or not samples:
            clock = samples[-1][1] if samples else None
            n = 1 if samples else 0
        else:
            clock = sum(s[1] for s in samples) / len(samples)
            n = len(samples)
        tpa = gpu.sum_af / gpu.sum_f if gpu.sum_f else 0.0
        true_mfu = (gpu.sum_af / gpu.ticks) * gpu.efficiency / spec.tensor_ref_clock_mhz if gpu.ticks else 0.0
        gr, sm, dram = ((gpu.sum_gf / gpu.sum_f, gpu.sum_sf / gpu.sum_f, gpu.sum_df / gpu.sum_f) if gpu.sum_f
                        else (0.0, 0.0, 0.0))
        raw = gpu.sum_af / gpu.ticks / spec.tensor_ref_clock_mhz if gpu.ticks else 0.0
        parts = {loss.ENGINE_IDLE: 1.0 - gr, loss.SM_IDLE: gr - sm, loss.NON_TENSOR: sm - tpa, loss.CLOCK: tpa - raw,
                 loss.PADDING: raw - true_mfu}
        _, _, running = job_state(gpu.job, self.t)
        precision = max(gpu.precision_cycles, key=gpu.precision_cycles.get) if gpu.precision_cycles else None
        job = gpu.job if running else None
        if job is None:
            precision = None
        reported = true_mfu * job.reported_mfu_factor if job else None
        tensor_active: float = round(tpa, 6)
        if job is not None and gpu.first_of_job and _profiled(job, start_t, self.t):
            tensor_active = DCGM_FP64_BLANK
        gr_read, sm_read, dram_read = (self._reading(gr), self._reading(sm), self._reading(dram))
        if tensor_active == DCGM_FP64_BLANK:  # the profiler holds every profiling counter
            gr_read = sm_read = dram_read = DCGM_FP64_BLANK
        sample = GpuSample(
            time_unix_nano=end_ns, window_s=self.t - start_t, host=gpu.host, gpu_index=gpu.index, uuid=gpu.uuid,
            model=_model_string(spec), tensor_active=tensor_active, sm_clock_mhz=clock, sm_clock_samples=n,
            max_sm_clock_mhz=spec.max_sm_clock_mhz, power_w=round(gpu.sum_power / max(gpu.ticks, 1), 1),
            clock_event_reasons=gpu.reasons, sm_active=sm_read, gr_active=gr_read, dram_active=dram_read,
            source="sim", job_id=job.id if job else NO_JOB, precision=precision,
            energy_mj=int(gpu.energy_mj), clock_event_ns=dict(gpu.event_ns),
            **{name: int(total / seconds) for name, total in zip(TRAFFIC_FIELDS, gpu.traffic_bytes)
               for seconds in (max(self.t - start_t, self.dt),)},
        )
        truth = WindowTruth(true_mfu, reported, gpu.sum_f / gpu.ticks if gpu.ticks else None, parts,
                            loss.clock_cause(gpu.reasons), dram >= loss.MEMORY_BOUND_DRAM)
        return sample, truth

    def _reading(self, ratio: float) -> float:
        """A ratio as DCGM reports it: sampled a moment apart from the others (a little noise), six decimals."""
        if ratio <= 0.0:
            return 0.0
        return round(min(1.0, max(0.0, ratio + self.counter_rng.gauss(0.0, COUNTER_NOISE))), 6)

    def running_jobs(self) -> list[JobSpec]:
        return [j for j in self.jobs if job_state(j, self.t)[2]]


TRAFFIC_FIELDS = ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")


def traffic(job: JobSpec | None, t: float, running: bool, activity: float, engine: float
            ) -> tuple[float, float, float, float]:
    """A GPU's interconnect traffic in one tick, bytes per second: (PCIe tx, PCIe rx, NVLink tx, NVLink rx).

    A job on several GPUs runs collectives over NVLink while its kernels run (a share of the engine-busy
    time; more for an MoE job's all-to-all); an input-bound job pulls its input over PCIe (host to device:
    rx) while it waits; a checkpoint writes over PCIe (device to host: tx); every running job copies a
    little (its batches, its logging). Idle GPUs move nothing. Deterministic: no random draw.
    """
    if job is None or not running or job.scenario == "idle":
        return 0.0, 0.0, 0.0, 0.0
    if hung(job, t):  # its collectives never complete: nothing moves but a little housekeeping over PCIe
        return 0.0002 * PCIE_BYTES_PER_S, 0.0002 * PCIE_BYTES_PER_S, 0.0, 0.0
    pcie_tx, pcie_rx = 0.002 * PCIE_BYTES_PER_S, (0.01 + 0.02 * engine) * PCIE_BYTES_PER_S
    nvlink = 0.0
    if job.gpus > 1:
        nvlink = (0.35 if job.scenario == "moe_inflated" else 0.2) * engine * NVLINK_BYTES_PER_S
    if job.scenario == "input_bound":
        pcie_rx = 0.45 * PCIE_BYTES_PER_S  # the input pipeline feeds it as fast as it can
    elif job.scenario == "checkpoint" and activity < 0.05:
        pcie_tx = 0.4 * PCIE_BYTES_PER_S  # the checkpoint's weights and optimizer state to the host
    return pcie_tx, pcie_rx, nvlink, nvlink


def _kernel_time(job: JobSpec | None, activity: float) -> tuple[float, float, float]:
    """(engine busy, SMs busy, DRAM busy) in a tick where tensor pipes are busy ``activity`` of the time.

    The engine is busy ``activity / tensor share`` of the time (the job's profile); beyond full
    time the tensor share grows and the rest keeps its proportions.
    """
    if job is None or activity <= 0.0:
        return 0.0, 0.0, 0.0
    tensor, other, gaps = job.profile
    engine = activity / tensor
    if engine <= 1.0:
        sm_busy = engine * (tensor + other)
        dram = engine * (tensor * TENSOR_DRAM + other * job.non_tensor_dram)
        return engine, sm_busy, dram
    rest = 1.0 - activity
    other_time = rest * other / (other + gaps) if other + gaps > 0 else 0.0
    return 1.0, activity + other_time, activity * TENSOR_DRAM + other_time * job.non_tensor_dram


def _profiled(job: JobSpec, start_t: float, end_t: float) -> bool:
    """Whether a profiler held the job's first GPU during any of the window [start_t, end_t]."""
    if job.profiler_at is None:
        return False
    begin = job.start + job.profiler_at
    return start_t < begin + job.profiler_length and end_t > begin


# Model strings as DCGM/NVML print them, so the sim exercises the spec table's matching.
_MODEL_STRINGS = {
    "h100_sxm": "NVIDIA H100 80GB HBM3", "h100_pcie": "NVIDIA H100 PCIe", "h100_nvl": "NVIDIA H100 NVL",
    "h200_sxm": "NVIDIA H200", "h200_nvl": "NVIDIA H200 NVL", "gh200": "NVIDIA GH200 480GB",
    "a100_sxm": "NVIDIA A100-SXM4-80GB", "a100_pcie": "NVIDIA A100 80GB PCIe", "b200": "NVIDIA B200",
    "gb200": "NVIDIA GB200",
}


def _model_string(spec: specs.GpuSpec) -> str:
    return _MODEL_STRINGS.get(spec.key, spec.name)

