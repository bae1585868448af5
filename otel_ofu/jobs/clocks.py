"""Hosts' clocks as their points show them: each host's data time, arrival and usual lead, and
the rules that judge a point's time against them (how far ahead is too far)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.core.model import HOST_NAME, Attributes, GpuKey


@dataclass(slots=True)
class HostClock:
    """One host's clock, as its points show it.

    ``data``: the newest data time it sent (its own clock); ``arrived``: when its newest
    point arrived (the caller's clock); ``lead``: how far its data has run ahead of the
    caller's clock at most (its skew, or a simulation's acceleration), None until a point
    is accepted; ``pending``: a jump ahead not yet confirmed (lead, batch number); ``back``: a
    step back not yet confirmed (how far behind ``data``, batch number); ``fresh_batch``: the
    last batch in which one of its points was used.
    """

    data: float
    arrived: float
    lead: float | None = None
    pending: tuple[float, int] | None = None
    back: tuple[float, int] | None = None
    fresh_batch: int = -1
    gpus: set[tuple] = field(default_factory=set)  # its (GPU, job) keys in JobBook._gpu_last


def source_of(resource: Attributes, gpu: GpuKey) -> Any:
    """The clock a GPU point was stamped by: its host; the GPU itself when it names no host."""
    for key, value in resource:
        if key == HOST_NAME and value not in (None, ""):
            return str(value)
    return gpu


class HostClocks:
    """Every host's :class:`HostClock`, by source (:func:`source_of`), for one :class:`JobBook`.

    ``batch`` counts the book's batches (``observe`` calls): a jump of a host's clock is
    confirmed by a later batch, never by the one it came in.
    """

    def __init__(self, max_future: float):
        self.max_future = max_future
        self.hosts: dict[Any, HostClock] = {}
        self.batch = 0
        self._fleet_lead_batch = -1
        self._fleet_lead_value: float | None = None

    def next_batch(self) -> None:
        self.batch += 1

    def too_far_ahead(self, source: Any, lead: float, arrival: float, live: bool) -> bool:
        """Whether a point ``lead`` seconds ahead of the caller's clock is too far in the future.

        Too far: more than ``max_future`` beyond its host's lead so far (a new host: the fleet's
        median lead). A host that keeps its clock steadily ahead, or a simulation running
        faster than real time, is measured against itself; a lone point a day ahead is not
        counted. A jump that the host's next request confirms (its clock really moved) is.
        ``live``: the caller's clock is a wall clock (the processor's); then with no host to
        compare with, a point is measured against that clock (a lead of 0).
        """
        limit = self.max_future
        clock = self.hosts.get(source)
        usual = clock.lead if clock is not None and clock.lead is not None else self.fleet_lead()
        if usual is None and live:
            usual = 0.0
        if usual is None or lead - usual <= limit:
            return False
        if clock is None:
            clock = self.hosts[source] = HostClock(-math.inf, arrival)
        pending = clock.pending
        if pending is not None and pending[1] < self.batch and abs(lead - pending[0]) <= limit:
            return False  # the second request in a row this far ahead: the host's clock moved
        if pending is None or pending[1] < self.batch:
            clock.pending = (lead, self.batch)
        return True

    def fleet_lead(self) -> float | None:
        """The median lead of the hosts seen (computed once per batch): a new host's yardstick."""
        if self._fleet_lead_batch != self.batch:
            leads = sorted(c.lead for c in self.hosts.values() if c.lead is not None)
            self._fleet_lead_value = leads[(len(leads) - 1) // 2] if leads else None
            self._fleet_lead_batch = self.batch
        return self._fleet_lead_value

    def accepted(self, source: Any, t: float, arrival: float) -> HostClock:
        """Note a point of ``source`` stamped ``t`` that arrived at ``arrival`` (the caller's clock) and was used."""
        clock = self.hosts.get(source)
        if clock is None:
            clock = self.hosts[source] = HostClock(t, arrival)
        clock.data, clock.arrived = max(clock.data, t), max(clock.arrived, arrival)
        clock.lead = t - arrival if clock.lead is None else max(clock.lead, t - arrival)
        if clock.pending is not None and clock.pending[1] < self.batch:
            clock.pending = None
        clock.fresh_batch = self.batch
        return clock

    def behind(self, source: Any, t: float) -> bool:
        """Whether ``t`` is more than ``max_future`` behind the newest data ``source`` sent.

        Such a point is late (a retried batch) or its host's clock was stepped back: the
        batch decides (:meth:`stepped_back`).
        """
        clock = self.hosts.get(source)
        return clock is not None and clock.data - t > self.max_future

    def stepped_back(self, source: Any, newest: float, lead: float, live: bool) -> bool:
        """Whether the host's clock was stepped back, given the points of this batch that are
        :meth:`behind` (``newest`` the newest of them, ``lead`` its lead over the caller's clock).

        Stepped back: two batches in a row hold points of the host this far behind, consistent
        with one another, and none at its old time (a late batch comes alone: the host's
        current data keeps coming). With a wall clock (``live``) the new time must also agree
        with the other hosts' (their median lead; no other host: this process's clock): NTP
        steps a clock to the right time, while a replayed backlog of old data is far behind it.
        The first batch's points are not counted, as a jump ahead's first point is not.
        """
        clock = self.hosts[source]
        how_far = clock.data - newest
        if clock.fresh_batch == self.batch or (live and abs(lead - self._others_lead(source)) > self.max_future):
            clock.back = None
            return False
        back = clock.back
        if back is not None and back[1] < self.batch and abs(how_far - back[0]) <= self.max_future:
            return True
        clock.back = (how_far, self.batch)
        return False

    def rebase(self, source: Any, newest: float, live: bool) -> HostClock:
        """The host's clock, stepped back, starts over at ``newest`` (its lead is learned again).

        Without a wall clock (a recording, whose clock is its newest data) every host's lead was
        measured against the stepped host's old time: all are learned again.
        """
        clock = self.hosts[source]
        clock.data, clock.lead, clock.pending, clock.back = newest, None, None, None
        if not live:
            for other in self.hosts.values():
                other.lead = None
        self._fleet_lead_batch = -1
        return clock

    def _others_lead(self, source: Any) -> float:
        leads = sorted(c.lead for key, c in self.hosts.items() if key != source and c.lead is not None)
        return leads[(len(leads) - 1) // 2] if leads else 0.0
