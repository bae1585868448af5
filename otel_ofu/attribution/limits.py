"""The series bound: at most ``max_jobs`` distinct job ids at a time.

Each job id a sample carries takes a slot until it has not been seen for ``idle_timeout``
(data time, so replays and the accelerated sim behave like live data); when every slot is
taken, new jobs map to one fixed overflow id. Jobs already holding a slot keep it: a burst of
short jobs cannot evict the long-running ones an operator is watching.
"""

from __future__ import annotations

from collections import OrderedDict


class JobLimiter:
    def __init__(self, max_jobs: int, idle_timeout_ns: int, overflow_id: str):
        self.max_jobs = max_jobs
        self.idle_timeout_ns = idle_timeout_ns
        self.overflow_id = overflow_id
        self._last_seen: OrderedDict[str, int] = OrderedDict()  # least recently seen first
        self._now = 0

    def admit(self, job_id: str, time_unix_nano: int) -> bool:
        """True if ``job_id`` has (or now gets) a slot; False if it must be overflowed."""
        self._now = max(self._now, time_unix_nano)
        if job_id in self._last_seen:
            self._last_seen[job_id] = max(self._last_seen[job_id], time_unix_nano)
            self._last_seen.move_to_end(job_id)
            return True
        self._expire()
        if len(self._last_seen) >= self.max_jobs:
            return False
        self._last_seen[job_id] = time_unix_nano
        return True

    def _expire(self) -> None:
        horizon = self._now - self.idle_timeout_ns
        while self._last_seen:
            job, seen = next(iter(self._last_seen.items()))
            if seen >= horizon:
                break
            del self._last_seen[job]

    def __len__(self) -> int:
        return len(self._last_seen)
