"""Capped exponential backoff for reconnecting to a GPU library that went away.

A plain class rather than a retry library: the receivers do not retry inside a call, they
decide at each poll whether it is time for the next attempt, on a clock tests can drive.
"""

from __future__ import annotations


class Backoff:
    def __init__(self, initial_s: float, max_s: float, factor: float = 2.0):
        self.initial_s = initial_s
        self.max_s = max(max_s, initial_s)
        self.factor = factor
        self.failures = 0
        self.next_attempt = 0.0  # monotonic seconds; 0 = now

    def ready(self, now: float) -> bool:
        return now >= self.next_attempt

    def failed(self, now: float) -> float:
        """Record a failed attempt at ``now``; returns the delay until the next one."""
        delay = min(self.max_s, self.initial_s * self.factor ** self.failures)
        self.failures += 1
        self.next_attempt = now + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.next_attempt = 0.0

    def wait_s(self, now: float) -> float:
        return max(0.0, self.next_attempt - now)
