"""Which files ``otel-ofu report PATH...`` reads, in what order, and what it says about each.

Paths may be files, directories (every recording inside, recursively), or globs (quoted, so
the shell does not expand them, or expanded by it: both work). A file named on the command line
is read whatever it is called (its bytes tell its format); in a directory, recordings are found
by name (:data:`DATA_SUFFIXES`, compressed or rotated) and, whatever their name, by their first
bytes when they are the Collector's length-prefixed records (its ``format: proto``). Reading a file (compression,
the Collector's length-prefixed records, rotated names, a crash's partial last line) is the
library's one reader, :mod:`otel_ofu.otlp.files`; this module only chooses the files and
records what reading each found.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path

from otel_ofu.otlp.files import RecordedFile, detect_compression, rotation_stamp, unrotated_name

COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")
# Names a directory is searched for: the file exporter's JSON lines, OTLP protobuf records (the
# Collector's format: proto; .binpb is protobuf's own name for binary messages), and recordings the
# replay receiver reads (dmon, CSV), each possibly compressed and rotated.
DATA_SUFFIXES = (".jsonl", ".json", ".ndjson", ".pb", ".binpb", ".proto", ".otlp", ".csv", ".dmon")
_GLOB_CHARS = re.compile(r"[*?[]")


class InputError(Exception):
    """A path that cannot be read as a recording; the message names it."""


@dataclass
class InputFile(RecordedFile):
    """One file the report reads, and what reading it found (compression, a skipped partial tail,
    notes: :class:`RecordedFile`)."""

    format: str = ""  # otlp_json | otlp_proto | dmon | csv
    lines: int = 0
    first: float | None = None  # data time, seconds
    last: float | None = None

    def seen(self, t: float) -> None:
        self.first = t if self.first is None else min(self.first, t)
        self.last = t if self.last is None else max(self.last, t)


def data_time_order(source: InputFile) -> tuple:
    """The order the report lists its files in: by data time, then a rotated set by its names'
    times (the live file last), then by path; files without points last."""
    return source.first is None, source.first or 0.0, rotation_stamp(source.path.name) or "~", str(source.path)


def is_data_file(path: Path) -> bool:
    """Whether a file found in a directory is a recording: by name (compressed, rotated or not), or
    whatever its name by its first bytes, when they are the Collector's length-prefixed records."""
    name = unrotated_name(path.name).lower()
    for suffix in COMPRESSED_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    if name.endswith(DATA_SUFFIXES):
        return True
    try:
        with open(path, "rb") as handle:
            return detect_compression(handle.read(8)) == "records"
    except OSError:
        return False


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
                                 f"also compressed {'/'.join(COMPRESSED_SUFFIXES)}, and length-prefixed records "
                                 "of any name)")
            skipped = [p for p in found if p not in data]
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
