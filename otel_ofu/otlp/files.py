"""Recorded files: the one reader of what was recorded, and the ``file`` exporter's writing side.

Reading (:func:`read_lines`, :func:`read_json_lines`) serves every reader of recordings: the
``replay`` receiver, ``otel-ofu report`` and the tests. What the bytes are is told by their
first bytes, never by the file name (the Collector keeps the configured name when it
compresses):

- plain text: JSON lines, a ``dcgmi dmon`` capture or a CSV;
- gzip: one stream or one member per write; zstd: one stream or one frame per write (the
  Collector's native compression, ``zstd`` on the command line, ``pzstd``'s leading skippable
  frame);
- the Collector's length-prefixed records (``format: proto``, and ``compression: zstd`` without
  native compression): a 4-byte big-endian length, then the record, zstd-compressed or not
  (``exportMessageAsBuffer`` in the Collector's exporter/fileexporter/file_writer.go); with
  native compression the records are inside one zstd/gzip stream. A JSON record is read as a
  line; an OTLP protobuf record (an export request: its first field is 1, ``0x0a``) is read as
  its bytes, which :func:`proto_signal` tells metrics from logs.

:func:`read_items` yields both (text lines as ``str``, protobuf records as ``bytes``);
:func:`read_lines` is its text-only form. A crash leaves at most one partly written last line,
frame or record. It is skipped with one warning per file (:class:`RecordedFile` keeps what was
skipped), and the lines (records) before it are read. A last line that is complete JSON
without its newline (another tool's file) is kept.

Writing (docs/file-exporter.md). The current file is ``path``. A rotated file is renamed as the
Collector's file exporter (lumberjack) does: the rotation time, ``YYYY-MM-DDTHH-MM-SS.mmm``
(UTC, or local time with ``localtime``), inserted before the file's last extension:
``metrics.jsonl`` -> ``metrics-2026-11-30T12-07-16.799.jsonl``. Readers also accept the
``-<reason>`` suffix newer Collectors (timberjack) add (``metrics-<time>-size.jsonl``).
Compression (``zstd`` or ``gzip``) applies to every write: each export request's line(s) are
one complete zstd frame or gzip member, so a file is a valid ``.zst`` / ``.gz`` stream that
``zstd -d`` / ``gzip -d`` read, and a crash can only cut the last frame.
"""

from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import logging
import re
import struct
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("otel_ofu.otlp.files")

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"
# An OTLP export request's first byte: field 1 (resource_metrics / resource_logs), length-delimited.
PROTO_REQUEST_START = b"\x0a"
COMPRESSIONS = ("zstd", "gzip")
# A length-prefixed record is at most this long: also keeps a text file (first byte >= 0x09)
# from reading as a length.
MAX_RECORD_BYTES = 128 * 1024 * 1024
_TIME_FORMAT = "%Y-%m-%dT%H-%M-%S"  # then ".mmm": lumberjack's "2006-01-02T15-04-05.000"
# lumberjack's rotation time, then timberjack's optional "-<reason>" (size, time, manual)
_STAMP = r"(\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3})(?:-[a-z]+)?"
_BACKUP_TIME = re.compile(f"^{_STAMP}$")
_STAMP_IN_NAME = re.compile(f"-{_STAMP}(?=\\.|$)")
_JSON_START = re.compile(rb"\s*\{")


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


def rotation_stamp(name: str) -> str:
    """The rotation time a rotated file's name carries ("" for a live file): sorts a rotated set
    by name, whatever the live file is called (lumberjack and timberjack names, compressed or not)."""
    stamp = _last_stamp(name)
    return stamp.group(1) if stamp else ""


def unrotated_name(name: str) -> str:
    """The name of the live file a rotated file was renamed from (``name`` itself if not rotated)."""
    stamp = _last_stamp(name)
    return name[:stamp.start()] + name[stamp.end():] if stamp else name


