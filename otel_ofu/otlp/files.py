"""OTLP JSON line files as the ``file`` exporter writes them: rotation names, compression, reading back.

Layout (docs/file-exporter.md). The current file is ``path``. A rotated file is renamed as the
Collector's file exporter (lumberjack) does: the rotation time, ``YYYY-MM-DDTHH-MM-SS.mmm``
(UTC, or local time with ``localtime``), inserted before the file's last extension:
``metrics.jsonl`` -> ``metrics-2026-11-30T12-07-16.799.jsonl``. Readers also accept the
``-<reason>`` suffix newer Collectors (timberjack) add (``metrics-<time>-size.jsonl``).

Compression (``zstd`` or ``gzip``) applies to every write: each export request's line(s) are
one complete zstd frame or gzip member, so a file is a valid ``.zst`` / ``.gz`` stream that
``zstd -d`` / ``gzip -d`` read, and a crash can only cut the last frame. Readers recognise
compression by its magic bytes, not by the file name.

A crash leaves at most one partly written last line (or frame). :func:`read_json_lines`
skips it with a warning; a last line that is complete JSON without its newline (another
tool's file) is kept.
"""

from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import logging
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

log = logging.getLogger("otel_ofu.otlp.files")

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"
COMPRESSIONS = ("zstd", "gzip")
_TIME_FORMAT = "%Y-%m-%dT%H-%M-%S"  # then ".mmm": lumberjack's "2006-01-02T15-04-05.000"
_BACKUP_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3})(?:-[a-z]+)?$")


# --- names ------------------------------------------------------------------------------------

def _split_name(path: Path) -> tuple[str, str]:
    """(prefix, extension) as Go's filepath.Ext: the last dot-suffix of the file name."""
    name = path.name
    dot = name.rfind(".")
    if dot <= 0:
        return name, ""
    return name[:dot], name[dot:]


def backup_path(path: Path, when: dt.datetime) -> Path:
    """Where ``path`` goes when it is rotated at ``when`` (an aware datetime in UTC or local time)."""
    prefix, ext = _split_name(path)
    stamp = when.strftime(_TIME_FORMAT) + f".{when.microsecond // 1000:03d}"
    return path.with_name(f"{prefix}-{stamp}{ext}")


def backup_time(path: Path, candidate: Path, localtime: bool = False) -> dt.datetime | None:
    """The rotation time encoded in ``candidate`` if it is a rotated file of ``path``, else None."""
    prefix, ext = _split_name(path)
    name = candidate.name
    if not (name.startswith(prefix + "-") and name.endswith(ext)) or name == path.name:
        return None
    middle = name[len(prefix) + 1:len(name) - len(ext)] if ext else name[len(prefix) + 1:]
    match = _BACKUP_TIME.match(middle)
    if not match:
        return None
    try:
        parsed = dt.datetime.strptime(match.group(1), _TIME_FORMAT + ".%f")
    except ValueError:
        return None
    if localtime:
        return parsed.astimezone()  # naive -> the local zone
    return parsed.replace(tzinfo=dt.UTC)


def rotated_files(path: str | Path, localtime: bool = False) -> list[Path]:
    """The rotated files of ``path``, oldest first, then ``path`` itself if it exists: time order."""
    path = Path(path)
    found = []
    if path.parent.is_dir():
        for candidate in path.parent.iterdir():
            when = backup_time(path, candidate, localtime)
            if when is not None and candidate.is_file():
                found.append((when, candidate.name, candidate))
    out = [c for _, _, c in sorted(found)]
    if path.is_file():
        out.append(path)
    return out


# --- compression ------------------------------------------------------------------------------

def compressor(compression: str) -> Callable[[bytes], bytes]:
    """One complete zstd frame or gzip member per call; identity for ''/'none'."""
    if compression == "zstd":
        import zstandard

        ctx = zstandard.ZstdCompressor(level=3, write_content_size=True)
        return ctx.compress
    if compression == "gzip":
        return lambda data: gzip.compress(data, compresslevel=6, mtime=0)
    return lambda data: data


