"""A deadline on hardware reads that have none of their own (NVML, hwloc).

An NVML call on a sick GPU can block in the driver for minutes, and
slurmstepd (where the SPANK plugin runs) has no watchdog over us: a hung
read would hang the job step.  :func:`bounded` runs the read in a daemon
thread and gives up after *timeout* seconds; the stuck thread stays blocked
in C (ctypes released the GIL) and dies with the process.
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

from ..errors import HardwareError, SlurmGpuError

T = TypeVar("T")


def bounded(fn: Callable[[], T], timeout: float, what: str) -> T:
    """``fn()``, or :class:`HardwareError` when it has not returned after *timeout* s."""
    box: dict[str, object] = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e
        finally:
            done.set()

    t = threading.Thread(target=work, name=f"bounded-{what}", daemon=True)
    t.start()
    if not done.wait(timeout):
        raise HardwareError(f"{what} gave no answer in {timeout:g} s (hung driver or GPU?)")
    if "error" in box:
        e = box["error"]
        if isinstance(e, SlurmGpuError):
            raise e
        raise HardwareError(f"{what} failed: {type(e).__name__}: {e}") from e  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
