"""The join in time: one GPU's TPA and SM clock readings of a request -> its windows (GPU samples).

The loss account's ratios (GR, SM, DRAM activity) go with the window whose time they are
nearest, within the same tolerance; without one near, the window has none (no value).

Join rule: a GPU entity (host, index, UUID, MIG instance, pod) gives one sample per TPA data
point, at the TPA point's time. The clock points of the same entity whose timestamps lie
within ``tolerance_s`` of it (nearest TPA wins) are averaged into the sample's SM clock.
A scrape stamps all its points with one time, so that is an exact match; dcgmreceiver's
per-field timestamps differ by milliseconds. A TPA point without a clock, and a clock point
with no TPA near it, still make a sample; the ``ofu`` processor then reports it as a dropped
window (``missing``), never as 0, and re-emits the clock. Duplicate points of one entity and
time are one reading. Pure: no I/O, no protobuf.
"""

from __future__ import annotations

import bisect

from otel_ofu.core.model import GpuSample
from otel_ofu.core.values import clean_clock
from otel_ofu.otlp.join.inputs import ENERGY, ENERGY_BASE_UNIT, EVENT_NS_KINDS, TRAFFIC_KINDS
from otel_ofu.otlp.join.series import Entity

SOURCE = "otlp"  # GpuSample.source of every window the join makes


def near(readings: list[tuple[int, object]], t: int, tolerance_ns: int) -> object:
    """The reading nearest ``t`` within the tolerance (a later duplicate wins), else None (no value)."""
    if len(readings) == 1:
        r_t, value = readings[0]
        return value if abs(r_t - t) <= tolerance_ns else None
    best = None
    for r_t, value in readings:
        distance = abs(r_t - t)
        if distance <= tolerance_ns and (best is None or distance <= best[0]):
            best = (distance, value)
    return None if best is None else best[1]


def with_ratios(sample: GpuSample, entity: Entity, tolerance_ns: int) -> GpuSample:
    """The loss account's ratios of the sample's window (they pass through as they came: not re-emitted)."""
    if entity.gr or entity.sm or entity.dram:
        t = sample.time_unix_nano
        sample.gr_active = near(entity.gr, t, tolerance_ns) if entity.gr else None
        sample.sm_active = near(entity.sm, t, tolerance_ns) if entity.sm else None
        sample.dram_active = near(entity.dram, t, tolerance_ns) if entity.dram else None
        sample.ratios_forwarded = True
    return sample


def with_counters(sample: GpuSample, entity: Entity, tolerance_ns: int) -> GpuSample:
    """The ledger's counters of the sample's window: each kind's reading nearest its time, as the ratios."""
    counters = entity.counters
    if counters:
        t = sample.time_unix_nano
        put_counters(sample, {kind: near(readings, t, tolerance_ns) for kind, readings in counters.items()})
    return sample


def put_counters(sample: GpuSample, found: dict[str, object]) -> None:
    """The ledger's counters into a sample from ``{counter kind: reading or None}`` (the kinds a GPU's
    request holds): energy in J (1611) wins over mJ (156) when both are held, never mixed by time."""
    energy = found[ENERGY_BASE_UNIT] if ENERGY_BASE_UNIT in found else found.get(ENERGY)
    if energy is not None:
        sample.energy_mj = energy
    for kind, attribute in TRAFFIC_KINDS.items():
        value = found.get(kind)
        if value is not None:
            setattr(sample, attribute, value)
    reasons = {cause: value for kind, cause in EVENT_NS_KINDS.items() if (value := found.get(kind)) is not None}
    if reasons:
        sample.clock_event_ns = reasons


