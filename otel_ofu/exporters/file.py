"""The ``file`` exporter: one export request per line of OTLP JSON, or per protobuf record, like the Collector's.

``format: json`` (the default): other tools (the Collector's otlpjsonfilereceiver, ``otel-ofu
report``, the ``replay`` receiver, jq) read the same lines. ``format: proto``: the Collector's
file exporter's records, byte for byte its framing (a 4-byte big-endian length, then the
serialized request; with ``compression: zstd`` the request compressed alone, as the Collector
does). Both are written from the serialized request (the OTLP exporters' encoder): JSON through
:mod:`otel_ofu.otlp.wire_json`, not ``json_format``.

Every write is one ``write(2)`` of whole lines or records (or one whole zstd frame / gzip
member), flushed at once, so a crash leaves at most one partly written last line or record,
which readers skip with a warning (:func:`otel_ofu.otlp.files.read_json_lines`) and an append
cuts (:func:`otel_ofu.otlp.files.repair_tail`, :func:`repair_records_tail`).

A write that fails (disk full: ENOSPC, EFBIG, EDQUOT, EIO) is undone: the file is cut back to
where the write began, so it stays a file of whole lines / frames, and the batch is kept in
memory (up to ``max_pending_megabytes``) and written, in order, before the next one. What a
failure costs is counted (``otel_ofu.exporter.write_failed``, ``otel_ofu.exporter.dropped``)
and logged, never silent.

As the Collector's file exporter it can rotate (``rotation``: ``max_megabytes``, ``max_days``,
``max_backups``, ``localtime``; rotated files are named ``<name>-<UTC time>.<ext>``) and
compress (``compression: zstd`` or ``gzip``). A metric's description is written the first
time the metric appears in a file, not on every line (about a third of the demo's bytes).
File layout and naming: docs/file-exporter.md.
"""

from __future__ import annotations

import collections
import datetime as dt
import errno
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu.core.metrics import MetricInfo, register
from otel_ofu.core.model import Batch
from otel_ofu.otlp import files, payload, wire_json
from otel_ofu.pipeline.component import Context, Exporter, Factory
from otel_ofu.pipeline.config import build_config, path_kind, require

MIB = 1024 * 1024
_LENGTH = struct.Struct(">I")

WRITE_FAILED = register(MetricInfo(
    "otel_ofu.exporter.write_failed", "{write}", "sum",
    "Self-telemetry: writes of the file exporter that failed, by reason (the error: ENOSPC, EFBIG, EDQUOT, EIO); "
    "the file is cut back to its last whole line, frame or record and the batch kept to retry.")).name
PENDING = register(MetricInfo(
    "otel_ofu.exporter.pending", "{item}", "gauge",
    "Self-telemetry: items the file exporter keeps in memory after failed writes, to write with the next batch.")).name
DROPPED = "otel_ofu.exporter.dropped"  # reason write_error: beyond max_pending_megabytes; shutdown: never written


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


@dataclass
class RotationConfig:
    """The Collector's file exporter rotation keys (lumberjack's), with its defaults."""

    max_megabytes: int = 100  # rotate before the file would grow past this
    max_days: int = 0  # delete rotated files older than this (by the time in their name); 0: never
    max_backups: int = 100  # keep at most this many rotated files; 0: all
    localtime: bool = False  # the time in rotated file names: local instead of UTC

    def validate(self) -> None:
        require(self.max_megabytes >= 1, "max_megabytes", "must be at least 1")
        require(self.max_days >= 0, "max_days", "must be >= 0 (0: keep rotated files whatever their age)")
        require(self.max_backups >= 0, "max_backups", "must be >= 0 (0: keep every rotated file)")


