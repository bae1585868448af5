"""A fake DCGM: binding modules shaped like the real ones, over a scriptable host engine.

Shapes follow NVIDIA/DCGM testing/python3 (checked against the sources): pydcgm's
``DcgmHandle(handle=None, ipAddress=None, opMode=DCGM_OPERATION_MODE_AUTO,
persistAfterDisconnect=False, unixSocketPath=None, timeoutMs=0)`` with ``GetSystem()`` and
``Shutdown()`` (DcgmHandle.py); ``DcgmSystem.discovery.GetAllSupportedGpuIds()`` /
``GetGpuAttributes(gpuId).identifiers.{uuid,deviceName,pciBusId}``, ``GetEmptyGroup(name)``,
``UpdateAllFields(waitForUpdate)``, ``profiling.Pause()/Resume()`` (DcgmSystem.py);
``DcgmGroup.AddEntity(entityGroupId, entityId)``, ``samples.WatchFields(fieldGroup, updateFreq,
maxKeepAge, maxKeepSamples)``, ``UnwatchFields``, ``GetAllSinceLastCall_v2(dfvec, fieldGroup)``
(first call = latest values; no new values = latest again), ``Delete()`` (DcgmGroup.py);
``DcgmFieldGroup(dcgmHandle, name="", fieldIds=None, fieldGroupId=None)`` (DcgmFieldGroup.py);
values as ``DcgmFieldValue`` (ts usec, fieldId, fieldType, isBlank, value = None when the
status is not OK) in ``DcgmFieldValueTimeSeries`` under ``.values[entityGroupId][entityId]
[fieldId]``, ``EmptyValues()`` (dcgm_field_helpers.py); ``DCGMError`` with per-code subclasses
and ``dcgmExceptionClass``, DCGM_ST_* codes (dcgm_structs.py); DCGM_FE_* and DCGM_FT_*
(dcgm_fields.py); ``dcgmGetGpuInstanceHierarchy(handle)`` returning ``c_dcgmMigHierarchy_v2``
(dcgm_agent.py, dcgm_structs.py). Blank sentinels are dcgmvalue.py's.
"""

from __future__ import annotations

import ctypes
import string
import types
from dataclasses import dataclass, field

from otel_ofu.core.values import DCGM_FP64_BLANK, DCGM_INT64_BLANK
from otel_ofu.gpu.dcgm_api import DcgmBindings

# --- dcgm_structs ---------------------------------------------------------------------------

ST_CODES = {
    "DCGM_ST_OK": 0, "DCGM_ST_BADPARAM": -1, "DCGM_ST_GENERIC_ERROR": -3, "DCGM_ST_NOT_SUPPORTED": -6,
    "DCGM_ST_INIT_ERROR": -7, "DCGM_ST_NVML_ERROR": -8, "DCGM_ST_TIMEOUT": -11, "DCGM_ST_UNKNOWN_FIELD": -13,
    "DCGM_ST_NO_DATA": -14, "DCGM_ST_NOT_WATCHED": -16, "DCGM_ST_NO_PERMISSION": -17, "DCGM_ST_GPU_IS_LOST": -18,
    "DCGM_ST_CONNECTION_NOT_VALID": -21, "DCGM_ST_GPU_NOT_SUPPORTED": -22, "DCGM_ST_LIBRARY_NOT_FOUND": -25,
    "DCGM_ST_REQUIRES_ROOT": -29, "DCGM_ST_MODULE_NOT_LOADED": -33, "DCGM_ST_IN_USE": -34,
    "DCGM_ST_GROUP_IS_EMPTY": -35, "DCGM_ST_PROFILING_NOT_SUPPORTED": -36, "DCGM_ST_PROFILING_LIBRARY_ERROR": -37,
    "DCGM_ST_PROFILING_MULTI_PASS": -38, "DCGM_ST_INSUFFICIENT_DRIVER_VERSION": -44, "DCGM_ST_PAUSED": -54,
    "DCGM_ST_NVML_NOT_LOADED": -56,
}


