"""The service: builds components from a validated config, wires pipelines, runs them.

As in the Collector, a receiver listed in several pipelines feeds each of them, processors
are instantiated per pipeline (their state is the pipeline's), and an exporter listed in
several pipelines is one instance. Exports to one exporter are serialised by a lock, so an
exporter need not be thread-safe against several pipelines.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

from otel_ofu.core.metrics import RECEIVER_ACCEPTED
from otel_ofu.core.model import Batch
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.component import Component, Context, Exporter, Processor, Receiver, StartError
from otel_ofu.pipeline.config import ConfigError, ServiceConfig, component_type, load_document, parse_service_config
from otel_ofu.pipeline.telemetry import STARTING, Telemetry

log = logging.getLogger("otel_ofu.service")

_MAX_IDLE_WAIT_S = 5.0  # the run loop's longest wait between checks of ``stop``


def load_config(path: str) -> ServiceConfig:
    """Read, substitute and validate a config file; raises ConfigError naming the fault."""
    doc = load_document(path)
    return parse_service_config(doc, str(path), registry.factories())


@dataclass
class _ExporterSlot:
    exporter: Exporter
    lock: threading.Lock = field(default_factory=threading.Lock)


class Pipeline:
    def __init__(self, name: str, processors: list[Processor], exporters: list[tuple[str, _ExporterSlot]],
                 telemetry: Telemetry):
        self.name = name
        self.processors = processors
        self.exporters = exporters
        self.telemetry = telemetry
        self._lock = threading.Lock()
        # Processors told when their batch is exported (Processor.exported): processing, export and
        # that call happen under the lock, so each sees its own batches in order.
        self._notified = [p for p in processors if type(p).exported is not Processor.exported]

    def consume(self, batch: Batch) -> None:
        self._process_and_export(batch, self.processors)

    def flush(self) -> None:
        """At shutdown: each processor's :meth:`Processor.flush` output goes through the rest and out."""
        for i, processor in enumerate(self.processors):
            try:
                with self._lock:
                    batch = processor.flush()
            except Exception:
                log.exception("pipeline %s: flushing processor %s failed", self.name, processor.context.component_id)
                continue
            if batch:
                self._process_and_export(batch, self.processors[i + 1:])

    def _process_and_export(self, batch: Batch, processors: list[Processor]) -> None:
        if self._notified:
            with self._lock:
                self._run(batch, processors)
                for processor in self._notified:
                    if processor in processors:
                        try:
                            processor.exported()
                        except Exception:
                            log.exception("pipeline %s: processor %s failed after export", self.name,
                                          processor.context.component_id)
            return
        self._run(batch, processors, lock=self._lock)

    def _run(self, batch: Batch, processors: list[Processor],
                                     lock: threading.Lock | None = None) -> None:
        with lock or contextlib.nullcontext():
            for processor in processors:
                try:
                    batch = processor.process(batch)
                except Exception:
                    # A failing processor loses this batch for this pipeline only; count and say so.
                    log.exception("pipeline %s: processor %s failed; batch of %d items dropped", self.name,
                                  processor.context.component_id, len(batch))
                    self.telemetry.add("otel_ofu.pipeline.dropped", len(batch), pipeline=self.name,
                                       reason="processor_error")
                    return
        for exporter_id, slot in self.exporters:
            try:
                with slot.lock:
                    slot.exporter.export(batch)
            except Exception:
                log.exception("pipeline %s: exporter %s failed", self.name, exporter_id)
                self.telemetry.add("otel_ofu.pipeline.dropped", len(batch), pipeline=self.name,
                                   reason="exporter_error", exporter=exporter_id)


def _fan_out(pipelines: list[Pipeline]):
    if len(pipelines) == 1:
        return pipelines[0].consume

    def consume(batch: Batch) -> None:
        for pipeline in pipelines:
            # Processors may annotate samples; each pipeline gets its own copies.
            pipeline.consume(Batch([copy.copy(s) for s in batch.samples], list(batch.points), list(batch.passthrough),
                                  list(batch.events), peer=batch.peer))

    return consume


def _counted(consume, telemetry: Telemetry, receiver_id: str):
    """Count what a receiver hands in (otel_ofu.receiver.accepted): the self-telemetry's "points in".

    A receiver is ``starting`` until it hands in its first batch, then ``ok`` unless it says
    otherwise (otel_ofu.receiver.status): one that stays ``starting`` has never read its source.
    """
    telemetry.receiver_state(receiver_id, STARTING)

    def consume_counted(batch: Batch) -> None:
        telemetry.add(RECEIVER_ACCEPTED, len(batch), receiver=receiver_id)
        if telemetry.state_of(receiver_id) == STARTING:
            telemetry.receiver_state(receiver_id, "ok")
        consume(batch)

    return consume_counted


