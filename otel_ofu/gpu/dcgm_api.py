"""The seam to DCGM's Python bindings (pydcgm), which ship with DCGM and are not on PyPI.

:func:`import_bindings` finds them in the DCGM 4.x or 3.x install path (or a configured one)
and imports them lazily. Receivers and ``otel-ofu doctor`` ask :func:`get_loader` for the
loader, so tests install fakes with :func:`set_loader` instead of patching modules.

:class:`DcgmSession` uses the pydcgm object API (DcgmHandle, DcgmSystem, DcgmGroup,
DcgmFieldGroup, ``group.samples.WatchFields`` / ``GetAllSinceLastCall_v2``) rather than
DcgmReader: DcgmReader catches a lost connection itself (logging at every call through the
root logger and returning ``{}``), so a receiver on top of it could not tell "host engine
gone" from "no data yet", and its field-id dictionaries drop the per-value timestamps the
clock averaging needs. Every DCGM failure leaves here as a :class:`DcgmError` whose
``state`` is one of the receiver states in docs/components/receivers/dcgm.md, Failure states.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.core import dcgm_fields as F
from otel_ofu.core.values import DCGM_FP64_BLANK, DCGM_INT64_BLANK

log = logging.getLogger("otel_ofu.gpu.dcgm")

DCGM4_BINDINGS = "/usr/share/datacenter-gpu-manager-4/bindings/python3"
DCGM3_BINDINGS = "/usr/local/dcgm/bindings/python3"
BINDING_MODULES = ("pydcgm", "dcgm_structs", "dcgm_fields", "dcgm_agent")

# What the dcgm receiver watches, by numeric id (names changed in DCGM 4.6).
DEVICE_FIELDS = (F.MAX_SM_CLOCK, F.CLOCKS_EVENT_REASONS, F.POWER_USAGE)
# The ledger's device counters (issue 34): energy (156, or 1611 in J where the bindings know it) and the
# ns per clock event reason (1420-1424), watched with the device fields where the bindings know them; an
# engine that refuses them (older than the bindings) gets the device fields without them.
LEDGER_FIELDS = (F.TOTAL_ENERGY_CONSUMPTION, *F.CLOCK_EVENT_NS_FIELDS)
CLOCK_FIELDS = (F.SM_CLOCK,)
# TPA makes OFU; GR, SM and DRAM activity make its loss account (otel_ofu.core.loss).
PROFILING_FIELDS = (F.PIPE_TENSOR_ACTIVE, F.SM_ACTIVE, F.GR_ENGINE_ACTIVE, F.DRAM_ACTIVE, F.PIPE_TENSOR_HMMA_ACTIVE)
# PCIe and NVLink bytes per second: what tells a stalled job from a working one. Profiling fields, tried
# with the others first and left out when this DCGM/GPU cannot watch them together.
TRAFFIC_FIELDS = tuple(F.TRAFFIC_FIELDS)
COUNTER_FIELDS = (F.SM_CYCLES_ELAPSED_TOTAL, F.MMA_CYCLES_ACTIVE_TOTAL)
INT_FIELDS = frozenset({F.SM_CLOCK, F.MAX_SM_CLOCK, F.CLOCKS_EVENT_REASONS, *COUNTER_FIELDS, *LEDGER_FIELDS,
                        *TRAFFIC_FIELDS})


class DcgmError(Exception):
    """A DCGM failure, classified: ``state`` for the status metric, ``message`` for an admin."""

    def __init__(self, state: str, message: str, code: int | None = None):
        super().__init__(f"{state}: {message}")
        self.state, self.message, self.code = state, message, code


@dataclass(frozen=True)
class DcgmBindings:
    """The imported binding modules (real or fake) and where they came from."""

    pydcgm: Any
    dcgm_structs: Any
    dcgm_fields: Any
    dcgm_agent: Any
    path: str = ""


BindingsLoader = Callable[[str | None], DcgmBindings]


def binding_paths(bindings_path: str | None = None) -> list[str]:
    """Where to look for pydcgm, in order: the configured path, DCGM 4.x, DCGM 3.x."""
    paths = [bindings_path] if bindings_path else []
    return paths + [p for p in (DCGM4_BINDINGS, DCGM3_BINDINGS) if p not in paths]


def missing_message(bindings_path: str | None = None) -> str:
    return (f"DCGM Python bindings (pydcgm) not found in {', '.join(binding_paths(bindings_path))} or on PYTHONPATH: "
            "install datacenter-gpu-manager-4 (DCGM 4.x) or set bindings_path to the directory that holds pydcgm.py")


def import_bindings(bindings_path: str | None = None) -> DcgmBindings:
    """Import the real bindings; raises DcgmError(dcgm_missing) saying where it looked."""
    found = ""
    for path in binding_paths(bindings_path):
        if os.path.isfile(os.path.join(path, "pydcgm.py")):
            found = path
            if path not in sys.path:
                sys.path.append(path)  # pydcgm imports its siblings (DcgmHandle, ...) by bare name
            break
    try:
        modules = [importlib.import_module(name) for name in BINDING_MODULES]
    except ImportError as exc:
        if bindings_path and not found:
            raise DcgmError("dcgm_missing", f"bindings_path {bindings_path!r} has no pydcgm.py; "
                            + missing_message(bindings_path)) from None
        extra = "" if exc.name == "pydcgm" else f" (importing them failed: {exc})"
        raise DcgmError("dcgm_missing", missing_message(bindings_path) + extra) from None
    return DcgmBindings(*modules, path=found or os.path.dirname(getattr(modules[0], "__file__", "") or ""))


_loader: BindingsLoader = import_bindings


def get_loader() -> BindingsLoader:
    """The bindings loader receivers and the doctor use (the real one unless a test set one)."""
    return _loader


def set_loader(loader: BindingsLoader | None) -> BindingsLoader:
    """Install a loader (None restores the real one); returns the previous one."""
    global _loader
    previous, _loader = _loader, (loader or import_bindings)
    return previous


# --- error classification ----------------------------------------------------------------


def status_code(bindings: DcgmBindings, exc: BaseException) -> int | None:
    if isinstance(exc, bindings.dcgm_structs.DCGMError):
        return int(exc.value)
    return None


def _codes(bindings: DcgmBindings, *names: str) -> set[int]:
    return {getattr(bindings.dcgm_structs, n) for n in names if hasattr(bindings.dcgm_structs, n)}


def classify_connect_error(bindings: DcgmBindings, exc: BaseException, address: str) -> DcgmError:
    """Why the host engine could not be reached or started, in words an admin can act on."""
    code = status_code(bindings, exc)
    where = f"nv-hostengine at {address}" if address else "an embedded DCGM host engine"
    if code in _codes(bindings, "DCGM_ST_CONNECTION_NOT_VALID", "DCGM_ST_TIMEOUT"):
        return DcgmError("hostengine_unreachable",
                         f"cannot connect to {where}: is nv-hostengine running and listening there? "
                         "(systemctl status nvidia-dcgm; default port 5555), or leave address empty to start "
                         "an embedded host engine", code)
    if code in _codes(bindings, "DCGM_ST_LIBRARY_NOT_FOUND"):
        return DcgmError("dcgm_missing", "the DCGM library libdcgm.so.4 was not found: install "
                         "datacenter-gpu-manager-4 (the Python bindings alone are not enough) or add its library "
                         "directory to LD_LIBRARY_PATH", code)
    if code in _codes(bindings, "DCGM_ST_NVML_NOT_LOADED", "DCGM_ST_NVML_ERROR", "DCGM_ST_NVML_DRIVER_TIMEOUT"):
        return DcgmError("hostengine_refused", f"{where} could not use NVML: is the NVIDIA driver installed and "
                         f"loaded (nvidia-smi)? DCGM says: {exc}", code)
    if code in _codes(bindings, "DCGM_ST_REQUIRES_ROOT", "DCGM_ST_NO_PERMISSION"):
        return DcgmError("hostengine_refused", f"{where} refused: not permitted ({exc}); run as root or connect "
                         "to the system nv-hostengine with address", code)
    if code is not None:
        return DcgmError("hostengine_refused", f"{where} refused: {exc} (DCGM status {code})", code)
    return DcgmError("hostengine_refused", f"{where} failed: {type(exc).__name__}: {exc}")


def classify_profiling_error(bindings: DcgmBindings, exc: BaseException) -> DcgmError:
    """Why the profiling fields (1001+) cannot be watched."""
    code = status_code(bindings, exc)
    if code in _codes(bindings, "DCGM_ST_REQUIRES_ROOT", "DCGM_ST_NO_PERMISSION"):
        return DcgmError("profiling_no_permission",
                         "DCGM profiling is restricted to root: run nv-hostengine as root (or set the NVIDIA driver "
                         "option NVreg_RestrictProfilingToAdminUsers=0) and point address at it, or use the nvml "
                         "receiver (GPM, Hopper and newer)", code)
    if code in _codes(bindings, "DCGM_ST_IN_USE"):
        return DcgmError("profiling_in_use",
                         "another client holds the GPU profiling counters, and only one can per machine: stop it "
                         "(Nsight Compute/Systems, another nv-hostengine, dcgm-exporter's embedded engine) or point "
                         "address at the host engine that owns them", code)
    if code in _codes(bindings, "DCGM_ST_PAUSED"):
        return DcgmError("profiling_paused", "DCGM profiling is paused: resume it with dcgmi profile --resume (or wait "
                         "for a running diagnostic to finish)", code)
    if code in _codes(bindings, "DCGM_ST_PROFILING_NOT_SUPPORTED", "DCGM_ST_NOT_SUPPORTED",
                      "DCGM_ST_GPU_NOT_SUPPORTED", "DCGM_ST_MODULE_NOT_LOADED", "DCGM_ST_PROFILING_MULTI_PASS",
                      "DCGM_ST_INSUFFICIENT_DRIVER_VERSION"):
        return DcgmError("profiling_not_supported",
                         "DCGM profiling fields are not available on these GPUs: they need a datacenter GPU (Volta "
                         "or newer) and DCGM's profiling module; on Hopper and newer use the nvml receiver (GPM) "
                         f"instead. DCGM said: {exc}", code)
    if code in _codes(bindings, "DCGM_ST_CONNECTION_NOT_VALID"):
        return DcgmError("hostengine_lost", "the connection to the host engine was lost", code)
    return DcgmError("profiling_error", f"watching the profiling fields failed: {exc}", code)


# --- a session -----------------------------------------------------------------------------


@dataclass
class DcgmEntity:
    """What one sample describes: a GPU, or a MIG GPU instance (profiling fields are per instance)."""

    key: tuple[int, int]  # (entityGroupId, entityId) the profiling fields are read from
    gpu_id: int  # the physical GPU: clocks, power and event reasons are read from it
    uuid: str
    model: str
    pci_bus_id: str = ""
    mig_instance_id: int | None = None  # NVML GPU instance id (dcgm-exporter's GPU_I_ID)
    mig_profile_id: int | None = None
    mig_slices: int | None = None


Series = dict[int, list[tuple[int, object]]]  # field id -> [(ts in usec, raw value)], oldest first

_group_names = itertools.count(1)


@dataclass
class _Watch:
    name: str
    field_ids: tuple[int, ...]
    entities: Any  # the pydcgm.DcgmGroup of entities watched
    group: Any = None  # pydcgm.DcgmFieldGroup
    collection: Any = None  # what GetAllSinceLastCall_v2 returned last


@dataclass
class DcgmSession:
    """One connection to a host engine (embedded or remote) with this receiver's watches."""

    bindings: DcgmBindings
    address: str = ""  # "" = embedded host engine
    collection_interval_s: float = 10.0
    clock_interval_s: float = 1.0
    gpu_ids: list[int] = field(default_factory=list)  # [] = all supported GPUs
    mig: bool = True
    counters: bool = True
    entities: list[DcgmEntity] = field(default_factory=list)
    profiling_fields: tuple[int, ...] = ()
    _handle: Any = None
    _system: Any = None
    _gpus: Any = None  # DcgmGroup of the physical GPUs: clocks, power, event reasons
    _profiled: Any = None  # DcgmGroup of what profiling is read from: whole GPUs and MIG GPU instances
    _watches: list[_Watch] = field(default_factory=list)

    # -- lifecycle

    def open(self) -> None:
        """Connect (or start the embedded engine), discover GPUs and MIG instances, watch device fields."""
        b = self.bindings
        try:
            socket_path = self.address[len("unix://"):] if self.address.startswith("unix://") else None
            self._handle = b.pydcgm.DcgmHandle(ipAddress=None if socket_path else (self.address or None),
                                               unixSocketPath=socket_path,
                                               opMode=b.dcgm_structs.DCGM_OPERATION_MODE_AUTO)
            self._system = self._handle.GetSystem()
        except Exception as exc:
            self.close()
            raise classify_connect_error(b, exc, self.address) from None
        try:
            self.entities = self._discover()
            if not self.entities:
                raise DcgmError("no_gpus", "DCGM sees no supported GPU" + (f" among gpu_ids {self.gpu_ids}"
                                if self.gpu_ids else "") + ": check `dcgmi discovery -l` and `nvidia-smi`")
            self._gpus = self._system.GetEmptyGroup(self._unique_name("gpus"))
            for gpu_id in sorted({e.gpu_id for e in self.entities}):
                self._gpus.AddEntity(b.dcgm_fields.DCGM_FE_GPU, gpu_id)
            self._profiled = self._system.GetEmptyGroup(self._unique_name("profiled"))
            for entity in self.entities:
                self._profiled.AddEntity(*entity.key)
            keep_age = max(60.0, 3 * self.collection_interval_s)
            self._watch_device(keep_age)
            self._watch_in_base_units("clock", CLOCK_FIELDS, self.clock_interval_s, keep_age, self._gpus)
        except DcgmError:
            self.close()
            raise
        except Exception as exc:
            self.close()
            raise classify_connect_error(b, exc, self.address) from None

    def watch_profiling(self) -> tuple[int, ...]:
        """Watch the profiling fields, dropping what this DCGM/GPU cannot watch together.

        Tries the raw cycle counters (1084/1086) and the PCIe/NVLink traffic (1009-1012) with the
        ratio fields first, then without the traffic, then without the counters, then TPA with the
        loss account's ratios (GR, SM, DRAM), then TPA and SM, then TPA alone (GPUs before Hopper
        cannot watch every group together). Raises DcgmError(profiling_*) when none can be watched.
        """
        b = self.bindings
        known = [f for f in PROFILING_FIELDS + TRAFFIC_FIELDS + (COUNTER_FIELDS if self.counters else ())
                 if b.dcgm_fields.DcgmFieldGetById(f) is not None]
        ratios = tuple(f for f in known if f not in COUNTER_FIELDS)
        attempts = [tuple(known), tuple(f for f in known if f not in TRAFFIC_FIELDS), ratios,
                    tuple(f for f in ratios if f not in TRAFFIC_FIELDS),
                    tuple(f for f in ratios if f in (F.PIPE_TENSOR_ACTIVE, F.GR_ENGINE_ACTIVE, F.SM_ACTIVE,
                                                     F.DRAM_ACTIVE)),
                    tuple(f for f in ratios if f in (F.PIPE_TENSOR_ACTIVE, F.SM_ACTIVE)), (F.PIPE_TENSOR_ACTIVE,)]
        keep_age = max(60.0, 3 * self.collection_interval_s)
        error: DcgmError | None = None
        for ids in dict.fromkeys(a for a in attempts if a):  # unique, in order
            try:
                self._watch("profiling", ids, self.collection_interval_s, keep_age, self._profiled)
            except DcgmError as exc:
                error = exc
                if exc.state not in ("profiling_not_supported", "profiling_error"):
                    raise  # permission, lock, lost connection: fewer fields will not help
                continue
            self.profiling_fields = ids
            if not set(COUNTER_FIELDS) <= set(ids):
                self.counters = False
            return ids
        raise error or DcgmError("profiling_not_supported", "this DCGM knows none of the profiling fields")

    def close(self) -> None:
        """Release watches, the group and the handle; never raises (the engine may be gone)."""
        for watch in self._watches:
            _quietly(lambda w=watch: w.entities.samples.UnwatchFields(w.group))
            _quietly(watch.group.Delete)
        self._watches = []
        for group in (self._gpus, self._profiled):
            if group is not None:
                _quietly(group.Delete)
        self._gpus = self._profiled = None
        if self._handle is not None:
            _quietly(self._handle.Shutdown)
            self._handle = None
        self._system = None

    # -- reading

    def read(self) -> dict[tuple[int, int], Series]:
        """Every value since the last call: {(entityGroupId, entityId): {field id: [(ts_us, value)]}}.

        A blank that DCGM returns without a value (status not OK) comes back as the blank
        sentinel of the field's type, so it is reported as blank, never as a number.
        """
        b = self.bindings
        out: dict[tuple[int, int], Series] = {}
        for watch in self._watches:
            try:
                watch.collection = watch.entities.samples.GetAllSinceLastCall_v2(watch.collection, watch.group)
            except b.dcgm_structs.DCGMError as exc:
                code = status_code(b, exc)
                if code in _codes(b, "DCGM_ST_CONNECTION_NOT_VALID"):
                    raise DcgmError("hostengine_lost", f"the connection to {self._where()} was lost: {exc}",
                                    code) from None
                raise DcgmError("read_error", f"reading {watch.name} fields failed: {exc}", code) from None
            for group_id, by_entity in watch.collection.values.items():
                for entity_id, by_field in by_entity.items():
                    series = out.setdefault((int(group_id), int(entity_id)), {})
                    for field_id, values in by_field.items():
                        series.setdefault(int(field_id), []).extend(
                            (int(v.ts), _raw_value(v, int(field_id))) for v in values)
            watch.collection.EmptyValues()
        return out

    # -- internals

    def _where(self) -> str:
        return f"nv-hostengine at {self.address}" if self.address else "the embedded host engine"

    def _unique_name(self, what: str) -> str:
        return f"otel_ofu_{os.getpid()}_{what}_{next(_group_names)}"

    def _watch(self, name: str, field_ids: Iterable[int], interval_s: float, keep_age_s: float, entities: Any) -> None:
        b = self.bindings
        ids = [int(f) for f in field_ids]
        try:
            group = b.pydcgm.DcgmFieldGroup(self._handle, self._unique_name(name), ids)
        except Exception as exc:
            raise self._classify_watch(name, exc) from None
        try:
            entities.samples.WatchFields(group, int(interval_s * 1e6), keep_age_s, 0)
        except Exception as exc:
            _quietly(group.Delete)
            raise self._classify_watch(name, exc) from None
        self._watches = [w for w in self._watches if w.name != name] + [_Watch(name, tuple(ids), entities, group)]

    def _watch_device(self, keep_age_s: float) -> None:
        """The device fields with the ledger's counters the bindings know; without them when the engine
        refuses them (a remote nv-hostengine older than the bindings), so OFU never waits on them."""
        known = self.bindings.dcgm_fields.DcgmFieldGetById
        ledger = tuple(f for f in LEDGER_FIELDS if known(f) is not None)
        if ledger:
            try:
                self._watch_in_base_units("device", DEVICE_FIELDS + ledger, self.collection_interval_s, keep_age_s,
                                          self._gpus)
                return
            except DcgmError as exc:
                if exc.state == "hostengine_lost":
                    raise
                log.info("the host engine refused the energy and clock event time fields (%s): watching the device "
                         "fields without them", exc.message)
        self._watch_in_base_units("device", DEVICE_FIELDS, self.collection_interval_s, keep_age_s, self._gpus)

    def _watch_in_base_units(self, name: str, field_ids: tuple[int, ...], interval_s: float, keep_age_s: float,
                             entities: Any) -> None:
        """Watch the base-unit field (DCGM 4.6.1: SM clock in Hz) in place of each old one where the bindings
        know it; the old fields when they do not, or when the host engine refuses them (an older remote one).
        The receiver reads either through ``dcgm_fields.series_in_legacy_units``."""
        known = self.bindings.dcgm_fields.DcgmFieldGetById
        base = tuple(F.REPLACED_BY[f] if f in F.REPLACED_BY and known(F.REPLACED_BY[f]) is not None else f
                     for f in field_ids)
        if base != field_ids:
            try:
                self._watch(name, base, interval_s, keep_age_s, entities)
                return
            except DcgmError as exc:
                if exc.state == "hostengine_lost":
                    raise
        self._watch(name, field_ids, interval_s, keep_age_s, entities)

    def _classify_watch(self, name: str, exc: BaseException) -> DcgmError:
        if name == "profiling":
            return classify_profiling_error(self.bindings, exc)
        code = status_code(self.bindings, exc)
        if code in _codes(self.bindings, "DCGM_ST_CONNECTION_NOT_VALID"):
            return DcgmError("hostengine_lost", f"the connection to {self._where()} was lost", code)
        return DcgmError("hostengine_refused", f"watching the {name} fields failed: {exc}", code)

    def _discover(self) -> list[DcgmEntity]:
        b = self.bindings
        discovery = self._system.discovery
        gpu_ids = [int(g) for g in discovery.GetAllSupportedGpuIds()]
        if self.gpu_ids:
            gpu_ids = [g for g in gpu_ids if g in set(self.gpu_ids)]
        gpus = {}
        for gpu_id in gpu_ids:
            ident = discovery.GetGpuAttributes(gpu_id).identifiers
            gpus[gpu_id] = DcgmEntity((b.dcgm_fields.DCGM_FE_GPU, gpu_id), gpu_id, str(ident.uuid),
                                      str(ident.deviceName), str(ident.pciBusId))
        instances = self._mig_instances(gpus) if self.mig else []
        with_mig = {e.gpu_id for e in instances}
        return [g for gid, g in gpus.items() if gid not in with_mig] + instances

    def _mig_instances(self, gpus: dict[int, DcgmEntity]) -> list[DcgmEntity]:
        """GPU instances of MIG-enabled GPUs: their own entities for the profiling fields."""
        b = self.bindings
        try:
            hierarchy = b.dcgm_agent.dcgmGetGpuInstanceHierarchy(self._handle.handle)
        except Exception as exc:  # MIG not supported / older DCGM: treat every GPU as whole
            log.debug("no MIG hierarchy from DCGM: %s", exc)
            return []
        out = []
        for i in range(int(hierarchy.count)):
            item = hierarchy.entityList[i]
            if item.entity.entityGroupId != b.dcgm_fields.DCGM_FE_GPU_I:
                continue
            parent = gpus.get(int(item.parent.entityId))
            if parent is None:
                continue
            out.append(DcgmEntity((b.dcgm_fields.DCGM_FE_GPU_I, int(item.entity.entityId)), parent.gpu_id,
                                  parent.uuid, parent.model, parent.pci_bus_id,
                                  mig_instance_id=int(item.info.nvmlInstanceId),
                                  mig_profile_id=int(item.info.nvmlMigProfileId),
                                  mig_slices=int(item.info.nvmlProfileSlices)))
        return out


def _raw_value(value: Any, field_id: int) -> object:
    raw = getattr(value, "value", None)
    if raw is None:  # DcgmFieldValue with a non-OK status: isBlank, no value
        return DCGM_INT64_BLANK if field_id in INT_FIELDS else DCGM_FP64_BLANK
    return raw


def _quietly(call: Callable[[], object]) -> None:
    try:
        call()
    except Exception as exc:  # cleanup against an engine that may be gone
        log.debug("DCGM cleanup: %s", exc)
