"""Self-telemetry: otel-ofu's own counters and gauges (dropped points, queue length, ...).

One :class:`Telemetry` is shared by every component of a running service. Components
``add`` to counters and ``set`` gauges keyed by metric name and attributes; the service
turns a snapshot into metric points under the resource ``service.name=otel-ofu``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from otel_ofu.core.metrics import METRICS
from otel_ofu.core.model import Attributes, MetricPoint, attrs


class Telemetry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, Attributes], float] = {}
        self._gauges: dict[tuple[str, Attributes], float] = {}
        self.start_time_unix_nano = time.time_ns()

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
