"""The bounded sending queue and where its batches live (memory or SQLite).

:class:`BoundedQueue` keeps only batch ids in memory (oldest first) and a set of ids being
sent; the payloads live in a store. Its length counts both waiting and in-flight batches, so
``capacity`` bounds everything accepted and not yet sent or dropped. A batch leaves the store
only when :meth:`BoundedQueue.done` says it was sent or dropped for good: with
:class:`SqliteStore`, a crash at any point leaves every accepted, unsent batch on disk.
"""

from __future__ import annotations

import fcntl
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(slots=True)
class Item:
    """One serialized OTLP export request waiting to be sent."""

    signal: str  # "metrics" | "logs"
    payload: bytes
    count: int  # data points or log records in it: what sent/dropped counters count
    id: int = 0  # assigned by the store


class QueueFull(Exception):
    """No room, and nothing that may be dropped to make room."""


class Store(Protocol):
    persistent: bool

    def ids(self) -> list[int]: ...
    def add(self, item: Item) -> int: ...
    def load(self, item_id: int) -> Item: ...
    def describe(self, item_id: int) -> tuple[str, int]: ...
    def remove(self, item_id: int) -> tuple[str, int]: ...
    def close(self) -> None: ...


class MemoryStore:
    persistent = False

    def __init__(self) -> None:
        self._items: dict[int, Item] = {}
        self._next = 1

    def ids(self) -> list[int]:
        return sorted(self._items)

    def add(self, item: Item) -> int:
        item.id, self._next = self._next, self._next + 1
        self._items[item.id] = item
        return item.id

    def load(self, item_id: int) -> Item:
        return self._items[item_id]

    def describe(self, item_id: int) -> tuple[str, int]:
        item = self._items[item_id]
        return item.signal, item.count

    def remove(self, item_id: int) -> tuple[str, int]:
        item = self._items.pop(item_id)
        return item.signal, item.count

    def close(self) -> None:
        self._items.clear()


class SqliteStore:
    """Batches in one SQLite table (WAL): each add and remove is its own committed transaction.

    WAL with ``synchronous=NORMAL`` survives a process crash (kill -9) without an fsync per
    batch; a power loss may lose the last few commits. An exclusive lock file stops a second
    process from sending the same batches (the kernel releases it when the holder dies).
    """

    persistent = True
    _SCHEMA = ("CREATE TABLE IF NOT EXISTS queue (id INTEGER PRIMARY KEY AUTOINCREMENT, signal TEXT NOT NULL, "
               "items INTEGER NOT NULL, payload BLOB NOT NULL, enqueued_unix_nano INTEGER NOT NULL)")

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.path.with_name(self.path.name + ".lock"), "a")  # noqa: SIM115 (held open)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise RuntimeError(f"sending queue {self.path} is in use by another process") from None
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(self._SCHEMA)

    def ids(self) -> list[int]:
        return [row[0] for row in self._db.execute("SELECT id FROM queue ORDER BY id")]

    def add(self, item: Item) -> int:
        cursor = self._db.execute("INSERT INTO queue (signal, items, payload, enqueued_unix_nano) VALUES (?, ?, ?, ?)",
                                  (item.signal, item.count, item.payload, time.time_ns()))
        item.id = int(cursor.lastrowid or 0)
        return item.id

    def load(self, item_id: int) -> Item:
        signal, count, payload = self._db.execute("SELECT signal, items, payload FROM queue WHERE id = ?",
                                                  (item_id,)).fetchone()
        return Item(signal, bytes(payload), count, item_id)

    def describe(self, item_id: int) -> tuple[str, int]:
        signal, count = self._db.execute("SELECT signal, items FROM queue WHERE id = ?", (item_id,)).fetchone()
        return signal, count

    def remove(self, item_id: int) -> tuple[str, int]:
        row = self._db.execute("DELETE FROM queue WHERE id = ? RETURNING signal, items", (item_id,)).fetchone()
        return (row[0], row[1]) if row else ("", 0)

    def close(self) -> None:
        self._db.close()
        self._lock_file.close()


class BoundedQueue:
    """At most ``capacity`` batches accepted and not yet done; thread-safe."""

    def __init__(self, store: Store, capacity: int):
        self.store = store
        self.capacity = capacity
        self._waiting: deque[int] = deque(store.ids())
        self._inflight: set[int] = set()
        # Two conditions on one lock, as in queue.Queue: a new batch wakes one idle consumer
        # (not all of them); a finished one wakes whoever waits for room or for the drain.
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)  # consumers in take()
        self._shrunk = threading.Condition(self._lock)  # put(block=True) and wait_empty()
        self._stopped = False
        self.high_water = len(self._waiting)  # the most batches ever held at once (tests, benchmarks)

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting) + len(self._inflight)

    def put(self, item: Item, *, block: bool, timeout: float | None = None) -> list[tuple[str, int]]:
        """Accept ``item``; returns the (signal, count) of batches evicted to make room.

        Full and ``block``: wait up to ``timeout`` for room, then raise QueueFull. Full and not
        ``block``: drop the oldest waiting batches; QueueFull only if all are in flight.
        """
        evicted: list[tuple[str, int]] = []
        with self._lock:
            if block:
                deadline = None if timeout is None else time.monotonic() + timeout
                while self._length() >= self.capacity:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise QueueFull
                    self._shrunk.wait(remaining)
            else:
                while self._length() >= self.capacity and self._waiting:
                    evicted.append(self.store.remove(self._waiting.popleft()))
                if self._length() >= self.capacity:
                    raise QueueFull
            self._waiting.append(self.store.add(item))
            self.high_water = max(self.high_water, self._length())
            self._not_empty.notify()
        return evicted

    def take(self, timeout: float | None = None) -> Item | None:
        """The oldest waiting batch, now in flight; None after ``timeout`` or once stopped.

        Without a timeout it blocks until a batch arrives or :meth:`stop_taking` runs, so an
        idle consumer costs no wake-ups (a node daemon's consumers are idle almost always).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not self._waiting and not self._stopped:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._not_empty.wait(remaining)
            if self._stopped:
                return None
            item_id = self._waiting.popleft()
            self._inflight.add(item_id)
            return self.store.load(item_id)

    def done(self, item: Item) -> None:
        """Sent or dropped for good: forget it (and delete it from disk)."""
        with self._lock:
            self.store.remove(item.id)
            self._inflight.discard(item.id)
            self._shrunk.notify_all()

    def release(self, item: Item) -> None:
        """Not sent (shutting down): back to the head of the queue, still stored."""
        with self._lock:
            if item.id in self._inflight:
                self._inflight.discard(item.id)
                self._waiting.appendleft(item.id)
                self._not_empty.notify()

    def wait_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._length():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._shrunk.wait(remaining)
            return True

    def pending(self) -> list[tuple[str, int]]:
        """(signal, count) of every batch accepted and not done."""
        with self._lock:
            return [self.store.describe(i) for i in (*self._waiting, *self._inflight)]

    def stop_taking(self) -> None:
        """Shutdown: every blocked and later :meth:`take` returns None; the batches stay stored.

        Set under the lock that ``take`` checks it under, so no consumer can miss it.
        """
        with self._lock:
            self._stopped = True
            self._not_empty.notify_all()

    def close(self) -> None:
        with self._lock:
            self.store.close()

    def _length(self) -> int:
        return len(self._waiting) + len(self._inflight)
