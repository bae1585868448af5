"""The one rule for cumulative counters: what a window's increase is, and when there is none.

DCGM and NVML give some quantities as running totals since the driver loaded: energy (DCGM 156
in mJ, 1611 in J, NVML ``nvmlDeviceGetTotalEnergyConsumption`` in mJ) and the time the clock was
held down per reason (DCGM 1420-1424, ns). A window's share is the difference of two readings,
and every consumer (the energy of a job, the clock loss by cause) takes it from here so that a
reset, a blank or a reading out of order means the same everywhere:

- a blank or absent reading (the one blank rule, :func:`otel_ofu.core.values.clean`) gives no
  increase, never 0; the reading after it is compared with the last good one;
- the first reading of a series gives none (there is nothing to subtract);
- a reading below the previous one is a reset (driver reload, GPU reset, a counter that wrapped):
  the increase is the new reading, as Prometheus' ``increase()`` counts it, and it says so;
- a reading at or before the previous one's time (a repeated or late sample) is ignored.

Pure: :class:`CounterTracker` keeps only the last reading per series.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass

from otel_ofu.core.values import DCGM_FP64_BLANK, DCGM_INT32_BLANK, DCGM_INT64_BLANK, clean

_SENTINELS = {"int32": DCGM_INT32_BLANK, "fp64": DCGM_FP64_BLANK, "int64": DCGM_INT64_BLANK}


class Increase(enum.StrEnum):
    """How an increase was found, or why there is none."""

    OK = "ok"
    RESET = "reset"  # the counter went down: the new reading counted from 0
    FIRST = "first"  # no earlier reading to subtract
    NO_VALUE = "no_value"  # this reading is blank or absent
    STALE = "stale"  # not later than the last reading: ignored


@dataclass(frozen=True, slots=True)
class CounterStep:
    """A window's increase of one counter: ``value`` is None unless ``how`` is OK or RESET."""

    value: float | None
    how: Increase
    seconds: float | None = None  # time between the two readings


def counter_increase(previous: float, current: float) -> tuple[float, Increase]:
    """The increase from ``previous`` to ``current`` of a counter that only grows between resets."""
    if current >= previous:
        return current - previous, Increase.OK
    return current, Increase.RESET


class CounterTracker:
    """Last good reading per series key; :meth:`step` gives each new reading's increase."""

    __slots__ = ("_last", "field_type", "_below")

    def __init__(self, field_type: str = "int64"):
        self._last: dict[Hashable, tuple[int, float]] = {}
        self.field_type = field_type  # the blank rule's type of the counter's DCGM field
        self._below = _SENTINELS.get(field_type, DCGM_INT32_BLANK)  # a plain number below this is no blank

    def step(self, key: Hashable, time_unix_nano: int, raw: object) -> CounterStep:
        """The increase since ``key``'s last good reading; the reading is kept when it is good and later."""
        if (type(raw) is int or type(raw) is float) and 0 <= raw < self._below:  # type: ignore[operator]
            value: float | None = float(raw)  # the usual reading, as clean() takes it (a NaN fails the test)
        else:
            value, _reason = clean(raw, self.field_type)
        if value is None:
            return CounterStep(None, Increase.NO_VALUE)
        last = self._last.get(key)
        if last is not None and time_unix_nano <= last[0]:
            return CounterStep(None, Increase.STALE)
        self._last[key] = (time_unix_nano, value)
        if last is None:
            return CounterStep(None, Increase.FIRST)
        increase, how = counter_increase(last[1], value)
        return CounterStep(increase, how, (time_unix_nano - last[0]) / 1e9)

    def increase(self, key: Hashable, time_unix_nano: int, raw: object) -> float | None:
        """:meth:`step`'s value alone, the same rule without the object it returns (a processor's per-window
        path: five reasons per GPU window)."""
        if (type(raw) is int or type(raw) is float) and 0 <= raw < self._below:  # type: ignore[operator]
            value: float | None = float(raw)
        else:
            value, _reason = clean(raw, self.field_type)
            if value is None:
                return None
        last = self._last.get(key)
        if last is not None and time_unix_nano <= last[0]:
            return None
        self._last[key] = (time_unix_nano, value)  # type: ignore[assignment]
        if last is None:
            return None
        previous = last[1]
        return value - previous if value >= previous else value  # type: ignore[operator]

    def forget(self, key: Hashable) -> None:
        """Drop a series (its GPU left): its next reading is a first one."""
        self._last.pop(key, None)

    def __len__(self) -> int:
        return len(self._last)
