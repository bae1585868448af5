"""What the audit and the regression detector report: findings that open and close."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MFU_GAP = "mfu_gap"
REGRESSION = "regression"
STALLED = "stalled"  # GPUs busy doing nothing (jobs.stall)
KINDS = (MFU_GAP, REGRESSION, STALLED)

# Causes: the likely reason, named for the person who has to fix it.
FLOP_FORMULA_OVERCOUNT = "flop_formula_overcount"  # reported MFU above OFU
UNCOUNTED_PADDING_OR_RECOMPUTE = "uncounted_padding_or_recompute"  # OFU far above reported MFU
SUSTAINED_DROP = "sustained_ofu_drop"  # OFU well below the job's own baseline
STALLED_ENGINE_BUSY_NO_WORK = "engine_busy_no_work"  # engine busy, tensor pipes, DRAM and links idle (jobs.stall)


@dataclass(frozen=True)
class Cause:
    """What a cause code means, and what the person who owns the job can do about it."""

    meaning: str
    action: str


CAUSES: dict[str, Cause] = {
    FLOP_FORMULA_OVERCOUNT: Cause(
        "the job reports more MFU than its tensor cores did: its FLOP formula counts work that never ran",
        "check the formula the framework uses (MoE experts counted at full hidden size, attention or "
        "embedding FLOPs counted twice) and the peak it divides by (the peak at the precision in use); "
        "until it is fixed, trust OFU"),
    UNCOUNTED_PADDING_OR_RECOMPUTE: Cause(
        "the tensor cores did far more work than the job's FLOP formula counts",
        "add what the formula leaves out (activation recomputation, padded sequences, layers without "
        "FLOP accounting such as Mamba blocks), or report achieved TFLOP/s instead of MFU"),
    SUSTAINED_DROP: Cause(
        "the job's OFU fell well below its own recent baseline and stayed there",
        "look at what changed when it began ('since'): a debug setting (TORCH_DISTRIBUTED_DEBUG=DETAIL "
        "serialises NCCL calls), a slow node or link, data loading, a new software version"),
    STALLED_ENGINE_BUSY_NO_WORK: Cause(
        "the job's GPUs keep a kernel running while their tensor pipes, memory and links do nothing: a "
        "collective that never completes (an NCCL deadlock, a rank gone) or a kernel spinning on a flag",
        "look at the job's ranks now (py-spy dump, NCCL_DEBUG=INFO, torch.distributed's flight recorder): a rank "
        "that died or waits in another collective; restart it from its checkpoint rather than let it hold the "
        "GPUs until its NCCL timeout (docs/runbooks.md#ofujobstalled)"),
}


def cause_of(code: str) -> Cause:
    """The meaning and action of a cause code; a code this version does not know (a newer
    recording) says so rather than failing."""
    return CAUSES.get(code) or Cause(f"cause {code!r} (not known to this version of otel-ofu)",
                                     "see the version of otel-ofu that recorded it")

OPEN = "open"
CLOSE = "close"
# Why a finding closed other than by clearing (ofu.finding.reason on its close event).
JOB_END = "job_end"  # its job ended while it was open
NO_MFU_REPORT = "no_mfu_report"  # an mfu_gap whose job sent no MFU report for a whole audit window

# What the jobs processor emits (events and attribute names); readers such as the console use them too.
WINDOW = "ofu.window"
FINDING_KIND = "ofu.finding.kind"
FINDING_CAUSE = "ofu.finding.cause"
FINDING_ID = "ofu.finding.id"
EVENT_JOB_START = "ofu.job.start"
EVENT_JOB_END = "ofu.job.end"
EVENT_FINDING_OPEN = "ofu.finding.open"
EVENT_FINDING_CLOSE = "ofu.finding.close"
JOB_END_REASON = "ofu.job.end_reason"


@dataclass
class Finding:
    """One finding. Times are data time in seconds; numbers are named fractions or ratios."""

    kind: str
    cause: str
    opened_at: float  # when it was raised
    since: float  # when the condition began (start of the first bin that showed it)
    numbers: dict[str, float | str] = field(default_factory=dict)  # at open
    closed_at: float | None = None
    close_numbers: dict[str, float | str] = field(default_factory=dict)  # at close
    id: str = ""  # "<job>/<kind>/<n>", set by the job's tracker: pairs open and close events

    @property
    def is_open(self) -> bool:
        return self.closed_at is None


@dataclass(frozen=True)
class Transition:
    """A finding opened or closed at ``time`` (data seconds)."""

    action: str  # OPEN | CLOSE
    finding: Finding
    time: float


def sustain_bins(duration_s: float, resolution_s: float) -> int:
    """How many consecutive evaluations (one per resolution bin) make ``duration_s``."""
    return max(1, math.ceil(duration_s / resolution_s - 1e-9))
