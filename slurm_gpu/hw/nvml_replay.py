"""pynvml's surface without pynvml: error classes, structures, and recorded replay.

Three things live here because the replay backend and the simulator
(:mod:`slurm_gpu_devkit.sim`) both need them and neither may import pynvml:

* :class:`NVMLError` with ``.value`` and one subclass per ``NVML_ERROR_*``
  code, named like pynvml's (``NVMLError_NotSupported``...), so code written
  against pynvml (``except api.NVMLError_GpuIsLost``) runs unchanged;
* the few ctypes structures callers build themselves and pass by reference
  (fabric info), with pynvml's exact field layout;
* :func:`to_plain` / :func:`from_plain`: how an NVML answer is written into a
  snapshot and read back (ctypes structures become dicts, device handles
  become ``{"$handle": "gpu0/mig1"}``).

:class:`ReplayNvml` answers every call from recorded data, keyed by function
name, handle key and arguments (see :mod:`slurm_gpu.hw.nvml_record`).  A call
that was never recorded answers ``NVML_ERROR_NOT_SUPPORTED``, like a driver
that does not support it.  Fault overlays (a lost GPU, an ECC count, a hung call, XID
events) are applied on top by :mod:`slurm_gpu.hw.nvml_overlay`.
"""
from __future__ import annotations

import ctypes
import string
import time
from typing import Any, Iterable, Mapping

from . import nvml_constants as C

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
    """pynvml's exception: ``NVMLError(code)`` builds the code's subclass."""

    _valClassMapping: dict[int, type["NVMLError"]] = {}
    value: int

    def __new__(cls, value: int) -> "NVMLError":
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
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


def _make_error_classes() -> dict[str, type[NVMLError]]:
    out: dict[str, type[NVMLError]] = {}
    for name, code in sorted((n, getattr(C, n)) for n in dir(C) if n.startswith("NVML_ERROR_")):
        cls_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")

        def new(typ: type, *args: Any, _code: int = code) -> NVMLError:
            return NVMLError.__new__(typ, _code)

        cls = type(cls_name, (NVMLError,), {"__new__": new, "__module__": __name__})
        NVMLError._valClassMapping[code] = cls
        out[cls_name] = cls
    return out


ERROR_CLASSES = _make_error_classes()
globals().update(ERROR_CLASSES)

# ------------------------------------------------------- ctypes structures
# Same field layout as pynvml's, so ``byref(api.c_nvmlGpuFabricInfoV_t())``
# works the same against pynvml, the replay and the simulator.


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * C.NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
    ]


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * C.NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint32),
    ]

    def __init__(self) -> None:
        super().__init__(version=C.nvmlGpuFabricInfo_v2)


c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfo_v2_t

# --------------------------------------------------- plain <-> NVML values


class NvmlStruct:
    """A replayed structure: attribute access like the ctypes original."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        return f"NvmlStruct({self.__dict__!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NvmlStruct) and self.__dict__ == other.__dict__


class Handle:
    """An opaque NVML handle (device, MIG device, GPU or compute instance).

    ``key`` names it by how it was obtained (``gpu0``, ``gpu0/mig2``,
    ``gpu0/gi1/ci0``), which is stable between recording and replay.
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


def to_plain(value: Any) -> Any:
    """An NVML answer as JSON-able data (structures -> dicts, handles -> refs)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, Handle):
        return {"$handle": value.key}
    if isinstance(value, NvmlStruct):
        return {k: to_plain(v) for k, v in value.__dict__.items()}
    if isinstance(value, (ctypes.Structure, ctypes.Union)):
        out: dict[str, Any] = {}
        for f in value._fields_:
            name = f[0]
            v = getattr(value, name)
            if isinstance(v, ctypes._Pointer) or isinstance(v, ctypes.c_void_p):
                continue  # embedded handles (GI info's device) mean nothing outside the process
            out[name] = to_plain(v)
        return out
    if isinstance(value, ctypes.Array):
        if value._type_ is ctypes.c_char:
            return bytes(value.value).decode(errors="replace")
        return [to_plain(v) for v in value]
    if isinstance(value, ctypes._SimpleCData):
        return to_plain(value.value)
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    raise TypeError(f"cannot record NVML value of type {type(value).__name__}")


def from_plain(value: Any) -> Any:
    """Inverse of :func:`to_plain` (dicts -> :class:`NvmlStruct`)."""
    if isinstance(value, dict):
        if set(value) == {"$handle"}:
            return Handle(value["$handle"])
        return NvmlStruct({k: from_plain(v) for k, v in value.items()})
    if isinstance(value, list):
        return [from_plain(v) for v in value]
    return value


def fill_struct(target: Any, plain: Mapping[str, Any]) -> None:
    """Copy recorded fields into a caller's ctypes structure (an out-parameter)."""
    obj = getattr(target, "_obj", target)  # byref(x)._obj is x
    for name, v in plain.items():
        if not hasattr(obj, name):
            continue
        cur = getattr(obj, name)
        if isinstance(cur, ctypes.Array) and isinstance(v, list):
            for i, item in enumerate(v[:len(cur)]):
                cur[i] = item
        elif isinstance(cur, (ctypes.Structure, ctypes.Union)) and isinstance(v, dict):
            fill_struct(cur, v)
        else:
            setattr(obj, name, v.encode() if isinstance(v, str) and isinstance(cur, bytes) else v)


