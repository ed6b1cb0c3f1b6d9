"""Scripted GPU load for the NVML simulator: utilisation, memory, power,
energy, processes, per-process accounting and GPM, per GPU or MIG instance,
over time.

A test (or a developer) describes what each device does as a timeline, and
the simulator answers NVML's usage queries from it, so the project's real
adapter (:mod:`slurm_gpu.hw.gpustats`) and sampler run unchanged::

    {"schema": "slurm-gpu.simload/1",
     "t0": 1700000000.0,                    # epoch seconds; "t" below is relative to it
     "devices": {
       "0":     [{"t": 0, "sm": 95, "mem_util": 40, "mem_mib": 30000, "power_w": 600,
                  "pids": [4242]},
                 {"t": 60, "sm": 0, "pids": []}],
       "2/gi1": [{"t": 0, "sm": 50, "mem_mib": 4000, "pids": [{"pid": 77, "mem_mib": 4000}]}],
       "3":     [{"t": 0, "sm": 80, "pids": [{"pid": 5, "sm": 60}, {"pid": 6, "sm": 20}]}]
     }}

A process's ``sm`` is its own SM percentage (NVML's per-process
utilisation; a GPU shared by gres/shard or gres/mps); the device's ``sm``
stays the whole GPU's figure, so a load gives both consistently.
Keys are a GPU's NVML index, or ``<index>/gi<GPU instance id>`` for a MIG
instance.  Each entry holds from its ``t`` until the next one; a field an
entry leaves out keeps its earlier value.  Defaults: idle (0 %), no memory,
no processes, ``idle_power_w`` (60 W unless the load says otherwise).
Energy is the exact integral of the power timeline, so the counter a
sampler reads is consistent with the power it sees.

The load lives in the simulator state as ``state["load"]`` (inline) or
``state["load_file"]`` (a path, re-read when the file changes: a test
process scripts it while slurmd's prolog and the sampler read it).  The
clock is ``time.time()``, or ``state["clock"]`` when a test freezes it.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping

from slurm_gpu.errors import InputError
from slurm_gpu.fsutil import atomic_write

LOAD_SCHEMA = "slurm-gpu.simload/1"
DEFAULT_IDLE_POWER_W = 60.0
FIELDS = ("sm", "mem_util", "mem_mib", "power_w", "pids")

_file_cache: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}


def check_load(load: Any, where: str) -> dict[str, Any]:
    """Reject a load the simulator could not answer from (one line naming the place)."""
    if not isinstance(load, dict) or load.get("schema") != LOAD_SCHEMA:
        raise InputError(f"not a simulator load (schema must be {LOAD_SCHEMA})", where)
    devs = load.get("devices", {})
    if not isinstance(devs, dict):
        raise InputError("load \"devices\" must be an object", where)
    for key, timeline in devs.items():
        if not isinstance(timeline, list) or not all(isinstance(e, dict) and "t" in e for e in timeline):
            raise InputError(f"load for device {key!r} must be a list of entries with \"t\"", where)
        for e in timeline:
            unknown = set(e) - {"t", *FIELDS}
            if unknown:
                raise InputError(f"unknown load field {sorted(unknown)[0]!r} for device {key!r}", where)
    return load


def read_load_file(path: str) -> dict[str, Any]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError("simulator load file not found", path) from None
    stamp = (st.st_mtime_ns, st.st_ino)
    hit = _file_cache.get(path)
    if hit and hit[0] == stamp:
        return hit[1]
    try:
        with open(path) as f:
            data = check_load(json.load(f), path)
    except json.JSONDecodeError as e:
        raise InputError(f"bad simulator load JSON: {e.msg}", f"{path}:{e.lineno}") from None
    _file_cache[path] = (stamp, data)
    return data


def write_load(path: str, load: Mapping[str, Any]) -> None:
    """Write a load file atomically (readers never see half of it)."""
    check_load(dict(load), path)
    atomic_write(path, json.dumps(load, indent=1) + "\n", mode=0o644)


def state_load(state: Mapping[str, Any]) -> dict[str, Any] | None:
    """The load of a simulator state (inline or from its file), or None."""
    if state.get("load"):
        load = state["load"]
        if _tl_cache[0] is not load:
            check_load(load, "simulator state: load")
        return load
    if state.get("load_file"):
        return read_load_file(str(state["load_file"]))
    return None


def now(state: Mapping[str, Any]) -> float:
    c = state.get("clock")
    return float(c) if c is not None else time.time()


class Timeline:
    """One device's timeline: values at a time, and integrals up to a time."""

    def __init__(self, entries: list[dict[str, Any]], t0: float, idle_power_w: float) -> None:
        self.t0 = t0
        self.steps: list[tuple[float, dict[str, Any]]] = []
        cur: dict[str, Any] = {"sm": 0.0, "mem_util": 0.0, "mem_mib": 0, "power_w": idle_power_w,
                               "pids": []}
        for e in sorted(entries, key=lambda x: float(x["t"])):
            cur = {**cur, **{k: v for k, v in e.items() if k != "t"}}
            self.steps.append((t0 + float(e["t"]), cur))
        self.idle = {"sm": 0.0, "mem_util": 0.0, "mem_mib": 0, "power_w": idle_power_w, "pids": []}

    def at(self, t: float) -> dict[str, Any]:
        val = self.idle
        for start, v in self.steps:
            if start > t:
                break
            val = v
        return val

    def integral(self, field: str, t: float) -> float:
        """∫ field dt from t0 (or the first entry) to *t*, in field-units × seconds."""
        total = 0.0
        points = [(self.t0, self.idle)] + [s for s in self.steps if s[0] >= self.t0]
        for i, (start, v) in enumerate(points):
            if start >= t:
                break
            end = points[i + 1][0] if i + 1 < len(points) else t
            total += float(v[field]) * (min(end, t) - start)
        return total


_tl_cache: list[Any] = [None, None]    # [the load object, its timelines]: one NVML call after another


def timelines(state: Mapping[str, Any]) -> tuple[dict[str, Timeline], float]:
    """Every scripted device's timeline, and the load's idle power."""
    load = state_load(state) or {}
    if _tl_cache[0] is load:     # the same object (held here, so its id cannot be reused)
        return _tl_cache[1]
    idle = float(load.get("idle_power_w", DEFAULT_IDLE_POWER_W))
    t0 = float(load.get("t0", 0.0))
    out = ({k: Timeline(v, t0, idle) for k, v in (load.get("devices") or {}).items()}, idle)
    _tl_cache[0], _tl_cache[1] = load, out
    return out


def pid_list(value: Any) -> list[tuple[int, int]]:
    """``pids`` of an entry as (pid, memory MiB) pairs."""
    out = []
    for p in value or ():
        if isinstance(p, dict):
            out.append((int(p["pid"]), int(p.get("mem_mib", 0))))
        else:
            out.append((int(p), 0))
    return out


def pid_sm(value: Any) -> list[tuple[int, float]]:
    """``pids`` of an entry as (pid, SM %) pairs (0 when the entry gives none)."""
    return [(int(p["pid"]), float(p.get("sm", 0) or 0)) if isinstance(p, dict) else (int(p), 0.0)
            for p in value or ()]
