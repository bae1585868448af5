"""Every receiver that reads DCGM-shaped input, against the whole corpus in tests/data/real/.

Each capture has its expected OFU and identity beside it (``<capture>.expected.json``), worked
out by hand: OFU_raw = TPA x f_SM / f_ref (f_ref from the spec table, docs/gpus.md), OFU =
OFU_raw x the tile factor (0.973 for an unknown precision on every architecture in
otel_ofu/core/tiles.py's table). The tests below check first that each file's own arithmetic
holds, then that the receiver, through the ``ofu`` processor, gives the same numbers for the
same GPU. tests/data/real/README.md says where each capture comes from.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu.core.model import Batch, GpuSample, MetricPoint
from otel_ofu.otlp import join as otlp_join
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.dcgm_exporter import DcgmExporterReceiver, DcgmExporterReceiverConfig
from otel_ofu.receivers.prometheus import PrometheusReceiver, PrometheusReceiverConfig
from otel_ofu.receivers.replay import ReplayReceiver, ReplayReceiverConfig
from tests import corpus_captures
from tests.e2e_util import PageServer
from tools.collector_layout import as_collector_writes

REAL = Path(__file__).parent / "data" / "real"
PAGES = sorted((REAL / "dcgm-exporter").glob("*.prom"))
DMON = sorted((REAL / "dcgmi-dmon").glob("*.txt"))
COLLECTOR_CAPTURE = corpus_captures.COLLECTOR_CAPTURE
PROMETHEUS_PAGES = sorted((REAL / "prometheus").glob("*.prom"))
# OTLP requests as a source sends them (derived), with their expected values.
OTLP_REQUESTS = sorted(p for p in (REAL / "otlp").glob("*.json") if p.with_name(p.stem + ".expected.json").exists()
                       and not p.name.endswith(".expected.json"))
TOLERANCE = 2e-6  # the expected files carry six decimals


def expected_of(capture: Path) -> dict:
    return json.loads(capture.with_name(capture.stem + ".expected.json").read_text())


def expected_gpus(expected: dict) -> list[dict]:
    return expected.get("gpus") or [g for frame in expected["frames"] for g in frame["gpus"]]


def ofu_points(samples: list[GpuSample]) -> list[MetricPoint]:
    return OfuProcessor(OfuProcessorConfig(), Context("ofu", Telemetry())).process(Batch(samples=samples)).points


def matching(points: list[MetricPoint], name: str, identity: dict[str, str]) -> list[MetricPoint]:
    return [p for p in points if p.name == name and all(dict(p.resource).get(k) == v for k, v in identity.items())]


LEDGER_FIELDS = ("energy_mj", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "nvlink_tx_bytes_per_s",
                 "nvlink_rx_bytes_per_s", "clock_event_ns")


def assert_ledger(samples: list[GpuSample], gpus: list[dict], where: str) -> None:
    """Each expected GPU with a ``ledger`` (issue 34) has exactly those counters in its sample, raw as the page
    gives them: energy in mJ, bytes per second, ns per clock event reason by its loss account cause."""
    for gpu in gpus:
        if "ledger" not in gpu:
            continue
        found = [s for s in samples if all(dict(s.resource_attributes()).get(k) == v
                                           for k, v in gpu["identity"].items())]
        assert len(found) == 1, (where, gpu["identity"])
        for name in LEDGER_FIELDS:  # energy in J as mJ is a product: to its last bit
            value, want = getattr(found[0], name), gpu["ledger"][name]
            assert value == (want if want is None or isinstance(want, dict) else pytest.approx(want, rel=1e-15)), \
                (where, gpu["identity"], name)


def loss_account(points: list[MetricPoint], identity: dict[str, str]) -> dict[str, tuple[float, str | None]]:
    """A GPU's loss parts: part -> (share, cause)."""
    return {dict(p.attributes)["ofu.loss.part"]: (p.value, dict(p.attributes).get("ofu.loss.cause"))
            for p in matching(points, "gpu.ofu.loss", identity)}


