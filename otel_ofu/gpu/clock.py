"""A clock the GPU receivers read, so tests can drive windows and backoff without sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (windows, backoff)."""

    def time_ns(self) -> int:
        """Wall-clock time in ns since the epoch (sample timestamps)."""


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time_ns(self) -> int:
        return time.time_ns()


SYSTEM_CLOCK = SystemClock()
