"""Fault overlays: patch the answers of any :class:`~slurm_gpu.hw.nvml_api.NvmlApi`.

One implementation serves both places faults are injected: a snapshot replay
(``load_node(Snapshot(path, overlay))``) and the simulator's state file
(the devkit simulator's ``set_overlay``).  :class:`OverlayNvml` wraps the api
(replay, simulator, even the driver) and, per call of the contract:

* sleeps first when a ``hang`` entry matches (watchdog tests);
* raises ``NVML_ERROR_GPU_IS_LOST`` for every call on a lost GPU, including
  ``nvmlDeviceGetHandleByIndex`` of its index;
* answers a matching entry's ``error`` or ``result`` (an object ``result``
  is merged into the real structure, so ``{"state": 2}`` changes one field),
  or fills a matching ``out`` into the caller's out-parameter;
* hands out the overlay's ``events`` once each from ``nvmlEventSetWait_v2``.

Format (also in docs/snapshots.md)::

    {"gpus": {"<bus id>|<index>": {"lost": true}},
     "calls": [{"fn": ..., "gpu": ..., "args": [...], "result"|"error"|"out": ..., "hang": seconds}],
     "events": [{"gpu": ..., "type": "xid", "data": 79}],
     "comment": "..."}
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Mapping

from . import nvml_constants as C
from .nvml_api import CALLS, Handle, NvmlApi, NVMLError, NvmlForward, NvmlHandle, NvmlStruct, error_code
from .nvml_replay import call_key, fill_struct, from_plain, is_out_param, to_plain

EVENT_TYPES = {"xid": C.nvmlEventTypeXidCriticalError, "double_bit_ecc": C.nvmlEventTypeDoubleBitEccError,
               "single_bit_ecc": C.nvmlEventTypeSingleBitEccError}

_CALL_KEYS = {"fn", "gpu", "args", "result", "error", "hang", "out"}


def _freeze(a: Any) -> Any:
    return tuple(_freeze(x) for x in a) if isinstance(a, (list, tuple)) else a


def check_overlay(overlay: Any) -> None:
    """Reject a malformed overlay (ValueError naming the entry); GPUs are checked later."""
    if not isinstance(overlay, Mapping):
        raise ValueError("overlay must be a JSON object")
    unknown = set(overlay) - {"gpus", "calls", "events", "comment"}
    if unknown:
        raise ValueError(f"unknown overlay key {sorted(unknown)[0]!r}")
    gpus = overlay.get("gpus") or {}
    if not isinstance(gpus, Mapping):
        raise ValueError("overlay gpus must be an object")
    for gpu, props in gpus.items():
        if not isinstance(props, Mapping):
            raise ValueError(f"overlay gpus.{gpu} must be an object")
        bad = set(props) - {"lost"}
        if bad:
            raise ValueError(f"unknown overlay key gpus.{gpu}.{sorted(bad)[0]}")
    for key in ("calls", "events"):
        if not isinstance(overlay.get(key) or [], list):
            raise ValueError(f"overlay {key} must be a list")
    for i, e in enumerate(overlay.get("calls") or ()):
        if not isinstance(e, Mapping) or not isinstance(e.get("fn"), str):
            raise ValueError(f"overlay calls[{i}] needs \"fn\"")
        bad = set(e) - _CALL_KEYS
        if bad:
            raise ValueError(f"unknown overlay key calls[{i}].{sorted(bad)[0]}")
        if "error" in e:
            try:
                error_code(e["error"])
            except ValueError as err:
                raise ValueError(f"overlay calls[{i}]: {err}") from None
        if "hang" in e and not isinstance(e["hang"], (int, float)):
            raise ValueError(f"overlay calls[{i}].hang must be seconds")
        if e["fn"] not in CALLS:     # it would never apply: no one makes that call
            raise ValueError(f"overlay calls[{i}].fn: {e['fn']!r} is no NVML call slurm-gpu makes")
    for i, ev in enumerate(overlay.get("events") or ()):
        if not isinstance(ev, Mapping):
            raise ValueError(f"overlay events[{i}] must be an object")
        et = ev.get("type", "xid")
        if isinstance(et, str) and et not in EVENT_TYPES:
            raise ValueError(f"overlay events[{i}]: unknown event type {et!r}")


class _Compiled:
    """An overlay with its GPUs resolved to handle keys."""

    def __init__(self, overlay: Mapping[str, Any], resolve: Callable[[Any], str]) -> None:
        self.lost = {resolve(g) for g, p in (overlay.get("gpus") or {}).items() if p.get("lost")}
        self.exact: dict[tuple[str, str, tuple[Any, ...]], Mapping[str, Any]] = {}
        self.wild: list[tuple[str, str, Mapping[str, Any]]] = []
        self.hangs: list[tuple[str, str, tuple[Any, ...] | None, float]] = []
        for e in overlay.get("calls") or ():
            dev = resolve(e.get("gpu"))
            args = _freeze(e["args"]) if "args" in e else None
            if "hang" in e:
                self.hangs.append((e["fn"], dev, args, float(e["hang"])))
            if not ({"result", "error", "out"} & set(e)):
                continue
            if args is None:
                self.wild.append((e["fn"], dev, e))
            else:
                self.exact[(e["fn"], dev, args)] = e
        self.events: list[dict[str, Any]] = []
        for ev in overlay.get("events") or ():
            et = ev.get("type", "xid")
            self.events.append({"dev": resolve(ev.get("gpu", 0)) or "gpu0",
                                "eventType": EVENT_TYPES[et] if isinstance(et, str) else int(et),
                                "eventData": int(ev.get("data", 0)),
                                "gpuInstanceId": int(ev.get("gpu_instance", 0xFFFFFFFF)),
                                "computeInstanceId": int(ev.get("compute_instance", 0xFFFFFFFF))})

    def entry(self, fn: str, dev: str, args: tuple[Any, ...]) -> Mapping[str, Any] | None:
        e = self.exact.get((fn, dev, args)) or self.exact.get((fn, "", args))
        if e is not None:
            return e
        for wfn, wdev, w in reversed(self.wild):
            if wfn == fn and (not wdev or wdev == dev):
                return w
        return None

    def hang(self, fn: str, dev: str, args: tuple[Any, ...]) -> float:
        return sum(s for hfn, hdev, hargs, s in self.hangs
                   if hfn == fn and (not hdev or hdev == dev) and (hargs is None or hargs == args))


class OverlayNvml(NvmlForward):
    """Wrap *api* and apply a fault overlay (static dict, or a callable read per call)."""

    def __init__(self, api: NvmlApi, overlay: Mapping[str, Any] | Callable[[], Mapping[str, Any]]) -> None:
        self._api = api
        self._source = overlay
        self._cache: tuple[str, _Compiled] | None = None
        self._lock = threading.Lock()
        self._events_taken = 0
        if not callable(overlay):
            self._compiled()  # a bad static overlay fails now, not at the first call

    # -- overlay ----------------------------------------------------------

    def _compiled(self) -> _Compiled:
        ov = self._source() if callable(self._source) else self._source
        stamp = json.dumps(ov, sort_keys=True, default=str)
        with self._lock:
            if self._cache is None or self._cache[0] != stamp:
                check_overlay(ov)
                self._cache = (stamp, _Compiled(ov, self._resolver()))
                self._events_taken = 0
            return self._cache[1]

    def _resolver(self) -> Callable[[Any], str]:
        from .busid import normalize_bus_id
        buses: dict[str, str] = {}

        def bus_map() -> dict[str, str]:
            if not buses:
                api = self._api
                for i in range(api.nvmlDeviceGetCount()):
                    try:
                        pci = api.nvmlDeviceGetPciInfo(api.nvmlDeviceGetHandleByIndex(i))
                        bus = pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId
                        buses[normalize_bus_id(bus)] = f"gpu{i}"
                    except NVMLError:
                        continue
            return buses

        def resolve(gpu: Any) -> str:
            if gpu is None or gpu == "":
                return ""
            if isinstance(gpu, int) and not isinstance(gpu, bool):
                return f"gpu{gpu}"
            if not isinstance(gpu, str):
                raise ValueError(f"overlay names GPU {gpu!r}: not a bus id, index or handle key")
            if gpu.isdigit():
                return f"gpu{gpu}"
            if gpu.startswith("gpu") and gpu[3:4].isdigit():
                return gpu
            try:
                bus = normalize_bus_id(gpu)
            except ValueError:
                raise ValueError(f"overlay names GPU {gpu!r}: not a bus id, index or handle key") from None
            if bus not in bus_map():
                raise ValueError(f"overlay names GPU {bus}, which the machine does not have")
            return bus_map()[bus]

        return resolve

    # -- the contract -------------------------------------------------------

    def new_gpm_metrics(self) -> Any:
        return self._api.new_gpm_metrics()

    def nvmlEventSetWait_v2(self, eventSet: NvmlHandle, timeoutms: int) -> Any:
        return self._event_wait(self._api.nvmlEventSetWait_v2, eventSet, timeoutms)

    def _call(self, fn: str, args: tuple[Any, ...]) -> Any:
        target = getattr(self._api, fn)
        ov = self._compiled()
        _, dev, rest = call_key(fn, args)
        secs = ov.hang(fn, dev, rest)
        if secs:
            time.sleep(secs)
        if (dev and dev.split("/")[0] in ov.lost) or (
                fn == "nvmlDeviceGetHandleByIndex" and rest and f"gpu{rest[0]}" in ov.lost):
            raise NVMLError(C.NVML_ERROR_GPU_IS_LOST)
        e = ov.entry(fn, dev, rest)
        if e is None:
            return target(*args)
        if "error" in e:
            raise NVMLError(error_code(e["error"]))
        if "result" in e:
            res = e["result"]
            if isinstance(res, Mapping):
                try:
                    base = to_plain(target(*args))
                except NVMLError:
                    base = None
                if isinstance(base, dict):
                    res = {**base, **res}
            return from_plain(res)
        outs = [a for a in args if is_out_param(a)]
        try:
            ret = target(*args)
        except NVMLError:
            ret = C.NVML_SUCCESS
        if outs:
            fill_struct(outs[0], e["out"])
        return ret

    def _event_wait(self, target: Any, eventSet: Any, timeoutms: int) -> Any:
        ov = self._compiled()
        with self._lock:
            ev = ov.events[self._events_taken] if self._events_taken < len(ov.events) else None
            if ev is not None:
                self._events_taken += 1
        if ev is None:
            return target(eventSet, timeoutms)
        return NvmlStruct({"device": Handle(ev["dev"]), "eventType": ev["eventType"], "eventData": ev["eventData"],
                           "gpuInstanceId": ev["gpuInstanceId"], "computeInstanceId": ev["computeInstanceId"]})
