"""Self-telemetry reaches a pipeline: what components count is exported as metrics."""

from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.receivers.selftelemetry import SelfTelemetryReceiver, SelfTelemetryReceiverConfig


def test_snapshot_of_counters_and_gauges_under_the_service_resource():
    telemetry = Telemetry()
    received = []
    receiver = SelfTelemetryReceiver(build_config(SelfTelemetryReceiverConfig, {"collection_interval": "5s"}),
                                     Context("selftelemetry", telemetry), received.append)
    receiver.on_start()
    assert receiver.poll() is None  # nothing counted yet: nothing to send
    telemetry.add("otel_ofu.ofu.dropped", 2, reason="blank")
    telemetry.add("otel_ofu.ofu.dropped", 1, reason="blank")
    telemetry.set("otel_ofu.exporter.queue.size", 7, exporter="otlp")
    points = {p.name: p for p in receiver.poll().points}
    dropped = points["otel_ofu.ofu.dropped"]
    assert dropped.value == 3 and dropped.monotonic and dict(dropped.attributes) == {"reason": "blank"}
    assert points["otel_ofu.exporter.queue.size"].value == 7 and not points["otel_ofu.exporter.queue.size"].monotonic
    assert dict(dropped.resource)["service.name"] == "otel-ofu"
    assert receiver.interval() == 5


# --- every receiver says what state it is in (otel_ofu.receiver.status) -------------------------------

def test_every_receiver_reports_its_state_down_empty_never_seen_and_ok(tmp_path):
    """A dcgm-exporter that is down, one that answers with nothing, one that works, an OTLP receiver
    waiting for senders and a replay that ends: each has one state, 1, and 0 for the ones it left."""
    import threading
    import time

    from otel_ofu.pipeline import registry
    from otel_ofu.pipeline.config import parse_service_config
    from otel_ofu.pipeline.service import Service
    from tests.e2e_util import ROOT, PageServer, free_ports, wait_for

    (closed,) = free_ports(1)
    page = (ROOT / "tests" / "data" / "dcgm-exporter" / "h100.prom").read_bytes()
    with PageServer({"/metrics": page, "/empty": b""}) as exporter:
        scrape = {"collection_interval": "200ms", "exporter_collect_interval": "1s"}
        doc = {"receivers": {"dcgm_exporter/down": {"endpoint": f"http://127.0.0.1:{closed}/metrics", **scrape},
                             "dcgm_exporter/empty": {"endpoint": f"{exporter.url}/empty", **scrape},
                             "dcgm_exporter/good": {"endpoint": f"{exporter.url}/metrics", **scrape},
                             "otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}},
                             "replay": {"path": str(ROOT / "tests" / "data" / "replay" / "sim-ofu.jsonl"),
                                        "speed": 0}},
               "processors": {"ofu": {}},
               "exporters": {"file": {"path": str(tmp_path / "out.jsonl")}},
               "service": {"pipelines": {"metrics": {
                   "receivers": ["dcgm_exporter/down", "dcgm_exporter/empty", "dcgm_exporter/good", "otlp", "replay"],
                   "processors": ["ofu"], "exporters": ["file"]}}}}
        service = Service(parse_service_config(doc, "inline", registry.factories()), exit_when_done=False)
        telemetry = service.telemetry
        receivers = ["dcgm_exporter/down", "dcgm_exporter/empty", "dcgm_exporter/good", "otlp", "replay"]
        assert {r: telemetry.state_of(r) for r in receivers} == dict.fromkeys(receivers, "starting")
        stop = threading.Event()
        runner = threading.Thread(target=service.run, kwargs={"stop": stop})
        runner.start()
        try:
            expected = {"dcgm_exporter/down": "scrape_failed", "dcgm_exporter/empty": "empty",
                        "dcgm_exporter/good": "ok", "otlp": "ok", "replay": "finished"}
            wait_for("every receiver's state", lambda: {r: telemetry.state_of(r) for r in receivers} == expected,
                     timeout=60)
            time.sleep(0.5)  # more rounds: the states hold
            assert {r: telemetry.state_of(r) for r in receivers} == expected
        finally:
            stop.set()
            runner.join(60)
    for receiver, state in expected.items():
        assert telemetry.gauge("otel_ofu.receiver.status", receiver=receiver, state=state) == 1.0
        assert telemetry.gauge("otel_ofu.receiver.status", receiver=receiver, state="starting") == 0.0
