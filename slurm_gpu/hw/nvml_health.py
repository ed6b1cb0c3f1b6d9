"""NVML health reads: plain data for the ``gpu.*`` checks.

:func:`read_health` reads through the same :class:`~slurm_gpu.hw.nvml_api.NvmlApi`
as :mod:`slurm_gpu.hw.nvml` (the driver, snapshot replay, simulator, or a
recorder around any of them), so snapshots can record these answers and
fault overlays can change them (remapped rows, ECC counts, a lost GPU...).

:func:`read_health_bounded` runs the reads in a worker thread and gives every
single NVML call a deadline: a GPU whose driver hangs in a call cannot hang
the health check (the worker is a daemon thread, abandoned when it hangs,
and the answer says which call hung).

The error policy is :func:`slurm_gpu.hw.nvml_api.classify`'s: an absent
answer (not supported...) becomes ``None``, it is not a fault.  A denied
one (NO_PERMISSION) is ``None`` too, and kept by name in ``GpuHealth.errors``
like any other NVML error, so that "unknown" is never read as "none" (an
unreadable process list is not an empty one).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import HardwareError, SlurmGpuError
from . import nvml_constants as C
from .busid import normalize_bus_id
from .nvml_api import ABSENT, NVMLError, NvmlApi, NvmlForward, NvmlHandle, Reader, classify


@dataclass
class GpuHealth:
    """What NVML says about one GPU's health (None: not supported / not read)."""

    index: int
    bus_id: str | None = None
    uuid: str | None = None
    name: str | None = None
    minor: int | None = None
    lost: str | None = None                 # NVML error name when the GPU cannot be reached
    architecture: int | None = None
    remapped_rows: tuple[int, int, int, int] | None = None  # correctable, uncorrectable, pending, failure
    retired_pages: tuple[int, int] | None = None             # single-bit, double-bit causes
    retired_pending: int | None = None
    ecc_volatile_uncorrected: int | None = None
    recovery_action: int | None = None
    fabric_state: str | None = None
    fabric_status: int | None = None
    fabric_health_mask: int | None = None
    fabric_health_summary: int | None = None                 # NVML_GPU_FABRIC_HEALTH_SUMMARY_* (0: not supported)
    fabric_cluster_uuid: str | None = None                   # "00000000-...": no multi-node fabric
    fabric_clique_id: int | None = None
    nvlink_states: tuple[int, ...] | None = None            # one per existing link: 1 up, 0 down
    # NVML_FI_DEV_NVLINK_GET_SPEED per link slot (MB/s; None: not answered).
    # Read only when a check asks (include_nvlink_speed): one field query a GPU.
    nvlink_speeds: tuple[int | None, ...] | None = None
    pcie_gen: tuple[int, int] | None = None                  # current, max
    pcie_width: tuple[int, int] | None = None                # current, max
    clock_reasons: int | None = None
    persistence_mode: int | None = None
    # Read only when asked (include_processes): the repair ladder and the
    # user-problem check, never a clean routine run.
    processes: tuple[tuple[int, int | None], ...] | None = None  # (pid, used GPU memory bytes or None)
    memory_used: int | None = None                           # bytes
    errors: dict[str, str] = field(default_factory=dict)     # query -> NVML error name


@dataclass
class NvmlHealth:
    """The whole gather: ``available`` False means NVML itself could not start."""

    available: bool
    error: str | None = None
    gpus: list[GpuHealth] = field(default_factory=list)
    count: int | None = None
    hung: str | None = None                 # "nvmlDeviceGetX gave no answer in 5 s (GPU ...)"
    hung_gpu: str | None = None             # bus id of the GPU being read when it hung
    # The read ran out of its total budget with no single call past its own
    # timeout (or still inside nvmlInit): slow, not hung.  nvmlInit without
    # persistence mode, or a loaded node, does that; it is no proof of a fault.
    slow: bool = False


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class _Calls:
    """Optional queries of one GPU under the one policy; what is not absent goes to its ``errors``."""

    def __init__(self, api: NvmlApi) -> None:
        self.api = api

    def opt(self, g: GpuHealth, key: str, fn: Any, *args: Any) -> Any:
        r = Reader(self.api)
        try:
            got = r.maybe(fn, *args, key=key)
        except NVMLError as e:
            g.errors[key] = e.name
            return None
        g.errors.update(r.denied)
        return got