def _last_stamp(name: str) -> re.Match[str] | None:
    found = None
    for found in _STAMP_IN_NAME.finditer(name):  # noqa: B007 (the last one is wanted)
        pass
    return found


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


# --- writing: compression, crash repair ------------------------------------------------------

def compressor(compression: str) -> Callable[[bytes], bytes]:
    """One complete zstd frame or gzip member per call; identity for ''/'none'."""
    if compression == "zstd":
        import zstandard

        ctx = zstandard.ZstdCompressor(level=3, write_content_size=True)
        return ctx.compress
    if compression == "gzip":
        return lambda data: gzip.compress(data, compresslevel=6, mtime=0)
    return lambda data: data


def repair_tail(path: Path) -> int:
    """Cut a partly written end (a crash) off a file about to be appended to; returns bytes removed.

    Plain files are cut after their last newline; compressed files after their last complete
    zstd frame or gzip member, so what is appended starts cleanly. Length-prefixed records
    (not this exporter's) are left as they are.
    """
    if not path.is_file() or path.stat().st_size == 0:
        return 0
    size = path.stat().st_size
    with open(path, "rb") as handle:
        compression = detect_compression(handle.read(8))
    if compression == "records":
        return 0
    if compression:
        frames = _Frames(open(path, "rb"), compression)  # noqa: SIM115 (closed just below)
        with frames:
            while frames.read(1 << 20):
                pass
        keep = frames.end_of_last_frame
    else:
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
    with open(path, "r+b") as handle:
        handle.truncate(keep)
    return size - keep


# --- reading ---------------------------------------------------------------------------------

class RecordingError(ValueError):
    """A recorded file that cannot be read as lines: which file, which line (0: none), what is wrong."""

    def __init__(self, path: str | Path, line: int, message: str):
        self.path, self.line, self.message = str(path), line, message
        super().__init__(f"{path}:{line}: {message}" if line else f"{path}: {message}")


@dataclass
class RecordedFile:
    """One recorded file as it is read: what its bytes turned out to be, and what a crash cut."""

    path: Path
    # "" | gzip | zstd | records (length-prefixed) | records+zstd (each record a zstd frame) |
    # zstd+records, gzip+records (records inside one compressed stream: native compression)
    compression: str = ""
    partial_tail: bool = False  # a partly written last line, frame or record was skipped
    notes: list[str] = field(default_factory=list)
    # Told about a skipped partial tail instead of the log (a warning), once per file.
    on_partial: Callable[[str], object] | None = field(default=None, repr=False, compare=False)

    def skipped_tail(self, line: int, what: str) -> None:
        """A crash's partial tail was skipped: noted, and said once."""
        self.partial_tail = True
        self.notes.append(what)
        message = f"{self.path}:{line}: {what}" if line else f"{self.path}: {what}"
        if self.on_partial is not None:
            self.on_partial(message)
        else:
            log.warning("%s", message)


def detect_compression(head: bytes) -> str:
    """'zstd', 'gzip', 'records' (the Collector's length-prefixed records) or '' (plain) from a
    file's first 8 bytes."""
    if head.startswith(ZSTD_MAGIC) or (head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50):
        return "zstd"  # a frame, or a skippable frame first (pzstd)
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if len(head) >= 8:
        (size,) = struct.unpack(">I", head[:4])
        if 0 < size <= MAX_RECORD_BYTES and (head[4:8] == ZSTD_MAGIC or head[4:5] in (b"{", PROTO_REQUEST_START)):
            return "records"
    return ""