def detect_compression(path: str | Path) -> str:
    """'zstd', 'gzip' or '' from the file's first bytes."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    return ""


def open_text(path: str | Path, errors: str = "strict") -> tuple[IO[str], Callable[[], bool]]:
    """The file as text, decompressed if it is zstd or gzip; and a function saying whether the
    compressed stream was cut short (a crash mid-write).
    """
    compression = detect_compression(path)
    raw = open(path, "rb")  # noqa: SIM115 (returned, closed by the caller through the text wrapper)
    if not compression:
        return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, newline=""), lambda: False
    reader = _Frames(raw, compression)
    text = io.TextIOWrapper(io.BufferedReader(reader), encoding="utf-8", errors=errors, newline="")
    return text, lambda: reader.truncated


class _Frames(io.RawIOBase):
    """Concatenated zstd frames or gzip members, decompressed; stops quietly at a cut one."""

    def __init__(self, raw: IO[bytes], compression: str):
        self._raw = raw
        self._compression = compression
        self._decoder = None
        self._pending = b""
        self._done = False
        self.truncated = False

    def _new_decoder(self):
        if self._compression == "zstd":
            import zstandard

            return zstandard.ZstdDecompressor().decompressobj()
        return zlib.decompressobj(16 + zlib.MAX_WBITS)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()
        super().close()

    def readinto(self, buffer) -> int:  # type: ignore[override]
        while not self._pending and not self._done:
            self._pending = self._fill()
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _fill(self) -> bytes:
        data = self._raw.read(1 << 16)
        if not data:
            self._done = True
            if self._decoder is not None and not self._decoder.eof:
                self.truncated = True  # the last frame/member never ended
            return b""
        out = []
        try:
            while data:
                if self._decoder is None:
                    self._decoder = self._new_decoder()
                out.append(self._decoder.decompress(data))
                if not self._decoder.eof:
                    break  # needs more input
                data = self._decoder.unused_data
                self._decoder = None  # a frame/member ended: the rest starts the next one
        except Exception:  # zstandard.ZstdError, zlib.error: a damaged frame, as from a torn write
            self.truncated = True
            self._done = True
        return b"".join(out)


# --- reading ----------------------------------------------------------------------------------

def read_json_lines(path: str | Path, on_partial: Callable[[str], None] | None = None) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line of a (possibly compressed) JSON lines file.

    A last line cut by a crash (no newline and not valid JSON, or a cut compressed frame) is
    not returned: ``on_partial`` (default: a warning) is told about it.
    """
    warn = on_partial or (lambda message: log.warning("%s", message))
    handle, truncated = open_text(path)
    with handle:
        previous: tuple[int, str] | None = None
        number = 0
        for number, line in enumerate(handle, 1):  # noqa: B007 (used after the loop)
            if previous is not None:
                yield previous
            previous = (number, line)
        cut = truncated()
    if previous is None:
        if cut:
            warn(f"{path}: the compressed stream is cut before its first line (the writer stopped mid-write)")
        return
    number, line = previous
    if line.endswith("\n"):  # complete, even if a compressed stream was cut after it
        yield previous
        if cut:
            warn(f"{path}: the compressed stream ends mid-frame after line {number} (the writer stopped "
                 "mid-write: a crash?); the lines before the cut are read")
        return
    if line.strip() and not cut:
        try:
            json.loads(line)
        except ValueError:
            pass
        else:
            yield previous  # complete, just no final newline
            return
    if line.strip():
        warn(f"{path}:{number}: skipping a partly written last line ({len(line)} characters"
             f"{', compressed stream cut short' if cut else ''}): the writer stopped mid-write (a crash?)")
    elif cut:
        warn(f"{path}: the compressed stream ends mid-frame after line {number - 1} (the writer stopped "
             "mid-write: a crash?)")


def repair_tail(path: Path) -> int:
    """Cut a partly written end (a crash) off a file about to be appended to; returns bytes removed.

    Plain files are cut after their last newline; compressed files after their last complete
    zstd frame or gzip member, so what is appended starts cleanly.
    """
    if not path.is_file() or path.stat().st_size == 0:
        return 0
    size = path.stat().st_size
    compression = detect_compression(path)
    if not compression:
        with open(path, "rb") as handle:
            keep = size
            step = 1 << 16
            while keep > 0:
                start = max(0, keep - step)
                handle.seek(start)
                chunk = handle.read(keep - start)
                newline = chunk.rfind(b"\n")
                if newline >= 0:
                    keep = start + newline + 1
                    break
                keep = start
            if keep == size:
                return 0
    else:
        keep = _last_complete_frame_end(path, compression)
        if keep == size:
            return 0
    with open(path, "r+b") as handle:
        handle.truncate(keep)
    return size - keep


def _last_complete_frame_end(path: Path, compression: str) -> int:
    with open(path, "rb") as handle:
        data = handle.read()
    position = 0
    while position < len(data):
        if compression == "zstd":
            import zstandard

            decoder = zstandard.ZstdDecompressor().decompressobj()
        else:
            decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            decoder.decompress(data[position:])
        except Exception:
            return position
        if not decoder.eof:
            return position
        position = len(data) - len(decoder.unused_data)
    return position
