"""What one send attempt returns, and the backoff between attempts (the Collector's).

Transports classify their own failures (gRPC status codes, HTTP status codes) into
retryable or permanent, because only they can see the codes; the delivery loop only reads a
:class:`SendResult`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SendResult:
    ok: bool
    retryable: bool = False
    reason: str = ""  # short code for logs and the retried counter: "UNAVAILABLE", "http_503", ...
    detail: str = ""  # what the backend said, for the log line
    retry_after: float | None = None  # seconds the backend asked us to wait (Retry-After, RetryInfo)
    rejected: int = 0  # items the backend refused in a partial success (never retried)
    too_large: bool = False  # refused for its size (HTTP 413, RESOURCE_EXHAUSTED without RetryInfo): split it

    @classmethod
    def success(cls, rejected: int = 0, detail: str = "") -> SendResult:
        return cls(True, rejected=rejected, detail=detail)

    @classmethod
    def retry(cls, reason: str, detail: str = "", retry_after: float | None = None) -> SendResult:
        return cls(False, True, reason, detail, retry_after)

    @classmethod
    def permanent(cls, reason: str, detail: str = "", too_large: bool = False) -> SendResult:
        return cls(False, False, reason, detail, too_large=too_large)


class Backoff:
    """Exponential backoff with jitter: initial x multiplier^n, capped at max, +-randomization.

    The defaults match the Collector's exporterhelper (cenkalti/backoff): multiplier 1.5,
    randomization factor 0.5.
    """

    def __init__(self, initial: float, maximum: float, multiplier: float = 1.5, randomization: float = 0.5,
                 rng: random.Random | None = None):
        self.initial, self.maximum = initial, maximum
        self.multiplier, self.randomization = multiplier, randomization
        self._rng = rng or random.Random()
        self._current = initial

    def next(self) -> float:
        base = self._current
        self._current = min(self._current * self.multiplier, self.maximum)
        delta = self.randomization * base
        return min(max(base + self._rng.uniform(-delta, delta), 0.0), self.maximum)