def read_items(source: RecordedFile, *, errors: str = "strict", progress: Callable[[int], object] | None = None
               ) -> Iterator[tuple[int, str | bytes]]:
    """(line or record number, item) of a recording, decompressed or unframed as its bytes say.

    An item is a text line (``str``, JSON records too) or an OTLP protobuf record (``bytes``, the
    Collector's ``format: proto``). A line keeps its line end; only a plain file's last line may
    lack one (another tool's file, or a crash: :func:`skip_partial_last_line` tells them apart
    for JSON lines). A cut compressed stream or record ends the items: what follows the last
    complete line or record is skipped, with one warning (``source.skipped_tail``). Records are
    numbered as lines. ``progress`` is told how many file bytes were read. Raises
    :class:`RecordingError`.
    """
    try:
        raw: Any = open(source.path, "rb", buffering=0)  # noqa: SIM115 (closed through the handle below)
    except OSError as exc:
        raise RecordingError(source.path, 0, f"cannot read: {exc.strerror or exc}") from None
    handle = io.BufferedReader(_Counting(raw, progress) if progress is not None else raw, buffer_size=1 << 20)
    with handle:
        compression = detect_compression(handle.peek(8)[:8])
        if compression == "records":
            source.compression = "records"
            yield from _records(source, handle, errors)
            return
        frames = _Frames(handle, compression) if compression else None
        source.compression = compression
        binary = io.BufferedReader(frames, buffer_size=1 << 20) if frames is not None else handle
        if frames is not None and detect_compression(binary.peek(8)[:8]) == "records":
            # Native compression (the Collector's exporter.file.nativeCompression gate) of records:
            # one compressed stream, length-prefixed records inside (format: proto).
            source.compression = f"{compression}+records"
            count = yield from _records(source, binary, errors)
            if frames.problem and not source.partial_tail:
                source.skipped_tail(0, f"the compressed stream {frames.problem} after record {count} (the writer "
                                       "stopped mid-write: a crash?); the records before the cut are read")
            return
        yield from _text_lines(source, binary, frames, errors)


def read_lines(source: RecordedFile, *, errors: str = "strict", progress: Callable[[int], object] | None = None
               ) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line of a text recording: :func:`read_items` less protobuf records,
    which are refused (a dmon or CSV reader has no use for them)."""
    for number, item in read_items(source, errors=errors, progress=progress):
        if isinstance(item, bytes):
            raise RecordingError(source.path, 0, f"record {number}: OTLP protobuf (the Collector's format: proto), "
                                                 "not text")
        yield number, item


def _text_lines(source: RecordedFile, binary: IO[bytes], frames: _Frames | None, errors: str
                ) -> Iterator[tuple[int, str]]:
    text = io.TextIOWrapper(binary, encoding="utf-8", errors=errors, newline="")
    text._CHUNK_SIZE = 1 << 16  # type: ignore[attr-defined]  # fewer, larger reads: lines are ~10 kB
    number = 0
    pending: str | None = None
    try:
        for line in text:
            if pending is not None:
                yield number, pending
            number += 1
            pending = line
    except UnicodeDecodeError as exc:  # in the chunk after line ``number``: count its lines up to the byte
        before = exc.object[:exc.start].count(b"\n") if isinstance(exc.object, bytes) else 0
        raise RecordingError(source.path, number + 1 + before,
                             f"not UTF-8 text ({exc.reason}); is this a recording?") from None
    if frames is not None and frames.problem:
        if pending is not None and not pending.endswith("\n"):
            source.skipped_tail(number, f"skipping a partly written last line ({len(pending)} characters; "
                                        f"the compressed stream {frames.problem}): the writer stopped "
                                        "mid-write (a crash?)")
            return
        if pending is None:
            source.skipped_tail(0, f"the compressed stream {frames.problem} before its first line (the writer "
                                   "stopped mid-write: a crash?)")
            return
        yield number, pending
        source.skipped_tail(0, f"the compressed stream {frames.problem} after line {number} (the writer "
                               "stopped mid-write: a crash?); the lines before the cut are read")
        return
    if pending is not None:
        yield number, pending


def skip_partial_last_line(lines: Iterable[tuple[int, str | bytes]], source: RecordedFile
                           ) -> Iterator[tuple[int, str | bytes]]:
    """JSON lines: ``lines`` less a crash's partly written last line (no line end and not valid JSON),
    which is skipped with a warning. A complete JSON last line without its newline is kept.
    Protobuf records pass (a cut record is skipped where it is read)."""
    pending: tuple[int, str | bytes] | None = None
    for item in lines:
        if pending is not None:
            yield pending
        pending = item
    if pending is None:
        return
    number, line = pending
    if isinstance(line, str) and not line.endswith("\n") and line.strip():
        try:
            json.loads(line)
        except ValueError:
            source.skipped_tail(number, f"skipping a partly written last line ({len(line)} characters): the "
                                        "writer stopped mid-write (a crash?)")
            return
    yield pending


def read_json_lines(path: str | Path, on_partial: Callable[[str], object] | None = None
                    ) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line of a JSON lines recording, a crash's partial tail skipped
    (protobuf records are refused: :func:`read_requests` reads both).

    ``on_partial`` (default: a logged warning) is told about a skipped partial tail.
    """
    source = RecordedFile(Path(path), on_partial=on_partial)
    return skip_partial_last_line(read_lines(source), source)  # type: ignore[return-value]


