"""The NVML contract: the calls slurm-gpu makes, their errors, and one error policy.

:class:`NvmlApi` is a closed interface, like mig-parted's ``internal/nvml``:
exactly the NVML calls the code makes, with pynvml's names and argument
order.  Every backend implements it explicitly:

* the driver through pynvml (:class:`slurm_gpu.hw.nvml.PynvmlApi`),
* a snapshot replay (:class:`slurm_gpu.hw.nvml_replay.ReplayNvml`),
* a fault overlay and a recorder around any backend
  (:mod:`slurm_gpu.hw.nvml_overlay`, :mod:`slurm_gpu.hw.nvml_record`),
* the simulator (``SimNvml``, outside the runtime).

The wrappers derive from :class:`NvmlForward`, which spells out each call
once and hands it to one ``_call``; nothing answers a name outside the
contract, so a fake cannot quietly accept a call the real driver would
need to be asked about.

Errors: every backend raises :class:`NVMLError` (the pynvml adapter turns
pynvml's errors into it), with NVML's numeric ``value``.  What a code
*means* is decided once, in :func:`classify` (see :class:`Reader`).
"""
from __future__ import annotations

import string
from typing import Any, Callable, Mapping, Protocol

from . import nvml_constants as C

# An NVML handle (device, MIG device, GPU or compute instance, event set,
# GPM sample): a ctypes pointer from pynvml, a :class:`Handle` elsewhere.
# Opaque to every caller, so it stays Any.
NvmlHandle = Any

# ----------------------------------------------------------------- errors

_ERROR_STRINGS = {
    C.NVML_ERROR_UNINITIALIZED: "Uninitialized",
    C.NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    C.NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    C.NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    C.NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    C.NVML_ERROR_NOT_FOUND: "Not Found",
    C.NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    C.NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
    C.NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    C.NVML_ERROR_TIMEOUT: "Timeout",
    C.NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
    C.NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    C.NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    C.NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
    C.NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    C.NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    C.NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
    C.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    C.NVML_ERROR_IN_USE: "In use by another client",
    C.NVML_ERROR_MEMORY: "Insufficient Memory",
    C.NVML_ERROR_NO_DATA: "No data",
    C.NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient resources",
    C.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    C.NVML_ERROR_NOT_READY: "Not ready",
    C.NVML_ERROR_GPU_NOT_FOUND: "GPU not found",
    C.NVML_ERROR_INVALID_STATE: "Invalid state",
    C.NVML_ERROR_UNKNOWN: "Unknown Error",
}

ERROR_NAMES: dict[int, str] = {getattr(C, n): n for n in dir(C) if n.startswith("NVML_ERROR_")}


def error_name(code: int) -> str:
    """``15`` -> ``"NVML_ERROR_GPU_IS_LOST"``."""
    return ERROR_NAMES.get(code, f"NVML_ERROR_{code}")


def error_code(value: int | str) -> int:
    """Accept ``15``, ``"NVML_ERROR_GPU_IS_LOST"`` or ``"GPU_IS_LOST"``."""
    if isinstance(value, int):
        return value
    name = value if value.startswith("NVML_ERROR_") else f"NVML_ERROR_{value}"
    code = getattr(C, name, None)
    if not isinstance(code, int):
        raise ValueError(f"unknown NVML error {value!r}")
    return code


class NVMLError(Exception):
    """An NVML call failed with return code ``value``.

    ``NVMLError(code)`` builds the code's subclass, named like pynvml's
    (``NVMLError_GpuIsLost``), so ``except NVMLError_Timeout`` reads the same.
    """

    _by_code: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int | None = None) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (NVMLError, (self.value,))

    @property
    def name(self) -> str:
        """``NVML_ERROR_GPU_IS_LOST``."""
        return error_name(self.value)