def read_health(api: NvmlApi, gpu_indices: list[int] | None = None, *, include_fabric: bool = True,
                out: NvmlHealth | None = None, include_processes: bool = False,
                include_nvlink_speed: bool = False) -> NvmlHealth:
    """Read every GPU's health through *api* (initialised).

    *out*, when given, is filled as the read goes, so a caller that gives up
    on a hung call still has what was read and knows which GPU hung (the
    last one in ``out.gpus``).
    """
    if out is None:
        out = NvmlHealth(available=True)
    c = _Calls(api)
    try:
        out.count = int(api.nvmlDeviceGetCount())
    except NVMLError as e:
        return NvmlHealth(available=False, error=f"nvmlDeviceGetCount: {e.name}")
    for i in (range(out.count) if gpu_indices is None else gpu_indices):
        g = GpuHealth(index=i)
        out.gpus.append(g)
        try:
            h = api.nvmlDeviceGetHandleByIndex(i)
            pci = api.nvmlDeviceGetPciInfo(h)
            g.bus_id = normalize_bus_id(_s(pci.busId))
        except NVMLError as e:
            g.lost = e.name
            continue
        _read_one(c, g, h, include_fabric)
        if include_nvlink_speed and g.lost is None and g.nvlink_states:
            _read_nvlink_speeds(c, g, h)
        if include_processes and g.lost is None:
            _read_processes(c, g, h)
    return out


def read_processes(gpus: Any, indices: list[int]) -> NvmlHealth:
    """The processes and used memory of GPUs *indices* of an open
    :class:`~slurm_gpu.hw.gpus.Gpus` (the epilog's leftover check)."""
    return read_health(gpus.api, indices, include_fabric=False, include_processes=True)


def _read_processes(c: _Calls, g: GpuHealth, h: NvmlHandle) -> None:
    """Compute and graphics processes holding a context on the GPU, and its used memory."""
    procs: dict[int, int | None] = {}
    for fn in (c.api.nvmlDeviceGetComputeRunningProcesses, c.api.nvmlDeviceGetGraphicsRunningProcesses):
        got = c.opt(g, "processes", fn, h)
        for p in got or ():
            used = getattr(p, "usedGpuMemory", None)
            procs[int(p.pid)] = int(used) if isinstance(used, int) else None
    if "processes" not in g.errors:
        g.processes = tuple(sorted(procs.items()))
    mem = c.opt(g, "memory", c.api.nvmlDeviceGetMemoryInfo, h)
    if mem is not None:
        g.memory_used = int(mem.used)


