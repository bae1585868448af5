"""The memory limiter: refuse new data while the process holds too much (the Collector's model).

Two limits, as the Collector's ``memory_limiter``: a hard limit (``limit_mib`` or
``limit_percentage`` of the container's memory limit) and a soft limit below it by a spike
allowance (``spike_limit_mib`` / ``spike_limit_percentage``, default 20 % of the hard limit).
Above the soft limit a push receiver refuses requests with a retryable status, so the sender
keeps the data and retries; above it, the limiter also empties the hot paths' caches
(:mod:`otel_ofu.pipeline.caches`: they are built again within an interval) and asks the
allocator to give freed memory back (a full garbage collection and glibc's ``malloc_trim``)
before it measures again.

What is measured is the resident set of the whole process (``/proc/self/statm``), so the limit
covers everything it holds: requests being decoded, the sending queues in memory, processor
state. It is read on every request (about 10 us), not on a timer, so a burst cannot run past
the limit between two checks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from otel_ofu.pipeline import caches
from otel_ofu.pipeline.config import require

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TRIM_INTERVAL_S = 1.0  # at most one gc + malloc_trim per second while over the soft limit
MIB = 1024 * 1024
_NOT_GIVEN = object()


def process_rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm (pages)."""
    fd = os.open("/proc/self/statm", os.O_RDONLY)
    try:
        fields = os.read(fd, 128).split()
    finally:
        os.close(fd)
    return int(fields[1]) * _PAGE


def available_memory_bytes() -> int:
    """The container's memory limit (cgroup v2, then v1), else the machine's physical memory."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path).read().strip()  # noqa: SIM115
        except OSError:
            continue
        if text.isdecimal() and int(text) < (1 << 60):  # "max" or a huge number: no limit
            return int(text)
    return os.sysconf("SC_PHYS_PAGES") * _PAGE


def _libc_function(name: str) -> Callable[..., int] | None:
    """A function of the C library (glibc's malloc_trim, mallopt); None where it has none (musl, macOS)."""
    library = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(library), name) if library else None
    except (OSError, AttributeError):
        return None


def _malloc_trim() -> Callable[[], None]:
    trim = _libc_function("malloc_trim")
    if trim is None:
        return lambda: None
    return lambda: trim(0)


# glibc's mallopt parameters (malloc.h) and the values a running service sets (tune_allocator).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
ALLOCATOR_SETTINGS = {
    M_ARENA_MAX: 2,  # Python runs one thread at a time: the 8 per core that glibc allows only spread memory
    M_MMAP_THRESHOLD: 32 * MIB,  # a request's buffers (its body, the payload made from it) from the heap ...
    M_TRIM_THRESHOLD: 64 * MIB,  # ... kept there for the next request; MemoryLimiter trims when memory is short
}
# The operator's own malloc settings (glibc reads them at start-up): tune_allocator leaves them be.
ALLOCATOR_ENVIRONMENT = ("GLIBC_TUNABLES", "MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                         "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def tune_allocator(environ: Mapping[str, str] = os.environ,
                   mallopt: Callable[[int, int], int] | None | object = _NOT_GIVEN) -> bool:
    """Set glibc malloc for a service that takes megabyte requests from several threads; False when it
    was left as it is (not glibc, or the operator set malloc's own variables).

    Why: with glibc's defaults each request thread's megabyte buffers come from fresh memory maps
    or arenas that are trimmed after every request, so the next request faults its pages in again:
    a processing stage behind a Collector spent 13-15 % of its CPU in the kernel so, 7-9 % with
    these settings (BENCHMARKS.md, section 11). What is kept is bounded (64 MiB of free heap at its
    top) and still given back when memory is short: a receiver's memory_limiter calls malloc_trim
    when the process goes over its soft limit.
    """
    if any(name in environ for name in ALLOCATOR_ENVIRONMENT):
        return False
    if mallopt is _NOT_GIVEN:
        mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    return all([mallopt(parameter, value) == 1 for parameter, value in ALLOCATOR_SETTINGS.items()])  # type: ignore[operator]


@dataclass
class MemoryLimiterConfig:
    """The Collector's memory_limiter, checked per request on the process's resident memory:
    above the soft limit requests are refused, retryably (docs/reliability.md). Off unless a
    limit is set."""

    limit_mib: int = 0  # hard limit, MiB of resident memory; 0: use limit_percentage
    spike_limit_mib: int = 0  # soft limit = hard - spike; 0: 20 % of the hard limit
    limit_percentage: int = 0  # hard limit as a percentage of the container's memory limit
    spike_limit_percentage: int = 0  # soft limit = hard - this percentage; 0: 20 % of the hard limit

    def validate(self) -> None:
        require(self.limit_mib >= 0, "limit_mib", "must be >= 0 (0: off, or limit_percentage)")
        require(self.spike_limit_mib >= 0, "spike_limit_mib", "must be >= 0")
        require(0 <= self.limit_percentage <= 100, "limit_percentage", "must be within 0-100")
        require(0 <= self.spike_limit_percentage <= 100, "spike_limit_percentage", "must be within 0-100")
        require(not (self.limit_mib and self.limit_percentage), "limit_percentage",
                "set either limit_mib or limit_percentage, not both")
        require(not self.limit_mib or self.spike_limit_mib < self.limit_mib, "spike_limit_mib",
                f"must be below limit_mib ({self.limit_mib})")
        require(not self.limit_percentage or self.spike_limit_percentage < self.limit_percentage,
                "spike_limit_percentage", f"must be below limit_percentage ({self.limit_percentage})")

    @property
    def enabled(self) -> bool:
        return bool(self.limit_mib or self.limit_percentage)

    def limits(self, total: int | None = None) -> tuple[int, int]:
        """(soft, hard) in bytes."""
        if self.limit_mib:
            hard = self.limit_mib * MIB
            spike = self.spike_limit_mib * MIB
        else:
            total = available_memory_bytes() if total is None else total
            hard = total * self.limit_percentage // 100
            spike = total * self.spike_limit_percentage // 100
        return hard - (spike or hard // 5), hard


class MemoryLimiter:
    """Says, per request, whether the process may take more data."""

    def __init__(self, soft_bytes: int, hard_bytes: int, measure: Callable[[], int] = process_rss_bytes):
        self.soft, self.hard = soft_bytes, hard_bytes
        self._measure = measure
        self._trim = _malloc_trim()
        self._lock = threading.Lock()
        self._trimmed_at = 0.0
        self.last_bytes = 0
        self.peak_bytes = 0

    @classmethod
    def from_config(cls, config: MemoryLimiterConfig) -> MemoryLimiter | None:
        if not config.enabled:
            return None
        soft, hard = config.limits()
        return cls(soft, hard)

    def over_limit(self) -> str | None:
        """None when below the soft limit; otherwise "soft" or "hard" (after trying to free memory)."""
        used = self._measure()
        self.last_bytes = used
        self.peak_bytes = max(self.peak_bytes, used)
        if used < self.soft:
            return None
        now = time.monotonic()
        with self._lock:
            trim = now - self._trimmed_at >= _TRIM_INTERVAL_S
            if trim:
                self._trimmed_at = now
        if trim:
            caches.release_all()
            gc.collect()
            self._trim()
            used = self._measure()
            self.last_bytes = used
            if used < self.soft:
                return None
        return "hard" if used >= self.hard else "soft"
