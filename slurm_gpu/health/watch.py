"""``xid-watch``: a small persistent NVML event listener.

NVML delivers events (critical XID, double-bit ECC, GPU unavailable, GPU
recovery action) only to a process registered when they happen; a health
check that starts every few minutes would miss them.  This listener
appends one JSON line per event to the file ``slurm-gpu health`` reads
(with its own cursor), so nothing between two checks is lost::

    {"time": 1732250000.1, "event": "xid", "xid": 79, "gpu": "0000:07:00.0", "data": 79}

``event`` is ``xid``, ``dbe``, ``gpu_unavailable``, ``recovery_action`` or ``other``.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, Callable

_WAIT_MS = 1000


def _bus(api: Any, h: Any) -> str | None:
    from ..hw.model import normalize_bus_id
    try:
        b = api.nvmlDeviceGetPciInfo(h).busId
        return normalize_bus_id(b.decode() if isinstance(b, bytes) else str(b))
    except Exception:  # noqa: BLE001 - a lost GPU has no PCI info; the event still counts
        return None


def _kind(api: Any, etype: int) -> str:
    table = (("nvmlEventTypeXidCriticalError", "xid"), ("nvmlEventTypeDoubleBitEccError", "dbe"),
             ("nvmlEventTypeGpuUnavailableError", "gpu_unavailable"),
             ("nvmlEventTypeGpuRecoveryAction", "recovery_action"))
    for const, name in table:
        if etype & int(getattr(api, const, 0)):
            return name
    return "other"


LOST_REPEAT_S = 60.0


def event_record(api: Any, ev: Any, buses: dict[Any, str | None]) -> dict[str, Any]:
    """One NVML event as the JSON record health reads."""
    etype = int(ev.eventType)
    kind = _kind(api, etype)
    dev = ev.device
    gpu = buses.get(getattr(dev, "key", id(dev))) or _bus(api, dev)
    rec: dict[str, Any] = {"time": round(time.time(), 3), "event": kind, "gpu": gpu, "data": int(ev.eventData),
                           "type": etype}
    if kind == "xid":
        rec["xid"] = int(ev.eventData)
    return rec


def append(path: str, rec: dict[str, Any]) -> None:
    """One line per event, O_APPEND: a reader never sees half a line it would keep."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.write(fd, (json.dumps(rec, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def watch(opener: Callable[[], Any], path: str, *, max_events: int = 0, run_for: float = 0.0,
          closer: Callable[[Any], None] | None = None) -> int:
    """Listen until SIGTERM/SIGINT (or *max_events* / *run_for*); returns the events written."""
    from ..errors import HardwareError
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    api = opener()
    stop = {"now": False}

    def _stop(signum: int, frame: Any) -> None:
        stop["now"] = True

    old_term = signal.signal(signal.SIGTERM, _stop)
    wanted = 0
    for const in ("nvmlEventTypeXidCriticalError", "nvmlEventTypeDoubleBitEccError",
                  "nvmlEventTypeGpuUnavailableError", "nvmlEventTypeGpuRecoveryAction"):
        wanted |= int(getattr(api, const, 0))
    es = api.nvmlEventSetCreate()
    buses: dict[Any, str | None] = {}
    try:
        registered = 0
        for i in range(int(api.nvmlDeviceGetCount())):
            try:
                h = api.nvmlDeviceGetHandleByIndex(i)
                try:
                    supported = int(api.nvmlDeviceGetSupportedEventTypes(h))
                except api.NVMLError:
                    supported = wanted
                api.nvmlDeviceRegisterEvents(h, wanted & supported, es)
            except api.NVMLError as e:
                # Only a lost GPU is a fault; NOT_SUPPORTED (no XID events on
                # this GPU or platform) and the like are recorded, never drained.
                # (Not written to the event file: a watcher restarted by systemd
                # every few seconds would grow it without end.)
                if e.value == api.NVML_ERROR_GPU_IS_LOST:
                    append(path, {"time": round(time.time(), 3), "event": "gpu_unavailable", "gpu": None,
                                  "data": int(e.value), "index": i})
                else:
                    print(f"slurm-gpu: xid-watch: GPU {i}: event registration refused ({e})", file=sys.stderr)
                continue
            buses[getattr(h, "key", id(h))] = _bus(api, h)
            registered += 1
        if registered == 0:
            raise HardwareError("xid-watch: no GPU accepts NVML event registration")
        n = 0
        t0 = time.monotonic()
        last_lost = -LOST_REPEAT_S
        while not stop["now"]:
            if run_for and time.monotonic() - t0 >= run_for:
                break
            try:
                ev = api.nvmlEventSetWait_v2(es, _WAIT_MS)
            except api.NVMLError as e:
                if e.value == api.NVML_ERROR_TIMEOUT:
                    continue
                if e.value == api.NVML_ERROR_GPU_IS_LOST:
                    # NVML answers this on every wait while the GPU stays lost:
                    # one record a minute is enough to keep the node drained.
                    if time.monotonic() - last_lost >= LOST_REPEAT_S:
                        append(path, {"time": round(time.time(), 3), "event": "gpu_unavailable", "gpu": None,
                                      "data": int(e.value)})
                        n += 1
                        last_lost = time.monotonic()
                    time.sleep(1.0)
                    continue
                raise HardwareError(f"xid-watch: nvmlEventSetWait failed ({e})") from None
            append(path, event_record(api, ev, buses))
            n += 1
            if max_events and n >= max_events:
                break
        return n
    finally:
        try:
            api.nvmlEventSetFree(es)
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
        if closer is not None:
            closer(api)
        signal.signal(signal.SIGTERM, old_term)