@dataclass
class FileExporterConfig:
    path: str = ""  # the output file (the current one, with rotation); its directory must exist
    # As in the Collector: false truncates the file at start, true appends to it. With rotation
    # an existing file is never truncated: it is rotated (false) or appended to (true).
    append: bool = False
    # Rotation, as the Collector's file exporter (docs/file-exporter.md): absent, one file that
    # grows; `rotation:` alone, the defaults below.
    rotation: Annotated[Any, RotationConfig] = UNSET
    # What each export request is written as, as the Collector's file exporter: json (one line of OTLP
    # JSON each) or proto (the protobuf, after its length in 4 bytes, big-endian; docs/file-exporter.md).
    format: Literal["json", "proto"] = "json"
    # json: compress each write as one zstd frame or gzip member; proto: each record's message as one
    # zstd frame, as the Collector does ("" and "none": not compressed).
    compression: Literal["", "none", "zstd", "gzip"] = ""
    # true: every line carries every metric's description; false: only a metric's first line in a file.
    repeat_descriptions: bool = False
    # After a failed write (disk full), batches are kept in memory up to this size and written before
    # the next one; beyond it the oldest are dropped and counted. 0: a batch that fails is dropped at once.
    max_pending_megabytes: int = 16

    def validate(self) -> None:
        if require(bool(self.path), "path", "required: the file to write OTLP JSON lines or records to"):
            parent = Path(self.path).expanduser().parent
            if require(path_kind("path", parent) == "dir", "path", f"directory {str(parent)!r} does not exist"):
                require(path_kind("path", self.path) != "dir", "path", f"{self.path!r} is a directory: name the file")
        require(self.max_pending_megabytes >= 0, "max_pending_megabytes", "must be >= 0 (0: keep nothing to retry)")
        if self.rotation is not UNSET and not isinstance(self.rotation, RotationConfig):
            require(self.rotation is None or isinstance(self.rotation, dict), "rotation",
                    f"expected a mapping, got {self.rotation!r}")
            self.rotation = build_config(RotationConfig, self.rotation or {}, prefix="rotation.")
        require(not (self.format == "proto" and self.compression == "gzip"), "compression",
                "gzip is for format: json; the Collector compresses proto records with zstd: use zstd")
        if self.compression == "zstd":
            try:
                import zstandard  # noqa: F401
            except ImportError:
                require(False, "compression", "zstd needs the zstandard package (pip install zstandard)")

    def rotation_config(self) -> RotationConfig | None:
        return self.rotation if isinstance(self.rotation, RotationConfig) else None