def read_requests(path: str | Path, on_partial: Callable[[str], object] | None = None
                  ) -> Iterator[tuple[int, str | bytes]]:
    """(number, request) of every export request of an OTLP recording: a JSON line (``str``) or a
    protobuf record (``bytes``), a crash's partial tail skipped."""
    source = RecordedFile(Path(path), on_partial=on_partial)
    return skip_partial_last_line(read_items(source), source)


def proto_signal(record: bytes) -> str:
    """'metrics', 'logs' or '' (no item at all) of an OTLP protobuf export request, from its bytes.

    Both requests are ``repeated Resource* = 1`` holding ``repeated Scope* = 2`` holding their
    items as field 2 (the Collector writes a message's fields highest number first, so nothing
    can be told by position), and the Collector's file exporter writes both signals into one
    file without a marker. Every field of a Metric is length-delimited and it has no field 6;
    a LogRecord has fixed64 times, a varint severity, fixed32 flags or its attributes (field
    6), one of which every log record the Collector or otel-ofu writes carries.
    """
    for resource in _len_fields(record, 0, len(record), 1):
        for scope in _len_fields(record, *resource, 2):
            for item in _len_fields(record, *scope, 2):
                if item[0] == item[1]:
                    continue
                return "logs" if any(kind != 2 or number == 6 for number, kind, _, _ in _fields(record, *item)) \
                    else "metrics"
    return ""


