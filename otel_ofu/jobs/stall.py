"""Stalled jobs: GPUs that keep their engine busy while nothing moves, for long enough.

The signature of a collective deadlock (NCCL ranks spinning in a collective that never
completes) or a kernel spinning on a flag: "GPU utilization" reads 100 % (the graphics
engine has a kernel resident), yet the tensor pipes, DRAM and the links (NVLink, PCIe) are
idle. Each GPU window of a job is one of:

- ``working``: tensor pipes active (TPA above ``tensor_idle``), DRAM-heavy (the window's
  non-tensor work is memory-bound: the loss account's cause), or link traffic above
  ``link_idle``: the job moves something;
- ``stalled``: none of that, with the engine busy (GR_ENGINE_ACTIVE at or above
  ``engine_busy``; SM_ACTIVE at or above ``sm_busy`` where the source has no GR);
- ``idle``: none of that, with the engine not busy (an input-bound job waiting for data, a job
  between steps, a GPU held but unused: the loss account's ``engine_idle``);
- ``unknown``: neither GR nor SM was read (or the window came without its loss account): it
  cannot tell.

What a window's levels are comes from the loss account the ``ofu`` processor sends beside
``gpu.ofu`` (core.loss: GR = 1 - engine_idle, SM = GR - sm_idle, TPA = 1 - the three steps,
the memory cause on the non-tensor part), so it reaches a jobs tier behind a gateway as the
account does; link traffic from ``gpu.link.throughput`` (PCIe and NVLink, tx + rx) where the
source reads it. A bin of the job is stalled when no GPU window in it worked and its stalled
GPU time is at least its idle time; ``after`` of consecutive stalled bins (no bin between them
missing or unknown) opens the finding, the first bin in which any of its GPUs works again
clears it (``work_resumed``). Idle or unknown bins neither open nor clear an open finding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from otel_ofu.core.exact import exact, to_float
from otel_ofu.core.loss import ENGINE_IDLE, MEMORY_BOUND, MERGE, NON_TENSOR, SM_IDLE
from otel_ofu.core.metrics import LINK_THROUGHPUT_METRIC
from otel_ofu.jobs.findings import CLOSE, OPEN, STALLED, STALLED_ENGINE_BUSY_NO_WORK, Finding, Transition, sustain_bins
from otel_ofu.pipeline.config import Duration, require

WORKING = "working"
STALLED_WINDOW = "stalled"
IDLE = "idle"
UNKNOWN = "unknown"

# ofu.finding.evidence: what the stalled windows were judged on.
EVIDENCE_LINKS = "links"  # GR/SM activity, tensor and DRAM activity, and NVLink/PCIe traffic
EVIDENCE_ACTIVITY_ONLY = "activity_only"  # the source reads no link traffic: activity counters alone
WORK_RESUMED = "work_resumed"  # ofu.finding.reason of a stalled finding that cleared

LINK_METRIC = LINK_THROUGHPUT_METRIC
_STEPS = frozenset((ENGINE_IDLE, SM_IDLE, NON_TENSOR))


@dataclass
class StallConfig:
    """Stalled jobs: GPUs whose engine stays busy while tensor pipes, DRAM and links are idle are a
    finding (kind stalled, cause engine_busy_no_work; docs/jobs.md#stalled-jobs)."""

    enabled: bool = True  # false turns the stalled finding off
    # How long the job's GPUs must look stalled, without a break, before the finding opens: longer
    # than a checkpoint write or an evaluation pass, short enough to catch a hang before its job's
    # own NCCL timeout (30 minutes by default) ends it.
    after: Duration = field(default_factory=lambda: Duration(600))
    # Busy: GR_ENGINE_ACTIVE (DCGM 1001) at or above this (a kernel resident nearly all the time:
    # what "GPU utilization 100 %" means) ...
    engine_busy: float = 0.9
    # ... or, where the source reads no GR, SM_ACTIVE (DCGM 1002) at or above this. A collective
    # spinning on a few SMs reads low here: without GR such a hang is seen as idle, not stalled.
    sm_busy: float = 0.5
    # Tensor pipes idle: PIPE_TENSOR_ACTIVE (DCGM 1004) at or below this (a training step's GEMMs
    # read 0.2 and more; a spinning collective 0).
    tensor_idle: float = 0.02
    # Links idle: PCIe and NVLink traffic together (tx + rx, bytes per second) at or below this;
    # gradients moving read GB/s, an idle link's housekeeping a few MB/s.
    link_idle: float = 50e6

    def validate(self) -> None:
        require(self.after > 0, "after", "must be positive")
        require(0 < self.engine_busy <= 1, "engine_busy", f"must be within (0, 1], got {self.engine_busy}")
        require(0 < self.sm_busy <= 1, "sm_busy", f"must be within (0, 1], got {self.sm_busy}")
        require(0 <= self.tensor_idle < 1, "tensor_idle", f"must be within [0, 1), got {self.tensor_idle}")
        require(self.tensor_idle < self.engine_busy, "tensor_idle",
                f"must be below engine_busy ({self.engine_busy}): a busy engine with tensor pipes as busy is work")
        require(math.isfinite(self.link_idle) and self.link_idle >= 0, "link_idle",
                f"must be a number of bytes per second, 0 or more, got {self.link_idle}")


# What a loss part says about the levels (bits): a step of the chain; it holds the non-tensor step (its cause is
# the memory cause); 1 - it is GR; 1 - it is SM (GR not read); GR - it is SM.
_STEP, _HOLDS_NON_TENSOR, _GR_LEVEL, _SM_LEVEL_ALONE, _SM_LEVEL_BELOW_GR = 1, 2, 4, 8, 16
_ROLES: dict[str, int] = {}


def _role(part: str) -> int:
    names = part.split(MERGE)
    if not _STEPS.issuperset(names):
        return 0
    role = _STEP | (_HOLDS_NON_TENSOR if NON_TENSOR in names else 0)
    if part == ENGINE_IDLE:
        role |= _GR_LEVEL
    elif part == ENGINE_IDLE + MERGE + SM_IDLE:
        role |= _SM_LEVEL_ALONE
    elif part == SM_IDLE:
        role |= _SM_LEVEL_BELOW_GR
    return role


Parts = tuple[tuple[tuple[str, float], ...], dict[str, str]]  # jobs.loss.Parts: (part, share) pairs, part -> cause


def window_state(parts: Parts | None, links: float | None, config: StallConfig) -> str:
    """What one GPU window did (module docstring): working, stalled, idle or unknown.

    ``parts``: its loss account (jobs.loss.window_parts), None when it came without one;
    ``links``: its PCIe + NVLink bytes per second, None where the source reads none.
    """
    if parts is None:
        return UNKNOWN
    shares, causes = parts
    chain = 0.0
    gr = sm = None
    memory = None
    steps = False
    for part, share in shares:
        role = _ROLES.get(part)
        if role is None:
            role = _role(part)
            if len(_ROLES) < 64:  # the part names are a small fixed set (core.loss); a sender's others are not kept
                _ROLES[part] = role
        if not role & _STEP:
            continue
        steps = True
        chain += share
        if role & _HOLDS_NON_TENSOR:
            memory = causes.get(part)
        if role & _GR_LEVEL:
            gr = 1.0 - share
        elif role & _SM_LEVEL_ALONE:
            sm = 1.0 - share
        elif role & _SM_LEVEL_BELOW_GR and gr is not None:
            sm = gr - share
    if not steps:
        return UNKNOWN
    tpa = 1.0 - chain
    if tpa > config.tensor_idle + 1e-9 or memory == MEMORY_BOUND or (links is not None and links > config.link_idle):
        return WORKING
    if gr is not None:
        return STALLED_WINDOW if gr >= config.engine_busy - 1e-9 else IDLE
    if sm is not None:
        return STALLED_WINDOW if sm >= config.sm_busy - 1e-9 else IDLE
    return UNKNOWN


@dataclass
class StallBin:
    """One bin of a job: its GPU time by window state (exact sums, core.exact), and the stalled part of it
    whose windows carried link traffic."""

    seconds: dict[str, int] = field(default_factory=dict)
    stalled_with_links: int = 0

    def add(self, state: str, seconds: float, links: bool) -> None:
        amount = exact(seconds)
        self.seconds[state] = self.seconds.get(state, 0) + amount
        if state == STALLED_WINDOW and links:
            self.stalled_with_links += amount

    def state(self) -> str:
        """The bin's state: working if any GPU worked; stalled if its stalled time is at least its idle time."""
        s = self.seconds
        if s.get(WORKING, 0) > 0:
            return WORKING
        stalled = s.get(STALLED_WINDOW, 0)
        if stalled > 0 and stalled >= s.get(IDLE, 0):
            return STALLED_WINDOW
        if s.get(IDLE, 0) > 0:
            return IDLE
        return UNKNOWN


class StallDetector:
    """One job's stalled finding: feed it each closed bin's :class:`StallBin`, get transitions back."""

    def __init__(self, config: StallConfig, resolution_s: float):
        self.config = config
        self._resolution = resolution_s
        self._open_after = sustain_bins(config.after, resolution_s)
        self._streak: list[tuple[float, StallBin]] = []  # (bin end, bin): consecutive stalled bins, not yet a finding
        self.open: Finding | None = None
        self._open_seconds = 0  # stalled GPU seconds (exact) of the open finding, its streak's included
        self._open_links = 0  # ... of them, the part whose windows carried link traffic
        self.closed_seconds = 0  # stalled GPU seconds (exact) of its findings already closed
        # A bin whose GPU windows all had neither GR nor SM (or no loss account) came: it cannot tell (said once)
        self.cannot_tell = False

    @property
    def stalled_seconds(self) -> float:
        """The job's GPU time in stalled windows of its stalled findings (those open too): stalled GPU-hours x 3600."""
        return to_float(self.closed_seconds + self._open_seconds)

    def observe(self, t: float, stall_bin: StallBin | None) -> list[Transition]:
        """``t``: the bin's end; ``stall_bin``: what the job's GPU windows did in it (None: no window)."""
        if not self.config.enabled:
            return []
        state = stall_bin.state() if stall_bin is not None else UNKNOWN
        if state == UNKNOWN and stall_bin is not None:
            self.cannot_tell = True
        if self.open is not None:
            return self._while_open(t, state, stall_bin)
        if state != STALLED_WINDOW or stall_bin is None:
            self._streak = []
            return []
        if self._streak and abs(self._streak[-1][0] + self._resolution - t) > 1e-6:
            self._streak = []  # a bin without data between: not continuous
        self._streak.append((t, stall_bin))
        if len(self._streak) < self._open_after:
            return []
        seconds = sum(b.seconds.get(STALLED_WINDOW, 0) for _, b in self._streak)
        links = sum(b.stalled_with_links for _, b in self._streak)
        since = self._streak[0][0] - self._resolution
        self._streak = []
        self._open_seconds, self._open_links = seconds, links
        self.open = Finding(STALLED, STALLED_ENGINE_BUSY_NO_WORK, opened_at=t, since=since,
                            numbers={"evidence": self._evidence(), "stalled_for_s": t - since,
                                     "stalled_gpu_hours": to_float(seconds) / 3600.0})
        return [Transition(OPEN, self.open, t)]

    def _evidence(self) -> str:
        """Links when every stalled window so far carried link traffic; else activity counters alone."""
        return EVIDENCE_LINKS if self._open_seconds > 0 and self._open_links >= self._open_seconds \
            else EVIDENCE_ACTIVITY_ONLY

    def _while_open(self, t: float, state: str, stall_bin: StallBin | None) -> list[Transition]:
        assert self.open is not None
        if state == STALLED_WINDOW and stall_bin is not None:
            self._open_seconds += stall_bin.seconds.get(STALLED_WINDOW, 0)
            self._open_links += stall_bin.stalled_with_links
            return []
        if state != WORKING:
            return []
        return [self.close(t, WORK_RESUMED, t - self._resolution)]

    def close(self, t: float, reason: str, stalled_until: float | None = None) -> Transition:
        """Close the open finding at ``t`` (work resumed in the bin ending then, or its job ended then);
        ``stalled_until``: where the stalled time ended (the start of the bin that worked), else ``t``."""
        finding = self.open
        assert finding is not None
        self.open = None
        finding.closed_at = t
        until = t if stalled_until is None else max(stalled_until, finding.since)
        finding.close_numbers = {"reason": reason, "evidence": self._evidence(), "stalled_for_s": until - finding.since,
                                 "stalled_gpu_hours": to_float(self._open_seconds) / 3600.0}
        self.closed_seconds += self._open_seconds
        self._open_seconds = self._open_links = 0
        return Transition(CLOSE, finding, t)
