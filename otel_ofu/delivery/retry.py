"""What one send attempt returns, and the backoff between attempts (the Collector's).

Transports classify their own failures (gRPC status codes, HTTP status codes) into
retryable or permanent, because only they can see the codes; the delivery loop only reads a
:class:`SendResult`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# What a backend refused some samples of a request for (Prometheus' storage errors, storage/interface.go).
DUPLICATE = "duplicate"  # another value at a timestamp the series holds
OUT_OF_ORDER = "out_of_order"  # older than the series' newest sample (no out-of-order window)
TOO_OLD = "too_old"  # older than the out-of-order window allows
OUT_OF_BOUNDS = "out_of_bounds"  # older than the oldest time the database takes
BY_TIME = frozenset({TOO_OLD, OUT_OF_BOUNDS})  # refused for their time alone: every sample of that age is


@dataclass(frozen=True, slots=True)
class SampleRefusal:
    """A request refused for some of its samples: the rest may be fine (Prometheus refuses the whole request
    and stores none of it), so the delivery loop splits it to set the refused ones apart."""

    kinds: frozenset[str]  # DUPLICATE, OUT_OF_ORDER, TOO_OLD, OUT_OF_BOUNDS
    timestamps_ms: frozenset[int] = frozenset()  # the sample times the backend named (a duplicate's)

    @property
    def by_time(self) -> bool:
        """Every refused sample was refused for its age: the samples of one time share their fate."""
        return self.kinds <= BY_TIME


@dataclass(frozen=True, slots=True)
class SendResult:
    ok: bool
    retryable: bool = False
    reason: str = ""  # short code for logs and the retried counter: "UNAVAILABLE", "http_503", ...
    detail: str = ""  # what the backend said, for the log line
    retry_after: float | None = None  # seconds the backend asked us to wait (Retry-After, RetryInfo)
    rejected: int = 0  # items the backend refused in a partial success (never retried)
    too_large: bool = False  # refused for its size (HTTP 413, RESOURCE_EXHAUSTED without RetryInfo): split it
    refusal: SampleRefusal | None = None  # refused for some of its samples: split it to find them

    @classmethod
    def success(cls, rejected: int = 0, detail: str = "") -> SendResult:
        return cls(True, rejected=rejected, detail=detail)

    @classmethod
    def retry(cls, reason: str, detail: str = "", retry_after: float | None = None) -> SendResult:
        return cls(False, True, reason, detail, retry_after)

    @classmethod
    def permanent(cls, reason: str, detail: str = "", too_large: bool = False,
                  refusal: SampleRefusal | None = None) -> SendResult:
        return cls(False, False, reason, detail, too_large=too_large, refusal=refusal)


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
