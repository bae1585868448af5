"""The report's points, read straight into columns: OTLP JSON requests (simdjson's lazy proxies
walked where it reads the line, else ``json.loads`` and a walk of the dicts) and OTLP protobuf
records (upb's decode and a walk of the messages).

Only the metrics the report reads are touched; a point becomes five array entries (time,
metric, resource, attributes, value), never an object: resources and attribute sets are
interned once per distinct encoding (a GPU's resource repeats every window, a loss part's
attribute on every GPU). What it reads equals :func:`otel_ofu.report.build.metric_points`
(the dict walk that builds :class:`MetricPoint`\\ s), point for point and in order
(tests/test_report_speed.py).

simdjson (pysimdjson) parses a line and the walk touches only the metrics asked for: json.loads
builds every small object of a line (30 times upb's decode of the same points). The simdjson walk
reads a line only where the dict walk would read it to the same points without an error; anything
else (a logs line, a number simdjson refuses such as 1e400, a duplicate key, a value of an odd type,
any error) goes to the json.loads path, so odd input is read, or refused, as by the dict walk.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from otel_ofu.core.model import JOB_ID, JOB_SHARED, Attributes, MetricPoint
from otel_ofu.jobs.book import OFU_METRIC
from otel_ofu.otlp import codec as otlp

try:
    import simdjson
except ImportError:  # the json.loads path reads every line (one DEBUG log, at the first line)
    simdjson = None

log = logging.getLogger("otel_ofu.report")

_MAX_NS = 1 << 63
_REPLAY_CHUNK = 1 << 20  # points turned into Python values at once by the replay


@dataclass(frozen=True)
class PointFilter:
    """Points of the wanted metrics left out as they are read (the series report's, report/series.py).

    ``no_job_metrics`` are kept only on resources with no job of their own (no ofu.job.id, one of
    ``ignored_jobs``, or a shared GPU's): a GPU's energy and share, which a job's series count already.
    ``with_attribute`` metric -> (key, string value): of those metrics, only points with that attribute
    (a job's gauges over its life, not over each rolling window).
    """

    no_job_metrics: frozenset[str] = frozenset()
    ignored_jobs: frozenset[str] = frozenset()
    with_attribute: tuple[tuple[str, str, str], ...] = ()


class PointStore:
    """The report's points from every input, compact, replayed in data-time order.

    Resources and attribute sets are interned (a GPU's points share one tuple); values live in
    typed arrays: time (8 bytes), metric (1), resource (4), attributes (4), value (8).
    """

    def __init__(self, names: list[str], point_filter: PointFilter | None = None):
        self.names = names
        self.point_filter = point_filter or PointFilter()
        self._with_attribute = {metric: (key, value) for metric, key, value in self.point_filter.with_attribute}
        self._has_job: dict[int, bool] = {}
        self._codes = {n: i for i, n in enumerate(names)}
        self._tables: dict[Attributes, int] = {}
        self.attributes: list[Attributes] = []
        self.times = array("q")
        self.metric = array("b")
        self.resource = array("i")
        self.attrs = array("i")
        self.values = array("d")
        # The encoded attribute sets already interned: JSON's (hashable) and protobuf's serialized
        # resources; protobuf's serialized point attributes (KeyValues) apart.
        self._encoded: dict[Any, int] = {}
        self._point_sets: dict[bytes, int] = {}
        self._json_sets: dict[bytes, int] = {}  # simdjson: an attribute list's minified JSON

    def intern(self, value: Attributes) -> int:
        code = self._tables.get(value)
        if code is None:
            code = self._tables[value] = len(self.attributes)
            self.attributes.append(value)
        return code

    _intern = intern

    def has_job(self, resource: int) -> bool:
        """Whether the interned resource names a job of its own (an ofu.job.id, not a shared GPU's)."""
        found = self._has_job.get(resource)
        if found is None:
            values = dict(self.attributes[resource])
            found = self._has_job[resource] = (JOB_ID in values and str(values[JOB_ID]) not in
                                               self.point_filter.ignored_jobs and not values.get(JOB_SHARED))
        return found

    def add(self, point: MetricPoint) -> None:
        self.times.append(point.time_unix_nano)
        self.metric.append(self._codes[point.name])
        self.resource.append(self._intern(point.resource))
        self.attrs.append(self._intern(point.attributes))
        self.values.append(point.value)

    def __len__(self) -> int:
        return len(self.times)

    def extend(self, other: PointStore) -> None:
        """Append another store's points (a file read in another process), its codes mapped to ours."""
        import numpy

        metric_map = numpy.array([self._codes[n] for n in other.names], dtype=numpy.int8)
        attr_map = numpy.array([self.intern(a) for a in other.attributes] or [0], dtype=numpy.int32)
        self.times.frombytes(other.times.tobytes())
        self.values.frombytes(other.values.tobytes())
        for target, source, mapping in ((self.metric, other.metric, metric_map), (self.resource, other.resource,
                                        attr_map), (self.attrs, other.attrs, attr_map)):
            codes = numpy.frombuffer(source, dtype=numpy.dtype(source.typecode))
            target.frombytes(mapping[codes].astype(numpy.dtype(target.typecode)).tobytes() if len(codes) else b"")

    # --- reading requests ---------------------------------------------------------------------

    def _json_attributes(self, key_values: Any) -> int:
        """The code of a JSON attribute list, decoded once per distinct list."""
        key = _json_key(key_values) if key_values else ()
        try:
            code = self._encoded.get(key, -1) if key is not None else -1
        except TypeError:  # a list or an object among the values (arrayValue, kvlistValue): not cached
            key, code = None, -1
        if code < 0:
            code = self.intern(json_attributes(key_values))
            if key is not None:
                self._encoded[key] = code
        return code

    def add_json_metrics(self, doc: dict[str, Any], names: set[str]) -> tuple[int, int] | None:
        """The gauge and sum points of ``names`` in one OTLP/JSON metrics request (a parsed line);
        returns the request's (first, last) point time in ns, None without points.

        The same mapping and checks as :func:`otel_ofu.report.build.metric_points`; raises
        KeyError, TypeError, ValueError or AttributeError on malformed input.
        """
        codes = self._codes
        times, metric_col, resource_col, attrs_col, values = (self.times, self.metric, self.resource, self.attrs,
                                                              self.values)
        first, last = _MAX_NS, -1
        no_attributes = self.intern(())
        isfinite = math.isfinite
        no_job_only, with_attribute = self.point_filter.no_job_metrics, self._with_attribute
        for rm in doc.get("resourceMetrics") or ():
            resource = -1
            for sm in rm.get("scopeMetrics") or ():
                for metric in sm.get("metrics") or ():
                    name = metric.get("name")
                    if name not in names:
                        continue
                    if "gauge" in metric:
                        data = metric["gauge"]
                    elif "sum" in metric:
                        data = metric["sum"]
                    else:
                        continue
                    if resource < 0:
                        resource = self._json_attributes((rm.get("resource") or {}).get("attributes"))
                    if name in no_job_only and self.has_job(resource):
                        continue
                    code = codes[name]
                    required = with_attribute.get(name)
                    for dp in data.get("dataPoints") or ():
                        value = float(dp["asDouble"]) if "asDouble" in dp else float(int(dp.get("asInt", 0)))
                        t, start = int(dp.get("timeUnixNano", 0)), int(dp.get("startTimeUnixNano", 0))
                        if not 0 < t < _MAX_NS or not 0 <= start < _MAX_NS:
                            raise ValueError(f"timeUnixNano {t} / startTimeUnixNano {start} out of range "
                                             "(0 means missing)")
                        if not isfinite(value):
                            raise ValueError(f"{name} value {value} is not a number")
                        key_values = dp.get("attributes")
                        attributes = self._json_attributes(key_values) if key_values else no_attributes
                        if required is not None and required not in self.attributes[attributes]:
                            continue
                        times.append(t)
                        metric_col.append(code)
                        resource_col.append(resource)
                        attrs_col.append(attributes)
                        values.append(value)
                        if t < first:
                            first = t
                        if t > last:
                            last = t
        return (first, last) if last >= 0 else None

    def add_json_line(self, line: str | bytes, names: set[str]) -> tuple[bool, tuple[int, int] | None]:
        """One OTLP/JSON line's gauge and sum points of ``names``, parsed by simdjson: (True, the
        request's first and last point time in ns, or None without points) where read, the points
        :meth:`add_json_metrics` would store from ``json.loads(line)``; (False, None) for a line this
        path leaves to json.loads (nothing stored): a logs line, a blank or malformed one, anything
        simdjson or the walk refuses.
        """
        if simdjson is None:
            global _told
            if not _told:
                _told = True
                log.debug("pysimdjson is not importable: OTLP JSON lines are read with json.loads")
            return False, None
        if line.startswith(_BOM_TEXT if isinstance(line, str) else _BOM_BYTES):
            return False, None  # simdjson skips a byte order mark; json.loads refuses it
        size = len(self.times)
        try:
            return True, self._add_simdjson(line, names)
        except Exception:  # noqa: BLE001 (json.loads reads the line again and says what is wrong)
            for column in (self.times, self.metric, self.resource, self.attrs, self.values):
                del column[size:]
            return False, None

    def _simd_attributes(self, key_values: Any, no_attributes: int) -> int:
        """The code of an attribute list (a simdjson Array), decoded once per distinct minified JSON
        (which keeps each value's type: ``1.0``, ``1`` and ``true`` differ)."""
        if not key_values:
            return no_attributes
        if type(key_values) is not _Array:
            raise _Declined
        key = key_values.mini
        code = self._json_sets.get(key, -1)
        if code < 0:
            code = self._json_sets[key] = self.intern(json_attributes(key_values.as_list()))
        return code

    def _add_simdjson(self, line: str | bytes, names: set[str]) -> tuple[int, int] | None:
        """:meth:`add_json_metrics`' walk on simdjson's proxies; raises where the dict walk might read
        otherwise: an object whose keys repeat (simdjson finds the first, json.loads keeps the last), a
        container of another type than the walk's (its proxy would be iterated, or hashed, where a dict
        or list raises)."""
        codes = self._codes
        times, metric_col, resource_col, attrs_col, values = (self.times, self.metric, self.resource, self.attrs,
                                                              self.values)
        first, last = _MAX_NS, -1
        no_attributes = self.intern(())
        isfinite = math.isfinite
        Object, Array = _Object, _Array  # noqa: N806
        json_sets = self._json_sets
        no_job_only, with_attribute = self.point_filter.no_job_metrics, self._with_attribute
        doc = _parser().parse(line)
        if type(doc) is not Object:
            raise _Declined
        keys = list(doc)
        if "resourceMetrics" not in keys or "resourceLogs" in keys or len(set(keys)) < len(keys):
            raise _Declined
        for rm in _array(doc[b"resourceMetrics"]):
            if type(rm) is not Object:
                raise _Declined
            rm_keys = list(rm)
            if len(set(rm_keys)) < len(rm_keys):
                raise _Declined
            resource = -1
            for sm in _array(rm[b"scopeMetrics"] if "scopeMetrics" in rm_keys else None):
                if type(sm) is not Object:
                    raise _Declined
                sm_keys = list(sm)
                if len(set(sm_keys)) < len(sm_keys):
                    raise _Declined
                for metric in _array(sm[b"metrics"] if "metrics" in sm_keys else None):
                    if type(metric) is not Object:
                        raise _Declined
                    keys = list(metric)
                    if "name" not in keys:
                        continue  # name None
                    if keys.count("name") > 1:
                        raise _Declined
                    name = metric[b"name"]
                    if name not in names:
                        if type(name) is Object or type(name) is Array:
                            raise _Declined  # unhashable as a dict or a list
                        continue
                    if len(set(keys)) < len(keys):
                        raise _Declined
                    if "gauge" in keys:
                        data = metric[b"gauge"]
                    elif "sum" in keys:
                        data = metric[b"sum"]
                    else:
                        continue
                    if resource < 0:
                        found = rm[b"resource"] if "resource" in rm_keys else None
                        attributes = None
                        if found:
                            if type(found) is not Object:
                                raise _Declined
                            keys = list(found)
                            if len(set(keys)) < len(keys):
                                raise _Declined
                            attributes = found[b"attributes"] if "attributes" in keys else None
                        resource = self._simd_attributes(attributes, no_attributes)
                    if name in no_job_only and self.has_job(resource):
                        continue
                    code = codes[name]
                    required = with_attribute.get(name)
                    if type(data) is not Object:
                        raise _Declined
                    keys = list(data)
                    if len(set(keys)) < len(keys):
                        raise _Declined
                    for dp in _array(data[b"dataPoints"] if "dataPoints" in keys else None):
                        if type(dp) is not Object:
                            raise _Declined
                        keys = list(dp)
                        if len(set(keys)) < len(keys):
                            raise _Declined
                        value = (float(dp[b"asDouble"]) if "asDouble" in keys
                                 else float(int(dp[b"asInt"])) if "asInt" in keys else 0.0)
                        t = int(dp[b"timeUnixNano"]) if "timeUnixNano" in keys else 0
                        start = int(dp[b"startTimeUnixNano"]) if "startTimeUnixNano" in keys else 0
                        if not 0 < t < _MAX_NS or not 0 <= start < _MAX_NS or not isfinite(value):
                            raise _Declined
                        attributes = no_attributes
                        if "attributes" in keys:
                            found = dp[b"attributes"]
                            if found:
                                attributes = json_sets.get(found.mini, -1) if type(found) is Array else -1
                                if attributes < 0:
                                    attributes = self._simd_attributes(found, no_attributes)
                        if required is not None and required not in self.attributes[attributes]:
                            continue
                        times.append(t)
                        metric_col.append(code)
                        resource_col.append(resource)
                        attrs_col.append(attributes)
                        values.append(value)
                        if t < first:
                            first = t
                        if t > last:
                            last = t
        return (first, last) if last >= 0 else None

    def add_proto_metrics(self, request: Any, names: set[str]) -> tuple[int, int] | None:
        """The gauge and sum points of ``names`` in one decoded ExportMetricsServiceRequest; returns
        the request's (first, last) point time in ns, None without points. The same checks as the
        JSON walk; raises ValueError on a point it refuses."""
        codes = self._codes
        encoded, point_sets = self._encoded, self._point_sets
        times, metric_col, resource_col, attrs_col, values = (self.times, self.metric, self.resource, self.attrs,
                                                              self.values)
        first, last = _MAX_NS, -1
        no_attributes = self.intern(())
        isfinite = math.isfinite
        no_job_only, with_attribute = self.point_filter.no_job_metrics, self._with_attribute
        for rm in request.resource_metrics:
            resource = -1
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    name = metric.name
                    if name not in names:
                        continue
                    kind = metric.WhichOneof("data")
                    if kind == "gauge":
                        data = metric.gauge
                    elif kind == "sum":
                        data = metric.sum
                    else:
                        continue
                    if resource < 0:
                        wire = rm.resource.SerializeToString()
                        resource = encoded.get(wire, -1)
                        if resource < 0:
                            resource = encoded[wire] = self.intern(otlp.attributes_of(rm.resource.attributes))
                    if name in no_job_only and self.has_job(resource):
                        continue
                    code = codes[name]
                    required = with_attribute.get(name)
                    for dp in data.data_points:
                        key_values = dp.attributes
                        if key_values:
                            chunk = (key_values[0].SerializeToString() if len(key_values) == 1
                                     else b"".join([kv.SerializeToString() for kv in key_values]))
                            attributes = point_sets.get(chunk, -1)
                            if attributes < 0:
                                attributes = point_sets[chunk] = self.intern(otlp.attributes_of(key_values))
                        else:
                            attributes = no_attributes
                        value = dp.as_double if dp.WhichOneof("value") == "as_double" else float(dp.as_int)
                        t, start = dp.time_unix_nano, dp.start_time_unix_nano
                        if not 0 < t < _MAX_NS or not 0 <= start < _MAX_NS:
                            raise ValueError(f"time_unix_nano {t} / start_time_unix_nano {start} out of range "
                                             "(0 means missing)")
                        if not isfinite(value):
                            raise ValueError(f"{name} value {value} is not a number")
                        if required is not None and required not in self.attributes[attributes]:
                            continue
                        times.append(t)
                        metric_col.append(code)
                        resource_col.append(resource)
                        attrs_col.append(attributes)
                        values.append(value)
                        if t < first:
                            first = t
                        if t > last:
                            last = t
        return (first, last) if last >= 0 else None

    def time_span(self) -> tuple[float | None, float | None]:
        """The first and last point's time, seconds (None without points)."""
        if not self.times:
            return None, None
        import numpy

        times = numpy.frombuffer(self.times, dtype=numpy.int64)
        return int(times.min()) / 1e9, int(times.max()) / 1e9

    def in_time_order(self, first_window_max_s: float, rows: Any = None) -> Iterator[list[MetricPoint]]:
        """The points (``rows``: those a numpy bool mask selects) as batches of one timestamp each, oldest first.

        A series' first gpu.ofu point gets ``start_time_unix_nano`` one interval before it (the
        spacing to the series' next point, when within ``first_window_max_s``), so its first
        window counts as long as the others instead of the jobs default.
        """
        if not self.times:
            return
        import numpy

        all_times = numpy.frombuffer(self.times, dtype=numpy.int64)
        all_metrics = numpy.frombuffer(self.metric, dtype=numpy.int8)
        all_resources = numpy.frombuffer(self.resource, dtype=numpy.int32)
        all_attrs = numpy.frombuffer(self.attrs, dtype=numpy.int32)
        all_values = numpy.frombuffer(self.values, dtype=numpy.float64)
        if rows is None:
            order = numpy.argsort(all_times, kind="stable")
        else:
            selected = numpy.flatnonzero(rows)
            order = selected[numpy.argsort(all_times[selected], kind="stable")]
        ofu = self._codes[OFU_METRIC]
        # Each gpu.ofu series' first time, and the first time after it (times in order, ties kept).
        ofu_order = order[all_metrics[order] == ofu]
        series, ofu_times = all_resources[ofu_order], all_times[ofu_order]
        resources, first_at, which = numpy.unique(series, return_index=True, return_inverse=True)
        later = ofu_times > ofu_times[first_at][which]
        seconds, second_at = numpy.unique(series[later], return_index=True)
        firsts = dict(zip(resources.tolist(), ofu_times[first_at].tolist(), strict=True))
        starts = {r: (firsts[r], 2 * firsts[r] - t1) for r, t1 in zip(seconds.tolist(),
                                                                          ofu_times[later][second_at].tolist(),
                                                                          strict=True)
                  if t1 - firsts[r] <= first_window_max_s * 1e9}
        names, attributes = self.names, self.attributes
        batch: list[MetricPoint] = []
        batch_t = None
        for lo in range(0, len(order), _REPLAY_CHUNK):  # a chunk at a time: a day's points do not fit as lists
            chunk = order[lo:lo + _REPLAY_CHUNK]
            for t, code, res, attrs, value in zip(all_times[chunk].tolist(), all_metrics[chunk].tolist(),
                                                  all_resources[chunk].tolist(), all_attrs[chunk].tolist(),
                                                  all_values[chunk].tolist(), strict=True):
                if t != batch_t:
                    if batch:
                        yield batch
                        batch = []
                    batch_t = t
                start = 0
                if code == ofu and res in starts and t == starts[res][0]:
                    start = starts.pop(res)[1]
                batch.append(MetricPoint(names[code], value, t, attributes[res], attributes[attrs],
                                         start_time_unix_nano=start))
        if batch:
            yield batch


class _Declined(Exception):
    """A line the simdjson walk leaves to the json.loads path."""


_BOM_TEXT, _BOM_BYTES = "\ufeff", b"\xef\xbb\xbf"
_Object: Any = simdjson.Object if simdjson is not None else None
_Array: Any = simdjson.Array if simdjson is not None else None
_here = threading.local()  # a parser per thread: one parses a line at a time
_told = False  # the DEBUG line about pysimdjson missing, once


def _parser() -> Any:
    """This thread's simdjson parser (it keeps its buffers from line to line); a new one where the
    last line's proxies still live (a traceback holding them), which the old one refuses."""
    parser = getattr(_here, "parser", None)
    if parser is None or _in_use(parser):
        parser = _here.parser = simdjson.Parser()
    return parser


def _in_use(parser: Any) -> bool:
    try:
        parser.parse(b"0")  # refused (RuntimeError) while proxies of the last document live
    except RuntimeError:
        return True
    return False


def _array(value: Any) -> Any:
    """The dict walk's ``value or ()`` on a list: anything truthy but a list makes it raise."""
    if not value:
        return ()
    if type(value) is not _Array:
        raise _Declined
    return value


def any_value(value: dict[str, Any]) -> Any:
    """An OTLP/JSON AnyValue as the value :class:`MetricPoint` attributes hold."""
    for key, kind in (("stringValue", str), ("boolValue", bool), ("doubleValue", None)):
        if key in value:
            if kind is not None and not isinstance(value[key], kind):  # found by benchmarks/fuzz.py
                raise ValueError(f"{key} is not a {kind.__name__}: {value[key]!r:.60}")
            return float(value[key]) if key == "doubleValue" else value[key]
    if "intValue" in value:
        return int(value["intValue"])
    for key in ("arrayValue", "kvlistValue", "bytesValue"):
        if key in value:
            return json.dumps(value[key], separators=(",", ":"))
    return None


def json_attributes(key_values: list[dict[str, Any]] | None) -> Attributes:
    """An OTLP/JSON attribute list as sorted Attributes; ValueError for a key that is not a string."""
    for kv in key_values or ():
        if not isinstance(kv.get("key"), str):
            raise ValueError(f"an attribute key is not a string: {kv.get('key')!r:.60}")
    return tuple(sorted((kv["key"], any_value(kv.get("value") or {})) for kv in key_values or ()))


def _json_key(key_values: list[Any]) -> tuple | None:
    """A hashable key of a JSON attribute list, each value with its type (``true`` is not ``1``);
    None where a value is a list or an object (not cached: decoded each time)."""
    try:
        return tuple((kv["key"], *((k, v.__class__, v) for k, v in kv["value"].items())) for kv in key_values)
    except (KeyError, TypeError, AttributeError):
        return None