def _error_classes() -> dict[str, type[NVMLError]]:
    out: dict[str, type[NVMLError]] = {}
    for code, name in sorted(ERROR_NAMES.items(), key=lambda kv: kv[1]):
        cls_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")

        def new(typ: type[NVMLError], *args: Any, _code: int = code) -> NVMLError:
            return NVMLError.__new__(typ, _code)

        cls = type(cls_name, (NVMLError,), {"__new__": new, "__module__": __name__})
        NVMLError._by_code[code] = cls
        out[cls_name] = cls
    return out


ERROR_CLASSES = _error_classes()


# ----------------------------------------------------------- error policy
#
# One table for every reader (the node model, the health check, usage, the
# GPU interface): what an NVML return code means for a query.
#
# * ABSENT: the query does not apply here (NVLink on a PCIe card, MIG on a
#   GPU without it, a function this driver or nvidia-ml-py lacks).  The
#   answer is "none": an optional query gives its default.
# * DENIED (NO_PERMISSION): the answer exists but this process may not read
#   it (not root).  The answer is *unknown*: an optional query gives its
#   default, never a fault of the GPU; a reader that reports per query
#   (the health check) names it, so that "unknown" is never taken for
#   "none" (an unreadable process list is not an empty one).
# * FAULT: anything else (GPU_IS_LOST, UNKNOWN, ...): the call failed and
#   the caller's rule for a failed GPU applies.

ABSENT = "absent"
DENIED = "denied"
FAULT = "fault"

ABSENT_CODES = frozenset({C.NVML_ERROR_NOT_SUPPORTED, C.NVML_ERROR_FUNCTION_NOT_FOUND,
                          C.NVML_ERROR_INVALID_ARGUMENT, C.NVML_ERROR_NOT_FOUND, C.NVML_ERROR_NO_DATA})
DENIED_CODES = frozenset({C.NVML_ERROR_NO_PERMISSION})


def classify(code: int) -> str:
    """:data:`ABSENT`, :data:`DENIED` or :data:`FAULT` for NVML return code *code*."""
    if code in ABSENT_CODES:
        return ABSENT
    if code in DENIED_CODES:
        return DENIED
    return FAULT


def optional(code: int) -> bool:
    """True when an optional query failing with *code* just has no answer (ABSENT or DENIED)."""
    return classify(code) != FAULT


class Reader:
    """Calls through an :class:`NvmlApi` under the one policy (:func:`classify`).

    ``denied`` collects the queries refused with NO_PERMISSION (key given
    by the caller, or the function's name), for readers that report them.
    """

    def __init__(self, api: NvmlApi) -> None:
        self.api = api
        self.denied: dict[str, str] = {}

    def maybe(self, fn: Callable[..., Any], *args: Any, default: Any = None, key: str = "") -> Any:
        """An optional query: ABSENT and DENIED give *default*; a FAULT raises :class:`NVMLError`."""
        try:
            return fn(*args)
        except NVMLError as e:
            kind = classify(e.value)
            if kind == FAULT:
                raise
            if kind == DENIED:
                self.denied[key or getattr(fn, "__name__", "?")] = e.name
            return default


def describe(e: BaseException) -> str:
    """``GPU is lost (NVML_ERROR_GPU_IS_LOST)`` for an NVML error, ``str(e)`` otherwise."""
    return f"{e} ({e.name})" if isinstance(e, NVMLError) else str(e)


class Handle:
    """An opaque NVML handle outside the driver (replay, simulator, recorder).

    ``key`` names it by how it was obtained (``gpu0``, ``gpu0/mig2``,
    ``gpu0/gi1/ci0``), which is stable between recording and replay;
    ``real`` is the driver's handle when a recorder wraps a live one.
    """

    __slots__ = ("key", "real")

    def __init__(self, key: str, real: Any = None) -> None:
        self.key = key
        self.real = real

    def __repr__(self) -> str:
        return f"<nvml handle {self.key}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Handle) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)


