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