def samples_of(entity: Entity, window_s: float, tolerance_ns: int) -> list[GpuSample]:
    """The entity's windows: one per TPA reading, and one per clock reading near no TPA reading.

    Duplicate points of one GPU and time (the same scrape twice in a request, a batch sent
    again) are one reading, the last one received. A clock with no TPA near it (profiling
    off, the field not exported, Nsight holding the counters) is still a window: the ``ofu``
    processor reports it as "no value" (``missing``) and re-emits its clock.
    """
    clocks = entity.clock_base_unit or entity.clock  # one clock field, never both (core.dcgm_fields)
    max_clocks = entity.max_clock_base_unit or entity.max_clock
    max_clock = max_clocks[-1][1] if max_clocks else None
    if len(entity.tpa) == 1 and len(clocks) == 1:  # a scrape: one TPA, one clock
        (t, tpa_value), (clock_t, raw) = entity.tpa[0], clocks[0]
        sample = scrape_sample(entity, t, tpa_value, clock_t, raw, max_clock, window_s, tolerance_ns, entity.resource)
        if sample is not None:
            return [with_counters(with_ratios(sample, entity, tolerance_ns), entity, tolerance_ns)]
    tpa = sorted(dict(entity.tpa).items())  # by time; a later duplicate replaces an earlier one
    times = [t for t, _ in tpa]
    windows: list[tuple[int, object, list[object]]] = [(t, value, []) for t, value in tpa]
    lone: list[tuple[int, object, list[object]]] = []  # clock readings near no TPA reading
    for t, value in sorted(dict(clocks).items()):
        if times:
            i = bisect.bisect_left(times, t)
            best = min((j for j in (i - 1, i) if 0 <= j < len(times)), key=lambda j: abs(times[j] - t))
            if abs(times[best] - t) <= tolerance_ns:
                windows[best][2].append(value)
                continue
        if lone and t - lone[-1][0] <= tolerance_ns:
            lone[-1][2].append(value)
        else:
            lone.append((t, None, [value]))
    windows += lone
    if not windows and max_clocks:  # only the max clock: a window with neither reading
        windows.append((max_clocks[-1][0], None, []))
    out = []
    for t, tpa_value, raw_clocks in windows:
        valid = [v for v in (clean_clock(c)[0] for c in raw_clocks) if v is not None]
        if valid:
            clock, count = sum(valid) / len(valid), len(valid)
        else:  # keep the raw reading (blank, 0, NaN) so the ofu processor names the reason
            clock, count = (raw_clocks[0] if raw_clocks else None), 0
        # Each sample gets its own resource dict (the entity's own when it makes only one).
        resource = entity.resource if len(windows) == 1 else dict(entity.resource)
        sample = GpuSample(t, window_s, entity.host, entity.gpu_index, entity.uuid, entity.model, tpa_value, clock,
                           count, max_clock, source=SOURCE, job_id=entity.job_id, resource=resource)
        out.append(with_counters(with_ratios(sample, entity, tolerance_ns), entity, tolerance_ns))
    return out


def scrape_sample(gpu: Entity, t: int, tpa: object, clock_t: int, clock: object, max_clock: object, window_s: float,
                  tolerance_ns: int, resource: dict, gr: object = None, sm: object = None, dram: object = None,
                  ratios_forwarded: bool = False) -> GpuSample | None:
    """The window of a GPU whose request holds one TPA and one clock reading of it (a scrape); None when
    they lie more than the tolerance apart (two windows: :func:`samples_of` makes them). ``gr``, ``sm``,
    ``dram``: the loss account's ratios of the window, as :func:`with_ratios` puts them."""
    if abs(clock_t - t) > tolerance_ns:
        return None
    valid = clean_clock(clock)[0]
    clock, count = (clock, 0) if valid is None else (valid, 1)
    # Positional: a processing stage makes one per GPU per interval, and keywords cost about as much again.
    return GpuSample(t, window_s, gpu.host, gpu.gpu_index, gpu.uuid, gpu.model, tpa, clock, count, max_clock, None,
                     None, sm, gr, dram, ratios_forwarded, SOURCE, gpu.job_id, None, resource)