def _fields(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(number, wire type, value start, value end) of each field of the message ``data[start:end]``; it stops
    quietly after a group's tag (never in OTLP) or at damage, a cut value ending at ``end``."""
    i = start
    while i < end:
        key, i = _varint(data, i)
        kind = key & 7
        if kind == 2:
            size, i = _varint(data, i)
            after = i + size
        elif kind == 0:
            _, after = _varint(data, i)
        elif kind == 1:
            after = i + 8
        elif kind == 5:
            after = i + 4
        else:
            yield key >> 3, kind, i, i  # told, as a field the reader cannot skip
            return
        yield key >> 3, kind, i, min(after, end)
        i = after


def _len_fields(data: bytes, start: int, end: int, number: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each length-delimited field ``number`` of the message ``data[start:end]``."""
    return ((first, last) for found, kind, first, last in _fields(data, start, end) if kind == 2 and found == number)


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while i < len(data):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7
    return value, len(data) + 1  # cut: past the end


def _records(source: RecordedFile, handle: IO[bytes], errors: str) -> Generator[tuple[int, str | bytes], None, int]:
    """The Collector's length-prefixed records, each a JSON or protobuf request (zstd-compressed or not);
    returns how many were read."""
    number = 0
    decompressor = None
    while True:
        header = handle.read(4)
        if not header:
            return number
        size = struct.unpack(">I", header)[0] if len(header) == 4 else 0
        body = handle.read(size) if size else b""
        if len(header) < 4 or len(body) < size:
            source.skipped_tail(0, f"record {number + 1} is cut short (the writer stopped mid-write: a crash?): "
                                   "skipped")
            return number
        number += 1
        if body.startswith(ZSTD_MAGIC):
            import zstandard

            if source.compression == "records":
                source.compression = "records+zstd"
            decompressor = decompressor or zstandard.ZstdDecompressor()
            try:
                body = decompressor.decompressobj().decompress(body)
            except zstandard.ZstdError as exc:
                raise RecordingError(source.path, 0, f"record {number}: not a zstd frame: {exc}") from None
        if not body:
            continue  # an empty request
        if body[:1] == PROTO_REQUEST_START:
            yield number, body
            continue
        if not _JSON_START.match(body):
            raise RecordingError(source.path, 0, f"record {number}: neither OTLP JSON nor an OTLP protobuf export "
                                                 f"request (starts with {body[:8]!r})")
        try:
            text = body.decode("utf-8", errors)
        except UnicodeDecodeError as exc:
            raise RecordingError(source.path, 0, f"record {number}: not UTF-8 text ({exc.reason}); "
                                                 "is this a recording?") from None
        if "\n" not in text and "\r" not in text:  # one request per record, as the Collector writes
            yield number, text + "\n"
            continue
        for piece in io.StringIO(text, newline=""):
            if piece.strip():
                yield number, piece if piece.endswith("\n") else piece + "\n"


class _Counting(io.RawIOBase):
    """A file that tells how many bytes were read from it (the report's progress bar)."""

    def __init__(self, raw: IO[bytes], progress: Callable[[int], object]):
        self.raw, self.progress = raw, progress

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self.raw.readinto(buffer)  # type: ignore[attr-defined]
        if n:
            self.progress(n)
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


class _Frames(io.RawIOBase):
    """Concatenated zstd frames or gzip members, decompressed; stops quietly at a cut or damaged one.

    ``problem`` then says which ("ends mid-frame", "is damaged (...)"); ``end_of_last_frame``
    is where the last complete frame or member ends in the file (where a repair cuts).
    """

    def __init__(self, raw: IO[bytes], compression: str):
        self._raw = raw
        self._compression = compression
        self._decoder: Any = None
        self._zstd: Any = None  # one decompressor context, a decoder per frame from it
        self._pending = b""
        self._offset = 0
        self._done = False
        self._read = 0
        self.end_of_last_frame = 0
        self.problem = ""

    def _new_decoder(self) -> Any:
        if self._compression == "zstd":
            if self._zstd is None:
                import zstandard

                self._zstd = zstandard.ZstdDecompressor()
            return self._zstd.decompressobj()
        return zlib.decompressobj(16 + zlib.MAX_WBITS)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()
        super().close()

    def readinto(self, buffer: Any) -> int:
        while self._offset >= len(self._pending):
            if self._done:
                return 0
            self._pending, self._offset = self._fill(), 0
        n = min(len(buffer), len(self._pending) - self._offset)
        buffer[:n] = memoryview(self._pending)[self._offset:self._offset + n]
        self._offset += n
        return n

    def _fill(self) -> bytes:
        data = self._raw.read(1 << 16)
        if not data:
            self._done = True
            if self._decoder is not None:
                self.problem = "ends mid-frame"  # the last frame/member never ended
            return b""
        self._read += len(data)
        out = []
        try:
            while data:
                if self._decoder is None:
                    if self._compression == "gzip":
                        data = data.lstrip(b"\0")  # zero padding after a member, as gzip -d allows
                        if not data:
                            break
                    self._decoder = self._new_decoder()
                out.append(self._decoder.decompress(data))
                if not self._decoder.eof:
                    break  # needs more input
                data = self._decoder.unused_data
                self.end_of_last_frame = self._read - len(data)
                self._decoder = None  # a frame/member ended: the rest starts the next one
        except Exception as exc:  # zstandard.ZstdError, zlib.error: a damaged frame, as from a torn write
            self.problem = f"is damaged ({exc})"
            self._done = True
        return b"".join(out)
