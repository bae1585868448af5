"""Per-job answers from recorded file-exporter output (``otel-ofu report``, :mod:`.command`).

The table is recomputed from the per-GPU points (``gpu.ofu``, ``gpu.flops.achieved``, the
reported-MFU metric) with the same :class:`otel_ofu.jobs.tracker.JobBook` the ``jobs``
processor runs, so a recording made without that processor still gets a full report.
Findings come from the recording's own ``ofu.finding.*`` events when the jobs processor
ran (what operators were told at the time, with the thresholds in force then), and are
recomputed from the points otherwise, or always with ``--recompute``.

Metric lines are decoded from OTLP/JSON with ``json`` directly, keeping only the metrics the
report needs: an order of magnitude faster than the protobuf JSON parser on large files.
Log lines (few) go through :mod:`otel_ofu.otlp`.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from otel_ofu.core.model import JOB_ID, Attributes, Event, MetricPoint, job_id_of
from otel_ofu.jobs.findings import MFU_GAP
from otel_ofu.jobs.tracker import FLOPS_METRIC, OFU_METRIC, JobBook, JobsConfig, JobSummary, Update
from otel_ofu.otlp import codec as otlp

log = logging.getLogger("otel_ofu.report")

TRUTH_METRIC = "sim.gpu.mfu.true"
PROGRESS_MIN_BYTES = 5_000_000  # below this a progress bar is noise
_FINDING_META = {"id", "kind", "cause", "since_unix_nano", "opened_unix_nano", "duration_s"}


class ReportError(Exception):
    """A problem with the input, located (file:line) where it has a line."""


# --- reading ----------------------------------------------------------------------------------

def _any_value(value: dict[str, Any]) -> Any:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return float(value[key]) if key == "doubleValue" else value[key]
    if "intValue" in value:
        return int(value["intValue"])
    for key in ("arrayValue", "kvlistValue", "bytesValue"):
        if key in value:
            return json.dumps(value[key], separators=(",", ":"))
    return None


def _attributes(key_values: list[dict[str, Any]] | None) -> Attributes:
    return tuple(sorted((kv["key"], _any_value(kv.get("value") or {})) for kv in key_values or ()))


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
                    resource = _attributes((rm.get("resource") or {}).get("attributes"))
                for dp in data.get("dataPoints") or ():
                    value = float(dp["asDouble"]) if "asDouble" in dp else float(int(dp.get("asInt", 0)))
                    yield MetricPoint(metric["name"], value, int(dp.get("timeUnixNano", 0)), resource,
                                      _attributes(dp.get("attributes")), metric.get("unit") or "1", monotonic,
                                      int(dp.get("startTimeUnixNano", 0)))


def read_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, parsed object) per non-empty line, with a progress bar on large inputs."""
    try:
        size = path.stat().st_size
        handle = path.open("r", encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror}") from None
    from tqdm import tqdm

    with handle, tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {path.name}", file=sys.stderr,
                      disable=None if size >= PROGRESS_MIN_BYTES else True, leave=False) as bar:
        for number, line in enumerate(handle, start=1):
            bar.update(len(line.encode("utf-8")))
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError as exc:
                raise ReportError(f"{path}:{number}: not a JSON line: {exc}") from None
            if not isinstance(doc, dict) or not ({"resourceMetrics", "resourceLogs"} & set(doc)):
                raise ReportError(f"{path}:{number}: not an OTLP export request (expected a JSON object with "
                                  "resourceMetrics or resourceLogs, as the file exporter writes)")
            yield number, doc


def _events(path: Path, number: int, doc: dict[str, Any]) -> list[Event]:
    try:
        request = otlp.from_json_line(json.dumps(doc, separators=(",", ":")))
        return list(otlp.events_from_request(request))  # type: ignore[arg-type]
    except ValueError as exc:
        raise ReportError(f"{path}:{number}: malformed OTLP logs: {exc}") from None


# --- building the report ----------------------------------------------------------------------

