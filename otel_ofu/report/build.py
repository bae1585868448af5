"""Per-job answers from recordings (``otel-ofu report``, :mod:`.command`).

Inputs (:mod:`.inputs` chooses them, :mod:`otel_ofu.otlp.files` reads them) are the file
exporter's OTLP JSON lines, compressed or rotated, and ``dcgmi dmon`` / CSV recordings, which
are read through the replay receiver's parsers and the ``ofu`` processor. Every file's points
are gathered, then replayed in data-time order, so concatenated or interleaved recordings
(``cat a.jsonl b.jsonl``, one file per node) give the same jobs as one recording made in
order. The points are held compactly (about 30 bytes per point of the metrics the report
reads) while they are sorted.

From a recording made behind the ``jobs`` processor, the table is that processor's own job
series and end events (:mod:`.series`: a few numbers per job and minute, the GPU points only
for the per-GPU table and the GPU time of no job). Otherwise, with ``--recompute`` or for the
plots' timelines, it is recomputed from the per-GPU points (``gpu.ofu``, ``gpu.flops.achieved``,
the reported-MFU metric) with the same :class:`otel_ofu.jobs.book.JobBook` the ``jobs``
processor runs, so a recording made without that processor still gets a full report.
Findings come from the recording's own ``ofu.finding.*`` events when the jobs processor
ran (what operators were told at the time, with the thresholds in force then), and are
recomputed from the points otherwise, or always with ``--recompute``.

Metric lines are decoded from OTLP/JSON by simdjson's lazy proxies (``json`` where it declines a
line, :mod:`.points`), keeping only the metrics the report needs: several times faster than
``json``, itself an order of magnitude faster than the protobuf JSON parser on large files. Log
lines (few) go through :mod:`otel_ofu.otlp`.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from otel_ofu.core import specs, tiles
from otel_ofu.core.exact import to_float
from otel_ofu.core.loss import LOSS_PARTS, UNACCOUNTED, UNALLOCATED, USEFUL, LossTotals
from otel_ofu.core.model import (
    GPU_INDEX,
    HW_ID,
    HW_MODEL,
    JOB_ID,
    Attributes,
    Event,
    GpuKey,
    MetricPoint,
    gpu_key,
    gpu_label,
    job_id_of,
)
from otel_ofu.jobs.aggregate import JobTotals, WeightedHistogram, segment_start, window_label
from otel_ofu.jobs.book import ENERGY_METRIC, FLOPS_METRIC, OFU_METRIC, SHARE_METRIC, JobBook, Update
from otel_ofu.jobs.config import JOULES_PER_KWH, CarbonConfig, JobsConfig
from otel_ofu.jobs.cost import money, money_gained, total
from otel_ofu.jobs.findings import MFU_GAP, NO_MFU_REPORT, STALLED, cause_of
from otel_ofu.jobs.loss import LOSS_METRIC, growth_text
from otel_ofu.jobs.stall import LINK_METRIC
from otel_ofu.jobs.tracker import JobSummary
from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp import files as recorded
from otel_ofu.report import series
from otel_ofu.report.inputs import InputError, InputFile, data_time_order, expand_paths
from otel_ofu.report.loss import breakdown_lines, largest_record, lost_gpu_hours, recommendations
from otel_ofu.report.points import PointFilter, PointStore, json_attributes

log = logging.getLogger("otel_ofu.report")

TRUTH_METRIC = "sim.gpu.mfu.true"
# The CSV's lost_gpu_hours_<part> columns: every loss part a job can have (empty where it has none)
CSV_LOSS_PARTS = (*LOSS_PARTS, UNACCOUNTED)
PROGRESS_MIN_BYTES = 5_000_000  # below this a progress bar is noise
PARALLEL_MIN_BYTES = 20_000_000  # below this, starting processes costs more than reading the files here
# inputs[].format of a Prometheus-compatible backend (``report --prometheus``, report/backend.py)
BACKEND_FORMAT = "prometheus"
_FINDING_META = {"id", "kind", "cause", "since_unix_nano", "opened_unix_nano", "duration_s"}


class ReportError(Exception):
    """A problem with the input, located (file:line) where it has a line."""


# --- reading ----------------------------------------------------------------------------------

def metric_points(doc: dict[str, Any], names: set[str]) -> Iterator[MetricPoint]:
    """The gauge and sum points of the metrics in ``names`` from one OTLP/JSON metrics request.

    Decodes the same mapping as :func:`otel_ofu.otlp.from_request` (lowerCamelCase keys, 64-bit
    integers as strings) but skips every other metric without building it.
    """
    for rm in doc.get("resourceMetrics") or ():
        resource: Attributes | None = None
        for sm in rm.get("scopeMetrics") or ():
            for metric in sm.get("metrics") or ():
                if metric.get("name") not in names:
                    continue
                if "gauge" in metric:
                    data, monotonic = metric["gauge"], False
                elif "sum" in metric:
                    data = metric["sum"]
                    monotonic = bool(data.get("isMonotonic", False))
                else:
                    continue
                if resource is None:
                    resource = json_attributes((rm.get("resource") or {}).get("attributes"))
                for dp in data.get("dataPoints") or ():
                    value = float(dp["asDouble"]) if "asDouble" in dp else float(int(dp.get("asInt", 0)))
                    t, start = int(dp.get("timeUnixNano", 0)), int(dp.get("startTimeUnixNano", 0))
                    # Found by benchmarks/fuzz.py (overflows, a hang): times as the report stores them
                    # (int64 ns), values finite.
                    if not 0 < t < 1 << 63 or not 0 <= start < 1 << 63:
                        raise ValueError(f"timeUnixNano {t} / startTimeUnixNano {start} out of range "
                                         "(0 means missing)")
                    if not math.isfinite(value):
                        raise ValueError(f"{metric['name']} value {value} is not a number")
                    yield MetricPoint(metric["name"], value, t, resource, json_attributes(dp.get("attributes")),
                                      metric.get("unit") or "1", monotonic, start)


def dict_walk_store(path: Path | str, names: set[str]) -> PointStore:
    """A JSON recording's points as the report read them before its columnar readers (issue 33): ``json.loads``,
    then a :class:`MetricPoint` per point (:func:`metric_points`), stored. What those readers are tested against
    (tests/test_report_speed.py) and timed against (benchmarks/report_scale.py)."""
    store = PointStore(sorted(names))
    for _, line in recorded.read_json_lines(path):
        doc = json.loads(line)
        if "resourceMetrics" in doc:
            for point in metric_points(doc, names):
                store.add(point)
    return store


def parse_line(source: InputFile, number: int, line: str, skip_malformed: bool = False) -> dict[str, Any] | None:
    """One OTLP JSON line as an object; None for a line to skip (blank, or skipped as malformed).

    A crash's partly written last line never gets here (:func:`otel_ofu.otlp.files.skip_partial_last_line`).
    """
    if not line.strip():
        return None
    try:
        doc = json.loads(line)
    except ValueError as exc:
        if skip_malformed:
            source.notes.append(f"line {number}: not JSON: skipped")
            log.warning("%s:%d: not a JSON line: skipped", source.path, number)
            return None
        raise ReportError(f"{source.path}:{number}: not a JSON line: {exc} (--skip-malformed reads on)") from None
    if not isinstance(doc, dict) or not ({"resourceMetrics", "resourceLogs"} & set(doc)):
        raise ReportError(f"{source.path}:{number}: not an OTLP export request (expected a JSON object with "
                          "resourceMetrics or resourceLogs, as the file exporter writes)")
    return doc


def _events(path: Path | str, number: int, doc: dict[str, Any]) -> list[Event]:
    """A logs line's events: read from the dict where every attribute is a scalar (what the jobs processor
    writes), else (and for anything malformed) through the protobuf JSON parser and its errors."""
    events = events_from_json(doc)
    if events is not None:
        return events
    try:
        request = otlp.from_json_line(json.dumps(doc, separators=(",", ":")))
        return list(otlp.events_from_request(request))  # type: ignore[arg-type]
    except ValueError as exc:
        raise ReportError(f"{path}:{number}: malformed OTLP logs: {exc}") from None


_SCALARS = {"stringValue": str, "boolValue": bool, "intValue": None, "doubleValue": None}


def _scalar_attributes(key_values: Any) -> Attributes | None:
    """An OTLP/JSON attribute list of scalar values as sorted Attributes, as ``attributes_of`` decodes it from
    protobuf; None for anything else (a list or map value, a value of the wrong type, a key that repeats)."""
    out: dict[str, Any] = {}
    for kv in key_values or ():
        key, value = kv.get("key"), kv.get("value")
        if not isinstance(key, str) or key in out or not isinstance(value, dict) or len(value) != 1:
            return None
        ((kind, raw),) = value.items()
        if kind not in _SCALARS or (_SCALARS[kind] is not None and type(raw) is not _SCALARS[kind]):
            return None
        if kind == "intValue":
            if type(raw) not in (int, str):
                return None
            raw = int(raw)
        elif kind == "doubleValue":
            if type(raw) not in (int, float):
                return None  # "NaN" and the like: the protobuf parser's business
            raw = float(raw)
        out[key] = raw
    return tuple(sorted(out.items()))


def events_from_json(doc: dict[str, Any]) -> list[Event] | None:
    """:func:`otel_ofu.otlp.codec.events_from_request` of an OTLP/JSON logs request read from its dict, without the
    protobuf JSON parser (pure Python, the most of a JSON recording's reading after the metrics); None where the
    request is anything but plain (the caller parses it the slow way, which also names what is wrong)."""
    out: list[Event] = []
    try:
        for rl in doc.get("resourceLogs") or ():
            resource = _scalar_attributes((rl.get("resource") or {}).get("attributes"))
            if resource is None:
                return None
            for sl in rl.get("scopeLogs") or ():
                for record in sl.get("logRecords") or ():
                    attributes = _scalar_attributes(record.get("attributes"))
                    body = record.get("body") or {}
                    severity = record.get("severityText", "")
                    t = int(record.get("timeUnixNano", 0))
                    if attributes is None or set(body) - {"stringValue"} or not isinstance(severity, str) or \
                            not 0 <= t < 1 << 64:
                        return None
                    values = dict(attributes)
                    name = str(values.pop("event.name", ""))
                    out.append(Event(name, t, resource, tuple(sorted(values.items())), str(body.get("stringValue", "")),
                                     severity or "INFO"))
    except (AttributeError, TypeError, ValueError):
        return None
    return out


@dataclass
class ReadOptions:
    """How to read dmon and CSV recordings (they lack what OTLP carries): as the replay receiver's settings."""

    model: str = ""
    host_name: str = ""
    start_time: str | None = None
    interval: float | None = None
    skip_malformed: bool = False
    processes: int = 0  # files read at once (0: the CPUs this process may use, default_processes())


def _read_otlp(source: InputFile, items: Iterable[tuple[int, str | bytes]], names: set[str], store: PointStore,
               events: list[Event], options: ReadOptions) -> None:
    """OTLP requests, JSON lines or protobuf records, into the store's columns (:mod:`.points`)."""
    for number, item in recorded.skip_partial_last_line(items, source):
        if isinstance(item, bytes):
            where = f"{source.path}: record {number}"
            try:
                request = otlp.from_proto_record(item)
            except ValueError as exc:
                if options.skip_malformed:
                    source.notes.append(f"record {number}: {exc}: skipped")
                    log.warning("%s: %s: skipped", where, exc)
                    continue
                raise ReportError(f"{where}: {exc} (--skip-malformed reads on)") from None
            source.lines += 1
            if isinstance(request, otlp.ExportLogsServiceRequest):
                events += otlp.events_from_request(request)
                continue
            try:
                span = store.add_proto_metrics(request, names)
            except ValueError as exc:
                raise ReportError(f"{where}: malformed OTLP metrics: {exc!r}") from None
        else:
            read, span = store.add_json_line(item, names)  # simdjson: metric lines it reads as the dict walk would
            if read:
                source.lines += 1
            else:  # logs, and whatever the simdjson walk leaves: json.loads, the dict walk and their errors
                doc = parse_line(source, number, item, options.skip_malformed)
                if doc is None:
                    continue
                source.lines += 1
                if "resourceLogs" in doc:
                    events += _events(source.path, number, doc)
                    continue
                try:
                    span = store.add_json_metrics(doc, names)
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    raise ReportError(f"{source.path}:{number}: malformed OTLP metrics: {exc!r}") from None
        if span is not None:
            source.seen(span[0] / 1e9)
            source.seen(span[1] / 1e9)


def _read_replayable(source: InputFile, lines: Iterator[str], store: PointStore, names: set[str],
                     options: ReadOptions) -> None:
    """dmon or CSV: the replay receiver's parser, then the ofu processor, as a replay pipeline would."""
    from otel_ofu.pipeline.component import Context
    from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
    from otel_ofu.receivers import replay

    ofu = OfuProcessor(OfuProcessorConfig(), Context("report.ofu"))
    start_ns = replay.parse_timestamp(options.start_time) if options.start_time else time.time_ns()
    name = str(source.path)

    def skip(error: replay.ReplayFormatError) -> None:
        source.notes.append(f"line {error.line}: {error.message}: skipped")
        log.warning("skipping %s", error)

    on_error = skip if options.skip_malformed else None
    try:
        if source.format == "dmon":
            frames = replay.parse_dmon(lines, name, start_unix_nano=start_ns, interval_s=options.interval,
                                       model=options.model, host=options.host_name, on_error=on_error)
        else:
            frames = replay.parse_csv(lines, name, interval_s=options.interval, model=options.model,
                                      host=options.host_name, on_error=on_error)
        for frame in frames:
            source.lines += 1
            for p in ofu.process(frame.batch).points:
                if p.name in names:
                    source.seen(p.time_unix_nano / 1e9)
                    store.add(p)
    except replay.ReplayFormatError as exc:
        raise ReportError(f"{exc} (--skip-malformed reads on)") from None


def read_file(path: Path, names: set[str], options: ReadOptions, progress: Any = None,
              point_filter: PointFilter | None = None) -> tuple[InputFile, PointStore, list[Event]]:
    """One recording into a store of its own: its format told by its first bytes and lines (``point_filter``:
    :class:`PointStore`'s)."""
    from otel_ofu.receivers.replay import FORMATS_BY_SUFFIX, sniff_format

    source = InputFile(path)
    store = PointStore(sorted(names), point_filter)
    events: list[Event] = []
    try:
        items = recorded.read_items(source, progress=progress)
        head: list[tuple[int, str | bytes]] = []
        for item in items:  # enough lines to tell the format
            head.append(item)
            if len(head) >= 50 or isinstance(item[1], bytes) or item[1].strip().startswith("{"):
                break
        if head and isinstance(head[-1][1], bytes):
            fmt: str | None = "otlp_proto"
        else:
            fmt, first_text, _ = sniff_format(text for _, text in head)  # type: ignore[misc]
            suffix = recorded.unrotated_name(path.name).lower().removesuffix(".gz").removesuffix(
                ".zst").removesuffix(".zstd")
            fmt = fmt or FORMATS_BY_SUFFIX.get(Path(suffix).suffix)
            if fmt is None:
                if not first_text:
                    source.notes.append("empty")
                    return source, store, events
                raise ReportError(f"{path}: not a recording: expected OTLP JSON lines (the file exporter's output), "
                                  "OTLP protobuf records (the Collector's format: proto), dcgmi dmon output or a CSV "
                                  f"with a timestamp column; starts with {first_text[:60]!r}")
        source.format = fmt
        if fmt in ("otlp_json", "otlp_proto"):
            _read_otlp(source, itertools.chain(head, items), names, store, events, options)
        else:
            text = (line for _, line in itertools.chain(head, items))
            _read_replayable(source, text, store, names, options)  # type: ignore[arg-type]
    except recorded.RecordingError as exc:
        raise ReportError(str(exc)) from None
    return source, store, events


def default_processes() -> int:
    """Processes reading files at once by default: the CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def read_inputs(paths: list[str], names: set[str], options: ReadOptions, point_filter: PointFilter | None = None
                ) -> tuple[list[InputFile], list[str], PointStore, list[Event]]:
    """Every file the paths name, read into one store (in the order named: the replay sorts by data
    time); the files in data-time order. Several files of PARALLEL_MIN_BYTES or more in all are read
    by up to ``options.processes`` processes at once."""
    try:
        files, notes = expand_paths(paths)
    except InputError as exc:
        raise ReportError(str(exc)) from None
    store: PointStore | None = None
    events: list[Event] = []
    sources = []
    total = sum(p.stat().st_size for p in files)
    from tqdm import tqdm

    bar = tqdm(total=total, unit="B", unit_scale=True, desc="reading", file=sys.stderr, leave=False,
               disable=None if total >= PROGRESS_MIN_BYTES else True)
    processes = min(len(files), options.processes or default_processes())
    if processes > 1 and total >= PARALLEL_MIN_BYTES:
        read = _read_in_processes(files, names, options, processes, bar, point_filter)
    else:
        read = (_read_here(path, names, options, bar, point_filter) for path in files)
    for source, file_store, file_events in read:
        sources.append(source)
        if store is None:
            store = file_store  # the first file's columns are the store's: one large file is not copied
        else:
            store.extend(file_store)
        events += file_events
    bar.close()
    sources.sort(key=data_time_order)
    return sources, notes, store if store is not None else PointStore(sorted(names), point_filter), events


def _read_here(path: Path, names: set[str], options: ReadOptions, bar: Any, point_filter: PointFilter | None
               ) -> tuple[InputFile, PointStore, list[Event]]:
    bar.set_description(f"reading {path.name}")
    return read_file(path, names, options, bar.update, point_filter)


def _read_in_processes(files: list[Path], names: set[str], options: ReadOptions, processes: int, bar: Any,
                       point_filter: PointFilter | None) -> Iterator[tuple[InputFile, PointStore, list[Event]]]:
    """Each file read in a worker process, the results in the order of ``files``; what a worker
    logged is logged here, in that order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        running = [pool.submit(_read_in_worker, path, names, options, point_filter) for path in files]
        for path, future in zip(files, running, strict=True):
            result, records = future.result()
            for record in records:
                logging.getLogger(record.name).handle(record)
            bar.update(path.stat().st_size)
            yield result


def _read_in_worker(path: Path, names: set[str], options: ReadOptions, point_filter: PointFilter | None
                    ) -> tuple[tuple[InputFile, PointStore, list[Event]], list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            record.msg, record.args = record.getMessage(), None
            records.append(record)

    otel_ofu_log = logging.getLogger("otel_ofu")
    otel_ofu_log.handlers[:] = [Keep()]  # this process is the worker's own: what it says is the parent's to say
    otel_ofu_log.propagate = False
    return read_file(path, names, options, point_filter=point_filter), records


# --- building the report ----------------------------------------------------------------------

@dataclass
class JobReport:
    summary: JobSummary
    timeline: list[tuple[float, float, float | None, float | None]] = field(default_factory=list)  # t, ofu, mfu, base
    truth: list[tuple[float, float]] = field(default_factory=list)  # t, true MFU (simulator)
    findings: list[dict[str, Any]] = field(default_factory=list)
    carbon: CarbonConfig = field(default_factory=CarbonConfig)  # the jobs settings' carbon intensity: emissions


@dataclass
class GpuReport:
    """One GPU (or MIG instance) over the recording: host + UUID or index + MIG instance."""

    key: GpuKey
    model: str = ""
    index: str = ""
    uuid: str = ""
    totals: JobTotals = field(default_factory=JobTotals)
    histogram: WeightedHistogram = field(default_factory=WeightedHistogram)
    jobs: set[str] = field(default_factory=set)
    last: tuple[float, float] | None = None  # last window end, its length

    @property
    def label(self) -> str:
        """``host GPU 3`` (``MIG 2``): the index people know; the UUID is in the JSON."""
        host, ident, mig = self.key
        if self.index:
            return " ".join(x for x in (host, f"GPU {self.index}", f"MIG {mig}" if mig else "") if x)
        return gpu_label(self.key)


@dataclass
class Report:
    source: str
    lines: int
    start: float | None
    end: float | None
    findings_source: str  # recorded | recomputed
    jobs: list[JobReport]
    book: JobBook
    inputs: list[InputFile] = field(default_factory=list)
    gpus: list[GpuReport] = field(default_factory=list)
    recomputed_findings: int = 0  # what the points give with the settings in force (to explain a difference)
    config_source: str = "default settings"
    notes: list[str] = field(default_factory=list)
    recorded_events: bool = False  # the recording holds the jobs processor's finding/job events
    gpus_seen: int | None = None  # GPUs counted without a per-GPU table (the backend report); None: len(gpus)
    lines_word: str = "lines"  # what ``lines`` counts (the backend report: queries)
    jobs_source: str = "recomputed"  # series (the jobs processor's, report/series.py) | recomputed | backend

    @property
    def gpu_count(self) -> int:
        return len(self.gpus) if self.gpus_seen is None else self.gpus_seen


def _iso(seconds: float | None) -> str | None:
    if seconds is None or not math.isfinite(seconds):
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats become null (a ratio against 0 is not a number)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _finding_record(kind: str, cause: str, fid: str, opened: float, since: float, closed: float | None,
                    numbers: dict[str, Any], close_numbers: dict[str, Any], job_start: float) -> dict[str, Any]:
    explained = cause_of(cause)
    return {"kind": kind, "cause": cause, "meaning": explained.meaning, "action": explained.action, "id": fid,
            "time": _iso(opened), "time_unix_nano": int(round(opened * 1e9)),
            "minutes_into_job": round((opened - job_start) / 60.0, 2), "since": _iso(since), "closed": _iso(closed),
            "numbers": numbers, "close_numbers": close_numbers}


def _recomputed_findings(summary: JobSummary) -> list[dict[str, Any]]:
    return [_finding_record(f.kind, f.cause, f.id, f.opened_at, f.since, f.closed_at, dict(f.numbers),
                            dict(f.close_numbers), summary.start) for f in summary.findings]


def _recorded_findings(events: list[Event]) -> dict[str, list[dict[str, Any]]]:
    """Finding records by job id, from ofu.finding.open / ofu.finding.close events paired by id."""
    by_id: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.name not in ("ofu.finding.open", "ofu.finding.close"):
            continue
        a = dict(event.attributes)
        fid = str(a.get("ofu.finding.id", ""))
        numbers = {k.removeprefix("ofu.finding."): v for k, v in a.items()
                   if k.startswith("ofu.finding.") and k.removeprefix("ofu.finding.") not in _FINDING_META}
        record = by_id.setdefault(fid, {"job": job_id_of(event) or "",
                                        "kind": a.get("ofu.finding.kind"), "cause": a.get("ofu.finding.cause"),
                                        "opened": None, "since": None, "closed": None, "numbers": {},
                                        "close_numbers": {}})
        if event.name == "ofu.finding.open":
            record["opened"] = event.time_unix_nano / 1e9
            record["since"] = int(a.get("ofu.finding.since_unix_nano", event.time_unix_nano)) / 1e9
            record["numbers"] = numbers
        else:
            record["closed"] = event.time_unix_nano / 1e9
            record["close_numbers"] = numbers
            if record["opened"] is None and "ofu.finding.opened_unix_nano" in a:
                record["opened"] = int(a["ofu.finding.opened_unix_nano"]) / 1e9
                record["since"] = int(a.get("ofu.finding.since_unix_nano", 0)) / 1e9
    out: dict[str, list[dict[str, Any]]] = {}
    for fid, r in by_id.items():
        if r["opened"] is not None:
            out.setdefault(r["job"], []).append(r | {"id": fid})
    return out


def _gpu_window(gpus: dict[GpuKey, GpuReport], point: MetricPoint, config: JobsConfig) -> float | None:
    """Per-GPU totals of a gpu.ofu point (:func:`gpu_window`)."""
    return gpu_window(gpus, gpu_key(point.resource), point.resource, point.time_unix_nano,
                      point.start_time_unix_nano, point.value, job_id_of(point), config)


def gpu_window(gpus: dict[GpuKey, GpuReport], key: GpuKey, resource: Attributes, t_ns: int, start_ns: int,
               value: float, job: str | None, config: JobsConfig) -> float | None:
    """Per-GPU totals, with the jobs' window rule (duplicates and pod copies of a GPU count once): the window of
    GPU ``key`` ending at ``t_ns`` (``start_ns``: where its first one began, 0 when not known); returns its start
    (None: not counted)."""
    gpu = gpus.get(key)
    if gpu is None:
        values = dict(resource)
        gpu = gpus[key] = GpuReport(key, str(values.get(HW_MODEL, "")), str(values.get(GPU_INDEX, "") or ""),
                                    str(values.get(HW_ID, "") or ""))
    t = t_ns / 1e9
    first = None
    if gpu.last is None and 0 < start_ns < t_ns:
        first = t - start_ns / 1e9
    start = segment_start(t, gpu.last[0] if gpu.last else None, gpu.last[1] if gpu.last else first,
                          float(config.default_interval), float(config.max_gap))
    if start is None or not math.isfinite(value):
        return None
    gpu.last = (t, t - start)
    gpu.totals.add(t - start, value)
    gpu.histogram.add(value, t - start)
    if job is not None and job not in config.ignore_jobs:
        gpu.jobs.add(job)
    return start


def build_report(paths: str | Path | list[str], config: JobsConfig | None = None, recompute: bool = False,
                 options: ReadOptions | None = None, config_source: str = "default settings",
                 timelines: bool = False) -> Report:
    """Read every input; the jobs from the jobs processor's series and events where the recording holds them
    (:mod:`.series`), else (or with ``recompute``, or ``timelines`` for plots) by replaying the points in time
    order through a JobBook; collect jobs, GPUs, findings."""
    if isinstance(paths, (str, Path)):
        paths = [str(paths)]
    config = config or JobsConfig()
    options = options or ReadOptions()
    why = "--recompute" if recompute else "the plots' timelines" if timelines else f"no {series.PRESENCE} series"
    if not recompute and not timelines and holds_job_series(list(paths)):
        read = read_inputs(list(paths), series.names(), options, series.point_filter(config))
        _check_not_empty(paths, *read)
        if series.has_job_series(read[2]):
            report = _series_report(*read, config, config_source)
            if report is not None:
                return report
            why = "job counters that fall"
    log.info("replaying the recording's GPU points through the jobs logic (%s)", why)
    names = {OFU_METRIC, FLOPS_METRIC, SHARE_METRIC, LOSS_METRIC, ENERGY_METRIC, LINK_METRIC,
             config.mfu_metric,
             *config.tflops_metrics, TRUTH_METRIC}
    return _replay_report(*read_inputs(list(paths), names, options), paths, config, recompute, options,
                          config_source)


def holds_job_series(paths: list[str]) -> bool:
    """Whether any file the paths name holds the jobs processor's series: a look at the raw lines and records
    (no parse), stopping at the first, so that a recording without them is not parsed twice."""
    try:
        files, _ = expand_paths(paths)
    except InputError:
        return False  # read_inputs says what is wrong
    text, raw = series.PRESENCE, series.PRESENCE.encode()
    for path in files:
        source = recorded.RecordedFile(path, on_partial=lambda _: None)
        try:
            for _, item in recorded.read_items(source):
                if (raw if isinstance(item, bytes) else text) in item:
                    return True
        except (recorded.RecordingError, OSError, ValueError):
            continue  # read_inputs says what is wrong
    return False


def _check_not_empty(paths: list[str], sources: list[InputFile], notes: list[str], store: PointStore,
                     events: list[Event]) -> None:
    if sum(s.lines for s in sources) == 0 and not events:
        raise ReportError(f"{', '.join(map(str, paths))}: empty: no OTLP JSON lines or recorded frames")


def _label(sources: list[InputFile]) -> str:
    return str(sources[0].path) if len(sources) == 1 else f"{len(sources)} files"


def _no_gpus_error(label: str, sources: list[InputFile], options: ReadOptions | None) -> ReportError:
    replayed = [s for s in sources if s.format in ("dmon", "csv")]
    if replayed and options is not None and not options.model:
        return ReportError(f"{label}: no {OFU_METRIC} from the {replayed[0].format} recording: it names no GPU "
                           "model, and OFU needs the model's reference clock. Give it: --model 'NVIDIA H100 "
                           "80GB HBM3' (docs/gpus.md lists the models)")
    return ReportError(f"{label}: no {OFU_METRIC} points: record the output of the ofu processor (the file "
                       "exporter after ofu), or give a dmon/CSV recording, which is computed here")


def _job_findings(summary: JobSummary, recorded_findings: dict[str, list[dict[str, Any]]], resolution: float,
                  config: JobsConfig) -> list[dict[str, Any]]:
    """A job's recorded findings: those of its id opened within its life."""
    return [_finding_record(r["kind"], r["cause"], r["id"], r["opened"], r["since"], r["closed"], r["numbers"],
                            r["close_numbers"], summary.start)
            for r in recorded_findings.get(summary.job_id, [])
            if summary.start - resolution <= r["opened"] <= summary.end + float(config.job_timeout)]


def _series_report(sources: list[InputFile], notes: list[str], store: PointStore, events: list[Event],
                   config: JobsConfig, config_source: str) -> Report | None:
    """The report from the jobs processor's series and events in the recording (:mod:`.series`); the GPU points
    for the per-GPU table and the GPU time of no job. None where a job's counters fall (the caller replays)."""
    label = _label(sources)
    gpus: dict[GpuKey, GpuReport] = {}
    job_series = series.read_series(store, events)
    fell = sorted({str(dict(j.resource).get(JOB_ID, "")) for j in job_series if j.fell})
    if fell:
        log.warning("the job counters of %d job(s) fall in the recording (%s%s): the series of several jobs "
                    "instances read together (a job that moved in a jobs tier), or an instance restarted without its "
                    "storage; recomputing every job from the GPU points instead", len(fell), ", ".join(fell[:3]),
                    " ..." if len(fell) > 3 else "")
        return None
    passed = series.gpu_pass(store, config, lambda *window: gpu_window(gpus, *window, config), series.job_ends(events))
    if not gpus:
        raise _no_gpus_error(label, sources, None)
    resolution = float(config.resolution)
    made = [(j, series.summary_of(j, passed, config, resolution)) for j in job_series]
    jobs_made = [(j, s) for j, s in made if s is not None]
    summaries = [s for _, s in jobs_made]
    short = [j for j in job_series if j.short]
    if short:
        notes.append(f"{len(short)} job(s) ended with counters short of their ofu.job.end totals (recorded by an "
                     "otel-ofu whose jobs processor sent no final values at a job's end): their numbers miss up to "
                     "their last minute; --recompute replays the GPU points instead")
    recorded_findings = _recorded_findings(events)
    jobs = [JobReport(s, findings=sorted(_job_findings(s, recorded_findings, resolution, config),
                                         key=lambda f: f["time_unix_nano"]), carbon=config.carbon)
            for s in summaries]
    jobs.sort(key=lambda j: (-j.summary.totals.wasted_gpu_hours, j.summary.job_id))
    book = series.fleet_book(store, jobs_made, passed, config)
    first, last = store.time_span()
    gpu_list = sorted(gpus.values(), key=lambda g: (g.key[0], _index_order(g.key[1]), g.key[2]))
    return Report(label, sum(s.lines for s in sources), first, last, "recorded", jobs, book, sources, gpu_list, 0,
                  config_source, notes, True, jobs_source="series")


def _replay_report(sources: list[InputFile], notes: list[str], store: PointStore, events: list[Event],
                   paths: list[str], config: JobsConfig, recompute: bool, options: ReadOptions,
                   config_source: str) -> Report:
    """The report from the GPU points replayed in time order through a JobBook with the report's settings."""
    _check_not_empty(paths, sources, notes, store, events)
    book = JobBook(config, history=True)
    label = _label(sources)
    lines = sum(s.lines for s in sources)

    timelines: dict[str, list[tuple[float, float, float | None, float | None]]] = {}
    truth: dict[str, dict[float, list[float]]] = {}
    gpus: dict[GpuKey, GpuReport] = {}
    resolution = float(config.resolution)

    def collect(update: Update) -> None:
        for tracker, s in update.snapshots:
            timelines.setdefault(tracker.job_id, []).append((s.time, s.bin_ofu, s.bin_mfu, s.baseline))

    first, last = math.inf, -math.inf
    for batch in store.in_time_order(float(config.max_gap)):
        t = batch[0].time_unix_nano / 1e9
        first, last = min(first, t), max(last, t)
        for p in batch:
            if p.name == OFU_METRIC:
                _gpu_window(gpus, p, config)
            elif p.name == TRUTH_METRIC:
                job = job_id_of(p)
                if job is not None:
                    bin_end = (math.floor(t / resolution - 1e-9) + 1) * resolution
                    truth.setdefault(job, {}).setdefault(bin_end, []).append(p.value)
        collect(book.observe(batch))
    collect(book.close_all("end_of_recording"))
    if not gpus:
        raise _no_gpus_error(label, sources, options)

    recorded = any(e.name.startswith(("ofu.finding.", "ofu.job.")) for e in events)
    source = "recorded" if recorded and not recompute else "recomputed"
    recorded_findings = _recorded_findings(events) if source == "recorded" else {}
    jobs = []
    for summary in book.ended:
        if source == "recorded":
            findings = _job_findings(summary, recorded_findings, resolution, config)
        else:
            findings = _recomputed_findings(summary)
        life = (summary.start, summary.end + resolution)
        in_life = [row for row in timelines.get(summary.job_id, []) if life[0] <= row[0] <= life[1]]
        job_truth = sorted((t, sum(v) / len(v)) for t, v in truth.get(summary.job_id, {}).items()
                           if summary.start <= t <= summary.end + resolution)
        jobs.append(JobReport(summary, in_life, job_truth, sorted(findings, key=lambda f: f["time_unix_nano"]),
                              config.carbon))
    jobs.sort(key=lambda j: (-j.summary.totals.wasted_gpu_hours, j.summary.job_id))
    gpu_list = sorted(gpus.values(), key=lambda g: (g.key[0], _index_order(g.key[1]), g.key[2]))
    return Report(label, lines, first if first < math.inf else None, last if last > -math.inf else None,
                  source, jobs, book, sources, gpu_list, sum(len(s.findings) for s in book.ended), config_source,
                  notes, recorded)


def _index_order(ident: str) -> tuple[int, str]:
    return (int(ident[1:]), "") if ident.startswith("#") and ident[1:].isdecimal() else (1 << 30, ident)


# --- output -----------------------------------------------------------------------------------

def stalled_gpu_hours(findings: list[dict[str, Any]]) -> float | None:
    """The GPU-hours a job's stalled findings held (each at its close, or so far when still open); None without one."""
    hours = [float(f["close_numbers"].get("stalled_gpu_hours", f["numbers"].get("stalled_gpu_hours", 0.0)))
             for f in findings if f["kind"] == STALLED]
    return sum(hours) if hours else None


def job_record(job: JobReport) -> dict[str, Any]:
    s, t = job.summary, job.summary.totals
    return {
        "job_id": s.job_id, "start": _iso(s.start), "end": _iso(s.end), "end_reason": s.reason,
        "duration_hours": (s.end - s.start) / 3600.0, "gpus": s.gpus, "peak_gpus": s.peak_gpus,
        "gpu_hours": t.gpu_hours, "ofu_mean": t.ofu_mean, "ofu_p10": s.ofu_p10, "ofu_p50": s.ofu_p50,
        "ofu_p90": s.ofu_p90, "flops": t.flop if t.flops_known else None,
        "flops_per_gpu_s": t.flop / t.flop_gpu_seconds if t.flops_known else None,
        "wasted_gpu_hours": t.wasted_gpu_hours, "gained_gpu_hours": t.gained_gpu_hours,
        "mfu_reported_mean": s.mfu_reported,
        "energy_joules": t.energy, "joules_per_useful_pflop": t.energy_per_useful_pflop,
        "emissions_grams": None if t.energy is None else job.carbon.grams(t.energy),
        "precisions_gpu_hours": {p: sec / 3600.0 for p, sec in s.precisions.items()},
        "loss": s.loss.shares(),
        "loss_gpu_hours": lost_gpu_hours(s.loss),
        "gain_gpu_hours": s.loss.gained_gpu_hours(),
        "largest_loss": largest_record(s.loss),
        **cost_record(s.cost),
        "findings": job.findings,
        "stalled_gpu_hours": stalled_gpu_hours(job.findings),
    }


def cost_record(cost: LossTotals | None) -> dict[str, Any]:
    """A job's (or the fleet's) cost in the report's JSON: all of it, what its loss parts lost, by part and gained
    (jobs.cost); nulls without a price."""
    if cost is None:
        return {"cost": None, "wasted_cost": None, "cost_by_part": None, "gained_cost": None}
    by_part = money(cost)
    return {"cost": total(cost), "wasted_cost": math.fsum(v for part, v in by_part.items() if part != USEFUL),
            "cost_by_part": by_part, "gained_cost": math.fsum(money_gained(cost).values())}


def gpu_record(gpu: GpuReport) -> dict[str, Any]:
    host, _, mig = gpu.key
    return {"host": host, "gpu": gpu.index or None, "uuid": gpu.uuid or None, "mig_instance": mig or None,
            "model": gpu.model,
            "gpu_hours": gpu.totals.gpu_hours, "ofu_mean": gpu.totals.ofu_mean, "ofu_p50": gpu.histogram.quantile(0.5),
            "jobs": sorted(gpu.jobs)}


def input_record(source: InputFile) -> dict[str, Any]:
    return {"path": str(source.path), "format": source.format or None, "compression": source.compression or None,
            "lines": source.lines, "start": _iso(source.first), "end": _iso(source.last),
            "partial_tail_skipped": source.partial_tail, "notes": source.notes}


def report_json(report: Report) -> dict[str, Any]:
    book = report.book
    attributed = sum(j.summary.totals.gpu_seconds for j in report.jobs)
    ofu_seconds = sum(j.summary.totals.ofu_gpu_seconds for j in report.jobs)
    shown = sum(len(j.findings) for j in report.jobs)
    recorded_ = report.findings_source == "recorded"
    return _clean({
        "source": report.source, "lines": report.lines, "start": _iso(report.start), "end": _iso(report.end),
        "inputs": [input_record(s) for s in report.inputs],
        "jobs_source": report.jobs_source,
        "findings_source": report.findings_source,
        "findings_count": shown,
        "findings_recomputed_count": report.recomputed_findings if recorded_ and report.jobs_source != "series"
        else None,
        "findings_note": findings_note(report) or None,
        "fleet": {"gpus": report.gpu_count, "jobs": len(report.jobs),
                  "gpu_hours": (attributed + book.unattributed.gpu_seconds) / 3600.0,
                  "job_gpu_hours": attributed / 3600.0,
                  "unattributed_gpu_hours": book.unattributed.gpu_hours,
                  "ofu_mean": _ratio(ofu_seconds + book.unattributed.ofu_gpu_seconds,
                                     attributed + book.unattributed.gpu_seconds),
                  "job_ofu_mean": ofu_seconds / attributed if attributed else None,
                  "wasted_gpu_hours": sum(j.summary.totals.wasted_gpu_hours for j in report.jobs),
                  "gained_gpu_hours": sum(j.summary.totals.gained_gpu_hours for j in report.jobs),
                  "loss_gpu_hours": book.fleet_loss.gpu_hours(),
                  "gain_gpu_hours": book.fleet_loss.gained_gpu_hours(),
                  "currency": book.config.cost.currency if _priced(report) or book.config.cost.enabled else None,
                  **cost_record(_fleet_cost(report)),
                  "unpriced_gpu_hours": {key: to_float(count) / 3600.0 for key, count in book.unpriced.items()},
                  "stalled_gpu_hours": sum(stalled_gpu_hours(j.findings) or 0.0 for j in report.jobs),
                  **_fleet_energy(book)},
        "recommendations": recommendations(_job_losses(report), book.fleet_loss,
                                           fleet_factors=_fleet_tile_factors(report), costs=_job_costs(report),
                                           fleet_cost=_fleet_cost(report)),
        "jobs": [job_record(j) for j in report.jobs],
        "gpus": [gpu_record(g) for g in report.gpus],
    })


def _fleet_energy(book: JobBook) -> dict[str, Any]:
    """The report's fleet energy fields: null where no window's energy is known."""
    energy = book.fleet_energy
    by_use = energy.by_use() if energy.known else {}
    return {"energy_joules": sum(by_use.values()) if by_use else None,
            "unattributed_energy_joules": by_use.get("unallocated"),
            "joules_per_useful_pflop": energy.per_useful_pflop}


def _job_losses(report: Report) -> list[tuple[str, LossTotals]]:
    """Each job's life account, by job id: what the breakdown and the recommendations read."""
    return [(j.summary.job_id, j.summary.loss) for j in report.jobs]


def _job_costs(report: Report) -> list[LossTotals | None]:
    """Each job's cost account (jobs.cost), in the order of _job_losses; None for a job with no price."""
    return [j.summary.cost for j in report.jobs]


def _fleet_cost(report: Report) -> LossTotals | None:
    """The fleet's cost account; None when no GPU had a price."""
    cost = report.book.fleet_cost
    return cost if cost.exact_seconds > 0 else None


def _fleet_tile_factors(report: Report) -> dict[str, float]:
    """Job -> the built-in tile factor (core/tiles.py) of its GPUs' models at its precisions, where that is one
    number: a padding part made with it is the fleet's estimate for a typical job, not the job's own."""
    models: dict[str, set[str]] = {}
    for gpu in report.gpus:
        for job in gpu.jobs:
            models.setdefault(job, set()).add(gpu.model)
    out: dict[str, float] = {}
    for job in report.jobs:
        s = job.summary
        factors = set()
        for model in models.get(s.job_id, ()):
            spec = specs.find_spec(model)
            for precision in s.precisions:
                factors.add(tiles.correction_factor(spec.architecture if spec else None,
                                                    specs.normalize_precision(precision)))
        if len(factors) == 1:
            out[s.job_id] = factors.pop()
    return out


# The JSON of ``otel-ofu report --json``, field by field: docs/report.md's list is generated from
# this (``python -m otel_ofu.cli.docs``) and tests/test_report.py checks that a report has exactly
# these fields. ``[]`` marks a list's items; a field whose meaning starts with "mapping" is a
# mapping whose keys vary (not listed).
REPORT_FIELDS: dict[str, str] = {
    "source": "the file read, or how many; with --prometheus the backend's URL (credentials masked)",
    "lines": "lines (or dmon/CSV rows) read, all files together; with --prometheus the queries run",
    "start": "the first data time (ISO 8601, UTC)",
    "end": "the last data time",
    "inputs[].path": "a file read, in data-time order; with --prometheus the backend's URL",
    "inputs[].format": "`otlp_json`, `dmon` or `csv`; null for a file with no data; `prometheus` for the backend "
                       "of --prometheus (its `notes` say which naming its series carry)",
    "inputs[].compression": "`gzip`, `zstd`, ... as recognised by the first bytes; null for none",
    "inputs[].lines": "its lines",
    "inputs[].start": "its first data time",
    "inputs[].end": "its last data time",
    "inputs[].partial_tail_skipped": "true when a crash's partly written last line was skipped",
    "inputs[].notes": "what else was skipped or assumed, as sentences",
    "jobs_source": "where the job table comes from: `series` (the jobs processor's `job.*` series and `ofu.job.end` "
                   "events in the recording: what it computed while it ran, with its settings), `recomputed` (the GPU "
                   "points replayed through the jobs logic with this report's settings: --recompute, --plots, or a "
                   "recording without job series) or `backend` (--prometheus)",
    "findings_source": "where the findings come from: `recorded` (the `ofu.finding.*` events the jobs processor "
                       "logged while it ran), `recomputed` (from the points here, with --recompute or when the "
                       "recording holds no finding events) or `backend` (with --prometheus: the `job_finding` series)",
    "findings_count": "findings listed under `jobs`, all jobs together",
    "findings_recomputed_count": "with `findings_source` `recorded`: how many a recomputation from the same points "
                                 "gives with this report's settings (a difference is explained in `findings_note`); "
                                 "null when the findings are recomputed already",
    "findings_note": "why the recorded and the recomputed findings differ, and how to see the others; null when they "
                     "agree",
    "fleet.gpus": "distinct GPUs (and MIG instances) seen; with --prometheus those that sent `gpu.ofu` in the "
                  "range's last hour",
    "fleet.jobs": "jobs seen",
    "fleet.gpu_hours": "GPU time of every GPU, with a job or not",
    "fleet.job_gpu_hours": "GPU time held by jobs",
    "fleet.unattributed_gpu_hours": "GPU time without a job (idle, or not attributed)",
    "fleet.ofu_mean": "the fleet's OFU: time-weighted over every GPU's time, with a job or not (idle GPUs count, "
                      "at their OFU); what a fleet OFU panel shows, and the figure the table prints first",
    "fleet.job_ofu_mean": "OFU over the GPU time jobs held only: how well the jobs use what they hold",
    "fleet.wasted_gpu_hours": "GPU hours the jobs lost, jobs together: the sum of their loss parts' (a clock gain "
                              "counts apart; docs/method.md#wasted-gpu-hours-and-the-clock-gain)",
    "fleet.gained_gpu_hours": "GPU hours the jobs gained, jobs together: windows whose SM clock boosted above f_ref "
                              "(a negative clock part); job GPU time = their useful + wasted - this",
    "fleet.loss_gpu_hours": "mapping: every GPU-hour by where it went: `useful` (OFU), each loss part of the jobs "
                            "(docs/method.md#where-the-flops-go-the-loss-account), `unknown` (OFU that came "
                            "without its account), `unallocated` (no job); less `gain_gpu_hours` they add up to "
                            "`gpu_hours`",
    "fleet.gain_gpu_hours": "mapping: part -> GPU hours the jobs gained on it (`clock`: the SM clock boosting above "
                            "f_ref); empty without a gain",
    "fleet.currency": "the currency of every cost (the jobs settings' cost.currency); null without prices",
    "fleet.cost": "what every GPU-hour with a price cost (docs/method.md#cost): its parts less `gained_cost`; null "
                  "without a price",
    "fleet.wasted_cost": "what the jobs' loss parts and the GPUs with no job (`unallocated`) lost of it",
    "fleet.cost_by_part": "mapping: part -> money: `useful`, each loss part of the jobs, `unknown`, `unallocated`",
    "fleet.gained_cost": "money the clock boosting above f_ref gained (counted apart, as the GPU-hours are)",
    "fleet.unpriced_gpu_hours": "mapping: what a GPU is priced by (its model, or the cost.by attribute's value; \"\" "
                                "when it has none) -> GPU hours with no price, left out of every cost; empty when all "
                                "had one or no prices are set",
    "fleet.energy_joules": "energy of every GPU window, with a job or not (J); null when no window's is known",
    "fleet.unattributed_energy_joules": "the part of it of GPUs without a job",
    "fleet.joules_per_useful_pflop": "the jobs' J per useful PFLOP, jobs together (the unattributed GPUs' energy is "
                                     "not in it)",
    "fleet.stalled_gpu_hours": "GPU hours the jobs' stalled findings held, jobs together (`jobs[].stalled_gpu_hours`); "
                               "0 without one",
    "recommendations[].job_id": "the job (null: the fleet's GPU time of no job); the biggest losses first (by money "
                                "where prices are set, those with no price after them; else by GPU-hours), at most "
                                "5, none under 0.01 GPU h",
    "recommendations[].cost": "what it lost in money (`fleet.currency`); null without a price",
    "recommendations[].part": "the loss part (`ofu.loss.part`)",
    "recommendations[].cause": "its dominant cause (the clock's event reason, memory-bound or not); null for the "
                               "other parts",
    "recommendations[].gpu_hours": "GPU-hours lost to it",
    "recommendations[].share": "its share of the job's GPU time",
    "recommendations[].advice": "what to look at first, worded by part",
    "recommendations[].estimate": "for `padding`, how it was estimated (the counters cannot see GEMM shapes): "
                                  "`fleet_tile_factor` (the built-in factor for a typical job on its GPUs, the same "
                                  "for every job there: not its own shapes) or `tile_factor` (another factor: the "
                                  "job's own under `tile_correction.jobs`, or a site's fit); null for other parts or "
                                  "when not known",
    "recommendations[].tile_factor": "for `padding`, the tile correction c_tile its padding was made with; null "
                                     "otherwise",
    "jobs[].job_id": "the job (`ofu.job.id`); jobs are sorted by wasted GPU hours",
    "jobs[].start": "its first window's start",
    "jobs[].end": "its last window's end",
    "jobs[].end_reason": "`end_of_recording`, or why it ended (`timeout`, `silent`)",
    "jobs[].duration_hours": "end - start",
    "jobs[].gpus": "distinct GPUs over its life; with --prometheus the most at once",
    "jobs[].peak_gpus": "the most GPUs at once",
    "jobs[].gpu_hours": "GPU time it held",
    "jobs[].ofu_mean": "OFU, time-weighted over its GPU time",
    "jobs[].ofu_p10": "10th percentile of its GPU windows' OFU, weighted by their length (0.1 pp buckets)",
    "jobs[].ofu_p50": "the median, likewise",
    "jobs[].ofu_p90": "the 90th percentile, likewise",
    "jobs[].flops": "floating-point operations its tensor cores did (OFU x the dense peak at its precision); null "
                    "when its precision is unknown",
    "jobs[].flops_per_gpu_s": "flops per GPU second of known precision",
    "jobs[].wasted_gpu_hours": "GPU hours it lost: exactly what its loss parts add up to; GPU time = useful (OFU x "
                               "GPU time) + this - `gained_gpu_hours`",
    "jobs[].gained_gpu_hours": "GPU hours its windows gained where the SM clock boosted above f_ref (a negative "
                               "clock part), counted apart from the waste (docs/method.md#wasted-gpu-hours-and-the-"
                               "clock-gain)",
    "jobs[].mfu_reported_mean": "the MFU it reported about itself, time-weighted; null without reports",
    "jobs[].energy_joules": "energy its GPUs used (J): its windows' gpu.energy, a shared GPU's and a MIG instance's "
                            "by its part; null when no window's energy is known (docs/method.md#energy-per-job)",
    "jobs[].joules_per_useful_pflop": "J per PFLOP of useful work (OFU x the dense peak), over the windows where "
                                      "its energy and FLOPs are both known; null otherwise",
    "jobs[].emissions_grams": "g CO2e of its energy at the jobs settings' carbon.grams_per_kwh; null when that is "
                              "unset or its energy unknown",
    "jobs[].precisions_gpu_hours": "mapping: precision -> GPU hours in it (`unknown` when not declared)",
    "jobs[].loss": "mapping: its loss account, part -> share of its GPU time (`useful` is its OFU; they add up to 1)",
    "jobs[].loss_gpu_hours": "mapping: part -> GPU hours lost to it (they add up to `wasted_gpu_hours`; never below "
                             "0: a gain is in `gain_gpu_hours`)",
    "jobs[].gain_gpu_hours": "mapping: part -> GPU hours gained on it (`clock`: the SM clock boosting above f_ref; "
                             "they add up to `gained_gpu_hours`); empty without a gain",
    "jobs[].largest_loss.part": "the part that lost it the most GPU time",
    "jobs[].largest_loss.share": "that part's share of its GPU time",
    "jobs[].largest_loss.gpu_hours": "GPU hours lost to it",
    "jobs[].largest_loss.cause": "its dominant cause, when the part has one (clock, non-tensor)",
    "jobs[].largest_loss.advice": "what to look at first",
    "jobs[].cost": "what its GPU time cost (GPU h x the price of each GPU, window by window; docs/method.md#cost): "
                   "its parts less `gained_cost`; null when none of its GPUs had a price",
    "jobs[].wasted_cost": "what its loss parts lost of it (the money of `wasted_gpu_hours`)",
    "jobs[].cost_by_part": "mapping: part -> money (`useful` and each loss part)",
    "jobs[].gained_cost": "money its clock boosting above f_ref gained, counted apart",
    "jobs[].findings[].kind": "`mfu_gap` (the MFU audit), `regression` or `stalled` (GPUs busy with nothing "
                              "moving: docs/jobs.md#stalled-jobs)",
    "jobs[].findings[].cause": "the likely cause, a code: `flop_formula_overcount`, "
                               "`uncounted_padding_or_recompute`, `sustained_ofu_drop`, `engine_busy_no_work`",
    "jobs[].findings[].meaning": "the cause in words",
    "jobs[].findings[].action": "what to do about it",
    "jobs[].findings[].id": "`<job>/<kind>/<n>`: pairs the open and close events",
    "jobs[].findings[].time": "when it was raised (data time)",
    "jobs[].findings[].time_unix_nano": "the same, in nanoseconds",
    "jobs[].findings[].minutes_into_job": "the same, from the job's start",
    "jobs[].findings[].since": "when the condition began",
    "jobs[].findings[].closed": "when it cleared, closed with its job or closed for want of MFU reports; null while "
                                "open",
    "jobs[].findings[].numbers": "mapping: the numbers at open (`mfu_gap`: `mfu_reported`, `ofu`, `gap_pp`, "
                                 "`ratio`, `window`; `regression`: `ofu`, `baseline`, `ratio`; `stalled`: `evidence` "
                                 "(`links` or `activity_only`), `stalled_for_s`, `stalled_gpu_hours`)",
    "jobs[].findings[].close_numbers": "mapping: the numbers at close (`reason`: `job_end` when it closed with its "
                                       "job, `no_mfu_report` when the job sent no MFU report for a whole audit "
                                       "window, with `no_report_s`, how long; `work_resumed` when a stalled one "
                                       "cleared, with its `stalled_for_s` and `stalled_gpu_hours` to then)",
    "jobs[].stalled_gpu_hours": "GPU hours its stalled findings held (engine busy, nothing moving: "
                                "docs/jobs.md#stalled-jobs); null without one",
    "gpus[].host": "the GPU's host",
    "gpus[].gpu": "its index on the host",
    "gpus[].uuid": "its UUID",
    "gpus[].mig_instance": "the MIG instance; null for a whole GPU",
    "gpus[].model": "its model name",
    "gpus[].gpu_hours": "its GPU time",
    "gpus[].ofu_mean": "its OFU, time-weighted",
    "gpus[].ofu_p50": "the median of its windows' OFU",
    "gpus[].jobs": "the jobs seen on it",
}


def json_field_paths(value: Any, prefix: str = "") -> set[str]:
    """The field paths of a report's JSON, as REPORT_FIELDS writes them: leaves, lists of values and
    the mappings marked there (not entered); objects and lists of objects are entered."""
    if isinstance(value, dict) and not REPORT_FIELDS.get(prefix, "").startswith("mapping"):
        return {path for key, item in value.items()
                for path in json_field_paths(item, f"{prefix}.{key}" if prefix else str(key))}
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return {path for item in value for path in json_field_paths(item, f"{prefix}[]")}
    if isinstance(value, list) and not value and prefix not in REPORT_FIELDS:
        return set()  # an empty list of objects: no fields to see
    return {prefix}


def report_fields_table() -> str:
    """docs/report.md's list of the JSON fields."""
    rows = ["| field | meaning |", "|---|---|"]
    rows += [f"| `{path}` | {meaning} |" for path, meaning in REPORT_FIELDS.items()]
    return "\n".join(rows)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def _si(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def finding_line(job_id: str, f: dict[str, Any]) -> str:
    """One human-readable line per finding, with both numbers."""
    n = f["numbers"]
    when = f"+{f['minutes_into_job']:.0f} min into the job ({f['time']})"
    if f["kind"] == MFU_GAP and "mfu_reported" in n and "ofu" in n:
        what = (f"reported MFU {_pct(n['mfu_reported'])} vs OFU {_pct(n['ofu'])} over {n.get('window', '?')} "
                f"-> {f['cause']}")
    elif f["kind"] == STALLED and "stalled_for_s" in n:
        until = {**n, **f.get("close_numbers", {})}
        evidence = ("links and activity" if until.get("evidence") == "links"
                    else "activity counters only, no link counters")
        what = (f"engine busy with nothing moving for {window_label(round(float(until['stalled_for_s'])))}, "
                f"{float(until['stalled_gpu_hours']):.2f} GPU h ({evidence})")
    elif "ofu" in n and "baseline" in n:
        what = f"OFU {_pct(n['ofu'])} vs baseline {_pct(n['baseline'])} ({n['baseline'] / n['ofu']:.2f}x slower)" \
            if n["ofu"] else f"OFU 0 vs baseline {_pct(n['baseline'])}"
        if "grew" in n:  # where it went (the loss account)
            what += f": {growth_text(n)}"
    else:
        what = f["cause"]
    if not f.get("closed"):
        closed = "; still open"
    elif f.get("close_numbers", {}).get("reason") == "job_end":
        closed = "; open until the job ended"
    elif f.get("close_numbers", {}).get("reason") == NO_MFU_REPORT:
        silent = f["close_numbers"].get("no_report_s")
        closed = f"; closed {f['closed']}: the job sent no MFU report" + \
            (f" for {window_label(round(float(silent)))}" if isinstance(silent, int | float) else "")
    else:
        closed = f"; cleared {f['closed']}"
    explained = cause_of(f["cause"])
    return (f"  {job_id}: {f['kind']} {when}: {what}{closed}\n"
            f"    {f['cause']}: {explained.meaning}. What to do: {explained.action}.")


TABLE_COLUMNS = ("job", "GPUs", "GPU h", "OFU mean", "p10", "p50", "p90", "FLOPs", "wasted GPU h", "findings")


def _priced(report: Report) -> bool:
    """Whether the report has costs: prices are set and some GPU had one."""
    return _fleet_cost(report) is not None


ENERGY_COLUMNS = ("energy kWh", "J/PFLOP")  # after "wasted GPU h", where some job's energy is known


def _has_energy(report: Report) -> bool:
    return any(j.summary.totals.energy_known for j in report.jobs)


def table_columns(report: Report) -> tuple[str, ...]:
    """The jobs table's columns: with costs, what each job cost and what its loss parts lost, and where some
    job's energy is known its energy columns, before findings."""
    extra: tuple[str, ...] = ()
    if _priced(report):
        currency = report.book.config.cost.currency
        extra += (f"cost {currency}", f"wasted {currency}")
    if _has_energy(report):
        extra += ENERGY_COLUMNS
    return (*TABLE_COLUMNS[:-1], *extra, TABLE_COLUMNS[-1]) if extra else TABLE_COLUMNS


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _kwh(joules: float | None) -> str:
    return "-" if joules is None else f"{joules / JOULES_PER_KWH:.2f}"


def table_rows(report: Report) -> list[tuple[str, ...]]:
    """The jobs table's rows; with costs, by the money their loss parts lost (those with no price last), else as
    report.jobs has them (by wasted GPU hours)."""
    priced = _priced(report)
    jobs = report.jobs
    if priced:
        jobs = sorted(jobs, key=lambda j: (j.summary.cost is None,
                                           -(cost_record(j.summary.cost)["wasted_cost"] or 0.0)))
    rows = []
    energy = _has_energy(report)
    for job in jobs:
        s, t = job.summary, job.summary.totals
        kinds = ", ".join(f"{f['kind']}@+{f['minutes_into_job']:.0f}m" for f in job.findings) or "-"
        costs = cost_record(s.cost)
        money_cells = (_money(costs["cost"]), _money(costs["wasted_cost"])) if priced else ()
        per_pflop = t.energy_per_useful_pflop
        energy_cells = (_kwh(t.energy), "-" if per_pflop is None else f"{per_pflop:,.0f}") if energy else ()
        stalled = stalled_gpu_hours(job.findings)
        if stalled is not None:
            kinds += f" ({stalled:.2f} GPU h stalled)"
        rows.append((s.job_id, str(s.gpus), f"{t.gpu_hours:.2f}", _pct(t.ofu_mean), _pct(s.ofu_p10), _pct(s.ofu_p50),
                     _pct(s.ofu_p90), _si(t.flop if t.flops_known else None, "FLOP"), f"{t.wasted_gpu_hours:.2f}",
                     *money_cells, *energy_cells, kinds))
    return rows


def cost_lines(report: Report) -> list[str]:
    """The fleet's cost in one line, and the GPU-hours with no price (by what they would be priced by)."""
    fleet_cost = _fleet_cost(report)
    config = report.book.config.cost
    if not config.enabled and fleet_cost is None:  # the backend report's costs come from series, not prices
        return []
    out = []
    if fleet_cost is not None:
        costs = cost_record(fleet_cost)
        by_part = costs["cost_by_part"]
        idle = by_part.get(UNALLOCATED, 0.0)
        jobs_lost = costs["wasted_cost"] - idle
        out.append(f"Cost {costs['cost']:.2f} {config.currency} over the GPU-hours with a price: the jobs lost "
                   f"{jobs_lost:.2f} ({_pct(_ratio(jobs_lost, costs['cost']))}) to their loss parts, "
                   f"{idle:.2f} went to GPUs with no job, {by_part.get(USEFUL, 0.0):.2f} to useful work (OFU; "
                   "docs/method.md#cost).")
    unpriced = {key: to_float(count) / 3600.0 for key, count in report.book.unpriced.items()}
    if unpriced:
        by = "model" if config.by == "model" else config.by
        which = ", ".join(f"{key or f'no {by}'} ({hours:.2f} GPU h)" for key, hours in
                          sorted(unpriced.items(), key=lambda kv: -kv[1]))
        out.append(f"No price for {sum(unpriced.values()):.2f} GPU h, left out of the cost (never counted at 0): "
                   f"{by} {which}; add it to the jobs processor's cost.per_gpu_hour or set cost.default "
                   "(docs/jobs.md#cost).")
    return out


def _aligned(rows: list[tuple[str, ...]], numeric: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def line(row: tuple[str, ...]) -> str:
        cells = (c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
        return "  ".join(cells).rstrip()

    return [line(rows[0]), line(tuple("-" * w for w in widths)), *(line(r) for r in rows[1:])]


GPU_COLUMNS = ("GPU", "model", "GPU h", "OFU mean", "p50", "jobs")


def gpu_table(report: Report) -> list[str]:
    rows = [GPU_COLUMNS]
    for g in report.gpus:
        rows.append((g.label, g.model.removeprefix("NVIDIA ") or "-", f"{g.totals.gpu_hours:.2f}",
                     _pct(g.totals.ofu_mean), _pct(g.histogram.quantile(0.5)), ", ".join(sorted(g.jobs)) or "-"))
    return _aligned(rows, {2, 3, 4})


def _inputs_lines(report: Report) -> list[str]:
    if len(report.inputs) <= 1 and not report.notes and not any(s.notes for s in report.inputs):
        return []
    backend = all(s.format == BACKEND_FORMAT for s in report.inputs)
    out = ["Queried:" if backend else f"Read {len(report.inputs)} file(s), in data-time order:"]
    for s in report.inputs:
        what = ", ".join(x for x in (s.format or "no data", s.compression) if x)
        span = f"{_iso(s.first)} .. {_iso(s.last)}" if s.first is not None else "no points"
        out.append(f"  {s.path} ({what}; {s.lines} {'queries' if backend else 'lines'}; {span})")
        out += [f"    note: {n}" for n in s.notes]
    out += [f"  note: {n}" for n in report.notes]
    return [*out, ""]


def findings_note(report: Report) -> str:
    """Why the recorded findings shown differ from what the points give here ("" when they agree)."""
    shown = sum(len(j.findings) for j in report.jobs)
    if report.findings_source != "recorded" or report.jobs_source == "series" or report.recomputed_findings == shown:
        return ""
    return (f"Recomputed from these points with {report.config_source}, there are {report.recomputed_findings} "
            f"finding(s), not the {shown} recorded. The jobs processor decided with its own settings and the data "
            "it had then (it may have seen a job from before this recording, or used other thresholds): "
            "--recompute lists the recomputed ones, --config FILE takes the settings from your pipeline config.")


def findings_lines(report: Report) -> list[str]:
    """The findings, saying which the user is looking at and, when the other source differs, why."""
    findings = [line for j in report.jobs for f in j.findings for line in finding_line(j.summary.job_id, f).split("\n")]
    count = sum(len(j.findings) for j in report.jobs) or "none"
    if report.findings_source == "backend":
        out = [f"Findings (the jobs processor's job_finding series in the backend: open while 1; the numbers "
               f"behind each are in its ofu.finding events, not in the series): {count}"]
    elif report.findings_source == "recorded":
        out = [f"Findings (recorded: the ofu.finding events the jobs processor logged while it ran): {count}"]
        note = findings_note(report)
        if note:
            out.insert(0, f"Note: {note}")
    elif report.recorded_events:
        out = [f"Findings (recomputed from the points with {report.config_source}, as --recompute asks; the "
               f"recording's own finding events are not shown): {count}"]
    else:
        out = [f"Findings (recomputed from the points with {report.config_source}: the recording holds no "
               f"finding events, so the jobs processor did not run before the file exporter): {count}"]
    return out + findings


ATTRIBUTION_DOCS = "docs/components/processors/attribution.md"


def flops_hint(report: Report) -> list[str]:
    """Why a job's FLOPs are "-", and how to get them."""
    unknown = [j.summary.job_id for j in report.jobs if not j.summary.totals.flops_known]
    if not unknown:
        return []
    which = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
    return ["", f"FLOPs '-' ({which}): the job's precision is unknown, so its FLOPs cannot be counted (OFU does "
                "not need it). Declare it: the pod annotation or label ofu.dev/precision, OFU_PRECISION in the job's "
                f"environment, or an attribution rule ({ATTRIBUTION_DOCS}#precedence)."]


def no_jobs_hint(report: Report, gpus: int) -> str:
    """What to do when no GPU had a job: depends on what was recorded."""
    formats = {s.format for s in report.inputs if s.format}
    if formats and formats <= {"dmon", "csv"}:
        csv_note = " (a CSV can, in a job or hpc_job column)" if "csv" in formats else ""
        return (f"No job: the {gpus} GPUs below come from a {'/'.join(sorted(formats))} recording, which names no "
                f"job{csv_note}. For per-job answers, record the file exporter's output of a pipeline with the "
                f"attribution processor ({ATTRIBUTION_DOCS}).")
    ignored = ", ".join(repr(j) for j in report.book.config.ignore_jobs)
    return (f"No job was attributed: the {gpus} GPUs below sent {OFU_METRIC} without an ofu.job.id (or only ids "
            f"the jobs settings ignore: {ignored}). Name jobs with the attribution processor before ofu "
            f"({ATTRIBUTION_DOCS}).")


def render_table(report: Report, show_gpus: bool = False) -> str:
    data = report_json(report)
    fleet = data["fleet"]
    out = _inputs_lines(report)
    out.append(f"{report.source}: {report.lines} {report.lines_word}, {_iso(report.start)} .. {_iso(report.end)} "
               "(data time); "
               f"{fleet['gpus']} GPUs, {len(report.jobs)} jobs, {fleet['gpu_hours']:.2f} GPU h "
               f"({fleet['unattributed_gpu_hours']:.2f} without a job)")
    jobs_part = (f"; jobs: {_pct(fleet['job_ofu_mean'])} of the {fleet['job_gpu_hours']:.2f} GPU h they held"
                 if report.jobs else "")
    out.append(f"Fleet OFU {_pct(fleet['ofu_mean'])} over all {fleet['gpu_hours']:.2f} GPU h, idle GPUs "
               f"included{jobs_part}.")
    if report.jobs_source == "series":
        out.append("Jobs: as the jobs processor counted them while it ran, with its settings (its job series and "
                   f"events in the recording); --recompute replays the GPU points with {report.config_source}.")
    out += cost_lines(report)
    stalled_jobs = [j for j in data["jobs"] if j["stalled_gpu_hours"] is not None]
    if stalled_jobs:
        out.append(f"Stalled: {fleet['stalled_gpu_hours']:.2f} GPU h held by {len(stalled_jobs)} job(s) whose GPUs "
                   "were busy with nothing moving (a collective deadlock or a spinning kernel: "
                   "docs/jobs.md#stalled-jobs).")
    out.append("")
    if report.jobs:
        columns = table_columns(report)
        out += _aligned([columns, *table_rows(report)], set(range(1, len(columns) - 1)))
        out += flops_hint(report)
        out.append("")
        out += breakdown_lines(_job_losses(report), report.book.fleet_loss, _fleet_tile_factors(report),
                               _job_costs(report), _fleet_cost(report), report.book.config.cost.currency)
        out.append("")
    else:
        out.append(no_jobs_hint(report, fleet["gpus"]))
        out.append("")
    if show_gpus or not report.jobs:
        out += gpu_table(report)
        out.append("")
    if report.jobs:
        out += findings_lines(report)
        if _priced(report):
            out.append(f"Jobs are sorted by wasted {report.book.config.cost.currency}: what the GPU time their loss "
                       "parts lost cost (docs/method.md#cost).")
        else:
            out.append("Jobs are sorted by wasted GPU hours: the GPU time their loss parts lost "
                       "(docs/method.md#wasted-gpu-hours-and-the-clock-gain).")
    return "\n".join(out).rstrip()


def write_csv(report: Report, path: str | Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["job_id", "start", "end", "gpus", "gpu_hours", "ofu_mean", "ofu_p10", "ofu_p50", "ofu_p90",
                         "flops", "wasted_gpu_hours", "mfu_reported_mean", "findings", "finding_details",
                         "largest_loss", *(f"lost_gpu_hours_{part}" for part in CSV_LOSS_PARTS),
                         "gained_gpu_hours", "cost", "wasted_cost", "currency", "energy_joules",
                         "joules_per_useful_pflop", "emissions_grams", "stalled_gpu_hours"])
        for job in report.jobs:
            r = _clean(job_record(job))
            details = "; ".join(f"{f['kind']}:{f['cause']}@{f['time']}" for f in job.findings)
            lost = r["loss_gpu_hours"] or {}
            writer.writerow([r["job_id"], r["start"], r["end"], r["gpus"], r["gpu_hours"], r["ofu_mean"], r["ofu_p10"],
                             r["ofu_p50"], r["ofu_p90"], r["flops"], r["wasted_gpu_hours"], r["mfu_reported_mean"],
                             len(job.findings), details, (r.get("largest_loss") or {}).get("part"),
                             *(lost.get(part) for part in CSV_LOSS_PARTS), r["gained_gpu_hours"], r["cost"],
                             r["wasted_cost"], report.book.config.cost.currency if r["cost"] is not None else None,
                             r["energy_joules"], r["joules_per_useful_pflop"], r["emissions_grams"],
                             r["stalled_gpu_hours"]])
