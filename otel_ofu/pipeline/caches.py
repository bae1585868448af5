"""The hot paths' caches: bounded by entries, and emptied when memory runs short.

Why one place: what repeats every interval (a GPU's encoded resource and template, decoded
attribute sets, a GPU's facts, shapes of requests) is kept between batches, and that is most
of the speed of a processing stage or a jobs tier (BENCHMARKS.md, sections 3 and 6). Each
cache is a plain dict that starts over when it reaches its bound, so a fleet whose resources
churn (jobs come and go, a sender with a per-request attribute) cannot grow it without limit.
But a bound in entries is not a bound in bytes, and a cache filled by churn holds that
memory for good: with a ``memory_limiter`` set, that alone could keep the process over its
soft limit and refusing data. So the memory limiter calls :func:`release_all` before it
measures again: every cache is emptied (the working set comes back within an interval, at
the cost of building it again).

A :class:`Cache` is a ``dict`` (reads are the C ``dict.get``); :meth:`Cache.put` adds with
the bound. Emptying one from another thread is safe: a reader that misses builds the value.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger("otel_ofu.caches")

_lock = threading.Lock()
_caches: list[weakref.ref[Cache]] = []
_releasers: list[Callable[[], object]] = []


class Cache(dict):
    """A dict of at most ``max_entries`` entries: full, it starts over; :func:`release_all` empties it."""

    def __init__(self, name: str, max_entries: int):
        super().__init__()
        self.name = name
        self.max_entries = max_entries
        with _lock:
            _caches[:] = [ref for ref in _caches if ref() is not None]
            _caches.append(weakref.ref(self))

    def put(self, key: Any, value: Any) -> Any:
        """Keep ``value`` under ``key`` (emptying the cache first when it is full); returns ``value``."""
        if len(self) >= self.max_entries:
            self.clear()  # start over rather than grow: the working set comes back within an interval
        self[key] = value
        return value

    def shared(self, value: Any) -> Any:
        """One object for equal values: the one kept, or ``value`` (then kept)."""
        found = self.get(value)
        return found if found is not None else self.put(value, value)


def on_release(release: Callable[[], object]) -> Callable[[], object]:
    """Also call ``release`` from :func:`release_all` (a cache that is not a :class:`Cache`:
    an ``lru_cache``'s ``cache_clear``, a store of shapes). Returns ``release``."""
    with _lock:
        _releasers.append(release)
    return release


def entries() -> int:
    """Entries held by every live :class:`Cache` (what :func:`release_all` would drop)."""
    with _lock:
        live = [ref() for ref in _caches]
    return sum(len(cache) for cache in live if cache is not None)


def release_all() -> int:
    """Empty every cache; returns the :class:`Cache` entries dropped."""
    with _lock:
        live = [ref() for ref in _caches]
        releasers = list(_releasers)
    dropped = 0
    for cache in live:
        if cache is not None:
            dropped += len(cache)
            cache.clear()
    for release in releasers:
        release()
    if dropped:
        log.debug("memory short: %d cached entries dropped", dropped)
    return dropped
