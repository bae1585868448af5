"""The bounded sending queue and where its batches live (memory or SQLite).

:class:`BoundedQueue` keeps only batch ids and sizes in memory (oldest first) and a set of ids
being sent; the payloads live in a store. Its size counts both waiting and in-flight batches,
in the unit of its sizer (batches, items or payload bytes, as the Collector's
``sending_queue.sizer``), so ``capacity`` bounds everything accepted and not yet sent or
dropped. A batch leaves the store only when :meth:`BoundedQueue.done` says it was sent or
dropped for good: with :class:`SqliteStore`, a crash at any point leaves every accepted,
unsent batch on disk.
"""

from __future__ import annotations

import fcntl
import logging
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from otel_ofu.pipeline.component import StartError

log = logging.getLogger("otel_ofu.delivery")

WAL_SIZE_LIMIT = 4 * 1024 * 1024
# Opening a queue file that is not corrupt but fails now (disk full, read-only, locked, I/O error):
# this many tries, waiting 1 s, 2 s, ... between them, before the exporter refuses to start.
OPEN_ATTEMPTS = 3
Sizer = Literal["requests", "items", "bytes"]
SIZERS: tuple[str, ...] = ("requests", "items", "bytes")


@dataclass(slots=True)
class Item:
    """One serialized OTLP export request waiting to be sent."""

    signal: str  # "metrics" | "logs"
    payload: bytes
    count: int  # data points or log records in it: what sent/dropped counters count
    id: int = 0  # assigned by the store


class QueueFull(Exception):
    """No room, and nothing that may be dropped to make room."""


class QueueStorageError(Exception):
    """The store failed (disk full, I/O error, an unreadable row): what was lost is in ``lost``."""

    def __init__(self, message: str, lost: list[tuple[str, int]] | None = None):
        super().__init__(message)
        self.lost = lost or []


class QueueOpenError(StartError):
    """A queue file that is not corrupt cannot be opened now: it is kept as it is, with its batches."""


def is_corruption(error: sqlite3.Error) -> bool:
    """SQLite says the file is damaged or not a database (SQLITE_CORRUPT*, SQLITE_NOTADB), not that it
    cannot be used now (SQLITE_FULL, SQLITE_IOERR*, SQLITE_READONLY*, SQLITE_BUSY, SQLITE_CANTOPEN, ...)."""
    name = getattr(error, "sqlite_errorname", "") or ""
    return name.startswith("SQLITE_CORRUPT") or name == "SQLITE_NOTADB"


class Store(Protocol):
    persistent: bool

    def entries(self) -> list[tuple[int, str, int, int]]: ...
    def add(self, item: Item) -> int: ...
    def load(self, item_id: int) -> Item: ...
    def remove(self, item_id: int) -> None: ...
    def close(self) -> None: ...


class MemoryStore:
    persistent = False

    def __init__(self) -> None:
        self._items: dict[int, Item] = {}
        self._next = 1

    def entries(self) -> list[tuple[int, str, int, int]]:
        return [(i, it.signal, it.count, len(it.payload)) for i, it in sorted(self._items.items())]

    def add(self, item: Item) -> int:
        item.id, self._next = self._next, self._next + 1
        self._items[item.id] = item
        return item.id

    def load(self, item_id: int) -> Item:
        return self._items[item_id]

    def remove(self, item_id: int) -> None:
        self._items.pop(item_id, None)

    def close(self) -> None:
        self._items.clear()


