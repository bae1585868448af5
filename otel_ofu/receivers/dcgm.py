"""The ``dcgm`` receiver: tensor activity and clocks from DCGM, embedded or a remote nv-hostengine.

Fields are watched by numeric id (names changed in DCGM 4.6): the profiling fields (1004
TPA; 1001, 1002 and 1005 for the loss account; 1014; and, where DCGM and the GPU have them, the raw
cycle counters 1084/1086) at
``collection_interval``, the SM clock (100) at its own ``clock_sample_interval``, and max
clock, clock event reasons and power (113, 112, 155) at ``collection_interval``, with the
ledger's counters where the bindings know them: the energy counter (156, mJ), the nanoseconds
the clock was held down per reason (1420-1424), and PCIe/NVLink bytes per second (1009-1012,
profiling fields, left out where they cannot be watched with the others). Where the
DCGM bindings know the base-unit fields (4.6.1+), the SM clock, max clock and energy are watched as
1603, 1608 (Hz) and 1611 (J) instead, and converted to MHz and mJ (``core.dcgm_fields``); an engine
that refuses them gets the old ids.

Each window's TPA is the exact interval ratio d(1086)/d(1084) when the counters are there
(no sampling at all), else field 1004, DCGM's average over the watch interval; the SM clock
is the mean of the clock samples in the same window (``otel_ofu.core.ofu.mean_clock``). MIG GPU instances
are their own samples (profiling fields are per instance; clocks come from the parent GPU).

When DCGM is missing, the host engine refuses or goes away, or profiling is unsupported,
not permitted, locked by another client or paused, the receiver says which (once per
change), exports ``otel_ofu.receiver.status``, keeps running and reconnects with capped
exponential backoff. Missing values stay missing: a sample whose TPA is blank is dropped by
the ofu processor with its reason, never turned into 0.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from otel_ofu.core import dcgm_fields as F
from otel_ofu.core.metrics import MetricInfo, register
from otel_ofu.core.model import GPU_MIG_INSTANCE, GPU_MIG_PROFILE, GPU_MIG_SLICES, Batch, GpuSample, MetricPoint
from otel_ofu.core.ofu import mean_clock
from otel_ofu.core.values import NoValue, clean, clean_ratio
from otel_ofu.gpu import dcgm_api, status
from otel_ofu.gpu.backoff import Backoff
from otel_ofu.gpu.clock import SYSTEM_CLOCK, Clock
from otel_ofu.gpu.dcgm_api import DcgmEntity, DcgmError, DcgmSession, Series
from otel_ofu.pipeline.component import Context, Factory, PollingReceiver
from otel_ofu.pipeline.config import Duration, require

SOURCE = "dcgm"

HMMA_METRIC = register(MetricInfo(
    "gpu.tensor.hmma.activity", "{ratio}", "gauge",
    "Input: HMMA (FP16/BF16 tensor) pipe activity, DCGM 1014, average over the window; dcgm receiver only."))

_ADDRESS = re.compile(r"^(unix://.+|[A-Za-z0-9_.\-]+(:\d{1,5})?|\[[0-9A-Fa-f:]+\](:\d{1,5})?)$")

# The TPA a sample carries when profiling cannot be watched: the reason, as DCGM encodes it.
_TPA_FOR_STATE = {"profiling_not_supported": status.TPA_NOT_SUPPORTED,
                  "profiling_no_permission": status.TPA_NOT_PERMISSIONED}

# A window whose TPA is blank on every GPU means profiling is paused or taken over.
_PAUSED_MESSAGE = ("profiling fields are blank on every GPU: profiling is paused (dcgmi profile --pause; resume "
                   "with dcgmi profile --resume) or a profiler such as Nsight holds the counters")


@dataclass
class DcgmReceiverConfig:
    # "" starts an embedded host engine in this process; "host", "host:port" (default port 5555)
    # or "unix:///path" connects to a running nv-hostengine. Use the system host engine when one
    # runs (e.g. for dcgm-exporter): two host engines cannot both hold the profiling lock.
    address: str = ""
    # Directory holding pydcgm.py; "" looks in /usr/share/datacenter-gpu-manager-4/bindings/python3
    # (DCGM 4.x), then /usr/local/dcgm/bindings/python3 (3.x), then PYTHONPATH. Not on PyPI.
    bindings_path: str = ""
    # DCGM watch interval of the profiling and device fields: the TPA window, and how often the
    # receiver reads.
    collection_interval: Duration = field(default_factory=lambda: Duration(10))
    # Watch interval of the SM clock (field 100), at least 100ms; the samples inside each TPA
    # window are averaged.
    clock_sample_interval: Duration = field(default_factory=lambda: Duration(1))
    gpu_ids: list[int] = field(default_factory=list)  # DCGM GPU ids to read; [] = every GPU DCGM supports
    mig: bool = True  # MIG GPU instances as their own samples (profiling fields are per instance)
    # Use the raw cycle counters 1084/1086 (an exact interval average) where DCGM (4.6+) and the
    # GPU have them; else field 1004.
    exact_counters: bool = True
    stale_after: int = 3  # windows without new values before a GPU is reported as gpu_no_data
    # Backoff between reconnects (and retries of a refused profiling watch), doubling per failure:
    reconnect_initial_interval: Duration = field(default_factory=lambda: Duration(1))  # the first delay
    reconnect_max_interval: Duration = field(default_factory=lambda: Duration(60))  # the longest delay

    def validate(self) -> None:
        require(not self.address or bool(_ADDRESS.match(self.address)), "address",
                f"expected host, host:port or unix:///path, got {self.address!r}")
        require(self.clock_sample_interval >= 0.1, "clock_sample_interval", "DCGM samples at most every 100ms")
        require(self.collection_interval >= self.clock_sample_interval, "collection_interval",
                "must be at least clock_sample_interval")
        require(self.reconnect_initial_interval > 0, "reconnect_initial_interval", "must be positive")
        require(self.reconnect_max_interval >= self.reconnect_initial_interval, "reconnect_max_interval",
                "must be at least reconnect_initial_interval")
        require(self.stale_after >= 1, "stale_after", "must be at least 1")
        require(all(g >= 0 for g in self.gpu_ids), "gpu_ids", "GPU ids are >= 0")


class DcgmReceiver(PollingReceiver):
    def __init__(self, config: DcgmReceiverConfig, context: Context, consumer, *,
                 loader: dcgm_api.BindingsLoader | None = None, clock: Clock | None = None):
        super().__init__(config, context, consumer)
        self._loader = loader
        self.clock = clock or SYSTEM_CLOCK
        self.status = status.StatusReporter(context.component_id, self.log, context.telemetry)
        self.session: DcgmSession | None = None
        self.backoff = Backoff(float(config.reconnect_initial_interval), float(config.reconnect_max_interval))
        self.profiling_backoff = Backoff(float(config.reconnect_initial_interval), float(config.reconnect_max_interval))
        self.profiling_error: DcgmError | None = None
        self._reset_session_state()

    def _reset_session_state(self) -> None:
        self._clocks: dict[int, deque[tuple[int, object]]] = {}
        self._max_clock: dict[int, object] = {}
        self._last_end: dict[tuple[int, int], int] = {}  # entity -> end of its last window (ns)
        self._last_new: dict[tuple[int, int], float] = {}  # entity -> monotonic time of its last new window
        self._counters: dict[tuple[int, int], tuple[int, int, int]] = {}  # entity -> (ts_us, 1084, 1086)
        self._reads = 0

    # --- the loop ------------------------------------------------------------------------------

    def interval(self) -> float:
        if self.session is None:  # wake for the next reconnect attempt, not a whole window later
            return min(float(self.config.collection_interval), max(0.05, self.backoff.wait_s(self.clock.monotonic())))
        return float(self.config.collection_interval)

    def on_stop(self) -> None:
        self._disconnect()

    def poll(self) -> Batch:
        """One step: (re)connect when due, read what DCGM collected since the last poll."""
        now = self.clock.monotonic()
        batch = Batch()
        if self.session is None and self.backoff.ready(now):
            self._connect(now)
        if self.session is not None:
            if self.profiling_error is not None and self.profiling_backoff.ready(now):
                self._watch_profiling(now)
        if self.session is not None:
            try:
                data = self.session.read()
            except DcgmError as exc:
                self._lost(now, exc)
            else:
                self._reads += 1
                batch.samples, batch.points = self._samples(data, now)
                self._update_state(batch.samples, now)
        batch.points += self.status.points(self.clock.time_ns())
        return batch

    # --- connection ----------------------------------------------------------------------------

    def _connect(self, now: float) -> None:
        cfg = self.config
        try:
            bindings = (self._loader or dcgm_api.get_loader())(cfg.bindings_path or None)
            session = DcgmSession(bindings, cfg.address, float(cfg.collection_interval),
                                  float(cfg.clock_sample_interval), list(cfg.gpu_ids), cfg.mig,
                                  counters=cfg.exact_counters)
            session.open()
        except DcgmError as exc:
            delay = self.backoff.failed(now)
            self.status.set(exc.state, f"{exc.message} (retrying, next in {delay:.0f}s)")
            return
        self.session = session
        self.backoff.succeeded()
        self._reset_session_state()
        for entity in session.entities:
            self._last_new[entity.key] = now
        where = f"nv-hostengine at {cfg.address}" if cfg.address else "an embedded host engine"
        self.status.set(status.OK, f"connected to {where}: {len(session.entities)} GPU(s)/MIG instance(s)")
        self.profiling_error = None
        self._watch_profiling(now)

    def _watch_profiling(self, now: float) -> None:
        assert self.session is not None
        try:
            ids = self.session.watch_profiling()
        except DcgmError as exc:
            if exc.state == "hostengine_lost":
                self._lost(now, exc)
                return
            self.profiling_error = exc
            delay = self.profiling_backoff.failed(now)
            self.status.set(exc.state, f"{exc.message} (retrying, next in {delay:.0f}s)")
            return
        self.profiling_error = None
        self.profiling_backoff.succeeded()
        exact = "with" if set(dcgm_api.COUNTER_FIELDS) <= set(ids) else "without"
        self.log.info("%s: watching profiling fields %s (%s exact cycle counters)", self.context.component_id,
                      ", ".join(map(str, ids)), exact)

    def _lost(self, now: float, exc: DcgmError) -> None:
        self._disconnect()
        delay = self.backoff.failed(now)
        self.status.set(exc.state, f"{exc.message}; reconnecting with backoff (next in {delay:.0f}s)")

    def _disconnect(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    # --- samples -------------------------------------------------------------------------------

    def _samples(self, data: dict[tuple[int, int], Series], now: float) -> tuple[list[GpuSample], list[MetricPoint]]:
        assert self.session is not None
        # The base-unit fields (DCGM 4.6.1: SM clock in Hz), where watched, in the old fields' units.
        data = {key: F.series_in_legacy_units(series) for key, series in data.items()}
        gpu_group = self.session.bindings.dcgm_fields.DCGM_FE_GPU
        keep_ns = int(max(60.0, 3 * float(self.config.collection_interval)) * 1e9)
        for gpu_id in {e.gpu_id for e in self.session.entities}:
            device = data.get((gpu_group, gpu_id), {})
            buffer = self._clocks.setdefault(gpu_id, deque())
            buffer.extend((ts * 1000, value) for ts, value in device.get(F.SM_CLOCK, []))
            while buffer and buffer[0][0] < buffer[-1][0] - keep_ns:
                buffer.popleft()
            if device.get(F.MAX_SM_CLOCK):
                self._max_clock[gpu_id] = device[F.MAX_SM_CLOCK][-1][1]
        samples, points = [], []
        for entity in self.session.entities:
            sample = self._sample(entity, data.get(entity.key, {}), data.get((gpu_group, entity.gpu_id), {}))
            if sample is None:
                continue
            self._last_new[entity.key] = now
            samples.append(sample)
            hmma = data.get(entity.key, {}).get(F.PIPE_TENSOR_HMMA_ACTIVE)
            value, _ = clean_ratio(hmma[-1][1]) if hmma else (None, None)
            if value is not None:
                points.append(MetricPoint(HMMA_METRIC.name, value, sample.time_unix_nano,
                                          sample.resource_attributes()))
        return samples, points

    def _sample(self, entity: DcgmEntity, prof: Series, device: Series) -> GpuSample | None:
        window_ns = int(float(self.config.collection_interval) * 1e9)
        exact = self._exact_tpa(entity, prof)
        tpa_series = prof.get(F.PIPE_TENSOR_ACTIVE, [])
        if exact is not None:
            tpa, start, end = exact
        elif self.profiling_error is not None:
            # Nothing to read: a sample per window still says why there is no OFU.
            tpa = _TPA_FOR_STATE.get(self.profiling_error.state, status.TPA_BLANK)
            end = self.clock.time_ns()
            start = end - window_ns
        elif tpa_series:
            ts_us, tpa = tpa_series[-1]
            end = ts_us * 1000
            start = end - window_ns
        else:
            return None
        if end <= self._last_end.get(entity.key, -1):
            return None  # DCGM repeated the last value: no new window
        self._last_end[entity.key] = end
        clocks = self._clocks.get(entity.gpu_id, deque())
        clock, count = mean_clock(clocks, start, end)
        if clock is None:  # no valid sample inside the window: the latest one before its end, as read
            before = [value for t, value in clocks if t <= end]
            clock, count = (before[-1], 1) if before else (None, 0)
        is_gpu = entity.key[0] == self.session.bindings.dcgm_fields.DCGM_FE_GPU  # type: ignore[union-attr]
        resource: dict[str, object] = {}
        if entity.pci_bus_id:
            resource["gpu.pci_bus_id"] = entity.pci_bus_id
        if entity.mig_instance_id is not None:
            resource[GPU_MIG_INSTANCE] = str(entity.mig_instance_id)
            resource[GPU_MIG_PROFILE] = f"profile-{entity.mig_profile_id}"
            resource[GPU_MIG_SLICES] = str(entity.mig_slices)
        return GpuSample(
            time_unix_nano=end, window_s=(end - start) / 1e9, host=self.status.host, gpu_index=entity.gpu_id,
            uuid=entity.uuid, model=entity.model, tensor_active=tpa, sm_clock_mhz=clock,
            sm_clock_samples=count, max_sm_clock_mhz=self._max_clock.get(entity.gpu_id),
            power_w=_latest(device, F.POWER_USAGE) if is_gpu else None,
            clock_event_reasons=_latest(device, F.CLOCKS_EVENT_REASONS), sm_active=_latest(prof, F.SM_ACTIVE),
            gr_active=_latest(prof, F.GR_ENGINE_ACTIVE), dram_active=_latest(prof, F.DRAM_ACTIVE),
            source=SOURCE, resource=resource,
            # The whole GPU's energy (an instance has none of its own, as with power); the clock's
            # event time is its GPU's, as the clock is; the traffic is the entity's.
            energy_mj=_latest(device, F.TOTAL_ENERGY_CONSUMPTION) if is_gpu else None,
            clock_event_ns={cause: _latest(device, fid) for fid, cause in F.CLOCK_EVENT_NS_FIELDS.items()
                            if device.get(fid)} or None,
            **{name: _latest(prof, fid) for fid, name in F.TRAFFIC_FIELDS.items()},
        )

    def _exact_tpa(self, entity: DcgmEntity, prof: Series) -> tuple[float, int, int] | None:
        """TPA over (previous read, this read] from the raw cycle counters, when both are valid."""
        elapsed, active = prof.get(F.SM_CYCLES_ELAPSED_TOTAL), prof.get(F.MMA_CYCLES_ACTIVE_TOTAL)
        if not elapsed or not active:
            return None
        ts_us, raw_elapsed = elapsed[-1]
        raw_active = active[-1][1]
        if clean(raw_elapsed, "int64")[0] is None or clean(raw_active, "int64")[0] is None:
            self._counters.pop(entity.key, None)
            return None
        current = (int(ts_us), int(raw_elapsed), int(raw_active))  # type: ignore[call-overload]
        previous = self._counters.get(entity.key)
        if previous is not None and current[0] <= previous[0]:
            return None
        self._counters[entity.key] = current
        if previous is None:
            return None
        d_elapsed, d_active = current[1] - previous[1], current[2] - previous[2]
        if d_elapsed <= 0 or d_active < 0:  # a counter reset (GPU reset, engine restart)
            return None
        return d_active / d_elapsed, previous[0] * 1000, current[0] * 1000

    # --- state -----------------------------------------------------------------------------------

    def _update_state(self, samples: list[GpuSample], now: float) -> None:
        assert self.session is not None
        if self.profiling_error is not None:
            return  # already said why, at the watch
        reasons = {id(s): clean_ratio(s.tensor_active)[1] for s in samples}
        if samples and self._reads > 1:
            if all(r in (NoValue.BLANK, NoValue.NOT_FOUND) for r in reasons.values()):
                self.status.set("profiling_paused", _PAUSED_MESSAGE)
            elif all(r == NoValue.NOT_PERMISSIONED for r in reasons.values()):
                self.status.set("profiling_no_permission", "DCGM returns profiling values as not permissioned: "
                                "run nv-hostengine as root")
            elif all(r == NoValue.NOT_SUPPORTED for r in reasons.values()):
                self.status.set("profiling_not_supported", "DCGM returns the profiling fields as not supported on "
                                "every GPU")
            elif any(r is None for r in reasons.values()):
                self.status.set(status.OK, "reading counters")
        by_key = {(s.uuid, s.resource.get(GPU_MIG_INSTANCE)): s for s in samples}
        stale_s = self.config.stale_after * float(self.config.collection_interval)
        for entity in self.session.entities:
            key = entity.uuid if entity.mig_instance_id is None else f"{entity.uuid}/gi{entity.mig_instance_id}"
            resource = {"hw.id": entity.uuid, "gpu.index": str(entity.gpu_id), "hw.model": entity.model,
                        GPU_MIG_INSTANCE: None if entity.mig_instance_id is None else str(entity.mig_instance_id)}
            sample = by_key.get((entity.uuid, resource[GPU_MIG_INSTANCE]))
            if sample is not None:
                reason = reasons[id(sample)]
                if reason is None or self.status.state != status.OK:
                    self.status.set_gpu(key, status.OK)
                else:
                    self.status.set_gpu(key, "gpu_blank", f"tensor activity is {reason.value} on this GPU while "
                                        "others report values (GPU lost, reset or MIG reconfigured?)", resource)
            elif now - self._last_new.get(entity.key, now) > stale_s:
                self.status.set_gpu(key, "gpu_no_data", f"no new values from DCGM for {stale_s:.0f}s: the GPU may "
                                    "be lost or reset (check nvidia-smi and the kernel log for Xid errors)", resource)


def _latest(series: Series, field_id: int) -> object:
    values = series.get(field_id)
    return values[-1][1] if values else None


FACTORY = Factory(SOURCE, DcgmReceiverConfig, DcgmReceiver,
                  "DCGM profiling fields (embedded host engine or nv-hostengine)", output="samples")
