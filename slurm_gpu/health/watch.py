"""``xid-watch``: a small persistent GPU event listener.

The driver delivers events (critical XID, double-bit ECC, GPU unavailable, GPU
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

from ..hw.gpus import GpuError, GpuEvent, Gpus

_WAIT_MS = 1000


LOST_REPEAT_S = 60.0


def event_record(ev: GpuEvent) -> dict[str, Any]:
    """One GPU event as the JSON record health reads."""
    rec: dict[str, Any] = {"time": round(time.time(), 3), "event": ev.kind, "gpu": ev.gpu, "data": ev.data,
                           "type": ev.type}
    if ev.kind == "xid":
        rec["xid"] = ev.data
    return rec


def append(path: str, rec: dict[str, Any]) -> None:
    """One line per event, O_APPEND: a reader never sees half a line it would keep."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.write(fd, (json.dumps(rec, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def watch(opener: Callable[[], Gpus], path: str, *, max_events: int = 0, run_for: float = 0.0) -> int:
    """Listen until SIGTERM/SIGINT (or *max_events* / *run_for*); returns the events written."""
    from ..errors import HardwareError
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    gpus = opener()
    stop = {"now": False}

    def _stop(signum: int, frame: Any) -> None:
        stop["now"] = True

    old_term = signal.signal(signal.SIGTERM, _stop)
    events = gpus.listen()
    try:
        registered = 0
        for i in range(gpus.count()):
            try:
                events.register(i)
            except GpuError as e:
                # Only a lost GPU is a fault; NOT_SUPPORTED (no XID events on
                # this GPU or platform) and the like are recorded, never drained.
                # (Not written to the event file: a watcher restarted by systemd
                # every few seconds would grow it without end.)
                if e.lost:
                    append(path, {"time": round(time.time(), 3), "event": "gpu_unavailable", "gpu": None,
                                  "data": int(e.code or 0), "index": i})
                else:
                    print(f"slurm-gpu: xid-watch: GPU {i}: event registration refused ({e})", file=sys.stderr)
                continue
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
                ev = events.wait(_WAIT_MS)
            except GpuError as e:
                if e.lost:
                    # The driver answers this on every wait while the GPU stays lost:
                    # one record a minute is enough to keep the node drained.
                    if time.monotonic() - last_lost >= LOST_REPEAT_S:
                        append(path, {"time": round(time.time(), 3), "event": "gpu_unavailable", "gpu": None,
                                      "data": int(e.code or 0)})
                        n += 1
                        last_lost = time.monotonic()
                    time.sleep(1.0)
                    continue
                raise HardwareError(f"xid-watch: {e.call} failed ({e})") from None
            if ev is None:
                continue
            append(path, event_record(ev))
            n += 1
            if max_events and n >= max_events:
                break
        return n
    finally:
        events.close()
        gpus.close()
        signal.signal(signal.SIGTERM, old_term)
