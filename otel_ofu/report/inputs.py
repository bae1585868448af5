"""Which files ``otel-ofu report PATH...`` reads, and their lines, however they were written.

Paths may be files, directories (every recording inside, recursively), or globs (quoted, so
the shell does not expand them, or expanded by it: both work). Files may be rotated (the
Collector file exporter's and lumberjack's ``name-2026-11-30T12-00-00.000.jsonl``),
compressed, or both. Compression is recognised by the first bytes, not the name, because the
Collector file exporter keeps the configured name (``path: metrics.jsonl``) when it compresses:

- gzip (``.gz``), one stream;
- a zstd stream, or one zstd frame per write (the Collector's native compression, and
  ``zstd`` from the command line): newline-separated JSON once decompressed;
- the Collector's length-prefixed records (``compression: zstd`` without native compression,
  and ``format: proto``): 4 bytes big-endian length, then the record, itself zstd-compressed
  or not. JSON records are read; protobuf records are refused with a message.

A crash can leave a partly written last line (or a truncated compressed stream): it is
skipped with a warning, once per file, and the rest of the file is read.
"""

from __future__ import annotations

import glob
import gzip
import io
import logging
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger("otel_ofu.report")

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")
# Names a directory is searched for: the file exporter's JSON lines, and recordings the replay
# receiver reads (dmon, CSV), each possibly compressed.
DATA_SUFFIXES = (".jsonl", ".json", ".ndjson", ".csv", ".dmon")
_GLOB_CHARS = re.compile(r"[*?[]")
# lumberjack / the Collector: name-2006-01-02T15-04-05.000.ext
ROTATED_STAMP = re.compile(r"-(\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3})(?=\.|$)")
# A record is at most this long: also keeps a text file (first byte >= 0x09) from reading as a length.
MAX_RECORD_BYTES = 128 * 1024 * 1024


class InputError(Exception):
    """A path that cannot be read as a recording; the message names it."""


@dataclass
class InputFile:
    """One file the report reads, and what reading it found."""

    path: Path
    format: str = ""  # otlp_json | dmon | csv
    compression: str = ""  # "" | gzip | zstd | records (length-prefixed) | records+zstd
    lines: int = 0
    first: float | None = None  # data time, seconds
    last: float | None = None
    partial_tail: bool = False  # a partly written last line (or truncated stream) was skipped
    notes: list[str] = field(default_factory=list)

    def seen(self, t: float) -> None:
        self.first = t if self.first is None else min(self.first, t)
        self.last = t if self.last is None else max(self.last, t)


def is_data_file(path: Path) -> bool:
    """Whether a file found in a directory is a recording (by name: compressed or not)."""
    name = path.name.lower()
    for suffix in COMPRESSED_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return name.endswith(DATA_SUFFIXES)


def expand_paths(args: list[str]) -> tuple[list[Path], list[str]]:
    """The files named by PATH arguments (files, directories, globs), each once, and notes on what was skipped."""
    files: list[Path] = []
    notes: list[str] = []
    seen: set[Path] = set()

    def add(path: Path) -> None:
        resolved = path.resolve()
        if resolved not in seen:
            seen.add(resolved)
            files.append(path)

    for arg in args:
        path = Path(arg).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file())
            data = [p for p in found if is_data_file(p)]
            if not data:
                raise InputError(f"{arg}: a directory without recordings (looked for {', '.join(DATA_SUFFIXES)}, "
                                 f"also compressed {'/'.join(COMPRESSED_SUFFIXES)})")
            skipped = [p for p in found if not is_data_file(p)]
            if skipped:
                names = ", ".join(p.name for p in skipped[:5]) + (" ..." if len(skipped) > 5 else "")
                notes.append(f"{arg}: skipped {len(skipped)} file(s) that are not recordings: {names}")
            for p in data:
                add(p)
        elif path.is_file():
            add(path)
        elif _GLOB_CHARS.search(arg):
            matches = sorted(Path(m) for m in glob.glob(os.path.expanduser(arg), recursive=True))
            matches = [m for m in matches if m.is_file()]
            if not matches:
                raise InputError(f"{arg}: no file matches")
            for m in matches:
                add(m)
        elif path.exists():
            raise InputError(f"{arg}: not a regular file or directory")
        else:
            raise InputError(f"{arg}: no such file or directory")
    return files, notes


def rotation_stamp(path: Path) -> str:
    """The timestamp a rotated file's name carries ("" for the live file): orders backups."""
    m = ROTATED_STAMP.search(path.name)
    return m.group(1) if m else ""