@dataclass
class JobReport:
    summary: JobSummary
    timeline: list[tuple[float, float, float | None, float | None]] = field(default_factory=list)  # t, ofu, mfu, base
    truth: list[tuple[float, float]] = field(default_factory=list)  # t, true MFU (simulator)
    findings: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Report:
    source: str
    lines: int
    start: float | None
    end: float | None
    findings_source: str  # recorded | recomputed
    jobs: list[JobReport]
    book: JobBook


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
    return {"kind": kind, "cause": cause, "id": fid, "time": _iso(opened), "time_unix_nano": int(round(opened * 1e9)),
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
        record = by_id.setdefault(fid, {"job": str(a.get(JOB_ID, dict(event.resource).get(JOB_ID, ""))),
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


def build_report(path: str | Path, config: JobsConfig | None = None, recompute: bool = False) -> Report:
    """Replay a recording through a JobBook; collect timelines, summaries and findings."""
    path = Path(path)
    config = config or JobsConfig()
    book = JobBook(config)
    names = {OFU_METRIC, FLOPS_METRIC, config.mfu_metric, TRUTH_METRIC}
    timelines: dict[str, list[tuple[float, float, float | None, float | None]]] = {}
    truth: dict[str, dict[float, list[float]]] = {}
    events: list[Event] = []
    lines, first, last = 0, math.inf, -math.inf
    resolution = float(config.resolution)

    def collect(update: Update) -> None:
        for tracker, s in update.snapshots:
            timelines.setdefault(tracker.job_id, []).append((s.time, s.bin_ofu, s.bin_mfu, s.baseline))

    for number, doc in read_lines(path):
        lines += 1
        if "resourceLogs" in doc:
            events += _events(path, number, doc)
            continue
        try:
            points = list(metric_points(doc, names))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ReportError(f"{path}:{number}: malformed OTLP metrics: {exc!r}") from None
        for p in points:
            t = p.time_unix_nano / 1e9
            first, last = min(first, t), max(last, t)
            if p.name == TRUTH_METRIC:
                job = job_id_of(p)
                if job is not None:
                    bin_end = (math.floor(t / resolution - 1e-9) + 1) * resolution
                    truth.setdefault(str(job), {}).setdefault(bin_end, []).append(p.value)
        collect(book.observe(points))
    if lines == 0:
        raise ReportError(f"{path}: empty: no OTLP JSON lines")
    collect(book.close_all("end_of_recording"))
    if not book.ended:
        raise ReportError(f"{path}: no {OFU_METRIC} points of any job: record the output of the ofu processor "
                          "(with jobs named by attribution or the sim)")

    recorded = any(e.name.startswith(("ofu.finding.", "ofu.job.")) for e in events)
    source = "recorded" if recorded and not recompute else "recomputed"
    recorded_findings = _recorded_findings(events) if source == "recorded" else {}
    jobs = []
    for summary in book.ended:
        if source == "recorded":
            findings = [_finding_record(r["kind"], r["cause"], r["id"], r["opened"], r["since"], r["closed"],
                                        r["numbers"], r["close_numbers"], summary.start)
                        for r in recorded_findings.get(summary.job_id, [])
                        if summary.start - resolution <= r["opened"] <= summary.end + float(config.job_timeout)]
        else:
            findings = _recomputed_findings(summary)
        life = (summary.start, summary.end + resolution)
        in_life = [row for row in timelines.get(summary.job_id, []) if life[0] <= row[0] <= life[1]]
        job_truth = sorted((t, sum(v) / len(v)) for t, v in truth.get(summary.job_id, {}).items()
                           if summary.start <= t <= summary.end + resolution)
        jobs.append(JobReport(summary, in_life, job_truth, sorted(findings, key=lambda f: f["time_unix_nano"])))
    jobs.sort(key=lambda j: (-j.summary.totals.wasted_gpu_hours, j.summary.job_id))
    return Report(str(path), lines, first if first < math.inf else None, last if last > -math.inf else None,
                  source, jobs, book)


# --- output -----------------------------------------------------------------------------------

def job_record(job: JobReport) -> dict[str, Any]:
    s, t = job.summary, job.summary.totals
    return {
        "job_id": s.job_id, "start": _iso(s.start), "end": _iso(s.end), "end_reason": s.reason,
        "duration_hours": (s.end - s.start) / 3600.0, "gpus": s.gpus, "peak_gpus": s.peak_gpus,
        "gpu_hours": t.gpu_hours, "ofu_mean": t.ofu_mean, "ofu_p10": s.ofu_p10, "ofu_p50": s.ofu_p50,
        "ofu_p90": s.ofu_p90, "flops": t.flop if t.flops_known else None,
        "flops_per_gpu_s": t.flop / t.flop_gpu_seconds if t.flops_known else None,
        "wasted_gpu_hours": t.wasted_gpu_hours, "mfu_reported_mean": s.mfu_reported,
        "precisions_gpu_hours": {p: sec / 3600.0 for p, sec in s.precisions.items()},
        "findings": job.findings,
    }


def report_json(report: Report) -> dict[str, Any]:
    book = report.book
    attributed = sum(j.summary.totals.gpu_seconds for j in report.jobs)
    ofu_seconds = sum(j.summary.totals.ofu_gpu_seconds for j in report.jobs)
    return _clean({
        "source": report.source, "lines": report.lines, "start": _iso(report.start), "end": _iso(report.end),
        "findings_source": report.findings_source,
        "fleet": {"gpus": book.gpu_count, "jobs": len(report.jobs),
                  "gpu_hours": (attributed + book.unattributed.gpu_seconds) / 3600.0,
                  "job_gpu_hours": attributed / 3600.0,
                  "unattributed_gpu_hours": book.unattributed.gpu_hours,
                  "job_ofu_mean": ofu_seconds / attributed if attributed else None,
                  # Every GPU's time, with a job or not: what a fleet OFU panel shows.
                  "ofu_mean": _ratio(ofu_seconds + book.unattributed.ofu_gpu_seconds,
                                     attributed + book.unattributed.gpu_seconds),
                  "wasted_gpu_hours": sum(j.summary.totals.wasted_gpu_hours for j in report.jobs)},
        "jobs": [job_record(j) for j in report.jobs],
    })


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
    elif "ofu" in n and "baseline" in n:
        what = f"OFU {_pct(n['ofu'])} vs baseline {_pct(n['baseline'])} ({n['baseline'] / n['ofu']:.2f}x slower)" \
            if n["ofu"] else f"OFU 0 vs baseline {_pct(n['baseline'])}"
    else:
        what = f["cause"]
    if not f.get("closed"):
        closed = "; still open"
    elif f.get("close_numbers", {}).get("reason") == "job_end":
        closed = "; open until the job ended"
    else:
        closed = f"; cleared {f['closed']}"
    return f"  {job_id}: {f['kind']} {when}: {what}{closed}"


TABLE_COLUMNS = ("job", "GPUs", "GPU h", "OFU mean", "p10", "p50", "p90", "FLOPs", "wasted GPU h", "findings")


def table_rows(report: Report) -> list[tuple[str, ...]]:
    rows = []
    for job in report.jobs:
        s, t = job.summary, job.summary.totals
        kinds = ", ".join(f"{f['kind']}@+{f['minutes_into_job']:.0f}m" for f in job.findings) or "-"
        rows.append((s.job_id, str(s.gpus), f"{t.gpu_hours:.2f}", _pct(t.ofu_mean), _pct(s.ofu_p10), _pct(s.ofu_p50),
                     _pct(s.ofu_p90), _si(t.flop if t.flops_known else None, "FLOP"), f"{t.wasted_gpu_hours:.2f}",
                     kinds))
    return rows


def render_table(report: Report) -> str:
    rows = [TABLE_COLUMNS, *table_rows(report)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_COLUMNS))]
    numeric = set(range(1, 9))

    def line(row: tuple[str, ...]) -> str:
        cells = (c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
        return "  ".join(cells).rstrip()

    data = report_json(report)
    fleet = data["fleet"]
    out = [f"{report.source}: {report.lines} lines, {_iso(report.start)} .. {_iso(report.end)} (data time); "
           f"{fleet['gpus']} GPUs, {len(report.jobs)} jobs, {fleet['gpu_hours']:.2f} GPU h "
           f"({fleet['unattributed_gpu_hours']:.2f} without a job)",
           "", line(rows[0]), line(tuple("-" * w for w in widths)), *(line(r) for r in rows[1:]), ""]
    findings = [finding_line(j.summary.job_id, f) for j in report.jobs for f in j.findings]
    out.append(f"Findings ({report.findings_source}): {len(findings) or 'none'}")
    out += findings
    out.append("Jobs are sorted by wasted GPU hours = GPU time x (1 - OFU).")
    return "\n".join(out)


def write_csv(report: Report, path: str | Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["job_id", "start", "end", "gpus", "gpu_hours", "ofu_mean", "ofu_p10", "ofu_p50", "ofu_p90",
                         "flops", "wasted_gpu_hours", "mfu_reported_mean", "findings", "finding_details"])
        for job in report.jobs:
            r = _clean(job_record(job))
            details = "; ".join(f"{f['kind']}:{f['cause']}@{f['time']}" for f in job.findings)
            writer.writerow([r["job_id"], r["start"], r["end"], r["gpus"], r["gpu_hours"], r["ofu_mean"], r["ofu_p10"],
                             r["ofu_p50"], r["ofu_p90"], r["flops"], r["wasted_gpu_hours"], r["mfu_reported_mean"],
                             len(job.findings), details])
