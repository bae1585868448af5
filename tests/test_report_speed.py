"""The report's reading path (otel_ofu/report/points.py) reads exactly what the dict walk it
replaced reads (:func:`otel_ofu.report.build.metric_points` building a MetricPoint per point,
kept here as the oracle), from OTLP JSON and from OTLP protobuf: on the corpus, on simulated
recordings with and without the jobs processor, and on random requests (hypothesis); and files
read in several processes give the report one process gives. The simdjson walk of a JSON line
stores exactly the columns the json.loads path stores, and leaves every line it cannot read so
(odd values, duplicate keys, numbers simdjson refuses) to that path, whose errors stay the same.
"""

from __future__ import annotations

import json
import logging
import struct
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu.core.model import MetricPoint, attrs
from otel_ofu.exporters.file import FileExporter, FileExporterConfig
from otel_ofu.jobs.book import FLOPS_METRIC, OFU_METRIC, SHARE_METRIC
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.jobs.loss import LOSS_METRIC
from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp import files
from otel_ofu.pipeline.component import Context
from otel_ofu.processors.jobs import JobsProcessor
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.sim import SimReceiverConfig, build_fleet, window_batch
from otel_ofu.report import build
from otel_ofu.report import points as points_module
from otel_ofu.report.build import ReadOptions, build_report, metric_points, read_file, report_json
from otel_ofu.report.inputs import InputFile
from otel_ofu.report.points import PointStore

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "replay"
# OTLP JSON requests other programs wrote (the Collector's file exporter, its dcgm receiver): tests/data/real/README.md
REAL_OTLP = [ROOT / "tests" / "data" / "real" / "otlp" / name for name in (
    "collector-prometheus-receiver.json", "dcgmreceiver-v1_h100.json", "dcgmreceiver-v2_h100.json")]
NAMES = {OFU_METRIC, FLOPS_METRIC, SHARE_METRIC, LOSS_METRIC, "training.mfu", "sim.gpu.mfu.true"}
START = 1_800_000_000.0


def oracle(path: Path) -> PointStore:
    """The points as the report read them before: json.loads, then a MetricPoint per point."""
    return build.dict_walk_store(path, NAMES)


def replayed(store: PointStore) -> list[list[MetricPoint]]:
    """What the report's JobBook is given: the points in time order, batched by timestamp."""
    return list(store.in_time_order(60.0))


def proto_copy(json_path: Path, out: Path) -> Path:
    """The same requests as the Collector's format: proto writes them (length-prefixed records)."""
    with open(out, "wb") as handle:
        for _, line in files.read_json_lines(json_path):
            body = otlp.from_json_line(line).SerializeToString()
            handle.write(struct.pack(">I", len(body)) + body)
    return out


