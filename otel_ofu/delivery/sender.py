"""The delivery loop: consumers take batches from the queue and send them, with retries.

``submit`` never sends (unless the queue is disabled, as in the Collector, where the caller
sends and waits): it enqueues and returns, so receivers keep producing while a backend is
down. Retryable failures are retried with exponential backoff (at least as long as the
backend's Retry-After / RetryInfo) until ``max_elapsed_time``; permanent failures are
dropped at once, logged with the backend's reason and counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from otel_ofu.delivery.queue import BoundedQueue, Item, QueueFull
from otel_ofu.delivery.retry import Backoff, SendResult
from otel_ofu.pipeline.telemetry import Telemetry

QUEUE_SIZE = "otel_ofu.exporter.queue.size"
QUEUE_CAPACITY = "otel_ofu.exporter.queue.capacity"
SENT = "otel_ofu.exporter.sent"
RETRIED = "otel_ofu.exporter.retried"
DROPPED = "otel_ofu.exporter.dropped"

# Values of the ``reason`` attribute of DROPPED.
QUEUE_FULL = "queue_full"  # evicted as the oldest when full, or no room in time (blocking)
PERMANENT_ERROR = "permanent_error"  # the backend refused it for good (400, INVALID_ARGUMENT, ...)
RETRIES_EXHAUSTED = "retries_exhausted"  # still failing after retry_on_failure.max_elapsed_time
RETRY_DISABLED = "retry_disabled"  # a retryable failure with retry_on_failure.enabled false
REJECTED = "rejected"  # refused in a partial success
SHUTDOWN = "shutdown"  # in the memory queue, unsent when shutdown's drain_timeout ran out

_OVERFLOW_LOG_INTERVAL_S = 30.0


@dataclass
class DeliveryOptions:
    queue_enabled: bool = True
    num_consumers: int = 10  # the Collector's; idle consumers block in take() and cost nothing
    block_on_overflow: bool = False
    block_timeout: float = 30.0
    drain_timeout: float = 10.0
    retry_enabled: bool = True
    initial_interval: float = 5.0
    max_interval: float = 30.0
    max_elapsed_time: float = 300.0  # 0: retry until sent or shut down
    multiplier: float = 1.5
    randomization_factor: float = 0.5
    send_timeout: float = 10.0  # one attempt's bound, so shutdown knows how long to join


class Delivery:
    """Sends :class:`Item` s through ``send`` from a bounded queue on consumer threads."""

    def __init__(self, component_id: str, send: Callable[[Item], SendResult], queue: BoundedQueue | None,
                 options: DeliveryOptions, telemetry: Telemetry, log: logging.Logger):
        self.component_id = component_id
        self.queue = queue
        self.options = options
        self.telemetry = telemetry
        self.log = log
        self._send = send
        self._stop = threading.Event()
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._overflow_lock = threading.Lock()
        self._gauge_lock = threading.Lock()
        self._overflow_since_log = 0
        self._overflow_logged_at = 0.0
        # Seam for tests: waits ``seconds`` unless shutting down; True when shutting down.
        self.wait: Callable[[float], bool] = self._stop.wait

    # --- producer side ----------------------------------------------------------------------

    def start(self) -> None:
        if self.queue is None:
            return
        self.telemetry.set(QUEUE_CAPACITY, self.queue.capacity, exporter=self.component_id)
        self._gauge()
        if len(self.queue):
            self.log.info("%s: %d batches from a previous run are queued in %s; sending them",
                          self.component_id, len(self.queue), getattr(self.queue.store, "path", "memory"))
        for n in range(self.options.num_consumers):
            thread = threading.Thread(target=self._consume, name=f"{self.component_id}-send-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(self, signal: str, payload: bytes, count: int) -> None:
        """Accept one serialized request: enqueue it (or, without a queue, send it now)."""
        if self._closing:
            raise RuntimeError(f"{self.component_id}: export after shutdown")
        item = Item(signal, payload, count)
        if self.queue is None:
            if not self._deliver(item):
                self.log.error("%s: dropping %d %s items: shut down while retrying", self.component_id, count, signal)
                self._drop(signal, count, SHUTDOWN)
            return
        try:
            evicted = self.queue.put(item, block=self.options.block_on_overflow,
                                     timeout=self.options.block_timeout)
        except QueueFull:
            evicted = [(signal, count)]
        for ev_signal, ev_count in evicted:
            self._drop(ev_signal, ev_count, QUEUE_FULL)
        if evicted:
            self._log_overflow(len(evicted))
        self._gauge()

    # --- consumer side ----------------------------------------------------------------------

    def _consume(self) -> None:
        """One consumer thread: blocks in ``take`` (no polling) until a batch or shutdown."""
        assert self.queue is not None
        while not self._stop.is_set():
            try:
                item = self.queue.take()
                if item is None:  # only after stop_taking: shutting down
                    return
                if self._deliver(item):
                    self.queue.done(item)
                else:
                    self.queue.release(item)
                self._gauge()
            except Exception:
                if self._stop.is_set():
                    return
                self.log.exception("%s: sending queue consumer failed; carrying on", self.component_id)
                self.wait(1.0)

    def _deliver(self, item: Item) -> bool:
        """Send ``item`` until it is sent or dropped (True), or shutdown interrupts (False)."""
        opts = self.options
        backoff = Backoff(opts.initial_interval, opts.max_interval, opts.multiplier, opts.randomization_factor)
        started = time.monotonic()
        attempts = 0
        while True:
            result = self._attempt(item)
            if result.ok:
                self.telemetry.add(SENT, item.count - result.rejected, exporter=self.component_id, signal=item.signal)
                if result.rejected:
                    self.log.error("%s: backend rejected %d of %d %s items (partial success): %s", self.component_id,
                                   result.rejected, item.count, item.signal, result.detail or "no message")
                    self._drop(item.signal, result.rejected, REJECTED)
                return True
            if not result.retryable:
                self.log.error("%s: dropping %d %s items: permanent error %s: %s", self.component_id, item.count,
                               item.signal, result.reason, result.detail or "no details")
                self._drop(item.signal, item.count, PERMANENT_ERROR)
                return True
            if not opts.retry_enabled:
                self.log.error("%s: dropping %d %s items: %s (%s) and retry_on_failure is disabled",
                               self.component_id, item.count, item.signal, result.reason, result.detail)
                self._drop(item.signal, item.count, RETRY_DISABLED)
                return True
            delay = max(backoff.next(), result.retry_after or 0.0)
            elapsed = time.monotonic() - started
            if opts.max_elapsed_time and elapsed + delay > opts.max_elapsed_time:
                self.log.error("%s: dropping %d %s items: still failing after %.0fs (%s: %s); "
                               "retry_on_failure.max_elapsed_time is %.0fs", self.component_id, item.count,
                               item.signal, elapsed, result.reason, result.detail, opts.max_elapsed_time)
                self._drop(item.signal, item.count, RETRIES_EXHAUSTED)
                return True
            attempts += 1
            self.telemetry.add(RETRIED, 1, exporter=self.component_id, signal=item.signal, reason=result.reason)
            self.log.log(logging.WARNING if attempts == 1 else logging.DEBUG,
                         "%s: sending %d %s items failed (%s: %s); retry %d in %.1fs", self.component_id,
                         item.count, item.signal, result.reason, result.detail, attempts, delay)
            if self.wait(delay):
                return False

    def _attempt(self, item: Item) -> SendResult:
        try:
            return self._send(item)
        except Exception as exc:  # a transport bug must not kill the consumer or lose the batch silently
            self.log.exception("%s: send failed unexpectedly", self.component_id)
            return SendResult.permanent("internal_error", repr(exc))

    # --- shutdown ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Send what is queued for up to ``drain_timeout``, then stop; the disk queue keeps the rest."""
        if self._closing:
            return
        self._closing = True
        if self.queue is None:
            self._stop.set()
            return
        self.queue.wait_empty(self.options.drain_timeout)
        self._stop.set()  # interrupts retry backoffs (self.wait)
        self.queue.stop_taking()  # wakes idle consumers
        for thread in self._threads:
            thread.join(timeout=self.options.send_timeout + 5.0)
        left = self.queue.pending()
        if left and self.queue.store.persistent:
            self.log.warning("%s: %d batches (%d items) not sent within drain_timeout; kept in %s for the next start",
                             self.component_id, len(left), sum(c for _, c in left),
                             getattr(self.queue.store, "path", "?"))
        elif left:
            self.log.error("%s: dropping %d batches (%d items) not sent within drain_timeout (%.0fs) at shutdown; "
                           "configure sending_queue.storage to keep them", self.component_id, len(left),
                           sum(c for _, c in left), self.options.drain_timeout)
            for signal, count in left:
                self._drop(signal, count, SHUTDOWN)
        self._gauge()
        self.queue.close()

    # --- telemetry --------------------------------------------------------------------------

    def _drop(self, signal: str, count: int, reason: str) -> None:
        self.telemetry.add(DROPPED, count, exporter=self.component_id, signal=signal, reason=reason)

    def _gauge(self) -> None:
        # Read and set under one lock: a slower thread must not overwrite a newer length.
        if self.queue is not None:
            with self._gauge_lock:
                self.telemetry.set(QUEUE_SIZE, len(self.queue), exporter=self.component_id)

    def _log_overflow(self, batches: int) -> None:
        """One warning per interval, not one per batch, while the queue overflows."""
        with self._overflow_lock:
            self._overflow_since_log += batches
            now = time.monotonic()
            if self._overflow_logged_at and now - self._overflow_logged_at < _OVERFLOW_LOG_INTERVAL_S:
                return
            count, self._overflow_since_log, self._overflow_logged_at = self._overflow_since_log, 0, now
        policy = "no room within block_timeout" if self.options.block_on_overflow else "dropped the oldest"
        self.log.warning("%s: sending queue full (%d batches): %s; %d batches dropped since the last warning",
                         self.component_id, self.queue.capacity if self.queue else 0, policy, count)
