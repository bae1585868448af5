"""The delivery loop: consumers take batches from the queue and send them, with retries.

``submit`` never sends (unless the queue is disabled, as in the Collector, where the caller
sends and waits): it enqueues and returns, so receivers keep producing while a backend is
down. Retryable failures are retried with exponential backoff (at least as long as the
backend's Retry-After / RetryInfo) until ``max_elapsed_time``; permanent failures are
dropped at once, logged with the backend's reason and counted; a batch the backend refuses
as too large is split in two and each half sent on its own. A batch refused for some of its
samples (a duplicate or out-of-order sample: Prometheus refuses the whole request) is split
the same way, again and again, until what is refused is the samples themselves: those are
dropped, counted (``sample_refused``) and their series logged once; the rest is sent.

Shutdown is bounded: :meth:`Delivery.begin_shutdown` sets a deadline after which nothing is
retried (the service's ``shutdown_timeout``), and :meth:`Delivery.shutdown` drains the queue
for at most ``drain_timeout`` within it, then says what it could not deliver.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from otel_ofu.delivery.queue import BoundedQueue, Item, QueueFull, QueueStorageError
from otel_ofu.delivery.retry import Backoff, SampleRefusal, SendResult
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
SAMPLE_REFUSED = "sample_refused"  # the backend refused these samples (duplicate, out of order, too old)
SHUTDOWN = "shutdown"  # not sent by the shutdown deadline (memory queue, or no queue)
STORAGE_ERROR = "storage_error"  # the disk queue could not store or read it (disk full, I/O error)

SATURATED_FRACTION = 0.9  # see Delivery.saturated
_OVERFLOW_LOG_INTERVAL_S = 30.0
_FAILING_LOG_INTERVAL_S = 60.0  # while a backend keeps failing, one summary per interval
_JOIN_GRACE_S = 5.0  # beyond one attempt's timeout, how long shutdown waits for a consumer
_MAX_LOGGED_SERIES = 4096  # series whose refusal was logged, remembered so that each is logged once

# What _deliver decided for a batch.
_DONE = "done"  # sent, or dropped for good: forget it
_RELEASE = "release"  # not sent, shutting down: keep it (disk) or count it (memory)


@dataclass
class DeliveryOptions:
    """How a :class:`Delivery` sends (sending_queue and retry_on_failure settings). Whether there is a
    queue at all is the ``queue`` given beside it (None: each batch sent inline)."""

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


Send = Callable[[Item, float], SendResult]  # (batch, timeout in seconds) -> outcome
# A refused batch -> two or more smaller ones ([item] or [] if it cannot be split); the refusal says which
# samples the backend named (None: refused as too large).
Split = Callable[[Item, SampleRefusal | None], list[Item]]
Describe = Callable[[Item], list[tuple[str, str]]]  # a batch's (series, time and value), for a log line


class Delivery:
    """Sends :class:`Item` s through ``send`` from a bounded queue on consumer threads."""

    def __init__(self, component_id: str, send: Send, queue: BoundedQueue | None, options: DeliveryOptions,
                 telemetry: Telemetry, log: logging.Logger, split: Split | None = None,
                 describe: Describe | None = None):
        self.component_id = component_id
        self.queue = queue
        self.options = options
        self.telemetry = telemetry
        self.log = log
        self._send = send
        self._split = split
        self._describe = describe
        self._refused_logged: set[str] = set()  # series whose refused samples were logged
        self._stop = threading.Event()
        self._closing = False
        self._deadline: float | None = None  # monotonic; set by begin_shutdown
        self._threads: list[threading.Thread] = []
        self._overflow_lock = threading.Lock()
        self._gauge_lock = threading.Lock()
        self._overflow_since_log = 0
        self._overflow_logged_at = 0.0
        # Backend health, for one warning when it starts failing and one line when it recovers.
        self._health_lock = threading.Lock()
        self._failing_since: float | None = None
        self._failed_attempts = 0
        self._failure_logged_at = 0.0
        # Sends in progress (consumer thread -> batch), and those shutdown gave up waiting for.
        self._sending: dict[int, Item] = {}
        self._abandoned: set[int] = set()
        self._close_when_idle = False
        self._shutdown_losses: Counter[str] = Counter()  # signal -> items not delivered at shutdown
        self._wakeup = threading.Condition()  # interrupts retry waits at begin_shutdown and stop
        # Seam for tests: waits ``seconds`` (less when interrupted); True when stopping.
        self.wait: Callable[[float], bool] = self._wait

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
            self._deliver_inline(item)
            return
        try:
            evicted = self.queue.put(item, block=self.options.block_on_overflow, timeout=self.options.block_timeout)
        except QueueFull as exc:
            if str(exc):
                self.log.error("%s: dropping %d %s items: %s", self.component_id, count, signal, exc)
            evicted = [(signal, count)]
        except QueueStorageError as exc:
            self.log.error("%s: dropping %d %s items: the sending queue %s failed: %s", self.component_id, count,
                           signal, getattr(self.queue.store, "path", ""), exc.__cause__ or exc)
            self._drop(signal, count, STORAGE_ERROR)
            evicted = []
        for ev_signal, ev_count in evicted:
            self._drop(ev_signal, ev_count, QUEUE_FULL)
        if evicted:
            self._log_overflow(len(evicted))
        self._gauge()

    def _deliver_inline(self, item: Item) -> None:
        """No queue: send on the caller's thread, splitting refused batches, until done or shut down."""
        outcome = self._deliver(item)
        if isinstance(outcome, list):
            for part in outcome:
                self._deliver_inline(part)
        elif outcome == _RELEASE:
            self.log.error("%s: dropping %d %s items: shut down before they could be sent", self.component_id,
                           item.count, item.signal)
            self._drop(item.signal, item.count, SHUTDOWN)

    def saturated(self) -> bool:
        """The queue is at least SATURATED_FRACTION full: a push receiver should refuse, not make it evict.

        The margin leaves room for the requests already in flight when the receiver checked.
        """
        queue = self.queue
        return queue is not None and queue.used() >= SATURATED_FRACTION * queue.capacity

    # --- consumer side ----------------------------------------------------------------------

    def _consume(self) -> None:
        """One consumer thread: blocks in ``take`` (no polling) until a batch or shutdown."""
        assert self.queue is not None
        me = threading.get_ident()
        while not self._stop.is_set():
            try:
                try:
                    item = self.queue.take()
                except QueueStorageError as exc:
                    self.log.error("%s: %s; dropping it", self.component_id, exc)
                    for signal, count in exc.lost:
                        self._drop(signal, count, STORAGE_ERROR)
                    continue
                if item is None:  # only after stop_taking: shutting down
                    return
                with self._health_lock:
                    self._sending[me] = item
                try:
                    outcome = self._deliver(item)
                finally:
                    with self._health_lock:
                        self._sending.pop(me, None)
                        abandoned = me in self._abandoned
                self._settle(item, outcome, abandoned)
                self._gauge()
            except Exception:
                if self._stop.is_set():
                    return
                self.log.exception("%s: sending queue consumer failed; carrying on", self.component_id)
                self.wait(1.0)

    def _settle(self, item: Item, outcome: str | list[Item], abandoned: bool) -> None:
        assert self.queue is not None
        if isinstance(outcome, list) and abandoned:
            outcome = _RELEASE  # shutdown already accounted for this batch as one: keep it whole
        if isinstance(outcome, list):
            try:
                self.queue.replace(item, outcome)
                return
            except QueueStorageError as exc:
                self.log.error("%s: dropping %d %s items: %s", self.component_id, item.count, item.signal, exc)
                self._drop(item.signal, item.count, STORAGE_ERROR)
                outcome = _DONE
        if outcome == _DONE:
            self.queue.done(item)
        else:
            self.queue.release(item)
        if abandoned:
            self._straggler_finished(item, outcome == _DONE)

    def _deliver(self, item: Item) -> str | list[Item]:
        """Send ``item`` until it is sent or dropped (_DONE), split (the parts), or shutdown stops it (_RELEASE)."""
        opts = self.options
        backoff = Backoff(opts.initial_interval, opts.max_interval, opts.multiplier, opts.randomization_factor)
        started = time.monotonic()
        attempts = 0
        while True:
            timeout = self._attempt_timeout()
            if timeout is None:
                return self._past_deadline(item, None)
            result = self._attempt(item, timeout)
            if result.ok:
                self._backend_ok()
                self.telemetry.add(SENT, item.count - result.rejected, exporter=self.component_id, signal=item.signal)
                if result.rejected:
                    self.log.error("%s: backend rejected %d of %d %s items (partial success): %s", self.component_id,
                                   result.rejected, item.count, item.signal, result.detail or "no message")
                    self._drop(item.signal, result.rejected, REJECTED)
                return _DONE
            if result.too_large or result.refusal is not None:
                refusal = None if result.too_large else result.refusal
                parts = self._split(item, refusal) if self._split is not None and item.count > 1 else [item]
                if len(parts) > 1:
                    if result.too_large:
                        self.log.warning("%s: the backend refused %d %s items as too large (%s: %s); sending them "
                                         "as %d smaller requests", self.component_id, item.count, item.signal,
                                         result.reason, result.detail or "no details", len(parts))
                    else:
                        self.log.debug("%s: the backend refused %d %s items for some of their samples (%s: %s); "
                                       "sending them as %d requests to set those apart", self.component_id,
                                       item.count, item.signal, result.reason, result.detail, len(parts))
                    return parts
                if refusal is not None:  # these are the samples it refuses
                    self._refused(item, result)
                    return _DONE
            if not result.retryable:
                self.log.error("%s: dropping %d %s items: permanent error %s: %s", self.component_id, item.count,
                               item.signal, result.reason, result.detail or "no details")
                self._drop(item.signal, item.count, PERMANENT_ERROR)
                return _DONE
            self._backend_failed(result)
            if not opts.retry_enabled:
                self.log.error("%s: dropping %d %s items: %s (%s) and retry_on_failure is disabled",
                               self.component_id, item.count, item.signal, result.reason, result.detail)
                self._drop(item.signal, item.count, RETRY_DISABLED)
                return _DONE
            delay = max(backoff.next(), result.retry_after or 0.0)
            now = time.monotonic()
            elapsed = now - started
            if opts.max_elapsed_time and elapsed + delay > opts.max_elapsed_time:
                self.log.error("%s: dropping %d %s items: still failing after %.0fs (%s: %s); "
                               "retry_on_failure.max_elapsed_time is %.0fs", self.component_id, item.count,
                               item.signal, elapsed, result.reason, result.detail, opts.max_elapsed_time)
                self._drop(item.signal, item.count, RETRIES_EXHAUSTED)
                return _DONE
            if self._deadline is not None and now + delay >= self._deadline:
                return self._past_deadline(item, result)
            attempts += 1
            self.telemetry.add(RETRIED, 1, exporter=self.component_id, signal=item.signal, reason=result.reason)
            self.log.debug("%s: sending %d %s items failed (%s: %s); retry %d in %.1fs", self.component_id,
                           item.count, item.signal, result.reason, result.detail, attempts, delay)
            if self.wait(delay):
                return _RELEASE

    def _refused(self, item: Item, result: SendResult) -> None:
        """Samples the backend refuses, set apart from their batch (whose other samples go on their own):
        counted, and each series logged once."""
        self._drop(item.signal, item.count, SAMPLE_REFUSED)
        series = self._describe(item) if self._describe is not None else []
        said = ", ".join(f"{name} at {when}" for name, when in series) or "?"
        new = {name for name, _ in series} - self._refused_logged
        if series and not new:
            self.log.debug("%s: the backend refused %d %s items again: %s", self.component_id, item.count,
                           item.signal, said)
            return
        if len(self._refused_logged) >= _MAX_LOGGED_SERIES:
            self._refused_logged.clear()
        self._refused_logged |= new
        more = f" and {item.count - len(series)} more" if item.count > len(series) else ""
        self.log.error("%s: dropping %d %s items the backend refuses (%s: %s); the other items of their batch are "
                       "sent on their own. Refused: %s%s. Logged once per series; counted in %s{reason=%s}",
                       self.component_id, item.count, item.signal, result.reason, result.detail or "no details",
                       said, more, DROPPED, SAMPLE_REFUSED)

    def _attempt_timeout(self) -> float | None:
        """One attempt's timeout: ``send_timeout``, cut to what is left before the shutdown deadline."""
        if self._deadline is None:
            return self.options.send_timeout
        remaining = self._deadline - time.monotonic()
        return min(self.options.send_timeout, remaining) if remaining > 0.05 else None

    def _past_deadline(self, item: Item, last: SendResult | None) -> str:
        """The shutdown deadline leaves no time for another attempt."""
        if self.queue is not None:
            # shutdown() keeps it on disk or counts it; until then this consumer rests (no retry loop).
            if self._deadline is not None:
                self.wait(max(0.2, self._deadline - time.monotonic()))
            return _RELEASE
        why = f" (last error {last.reason}: {last.detail})" if last is not None else ""
        self.log.error("%s: dropping %d %s items: not sent before the shutdown deadline%s", self.component_id,
                       item.count, item.signal, why)
        self._drop(item.signal, item.count, SHUTDOWN)
        return _DONE

    def _attempt(self, item: Item, timeout: float) -> SendResult:
        try:
            return self._send(item, timeout)
        except Exception as exc:  # a transport bug must not kill the consumer or lose the batch silently
            self.log.exception("%s: send failed unexpectedly", self.component_id)
            return SendResult.permanent("internal_error", repr(exc))

    # --- backend health ---------------------------------------------------------------------

    def _backend_failed(self, result: SendResult) -> None:
        """One warning when sending starts failing, then one summary per minute (not one per batch)."""
        now = time.monotonic()
        with self._health_lock:
            self._failed_attempts += 1
            first = self._failing_since is None
            if first:
                self._failing_since = self._failure_logged_at = now
            summary = not first and now - self._failure_logged_at >= _FAILING_LOG_INTERVAL_S
            if summary:
                self._failure_logged_at = now
            attempts, since = self._failed_attempts, self._failing_since or now
        if first:
            self.log.warning("%s: sending failed (%s: %s); retrying with backoff. Until it recovers, a summary "
                             "is logged every %.0fs", self.component_id, result.reason, result.detail or "no details",
                             _FAILING_LOG_INTERVAL_S)
        elif summary:
            self.log.warning("%s: still failing after %.0fs: %d attempts failed, %s waiting; last error %s: %s",
                             self.component_id, now - since, attempts, self._waiting_text(),
                             result.reason, result.detail or "no details")

    def _backend_ok(self) -> None:
        with self._health_lock:
            since, attempts = self._failing_since, self._failed_attempts
            if since is None:
                return
            self._failing_since, self._failed_attempts = None, 0
        self.log.info("%s: the backend accepts data again after %.0fs of failures (%d failed attempts); %s to send",
                      self.component_id, time.monotonic() - since, attempts, self._waiting_text())

    def _waiting_text(self) -> str:
        if self.queue is None:
            return "no queue"
        return f"{len(self.queue)} batches"

    # --- shutdown ---------------------------------------------------------------------------

    def _wait(self, seconds: float) -> bool:
        with self._wakeup:
            if not self._stop.is_set():
                self._wakeup.wait(seconds)
        return self._stop.is_set()

    def _interrupt(self) -> None:
        with self._wakeup:
            self._wakeup.notify_all()

    def begin_shutdown(self, deadline: float) -> None:
        """From now on nothing is retried past ``deadline`` (time.monotonic()); sends still go out.

        A retry wait in progress is cut short, so a batch waiting out a long backoff gets one
        last attempt now rather than none (or a wait past the deadline).
        """
        self._deadline = deadline if self._deadline is None else min(self._deadline, deadline)
        self._interrupt()

    def shutdown(self) -> None:
        """Send what is queued for up to ``drain_timeout`` (and the deadline), then stop.

        The disk queue keeps what was not sent; the memory queue counts it as dropped. A send
        still running when its consumer could not be joined (a backend answering byte by byte)
        is a straggler: its batch is counted when it ends, and the disk queue stays open for it,
        so a batch it does send is not sent again after a restart.
        """
        if self._closing:
            return
        self._closing = True
        if self.queue is None:
            self._stop.set()
            self._interrupt()
            self._report_losses()
            return
        drain = self.options.drain_timeout
        if self._deadline is not None:
            drain = max(0.0, min(drain, self._deadline - time.monotonic()))
        self.queue.wait_empty(drain)
        self._stop.set()
        self._interrupt()  # ends retry backoffs (self.wait)
        self.queue.stop_taking()  # wakes idle consumers
        join_until = time.monotonic() + self.options.send_timeout + _JOIN_GRACE_S
        if self._deadline is not None:
            join_until = min(join_until, max(self._deadline, time.monotonic() + 1.0))
        for thread in self._threads:
            thread.join(timeout=max(0.0, join_until - time.monotonic()))
        with self._health_lock:
            stragglers = list(self._sending.values())
            self._abandoned.update(self._sending)
            self._close_when_idle = bool(stragglers)
        if stragglers:
            self.log.warning("%s: %d sends (%d items) still in progress at shutdown; each is counted, and its "
                             "outcome logged, when it ends", self.component_id, len(stragglers),
                             sum(item.count for item in stragglers))
        left = self.queue.pending(exclude={item.id for item in stragglers})
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
        self._report_losses()
        if not stragglers:
            self.queue.close()

    def _straggler_finished(self, item: Item, settled: bool) -> None:
        """A send that outlived shutdown ended: count it once, and close the queue after the last."""
        assert self.queue is not None
        if not settled and not self.queue.store.persistent:
            self._drop(item.signal, item.count, SHUTDOWN)
        self.log.info("%s: a send still in progress at shutdown ended: %d %s items %s", self.component_id,
                      item.count, item.signal, "settled" if settled else
                      ("kept for the next start" if self.queue.store.persistent else "dropped"))
        with self._health_lock:
            last = self._close_when_idle and not self._sending
            if last:
                self._close_when_idle = False
        if last:
            self.queue.close()

    def _report_losses(self) -> None:
        if self._shutdown_losses:
            lost = ", ".join(f"{n} {signal} items" for signal, n in sorted(self._shutdown_losses.items()))
            self.log.error("%s: shut down without delivering %s (counted in %s, reason=%s)", self.component_id,
                           lost, DROPPED, SHUTDOWN)

    # --- telemetry --------------------------------------------------------------------------

    def _drop(self, signal: str, count: int, reason: str) -> None:
        self.telemetry.add(DROPPED, count, exporter=self.component_id, signal=signal, reason=reason)
        if reason == SHUTDOWN:
            self._shutdown_losses[signal] += count

    def _gauge(self) -> None:
        # Read and set under one lock: a slower thread must not overwrite a newer length.
        if self.queue is not None:
            with self._gauge_lock:
                self.telemetry.set(QUEUE_SIZE, self.queue.used(), exporter=self.component_id)

    def _log_overflow(self, batches: int) -> None:
        """One warning per interval, not one per batch, while the queue overflows."""
        with self._overflow_lock:
            self._overflow_since_log += batches
            now = time.monotonic()
            if self._overflow_logged_at and now - self._overflow_logged_at < _OVERFLOW_LOG_INTERVAL_S:
                return
            count, self._overflow_since_log, self._overflow_logged_at = self._overflow_since_log, 0, now
        policy = "no room within block_timeout" if self.options.block_on_overflow else "dropped the oldest"
        capacity = f"{self.queue.capacity} {self.queue.sizer}" if self.queue else "0"
        self.log.warning("%s: sending queue full (%s): %s; %d batches dropped since the last warning",
                         self.component_id, capacity, policy, count)