def _make_structs() -> types.ModuleType:
    mod = types.ModuleType("dcgm_structs")
    for name, value in ST_CODES.items():
        setattr(mod, name, value)
    mod.DCGM_OPERATION_MODE_AUTO = 1
    mod.DCGM_OPERATION_MODE_MANUAL = 2
    mod.DCGM_GROUP_EMPTY = 1
    mod.DCGM_GROUP_ALL_GPUS = 0x7FFFFFFF

    class DCGMError(Exception):
        _valClassMapping: dict[int, type] = {}

        def __new__(typ, value):
            if typ == DCGMError:
                typ = DCGMError._valClassMapping.get(value, typ)
            obj = Exception.__new__(typ)
            obj.info = None
            obj.value = value
            return obj

        def __str__(self):
            return f"DCGM Error with code {self.value}"

        def __eq__(self, other):
            return self.value == other.value

        def __hash__(self):
            return hash(self.value)

    for name, value in ST_CODES.items():  # as _extractDCGMErrorsAsClasses does
        class_name = "DCGMError_" + string.capwords(name.replace("DCGM_ST_", ""), "_").replace("_", "")

        def new(typ, _val=value):
            return DCGMError.__new__(typ, _val)

        cls = type(class_name, (DCGMError,), {"__new__": new})
        setattr(mod, class_name, cls)
        DCGMError._valClassMapping[value] = cls
    mod.DCGMError = DCGMError
    mod.dcgmExceptionClass = lambda error_code: DCGMError._valClassMapping.get(error_code)

    class c_dcgmGroupEntityPair_t(ctypes.Structure):
        _fields_ = [("entityGroupId", ctypes.c_uint32), ("entityId", ctypes.c_uint32)]

    class c_dcgmMigEntityInfo_t(ctypes.Structure):
        _fields_ = [("gpuUuid", ctypes.c_char * 128), ("nvmlGpuIndex", ctypes.c_uint),
                    ("nvmlInstanceId", ctypes.c_uint), ("nvmlComputeInstanceId", ctypes.c_uint),
                    ("nvmlMigProfileId", ctypes.c_uint), ("nvmlProfileSlices", ctypes.c_uint)]

    class c_dcgmMigHierarchyInfo_v2(ctypes.Structure):
        _fields_ = [("entity", c_dcgmGroupEntityPair_t), ("parent", c_dcgmGroupEntityPair_t),
                    ("info", c_dcgmMigEntityInfo_t)]

    class c_dcgmMigHierarchy_v2(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint), ("count", ctypes.c_uint),
                    ("entityList", c_dcgmMigHierarchyInfo_v2 * (32 * 14))]

    mod.c_dcgmGroupEntityPair_t = c_dcgmGroupEntityPair_t
    mod.c_dcgmMigHierarchy_v2 = c_dcgmMigHierarchy_v2

    def _dcgmInit(libDcgmPath=None):
        return None

    mod._dcgmInit = _dcgmInit
    return mod


# --- the engine ------------------------------------------------------------------------------

FE_GPU, FE_GPU_I, FE_GPU_CI = 1, 4, 5
# Profiling fields: DCGM_FI_PROF_FIRST_ID (1001) to DCGM_FI_PROF_LAST_ID (1096, FP16_CYCLES_ACTIVE_TOTAL) and the
# per-link NVLink bytes (1532-1533) (NVIDIA/DCGM dcgmlib/dcgm_fields_internal.hpp DCGM_FIELD_ID_IS_PROF_FIELD at
# v4.6.0); 1420-1424 (clock event time) and 1600-1612 (base-unit fields) are device fields.
PROFILING_MIN_FIELD = 1001
PROFILING_END_FIELD = 1097
BASE_UNIT_FIELDS = {1600, 1601, 1602, 1603, 1604, 1605, 1606, 1607, 1608, 1609, 1610, 1611, 1612}
COUNTERS = (1084, 1086)
LEDGER = (156, 1420, 1421, 1422, 1423, 1424)  # energy (mJ), ns per clock event reason: DCGM_FT_INT64
TRAFFIC = (1009, 1010, 1011, 1012)  # PCIe/NVLink bytes per second: profiling fields, DCGM_FT_INT64
INT_FIELDS = {100, 112, 113, 1084, 1086, *LEDGER, *TRAFFIC}
_PROFILING_CODES = {"not_supported": "DCGM_ST_PROFILING_NOT_SUPPORTED", "no_permission": "DCGM_ST_REQUIRES_ROOT",
                    "in_use": "DCGM_ST_IN_USE", "multi_pass": "DCGM_ST_PROFILING_MULTI_PASS"}


@dataclass
class FakeMigInstance:
    entity_id: int  # DCGM GPU_I entity id
    nvml_instance_id: int
    profile_id: int = 19
    slices: int = 1