class Service:
    def __init__(self, config: ServiceConfig, telemetry: Telemetry | None = None, exit_when_done: bool | None = None):
        self.config = config
        self.telemetry = telemetry or Telemetry()
        self.exit_when_done = config.exit_when_done if exit_when_done is None else exit_when_done
        self._stop = threading.Event()
        self._started: list[Component] | None = None  # None: start() not called (shutdown stops everything)
        self._starting: Component | None = None  # the component start() is starting
        self._stopped = False
        self.host_name = socket.gethostname()
        factories = registry.factories()
        self.exporters: dict[str, _ExporterSlot] = {}
        self.pipelines: list[Pipeline] = []
        self.receivers: dict[str, Receiver] = {}
        self.processors: list[Processor] = []

        used_exporters = {e for p in config.pipelines for e in p.exporters}
        for exp_id in sorted(used_exporters):
            exporter = self._create(factories["exporters"], exp_id, config.components["exporters"][exp_id])
            self.exporters[exp_id] = _ExporterSlot(exporter)  # type: ignore[arg-type]
        feeds: dict[str, list[Pipeline]] = {}
        for spec in config.pipelines:
            processors = [self._create(factories["processors"], pid, config.components["processors"][pid],
                                       ctx_id=f"{pid}@{spec.name}") for pid in spec.processors]
            self.processors += processors  # type: ignore[arg-type]
            pipeline = Pipeline(spec.name, processors, [(e, self.exporters[e]) for e in spec.exporters],  # type: ignore[arg-type]
                                self.telemetry)
            self.pipelines.append(pipeline)
            for rid in spec.receivers:
                feeds.setdefault(rid, []).append(pipeline)
        for rid, pipelines in feeds.items():
            downstream = {e: self.exporters[e].exporter for p in pipelines for e, _ in p.exporters}
            self.receivers[rid] = self._create(factories["receivers"], rid, config.components["receivers"][rid],  # type: ignore[assignment]
                                               consumer=_counted(_fan_out(pipelines), self.telemetry, rid),
                                               saturated=_saturated(downstream))

    def _create(self, section_factories, comp_id: str, cfg, ctx_id: str | None = None, saturated=None,
                **kwargs) -> Component:
        factory = section_factories[component_type(comp_id)]
        context = Context(component_id=ctx_id or comp_id, telemetry=self.telemetry,
                          on_finished=self._receiver_finished)
        if saturated is not None:
            context.downstream_saturated = saturated
        return factory.create(cfg, context, **kwargs)

    def _receiver_finished(self) -> None:
        """A finite receiver ended: with exit_when_done, stop once all of them have."""
        for rid, receiver in self.receivers.items():
            if receiver.is_finite() and receiver.is_finished():
                self.telemetry.receiver_state(rid, "failed" if receiver.failure() is not None else "finished")
        if not self.exit_when_done:
            return
        finite = [r for r in self.receivers.values() if r.is_finite()]
        if finite and all(r.is_finished() for r in finite):
            log.info("every finite receiver is done (%s): stopping", ", ".join(
                rid for rid, r in self.receivers.items() if r.is_finite()))
            self._stop.set()

    def failures(self) -> dict[str, str]:
        """Finite receivers that ended without sending their data, and why (for the exit status)."""
        return {rid: why for rid, r in self.receivers.items() if (why := r.failure()) is not None}

    def start(self) -> None:
        """Exporters, then processors, then receivers. When one cannot start, the service stops
        what did, as a run stops (:meth:`_stop_components`), and raises: nothing is left running, and a
        processor's final flush reaches only exporters that are running."""
        self._started = []
        try:
            exporters = [slot.exporter for slot in self.exporters.values()]
            for group in (exporters, self.processors, list(self.receivers.values())):
                for component in group:
                    self._starting = component
                    _start(component)
                    self._started.append(component)
        except BaseException:
            self._stopped = True
            self._stop_components(time.monotonic() + self.config.shutdown_timeout)
            raise
        finally:
            self._starting = None

    def shutdown(self) -> None:
        """Receivers first (no new data), then processors (their final flush), then exporters.

        Bounded by ``service.shutdown_timeout``: the exporters learn the deadline before the
        final flush, so its exports (job-end metrics, events) are not retried past it, and
        each exporter's drain ends by it; what could not be delivered is logged and counted.
        A second call, or one after a start that failed (which stopped what it started), does nothing.
        """
        if self._stopped:
            return
        self._stopped = True
        started = time.monotonic()
        self._stop_components(started + self.config.shutdown_timeout)
        took = time.monotonic() - started
        if took > self.config.shutdown_timeout:
            log.warning("stopping took %.1fs, more than service.shutdown_timeout (%.0fs)", took,
                        self.config.shutdown_timeout)
        else:
            log.info("stopped in %.1fs", took)

    def _stop_components(self, deadline: float) -> None:
        """Stop the components that started (all of them after :meth:`start`) and the one whose
        start failed, which may hold part of what it acquired. The processors flush into the
        exporters only when every processor and exporter is running: a start stops at the first
        failure, so otherwise no data has flowed (and a flush would meet a stopped exporter)."""
        started = self._started if self._started is not None else [
            *(s.exporter for s in self.exporters.values()), *self.processors, *self.receivers.values()]
        running = {id(c) for c in started}
        stopping = running | ({id(self._starting)} if self._starting is not None else set())
        exporters = [s.exporter for s in self.exporters.values() if id(s.exporter) in stopping]
        receivers = [r for r in self.receivers.values() if id(r) in stopping]
        processors = [p for p in self.processors if id(p) in stopping]
        # Exporters first, so that a receiver blocked in an export (no sending queue, backend down) is freed.
        for component in [*exporters, *receivers, *processors]:
            try:
                component.begin_shutdown(deadline)
            except Exception:
                log.exception("%s failed to prepare for shutdown", component.context.component_id)
        for receiver in receivers:
            _safe_shutdown(receiver)
        if all(id(c) in running for c in [*self.processors, *(s.exporter for s in self.exporters.values())]):
            for pipeline in self.pipelines:
                pipeline.flush()
        for component in [*processors, *exporters]:
            _safe_shutdown(component)

    def run(self, duration: float | None = None, stop: threading.Event | None = None) -> None:
        """Run until ``duration`` seconds pass, ``stop`` is set, or SIGINT/SIGTERM arrives."""
        stop = self._stop = stop or self._stop
        restore = _install_signal_handlers(stop)
        try:
            for warning in self.config.warnings:
                log.warning("config: %s", warning)
            self.start()  # when a component cannot start, what started is stopped and it raises
        except BaseException:
            restore()
            raise
        try:
            log.info("otel-ofu running: %d pipeline(s), receivers %s", len(self.pipelines), ", ".join(self.receivers))
            if self.exit_when_done:
                if not any(r.is_finite() for r in self.receivers.values()):
                    log.warning("exit_when_done: no receiver ends by itself (only a replay without loop does); "
                                "running until stopped")
                else:
                    self._receiver_finished()  # one may have finished while starting
            deadline = time.monotonic() + duration if duration else None
            while not stop.is_set():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                # The signal handler sets ``stop`` and interrupts this wait (Linux delivers a
                # kill(pid) to the main thread); the bound only covers a signal that another
                # thread took. Not a 1 s poll: an idle node daemon should not wake for nothing.
                stop.wait(min(remaining, _MAX_IDLE_WAIT_S) if remaining is not None else _MAX_IDLE_WAIT_S)
        finally:
            log.info("otel-ofu shutting down")
            self.shutdown()
            restore()


def _saturated(exporters: dict[str, Exporter]):
    def first_saturated() -> str | None:
        for exporter_id, exporter in exporters.items():
            if exporter.saturated():
                return exporter_id
        return None

    return first_saturated


def _start(component: Component) -> None:
    """Start one component; a failure is a StartError naming it (``run`` prints it, no traceback)."""
    try:
        component.start()
    except (ConfigError, StartError):
        raise
    except Exception as exc:
        log.debug("%s failed to start", component.context.component_id, exc_info=True)
        what = str(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
        raise StartError(f"{component.context.component_id}: {what}") from exc


def _safe_shutdown(component: Component) -> None:
    try:
        component.shutdown()
    except Exception:
        log.exception("%s failed to shut down cleanly", component.context.component_id)


def _install_signal_handlers(stop: threading.Event):
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, _frame):
        if stop.is_set():  # a second signal: the user insists
            raise KeyboardInterrupt
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    for sig in previous:
        signal.signal(sig, handler)

    def restore():
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


__all__ = ["ConfigError", "Service", "load_config"]
