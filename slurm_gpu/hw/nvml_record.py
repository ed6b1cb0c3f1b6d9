"""Record every NVML answer that flows through an api object.

:class:`RecordingNvml` wraps any :class:`~slurm_gpu.hw.nvml_api.NvmlApi`
(the driver, the simulator, even a replay) and keeps, for each call, its answer or
its error code, keyed by function name, handle key and the other arguments.
Handles are replaced by :class:`~slurm_gpu.hw.nvml_replay.Handle` objects
named by how they were obtained (``gpu3``, ``gpu3/mig0``, ``gpu3/gi1/ci0``),
so :class:`~slurm_gpu.hw.nvml_replay.ReplayNvml` can answer the same calls in
another process, on another machine.

Because the adapter (:mod:`slurm_gpu.hw.nvml`) and the health reads go
through this wrapper unchanged, what is recorded is exactly what they asked.
"""
from __future__ import annotations

import threading
from typing import Any

from .nvml_api import Handle, NvmlApi, NVMLError, NvmlForward
from .nvml_replay import call_key, handle_key_for, is_out_param, to_plain

# Calls whose answers mean nothing in another process (event sets carry live
# pointers; init/shutdown only change library state; GPM samples are
# buffers): passed through, not kept.
PASS_THROUGH = frozenset({
    "nvmlEventSetCreate", "nvmlEventSetFree", "nvmlEventSetWait_v2",
    "nvmlDeviceRegisterEvents", "nvmlShutdown", "nvmlInit",
})


class RecordingNvml(NvmlForward):
    """Records each call's answer, then answers as *api* did (see module docstring)."""

    def __init__(self, api: NvmlApi) -> None:
        self._api = api
        self._lock = threading.Lock()
        self._records: dict[tuple[str, str, tuple[Any, ...]], dict[str, Any]] = {}

    def new_gpm_metrics(self) -> Any:
        return self._api.new_gpm_metrics()

    def _call(self, fn: str, args: tuple[Any, ...]) -> Any:
        target = getattr(self._api, fn)
        # A raw device handle (e.g. from an event) is named like ByIndex names it.
        args = tuple(Handle(self._name_device(a), a) if _is_raw_handle(a) else a for a in args)
        real_args = tuple(_unwrap(a) for a in args)
        if fn in PASS_THROUGH:
            return target(*real_args)
        key = call_key(fn, args)
        rec: dict[str, Any] = {"fn": fn, "dev": key[1], "args": list(key[2])}
        try:
            result = target(*real_args)
        except NVMLError as e:
            rec["error"] = e.value
            self._keep(key, rec)
            raise
        hkey = handle_key_for(fn, key[1], key[2])
        if hkey is None and _is_handle(result):
            hkey = self._name_device(result)
        if hkey is not None:
            wrapped = Handle(hkey, result)
            rec["result"] = {"$handle": hkey}
            self._keep(key, rec)
            return wrapped
        rec["result"] = to_plain(result)
        outs = [a for a in args if is_out_param(a)]
        if outs:
            rec["out"] = to_plain(getattr(outs[0], "_obj", outs[0]))
        self._keep(key, rec)
        return result

    def _name_device(self, real: Any) -> str:
        # Handles from ByUUID / ByPciBusId: name them like ByIndex does.
        try:
            return f"gpu{self._api.nvmlDeviceGetIndex(real)}"
        except Exception:  # noqa: BLE001 - a handle we cannot name is still usable
            return f"dev{id(real):x}"

    def _keep(self, key: tuple[str, str, tuple[Any, ...]], rec: dict[str, Any]) -> None:
        with self._lock:
            self._records[key] = rec

    def records(self) -> list[dict[str, Any]]:
        """Every recorded call, in a stable order (for a diff-friendly snapshot)."""
        with self._lock:
            return [self._records[k] for k in sorted(self._records, key=_sort_key)]


def _sort_key(k: tuple[str, str, tuple[Any, ...]]) -> tuple[str, str, str]:
    return (k[1], k[0], repr(k[2]))


def _unwrap(a: Any) -> Any:
    if isinstance(a, Handle):
        return a.real if a.real is not None else a
    if isinstance(a, list):
        return [_unwrap(x) for x in a]
    return a


def _is_raw_handle(a: Any) -> bool:
    import ctypes
    return isinstance(a, ctypes._Pointer)


def _is_handle(result: Any) -> bool:
    if isinstance(result, Handle):
        return True
    import ctypes
    return isinstance(result, ctypes._Pointer)