@dataclass
class FakeDcgmGpu:
    gpu_id: int
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    pci_bus_id: str = ""
    mig: list[FakeMigInstance] = field(default_factory=list)

    def __post_init__(self):
        self.uuid = self.uuid or f"GPU-0000000{self.gpu_id}-aaaa-bbbb-cccc-dddddddddddd"
        self.pci_bus_id = self.pci_bus_id or f"00000000:{0x18 + self.gpu_id:02X}:00.0"


class FakeDcgmEngine:
    """A host engine the test scripts: GPUs, pushed field values, failures."""

    def __init__(self, gpus: list[FakeDcgmGpu]):
        self.gpus = {g.gpu_id: g for g in gpus}
        self.running = True  # a remote nv-hostengine is up
        self.refuse_code: str | None = None  # DCGM_ST_* name the handle constructor fails with
        self.profiling = "ok"  # ok | not_supported | no_permission | in_use | multi_pass
        self.multi_pass_fields: set[int] = set()  # watching these together with others gives MULTI_PASS
        self.paused = False  # profiling paused: DCGM stores blanks
        self.counters_known = True  # DCGM >= 4.6 knows fields 1084/1086
        self.base_units_known = False  # the bindings are DCGM >= 4.6.1's: they know fields 1600-1612
        self.ledger_known = True  # the bindings know 156, 1009-1012 and 1420-1424 (DCGM >= 3.3)
        self.refused_fields: set[int] = set()  # watching any of these fails (an older remote host engine)
        self.generation = 0
        self.store: dict[tuple[int, int, int], list[tuple[int, object]]] = {}
        # field group id -> (field ids, update usec, entities of the group watched)
        self.watched: dict[int, tuple[tuple[int, ...], int, tuple[tuple[int, int], ...]]] = {}
        self.handles_opened = 0
        self.addresses: list[str | None] = []
        self.structs = _make_structs()

    # -- scripting

    def error(self, name: str) -> Exception:
        return self.structs.DCGMError(getattr(self.structs, name))

    def stop(self) -> None:
        """The nv-hostengine goes away: every existing handle is dead."""
        self.running = False
        self.generation += 1
        self.watched.clear()

    def start(self) -> None:
        self.running = True

    def push(self, entity: tuple[int, int], field_id: int, ts_us: int, value: object) -> None:
        if self.paused and PROFILING_MIN_FIELD <= field_id < PROFILING_END_FIELD:
            value = DCGM_INT64_BLANK if field_id in INT_FIELDS else DCGM_FP64_BLANK
        self.store.setdefault((entity[0], entity[1], field_id), []).append((ts_us, value))

    def bindings(self, path: str | None = None) -> DcgmBindings:
        """The loader the receiver calls: fake binding modules over this engine."""
        return DcgmBindings(_pydcgm(self), self.structs, _fields(self), _agent(self), path=path or "/fake/dcgm")


# --- pydcgm ---------------------------------------------------------------------------------


class FakeFieldValue:
    """dcgm_field_helpers.DcgmFieldValue: value is None when the status was not OK."""

    def __init__(self, ts: int, field_id: int, value: object):
        self.ts = ts
        self.fieldId = field_id
        self.fieldType = "i" if field_id in INT_FIELDS else "d"
        self.value = value
        if value is None:
            self.isBlank = True
        elif self.fieldType == "i":
            self.isBlank = value >= DCGM_INT64_BLANK  # type: ignore[operator]
        else:
            self.isBlank = value >= DCGM_FP64_BLANK  # type: ignore[operator]


class FakeTimeSeries:
    """dcgm_field_helpers.DcgmFieldValueTimeSeries: values in timestamp order."""

    def __init__(self):
        self.values: list[FakeFieldValue] = []

    def __len__(self):
        return len(self.values)

    def __getitem__(self, key):
        return self.values[key]

    def InsertValue(self, value):
        self.values.append(value)
        self.values.sort(key=lambda v: v.ts)


class FakeEntityCollection:
    """dcgm_field_helpers.DcgmFieldValueEntityCollection."""

    def __init__(self, handle, groupId):
        self.values: dict = {}
        self._handle = handle
        self._groupId = groupId
        self._since: dict[tuple[int, int, int], int] = {}

    def _add(self, key, ts, value):
        egid, eid, fid = key
        by_field = self.values.setdefault(egid, {}).setdefault(eid, {})
        by_field.setdefault(fid, FakeTimeSeries()).InsertValue(FakeFieldValue(ts, fid, value))

    def EmptyValues(self):
        self.values = {}


