"""The jobs processor's own on-disk state: a snapshot of its :class:`JobBook` and a journal since.

Why: a jobs-tier instance killed (SIGKILL, OOM, node loss) and restarted must resume its jobs
(lifetime aggregates, regression baselines, open findings) without losing or double counting
what it had accepted, and must never emit a job's bin again with another value (a backend
refuses a second value at a timestamp it holds). The processor journals each batch *before*
its outputs go to the exporters (write-ahead): the points it used, and the job points and
events it made of them. Once the exporters took the batch (the sending queue, on disk in a
jobs tier) a mark says so. So after a crash:

- every batch the processor worked is in the journal and replayed on start: its bins are closed
  in the state and are never made again from other data;
- a batch whose outputs have no mark may not have reached the exporters: its outputs are read
  back from the journal and sent again, as they were (the same points, the same values: a
  backend keeps one);
- a batch the receiver had not acknowledged is sent again by the gateway; the jobs' state
  counts its points once (a GPU's window already covered is skipped).

The snapshot is written to a temporary file, synced and renamed over the old one (atomic),
every ``checkpoint_interval`` or when the journal passes ``max_journal_bytes``; the journal then
starts over. Each file carries a generation, so a crash between the two steps cannot replay a
journal into the snapshot that already holds it. Both are pickles read back through an
allow-list (only otel-ofu's jobs classes and plain Python values), and a snapshot written by a
different version of the state's layout or a different jobs configuration is set aside with a
log line, not loaded into the wrong shape.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import pickle
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from otel_ofu.core.model import Attributes, Event, MetricPoint

STATE_VERSION = 4  # 4: sums kept exact (core.exact) and bins not closed yet apart; 3: GPUs keyed by core.model.gpu_key
_FRAME = struct.Struct("<II")  # payload length, crc32
_MAGIC = b"OFUJOBS1"
_SNAPSHOT_MODULES = ("otel_ofu.jobs.", "otel_ofu.pipeline.config")
_SNAPSHOT_CLASSES = frozenset({("otel_ofu.core.loss", "LossTotals")})  # a job's loss account (core.loss)
_BUILTINS = frozenset({"set", "frozenset", "dict", "list", "tuple", "float", "int", "str", "bool", "complex"})


# Journal records: a batch (its points, clock and outputs), outputs alone (a previous run's, to send
# again), and the mark that the exporters took the outputs of every record before it.
_BATCH, _OUTPUTS = "batch", "outputs"
_EXPORTED = ("exported",)
Outputs = tuple[list[MetricPoint], list[Event]]  # job points and events


def _point(row: tuple, names: dict[int, str], resources: dict[int, Attributes]) -> MetricPoint:
    n, v, t, r, a, u, m, s = row
    return MetricPoint(names[n], v, t, resources[r], resources[a], u, m, s)


class StateError(Exception):
    """A state file that cannot be used (corrupt, another layout, another configuration)."""


class _SnapshotUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.startswith(_SNAPSHOT_MODULES) or (module, name) in _SNAPSHOT_CLASSES or (
                module == "builtins" and name in _BUILTINS) or (
                module == "collections" and name == "deque") or (module == "copyreg" and name == "_reconstructor"):
            return super().find_class(module, name)
        raise StateError(f"state file refers to {module}.{name}, which a jobs state never holds")


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise StateError(f"journal refers to {module}.{name}; a journal holds plain values only")


def _safe_name(component_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in component_id)


def layout_fingerprint(objects: Iterable[object], config: object) -> str:
    """What a snapshot must match to be loaded: the state classes' fields and the jobs configuration."""
    parts = [f"v{STATE_VERSION}", repr(config)]
    for obj in objects:
        fields = sorted(getattr(obj, "__dict__", {}) or getattr(type(obj), "__slots__", ()))
        parts.append(f"{type(obj).__module__}.{type(obj).__qualname__}:{','.join(fields)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


class JobState:
    """Snapshot + journal files of one jobs processor in ``directory``."""

    def __init__(self, directory: str | Path, component_id: str, fingerprint: str,
                 log: logging.Logger | None = None):
        self.directory = Path(directory).expanduser()
        self.directory.mkdir(parents=True, exist_ok=True)
        base = _safe_name(component_id)
        self.snapshot_path = self.directory / f"{base}.snapshot"
        self.journal_path = self.directory / f"{base}.journal"
        self.fingerprint = fingerprint
        self.log = log or logging.getLogger("otel_ofu.jobs.state")
        self.generation = 0
        self._journal: io.BufferedWriter | None = None
        self._resources: dict[Attributes, int] = {}  # interned in the current journal
        self._names: dict[str, int] = {}
        self.journal_bytes = 0

    # --- reading ----------------------------------------------------------------------------

    def load(self) -> tuple[Any | None, list[tuple[float, list[MetricPoint]]], Outputs]:
        """The saved book (None: start fresh), the journal's batches to replay into it, in order, and the
        outputs the journal has no mark for (to send again).

        Each batch comes with the processor's clock reading when it was first observed, so the
        replay sees what the processor saw.
        """
        book = None
        if self.snapshot_path.exists():
            try:
                book = self._read_snapshot()
            except (StateError, OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError,
                    TypeError, IndexError, ImportError) as exc:
                aside = self._set_aside(self.snapshot_path)
                self.log.warning("jobs state %s not loaded (%s): moved to %s; every job starts fresh",
                                 self.snapshot_path, exc, aside)
                self.generation = 0
                book = None
                if self.journal_path.exists():
                    self._set_aside(self.journal_path)
                return None, [], ([], [])
        if not self.journal_path.exists():
            return book, [], ([], [])
        batches, unsent = self._read_journal()
        return book, batches, unsent

    def _read_snapshot(self) -> Any:
        data = self.snapshot_path.read_bytes()
        if not data.startswith(_MAGIC):
            raise StateError("not a jobs state file")
        (length, crc), body = _FRAME.unpack_from(data, len(_MAGIC)), data[len(_MAGIC) + _FRAME.size:]
        if len(body) != length or zlib.crc32(body) != crc:
            raise StateError("truncated or corrupt")
        header_end = body.index(b"\n")
        fingerprint, generation = body[:header_end].decode().split(" ")
        if fingerprint != self.fingerprint:
            raise StateError("written by another otel-ofu version or with another jobs configuration")
        self.generation = int(generation)
        return _SnapshotUnpickler(io.BytesIO(body[header_end + 1:])).load()

    def _read_journal(self) -> tuple[list[tuple[float, list[MetricPoint]]], Outputs]:
        data = self.journal_path.read_bytes()
        batches: list[tuple[float, list[MetricPoint]]] = []
        unsent: Outputs = ([], [])
        resources: dict[int, Attributes] = {}
        names: dict[int, str] = {}
        i = 0
        good = 0
        first = True
        while i + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, i)
            body = data[i + _FRAME.size:i + _FRAME.size + length]
            if len(body) != length or zlib.crc32(body) != crc:
                break
            try:
                record = _PlainUnpickler(io.BytesIO(body)).load()
            except (StateError, pickle.UnpicklingError, EOFError, ValueError):
                break
            i += _FRAME.size + length
            if first:  # the header: the snapshot generation this journal continues
                first = False
                if record != ("generation", self.generation):
                    self.log.info("jobs journal %s continues another snapshot: not replayed", self.journal_path)
                    return [], ([], [])
                good = i
                continue
            if record == _EXPORTED:
                unsent = ([], [])
                good = i
                continue
            try:
                kind, now, new_names, new_resources, rows, output_rows, events = record
                names.update(new_names)
                resources.update(new_resources)
                points = [_point(row, names, resources) for row in rows]
                outputs = [_point(row, names, resources) for row in output_rows]
                made = [Event(name, t, resources[r], resources[a], body, severity)
                        for name, t, r, a, body, severity in events]
            except (ValueError, TypeError, KeyError):  # a record of another layout: nothing after it is read
                self.log.warning("jobs journal %s: a record of another layout at byte %d: the journal is read up "
                                 "to it", self.journal_path, good)
                return batches, unsent
            if kind == _BATCH:
                batches.append((now, points))
            unsent[0].extend(outputs)
            unsent[1].extend(made)
            good = i
        if good < len(data):
            self.log.warning("jobs journal %s: %d bytes at its end were cut short by a crash and are ignored "
                             "(their requests were never acknowledged, so the gateway sends them again)",
                             self.journal_path, len(data) - good)
        return batches, unsent

    # --- writing ----------------------------------------------------------------------------

    def append(self, now: float, points: list[MetricPoint], outputs: Outputs) -> None:
        """Journal one batch before its outputs go out: the points the jobs book read, the clock it was
        observed at, and the job points and events made of it."""
        self._write_record(_BATCH, now, points, outputs)

    def append_outputs(self, outputs: Outputs) -> None:
        """Journal outputs to send again (a previous run's, not marked as exported), without a batch."""
        self._write_record(_OUTPUTS, 0.0, [], outputs)

    def mark_exported(self) -> None:
        """The exporters took the outputs of every record so far."""
        if self._journal is not None:
            self._write_frame(_EXPORTED)

    def _write_record(self, kind: str, now: float, points: list[MetricPoint], outputs: Outputs) -> None:
        if self._journal is None:
            self._open_journal()
        new_names: dict[int, str] = {}
        new_resources: dict[int, Attributes] = {}
        names, resources = self._names, self._resources

        def rows(of: list[MetricPoint]) -> list[tuple]:
            out = []
            for p in of:  # names and attribute sets interned: a batch repeats them
                n = names.get(p.name)
                if n is None:
                    n = names[p.name] = len(names)
                    new_names[n] = p.name
                r = resources.get(p.resource)
                if r is None:
                    r = resources[p.resource] = len(resources)
                    new_resources[r] = p.resource
                a = resources.get(p.attributes)
                if a is None:
                    a = resources[p.attributes] = len(resources)
                    new_resources[a] = p.attributes
                out.append((n, p.value, p.time_unix_nano, r, a, p.unit, p.monotonic, p.start_time_unix_nano))
            return out

        def resource_id(attributes: Attributes) -> int:
            r = resources.get(attributes)
            if r is None:
                r = resources[attributes] = len(resources)
                new_resources[r] = attributes
            return r

        output_points, events = outputs
        self._write_frame((kind, now, new_names, new_resources, rows(points), rows(output_points),
                           [(e.name, e.time_unix_nano, resource_id(e.resource), resource_id(e.attributes), e.body,
                             e.severity) for e in events]))

    def checkpoint(self, book: Any) -> None:
        """Write ``book`` atomically as the new snapshot, then start an empty journal."""
        self.generation += 1
        body = f"{self.fingerprint} {self.generation}\n".encode() + pickle.dumps(book, protocol=5)
        tmp = self.snapshot_path.with_name(self.snapshot_path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(_MAGIC + _FRAME.pack(len(body), zlib.crc32(body)) + body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.snapshot_path)
        self._sync_directory()
        self._open_journal()

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def _open_journal(self) -> None:
        self.close()
        self._journal = open(self.journal_path, "wb")  # noqa: SIM115 (held open between batches)
        self._resources.clear()
        self._names.clear()
        self.journal_bytes = 0
        self._write_frame(("generation", self.generation))

    def _write_frame(self, record: object) -> None:
        assert self._journal is not None
        body = pickle.dumps(record, protocol=5)
        frame = _FRAME.pack(len(body), zlib.crc32(body)) + body
        self._journal.write(frame)
        self._journal.flush()  # in the kernel: survives the process being killed (not a power loss)
        self.journal_bytes += len(frame)

    def _sync_directory(self) -> None:
        with contextlib.suppress(OSError):
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _set_aside(self, path: Path) -> Path:
        aside = path.with_name(path.name + ".unusable")
        with contextlib.suppress(OSError):
            os.replace(path, aside)
        return aside
