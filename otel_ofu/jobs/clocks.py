"""Hosts' clocks as their points show them: each host's data time, arrival and usual lead."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from otel_ofu.core.model import HOST_NAME, Attributes, GpuKey


@dataclass(slots=True)
class HostClock:
    """One host's clock, as its points show it.

    ``data``: the newest data time it sent (its own clock); ``arrived``: when its newest
    point arrived (the caller's clock); ``lead``: how far its data has run ahead of the
    caller's clock at most (its skew, or a simulation's acceleration), None until a point
    is accepted; ``pending``: a jump ahead not yet confirmed (lead, batch number).
    """

    data: float
    arrived: float
    lead: float | None = None
    pending: tuple[float, int] | None = None
    gpus: set[tuple] = field(default_factory=set)  # its (GPU, job) keys in JobBook._gpu_last


def source_of(resource: Attributes, gpu: GpuKey) -> Any:
    """The clock a GPU point was stamped by: its host; the GPU itself when it names no host."""
    for key, value in resource:
        if key == HOST_NAME and value not in (None, ""):
            return str(value)
    return gpu