def simulated(directory: Path, gpus: int = 16, windows: int = 90, jobs: bool = True) -> Path:
    """A simulated fleet's recording as the file exporter writes it: ofu (and jobs) processor output."""
    fleet = build_fleet(SimReceiverConfig(nodes=gpus // 8, gpus_per_node=8), START)
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    tier = JobsProcessor(JobsConfig(), Context("jobs"), clock=lambda: START + fleet.t)
    path = directory / ("fleet.jsonl" if jobs else "raw.jsonl")
    exporter = FileExporter(FileExporterConfig(path=str(path)), Context("file"))
    exporter.start()
    for _ in range(windows):
        batch = ofu.process(window_batch(fleet.step_window(), True))
        exporter.export(tier.process(batch) if jobs else batch)
    if jobs:
        exporter.export(tier.flush())
    exporter.shutdown()
    return path


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> list[Path]:
    directory = tmp_path_factory.mktemp("speed")
    return [DATA / "sim-ofu.jsonl", simulated(directory), simulated(directory, jobs=False)]


def test_json_and_protobuf_read_what_the_dict_walk_read(recordings, tmp_path):
    for path in recordings:
        expected = replayed(oracle(path))
        assert sum(map(len, expected)) > 10
        by_json = read_file(path, NAMES, ReadOptions())
        by_proto = read_file(proto_copy(path, tmp_path / f"{path.stem}.binpb"), NAMES, ReadOptions())
        assert by_json[0].format == "otlp_json" and by_proto[0].format == "otlp_proto"
        assert replayed(by_json[1]) == expected
        assert replayed(by_proto[1]) == expected
        assert (by_json[0].first, by_json[0].last, by_json[0].lines) == (by_proto[0].first, by_proto[0].last,
                                                                          by_proto[0].lines)
        assert by_json[2] == by_proto[2]  # the events


def _without_paths(report: dict) -> dict:
    report.pop("source")
    for source in report["inputs"]:
        source.pop("path"), source.pop("format"), source.pop("compression")
    return report


def test_the_report_is_the_same_from_json_from_protobuf_and_from_several_processes(recordings, tmp_path,
                                                                                    monkeypatch, caplog):
    """Several files read in worker processes (the default for large inputs): the same report as
    one process reading them in turn, and a worker's warnings (a crash's cut tail) said here."""
    fleet = recordings[1]
    lines = fleet.read_bytes().splitlines(keepends=True)
    parts = [tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.binpb"]
    parts[0].write_bytes(b"".join(lines[: len(lines) // 3]))
    parts[1].write_bytes(b"".join(lines[len(lines) // 3: 2 * len(lines) // 3]))
    middle = tmp_path / "c.jsonl"
    middle.write_bytes(b"".join(lines[2 * len(lines) // 3:]))
    proto_copy(middle, parts[2])
    middle.unlink()
    cut = tmp_path / "d.jsonl"
    cut.write_bytes(lines[0][: len(lines[0]) // 2])  # a crash's partial line, alone in its file
    whole = _without_paths(report_json(build_report(fleet)))
    monkeypatch.setattr(build, "PARALLEL_MIN_BYTES", 0)
    reports = {}
    for processes in (1, 3):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            report = build_report([str(tmp_path)], options=ReadOptions(processes=processes))
        assert [r.getMessage() for r in caplog.records if "partly written" in r.getMessage()] == [
            f"{cut}:1: skipping a partly written last line ({len(lines[0]) // 2} characters): the writer stopped "
            "mid-write (a crash?)"]
        reports[processes] = report_json(report)
    assert reports[1] == reports[3]
    split = _without_paths(reports[3])
    assert [s["lines"] for s in split.pop("inputs")] == [len(lines) // 3, len(lines) // 3,
                                                          len(lines) - 2 * (len(lines) // 3), 0]
    whole.pop("inputs")
    assert split == whole


# --- random requests -------------------------------------------------------------------------------

keys = st.sampled_from(["host.name", "hw.id", "gpu.index", "ofu.job.id", "ofu.loss.part", "rank", "flag"])
attribute_values = st.one_of(st.text(max_size=8), st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1),
                             st.floats(allow_nan=False), st.booleans())
attribute_sets = st.dictionaries(keys, attribute_values, max_size=3)  # OTLP: a key once per set
point_values = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                         st.integers(min_value=-(2 ** 53), max_value=2 ** 53))
points = st.fixed_dictionaries({"time": st.integers(min_value=1, max_value=2 ** 63 - 1),
                                "value": point_values, "attributes": attribute_sets})
metrics = st.fixed_dictionaries({"name": st.sampled_from(sorted(NAMES) + ["gpu.other", "job.ofu"]),
                                 "sum": st.booleans(), "points": st.lists(points, min_size=1, max_size=3)})
resources = st.fixed_dictionaries({"attributes": attribute_sets, "metrics": st.lists(metrics, max_size=4)})


def _request(spec: list[dict]) -> ExportMetricsServiceRequest:
    out = []
    for r in spec:
        for m in r["metrics"]:
            for p in m["points"]:
                out.append(MetricPoint(m["name"], p["value"], p["time"], attrs(r["attributes"]),
                                       attrs(p["attributes"]), "1", m["sum"], 0))
    request = ExportMetricsServiceRequest()
    for point in out:  # one ResourceMetrics per point: every point keeps its own value type
        rm = request.resource_metrics.add()
        rm.MergeFrom(otlp.to_request([point]).resource_metrics[0])
        if isinstance(point.value, int):
            dps = rm.scope_metrics[0].metrics[0]
            data = dps.sum if dps.WhichOneof("data") == "sum" else dps.gauge
            data.data_points[0].as_int = point.value
    return request


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.lists(resources, max_size=3))
def test_any_request_is_read_the_same_from_json_and_protobuf_as_by_the_dict_walk(spec):
    request = _request(spec)
    doc = json.loads(otlp.to_json_line(request))
    expected = PointStore(sorted(NAMES))
    for point in metric_points(doc, NAMES):
        expected.add(point)
    by_json, by_proto, by_simdjson = PointStore(sorted(NAMES)), PointStore(sorted(NAMES)), PointStore(sorted(NAMES))
    spans = by_json.add_json_metrics(doc, NAMES), by_proto.add_proto_metrics(request, NAMES)
    read, span = by_simdjson.add_json_line(otlp.to_json_line(request), NAMES)
    assert replayed(by_json) == replayed(by_proto) == replayed(expected)
    assert read is ("resourceMetrics" in doc)  # "{}": not a request (the json.loads path says so)
    assert columns(by_simdjson) == columns(by_json)
    times = list(expected.times)
    assert spans[0] == spans[1] == ((min(times), max(times)) if times else None)
    assert span == spans[0] or not read


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70) | st.floats()
    | st.sampled_from(["NaN", "Infinity", "-1", "1.5", "42", "1800000000000000000", "", "gpu.ofu", "\ud800"])
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(
        st.sampled_from(["key", "value", "name", "asDouble", "asInt", "stringValue", "intValue", "values"]), inner,
        max_size=2), max_leaves=4)
repeated_keys = st.sampled_from(["resourceMetrics", "scopeMetrics", "resource", "attributes", "metrics", "name",
                                 "gauge", "sum", "dataPoints", "asDouble", "asInt", "timeUnixNano", "stringValue"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.lists(resources, min_size=1, max_size=2), data=st.data())
def test_a_mutated_request_is_read_or_refused_by_the_simdjson_walk_as_by_the_json_path(spec, data):
    """Random values put anywhere in a request (strings where numbers go, objects where lists go,
    numbers simdjson refuses, NaN), keys dropped or written twice: the report's reader gives the
    same columns, or the same error, with simdjson as with json.loads alone."""
    doc = json.loads(otlp.to_json_line(_request(spec)))
    slots: list[tuple] = []

    def walk(node):
        for key in (list(node) if isinstance(node, dict) else range(len(node)) if isinstance(node, list) else ()):
            slots.append((node, key))
            walk(node[key])

    walk(doc)
    for _ in range(data.draw(st.integers(min_value=0, max_value=3)) if slots else 0):
        node, key = data.draw(st.sampled_from(slots))
        if isinstance(node, dict) and data.draw(st.booleans()):
            node.pop(key, None)
        else:
            node[key] = data.draw(json_values)
    line = json.dumps(doc, separators=(",", ":"))
    if data.draw(st.booleans()):
        key = data.draw(repeated_keys)
        line = line.replace(f'"{key}":', f'"{key}":{json.dumps(data.draw(json_values))},"{key}":', 1)
    assert _outcome([line], NAMES, simd=True) == _outcome([line], NAMES, simd=False)


# --- the simdjson walk against the json.loads path ----------------------------------------------------

def typed(value):
    """A value with the type of each part (``True`` is not ``1``, ``-0.0`` not ``0.0`` here)."""
    if isinstance(value, tuple):
        return tuple(typed(v) for v in value)
    return type(value).__name__, repr(value)


def columns(store: PointStore) -> tuple:
    """What a store holds, each attribute code as the set it stands for."""
    return (list(store.times), [store.names[c] for c in store.metric], [typed(v) for v in store.values],
            [typed(store.attributes[r]) for r in store.resource], [typed(store.attributes[a]) for a in store.attrs])


def json_path(lines: list[str], names: set[str]) -> tuple[PointStore, list]:
    """The oracle: json.loads and the dict walk of :meth:`PointStore.add_json_metrics`; each line's span."""
    store = PointStore(sorted(names))
    return store, [store.add_json_metrics(json.loads(line), names) for line in lines]


def metric_names(lines: list[str]) -> set[str]:
    return {m.get("name") for line in lines for rm in json.loads(line).get("resourceMetrics") or ()
            for sm in rm.get("scopeMetrics") or () for m in sm.get("metrics") or ()}


def test_the_simdjson_walk_stores_the_json_paths_columns_on_the_corpus(recordings):
    """Every metrics line of the corpus (the real Collector's and dcgm receiver's output, simulated
    recordings) read by simdjson, none left to json.loads, to the same columns; every metric read."""
    assert points_module.simdjson is not None  # pyproject.toml: a dependency
    for path in [*REAL_OTLP, *recordings]:
        lines = [line for _, line in files.read_json_lines(path)]
        metric_lines = [line for line in lines if '"resourceMetrics"' in line[:20]]
        for names in (NAMES, metric_names(metric_lines)):
            store = PointStore(sorted(names))
            read = [store.add_json_line(line, names) for line in metric_lines]
            expected, spans = json_path(metric_lines, names)
            assert read == [(True, span) for span in spans], path
            assert columns(store) == columns(expected), path
        assert len(store) > 10, path  # every metric of the file read
        logs = [line for line in lines if '"resourceLogs"' in line[:20]]
        assert all(store.add_json_line(line, NAMES) == (False, None) for line in logs)  # events: json.loads


def _outcome(lines: list[str], names: set[str], simd: bool):
    """What the report's reader makes of the lines: the columns, lines, time span and events, or its
    error; with simdjson, or with the json.loads path alone (as where pysimdjson is not installed)."""
    store, events, source = PointStore(sorted(names)), [], InputFile(Path("rec.jsonl"))
    items = list(enumerate((line if line.endswith("\n") else line + "\n" for line in lines), 1))
    with mock.patch.object(points_module, "simdjson", points_module.simdjson if simd else None):
        try:
            build._read_otlp(source, items, names, store, events, ReadOptions())
        except Exception as exc:  # noqa: BLE001 (ReportError, or what the json.loads path lets through)
            return type(exc).__name__, str(exc)
    return columns(store), source.lines, source.first, source.last, events


def _line(point: str = '"timeUnixNano":"1800000000000000000","asDouble":0.5', *, name: str = '"gpu.ofu"',
          resource: str = '[{"key":"hw.id","value":{"stringValue":"GPU-1"}}]', metric: str = "") -> str:
    """A metrics request of one gauge point, a part of it replaced."""
    return ('{"resourceMetrics":[{"resource":{"attributes":' + resource + '},"scopeMetrics":[{"metrics":[{"name":'
            + name + "," + metric + '"gauge":{"dataPoints":[{' + point + "}]}}]}]}]}")


T = '"timeUnixNano":"1800000000000000000"'
DATA_POINTS = '"dataPoints":[{' + T + ',"asDouble":0.5}]'
ODD_LINES = {  # line -> whether the simdjson walk reads it (False: the json.loads path does, or refuses it)
    "asDouble NaN": (_line(T + ',"asDouble":"NaN"'), False),
    "asDouble Infinity": (_line(T + ',"asDouble":"Infinity"'), False),
    "asDouble -Infinity": (_line(T + ',"asDouble":"-Infinity"'), False),
    "asDouble as a string": (_line(T + ',"asDouble":"1.5"'), True),
    "asDouble true": (_line(T + ',"asDouble":true'), True),
    "asDouble an object": (_line(T + ',"asDouble":{"a":1}'), False),
    "asDouble null": (_line(T + ',"asDouble":null'), False),
    "asDouble out of range": (_line(T + ',"asDouble":1e400'), False),
    "asInt as a string": (_line(T + ',"asInt":"42"'), True),
    "asInt a number": (_line(T + ',"asInt":42'), True),
    "asInt a uint64": (_line(T + ',"asInt":18446744073709551615'), True),
    "asInt past 64 bits": (_line(T + ',"asInt":123456789012345678901234567890'), False),
    "asInt a fraction": (_line(T + ',"asInt":"4.5"'), False),
    "no value": (_line(T), True),
    "no time": (_line('"asDouble":0.5'), False),
    "time a number": (_line('"timeUnixNano":1800000000000000000,"asDouble":0.5'), True),
    "time past int64": (_line('"timeUnixNano":"9223372036854775808","asDouble":0.5'), False),
    "start time": (_line(T + ',"startTimeUnixNano":"1799999990000000000","asDouble":0.5'), True),
    "negative start": (_line(T + ',"startTimeUnixNano":"-1","asDouble":0.5'), False),
    "other keys": (_line(T + ',"asDouble":0.5,"flags":1,"exemplars":[]'), True),
    "int attribute as a string": (_line(T + ',"asDouble":0.5,"attributes":[{"key":"k","value":{"intValue":"7"}}]'),
                                  True),
    "int attribute a number": (_line(T + ',"asDouble":0.5,"attributes":[{"key":"k","value":{"intValue":7}}]'), True),
    "bool attribute": (_line(T + ',"asDouble":0.5,"attributes":[{"key":"k","value":{"boolValue":true}}]'), True),
    "bool attribute as a string": (_line(T + ',"asDouble":0.5,"attributes":[{"key":"k","value":{"boolValue":"true"}}'
                                         ']'), False),
    "double attribute": (_line(T + ',"asDouble":0.5,"attributes":[{"key":"k","value":{"doubleValue":-0.0}}]'), True),
    "double attribute NaN": (_line(T + ',"asDouble":0.5,"attributes":[{"key":"k","value":{"doubleValue":"NaN"}}]'),
                             True),
    "double attribute out of range": (_line(T + ',"asDouble":0.5,"attributes":[{"key":"k","value":{"doubleValue":'
                                      '1e400}}]'), False),
    "array attribute": (_line(T + ',"asDouble":0.5,"attributes":[{"key":"k","value":{"arrayValue":{"values":['
                              '{"doubleValue":1.0},{"intValue":"2"},{"boolValue":false}]}}}]'), True),
    "kvlist attribute": (_line(T + ',"asDouble":0.5,"attributes":[{"key":"k","value":{"kvlistValue":{"values":['
                               '{"key":"a","value":{"stringValue":"\\u00e9"}}]}}}]'), True),
    "bytes attribute": (_line(T + ',"asDouble":0.5,"attributes":[{"key":"k","value":{"bytesValue":"AAE="}}]'), True),
    "empty attribute value": (_line(T + ',"asDouble":0.5,"attributes":[{"key":"k","value":{}}]'), True),
    "attribute without value": (_line(T + ',"asDouble":0.5,"attributes":[{"key":"k"}]'), True),
    "attribute key a number": (_line(T + ',"asDouble":0.5,"attributes":[{"key":1,"value":{}}]'), False),
    "attribute value repeated": (_line(T + ',"asDouble":0.5,"attributes":[{"key":"k","value":{"stringValue":"a",'
                                       '"stringValue":"b"}}]'), True),
    "attributes an object": (_line(T + ',"asDouble":0.5,"attributes":{"key":"k"}'), False),
    "attributes empty": (_line(T + ',"asDouble":0.5,"attributes":[]'), True),
    "resource attributes missing": (_line(resource="null"), True),
    "resource attributes a string": (_line(resource='"abc"'), False),
    "escaped strings": (_line(resource='[{"key":"h\\u0077.id","value":{"stringValue":"GPU-\\u00e9\\ud83d'
                                       '\\ude00 \\"x\\""}}]'), True),
    "a lone surrogate": (_line(resource='[{"key":"hw.id","value":{"stringValue":"\\ud800"}}]'), False),
    "escaped key": (_line(T + ',"\\u0061sDouble":0.25'), True),
    "asDouble repeated": (_line(T + ',"asDouble":1,"asDouble":2'), False),
    "name repeated": (_line(name='"gpu.other","name":"gpu.ofu"'), False),
    "gauge repeated": (_line(metric='"gauge":{"dataPoints":[]},'), False),
    "name an object": (_line(name='{"a":1}'), False),
    "name a list": (_line(name='["gpu.ofu"]'), False),
    "name a number": (_line(name="1"), True),
    "another metric": (_line(name='"gpu.other"'), True),
    "a sum": (_line().replace('"gauge"', '"sum"'), True),
    "a histogram": (_line().replace('"gauge"', '"histogram"'), True),
    "gauge null": (_line().replace("{" + DATA_POINTS + "}", "null"), False),
    "no data points": (_line().replace('"dataPoints"', '"points"'), True),
    "data point a list": (_line().replace(DATA_POINTS, '"dataPoints":[["asDouble"]]'), False),
    "metric a string": ('{"resourceMetrics":[{"scopeMetrics":[{"metrics":["gpu.ofu"]}]}]}', False),
    "scope a number": ('{"resourceMetrics":[{"scopeMetrics":[7]}]}', False),
    "resource metrics a list of lists": ('{"resourceMetrics":[["resource"]]}', False),
    "data point a string": (_line().replace(DATA_POINTS, '"dataPoints":["asDouble"]'), False),
    "metrics an object": ('{"resourceMetrics":[{"scopeMetrics":[{"metrics":{"name":"gpu.ofu"}}]}]}', False),
    "metrics empty object": ('{"resourceMetrics":[{"scopeMetrics":[{"metrics":{}}]}]}', True),
    "resourceMetrics a string": ('{"resourceMetrics":"x"}', False),
    "resourceMetrics null": ('{"resourceMetrics":null}', True),
    "resourceMetrics repeated": ('{"resourceMetrics":[],' + _line()[1:], False),
    "number out of range elsewhere": (_line(metric='"unit":"1","x":123456789012345678901234567890,'), False),
    "byte order mark": ("\ufeff" + _line(), False),
    "blank": ("   ", False),
    "not an object": ("[1]", False),
    "not JSON": (_line()[:-1], False),
    "NaN literal": (_line(T + ',"asDouble":NaN'), False),
    "logs": ('{"resourceLogs":[]}', False),
}


@pytest.mark.parametrize("case", ODD_LINES)
def test_an_odd_line_is_read_or_refused_as_by_the_json_path(case):
    line, read = ODD_LINES[case]
    assert PointStore(sorted(NAMES)).add_json_line(line, NAMES)[0] is read
    plain = _line()
    assert _outcome([plain, line, plain], NAMES, simd=True) == _outcome([plain, line, plain], NAMES, simd=False)


def test_the_odd_values_read_as_the_json_path_reads_them():
    """A few of the cases above, spelled out (the comparison above would pass were both paths wrong alike)."""
    def attributes_of(line):
        store = PointStore(sorted(NAMES))
        assert store.add_json_line(line, NAMES)[0]
        return store.attributes[store.attrs[0]], store.values[0]

    assert attributes_of(ODD_LINES["bool attribute"][0]) == ((("k", True),), 0.5)
    assert type(attributes_of(ODD_LINES["bool attribute"][0])[0][0][1]) is bool
    assert attributes_of(ODD_LINES["int attribute as a string"][0]) == ((("k", 7),), 0.5)
    assert attributes_of(ODD_LINES["array attribute"][0])[0] == (
        ("k", '{"values":[{"doubleValue":1.0},{"intValue":"2"},{"boolValue":false}]}'),)
    assert attributes_of(ODD_LINES["attribute value repeated"][0])[0] == (("k", "b"),)  # the last, as json.loads
    assert attributes_of(ODD_LINES["asInt as a string"][0])[1] == 42.0
    assert attributes_of(ODD_LINES["asDouble as a string"][0])[1] == 1.5
    assert attributes_of(ODD_LINES["escaped key"][0])[1] == 0.25
    assert _outcome([ODD_LINES["asDouble NaN"][0]], NAMES, simd=True) == (
        "ReportError", "rec.jsonl:1: malformed OTLP metrics: ValueError('gpu.ofu value nan is not a number')")
    assert _outcome([ODD_LINES["asDouble repeated"][0]], NAMES, simd=True)[0][2] == [("float", "2.0")]


def test_a_parser_whose_last_document_is_still_held_is_not_reused():
    """simdjson refuses to parse while proxies of its last document live: a new parser reads the line."""
    held = points_module._parser().parse(_line())["resourceMetrics"]
    store = PointStore(sorted(NAMES))
    assert store.add_json_line(_line(), NAMES) == (True, (1800000000000000000, 1800000000000000000))
    assert len(held) == 1


def test_without_pysimdjson_the_json_path_reads_every_line_and_says_so_once(tmp_path):
    script = (
        "import logging, sys\n"
        "sys.modules['simdjson'] = None  # import simdjson raises ImportError\n"
        "logging.basicConfig(level=logging.DEBUG, format='%(levelname)s %(message)s')\n"
        "from otel_ofu.report.build import ReadOptions, read_file\n"
        f"source, store, events = read_file(__import__('pathlib').Path({str(DATA / 'sim-ofu.jsonl')!r}), "
        f"{sorted(NAMES)!r}, ReadOptions())\n"
        "print(len(store), source.lines)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "simdjson" in line]
    assert said == ["DEBUG pysimdjson is not importable: OTLP JSON lines are read with json.loads"]
    by_simdjson = read_file(DATA / "sim-ofu.jsonl", NAMES, ReadOptions())
    assert done.stdout.split() == [str(len(by_simdjson[1])), str(by_simdjson[0].lines)]


def _events_the_slow_way(doc: dict) -> list:
    request = otlp.from_json_line(json.dumps(doc, separators=(",", ":")))
    return list(otlp.events_from_request(request))


def test_the_jobs_processors_events_are_read_from_the_dict_as_the_protobuf_parser_reads_them(recordings):
    """Every logs line of a recording made behind the jobs processor (job starts and ends, findings): the dict
    walk gives the events the protobuf JSON parser gives, value types included."""
    docs = [json.loads(line) for path in recordings if path.suffix == ".jsonl"
            for _, line in files.read_json_lines(path) if line.startswith('{"resourceLogs"')]
    assert len(docs) >= 2
    names = set()
    for doc in docs:
        fast = build.events_from_json(doc)
        assert fast is not None and fast == _events_the_slow_way(doc)
        assert [[type(v) for _, v in e.attributes] for e in fast] == [
            [type(v) for _, v in e.attributes] for e in _events_the_slow_way(doc)]
        names |= {e.name for e in fast}
    assert {"ofu.job.start", "ofu.job.end"} <= names


@pytest.mark.parametrize("value", [{"arrayValue": {"values": [{"intValue": "1"}]}}, {"kvlistValue": {}},
                                   {"doubleValue": "NaN"}, {"stringValue": 5}, {"intValue": 1.5},
                                   {"boolValue": "true"}, {}, {"stringValue": "a", "intValue": "1"}])
def test_an_event_attribute_the_dict_walk_does_not_take_goes_to_the_protobuf_parser(value):
    doc = {"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [{"logRecords": [
        {"timeUnixNano": "1800000000000000000", "body": {"stringValue": "x"},
         "attributes": [{"key": "event.name", "value": {"stringValue": "ofu.job.end"}},
                        {"key": "k", "value": value}]}]}]}]}
    assert build.events_from_json(doc) is None
    try:
        want = _events_the_slow_way(doc)
    except ValueError:
        with pytest.raises(build.ReportError, match="malformed OTLP logs"):
            build._events("f", 1, doc)
    else:
        assert repr(build._events("f", 1, doc)) == repr(want)  # NaN is not equal to itself