def assert_gpus(points: list[MetricPoint], gpus: list[dict], where: str) -> None:
    """Each expected GPU has exactly its OFU (or its drop reason), found by its identity, and its loss
    account where the expected file gives one (its parts, none merged, and their causes)."""
    for gpu in gpus:
        identity = gpu["identity"]
        if "dropped" in gpu:
            assert matching(points, "gpu.ofu", identity) == [], (where, identity)
            (dropped,) = matching(points, "gpu.ofu.dropped", identity)
            assert dict(dropped.attributes)["ofu.drop.reason"] == gpu["dropped"], (where, identity)
        else:
            (ofu,) = matching(points, "gpu.ofu", identity)
            (raw,) = matching(points, "gpu.ofu.raw", identity)
            assert raw.value == pytest.approx(gpu["ofu_raw"], abs=TOLERANCE), (where, identity)
            assert ofu.value == pytest.approx(gpu["ofu"], abs=TOLERANCE), (where, identity)
        (clock,) = matching(points, "gpu.sm.clock.frequency", identity)
        assert clock.value == pytest.approx(gpu["sm_clock_mhz"] * 1e6), (where, identity)
        if "loss" in gpu:
            account = loss_account(points, identity)
            assert {part: share for part, (share, _) in account.items()} == pytest.approx(gpu["loss"], abs=TOLERANCE), (
                where, identity)
            assert {part: account[part][1] for part in gpu["causes"]} == gpu["causes"], (where, identity)


