"""Recorded NVML answers: how they are written down and answered again.

* :func:`to_plain` / :func:`from_plain`: how an NVML answer is written into a
  snapshot and read back (ctypes structures become dicts, device handles
  become ``{"$handle": "gpu0/mig1"}``);
* :func:`call_key`: which recorded answer a call gets (function, handle key,
  other arguments), shared with the recorder and the fault overlay.

:class:`ReplayNvml` answers every call of the contract
(:class:`~slurm_gpu.hw.nvml_api.NvmlApi`) from recorded data, keyed by function
name, handle key and arguments (see :mod:`slurm_gpu.hw.nvml_record`).  A call
that was never recorded answers ``NVML_ERROR_NOT_SUPPORTED``, like a driver
that does not support it.  Fault overlays (a lost GPU, an ECC count, a hung call, XID
events) are applied on top by :mod:`slurm_gpu.hw.nvml_overlay`.
"""
from __future__ import annotations

import ctypes
import time
from typing import Any, Iterable, Mapping

from . import nvml_constants as C
from .nvml_api import Handle, NvmlForward, NVMLError, NvmlHandle, NvmlStruct, error_code

# --------------------------------------------------- plain <-> NVML values


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


Key = tuple[str, str, tuple[Any, ...]]


class ReplayNvml(NvmlForward):
    """Answers the contract's calls from a recording (list of call records).

    Each record is ``{"fn": name, "dev": handle key or "", "args": [...],
    "result": value}`` or ``... "error": code`` (see docs/snapshots.md).
    Faults are layered on top by :class:`~slurm_gpu.hw.nvml_overlay.OverlayNvml`.
    """

    def __init__(self, calls: Iterable[Mapping[str, Any]], *, where: str = "snapshot") -> None:
        self._answers: dict[Key, Mapping[str, Any]] = {}
        for rec in calls:
            self._answers[(rec["fn"], rec.get("dev", ""), tuple(_freeze(a) for a in rec.get("args", ())))] = rec
        self.where = where

    def _call(self, fn: str, args: tuple[Any, ...]) -> Any:
        key = call_key(fn, args)
        rec = self._answers.get(key)
        if rec is None:
            if fn in ("nvmlInit", "nvmlShutdown"):
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

    # Event sets hold live state, so they are never recorded: a replay has
    # no events of its own (an overlay's "events" supply them).
    def nvmlEventSetCreate(self) -> NvmlHandle:
        return Handle("eventset")

    def nvmlDeviceRegisterEvents(self, handle: NvmlHandle, eventTypes: int, eventSet: NvmlHandle) -> None:
        return None

    def nvmlEventSetWait_v2(self, eventSet: NvmlHandle, timeoutms: int) -> Any:
        time.sleep(min(timeoutms, 50) / 1000.0)
        raise NVMLError(C.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, eventSet: NvmlHandle) -> None:
        return None
