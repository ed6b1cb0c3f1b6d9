"""Starting the sandbox's daemons and stopping exactly those.

Daemons are long-lived, so they cannot go through ``slurm_gpu.runner.run``
(which waits for its child); they are spawned here, each in its own session,
with stdout/stderr in a log file and a harmless working directory (prologs
inherit it).  A process is identified by its PID *and* its start time from
``/proc/PID/stat``, so a PID the kernel reused for someone else's process is
never signalled.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from slurm_gpu.errors import SlurmGpuError


@dataclass(frozen=True)
class Proc:
    """A process we started (or found) and may signal."""

    name: str          # "munged", "slurmctld", "slurmd:n1", ...
    pid: int
    start_time: int    # field 22 of /proc/PID/stat (clock ticks since boot)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> "Proc":
        return cls(str(d["name"]), int(d["pid"]), int(d["start_time"]))  # type: ignore[arg-type]


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of *pid*, or None when it is gone."""
    from slurm_gpu.procfs import stat
    st = stat(pid)
    if st is None:
        return None
    rest = st[1]
    return rest[0], int(rest[1]), int(rest[19])


def start_time(pid: int) -> int | None:
    st = _stat(pid)
    return st[2] if st else None


def alive(proc: Proc) -> bool:
    """True while *proc* runs: same PID and start time, and not a zombie."""
    st = _stat(proc.pid)
    return st is not None and st[2] == proc.start_time and st[0] not in ("Z", "X")


def spawn(name: str, argv: Sequence[str], *, log: Path, cwd: Path, env: dict[str, str],
          preexec: Callable[[], None] | None = None) -> tuple[Proc, subprocess.Popen[bytes]]:
    """Start a daemon in the foreground of its own session, output to *log*."""
    with open(log, "ab") as out:
        try:
            p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                 cwd=str(cwd), env=env, start_new_session=True, close_fds=True,
                                 preexec_fn=preexec)
        except OSError as e:
            raise SlurmGpuError(f"cannot start {name}: {e.strerror}", argv[0]) from None
    st = start_time(p.pid)
    if st is None:  # died at once; still record it so callers see the log
        st = -1
    return Proc(name, p.pid, st), p


def signal_proc(proc: Proc, sig: int) -> None:
    if alive(proc):
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass


def stop(procs: Iterable[Proc], *, grace: float = 5.0,
         reap: Callable[[], None] | None = None) -> list[Proc]:
    """TERM every process, wait up to *grace* seconds, then KILL the rest.

    Returns the processes that needed KILL.  *reap* is called while waiting
    so a parent that spawned them can collect its zombies.
    """
    procs = [p for p in procs if alive(p)]
    for p in procs:
        signal_proc(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = procs
    while left and time.monotonic() < deadline:
        if reap:
            reap()
        left = [p for p in left if alive(p)]
        if left:
            time.sleep(0.02)
    for p in left:
        signal_proc(p, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while any(alive(p) for p in left) and time.monotonic() < deadline:
        if reap:
            reap()
        time.sleep(0.02)
    return left


def all_pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def children_map() -> dict[int, list[int]]:
    """ppid -> child PIDs for every process on the host."""
    out: dict[int, list[int]] = {}
    for pid in all_pids():
        st = _stat(pid)
        if st:
            out.setdefault(st[1], []).append(pid)
    return out


def descendants(roots: Iterable[int], tree: dict[int, list[int]] | None = None) -> set[int]:
    tree = children_map() if tree is None else tree
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        for c in tree.get(todo.pop(), ()):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def as_procs(pids: Iterable[int], name: str) -> list[Proc]:
    out = []
    for pid in pids:
        st = _stat(pid)
        if st and st[0] not in ("Z", "X"):
            out.append(Proc(name, pid, st[2]))
    return out


_OURS = ("slurmstepd", "slurmd", "slurmctld", "munged")


def touching(root: Path) -> set[int]:
    """PIDs of Slurm/munge processes with a file open under *root*.

    slurmstepd outlives slurmd and is not its child; it keeps the node's log
    file and spool socket open, which is how a sandbox finds its own.
    """
    prefix = str(root).rstrip("/") + "/"
    found: set[int] = set()
    me = os.getpid()
    for pid in all_pids():
        if pid == me:
            continue
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        # Debian installs slurmd/slurmstepd as alternatives (slurmstepd-wlm).
        if not os.path.basename(exe).startswith(_OURS):
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                    found.add(pid)
                    break
            except OSError:
                continue
    return found


def in_netns(ns_inodes: set[int]) -> set[int]:
    """PIDs of processes living in one of these network namespaces."""
    found: set[int] = set()
    if not ns_inodes:
        return found
    for pid in all_pids():
        try:
            st = os.stat(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        if st.st_ino in ns_inodes:
            found.add(pid)
    return found
