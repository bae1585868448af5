"""The component model, after the OpenTelemetry Collector's.

Each receiver, processor and exporter is a small class with its own config dataclass and a
:class:`Factory`. A component never knows its neighbours: a receiver gets a ``consumer``
callable, a processor maps a batch to a batch, an exporter takes batches. The service
(:mod:`otel_ofu.service`) wires them from the YAML pipelines and owns their lifecycle:
``start()`` exporters, processors, receivers in that order; ``shutdown()`` the reverse, where
an exporter flushes everything it accepted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.core.model import Batch
from otel_ofu.pipeline.telemetry import Telemetry

Consumer = Callable[[Batch], None]


class StartError(Exception):
    """A component cannot start for a reason outside its config (a file it needs cannot be opened
    now); the message names what and says what to do. ``otel-ofu run`` prints it and exits 1."""


@dataclass
class Context:
    """What the service gives every component besides its config."""

    component_id: str
    telemetry: Telemetry = field(default_factory=Telemetry)
    # Called by a receiver that has ended by itself (a replay at the end of its file), so the
    # service can stop when every such receiver is done (``service.exit_when_done``).
    on_finished: Callable[[], None] | None = None
    # For receivers: the id of an exporter downstream whose sending queue is nearly full, else
    # None. A push receiver refuses (retryably) rather than make it drop accepted data.
    downstream_saturated: Callable[[], str | None] = field(default=lambda: None)

    @property
    def logger(self) -> logging.Logger:
        return logging.getLogger(f"otel_ofu.{self.component_id}")


class Component:
    def __init__(self, config: Any, context: Context):
        self.config = config
        self.context = context
        self.log = context.logger
        self.shutdown_deadline: float | None = None  # time.monotonic() by which shutdown() must return

    def start(self) -> None:
        """Acquire resources (threads, sockets, files). Must not block."""

    def begin_shutdown(self, deadline: float) -> None:
        """The service is stopping: :meth:`shutdown` must return by ``deadline`` (time.monotonic()),
        the end of ``service.shutdown_timeout``; a thread still busy then is left behind (a daemon)."""
        self.shutdown_deadline = deadline

    def time_left(self, at_most: float) -> float:
        """Seconds a wait in :meth:`shutdown` may take: ``at_most``, cut to the shutdown deadline."""
        if self.shutdown_deadline is None:
            return at_most
        return max(0.0, min(at_most, self.shutdown_deadline - time.monotonic()))

    def shutdown(self) -> None:
        """Release resources; exporters flush what they accepted first."""


class Receiver(Component):
    def __init__(self, config: Any, context: Context, consumer: Consumer):
        super().__init__(config, context)
        self.consumer = consumer

    def is_finite(self) -> bool:
        """True for a receiver that ends by itself (a replay without loop); most run until stopped."""
        return False

    def is_finished(self) -> bool:
        """True once a finite receiver has sent everything it will send."""
        return False

    def failure(self) -> str | None:
        """Why a finite receiver ended without sending its data (e.g. a malformed recording), else None."""
        return None

    def notify_finished(self) -> None:
        if self.context.on_finished is not None:
            self.context.on_finished()


class Processor(Component):
    def process(self, batch: Batch) -> Batch:
        return batch

    def flush(self) -> Batch | None:
        """At shutdown, after the receivers stop: what the processor still holds (e.g. job end events)."""
        return None

    def exported(self) -> None:
        """The last batch this processor returned has been handed to every exporter of its pipeline.

        Called before the receiver acknowledges the data; a processor that keeps durable state
        records the batch here (after its outputs are queued, so a crash never loses them).
        A pipeline with such a processor exports under its processing lock, batch by batch.
        """


class Exporter(Component):
    def export(self, batch: Batch) -> None:
        raise NotImplementedError

    def saturated(self) -> bool:
        """True while its sending queue is nearly full: more data would push accepted data out."""
        return False

    def begin_shutdown(self, deadline: float) -> None:
        """The service is stopping: finish by ``deadline`` (time.monotonic()); retry nothing past it.

        Called before the processors' final flush, whose exports must not wait out a full
        retry policy against a backend that is down.
        """
        super().begin_shutdown(deadline)


class PollingReceiver(Receiver):
    """A receiver that calls :meth:`poll` on its own thread every ``interval()`` seconds.

    A poll that raises is logged and the loop carries on: one bad read never stops a
    receiver. Subclasses return a Batch (or None) from ``poll``.
    """

    def __init__(self, config: Any, context: Context, consumer: Consumer):
        super().__init__(config, context, consumer)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def interval(self) -> float:
        return float(getattr(self.config, "collection_interval", 10.0))

    def poll(self) -> Batch | None:
        raise NotImplementedError

    def on_start(self) -> None:
        """Called on the receiver's thread before the first poll."""

    def on_stop(self) -> None:
        """Called on the receiver's thread after the last poll."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.context.component_id, daemon=True)
        self._thread.start()

    @property
    def stopping(self) -> threading.Event:
        return self._stop

    def _run(self) -> None:
        try:
            self.on_start()
        except Exception:
            self.log.exception("%s failed to start", self.context.component_id)
        while not self._stop.is_set():
            try:
                batch = self.poll()
                if batch:
                    self.consumer(batch)
            except Exception:
                self.log.exception("%s: poll failed; retrying next interval", self.context.component_id)
            self._stop.wait(self.interval())
        try:
            self.on_stop()
        except Exception:
            self.log.exception("%s failed to stop cleanly", self.context.component_id)

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.time_left(30))


@dataclass(frozen=True)
class Factory:
    """How the service makes a component of one type: its config class and constructor."""

    type: str
    config_type: type
    create: Callable[..., Component]
    description: str = ""
    # What flows: a receiver's ``output`` ("samples": GPU samples the ofu processor turns into
    # points; "points": metric points ready for exporters; "any": either, as the otlp receiver
    # joins DCGM metrics into samples and passes everything else through). A receiver config may answer per
    # instance with ``output_kind()`` (a replay of OTLP JSON sends points). A processor's
    # ``consumes`` / ``produces`` let the loader check the order of a pipeline's processors.
    output: str = ""
    consumes: str = ""
    produces: str = ""