def is_out_param(arg: Any) -> bool:
    """True for a structure passed by reference for NVML to fill in."""
    # byref(x), a structure, an array or a scalar cell (countRef) handed to
    # NVML to fill: not part of the question, so not part of the key.
    return type(arg).__name__ == "CArgObject" or isinstance(
        arg, (ctypes.Structure, ctypes.Union, ctypes.Array, ctypes._SimpleCData))


def plain_args(args: Iterable[Any]) -> tuple[Any, ...]:
    """The key part of a call's arguments: handles by key, out-parameters left out."""
    out: list[Any] = []
    for a in args:
        if is_out_param(a):
            continue
        if isinstance(a, Handle):
            out.append(a.key)
        elif isinstance(a, (list, tuple)):
            out.append(tuple(plain_args(a)) if not a or not is_out_param(a[0]) else ())
        elif isinstance(a, bytes):
            out.append(a.decode())
        else:
            out.append(a)
    return tuple(out)


def call_key(fn: str, args: Iterable[Any]) -> tuple[str, str, tuple[Any, ...]]:
    """(function, handle key or "", other plain arguments)."""
    pa = plain_args(args)
    if pa and isinstance(pa[0], str) and _looks_like_handle_key(pa[0]):
        return fn, pa[0], tuple(_freeze(a) for a in pa[1:])
    return fn, "", tuple(_freeze(a) for a in pa)


def _looks_like_handle_key(s: str) -> bool:
    return s.startswith("gpu") and (len(s) > 3 and s[3].isdigit())


def _freeze(a: Any) -> Any:
    if isinstance(a, list):
        return tuple(_freeze(x) for x in a)
    return a


# Functions that return a handle, and how the handle is named.  The recorder
# and the replay must agree, so both use this table.
def handle_key_for(fn: str, key: str, args: tuple[Any, ...]) -> str | None:
    """The key of the handle that call *fn* returns, or None if it returns none."""
    if fn == "nvmlDeviceGetHandleByIndex":
        return f"gpu{args[0]}"
    if fn == "nvmlDeviceGetMigDeviceHandleByIndex":
        return f"{key}/mig{args[0]}"
    if fn == "nvmlDeviceGetGpuInstanceById":
        return f"{key}/gi{args[0]}"
    if fn == "nvmlGpuInstanceGetComputeInstanceById":
        return f"{key}/ci{args[0]}"
    if fn == "nvmlDeviceGetDeviceHandleFromMigDeviceHandle":
        return key.split("/")[0]
    return None


# ---------------------------------------------------------- the surface


class NvmlSurface:
    """pynvml's module-level names shared by the replay and the simulator."""

    NVMLError = NVMLError
    c_nvmlGpuFabricInfo_t = c_nvmlGpuFabricInfo_t
    c_nvmlGpuFabricInfo_v2_t = c_nvmlGpuFabricInfo_v2_t
    c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfoV_t

    def __getattr__(self, name: str) -> Any:
        # Constants and error classes, as module attributes of pynvml.
        if name.startswith("NVMLError_"):
            try:
                return ERROR_CLASSES[name]
            except KeyError:
                raise AttributeError(name) from None
        value = getattr(C, name, None)
        if value is not None and not name.startswith("_"):
            return value
        raise AttributeError(name)

    def nvmlErrorString(self, result: int) -> str:
        return _ERROR_STRINGS.get(result, f"NVML Error with code {result}")


Key = tuple[str, str, tuple[Any, ...]]


class ReplayNvml(NvmlSurface):
    """Answers pynvml calls from a recording (list of call records).

    Each record is ``{"fn": name, "dev": handle key or "", "args": [...],
    "result": value}`` or ``... "error": code`` (see docs/snapshots.md).
    Faults are layered on top by :class:`~slurm_gpu.hw.nvml_overlay.OverlayNvml`.
    """

    def __init__(self, calls: Iterable[Mapping[str, Any]], *, where: str = "snapshot") -> None:
        self._answers: dict[Key, Mapping[str, Any]] = {}
        for rec in calls:
            self._answers[(rec["fn"], rec.get("dev", ""), tuple(_freeze(a) for a in rec.get("args", ())))] = rec
        self.where = where

    def _answer(self, fn: str, args: tuple[Any, ...]) -> Any:
        key = call_key(fn, args)
        rec = self._answers.get(key)
        if rec is None:
            if fn in ("nvmlInit", "nvmlInitWithFlags", "nvmlShutdown"):
                return None
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        if "error" in rec:
            raise NVMLError(error_code(rec["error"]))
        hkey = handle_key_for(fn, key[1], key[2])
        if hkey is not None:
            return Handle(hkey)
        outs = [a for a in args if is_out_param(a)]
        if "out" in rec and outs:
            fill_struct(outs[0], rec["out"])
        return from_plain(rec.get("result"))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml") and name[4:5].isupper() and not hasattr(C, name):
            def call(*args: Any, _fn: str = name) -> Any:
                return self._answer(_fn, args)

            call.__name__ = name
            return call
        return super().__getattr__(name)

    # Event sets hold live state, so they are never recorded: a replay has
    # no events of its own (an overlay's "events" supply them).
    def nvmlEventSetCreate(self) -> Handle:
        return Handle("eventset")

    def nvmlDeviceRegisterEvents(self, handle: Handle, eventTypes: int, eventSet: Handle) -> None:
        return None

    def nvmlEventSetWait_v2(self, eventSet: Handle, timeoutms: int) -> NvmlStruct:
        time.sleep(min(timeoutms, 50) / 1000.0)
        raise NVMLError(C.NVML_ERROR_TIMEOUT)

    nvmlEventSetWait = nvmlEventSetWait_v2

    def nvmlEventSetFree(self, eventSet: Handle) -> None:
        return None


