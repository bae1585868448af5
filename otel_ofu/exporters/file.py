"""The ``file`` exporter: OTLP JSON, one export request per line, like the Collector's.

Other tools (the Collector's otlpjsonfilereceiver, ``otel-ofu report``, the ``replay``
receiver) read the same format. Every write is one ``write(2)`` of whole lines (or one whole
zstd frame / gzip member), flushed at once, so a crash leaves at most one partly written last
line, which readers skip with a warning (:func:`otel_ofu.otlp.files.read_json_lines`).

As the Collector's file exporter it can rotate (``rotation``: ``max_megabytes``, ``max_days``,
``max_backups``, ``localtime``; rotated files are named ``<name>-<UTC time>.<ext>``) and
compress (``compression: zstd`` or ``gzip``). A metric's description is written the first
time the metric appears in a file, not on every line (about a third of the demo's bytes).
File layout and naming: docs/file-exporter.md.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from otel_ofu.core.model import Batch
from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp import files
from otel_ofu.pipeline.component import Context, Exporter, Factory
from otel_ofu.pipeline.config import build_config, require

MIB = 1024 * 1024


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
    # Compress each write as one zstd frame or gzip member ("" and "none": plain text).
    compression: Literal["", "none", "zstd", "gzip"] = ""
    # true: every line carries every metric's description; false: only a metric's first line in a file.
    repeat_descriptions: bool = False

    def validate(self) -> None:
        require(bool(self.path), "path", "required: the file to write OTLP JSON lines to")
        parent = Path(self.path).expanduser().parent
        require(parent.is_dir(), "path", f"directory {str(parent)!r} does not exist")
        if self.rotation is not UNSET and not isinstance(self.rotation, RotationConfig):
            require(self.rotation is None or isinstance(self.rotation, dict), "rotation",
                    f"expected a mapping, got {self.rotation!r}")
            self.rotation = build_config(RotationConfig, self.rotation or {}, prefix="rotation.")
        if self.compression == "zstd":
            try:
                import zstandard  # noqa: F401
            except ImportError:
                require(False, "compression", "zstd needs the zstandard package (pip install zstandard)")

    def rotation_config(self) -> RotationConfig | None:
        return self.rotation if isinstance(self.rotation, RotationConfig) else None


class _OutputFile:
    """The current file: size-triggered rotation, retention of rotated files, whole writes."""

    def __init__(self, path: Path, rotation: RotationConfig | None, append: bool, log: Any):
        self.path, self.rotation, self.log = path, rotation, log
        self._fd: int | None = None
        self.size = 0
        if path.exists() and path.stat().st_size:
            if append:
                cut = files.repair_tail(path)
                if cut:
                    log.warning("%s ended with a partly written line or frame (a crash?): cut %d bytes before "
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
        self._open(keep=False)
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
        assert self._fd is not None
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self.size += len(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class FileExporter(Exporter):
    def __init__(self, config: FileExporterConfig, context: Context):
        super().__init__(config, context)
        self._file: _OutputFile | None = None
        self._lock = threading.Lock()
        self._compress = files.compressor(config.compression if config.compression != "none" else "")
        self._described: set[str] = set()  # metrics whose description the current file already has
        self.lines_written = 0

    def start(self) -> None:
        self._file = _OutputFile(Path(self.config.path).expanduser(), self.config.rotation_config(),
                                 self.config.append, self.log)
        self._described = set()

    def _encode(self, batch: Batch) -> tuple[bytes, int] | None:
        """The batch's line(s), compressed if configured, and how many lines."""
        lines = []
        request = otlp.to_request(batch.points)
        request.resource_metrics.extend(otlp.passthrough_messages(batch.passthrough))
        if request.resource_metrics:
            if not self.config.repeat_descriptions:
                for rm in request.resource_metrics:
                    for sm in rm.scope_metrics:
                        for metric in sm.metrics:
                            if metric.name in self._described:
                                metric.description = ""
                            elif metric.description:
                                self._described.add(metric.name)
            lines.append(otlp.to_json_line(request))
        if batch.events:  # as the Collector's file exporter: each signal's requests on their own lines
            lines.append(otlp.to_json_line(otlp.events_to_request(batch.events)))
        if not lines:
            return None
        return self._compress(("\n".join(lines) + "\n").encode()), len(lines)

    def export(self, batch: Batch) -> None:
        with self._lock:
            if self._file is None:
                raise RuntimeError("file exporter used before start() or after shutdown()")
            encoded = self._encode(batch)
            if encoded is None:
                return
            if self._file.needs_rotation(len(encoded[0])):
                self._file.rotate()
                self._described = set()  # the new file gets the descriptions again
                encoded = self._encode(batch)
                assert encoded is not None
            self._file.write(encoded[0])
            self.lines_written += encoded[1]

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


FACTORY = Factory("file", FileExporterConfig, FileExporter,
                  "writes OTLP JSON lines to a file, rotated and compressed as the Collector's file exporter can")