class SqliteStore:
    """Batches in one SQLite table (WAL): each add and remove is its own committed transaction.

    WAL with ``synchronous=NORMAL`` survives a process crash (kill -9) without an fsync per
    batch; a power loss may lose the last few commits. An exclusive lock file stops a second
    process from sending the same batches (the kernel releases it when the holder dies). A
    file SQLite says is corrupt (a torn disk, a file that is not a database) is moved aside and a
    fresh queue started, so a corrupt file never keeps the process from starting. Any other
    failure to open it (disk full, read-only, locked, I/O error) leaves it where it is, with its
    batches: it is tried again, and then :class:`QueueOpenError` says why.
    """

    persistent = True
    _SCHEMA = ("CREATE TABLE IF NOT EXISTS queue (id INTEGER PRIMARY KEY AUTOINCREMENT, signal TEXT NOT NULL, "
               "items INTEGER NOT NULL, payload BLOB NOT NULL, enqueued_unix_nano INTEGER NOT NULL)")

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.moved_aside: Path | None = None  # where a corrupt file went, if one was found
        self._lock_file = open(self.path.with_name(self.path.name + ".lock"), "a")  # noqa: SIM115 (held open)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise RuntimeError(f"sending queue {self.path} is in use by another process") from None
        try:
            self._db, self._entries = self._open_retrying()
        except sqlite3.Error as exc:
            if not is_corruption(exc):
                self._lock_file.close()
                raise QueueOpenError(
                    f"sending queue file {self.path} cannot be opened ({exc}; {_error_name(exc)}) after "
                    f"{OPEN_ATTEMPTS} tries: it is not corrupt, so it is kept as it is, with the batches it holds; "
                    "free disk space, or make it writable or unlocked, and start again") from None
            self.moved_aside = self._move_aside(exc)
            self._db, self._entries = self._open()

    def _open_retrying(self) -> tuple[sqlite3.Connection, list[tuple[int, str, int, int]]]:
        """:meth:`_open`, tried again after an error that is not corruption (it may pass: space freed)."""
        for attempt in range(1, OPEN_ATTEMPTS + 1):
            try:
                return self._open()
            except sqlite3.Error as exc:
                # A locked file was already waited for (the connection's 30 s busy timeout).
                if is_corruption(exc) or attempt == OPEN_ATTEMPTS or _error_name(exc).startswith("SQLITE_BUSY"):
                    raise
                log.warning("sending queue file %s cannot be opened (%s; %s): trying again in %d s", self.path, exc,
                            _error_name(exc), attempt)
                time.sleep(attempt)
        raise AssertionError("unreachable")

    def _open(self) -> tuple[sqlite3.Connection, list[tuple[int, str, int, int]]]:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        try:
            # Batches are blobs of hundreds of KB: with 16 KiB pages each is a chain of a few dozen
            # overflow pages, not a hundred, and adding and deleting one costs about half as much
            # (benchmarks/fleet.py). Takes effect when the file is created; an existing one keeps its pages.
            db.execute("PRAGMA page_size=16384")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            # After each checkpoint the WAL file is cut back to this, so the queue's disk use is its
            # bound (sizer bytes) plus SQLite's page overhead plus at most about this much.
            db.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            db.execute(self._SCHEMA)
            # Reads every row's header: a damaged table fails here, at start, not on the first send.
            entries = [tuple(row) for row in db.execute(
                "SELECT id, signal, items, length(payload) FROM queue ORDER BY id")]
        except sqlite3.Error:
            db.close()
            raise
        return db, entries  # type: ignore[return-value]

    def _move_aside(self, error: Exception) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            source = Path(f"{self.path}{suffix}")
            if source.exists():
                source.rename(Path(f"{target}{suffix}"))
        log.error("sending queue file %s cannot be read (%s): moved it to %s and started an empty queue; "
                  "the batches in it will not be sent", self.path, error, target)
        return target

    def entries(self) -> list[tuple[int, str, int, int]]:
        return list(self._entries)

    def add(self, item: Item) -> int:
        cursor = self._db.execute("INSERT INTO queue (signal, items, payload, enqueued_unix_nano) VALUES (?, ?, ?, ?)",
                                  (item.signal, item.count, item.payload, time.time_ns()))
        item.id = int(cursor.lastrowid or 0)
        return item.id

    def load(self, item_id: int) -> Item:
        signal, count, payload = self._db.execute("SELECT signal, items, payload FROM queue WHERE id = ?",
                                                  (item_id,)).fetchone()
        return Item(signal, bytes(payload), count, item_id)

    def remove(self, item_id: int) -> None:
        self._db.execute("DELETE FROM queue WHERE id = ?", (item_id,))

    def close(self) -> None:
        self._db.close()
        self._lock_file.close()


def _error_name(error: sqlite3.Error) -> str:
    return getattr(error, "sqlite_errorname", "") or type(error).__name__


