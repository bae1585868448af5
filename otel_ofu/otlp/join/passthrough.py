"""The pass-through in its wire form: forwarded ResourceMetrics cut from the received bytes.

Re-serializing the metrics that pass through costs about as much as decoding them, for
nothing: they leave as they came. So the receiver keeps the request's bytes, and each
forwarded ResourceMetrics is cut from them, with the join's input metrics left out. The
request was parsed from these bytes just before, so they are well-formed; anything this
reader does not expect (a group, a count that does not match the parsed message) makes
it fall back to serializing the message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics

from otel_ofu.otlp.codec import WireResourceMetrics, varint
from otel_ofu.otlp.wire import WireError, fields


@dataclass(slots=True)
class Edits:
    """What the join (``_take_inputs``) changed in one ResourceMetrics, by original index."""

    scopes: set[int] = field(default_factory=set)  # scope_metrics deleted (left empty)
    metrics: dict[int, dict[int, bytes | None]] = field(default_factory=dict)  # scope -> metric -> new bytes or None
    points: int = 0  # data points left, as otlp.count_data_points counts them
    inputs: bool = False  # it held join inputs (gauges or sums named as one)
    noticed: bool = False  # it held a metric by which the join notices a source (inputs.NOTICED_METRICS)

    def changed(self) -> bool:
        return bool(self.scopes or self.metrics)


def trimmed_scope(data: bytes, start: int, end: int, changed: dict[int, bytes | None]) -> bytes:
    """A ScopeMetrics' bytes with the metrics in ``changed`` left out (None) or replaced."""
    parts = []
    run = start  # the kept bytes not yet copied begin here
    m_index = -1
    for tag, f_start, _p_start, f_end in fields(data, start, end):
        if tag >> 3 != 2:  # ScopeMetrics.metrics
            continue
        m_index += 1
        if m_index in changed:
            parts.append(data[run:f_start])
            replacement = changed[m_index]
            if replacement is not None:
                parts.append(b"\x12" + varint(len(replacement)) + replacement)
            run = f_end
    parts.append(data[run:end])
    return b"".join(parts)


def trimmed_wire(data: bytes, start: int, end: int, edits: Edits) -> bytes:
    """A ResourceMetrics' bytes (data[start:end]) with the changes of ``edits`` applied."""
    parts = []
    s_index = -1
    for tag, f_start, p_start, f_end in fields(data, start, end):
        if tag >> 3 == 2:  # ResourceMetrics.scope_metrics
            s_index += 1
            if s_index in edits.scopes:
                continue
            changed = edits.metrics.get(s_index)
            if changed:
                scope = trimmed_scope(data, p_start, f_end, changed)
                parts.append(b"\x12" + varint(len(scope)) + scope)
                continue
        parts.append(data[f_start:f_end])
    return b"".join(parts)


def request_ranges(wire: bytes, total: int) -> list[tuple[int, int, int]]:
    """(field start, payload start, field end) of each ResourceMetrics in a request's bytes; [] if they do not fit."""
    try:
        ranges = [(f_start, p_start, f_end) for tag, f_start, p_start, f_end in fields(wire, 0, len(wire))
                  if tag == 0x0A]  # ExportMetricsServiceRequest.resource_metrics
    except (WireError, IndexError):
        return []
    return ranges if len(ranges) == total else []  # else: not the bytes this request was parsed from


def wire_passthrough(wire: bytes, total: int, kept: list[tuple[int, ResourceMetrics, Edits]]) -> list[Any]:
    """The forwarded ResourceMetrics with their bytes cut from the received request (``total`` in it)."""
    ranges = request_ranges(wire, total)
    out: list[Any] = []
    for index, rm, edits in kept:
        field_bytes = None
        if index < len(ranges):
            f_start, p_start, f_end = ranges[index]
            try:
                if not edits.changed():
                    field_bytes = wire[f_start:f_end]
                else:
                    payload = trimmed_wire(wire, p_start, f_end, edits)
                    field_bytes = b"\x0a" + varint(len(payload)) + payload
            except (WireError, IndexError):
                field_bytes = None
        if field_bytes is None:  # unexpected layout: serialize the message instead
            payload = rm.SerializeToString()
            field_bytes = b"\x0a" + varint(len(payload)) + payload
        out.append(WireResourceMetrics(rm, field_bytes, edits.points))
    return out