def _read_one(c: _Calls, g: GpuHealth, h: NvmlHandle, include_fabric: bool) -> None:
    api = c.api
    uuid = c.opt(g, "uuid", api.nvmlDeviceGetUUID, h)
    g.uuid = _s(uuid) if uuid is not None else None
    name = c.opt(g, "name", api.nvmlDeviceGetName, h)
    g.name = _s(name) if name is not None else None
    g.minor = c.opt(g, "minor", api.nvmlDeviceGetMinorNumber, h)
    if "GPU_IS_LOST" in g.errors.get("uuid", "") or "GPU_IS_LOST" in g.errors.get("name", ""):
        g.lost = "NVML_ERROR_GPU_IS_LOST"
        return
    g.architecture = c.opt(g, "architecture", api.nvmlDeviceGetArchitecture, h)
    rows = c.opt(g, "remapped_rows", api.nvmlDeviceGetRemappedRows, h)
    if rows is not None:
        g.remapped_rows = tuple(int(x) for x in rows)  # type: ignore[assignment]
    # Row remapping replaced page retirement with Ampere.
    if rows is None and (g.architecture is None or g.architecture < C.NVML_DEVICE_ARCH_AMPERE):
        sbe = c.opt(g, "retired_pages", api.nvmlDeviceGetRetiredPages, h,
                    C.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe = c.opt(g, "retired_pages", api.nvmlDeviceGetRetiredPages, h,
                    C.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        if sbe is not None or dbe is not None:
            g.retired_pages = (len(sbe or ()), len(dbe or ()))
            g.retired_pending = c.opt(g, "retired_pending", api.nvmlDeviceGetRetiredPagesPendingStatus, h)
    g.ecc_volatile_uncorrected = c.opt(g, "ecc", api.nvmlDeviceGetTotalEccErrors, h,
                                       C.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, C.NVML_VOLATILE_ECC)
    vals = c.opt(g, "recovery_action", api.nvmlDeviceGetFieldValues, h, [C.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    if vals:
        v = vals[0]
        if int(getattr(v, "nvmlReturn", 0)) == 0:
            val = getattr(v, "value", None)
            g.recovery_action = int(getattr(val, "uiVal", getattr(val, "ullVal", val if isinstance(val, int) else 0)))
    if include_fabric:
        from .nvml import read_fabric_fields  # the model's own fabric reader: one copy of that logic
        try:
            fab = read_fabric_fields(Reader(api), h)
        except NVMLError as e:
            g.errors["fabric"] = e.name
            fab = None
        if fab is not None:
            g.fabric_state, g.fabric_status, g.fabric_health_mask = fab["state"], fab["status"], fab["health_mask"]
            g.fabric_health_summary = fab["health_summary"]
            g.fabric_cluster_uuid, g.fabric_clique_id = fab["cluster_uuid"], fab["clique_id"]
    states: list[int] = []
    for link in range(C.NVML_NVLINK_MAX_LINKS):
        try:
            states.append(int(api.nvmlDeviceGetNvLinkState(h, link)))
        except NVMLError as e:
            if classify(e.value) != ABSENT:     # past the last link is INVALID_ARGUMENT: absent
                g.errors["nvlink"] = e.name
            break
    g.nvlink_states = tuple(states) if states else None
    cg = c.opt(g, "pcie", api.nvmlDeviceGetCurrPcieLinkGeneration, h)
    mg = c.opt(g, "pcie", api.nvmlDeviceGetMaxPcieLinkGeneration, h)
    cw = c.opt(g, "pcie", api.nvmlDeviceGetCurrPcieLinkWidth, h)
    mw = c.opt(g, "pcie", api.nvmlDeviceGetMaxPcieLinkWidth, h)
    if cg is not None and mg is not None:
        g.pcie_gen = (int(cg), int(mg))
    if cw is not None and mw is not None:
        g.pcie_width = (int(cw), int(mw))
    reasons = c.opt(g, "clocks", api.nvmlDeviceGetCurrentClocksEventReasons, h)
    if reasons is None:
        g.errors.pop("clocks", None)
        reasons = c.opt(g, "clocks", api.nvmlDeviceGetCurrentClocksThrottleReasons, h)
    g.clock_reasons = int(reasons) if reasons is not None else None
    g.persistence_mode = c.opt(g, "persistence", api.nvmlDeviceGetPersistenceMode, h)


NVLINK_GET_SPEED = 164   # NVML_FI_DEV_NVLINK_GET_SPEED: MB/s of the link given as scopeId (nvml.h)


def nvlink_speed_fields(links: int) -> list[tuple[int, int]]:
    """The one field query that reads every link slot's speed (a fault drill overlays exactly it)."""
    return [(NVLINK_GET_SPEED, link) for link in range(links)]


def _read_nvlink_speeds(c: _Calls, g: GpuHealth, h: Any) -> None:
    # nvidia-ml-py takes (fieldId, scopeId) pairs; one call for all links keeps
    # the cost one NVML round trip a GPU.  Values are matched by field and
    # scope, never by position: a driver may answer them in any order.
    n = len(g.nvlink_states or ())
    vals = c.opt(g, "nvlink_speed", c.api.nvmlDeviceGetFieldValues, h, nvlink_speed_fields(n))
    if not vals:
        return
    speeds: list[int | None] = [None] * n
    for v in vals:
        link = int(getattr(v, "scopeId", -1))
        if int(getattr(v, "fieldId", 0)) != NVLINK_GET_SPEED or not 0 <= link < n:
            continue
        if int(getattr(v, "nvmlReturn", 0)) != 0:
            continue
        val = getattr(v, "value", None)
        speeds[link] = int(getattr(val, "uiVal", getattr(val, "ullVal", val if isinstance(val, int) else 0)))
    if any(x is not None for x in speeds):
        g.nvlink_speeds = tuple(speeds)


# ------------------------------------------------------------- deadlines

class WatchedNvml(NvmlForward):
    """The NVML contract over *api*, telling :func:`read_health_bounded`'s watcher which
    call is running and when it began (in *state*: "call", "calls")."""

    def __init__(self, api: NvmlApi, state: dict[str, Any]) -> None:
        self._api = api
        self._state = state

    def new_gpm_metrics(self) -> Any:
        return self._api.new_gpm_metrics()

    def _call(self, fn: str, args: tuple[Any, ...]) -> Any:
        target = getattr(self._api, fn)
        self._state["call"] = (fn, args[:1], time.monotonic())
        try:
            return target(*args)
        finally:
            self._state["call"] = None
            self._state["calls"] += 1


def read_health_bounded(open_gpus: Callable[[], Any], *, call_timeout: float = 5.0, total_timeout: float = 12.0,
                        include_fabric: bool = True, include_processes: bool = False,
                        include_nvlink_speed: bool = False) -> NvmlHealth:
    """:func:`read_health` with a deadline on every NVML call and on the whole read.

    ``open_gpus`` opens the node's :class:`~slurm_gpu.hw.gpus_nvml.NvmlGpus`
    (HardwareError: NVML unavailable), closed after a complete read.  A call
    that does not return within ``call_timeout`` seconds ends the read with
    ``hung`` set; the stuck worker thread is left behind as a daemon.
    """
    state: dict[str, Any] = {"call": None, "calls": 0, "result": None, "error": None, "api": None}
    partial = NvmlHealth(available=True)

    done = threading.Event()

    def work() -> None:
        try:
            gpus = open_gpus()
            state["api"] = gpus
            state["result"] = read_health(WatchedNvml(gpus.api, state), include_fabric=include_fabric, out=partial,
                                          include_processes=include_processes,
                                          include_nvlink_speed=include_nvlink_speed)
        except HardwareError as e:
            state["error"] = e.what
        except SlurmGpuError as e:          # bad input (overlay, config): the caller's error, not NVML's
            state["fatal"] = e
        except Exception as e:  # noqa: BLE001 - reported as a broken check, never a traceback mid-run
            state["error"] = f"{type(e).__name__}: {e}"
        finally:
            done.set()

    t = threading.Thread(target=work, name="nvml-health", daemon=True)
    start = time.monotonic()
    t.start()
    while not done.wait(min(0.05, call_timeout)):
        now = time.monotonic()
        cur = state["call"]
        if cur is not None and now - cur[2] > call_timeout:
            return _hung(partial, f"{cur[0]} gave no answer in {call_timeout:g} s")
        if now - start > total_timeout:
            where = "" if cur is not None else " (still in nvmlInit)"
            return _hung(partial, f"NVML reads took longer than {total_timeout:g} s{where}", slow=True)
    if state.get("fatal") is not None:
        raise state["fatal"]
    if state["error"] is not None:
        return NvmlHealth(available=False, error=state["error"])
    if state["api"] is not None:
        state["api"].close()
    return state["result"]


def _hung(partial: NvmlHealth, what: str, slow: bool = False) -> NvmlHealth:
    gpus = list(partial.gpus)
    gpu = gpus[-1] if gpus else None
    where = f" (GPU {gpu.bus_id or gpu.index})" if gpu is not None else ""
    return NvmlHealth(available=True, count=partial.count, gpus=gpus[:-1] if gpus else [],
                      hung=f"{what}{where}", hung_gpu=gpu.bus_id if gpu is not None else None, slow=slow)
