"""The ``selftelemetry`` receiver: otel-ofu's own counters and gauges as metrics.

Every component counts into the service's shared :class:`otel_ofu.pipeline.telemetry.Telemetry`
(dropped windows by reason, exporter queue length, sent/retried/dropped, scrape errors,
receiver status). This receiver emits a snapshot of all of them every
``collection_interval`` into its pipelines, so they go wherever the pipeline's exporters
send data (OTLP, Prometheus, a file), under the resource ``service.name=otel-ofu``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from otel_ofu import __version__
from otel_ofu.core.model import HOST_NAME, Batch, attrs
from otel_ofu.pipeline.component import Factory, PollingReceiver
from otel_ofu.pipeline.config import Duration, require


@dataclass
class SelfTelemetryReceiverConfig:
    collection_interval: Duration = field(default_factory=lambda: Duration(10))  # how often a snapshot is emitted

    def validate(self) -> None:
        require(self.collection_interval > 0, "collection_interval", "must be positive")


class SelfTelemetryReceiver(PollingReceiver):
    def on_start(self) -> None:
        self.resource = attrs({"service.name": "otel-ofu", "service.version": __version__,
                               "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
                               HOST_NAME: socket.gethostname()})

    def poll(self) -> Batch | None:
        points = self.context.telemetry.points(self.resource)
        return Batch(points=points) if points else None


FACTORY = Factory("selftelemetry", SelfTelemetryReceiverConfig, SelfTelemetryReceiver,
                  "otel-ofu's own metrics (queue, drops, errors) into a pipeline", output="points")