class NvmlStruct:
    """A structure answered outside the driver: attribute access like the ctypes original."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        return f"NvmlStruct({self.__dict__!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NvmlStruct) and self.__dict__ == other.__dict__


class PlainMetric:
    """One entry of :class:`PlainMetricsGet` (``nvmlGpmMetric_t``'s fields that are read)."""

    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0


class PlainMetricsGet:
    """``nvmlGpmMetricsGet_t`` for backends other than the driver (replay, simulator)."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [PlainMetric() for _ in range(8)]


# ------------------------------------------------------------ the contract


class NvmlApi(Protocol):
    """Every NVML call slurm-gpu makes (pynvml's names, arguments and answers).

    Structures come back as objects with nvml.h's field names; strings may
    be ``bytes`` from an old nvidia-ml-py.  Every failure is an
    :class:`NVMLError`.  Add a call here, to :class:`NvmlForward`, and to
    the simulator when the code needs a new one.
    """

    # -- library -------------------------------------------------------------
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...

    # -- handles and identity ------------------------------------------------
    def nvmlDeviceGetHandleByIndex(self, index: int) -> NvmlHandle: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> NvmlHandle: ...
    def nvmlDeviceGetIndex(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetMinorNumber(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetUUID(self, handle: NvmlHandle) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: NvmlHandle) -> str | bytes: ...
    def nvmlDeviceGetPciInfo(self, handle: NvmlHandle) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: NvmlHandle) -> Any: ...
    def nvmlDeviceGetArchitecture(self, device: NvmlHandle) -> int: ...
    def nvmlDeviceGetPersistenceMode(self, handle: NvmlHandle) -> int: ...

    # -- compute mode and processes -----------------------------------------
    def nvmlDeviceGetComputeMode(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceSetComputeMode(self, handle: NvmlHandle, mode: int) -> None: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: NvmlHandle) -> list[Any]: ...
    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: NvmlHandle) -> list[Any]: ...

    # -- NVLink and fabric ---------------------------------------------------
    def nvmlDeviceGetNvLinkState(self, device: NvmlHandle, link: int) -> int: ...
    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: NvmlHandle, link: int) -> Any: ...
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, device: NvmlHandle, link: int) -> int: ...
    def nvmlDeviceGetGpuFabricInfo(self, device: NvmlHandle, gpuFabricInfo: Any) -> Any: ...
    def nvmlDeviceGetGpuFabricInfoV(self, device: NvmlHandle, gpuFabricInfo: Any) -> Any: ...

    # -- MIG -----------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, device: NvmlHandle) -> list[int]: ...
    def nvmlDeviceSetMigMode(self, device: NvmlHandle, mode: int) -> Any: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, device: NvmlHandle) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: NvmlHandle, index: int) -> NvmlHandle: ...
    def nvmlDeviceGetGpuInstanceId(self, device: NvmlHandle) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, device: NvmlHandle) -> int: ...
    def nvmlDeviceGetAttributes(self, device: NvmlHandle) -> Any: ...
    def nvmlDeviceGetGpuInstanceById(self, device: NvmlHandle, gpuInstanceId: int) -> NvmlHandle: ...
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: NvmlHandle, profile: int) -> Any: ...
    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: NvmlHandle, profileId: int,
                                                 placement: Any) -> NvmlHandle: ...
    def nvmlGpuInstanceGetInfo(self, gpuInstance: NvmlHandle) -> Any: ...
    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance: NvmlHandle,
                                              computeInstanceId: int) -> NvmlHandle: ...
    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(self, gpuInstance: NvmlHandle, profileId: int,
                                                          placement: Any) -> NvmlHandle: ...
    def nvmlGpuInstanceDestroy(self, gpuInstance: NvmlHandle) -> Any: ...
    def nvmlComputeInstanceGetInfo(self, computeInstance: NvmlHandle) -> Any: ...
    def nvmlComputeInstanceDestroy(self, computeInstance: NvmlHandle) -> Any: ...

    # -- health --------------------------------------------------------------
    def nvmlDeviceGetRemappedRows(self, device: NvmlHandle) -> Any: ...
    def nvmlDeviceGetRetiredPages(self, device: NvmlHandle, sourceFilter: int) -> list[int]: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: NvmlHandle) -> int: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: NvmlHandle, errorType: int, counterType: int) -> int: ...
    def nvmlDeviceGetFieldValues(self, handle: NvmlHandle, fieldIds: list[int]) -> Any: ...
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: NvmlHandle) -> int: ...

    # -- events --------------------------------------------------------------
    def nvmlEventSetCreate(self) -> NvmlHandle: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceRegisterEvents(self, handle: NvmlHandle, eventTypes: int, eventSet: NvmlHandle) -> None: ...
    def nvmlEventSetWait_v2(self, eventSet: NvmlHandle, timeoutms: int) -> Any: ...
    def nvmlEventSetFree(self, eventSet: NvmlHandle) -> None: ...

    # -- usage ---------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: NvmlHandle) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetProcessUtilization(self, handle: NvmlHandle, timeStamp: int) -> list[Any]: ...
    def nvmlDeviceGetAccountingMode(self, handle: NvmlHandle) -> int: ...
    def nvmlDeviceGetAccountingStats(self, handle: NvmlHandle, pid: int) -> Any: ...
    def nvmlGpmQueryDeviceSupport(self, device: NvmlHandle) -> Any: ...
    def nvmlGpmSampleAlloc(self) -> NvmlHandle: ...
    def nvmlGpmSampleFree(self, gpmSample: NvmlHandle) -> None: ...
    def nvmlGpmMigSampleGet(self, device: NvmlHandle, gpuInstanceId: int, gpmSample: NvmlHandle) -> Any: ...
    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any: ...

    def new_gpm_metrics(self) -> Any:
        """A fresh ``nvmlGpmMetricsGet_t`` for :meth:`nvmlGpmMetricsGet` (pynvml's own
        structure for the driver, :class:`PlainMetricsGet` elsewhere)."""
        ...


class NvmlForward(NvmlApi):
    """:class:`NvmlApi` with every call handed to :meth:`_call` (name, arguments).

    The base of the wrappers (recorder, overlay, the health check's
    watchdog), the replay and the pynvml adapter; the simulator answers
    NOT_SUPPORTED here for what it does not model.  Each call is written
    out, so a name outside the contract is an ``AttributeError``.
    """

    def _call(self, fn: str, args: tuple[Any, ...]) -> Any:
        raise NotImplementedError

    def new_gpm_metrics(self) -> Any:
        return PlainMetricsGet()

    def nvmlInit(self) -> None:
        return self._call("nvmlInit", ())

    def nvmlShutdown(self) -> None:
        return self._call("nvmlShutdown", ())

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        return self._call("nvmlSystemGetDriverVersion", ())

    def nvmlDeviceGetCount(self) -> int:
        return self._call("nvmlDeviceGetCount", ())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> NvmlHandle:
        return self._call("nvmlDeviceGetHandleByIndex", (index,))

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> NvmlHandle:
        return self._call("nvmlDeviceGetHandleByUUID", (uuid,))

    def nvmlDeviceGetIndex(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetIndex", (handle,))

    def nvmlDeviceGetMinorNumber(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetMinorNumber", (handle,))

    def nvmlDeviceGetUUID(self, handle: NvmlHandle) -> str | bytes:
        return self._call("nvmlDeviceGetUUID", (handle,))

    def nvmlDeviceGetName(self, handle: NvmlHandle) -> str | bytes:
        return self._call("nvmlDeviceGetName", (handle,))

    def nvmlDeviceGetPciInfo(self, handle: NvmlHandle) -> Any:
        return self._call("nvmlDeviceGetPciInfo", (handle,))

    def nvmlDeviceGetMemoryInfo(self, handle: NvmlHandle) -> Any:
        return self._call("nvmlDeviceGetMemoryInfo", (handle,))

    def nvmlDeviceGetArchitecture(self, device: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetArchitecture", (device,))

    def nvmlDeviceGetPersistenceMode(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetPersistenceMode", (handle,))

    def nvmlDeviceGetComputeMode(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetComputeMode", (handle,))

    def nvmlDeviceSetComputeMode(self, handle: NvmlHandle, mode: int) -> None:
        return self._call("nvmlDeviceSetComputeMode", (handle, mode))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: NvmlHandle) -> list[Any]:
        return self._call("nvmlDeviceGetComputeRunningProcesses", (handle,))

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: NvmlHandle) -> list[Any]:
        return self._call("nvmlDeviceGetGraphicsRunningProcesses", (handle,))

    def nvmlDeviceGetNvLinkState(self, device: NvmlHandle, link: int) -> int:
        return self._call("nvmlDeviceGetNvLinkState", (device, link))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: NvmlHandle, link: int) -> Any:
        return self._call("nvmlDeviceGetNvLinkRemotePciInfo", (device, link))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, device: NvmlHandle, link: int) -> int:
        return self._call("nvmlDeviceGetNvLinkRemoteDeviceType", (device, link))

    def nvmlDeviceGetGpuFabricInfo(self, device: NvmlHandle, gpuFabricInfo: Any) -> Any:
        return self._call("nvmlDeviceGetGpuFabricInfo", (device, gpuFabricInfo))

    def nvmlDeviceGetGpuFabricInfoV(self, device: NvmlHandle, gpuFabricInfo: Any) -> Any:
        return self._call("nvmlDeviceGetGpuFabricInfoV", (device, gpuFabricInfo))

    def nvmlDeviceGetMigMode(self, device: NvmlHandle) -> list[int]:
        return self._call("nvmlDeviceGetMigMode", (device,))

    def nvmlDeviceSetMigMode(self, device: NvmlHandle, mode: int) -> Any:
        return self._call("nvmlDeviceSetMigMode", (device, mode))

    def nvmlDeviceGetMaxMigDeviceCount(self, device: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetMaxMigDeviceCount", (device,))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: NvmlHandle, index: int) -> NvmlHandle:
        return self._call("nvmlDeviceGetMigDeviceHandleByIndex", (device, index))

    def nvmlDeviceGetGpuInstanceId(self, device: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetGpuInstanceId", (device,))

    def nvmlDeviceGetComputeInstanceId(self, device: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetComputeInstanceId", (device,))

    def nvmlDeviceGetAttributes(self, device: NvmlHandle) -> Any:
        return self._call("nvmlDeviceGetAttributes", (device,))

    def nvmlDeviceGetGpuInstanceById(self, device: NvmlHandle, gpuInstanceId: int) -> NvmlHandle:
        return self._call("nvmlDeviceGetGpuInstanceById", (device, gpuInstanceId))

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: NvmlHandle, profile: int) -> Any:
        return self._call("nvmlDeviceGetGpuInstanceProfileInfo", (device, profile))

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: NvmlHandle, profileId: int,
                                                 placement: Any) -> NvmlHandle:
        return self._call("nvmlDeviceCreateGpuInstanceWithPlacement", (device, profileId, placement))

    def nvmlGpuInstanceGetInfo(self, gpuInstance: NvmlHandle) -> Any:
        return self._call("nvmlGpuInstanceGetInfo", (gpuInstance,))

    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance: NvmlHandle,
                                              computeInstanceId: int) -> NvmlHandle:
        return self._call("nvmlGpuInstanceGetComputeInstanceById", (gpuInstance, computeInstanceId))

    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(self, gpuInstance: NvmlHandle, profileId: int,
                                                          placement: Any) -> NvmlHandle:
        return self._call("nvmlGpuInstanceCreateComputeInstanceWithPlacement", (gpuInstance, profileId, placement))

    def nvmlGpuInstanceDestroy(self, gpuInstance: NvmlHandle) -> Any:
        return self._call("nvmlGpuInstanceDestroy", (gpuInstance,))

    def nvmlComputeInstanceGetInfo(self, computeInstance: NvmlHandle) -> Any:
        return self._call("nvmlComputeInstanceGetInfo", (computeInstance,))

    def nvmlComputeInstanceDestroy(self, computeInstance: NvmlHandle) -> Any:
        return self._call("nvmlComputeInstanceDestroy", (computeInstance,))

    def nvmlDeviceGetRemappedRows(self, device: NvmlHandle) -> Any:
        return self._call("nvmlDeviceGetRemappedRows", (device,))

    def nvmlDeviceGetRetiredPages(self, device: NvmlHandle, sourceFilter: int) -> list[int]:
        return self._call("nvmlDeviceGetRetiredPages", (device, sourceFilter))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetRetiredPagesPendingStatus", (device,))

    def nvmlDeviceGetTotalEccErrors(self, handle: NvmlHandle, errorType: int, counterType: int) -> int:
        return self._call("nvmlDeviceGetTotalEccErrors", (handle, errorType, counterType))

    def nvmlDeviceGetFieldValues(self, handle: NvmlHandle, fieldIds: list[int]) -> Any:
        return self._call("nvmlDeviceGetFieldValues", (handle, fieldIds))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetCurrPcieLinkGeneration", (handle,))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetMaxPcieLinkGeneration", (handle,))

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetCurrPcieLinkWidth", (handle,))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetMaxPcieLinkWidth", (handle,))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetCurrentClocksEventReasons", (handle,))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetCurrentClocksThrottleReasons", (handle,))

    def nvmlEventSetCreate(self) -> NvmlHandle:
        return self._call("nvmlEventSetCreate", ())

    def nvmlDeviceGetSupportedEventTypes(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetSupportedEventTypes", (handle,))

    def nvmlDeviceRegisterEvents(self, handle: NvmlHandle, eventTypes: int, eventSet: NvmlHandle) -> None:
        return self._call("nvmlDeviceRegisterEvents", (handle, eventTypes, eventSet))

    def nvmlEventSetWait_v2(self, eventSet: NvmlHandle, timeoutms: int) -> Any:
        return self._call("nvmlEventSetWait_v2", (eventSet, timeoutms))

    def nvmlEventSetFree(self, eventSet: NvmlHandle) -> None:
        return self._call("nvmlEventSetFree", (eventSet,))

    def nvmlDeviceGetUtilizationRates(self, handle: NvmlHandle) -> Any:
        return self._call("nvmlDeviceGetUtilizationRates", (handle,))

    def nvmlDeviceGetPowerUsage(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetPowerUsage", (handle,))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetTotalEnergyConsumption", (handle,))

    def nvmlDeviceGetProcessUtilization(self, handle: NvmlHandle, timeStamp: int) -> list[Any]:
        return self._call("nvmlDeviceGetProcessUtilization", (handle, timeStamp))

    def nvmlDeviceGetAccountingMode(self, handle: NvmlHandle) -> int:
        return self._call("nvmlDeviceGetAccountingMode", (handle,))

    def nvmlDeviceGetAccountingStats(self, handle: NvmlHandle, pid: int) -> Any:
        return self._call("nvmlDeviceGetAccountingStats", (handle, pid))

    def nvmlGpmQueryDeviceSupport(self, device: NvmlHandle) -> Any:
        return self._call("nvmlGpmQueryDeviceSupport", (device,))

    def nvmlGpmSampleAlloc(self) -> NvmlHandle:
        return self._call("nvmlGpmSampleAlloc", ())

    def nvmlGpmSampleFree(self, gpmSample: NvmlHandle) -> None:
        return self._call("nvmlGpmSampleFree", (gpmSample,))

    def nvmlGpmMigSampleGet(self, device: NvmlHandle, gpuInstanceId: int, gpmSample: NvmlHandle) -> Any:
        return self._call("nvmlGpmMigSampleGet", (device, gpuInstanceId, gpmSample))

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        return self._call("nvmlGpmMetricsGet", (metricsGet,))


# The contract's calls, by name (the recorder, the overlay and the tests check names against it).
CALLS = frozenset(n for n in vars(NvmlApi) if n.startswith("nvml"))