class _Counting(io.RawIOBase):
    """A file that reports how many bytes were read from it (the progress bar of large inputs)."""

    def __init__(self, raw: BinaryIO, progress: Callable[[int], object] | None):
        self.raw, self.progress = raw, progress

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def readinto(self, buffer: Any) -> int:
        n = self.raw.readinto(buffer)  # type: ignore[attr-defined]
        if n and self.progress is not None:
            self.progress(n)
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def _open_binary(path: Path, progress: Callable[[int], object] | None = None) -> BinaryIO:
    try:
        raw = open(path, "rb", buffering=0)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    return io.BufferedReader(_Counting(raw, progress), buffer_size=1 << 20)  # type: ignore[arg-type]


def _is_record_header(head: bytes) -> bool:
    """The Collector's length-prefixed record: a big-endian length, then zstd or JSON."""
    if len(head) < 8:
        return False
    (size,) = struct.unpack(">I", head[:4])
    return 0 < size <= MAX_RECORD_BYTES and (head[4:8] == ZSTD_MAGIC or head[4:5] == b"{")


def read_text_lines(source: InputFile, progress: Callable[[int], object] | None = None
                    ) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, is_last) per line of a recording, decompressed as needed.

    ``is_last`` marks the final line so a partly written one can be told apart from a
    malformed line in the middle. A truncated compressed stream ends the file with a warning.
    """
    handle = _open_binary(source.path, progress)
    with handle:
        head = handle.peek(8)[:8]
        if head.startswith(GZIP_MAGIC):
            source.compression = "gzip"
            text = io.TextIOWrapper(gzip.GzipFile(fileobj=handle), encoding="utf-8", newline="")
            yield from _lines(source, text, (EOFError, OSError, zlib.error))
        elif head.startswith(ZSTD_MAGIC):
            import zstandard

            source.compression = "zstd"
            reader = zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=True)
            text = io.TextIOWrapper(reader, encoding="utf-8", newline="")
            yield from _lines(source, text, (zstandard.ZstdError, EOFError))
        elif _is_record_header(head):
            yield from _records(source, handle)
        else:
            text = io.TextIOWrapper(handle, encoding="utf-8", newline="")
            yield from _lines(source, text, ())


def _lines(source: InputFile, text: io.TextIOBase, truncation: tuple[type[BaseException], ...]
           ) -> Iterator[tuple[int, str, bool]]:
    number = 0
    pending: str | None = None
    try:
        for line in text:
            if pending is not None:
                yield number, pending, False
            number += 1
            pending = line
    except truncation as exc:
        source.partial_tail = True
        source.notes.append(f"the compressed stream ends early ({exc}); read up to line {number}")
        log.warning("%s: the compressed stream ends early (%s): a crash while writing? Read up to line %d",
                    source.path, exc, number)
        pending = None  # the line being decompressed when the stream broke may be cut
    except UnicodeDecodeError as exc:
        raise InputError(f"{source.path}:{number + 1}: not UTF-8 text ({exc.reason}); is this a recording?") from None
    if pending is not None:
        yield number, pending, True


def _records(source: InputFile, handle: BinaryIO) -> Iterator[tuple[int, str, bool]]:
    """The Collector's length-prefixed records, each a JSON request (zstd-compressed or not)."""
    source.compression = "records"
    number = 0
    decompressor = None
    while True:
        header = handle.read(4)
        if not header:
            return
        number += 1
        body = handle.read(struct.unpack(">I", header)[0]) if len(header) == 4 else b""
        if len(header) < 4 or len(body) < struct.unpack(">I", header.ljust(4, b"\0"))[0]:
            source.partial_tail = True
            source.notes.append(f"record {number} is cut short: skipped")
            log.warning("%s: record %d is cut short (a crash while writing?): skipped", source.path, number)
            return
        if body.startswith(ZSTD_MAGIC):
            import zstandard

            source.compression = "records+zstd"
            decompressor = decompressor or zstandard.ZstdDecompressor()
            try:
                body = decompressor.decompressobj().decompress(body)
            except zstandard.ZstdError as exc:
                raise InputError(f"{source.path}: record {number}: not a zstd frame: {exc}") from None
        if not body.lstrip().startswith(b"{"):
            raise InputError(f"{source.path}: record {number}: not JSON; the Collector's format: proto is not read "
                             "here: record with format: json")
        for piece in body.decode("utf-8", errors="replace").splitlines():
            if piece.strip():
                yield number, piece, False
