"""The processes of a job's MPS daemon: found through ``/proc`` by the pipe
directory in their environment, checked and killed without PID-reuse races.

Split from ``mps.py`` (which re-exports these names: tests patch
``mps.daemon_pids``, and ``mps`` calls them through its own namespace).
"""
from __future__ import annotations

import os
import signal
from pathlib import Path


def _ids(pid: int | str, proc: str = "/proc") -> tuple[tuple[int, ...], int] | None:
    """(real, effective, saved, fs uid) and start time (clock ticks after boot) of *pid*.

    Both read from files that do not take the target's memory lock, so a
    process hung in the driver cannot hang this scan.  The start time tells
    a process from a later one that got its recycled PID.
    """
    from ..procfs import start_time
    try:
        start = start_time(pid, proc)
        if start is None:
            return None
        with open(f"{proc}/{pid}/status", "rb") as f:
            uids = next(line for line in f if line.startswith(b"Uid:")).split()[1:5]
        return tuple(int(u) for u in uids), start
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def daemon_procs(pipe: Path | str, uid: int | None, proc: str = "/proc"
                 ) -> dict[int, tuple[int, int]]:
    """{pid: (start time, uid)} of *uid*'s processes bound to this pipe directory.

    Only processes whose every uid is the job user's count: anyone can put
    the pipe directory into a process's environment (a setuid program
    started with it, another user's process), and root must signal only the
    job user's own daemon, server and clients.  Root's processes never count;
    *uid* None takes any one non-root user (the job user is unknown).
    """
    if uid == 0:
        return {}
    want = f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode()
    out: dict[int, tuple[int, int]] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        ids = _ids(name, proc)
        if ids is None or len(set(ids[0])) != 1 or ids[0][0] == 0 or \
                (uid is not None and ids[0][0] != uid):
            continue
        try:
            with open(f"{proc}/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if want in env and _ids(name, proc) == ids:
            out[int(name)] = (ids[1], ids[0][0])
    return out


def daemon_pids(pipe: Path | str, proc: str = "/proc", uid: int | None = None) -> list[int]:
    """PIDs of processes bound to this pipe directory (control daemon and servers).

    With *uid*, only that user's processes (see :func:`daemon_procs`); the
    default takes the owner of the pipe directory (the job user) or, when
    the directory is gone, any non-root user.
    """
    if uid is None:
        try:
            uid = os.lstat(pipe).st_uid
        except OSError:
            uid = None
    return sorted(daemon_procs(pipe, uid, proc))


def _same(pid: int, start: int, uid: int) -> bool:
    """*pid* is still the process seen in the scan: same start time, same user, not a zombie."""
    ids = _ids(pid)
    if ids is None or ids[1] != start or set(ids[0]) != {uid}:
        return False
    return _alive(pid)


def _kill(pid: int, start: int, uid: int) -> None:
    """SIGKILL *pid* only if it is still the process seen in the scan (PID reuse)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:
        # No pidfds before Linux 5.3 (RHEL 8's 4.18): check, then kill by PID;
        # the window between the two is a few microseconds, not a quit wait.
        if _same(pid, start, uid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return
    try:
        # Checked after the pidfd pins the process: if the PID was recycled
        # before, the start time differs; if it dies after, the pidfd refers
        # to the dead process and the signal goes nowhere.
        if _same(pid, start, uid):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    from ..procfs import state
    s = state(pid)
    return s is not None and s != "Z"
