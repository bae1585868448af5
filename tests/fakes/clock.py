"""A clock tests advance by hand: windows and backoff without sleeping."""

from __future__ import annotations


class FakeClock:
    def __init__(self, wall_s: float = 1_700_000_000.0, mono_s: float = 1_000.0):
        self.wall_s = wall_s
        self.mono_s = mono_s

    def monotonic(self) -> float:
        return self.mono_s

    def time_ns(self) -> int:
        return int(round(self.wall_s * 1e9))

    def advance(self, seconds: float) -> None:
        self.wall_s += seconds
        self.mono_s += seconds