class _OutputFile:
    """The current file: size-triggered rotation, retention of rotated files, whole writes."""

    def __init__(self, path: Path, rotation: RotationConfig | None, append: bool, log: Any, records: bool = False):
        self.path, self.rotation, self.log = path, rotation, log
        self.repair_tail = repair_records_tail if records else files.repair_tail
        self._fd: int | None = None
        self.size = 0
        if path.exists() and path.stat().st_size:
            if append:
                _check_appendable(path, records)
                cut = self.repair_tail(path)
                if cut:
                    log.warning("%s ended with a partly written line, frame or record (a crash?): cut %d bytes before "
                                "appending", path, cut)
            elif rotation is not None:
                self._rename_to_backup()
        self._open(append or rotation is not None)

    def _open(self, keep: bool) -> None:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if keep else os.O_TRUNC)
        self._fd = os.open(self.path, flags, 0o644)
        self.size = os.fstat(self._fd).st_size

    def _now(self) -> dt.datetime:
        now = dt.datetime.now(dt.UTC)
        return now.astimezone() if self.rotation is not None and self.rotation.localtime else now

    def _rename_to_backup(self) -> Path:
        when = self._now()
        target = files.backup_path(self.path, when)
        while target.exists():  # two rotations within one millisecond
            when += dt.timedelta(milliseconds=1)
            target = files.backup_path(self.path, when)
        os.replace(self.path, target)
        return target

    def needs_rotation(self, incoming: int) -> bool:
        limit = self.rotation.max_megabytes * MIB if self.rotation is not None else 0
        return bool(limit) and self.size > 0 and self.size + incoming > limit

    def rotate(self) -> None:
        assert self.rotation is not None
        self.close()
        target = self._rename_to_backup()
        self.size = 0
        self._open(keep=False)  # may fail (no inode left): write() opens it then
        self.log.debug("rotated %s to %s", self.path, target.name)
        self._clean_up()

    def _clean_up(self) -> None:
        assert self.rotation is not None
        backups = files.rotated_files(self.path, self.rotation.localtime)[:-1]  # the current file is last
        doomed: list[Path] = []
        if self.rotation.max_days:
            cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=self.rotation.max_days)
            doomed += [b for b in backups
                       if (files.backup_time(self.path, b, self.rotation.localtime) or cutoff) < cutoff]
        if self.rotation.max_backups:
            keep = [b for b in backups if b not in doomed]
            doomed += keep[:max(0, len(keep) - self.rotation.max_backups)]
        for path in doomed:
            try:
                path.unlink()
            except OSError as exc:
                self.log.warning("cannot remove the rotated file %s: %s", path, exc.strerror)

    def write(self, data: bytes) -> None:
        """Append ``data`` whole, or raise OSError with the file as it was before (nothing of ``data`` in it)."""
        if self._fd is None:  # a failed write could not be undone, or a rotation could not open the new file
            self._reopen()
        assert self._fd is not None
        start = os.lseek(self._fd, 0, os.SEEK_END)  # where this write begins (the file may be appended to)
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            self._undo(start)
            raise
        self.size = start + len(data)

    def _undo(self, start: int) -> None:
        """Cut a failed write's partial bytes off, so the next write does not follow a torn line or frame."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, start)
            os.lseek(self._fd, start, os.SEEK_SET)  # without O_APPEND the next write would leave a hole
            self.size = start
        except OSError as exc:
            self.log.warning("cannot cut %s back to %d bytes after a failed write (%s): it is repaired before "
                             "the next write", self.path, start, exc.strerror or exc)
            self.close()

    def _reopen(self) -> None:
        cut = self.repair_tail(self.path)
        if cut:
            self.log.warning("%s ended with a partly written line, frame or record: cut %d bytes before writing",
                             self.path, cut)
        self._open(keep=True)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _looks_like_records(head: bytes) -> bool:
    """Whether a file's first bytes are a length-prefixed record (format: proto, or the Collector's
    compressed JSON): a length, then a request's first field (1: resource_metrics or resource_logs),
    a zstd frame or a JSON object."""
    if len(head) < 5:
        return len(head) == 4 and head == bytes(4)
    (size,) = struct.unpack(">I", head[:4])
    first = head[4:5] in (b"\x0a", b"{") or head[4:8] == files.ZSTD_MAGIC
    return size <= files.MAX_RECORD_BYTES and (size == 0 or first)


def _check_appendable(path: Path, records: bool) -> None:
    """A file holds one format: appending records to lines (or lines to records) would make it unreadable."""
    with open(path, "rb") as handle:
        head = handle.read(8)
    if _looks_like_records(head) != records:
        held, wanted = ("length-prefixed records", "json") if not records else ("text lines or frames", "proto")
        raise ValueError(f"{path} holds {held}: format: {wanted} cannot append to it (a file holds one format); "
                         "name another path or move the file away")


def repair_records_tail(path: Path) -> int:
    """Cut a partly written last record (a crash) off a file of length-prefixed records; returns bytes removed.

    Records are followed by their lengths from the start; the file is cut where the next record's
    4-byte length or body would run past its end.
    """
    if not path.is_file():
        return 0
    size = path.stat().st_size
    keep = 0
    with open(path, "rb") as handle:
        while keep + 4 <= size:
            handle.seek(keep)
            (length,) = struct.unpack(">I", handle.read(4))
            if keep + 4 + length > size:
                break
            keep += 4 + length
    if keep == size:
        return 0
    with open(path, "r+b") as handle:
        handle.truncate(keep)
    return size - keep


def record(message: bytes) -> bytes:
    """One record of the Collector's ``format: proto`` framing (exportMessageAsBuffer): the length, 4 bytes
    big-endian, then the message (compressed or not)."""
    return _LENGTH.pack(len(message)) + message


def without_known_descriptions(request: bytes, described: set[str]) -> bytes:
    """A serialized ExportMetricsServiceRequest without the descriptions of metrics in ``described``;
    the metrics whose description it keeps are added to ``described``.

    Through protobuf (upb parses and writes in C; a walk of the bytes in Python was slower): the
    request as it was when nothing changes.
    """
    message = ExportMetricsServiceRequest.FromString(request)
    changed = False
    for resource_metrics in message.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name in described:
                    if metric.description:
                        metric.description = ""
                        changed = True
                elif metric.description:
                    described.add(metric.name)
    return message.SerializeToString() if changed else request


class FileExporter(Exporter):
    def __init__(self, config: FileExporterConfig, context: Context):
        super().__init__(config, context)
        self._file: _OutputFile | None = None
        self._lock = threading.Lock()
        self._compress = files.compressor(config.compression if config.compression != "none" else "")
        self._records = config.format == "proto"
        self._described: set[str] = set()  # metrics whose description the current file already has
        # Batches not written yet (a write failed), oldest first, with their encoded size when last tried.
        self._pending: collections.deque[tuple[Batch, int]] = collections.deque()
        self._pending_bytes = 0
        self._failed_writes = 0  # since the last write that succeeded
        self._bytes_per_item = 0.0  # of the last batch encoded: a kept batch's size before it is encoded
        self.lines_written = 0

    def start(self) -> None:
        self._file = _OutputFile(Path(self.config.path).expanduser(), self.config.rotation_config(),
                                 self.config.append, self.log, records=self._records)
        self._described = set()

    def _encode(self, batch: Batch) -> tuple[bytes, int] | None:
        """The batch's line(s) or record(s), compressed if configured, and how many.

        Both formats start from the serialized request (the OTLP exporters' encoder): JSON is written
        from its bytes (:mod:`otel_ofu.otlp.wire_json`), protobuf is those bytes.
        """
        requests: list[tuple[bytes, bool]] = []  # (serialized request, whether logs)
        metrics = payload.metrics_payload(batch.points_and_rows(), batch.passthrough)
        if metrics is not None:
            body = metrics[0]
            if not self.config.repeat_descriptions:
                body = without_known_descriptions(body, self._described)
            requests.append((body, False))
        events = payload.logs_payload(batch.events)
        if events is not None:  # as the Collector's file exporter: each signal's requests on their own lines
            requests.append((events[0], True))
        if not requests:
            return None
        if self._records:
            return b"".join([record(self._compress(body)) for body, _ in requests]), len(requests)
        text = "\n".join([wire_json.request_json(body, logs) for body, logs in requests]) + "\n"
        return self._compress(text.encode("ascii")), len(requests)

    def export(self, batch: Batch) -> None:
        with self._lock:
            if self._file is None:
                raise RuntimeError("file exporter used before start() or after shutdown()")
            self._pending.append((batch, int(len(batch) * self._bytes_per_item)))
            self._write_pending()

    def _write_pending(self) -> None:
        """Write the kept batches, oldest first, then stop at the first failure (each failure undone)."""
        assert self._file is not None
        recovered = self._failed_writes
        while self._pending:
            batch, _ = self._pending[0]
            described = set(self._described)
            encoded = self._encode(batch)
            if encoded is not None and len(batch):
                self._bytes_per_item = len(encoded[0]) / len(batch)
            try:
                if encoded is not None and self._file.needs_rotation(len(encoded[0])):
                    self._file.rotate()
                    self._described, described = set(), set()  # the new file gets the descriptions again
                    encoded = self._encode(batch)
                if encoded is not None:
                    self._file.write(encoded[0])
            except OSError as exc:
                self._described = described  # what the file has
                self._write_failed(exc, 0 if encoded is None else len(encoded[0]))
                return
            self._pending.popleft()
            if encoded is not None:
                self.lines_written += encoded[1]
        self._pending_bytes = 0
        self._set_pending_gauge()
        if recovered:
            self.log.info("wrote to %s again after %d failed writes; nothing kept is pending", self._file.path,
                          recovered)
            self._failed_writes = 0

    def _write_failed(self, exc: OSError, size: int) -> None:
        """Count and say a failed write; keep its batch (and those after it) within max_pending_megabytes."""
        assert self._file is not None
        reason = errno.errorcode.get(exc.errno or 0, "error")
        self.context.telemetry.add(WRITE_FAILED, 1, exporter=self.context.component_id, reason=reason)
        batch, _ = self._pending[0]
        self._pending[0] = (batch, size)
        self._pending_bytes = sum(kept for _, kept in self._pending)
        limit = self.config.max_pending_megabytes * MIB
        dropped = 0
        while self._pending and (self._pending_bytes > limit or not limit):
            old, old_size = self._pending.popleft()
            self._pending_bytes -= old_size
            dropped += len(old)
        if dropped:
            self.context.telemetry.add(DROPPED, dropped, exporter=self.context.component_id, reason="write_error")
        self._set_pending_gauge()
        self._failed_writes += 1
        if self._failed_writes == 1 or dropped:
            kept = sum(len(b) for b, _ in self._pending)
            self.log.warning("cannot write to %s: %s; the file is kept whole (cut back to its last complete %s); "
                             "%d items kept to write with the next batch%s", self._file.path, exc.strerror or exc,
                             "record" if self._records else
                             "frame" if self.config.compression not in ("", "none") else "line", kept,
                             f", {dropped} dropped (more than max_pending_megabytes "
                             f"{self.config.max_pending_megabytes} kept)" if dropped else "")

    def _set_pending_gauge(self) -> None:
        self.context.telemetry.set(PENDING, sum(len(b) for b, _ in self._pending), exporter=self.context.component_id)

    def shutdown(self) -> None:
        with self._lock:
            if self._file is None:
                return
            if self._pending:
                self._write_pending()  # a last try
            if self._pending:
                lost = sum(len(b) for b, _ in self._pending)
                self.context.telemetry.add(DROPPED, lost, exporter=self.context.component_id, reason="shutdown")
                self.log.error("shut down with %d items (%d batches) never written to %s: writes kept failing",
                               lost, len(self._pending), self._file.path)
                self._pending.clear()
                self._set_pending_gauge()
            self._file.close()
            self._file = None


FACTORY = Factory("file", FileExporterConfig, FileExporter,
                  "writes OTLP JSON lines or protobuf records to a file, rotated and compressed as the Collector's "
                  "file exporter can")
