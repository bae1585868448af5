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

# The smallest DCGM blank sentinel of each field type: a number below it (and not below 0) is an ordinary reading.
_BLANK_AT = {"int32": DCGM_INT32_BLANK, "fp64": DCGM_FP64_BLANK, "int64": DCGM_INT64_BLANK}


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

    __slots__ = ("_blank_at", "_last", "field_type")

    def __init__(self, field_type: str = "int64"):
        self._last: dict[Hashable, tuple[int, float]] = {}
        self.field_type = field_type  # the blank rule's type of the counter's DCGM field
        self._blank_at = _BLANK_AT[field_type]

    def reading(self, raw: object) -> float | None:
        """The reading as the blank rule (core.values.clean) reads it; None when it has no value.

        Why not clean() alone: an energy counter is past the smallest sentinel (2^31 mJ is 25 days of
        1 kW), where clean() works out which blank a number is; an ordinary int or float below the field
        type's sentinel is what clean() gives back, checked at once (tests/test_energy.py compares them).
        """
        kind = type(raw)
        if (kind is int or kind is float) and 0 <= raw < self._blank_at:  # type: ignore[operator]
            return float(raw)  # type: ignore[arg-type]
        return clean(raw, self.field_type)[0]

    def step(self, key: Hashable, time_unix_nano: int, raw: object) -> CounterStep:
        """The increase since ``key``'s last good reading; the reading is kept when it is good and later."""
        last = self._last.get(key)
        value = self.increase(key, time_unix_nano, raw)
        if value is not None:
            assert last is not None
            how = Increase.OK if self._last[key][1] >= last[1] else Increase.RESET
            return CounterStep(value, how, (time_unix_nano - last[0]) / 1e9)
        if self.reading(raw) is None:
            return CounterStep(None, Increase.NO_VALUE)
        if last is not None and time_unix_nano <= last[0]:
            return CounterStep(None, Increase.STALE)
        return CounterStep(None, Increase.FIRST)

    def increase(self, key: Hashable, time_unix_nano: int, raw: object) -> float | None:
        """:meth:`step`'s value alone (None unless OK or RESET), kept the same way, without making a
        CounterStep: for a hot path (the ofu processor's energy, once per GPU window)."""
        value = self.reading(raw)
        if value is None:
            return None
        last = self._last.get(key)
        if last is not None and time_unix_nano <= last[0]:
            return None
        self._last[key] = (time_unix_nano, value)
        if last is None:
            return None
        previous = last[1]
        return value - previous if value >= previous else value  # counter_increase: a reset counts from 0

    def forget(self, key: Hashable) -> None:
        """Drop a series (its GPU left): its next reading is a first one."""
        self._last.pop(key, None)

    def forget_before(self, time_unix_nano: int) -> int:
        """Drop the series whose last good reading is older than ``time_unix_nano`` (GPUs that left);
        returns how many."""
        old = [key for key, (t, _) in self._last.items() if t < time_unix_nano]
        for key in old:
            del self._last[key]
        return len(old)

    def __len__(self) -> int:
        return len(self._last)