class BoundedQueue:
    """At most ``capacity`` (in ``sizer`` units) accepted and not yet done; thread-safe."""

    def __init__(self, store: Store, capacity: int, sizer: Sizer = "requests"):
        if sizer not in SIZERS:
            raise ValueError(f"unknown sizer {sizer!r}")
        self.store = store
        self.capacity = capacity
        self.sizer = sizer
        # id -> (signal, items, size in sizer units): everything accepted and not done.
        self._meta: dict[int, tuple[str, int, int]] = {}
        self._waiting: deque[int] = deque()
        for item_id, signal, count, nbytes in store.entries():
            self._meta[item_id] = (signal, count, self._units(count, nbytes))
            self._waiting.append(item_id)
        self._used = sum(size for _, _, size in self._meta.values())
        self._inflight: set[int] = set()
        # Two conditions on one lock, as in queue.Queue: a new batch wakes one idle consumer
        # (not all of them); a finished one wakes whoever waits for room or for the drain.
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)  # consumers in take()
        self._shrunk = threading.Condition(self._lock)  # put(block=True) and wait_empty()
        self._stopped = False
        self.high_water = self._used  # the most ever held at once, in sizer units (tests, benchmarks)

    def _units(self, count: int, nbytes: int) -> int:
        if self.sizer == "bytes":
            return nbytes
        if self.sizer == "items":
            return count
        return 1

    def size_of(self, item: Item) -> int:
        return self._units(item.count, len(item.payload))

    def __len__(self) -> int:
        """Batches accepted and not done."""
        with self._lock:
            return len(self._meta)

    def used(self) -> int:
        """What the batches accepted and not done take, in sizer units."""
        with self._lock:
            return self._used

    def put(self, item: Item, *, block: bool, timeout: float | None = None) -> list[tuple[str, int]]:
        """Accept ``item``; returns the (signal, count) of batches evicted to make room.

        Full and ``block``: wait up to ``timeout`` for room, then raise QueueFull. Full and not
        ``block``: drop the oldest waiting batches; QueueFull only if all are in flight. The new
        batch is stored before anything is evicted, so a failing store (QueueStorageError)
        loses only the new batch, never the old ones.
        """
        size = self.size_of(item)
        if size > self.capacity:
            raise QueueFull(f"one batch of {size} {self.sizer} exceeds the queue's capacity {self.capacity}")
        evicted: list[tuple[str, int]] = []
        with self._lock:
            if block:
                deadline = None if timeout is None else time.monotonic() + timeout
                while self._used + size > self.capacity:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise QueueFull
                    self._shrunk.wait(remaining)
            try:
                new_id = self.store.add(item)
            except Exception as exc:
                raise QueueStorageError(f"cannot store the batch: {exc}") from exc
            self._meta[new_id] = (item.signal, item.count, size)
            self._used += size
            self._waiting.append(new_id)
            while self._used > self.capacity and len(self._waiting) > 1:
                oldest = self._waiting.popleft()
                signal, count, _ = self._forget(oldest)
                evicted.append((signal, count))
            if self._used > self.capacity:  # the rest is in flight: no room after all
                self._waiting.pop()
                self._forget(new_id)
                raise QueueFull
            self.high_water = max(self.high_water, self._used)
            self._not_empty.notify()
        return evicted

    def _forget(self, item_id: int) -> tuple[str, int, int]:
        """Drop one batch from the store and the books (lock held); a store error is logged.

        A row the store failed to delete is still counted as gone: it would only be sent
        again after a restart, never lost.
        """
        meta = self._meta.pop(item_id)
        self._used -= meta[2]
        try:
            self.store.remove(item_id)
        except Exception as exc:
            log.error("sending queue: cannot delete batch %d from the store: %s", item_id, exc)
        return meta

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
            try:
                item = self.store.load(item_id)
            except Exception as exc:
                signal, count, _ = self._forget(item_id)
                self._shrunk.notify_all()
                raise QueueStorageError(f"cannot read batch {item_id} from the store: {exc}",
                                        [(signal, count)]) from exc
            self._inflight.add(item_id)
            return item

    def done(self, item: Item) -> None:
        """Sent or dropped for good: forget it (and delete it from disk)."""
        with self._lock:
            if item.id in self._meta:
                self._forget(item.id)
            self._inflight.discard(item.id)
            self._shrunk.notify_all()

    def replace(self, item: Item, parts: list[Item]) -> None:
        """An in-flight batch becomes ``parts`` (a refused batch split in two), first in line.

        The parts are stored before the batch is deleted; if storing fails, the batch stays
        in flight and QueueStorageError is raised.
        """
        with self._lock:
            added: list[int] = []
            try:
                for part in parts:
                    added.append(self.store.add(part))
            except Exception as exc:
                for part_id in added:
                    self.store.remove(part_id)
                raise QueueStorageError(f"cannot store the split batch: {exc}") from exc
            for part, part_id in zip(parts, added):
                size = self.size_of(part)
                self._meta[part_id] = (part.signal, part.count, size)
                self._used += size
            self._inflight.discard(item.id)
            if item.id in self._meta:
                self._forget(item.id)
            self._waiting.extendleft(reversed(added))
            self.high_water = max(self.high_water, self._used)
            self._not_empty.notify(len(added))

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
            while self._meta:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._shrunk.wait(remaining)
            return True

    def pending(self, exclude: set[int] | frozenset[int] = frozenset()) -> list[tuple[str, int]]:
        """(signal, count) of every batch accepted and not done, but those in ``exclude``."""
        with self._lock:
            ids = [i for i in (*self._waiting, *self._inflight) if i in self._meta and i not in exclude]
            return [self._meta[i][:2] for i in ids]

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
