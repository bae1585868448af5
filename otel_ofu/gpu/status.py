"""What a GPU receiver says about itself: one state at a time, logged once, exported as a metric.

A receiver that cannot read counters must say so explicitly (never by emitting zeros): it
keeps a current state ("ok", "hostengine_unreachable", "profiling_paused", ...) for itself
and for each GPU it has trouble with. A change of state is logged once (not at every poll),
and every poll exports ``otel_ofu.receiver.status`` = 1 for the current state, with the state
as an attribute, so a dashboard or alert can show *why* a GPU has no OFU.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

from otel_ofu.core.metrics import METRICS, RECEIVER_STATUS
from otel_ofu.core.model import HOST_NAME, HW_VENDOR, MetricPoint, attrs
from otel_ofu.core.values import DCGM_FP64_BLANK
from otel_ofu.pipeline.telemetry import STARTING, Telemetry

STATUS_METRIC = METRICS[RECEIVER_STATUS]

OK = "ok"

# A sample's tensor activity when the receiver knows *why* there is none: the DCGM blank
# encodings, which values.clean() turns into the matching ofu.drop.reason (never into 0).
TPA_BLANK = DCGM_FP64_BLANK
TPA_NOT_SUPPORTED = DCGM_FP64_BLANK + 2.0
TPA_NOT_PERMISSIONED = DCGM_FP64_BLANK + 3.0

RECEIVER_ATTR = "receiver"
STATE_ATTR = "state"


@dataclass
class _Entry:
    state: str
    message: str
    resource: dict[str, str]  # the GPU's resource attributes


class StatusReporter:
    """Current state of one receiver and of its troubled GPUs."""

    def __init__(self, receiver_id: str, log: logging.Logger, telemetry: Telemetry, host: str | None = None):
        self.receiver_id = receiver_id
        self.log = log
        self.telemetry = telemetry
        self.host = host or socket.gethostname()
        self.state = STARTING
        self.message = ""
        self._gpus: dict[str, _Entry] = {}

    # --- the receiver as a whole ---------------------------------------------------------

    def set(self, state: str, message: str = "") -> bool:
        """Enter ``state``; logs and returns True only when the state changed."""
        if state == self.state:
            if message and message != self.message:
                self.message = message
                self.telemetry.receiver_state(self.receiver_id, state, why=message)
            return False
        previous = self.state
        self.telemetry.receiver_state(self.receiver_id, state, why=message)
        self.state, self.message = state, message
        if state == OK:
            self.log.info("%s: %s%s", self.receiver_id, "reading counters" if not message else message,
                          f" (was {previous})" if previous != STARTING else "")
        else:
            self.log.warning("%s: %s: %s", self.receiver_id, state, message)
        return True

    # --- one GPU ---------------------------------------------------------------------------

    def set_gpu(self, key: str, state: str, message: str = "", resource: dict[str, object] | None = None) -> bool:
        """Enter ``state`` for one GPU or MIG instance (``ok`` clears it); logs once per change.

        ``key`` identifies the entity (UUID, plus the MIG instance); ``resource`` is its
        resource attributes, so the status point sits next to the GPU's own metrics.
        """
        entry = self._gpus.get(key)
        if entry is None and state == OK:
            return False
        if entry is not None and entry.state == state:
            entry.message = message or entry.message
            return False
        self.telemetry.receiver_state(self.receiver_id, state, gpu=key)
        if state == OK:
            del self._gpus[key]
            self.log.info("%s: GPU %s is back: %s", self.receiver_id, key, message or "reading counters")
            return True
        self._gpus[key] = _Entry(state, message, {k: str(v) for k, v in (resource or {}).items() if v is not None})
        self.log.warning("%s: GPU %s: %s: %s", self.receiver_id, key, state, message)
        return True

    def gpu_state(self, key: str) -> str:
        entry = self._gpus.get(key)
        return entry.state if entry else OK

    def gpu_states(self) -> dict[str, str]:
        return {key: entry.state for key, entry in self._gpus.items()}

    # --- export ------------------------------------------------------------------------------

    def points(self, time_unix_nano: int) -> list[MetricPoint]:
        """The status gauge for this poll: the receiver's state, then each troubled GPU's."""
        base = {HOST_NAME: self.host, "service.name": "otel-ofu"}
        out = [MetricPoint(STATUS_METRIC.name, 1.0, time_unix_nano, attrs(base),
                           attrs({RECEIVER_ATTR: self.receiver_id, STATE_ATTR: self.state}))]
        for entry in self._gpus.values():
            resource = attrs({HOST_NAME: self.host, HW_VENDOR: "nvidia", **entry.resource})
            out.append(MetricPoint(STATUS_METRIC.name, 1.0, time_unix_nano, resource,
                                   attrs({RECEIVER_ATTR: self.receiver_id, STATE_ATTR: entry.state})))
        return out
