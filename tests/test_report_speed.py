"""The report's reading path (otel_ofu/report/points.py) reads exactly what the dict walk it
replaced reads (:func:`otel_ofu.report.build.metric_points` building a MetricPoint per point,
kept here as the oracle), from OTLP JSON and from OTLP protobuf: on the corpus, on simulated
recordings with and without the jobs processor, and on random requests (hypothesis); and files
read in several processes give the report one process gives.
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

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
from otel_ofu.report.build import ReadOptions, build_report, metric_points, read_file, report_json
from otel_ofu.report.points import PointStore

DATA = Path(__file__).resolve().parent / "data" / "replay"
NAMES = {OFU_METRIC, FLOPS_METRIC, SHARE_METRIC, LOSS_METRIC, "training.mfu", "sim.gpu.mfu.true"}
START = 1_800_000_000.0


def oracle(path: Path) -> PointStore:
    """The points as the report read them before: json.loads, then a MetricPoint per point."""
    store = PointStore(sorted(NAMES))
    for _, line in files.read_json_lines(path):
        doc = json.loads(line)
        if "resourceMetrics" in doc:
            for point in metric_points(doc, NAMES):
                store.add(point)
    return store


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
    by_json, by_proto = PointStore(sorted(NAMES)), PointStore(sorted(NAMES))
    spans = by_json.add_json_metrics(doc, NAMES), by_proto.add_proto_metrics(request, NAMES)
    assert replayed(by_json) == replayed(by_proto) == replayed(expected)
    times = list(expected.times)
    assert spans[0] == spans[1] == ((min(times), max(times)) if times else None)