@pytest.mark.parametrize("capture", PAGES + DMON + OTLP_REQUESTS, ids=lambda p: p.name)
def test_the_expected_values_are_the_hand_arithmetic(capture):
    """A typo in an expected file would test nothing: its numbers must follow from its inputs."""
    expected = expected_of(capture)
    assert expected["capture"] == capture.name and expected["source"] and expected["covers"]
    for gpu in expected_gpus(expected):
        if "dropped" in gpu:
            continue
        assert gpu["tpa"] * gpu["sm_clock_mhz"] / gpu["f_ref_mhz"] == pytest.approx(gpu["ofu_raw"], abs=1e-6)
        assert gpu["ofu_raw"] * gpu["tile_factor"] == pytest.approx(gpu["ofu"], abs=TOLERANCE)
        if "loss" in gpu:  # the chain 1 > GR > SM > TPA > raw > OFU, step by step (core/loss.py)
            levels = [1.0, gpu["gr"], gpu["sm"], gpu["tpa"], gpu["ofu_raw"], gpu["ofu"]]
            steps = dict(zip(("engine_idle", "sm_idle", "non_tensor", "clock", "padding"),
                             [a - b for a, b in zip(levels, levels[1:])]))
            assert steps == pytest.approx(gpu["loss"], abs=TOLERANCE)
            assert sum(gpu["loss"].values()) + gpu["ofu"] == pytest.approx(1.0, abs=3 * TOLERANCE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_dcgm_exporter_receiver_reads_every_page(page):
    """A served page, scraped as in production: the OFU and identity of every GPU entity."""
    expected = expected_of(page)
    with PageServer({"/metrics": page.read_bytes()}) as server:
        config = build_config(DcgmExporterReceiverConfig, {"endpoint": f"{server.url}/metrics"})
        receiver = DcgmExporterReceiver(config, Context("dcgm_exporter", Telemetry()), lambda batch: None)
        try:
            batch = receiver.poll() or Batch()
        finally:
            receiver.shutdown()
    assert len(batch.samples) == len(expected["gpus"]), page.name  # one sample per GPU entity, none twice
    assert_gpus(ofu_points(batch.samples), expected["gpus"], page.name)
    assert_ledger(batch.samples, expected["gpus"], page.name)


def scraped_points(page: Path) -> list[MetricPoint]:
    """A page served and scraped by the dcgm_exporter receiver, through the ofu processor."""
    with PageServer({"/metrics": page.read_bytes()}) as server:
        config = build_config(DcgmExporterReceiverConfig, {"endpoint": f"{server.url}/metrics"})
        receiver = DcgmExporterReceiver(config, Context("dcgm_exporter", Telemetry()), lambda batch: None)
        try:
            batch = receiver.poll() or Batch()
        finally:
            receiver.shutdown()
    return ofu_points(batch.samples)


def test_a_page_with_the_dcgm_4_6_names_gives_the_loss_account_of_the_old_names():
    """Issue 31 item 15: DCGM 4.6 renamed 1001-1005 (..._UTIL_RATIO), and dcgm-exporter names a metric after
    its counters CSV; a page written with the new names has the same OFU and the same loss account, part by
    part and with the same causes, as its twin with the old names (both derived from the same CSV,
    tests/data/real/README.md), scraped and as the Collector forwards it."""
    old = REAL / "dcgm-exporter" / "4.6.0-4.8.3_h100_profiling-fields.prom"
    new = REAL / "dcgm-exporter" / "4.6.0-4.8.3_h100_dcgm-4.6-names.prom"
    assert "DCGM_FI_PROF_SM_UTIL_RATIO" in new.read_text() and "DCGM_FI_PROF_SM_ACTIVE" not in new.read_text()
    requests = collector_requests(COLLECTOR_CAPTURE.read_text().splitlines())
    for how, points_of in (("scraped", scraped_points),
                           ("through the Collector", lambda page: ofu_points(otlp_join.split(
                               ExportMetricsServiceRequest.FromString(requests[page.stem].SerializeToString())).samples))):
        old_points, new_points = points_of(old), points_of(new)
        for gpu in expected_of(old)["gpus"]:
            identity = gpu["identity"]
            account = loss_account(new_points, identity)
            assert sorted(account) == ["clock", "engine_idle", "non_tensor", "padding", "sm_idle"], (how, identity)
            assert account == loss_account(old_points, identity), (how, identity)
            assert [p.value for p in matching(new_points, "gpu.ofu", identity)] == [
                p.value for p in matching(old_points, "gpu.ofu", identity)], (how, identity)


@pytest.mark.parametrize("capture", DMON, ids=lambda p: p.name)
def test_replay_reads_every_dmon_capture(capture):
    expected = expected_of(capture)
    got: list[Batch] = []
    config = build_config(ReplayReceiverConfig, {**expected["replay"], "path": str(capture), "speed": "max"})
    receiver = ReplayReceiver(config, Context("replay", Telemetry()), got.append)
    while not receiver.is_finished():
        batch = receiver.poll()
        if batch is not None:
            got.append(batch)
    frames = [b for b in got if b.samples]
    assert len(frames) == len(expected["frames"])
    for number, (batch, frame) in enumerate(zip(frames, expected["frames"], strict=True)):
        assert len(batch.samples) == len(frame["gpus"])
        assert_gpus(ofu_points(batch.samples), frame["gpus"], f"{capture.name} frame {number}")


def collector_requests(lines: list[str]) -> dict[str, ExportMetricsServiceRequest]:
    """The Collector's output, one request per scrape job (named after its page)."""
    by_job: dict[str, ExportMetricsServiceRequest] = {}
    for line in lines:
        request = json_format.Parse(line, ExportMetricsServiceRequest())
        for rm in request.resource_metrics:
            job = next(kv.value.string_value for kv in rm.resource.attributes if kv.key == "service.name")
            by_job.setdefault(job, ExportMetricsServiceRequest()).resource_metrics.append(rm)
    return by_job


def assert_joined(request: ExportMetricsServiceRequest, page: Path) -> None:
    """The join of a page's OTLP, read through protobuf objects and from its bytes, gives the page's GPUs."""
    expected = expected_of(page)
    for wire in (None, request.SerializeToString()):
        copy = ExportMetricsServiceRequest.FromString(request.SerializeToString())
        found = otlp_join.split(copy, wire=wire)
        assert len(found.samples) == len(expected["gpus"]), page.name
        assert_gpus(ofu_points(found.samples), expected["gpus"], page.name)
        assert_ledger(found.samples, expected["gpus"], page.name)




@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_otlp_join_reads_every_page_as_the_collector_forwards_it(page):
    """The Collector's prometheus receiver scraped each page (kept in the corpus, README "made"); its
    OTLP, joined, gives the same OFU and identity as the page scraped directly."""
    assert_joined(collector_requests(COLLECTOR_CAPTURE.read_text().splitlines())[page.stem], page)


@pytest.mark.parametrize("capture", OTLP_REQUESTS, ids=lambda p: p.name)
def test_otlp_join_reads_every_request_a_source_sends(capture):
    """Issue 31 item 16: Google's dcgm receiver (version 2 names) sends GR, SM and DRAM activity beside TPA and
    the clock; the join reads them, so every part of the loss account is there (none merged), from the request
    as protobuf writes it and as the Collector lays it out."""
    request = json_format.Parse(capture.read_text(), ExportMetricsServiceRequest())
    expected = expected_of(capture)
    for wire in (None, request.SerializeToString(), as_collector_writes(request.SerializeToString())):
        copy = ExportMetricsServiceRequest.FromString(request.SerializeToString())
        found = otlp_join.split(copy, wire=wire)
        assert len(found.samples) == len(expected["gpus"]), capture.name
        assert_gpus(ofu_points(found.samples), expected["gpus"], capture.name)
        assert_ledger(found.samples, expected["gpus"], capture.name)
        # The ratios were read and pass through as they came (the ofu processor does not send them again).
        forwarded = ExportMetricsServiceRequest()
        for rm in found.passthrough:
            forwarded.resource_metrics.append(rm if wire is None else rm.message)
        names = {m.name for rm in forwarded.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
        assert {"gpu.dcgm.utilization", "gpu.dcgm.sm.utilization", "gpu.dcgm.memory.bandwidth_utilization"} <= names


def test_otlp_join_reads_what_the_collector_forwards_now(otelcol, tmp_path):
    """The same, remade: this Collector scrapes every page now (tests/corpus_captures.py)."""
    requests = collector_requests(corpus_captures.collector_capture(otelcol, PAGES, tmp_path))
    assert sorted(requests) == sorted(page.stem for page in PAGES)
    for page in PAGES:
        assert_joined(requests[page.stem], page)


@pytest.mark.parametrize("page", PROMETHEUS_PAGES, ids=lambda p: p.name)
def test_prometheus_receiver_reads_every_translators_page(page):
    """A training job's report as each translator writes it (the real programs' pages), served and scraped."""
    expected = expected_of(page)
    with PageServer({"/metrics": page.read_bytes()}) as server:
        receiver = PrometheusReceiver(build_config(PrometheusReceiverConfig, {"endpoint": f"{server.url}/metrics"}),
                                      Context("prometheus", Telemetry()), lambda batch: None)
        try:
            batch = receiver.poll() or Batch()
        finally:
            receiver.shutdown()
    assert {p.name: p.value for p in batch.points} == expected["points"]
    for point in batch.points:
        resource = dict(point.resource)
        assert {k: resource.get(k) for k in expected["identity"]} == expected["identity"], point.name
        if not expected["identity"]:
            assert not set(resource) & {"k8s.pod.name", "host.name", "process.pid"}


def test_a_page_without_tensor_activity_warns_once_naming_the_field_endpoint_and_fix(caplog):
    """Issue 23 item 3: ten scrapes of a page without profiling fields say once, at WARNING, what is
    missing where, and how to turn it on in dcgm-exporter."""
    page = REAL / "dcgm-exporter" / "4.5.3-4.8.2_h100-pcie_no-profiling.prom"
    with PageServer({"/metrics": page.read_bytes()}) as server:
        url = f"{server.url}/metrics"
        receiver = DcgmExporterReceiver(build_config(DcgmExporterReceiverConfig, {"endpoint": url}),
                                        Context("dcgm_exporter", Telemetry()), lambda batch: None)
        with caplog.at_level(logging.DEBUG):
            for _ in range(10):
                batch = receiver.poll() or Batch()
            ofu_points(batch.samples)
        receiver.shutdown()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in
                r.getMessage()]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert url in message
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge" in message  # the counters CSV line to add
    assert "customMetrics" in message and "dcp-metrics-included.csv" in message  # the Helm chart's ways
    assert receiver.missing_fields() == {url: ["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]}
    # The ofu processor's line per dropped window names the input and a time people read.
    (debug,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no OFU for pcie-node-5")]
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in debug and "missing" in debug
    assert re.search(r"ending \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", debug)


def test_the_profiling_fields_the_docs_say_dcgm_exporters_default_counters_carry_are_on_its_page():
    """Issue 31 item 18: docs/otlp-receiver.md said dcgm-exporter's default counters CSV has no profiling
    field, untrue since release 4.0.0 (its etc/default-counters.csv gained the DCP block). The fields the
    docs now name are those of the corpus page derived from that CSV at 4.5.3-4.8.2 (tests/data/real/README.md):
    no more, no fewer."""
    text = " ".join((Path(__file__).parent.parent / "docs" / "otlp-receiver.md").read_text().split())
    claim = re.search(r"dcgm-exporter's default counters CSV \(`etc/default-counters\.csv`\) has carried (.+?) since "
                      r"release 4\.0\.0", text)
    assert claim, "docs/otlp-receiver.md no longer says which profiling fields dcgm-exporter's default counters carry"
    named = set(re.findall(r"`(DCGM_FI_PROF_\w+)`", claim.group(1)))
    page = (REAL / "dcgm-exporter" / "4.5.3-4.8.2_h100_kubernetes.prom").read_text()
    assert named == set(re.findall(r"^# TYPE (DCGM_FI_PROF_\w+) ", page, re.M))
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in named  # what OFU needs
