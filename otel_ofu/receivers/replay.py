"""The ``replay`` receiver: feeds a recorded trace through a pipeline, in real time or faster.

Four recordings are understood (``format: auto`` tells them apart by their first bytes and lines,
whatever the file is called):

- ``dmon``: the table ``dcgmi dmon -e 1004,100,... -d <ms>`` prints (dcgmi/DeviceMonitor.cpp):
  a ``#Entity`` header of field short names (``TENSO``, ``SMCLK``, ...), a units line, then one
  row per entity (``GPU 0``, ``GPU-I 3``) per iteration, ``N/A`` for blanks, the header again
  every 14 iterations. It has no timestamps: iteration k is stamped ``start_time + k x
  interval``, where ``interval`` comes from the config, else from a recorded ``# dcgmi dmon
  ... -d <ms>`` comment line, else dcgmi's default of 1000 ms. That comment's ``-e`` list, when
  present, names the columns by field id exactly.
- ``csv``: a header row with ``timestamp``, ``gpu`` and optionally ``uuid``, ``model``,
  ``host``, dcgm-exporter label names (``pod``, ``GPU_I_ID``, ``hpc_job``, ...), then field
  columns named by DCGM field id (``1004``) or name (``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``).
- ``otlp_json``: this project's ``file`` exporter output (OTLP JSON, one request per line):
  its metric points and events are re-emitted as they were, so a recorded pipeline output can
  be replayed into another exporter.
- ``otlp_proto``: the same as OTLP protobuf export requests in the Collector file exporter's
  length-prefixed records (``format: proto``), compressed or not (:mod:`otel_ofu.otlp.files`).

Recorded timestamps are kept (``rebase_time`` shifts them to now). ``speed`` 1 replays in real
time, 60 a minute per second, 0 or ``max`` as fast as the pipeline takes it. A malformed line
is an error naming the file and line; by default the whole file is refused before anything
is sent (``skip_malformed`` logs and skips bad lines instead). The ``parse_*`` functions are
pure: lines in, frames out, :class:`ReplayFormatError` on bad input.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import itertools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from otel_ofu.core import dcgm_fields
from otel_ofu.core.metrics import MetricInfo, register
from otel_ofu.core.model import GPU_MIG_INSTANCE, Batch, GpuSample, MetricPoint
from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp import files
from otel_ofu.pipeline.component import Context, Factory, PollingReceiver
from otel_ofu.pipeline.config import Duration, invalid, path_kind, require

SOURCE = "replay"
FORMATS = ("dmon", "csv", "otlp_json", "otlp_proto")
OTLP_FORMATS = ("otlp_json", "otlp_proto")
DMON_DEFAULT_DELAY_S = 1.0  # dcgmi dmon -d default: 1000 ms
DMON_ENTITY_GROUPS = ("GPU", "GPU-I", "GPU-CI", "vGPU", "Switch", "GPU_I", "GPU_CI", "CPU", "CPU_CORE", "Link")
CSV_DEFAULT_WINDOW_S = 1.0
MAX_LOGGED_ERRORS = 10

REPLAY_ERRORS = register(MetricInfo(
    "otel_ofu.replay.errors", "{line}", "sum",
    "Malformed lines met by the replay receiver, by file; a refused file counts its first bad line."))


class ReplayFormatError(ValueError):
    """A recording that does not parse: which file, which line (1-based), what is wrong."""

    def __init__(self, path: str, line: int, message: str):
        self.path, self.line, self.message = path, line, message
        super().__init__(f"{path}:{line}: {message}")


ErrorHandler = Callable[[ReplayFormatError], None]


@dataclass(slots=True)
class Frame:
    """What one recorded instant produces: a batch and its timestamp (ns)."""

    time_unix_nano: int
    batch: Batch
    line: int  # the line the frame starts at


def _raise(error: ReplayFormatError) -> None:
    raise error


def _number(text: str) -> object:
    """A numeric cell as int or float (ints stay exact: int64 blanks keep their offset), else raw."""
    text = text.strip()
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text  # "N/A" and the like: values.clean reports it as blank


def _gpu_index(text: str) -> int | str:
    return int(text) if text.isdecimal() else text


# --- dcgmi dmon ------------------------------------------------------------------------------

_DMON_FIELDS = re.compile(r"(?:^|\s)(?:-e|--field-id)[\s=]+(\S+)")
_DMON_DELAY = re.compile(r"(?:^|\s)(?:-d|--delay)[\s=]+(\d+)")


def _dmon_columns(names: list[str], recorded: list[int] | None, path: str, line: int) -> list[int | None]:
    if recorded is not None:
        if len(recorded) != len(names):
            raise ReplayFormatError(path, line, f"the header has {len(names)} columns but the recorded -e list has "
                                                f"{len(recorded)} field ids")
        return list(recorded)
    return [dcgm_fields.DMON_SHORT_NAMES.get(n.upper()) or dcgm_fields.field_id(n) for n in names]


def parse_dmon(lines: Iterable[str], path: str, *, start_unix_nano: int, interval_s: float | None = None,
               model: str = "", host: str = "", on_error: ErrorHandler | None = None) -> Iterator[Frame]:
    """Frames from ``dcgmi dmon`` output: one per iteration (until an entity repeats)."""
    fail = on_error or _raise
    columns: list[int | None] | None = None
    recorded_ids: list[int] | None = None
    delay_s = interval_s
    rows: dict[tuple[str, str], tuple[dict[int, object], int | str]] = {}
    frame_line = 0
    iteration = 0
    parent_gpu: int | str = ""

    def flush() -> Frame:
        step = delay_s if delay_s is not None else DMON_DEFAULT_DELAY_S
        t = start_unix_nano + round(iteration * step * 1e9)
        batch = Batch()
        for (group, eid), (fields, parent) in rows.items():
            resource: dict[str, object] = {}
            index: int | str = _gpu_index(eid)
            if group != "GPU":
                resource["dcgm.entity"] = f"{group} {eid}"
                index = parent
                if group in ("GPU-I", "GPU_I"):
                    resource[GPU_MIG_INSTANCE] = eid
            batch.samples.append(dcgm_fields.sample_from_fields(
                fields, time_unix_nano=t, window_s=step, host=host, gpu_index=index, uuid="", model=model,
                source=SOURCE, resource=resource))
        return Frame(t, batch, frame_line)

    for number, raw in enumerate(lines, 1):
        text = raw.strip()
        if not text:
            continue
        if text.startswith("#"):
            body = text[1:].strip()
            if body.startswith("Entity"):
                names = body.split()[1:]
                if not names:
                    fail(ReplayFormatError(path, number, "the '#Entity' header names no field columns"))
                    continue
                try:
                    columns = _dmon_columns(names, recorded_ids, path, number)
                except ReplayFormatError as exc:
                    fail(exc)
                continue
            if "dmon" in body:  # a recorded command line: "# dcgmi dmon -e 1004,100 -d 1000"
                if (m := _DMON_FIELDS.search(body)) is not None:
                    ids = [dcgm_fields.field_id(part) for part in m.group(1).split(",") if part]
                    if None in ids:
                        fail(ReplayFormatError(path, number, f"unknown field in the -e list {m.group(1)!r}"))
                    else:
                        recorded_ids = ids  # type: ignore[assignment]
                if (m := _DMON_DELAY.search(body)) is not None and interval_s is None:
                    delay_s = int(m.group(1)) / 1000.0
            continue  # other comments are notes
        tokens = text.split()
        if tokens[0] in ("ID", "Id"):  # the units line under the header
            continue
        if text.startswith("dmon was stopped"):
            continue
        if tokens[0] not in DMON_ENTITY_GROUPS:
            hint = "dcgmi reported an error" if text.lower().startswith("error") else "unrecognised line"
            fail(ReplayFormatError(path, number, f"{hint}: {text[:80]!r}; expected a '#Entity' header, its units "
                                                 "line, or an entity row such as 'GPU 0 ...'"))
            continue
        if columns is None:
            fail(ReplayFormatError(path, number, "an entity row before any '#Entity' header line"))
            continue
        if len(tokens) < 2 or not tokens[1].isdecimal():
            fail(ReplayFormatError(path, number, f"expected '<entity group> <id>' such as 'GPU 0', got {text[:40]!r}"))
            continue
        values = tokens[2:]
        if len(values) != len(columns):
            fail(ReplayFormatError(path, number, f"{len(values)} values for {len(columns)} columns"))
            continue
        key = (tokens[0], tokens[1])
        if key in rows:  # the entity repeats: a new iteration begins
            yield flush()
            rows = {}
            iteration += 1
        if not rows:
            frame_line = number
        if tokens[0] == "GPU":
            parent_gpu = _gpu_index(tokens[1])
        rows[key] = ({fid: _number(v) for fid, v in zip(columns, values) if fid is not None}, parent_gpu)
    if rows:
        yield flush()


# --- CSV ---------------------------------------------------------------------------------------

# CSV header names -> the dcgm-exporter label they stand for (identity_from_labels reads labels).
_CSV_LABEL_ALIASES = {"model": "modelName", "host": "Hostname", "host_name": "Hostname", "job": "hpc_job",
                      "job_id": "hpc_job"}
_CSV_IDENTITY = ("gpu", "uuid", "UUID")


def parse_timestamp(text: str) -> int:
    """Unix ns from ISO 8601 (naive means UTC) or a number of s, ms, us or ns (told apart by size)."""
    text = text.strip()
    try:
        number = float(text)
    except ValueError:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return round(moment.timestamp() * 1e9)
    if not 0 <= number < 2 ** 64:  # inf, NaN, negative or beyond any clock (found by benchmarks/fuzz.py)
        raise ValueError(f"timestamp {text!r} is out of range")
    if number < 1e11:
        return round(number * 1e9)
    if number < 1e14:
        return round(number * 1e6)
    if number < 1e17:
        return round(number * 1e3)
    return int(text) if text.isdecimal() else round(number)


def parse_csv(lines: Iterable[str], path: str, *, interval_s: float | None = None, model: str = "",
              host: str = "", on_error: ErrorHandler | None = None) -> Iterator[Frame]:
    """Frames from a CSV recording: consecutive rows with the same timestamp form one frame."""
    fail = on_error or _raise
    reader = csv.reader(lines)
    header: list[str] | None = None
    time_col = -1
    window_col = -1
    field_cols: list[tuple[int, int]] = []
    label_cols: list[tuple[int, str]] = []
    frame: Frame | None = None
    last_seen: dict[tuple, int] = {}
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            fail(ReplayFormatError(path, reader.line_num, f"not CSV: {exc}"))
            continue
        number = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if header is None:
            header = [cell.strip() for cell in row]
            lowered = [h.lower() for h in header]
            missing = [c for c in ("timestamp", "gpu") if c not in lowered]
            duplicated = sorted({h for h in header if header.count(h) > 1})
            if missing or duplicated:
                problem = (f"the header lacks {', '.join(repr(m) for m in missing)}" if missing
                           else f"the header repeats {', '.join(repr(d) for d in duplicated)}")
                raise ReplayFormatError(path, number, f"{problem} (expected timestamp, gpu, then uuid, model, host, "
                                                      "labels and DCGM field columns by id or name)")
            time_col = lowered.index("timestamp")
            window_col = lowered.index("window_s") if "window_s" in lowered else -1
            for i, name in enumerate(header):
                if i in (time_col, window_col):
                    continue
                fid = dcgm_fields.field_id(name) if name.lower() not in ("gpu", "uuid") else None
                fid = fid if fid is not None else dcgm_fields.DMON_SHORT_NAMES.get(name)
                if fid is not None:
                    field_cols.append((i, fid))
                else:
                    label = name.lower() if name.lower() in _CSV_IDENTITY else name
                    label_cols.append((i, _CSV_LABEL_ALIASES.get(label.lower(), label)))
            continue
        if len(row) != len(header):
            fail(ReplayFormatError(path, number, f"{len(row)} cells for {len(header)} columns"))
            continue
        try:
            t = parse_timestamp(row[time_col])
        except ValueError:
            fail(ReplayFormatError(path, number, f"bad timestamp {row[time_col]!r}: expected ISO 8601 or unix time"))
            continue
        labels = {label: row[i].strip() for i, label in label_cols if row[i].strip()}
        if not labels.get("gpu"):
            fail(ReplayFormatError(path, number, "the gpu cell is empty"))
            continue
        ident = dcgm_fields.identity_from_labels(labels)
        key = (ident["host"], ident["gpu_index"], ident["uuid"], tuple(sorted(ident["resource"].items())))
        if window_col >= 0:
            try:
                window = float(row[window_col])
                if not 0 < window < 1e9:  # NaN, inf, 0 or negative: no window (found by benchmarks/fuzz.py)
                    raise ValueError
            except ValueError:
                fail(ReplayFormatError(path, number, f"bad window_s {row[window_col]!r}: expected seconds > 0"))
                continue
        elif interval_s is not None:
            window = interval_s
        elif key in last_seen and t > last_seen[key]:
            window = (t - last_seen[key]) / 1e9
        else:
            window = 0.0  # a GPU's first row: the spacing to the next frame, filled in below
        last_seen[key] = t
        sample = dcgm_fields.sample_from_fields(
            {fid: _number(row[i]) for i, fid in field_cols}, time_unix_nano=t, window_s=window,
            host=ident["host"] or host, gpu_index=_gpu_index(ident["gpu_index"]), uuid=ident["uuid"],
            model=ident["model"] or model, source=SOURCE, job_id=ident["job_id"], resource=dict(ident["resource"]))
        if frame is not None and frame.time_unix_nano != t:
            yield _fill_windows(frame, (t - frame.time_unix_nano) / 1e9)
            frame = None
        if frame is None:
            frame = Frame(t, Batch(), number)
        frame.batch.samples.append(sample)
    if header is None:
        raise ReplayFormatError(path, 1, "the file is empty: expected a header row")
    if frame is not None:
        yield _fill_windows(frame, CSV_DEFAULT_WINDOW_S)


def _fill_windows(frame: Frame, spacing_s: float) -> Frame:
    """Windows of first rows: without an interval, a row stands for the time to the next frame."""
    for sample in frame.batch.samples:
        if not sample.window_s:
            sample.window_s = spacing_s if spacing_s > 0 else CSV_DEFAULT_WINDOW_S
    return frame


# --- OTLP JSON lines -------------------------------------------------------------------------------

def parse_otlp(lines: Iterable[str | bytes], path: str, *, on_error: ErrorHandler | None = None) -> Iterator[Frame]:
    """Frames from OTLP requests: JSON lines (the file exporter's output) or protobuf records
    (``bytes``, the Collector's ``format: proto``): one per request."""
    fail = on_error or _raise
    for number, line in enumerate(lines, 1):
        if isinstance(line, bytes):
            try:
                request = otlp.from_proto_record(line)
            except ValueError as exc:
                fail(ReplayFormatError(path, number, str(exc)))
                continue
            yield from _request_frame(request, number)
            continue
        if not line.strip():
            continue
        try:
            document = json.loads(line)
        except json.JSONDecodeError as exc:
            fail(ReplayFormatError(path, number, f"not JSON: {exc.msg} at column {exc.colno}"))
            continue
        if not isinstance(document, dict) or not ({"resourceMetrics", "resourceLogs"} & set(document)):
            fail(ReplayFormatError(path, number, "not an OTLP export request: no resourceMetrics or resourceLogs"))
            continue
        try:
            request = otlp.from_json_line(line)
        except ValueError as exc:
            fail(ReplayFormatError(path, number, str(exc)))
            continue
        yield from _request_frame(request, number)


def _request_frame(request: object, number: int) -> Iterator[Frame]:
    batch = Batch()
    if isinstance(request, otlp.ExportLogsServiceRequest):
        batch.events = list(otlp.events_from_request(request))
    else:
        batch.points = list(otlp.from_request(request))  # type: ignore[arg-type]
    times = [p.time_unix_nano for p in batch.points] + [e.time_unix_nano for e in batch.events]
    if times:
        yield Frame(max(times), batch, number)


# --- format detection and the file --------------------------------------------------------------

def sniff_format(lines: Iterable[str]) -> tuple[str | None, str, int]:
    """(format or None, first non-empty line, its number) from the first lines of a recording."""
    first = ""
    first_line = 1
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        if not first:
            first, first_line = text, number
        if text.startswith("{"):
            return "otlp_json", first, first_line
        if text.startswith("#") and text[1:].strip().startswith("Entity") or "dcgmi dmon" in text:
            return "dmon", first, first_line
        if re.match(r"(GPU|GPU-I|GPU-CI)\s+\d+\s", text):
            return "dmon", first, first_line
        if "," in text and text.split(",")[0].strip().strip('"').lower() == "timestamp":
            return "csv", first, first_line
        if number >= 50:
            break
    return None, first, first_line


FORMATS_BY_SUFFIX = {".jsonl": "otlp_json", ".json": "otlp_json", ".ndjson": "otlp_json", ".csv": "csv",
                     ".dmon": "dmon"}


def detect_format(path: str | Path) -> str:
    """dmon, csv, otlp_json or otlp_proto from the first bytes and lines of a file (then its suffix)."""
    path = Path(path)
    # Compressed files and the Collector's records too; a cut tail is reported when the file is read.
    items = files.read_items(files.RecordedFile(path, on_partial=lambda message: None), errors="replace")
    try:
        with contextlib.closing(items):
            first_item = next(items, None)
            if isinstance(first_item, tuple) and isinstance(first_item[1], bytes):
                return "otlp_proto"
            lines = itertools.chain([first_item] if first_item else [], items)
            fmt, first, first_line = sniff_format(text for _, text in lines)  # type: ignore[misc]
    except files.RecordingError as exc:
        raise ReplayFormatError(exc.path, exc.line, exc.message) from None
    if fmt is not None:
        return fmt
    suffix = path.suffix.lower()
    if suffix in FORMATS_BY_SUFFIX:
        return FORMATS_BY_SUFFIX[suffix]
    if not first:
        raise ReplayFormatError(str(path), 1, "the file is empty")
    raise ReplayFormatError(str(path), first_line, f"cannot tell the format from {first[:60]!r}: set format to "
                                                   "dmon, csv, otlp_json or otlp_proto")


def read_frames(path: str | Path, fmt: str, *, start_unix_nano: int, interval_s: float | None = None,
                model: str = "", host: str = "", on_error: ErrorHandler | None = None) -> Iterator[Frame]:
    """Frames of a recording file, parsed lazily (a long recording is never held in memory).

    The file is read by :mod:`otel_ofu.otlp.files`: plain, compressed (zstd, gzip) or the
    Collector's length-prefixed records; a tail cut by a crash of the writer is skipped with a
    warning, not an error.
    """
    name = str(path)
    if fmt == "auto":
        fmt = detect_format(path)
    source = files.RecordedFile(Path(path))
    if fmt in OTLP_FORMATS:
        lines: Iterator[tuple[int, str | bytes]] = files.read_items(source)
    else:
        lines = files.read_lines(source)  # type: ignore[assignment]
    texts = (text for _, text in lines)
    try:
        if fmt in OTLP_FORMATS:
            yield from parse_otlp((item for _, item in files.skip_partial_last_line(lines, source)), name,
                                  on_error=on_error)
        elif fmt == "dmon":
            yield from parse_dmon(texts, name, start_unix_nano=start_unix_nano,  # type: ignore[arg-type]
                                  interval_s=interval_s, model=model, host=host, on_error=on_error)
        else:
            yield from parse_csv(texts, name, interval_s=interval_s, model=model, host=host,  # type: ignore[arg-type]
                                 on_error=on_error)
    except files.RecordingError as exc:
        raise ReplayFormatError(exc.path, exc.line, exc.message) from None
    finally:
        lines.close()


def shift_batch(batch: Batch, offset_ns: int) -> Batch:
    """A copy of a batch with every timestamp moved by ``offset_ns`` (rebase_time, loop passes)."""
    if not offset_ns:
        return batch

    def moved(point: MetricPoint) -> MetricPoint:
        start = point.start_time_unix_nano + offset_ns if point.start_time_unix_nano else 0
        return dataclasses.replace(point, time_unix_nano=point.time_unix_nano + offset_ns,
                                   start_time_unix_nano=start)

    samples: list[GpuSample] = [dataclasses.replace(s, time_unix_nano=s.time_unix_nano + offset_ns)
                                for s in batch.samples]
    events = [dataclasses.replace(e, time_unix_nano=e.time_unix_nano + offset_ns) for e in batch.events]
    return Batch(samples=samples, points=[moved(p) for p in batch.points], passthrough=list(batch.passthrough),
                 events=events)


# --- the receiver -----------------------------------------------------------------------------------

@dataclass
class ReplayReceiverConfig:
    path: str = ""  # the recording; checked to exist when the config is validated
    # auto looks at the first bytes and lines (OTLP protobuf records, OTLP JSON, dmon, CSV), then the
    # suffix (.dmon, .csv, .jsonl).
    format: Literal["auto", "dmon", "csv", "otlp_json", "otlp_proto"] = "auto"
    # Recorded seconds per wall second: 1 = real time, 60 = a minute per second, 0 or "max" = as
    # fast as the pipeline accepts.
    speed: float | Literal["max"] = 1.0
    # Start over at the end; each pass is shifted forward by the recording's span plus one step,
    # so timestamps keep increasing.
    loop: bool = False
    # Shift every timestamp so the first record is stamped "now" (for live backends); otherwise
    # recorded timestamps are kept.
    rebase_time: bool = False
    # dmon only: time of the first row, ISO 8601 (naive = UTC) or unix seconds; unset = when the
    # replay starts. Quote it in YAML ("2026-03-02T10:00:00Z"), or YAML reads a date.
    start_time: str | None = None
    # dmon: spacing of rows (unset: the recorded -d, else 1s); csv: the window length of every row
    # (unset: a window_s column, else the time since the GPU's previous row).
    interval: Duration | None = None
    # dmon (and csv without a model column): the GPU model, which picks f_ref; without it OFU
    # needs an SMMAX column.
    model: str = ""
    host_name: str = ""  # dmon (and csv without a host column): host.name of the GPUs
    # Log (the first 10) and count bad lines and replay the rest, instead of refusing the file.
    skip_malformed: bool = False
    # OTLP (JSON or protobuf): replay the rotated files of path first (the file exporter's and the Collector's
    # rotation names beside it, e.g. metrics-2026-11-30T12-00-00.000.jsonl), oldest first, then
    # path itself: the whole recording, in the order it was written.
    rotated: bool = True

    def validate(self) -> None:
        require(bool(self.path), "path", "required: the recording to replay")
        path = Path(self.path).expanduser()
        require(path_kind("path", path) == "file" or (self.rotated and bool(files.rotated_files(path))), "path",
                f"file {self.path!r} does not exist" + (" (nor any rotated file of it)" if self.rotated else ""))
        require(self.speed == "max" or float(self.speed) >= 0, "speed", "must be >= 0 (0 or 'max': no pacing)")
        require(self.interval is None or self.interval > 0, "interval", "must be positive")
        if self.start_time is not None:
            try:
                parse_timestamp(self.start_time)
            except ValueError:
                invalid("start_time", f"expected ISO 8601 or unix seconds, got {self.start_time!r}")

    def output_kind(self) -> str:
        """A replay of OTLP JSON sends finished points; dmon and CSV send GPU samples for the ofu processor."""
        try:
            return "points" if self._format_of(self.recording_files()[-1]) in OTLP_FORMATS else "samples"
        except (ReplayFormatError, OSError):
            return "samples"

    def _format_of(self, path: Path) -> str:
        return detect_format(path) if self.format == "auto" else self.format

    def recording_files(self) -> list[Path]:
        """The files replayed, in order: ``path``, after its rotated files when ``rotated`` is on and
        the recording is OTLP JSON (a dmon capture or CSV is one file: its rows are timed from its start)."""
        path = Path(self.path).expanduser()
        found = files.rotated_files(path) if self.rotated else []
        if not found or found == [path]:
            return [path]
        try:
            return found if self._format_of(found[-1]) in OTLP_FORMATS else [path]
        except (ReplayFormatError, OSError):
            return [path]

    def pace(self) -> float:
        """Recorded seconds per wall second; 0 means as fast as possible."""
        return 0.0 if self.speed == "max" else float(self.speed)


class ReplayReceiver(PollingReceiver):
    def __init__(self, config: ReplayReceiverConfig, context: Context, consumer):
        super().__init__(config, context, consumer)
        self.path = str(Path(config.path).expanduser())
        self.clock: Callable[[], float] = time.monotonic  # tests drive a fake clock
        self.wall_ns: Callable[[], int] = time.time_ns
        self.frames_emitted = 0
        self.passes = 0
        self.finished = False
        self.error: ReplayFormatError | None = None
        self._frames: Iterator[Frame] | None = None
        self._pending: Frame | None = None
        self._start_ns = 0
        self._offset = 0
        self._first_t: int | None = None
        self._wall_start = 0.0
        self._pass_first: int | None = None
        self._pass_last: int | None = None
        self._pass_step = 0
        self._logged_errors = 0
        self._started = False

    # -- lifecycle ----------------------------------------------------------------------------
    def on_start(self) -> None:
        self._started = True
        cfg = self.config
        self._start_ns = parse_timestamp(cfg.start_time) if cfg.start_time else self.wall_ns()
        try:
            count = sum(1 for _ in self._read(self._skip))  # refuse a malformed file before sending anything
        except (ReplayFormatError, OSError) as exc:
            self._refuse(exc)
            return
        if count == 0:
            self.log.warning("%s holds no data to replay", self.path)
        backups = [p for p in cfg.recording_files() if str(p) != self.path]
        if backups:
            self.log.info("%s has %d rotated files: replaying them first, oldest first%s", self.path, len(backups),
                          "" if Path(self.path).is_file() else " (the file itself is not there)")
        self.log.info("replaying %s (%d frames) at %s%s", self.path, count,
                      "full speed" if cfg.pace() == 0 else f"x{cfg.pace():g}", ", looping" if cfg.loop else "")
        self._open_pass()

    def _read(self, on_skip: ErrorHandler) -> Iterator[Frame]:
        """The recording's frames, file after file; bad lines raise, or go to ``on_skip`` with skip_malformed."""
        cfg = self.config
        handler = on_skip if cfg.skip_malformed else None
        for path in cfg.recording_files():
            yield from read_frames(path, cfg.format, start_unix_nano=self._start_ns,
                                   interval_s=float(cfg.interval) if cfg.interval is not None else None,
                                   model=cfg.model, host=cfg.host_name, on_error=handler)

    def _skip(self, error: ReplayFormatError) -> None:
        self.context.telemetry.add(REPLAY_ERRORS.name, 1, file=self.path)
        self._logged_errors += 1
        if self._logged_errors <= MAX_LOGGED_ERRORS:
            self.log.warning("skipping malformed line %s", error)
        elif self._logged_errors == MAX_LOGGED_ERRORS + 1:
            self.log.warning("more malformed lines in %s; counting them in %s without logging", self.path,
                             REPLAY_ERRORS.name)

    def _refuse(self, exc: Exception) -> None:
        self.error = exc if isinstance(exc, ReplayFormatError) else ReplayFormatError(self.path, 0, str(exc))
        self.finished = True
        self.context.telemetry.add(REPLAY_ERRORS.name, 1, file=self.path)
        self.log.error("cannot replay %s; nothing was sent (set skip_malformed: true to skip bad lines)", self.error)
        self.notify_finished()

    def is_finite(self) -> bool:
        return not self.config.loop

    def is_finished(self) -> bool:
        return self.finished

    def failure(self) -> str | None:
        return None if self.error is None else str(self.error)

    def _open_pass(self) -> None:
        self._frames = self._read(lambda error: None)  # reported when the file was checked
        self._pending = None
        self._pass_first = self._pass_last = None

    # -- pacing -------------------------------------------------------------------------------------
    def _next_frame(self) -> Frame | None:
        if self._pending is None and self._frames is not None:
            try:
                self._pending = next(self._frames)
            except StopIteration:
                self._frames = None
            except (ReplayFormatError, OSError) as exc:  # the file changed since it was checked
                self._frames = None
                self._refuse(exc)
        return self._pending

    def _end_of_pass(self) -> None:
        self.passes += 1
        if not self.config.loop or self._pass_first is None:
            self.finished = True
            self.log.info("replay of %s finished: %d frames in %d pass(es)", self.path, self.frames_emitted,
                          self.passes)
            self.notify_finished()
            return
        # The next pass continues after this one: shifted by its span plus one frame step.
        self._offset += self._pass_last - self._pass_first + (self._pass_step or 1_000_000_000)  # type: ignore[operator]
        self._open_pass()

    def _due(self, recorded_ns: int) -> float:
        assert self._first_t is not None
        return self._wall_start + (recorded_ns - self._first_t) / 1e9 / self.config.pace()

    def poll(self) -> Batch | None:
        if not self._started:
            self.on_start()  # polled directly, without start()
        pace = self.config.pace()
        while not self.finished and not self.stopping.is_set():
            frame = self._next_frame()
            if frame is None:
                if not self.finished:
                    self._end_of_pass()  # a looping replay starts its next pass at the next poll
                break
            t = frame.time_unix_nano + self._offset
            if self._first_t is None:
                if self.config.rebase_time:
                    self._offset = self.wall_ns() - frame.time_unix_nano
                    t = frame.time_unix_nano + self._offset
                self._first_t, self._wall_start = t, self.clock()
            if pace > 0 and self._due(max(t, self._last_emitted_t())) > self.clock():
                break
            self._emit(frame)
        return None

    def _last_emitted_t(self) -> int:
        return self._pass_last + self._offset if self._pass_last is not None else 0

    def _emit(self, frame: Frame) -> None:
        self._pending = None
        if self._pass_last is not None and frame.time_unix_nano > self._pass_last:
            self._pass_step = frame.time_unix_nano - self._pass_last
        if self._pass_first is None:
            self._pass_first = frame.time_unix_nano
        self._pass_last = max(frame.time_unix_nano, self._pass_last or frame.time_unix_nano)
        self.consumer(shift_batch(frame.batch, self._offset))
        self.frames_emitted += 1

    def interval(self) -> float:
        if self.finished:
            return 1.0
        pace = self.config.pace()
        frame = self._pending
        if pace == 0 or frame is None or self._first_t is None:
            return 0.01
        wait = self._due(frame.time_unix_nano + self._offset) - self.clock()
        return min(max(wait, 0.005), 0.5)


FACTORY = Factory("replay", ReplayReceiverConfig, ReplayReceiver,
                  "replays dcgmi dmon, CSV or OTLP JSON recordings, in real time or faster", output="samples")
