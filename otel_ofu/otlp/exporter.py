"""What the ``otlp`` (gRPC) and ``otlphttp`` exporters do: metrics and events out over OTLP.

``export()`` encodes the batch with the OTLP SDK's encoder (points keep their own
timestamps and resources, see :mod:`otel_ofu.otlp.payload`) and hands the
serialized requests to :class:`otel_ofu.delivery.Delivery`, which sends them from a bounded
queue on its own threads. Points go out as OTLP metrics; Batch.events as OTLP logs, built by
:func:`otel_ofu.otlp.codec.events_to_request` (raw protobuf: the SDK's log data classes are still
experimental) and sent over the same channel/session. Settings: docs/components/exporters/otlp.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from otel_ofu.core.model import Batch
from otel_ofu.delivery import BoundedQueue, Delivery, DeliveryOptions, Item, MemoryStore, SqliteStore
from otel_ofu.delivery.retry import SampleRefusal
from otel_ofu.otlp.exporter_config import OtlpExporterConfig, resolve
from otel_ofu.pipeline.component import Context, Exporter
from otel_ofu.pipeline.redact import redact_url


def queue_file(storage: str, component_id: str) -> Path:
    """Where an exporter keeps its queue: one SQLite file per exporter id in the storage dir."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in component_id)
    return Path(storage).expanduser() / f"{safe}.sqlite3"


class OtlpExporter(Exporter):
    def __init__(self, config: OtlpExporterConfig, context: Context):
        super().__init__(config, context)
        self.settings = resolve(config, os.environ)
        self._send_logs = "logs" in self.settings.targets  # events: false or logs_endpoint: none: metrics only
        self.delivery: Delivery | None = None
        self._transport = None

    def _make_transport(self):
        from otel_ofu.otlp.transport import GrpcTransport

        return GrpcTransport(self.settings)

    def start(self) -> None:
        cfg = self.config
        queue_cfg, retry = cfg.sending_queue, cfg.retry_on_failure
        self._transport = self._make_transport()
        queue = None
        if queue_cfg.enabled:
            store = SqliteStore(queue_file(queue_cfg.storage, self.context.component_id)) if queue_cfg.storage \
                else MemoryStore()
            queue = BoundedQueue(store, queue_cfg.queue_size, queue_cfg.sizer)
        options = DeliveryOptions(
            num_consumers=queue_cfg.num_consumers,
            block_on_overflow=queue_cfg.block_on_overflow, block_timeout=float(queue_cfg.block_timeout),
            drain_timeout=float(queue_cfg.drain_timeout), retry_enabled=retry.enabled,
            initial_interval=float(retry.initial_interval), max_interval=float(retry.max_interval),
            max_elapsed_time=float(retry.max_elapsed_time), multiplier=retry.multiplier,
            randomization_factor=retry.randomization_factor, send_timeout=self.settings.timeout)
        self.delivery = Delivery(self.context.component_id, self._transport.send, queue, options,
                                 self.context.telemetry, self.log, split=_split, describe=_describe)
        self.delivery.start()
        if self.settings.insecure_skip_verify:
            self.log.warning("%s: tls.insecure_skip_verify is set: the server's certificate is not checked",
                             self.context.component_id)
        if not self._send_logs:
            why = "events is false" if not self.config.events else "logs_endpoint is none"
            self.log.info("%s: %s: events (ofu.job.start, ofu.job.end, findings) are not sent",
                          self.context.component_id, why)
        where = queue_file(queue_cfg.storage, self.context.component_id) if queue_cfg.storage else "memory"
        self.log.info("%s: exporting to %s (%s, compression %s, queue %s)", self.context.component_id,
                      redact_url(self.settings.targets["metrics"]), "plaintext" if self.settings.insecure else "TLS",
                      self.settings.compression, where if queue_cfg.enabled else "disabled")

    def export(self, batch: Batch) -> None:
        from otel_ofu.otlp.payload import logs_payload, metrics_payload

        if self.delivery is None:
            raise RuntimeError(f"{self.context.component_id} used before start() or after shutdown()")
        metrics = metrics_payload(batch.points_and_rows(), batch.passthrough)  # rows unmade
        if metrics is not None:
            self.delivery.submit("metrics", *metrics)
        if self._send_logs:
            logs = logs_payload(batch.events)
            if logs is not None:
                self.delivery.submit("logs", *logs)

    def saturated(self) -> bool:
        delivery = self.delivery
        return delivery is not None and delivery.saturated()

    def begin_shutdown(self, deadline: float) -> None:
        super().begin_shutdown(deadline)
        if self.delivery is not None:
            self.delivery.begin_shutdown(deadline)

    def shutdown(self) -> None:
        if self.delivery is not None:
            self.delivery.shutdown()
            self.delivery = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None


def _split(item: Item, refusal: SampleRefusal | None) -> list[Item]:
    """A batch the backend refused as too large (``refusal`` None), or for some of its samples, as smaller
    batches (see :func:`split_payload` and :func:`split_refused`)."""
    from otel_ofu.otlp.payload import split_payload, split_refused

    parts = split_payload(item.signal, item.payload) if refusal is None else \
        split_refused(item.signal, item.payload, refusal)
    return [Item(item.signal, payload, count) for payload, count in parts]


def _describe(item: Item) -> list[tuple[str, str]]:
    """The series of a refused batch, for the log line that says which."""
    from otel_ofu.otlp.payload import describe_series

    return describe_series(item.signal, item.payload)


class OtlpHttpExporter(OtlpExporter):
    def _make_transport(self):
        from otel_ofu.otlp.transport import HttpTransport

        return HttpTransport(self.settings)
