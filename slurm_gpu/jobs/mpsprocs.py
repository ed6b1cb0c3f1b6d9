"""The processes of a job's MPS daemon: found through ``/proc`` by the pipe
directory in their environment, checked and killed without PID-reuse races.

Split from ``mps.py`` (which re-exports these names: tests patch
``mps.daemon_pids``, and ``mps`` calls them through its own namespace).
"""
from __future__ import annotations

import os
import signal

from ..procfs import read_each


def _ids(pid: int | str, proc: str = "/proc") -> tuple[tuple[int, ...], int] | None:
    """(real, effective, saved, fs uid) and start time (clock ticks after boot) of *pid*.

    Both read from files that do not take the target's memory lock, so a
    process hung in the driver cannot hang this scan.  The start time tells
    a process from a later one that got its recycled PID.
    """
    from ..procfs import start_time, uids
    start = start_time(pid, proc)
    if start is None:
        return None
    ids = uids(pid, proc)
    return None if ids is None else (ids, start)


def _status(pid: int | str, proc: str = "/proc") -> tuple[tuple[int, ...], int] | None:
    """(real, effective, saved, fs uid) and parent PID of *pid*, from ``/proc/PID/status``.

    One read per process: the scan below reads only this file for every
    process on the node (~6 us each), and ``stat``/``environ`` only for the
    job user's.  Like :func:`_ids` (``status`` and ``stat``), it does not
    take the target's memory lock; ``environ`` does, so it is read through
    :func:`slurm_gpu.procfs.read_each`, which never waits long on one.
    """
    try:
        fd = os.open(f"{proc}/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 8192)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        i = raw.index(b"\nPPid:")
        ppid = int(raw[i + 6:raw.index(b"\n", i + 1)])
        i = raw.index(b"\nUid:")
        uids = tuple(int(u) for u in raw[i + 5:raw.index(b"\n", i + 1)].split()[:4])
    except ValueError:
        return None
    return (uids, ppid) if len(uids) == 4 else None


def _table(proc: str = "/proc") -> dict[int, tuple[tuple[int, ...], int]]:
    """{pid: (uids, parent pid)} of every process, in one pass over ``/proc``."""
    out = {}
    for name in os.listdir(proc):
        if name.isdigit():
            st = _status(name, proc)
            if st is not None:
                out[int(name)] = st
    return out


def daemon_procs(pipe: str | os.PathLike[str], uid: int | None, proc: str = "/proc",
                 table: dict[int, tuple[tuple[int, ...], int]] | None = None
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
    seen: dict[int, tuple[tuple[int, ...], int]] = {}
    for pid, (uids, _ppid) in (_table(proc) if table is None else table).items():
        if len(set(uids)) != 1 or uids[0] == 0 or (uid is not None and uids[0] != uid):
            continue
        ids = _ids(pid, proc)               # the start time, read before the environment
        if ids is not None and ids[0] == uids:
            seen[pid] = ids
    # Every environment is the user's memory: read so that none can hold
    # the scan (procfs.read_each); one that does not answer is not theirs
    # to be found by (the daemon is found by its PID and its cgroup too).
    out: dict[int, tuple[int, int]] = {}
    for (pid, ids), raw in zip(seen.items(), read_each([f"{proc}/{pid}/environ" for pid in seen])):
        # Read again after the environment: the same process throughout
        # (a recycled PID has another start time).
        # A search, not a split: the environment may be megabytes of NULs.
        if raw is not None and (b"\0" + want + b"\0") in (b"\0" + raw + b"\0") \
                and _ids(pid, proc) == ids:
            out[pid] = (ids[1], ids[0][0])
    return out


def daemon_tree(pipe: str | os.PathLike[str], uid: int | None, proc: str = "/proc"
                ) -> dict[int, tuple[int, int]]:
    """:func:`daemon_procs` plus every process of *uid* below them in the process tree.

    The children that dropped ``CUDA_MPS_PIPE_DIRECTORY`` from their
    environment are found through their parents; never root's, never
    another user's.  One pass over ``/proc`` for both.
    """
    table = _table(proc)
    procs = daemon_procs(pipe, uid, proc, table)
    if not procs or uid in (None, 0):
        return procs
    children: dict[int, list[int]] = {}
    for pid, (_uids, ppid) in table.items():
        children.setdefault(ppid, []).append(pid)
    out = dict(procs)
    todo = [c for p in procs for c in children.get(p, ())]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        todo.extend(children.get(pid, ()))
        ids = _ids(pid, proc)
        if ids is not None and set(ids[0]) == {uid}:
            out[pid] = (ids[1], uid)
    return out


def wait_gone(procs: dict[int, tuple[int, int]], timeout: float) -> None:
    """Return once none of *procs* is the live process seen in the scan, or after *timeout* s.

    Each process is watched through a pidfd, which turns readable the moment
    it exits: no polling interval is added to the epilog.  Without pidfds
    (Linux < 5.3) it polls, every 1 ms at first.
    """
    import select
    import time
    deadline = time.monotonic() + timeout
    fds: dict[int, int] = {}
    try:
        for pid, (start, uid) in procs.items():
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            except OSError:
                break
            fds[fd] = pid
            if not _same(pid, start, uid):       # gone or recycled before the pidfd pinned it
                del fds[fd]
                os.close(fd)
        else:
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            while fds:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for fd, _ev in poller.poll(max(1, int(left * 1000))):
                    poller.unregister(fd)
                    del fds[fd]
                    os.close(fd)
            return
    finally:
        for fd in fds:
            os.close(fd)
    delay = 0.001
    while any(_same(p, *i) for p, i in procs.items()) and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def daemon_pids(pipe: str | os.PathLike[str], proc: str = "/proc", uid: int | None = None) -> list[int]:
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


def _alive(pid: int, proc: str = "/proc") -> bool:
    from ..procfs import alive
    return alive(pid, proc)


def _my_children(proc: str = "/proc") -> list[int]:
    """PIDs of this process's children: ``/proc/self/task/*/children`` (a few
    bytes per thread), or one pass over ``/proc`` where the kernel lacks it."""
    me = os.getpid()
    out: list[int] = []
    try:
        for tid in os.listdir(f"{proc}/{me}/task"):
            with open(f"{proc}/{me}/task/{tid}/children", "rb") as f:
                out += [int(p) for p in f.read().split()]
        return out
    except (OSError, ValueError):
        return [pid for pid, (_uids, ppid) in _table(proc).items() if ppid == me]


def children_of_ours(uid: int, proc: str = "/proc") -> dict[int, tuple[int, int]]:
    """{pid: (start time, uid)} of this process's live children running as *uid* (every uid).

    As a subreaper, the prolog gets the daemon that ``nvidia-cuda-mps-control
    -d`` leaves behind as its child: only processes descended from ours can
    become one, so no process of the user's can pass for it.
    """
    out: dict[int, tuple[int, int]] = {}
    for pid in _my_children(proc):
        ids = _ids(pid, proc)
        if ids is not None and set(ids[0]) == {uid} and _alive(pid, proc):
            out[pid] = (ids[1], uid)
    return out


def reap_ended_children(uid: int, skip: frozenset[int] = frozenset(),
                        proc: str = "/proc") -> list[tuple[int, bool]]:
    """Collect this process's ended children that ran as *uid* (every uid), but
    those in *skip*: (wait status, whether it led its own session) of each.

    Only zombies of that user are waited for, each by its PID, so a child that
    something else of ours still waits on is never taken from it.  State and
    session come from one read of ``stat``, before the wait (a zombie keeps it).
    """
    from ..procfs import stat
    out = []
    for pid in _my_children(proc):
        if pid in skip:
            continue
        ids = _status(pid, proc)
        st = stat(pid, proc)
        if ids is None or set(ids[0]) != {uid} or st is None or len(st[1]) < 4 or st[1][0] != "Z":
            continue
        leader = st[1][3] == str(pid)
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if got == pid:
            out.append((status, leader))
    return out