def _pydcgm(engine: FakeDcgmEngine) -> types.ModuleType:
    mod = types.ModuleType("pydcgm")
    structs = engine.structs
    group_ids = iter(range(100, 10_000))

    def check(generation: int) -> None:
        if generation != engine.generation:
            raise engine.error("DCGM_ST_CONNECTION_NOT_VALID")

    class DcgmHandle:
        def __init__(self, handle=None, ipAddress=None, opMode=structs.DCGM_OPERATION_MODE_AUTO,
                     persistAfterDisconnect=False, unixSocketPath=None, timeoutMs=0):
            engine.addresses.append(ipAddress or unixSocketPath)
            if engine.refuse_code:
                raise engine.error(engine.refuse_code)
            if (ipAddress or unixSocketPath) and not engine.running:
                raise engine.error("DCGM_ST_CONNECTION_NOT_VALID")
            self.handle = 1 + engine.handles_opened
            self.isEmbedded = ipAddress is None and unixSocketPath is None
            self._generation = engine.generation
            self._open = True
            engine.handles_opened += 1

        def GetSystem(self):
            check(self._generation)
            return DcgmSystem(self)

        def Shutdown(self):
            self._open = False

    class _Discovery:
        def __init__(self, handle):
            self._handle = handle

        def GetAllSupportedGpuIds(self):
            check(self._handle._generation)
            return sorted(engine.gpus)

        def GetAllGpuIds(self):
            return self.GetAllSupportedGpuIds()

        def GetGpuAttributes(self, gpuId):
            check(self._handle._generation)
            gpu = engine.gpus[gpuId]
            ident = types.SimpleNamespace(uuid=gpu.uuid, deviceName=gpu.name, pciBusId=gpu.pci_bus_id)
            return types.SimpleNamespace(identifiers=ident)

    class _Profiling:
        def __init__(self, handle):
            self._handle = handle

        def Pause(self):
            engine.paused = True

        def Resume(self):
            engine.paused = False

    class DcgmSystem:
        def __init__(self, dcgmHandle):
            self._dcgmHandle = dcgmHandle
            self.discovery = _Discovery(dcgmHandle)
            self.profiling = _Profiling(dcgmHandle)

        def UpdateAllFields(self, waitForUpdate):
            check(self._dcgmHandle._generation)

        def GetEmptyGroup(self, groupName):
            check(self._dcgmHandle._generation)
            return DcgmGroup(self._dcgmHandle, groupName=groupName)

    class _Samples:
        def __init__(self, group):
            self._group = group

        def WatchFields(self, fieldGroup, updateFreq, maxKeepAge, maxKeepSamples):
            check(self._group._handle._generation)
            ids = tuple(fieldGroup.fieldIds)
            if engine.refused_fields & set(ids):
                raise engine.error("DCGM_ST_UNKNOWN_FIELD")
            if any(PROFILING_MIN_FIELD <= f < PROFILING_END_FIELD for f in ids):
                if engine.profiling != "ok":
                    raise engine.error(_PROFILING_CODES[engine.profiling])
                if engine.multi_pass_fields & set(ids) and len(ids) > 1:
                    raise engine.error("DCGM_ST_PROFILING_MULTI_PASS")
            engine.watched[fieldGroup.fieldGroupId] = (ids, int(updateFreq), tuple(self._group._entities))

        def UnwatchFields(self, fieldGroup):
            check(self._group._handle._generation)
            engine.watched.pop(fieldGroup.fieldGroupId, None)

        def GetAllSinceLastCall_v2(self, dfvec, fieldGroup):
            check(self._group._handle._generation)
            if dfvec is None:
                dfvec = FakeEntityCollection(self._group._handle.handle, self._group._groupId)
                self._collect(dfvec, fieldGroup, latest=True)
            else:
                self._collect(dfvec, fieldGroup, latest=False)
                if len(dfvec.values) == 0:
                    self._collect(dfvec, fieldGroup, latest=True)
            return dfvec

        def _collect(self, dfvec, fieldGroup, latest):
            for egid, eid in self._group._entities:
                for fid in fieldGroup.fieldIds:
                    key = (egid, eid, fid)
                    series = engine.store.get(key, [])
                    if latest:
                        chosen = series[-1:]
                    else:
                        chosen = [(ts, v) for ts, v in series if ts > dfvec._since.get(key, -1)]
                    for ts, value in chosen:
                        dfvec._add(key, ts, value)
                    if series:
                        dfvec._since[key] = max(ts for ts, _ in series)

    class DcgmGroup:
        def __init__(self, dcgmHandle, groupId=None, groupName=None, groupType=structs.DCGM_GROUP_EMPTY):
            self._handle = dcgmHandle
            self._groupId = groupId if groupId is not None else next(group_ids)
            self.name = groupName
            self._entities: list[tuple[int, int]] = []
            self.samples = _Samples(self)
            self.deleted = False

        def AddEntity(self, entityGroupId, entityId):
            check(self._handle._generation)
            self._entities.append((entityGroupId, entityId))

        def AddGpu(self, gpuId):
            self.AddEntity(FE_GPU, gpuId)

        def GetGpuIds(self):
            return [eid for egid, eid in self._entities if egid == FE_GPU]

        def Delete(self):
            check(self._handle._generation)
            self.deleted = True

    class DcgmFieldGroup:
        def __init__(self, dcgmHandle, name="", fieldIds=None, fieldGroupId=None):
            check(dcgmHandle._generation)
            self.name = name
            self.fieldIds = list(fieldIds or [])
            self._dcgmHandle = dcgmHandle
            self.fieldGroupId = next(group_ids)

        def Delete(self):
            check(self._dcgmHandle._generation)

    class DcgmException(Exception):
        pass

    mod.DcgmHandle = DcgmHandle
    mod.DcgmSystem = DcgmSystem
    mod.DcgmGroup = DcgmGroup
    mod.DcgmFieldGroup = DcgmFieldGroup
    mod.DcgmException = DcgmException
    return mod


