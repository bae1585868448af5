"""Self-telemetry: otel-ofu's own counters and gauges (dropped points, queue length, ...).

One :class:`Telemetry` is shared by every component of a running service. Components
``add`` to counters and ``set`` gauges keyed by metric name and attributes; the service
turns a snapshot into metric points under the resource ``service.name=otel-ofu``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from otel_ofu.core.metrics import METRICS, RECEIVER_STATUS
from otel_ofu.core.model import Attributes, MetricPoint, attrs

STARTING = "starting"  # a receiver's state until it has read something


class Telemetry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, Attributes], float] = {}
        self._gauges: dict[tuple[str, Attributes], float] = {}
        self._states: dict[tuple[str, Attributes], str] = {}
        self._why: dict[str, str] = {}  # receiver -> what its state means now, in words
        self.start_time_unix_nano = time.time_ns()

    def receiver_state(self, receiver: str, state: str, *, why: str = "", **attributes: Any) -> str | None:
        """Put a receiver (or, with attributes such as gpu=..., one of its GPUs) in ``state``.

        ``otel_ofu.receiver.status`` is 1 for the new state and 0 for the one it left, so a
        dashboard or alert sees what each receiver is doing. ``why`` says it in words for the
        receiver as a whole (``cannot scrape http://...: connection refused; retrying every 30s``),
        what the console shows. Returns the previous state.
        """
        key = (receiver, attrs(attributes))
        with self._lock:
            if not attributes:
                self._why[receiver] = why
            previous = self._states.get(key)
            if previous != state:
                if previous is not None:
                    self._gauges[(RECEIVER_STATUS, attrs({**attributes, "receiver": receiver,
                                                          "state": previous}))] = 0.0
                self._gauges[(RECEIVER_STATUS, attrs({**attributes, "receiver": receiver, "state": state}))] = 1.0
                self._states[key] = state
        return previous

    def state_of(self, receiver: str, **attributes: Any) -> str | None:
        with self._lock:
            return self._states.get((receiver, attrs(attributes)))

    def receiver_states(self) -> dict[str, tuple[str, str]]:
        """Every receiver's own state (not its GPUs') and what it means in words ("" when unsaid)."""
        with self._lock:
            return {receiver: (state, self._why.get(receiver, "")) for (receiver, attributes), state
                    in self._states.items() if not attributes}

    def add(self, name: str, value: float = 1.0, **attributes: Any) -> None:
        key = (name, attrs(attributes))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + value

    def set(self, name: str, value: float, **attributes: Any) -> None:
        with self._lock:
            self._gauges[(name, attrs(attributes))] = value

    def counter(self, name: str, **attributes: Any) -> float:
        with self._lock:
            return self._counters.get((name, attrs(attributes)), 0.0)

    def gauge(self, name: str, **attributes: Any) -> float | None:
        with self._lock:
            return self._gauges.get((name, attrs(attributes)))

    def counters(self, name: str) -> dict[Attributes, float]:
        """Every series of one counter, by attribute set."""
        with self._lock:
            return {a: v for (n, a), v in self._counters.items() if n == name}

    def points(self, resource: Attributes, now_unix_nano: int | None = None) -> list[MetricPoint]:
        now = now_unix_nano or time.time_ns()
        with self._lock:
            counters = list(self._counters.items())
            gauges = list(self._gauges.items())
        out = []
        for (name, attributes), value in counters:
            info = METRICS.get(name)
            out.append(MetricPoint(name, value, now, resource, attributes, info.unit if info else "1",
                                   monotonic=True, start_time_unix_nano=self.start_time_unix_nano))
        for (name, attributes), value in gauges:
            info = METRICS.get(name)
            out.append(MetricPoint(name, value, now, resource, attributes, info.unit if info else "1"))
        return out