def _fields(engine: FakeDcgmEngine) -> types.ModuleType:
    mod = types.ModuleType("dcgm_fields")
    mod.DCGM_FT_BINARY, mod.DCGM_FT_DOUBLE, mod.DCGM_FT_INT64, mod.DCGM_FT_STRING = "b", "d", "i", "s"
    mod.DCGM_FE_NONE, mod.DCGM_FE_GPU, mod.DCGM_FE_VGPU, mod.DCGM_FE_SWITCH = 0, FE_GPU, 2, 3
    mod.DCGM_FE_GPU_I, mod.DCGM_FE_GPU_CI = FE_GPU_I, FE_GPU_CI
    known = {100, 110, 112, 113, 155, 1001, 1002, 1004, 1005, 1014, *COUNTERS, *LEDGER, *TRAFFIC}

    def DcgmFieldGetById(fieldId):
        if fieldId in BASE_UNIT_FIELDS and engine.base_units_known:
            return types.SimpleNamespace(fieldId=fieldId, tag=f"field_{fieldId}")
        if fieldId not in known or (fieldId in COUNTERS and not engine.counters_known) or (
                fieldId in (*LEDGER, *TRAFFIC) and not engine.ledger_known):
            return None
        return types.SimpleNamespace(fieldId=fieldId, tag=f"field_{fieldId}")

    mod.DcgmFieldGetById = DcgmFieldGetById
    return mod


def _agent(engine: FakeDcgmEngine) -> types.ModuleType:
    mod = types.ModuleType("dcgm_agent")

    def dcgmGetGpuInstanceHierarchy(dcgm_handle):
        hierarchy = engine.structs.c_dcgmMigHierarchy_v2()
        n = 0
        for gpu in engine.gpus.values():
            for inst in gpu.mig:
                item = hierarchy.entityList[n]
                item.entity.entityGroupId, item.entity.entityId = FE_GPU_I, inst.entity_id
                item.parent.entityGroupId, item.parent.entityId = FE_GPU, gpu.gpu_id
                item.info.gpuUuid = gpu.uuid.encode()
                item.info.nvmlGpuIndex = gpu.gpu_id
                item.info.nvmlInstanceId = inst.nvml_instance_id
                item.info.nvmlMigProfileId = inst.profile_id
                item.info.nvmlProfileSlices = inst.slices
                n += 1
        hierarchy.count = n
        return hierarchy

    mod.dcgmGetGpuInstanceHierarchy = dcgmGetGpuInstanceHierarchy
    return mod
