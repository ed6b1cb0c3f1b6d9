"""The MPS daemon's cgroup: ``<job's cgroup>/slurm_gpu_mps``, so the job's limits hold it.

Slurm's task/cgroup and proctrack/cgroup give each job a cgroup with its
device, memory and CPU limits:

* cgroup v1 (Slurm 22.05, 24.11): ``<controller>/slurm[_<node>]/uid_<uid>/job_<id>``
  in every controller hierarchy Slurm uses (cpuset, memory, devices, freezer);
* cgroup v2 (22.05 to 26.05): ``<mount>/system.slice/<node>_slurmstepd.scope/job_<id>``,
  or ``.../<SLUID>`` in 26.05 unless ``CgroupJobIdPaths`` (``SLURM_JOB_SLUID``).

The daemon and everything it starts (the MPS server, its children, even
those that drop ``CUDA_MPS_PIPE_DIRECTORY``) live in a child cgroup of the
job made for them, ``slurm_gpu_mps``: limits set on the job apply to its
children, and the epilog ends exactly the processes in it.

When the job's cgroup exists: with ``PrologFlags=RunInJob`` (24.11+) the
prolog itself runs in the job, and the daemon joins before it execs
(:func:`slurm_gpu.runner.run` ``join_cgroups``).  Without it, Slurm creates
the job's cgroup only after the prolog (``_rpc_prolog`` runs the prolog,
then spawns the extern step), so the daemon joins a holding cgroup of the
job's (:func:`hold_dirs`), and the SPANK plugin moves every process in it
into the job's from the job's first step, as root, before any task starts
(:func:`slurm_gpu.jobs.mps.adopt`).  With no job cgroup at all
(proctrack/linuxproc) the daemon stays in the hold and the epilog ends all
of it (documented in docs/mps-mig.md).
"""
from __future__ import annotations

import os
import signal
import stat
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable

from ..procfs import parent

NAME = "slurm_gpu_mps"
# v1 hierarchies whose limits Slurm sets on a job (and freezer/pids, which it uses to track it).
_V1 = ("cpuset", "memory", "devices", "freezer", "pids", "cpu", "cpuacct")


def mounts(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[str, int, tuple[str, ...]]]:
    """(mount point, cgroup version, v1 controllers) of every cgroup mount."""
    out = []
    try:
        with open(mountinfo, "rb") as f:
            raw = f.read()
    except OSError:
        return []
    # Bytes, lines ended at "\n" and fields at " " only: a mount point a user
    # chose (FUSE) may hold any byte but the four the kernel escapes, and
    # splitlines()/split() would also break at \x0b, \x0c, \x1c-\x1e or \x85.
    for line in raw.decode(errors="surrogateescape").split("\n"):
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(" "), tail.split(" ")
        if len(fields) < 5 or len(rest) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        if rest[0] == "cgroup2":
            out.append((point, 2, ()))
        elif rest[0] == "cgroup":
            ctrls = tuple(o for o in rest[2].split(",") if o in _V1)
            if ctrls:
                out.append((point, 1, ctrls))
    return out


def _root_dir(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0


def job_dirs(jobid: str, uid: int | None, sluid: str | None = None, node: str | None = None,
             mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """The job's cgroup directory in each hierarchy where Slurm made one (empty: none).

    Slurm puts the node name in the path when several slurmd share a host
    (``slurm_<node>``, ``<node>_slurmstepd.scope``); with *node* those and the
    plain names are looked at, else any, and then only a single match counts:
    another slurmd's job with the same id must never be taken for this one.
    """
    out = []
    names = [f"job_{jobid}"] + ([sluid] if sluid and sluid.replace("-", "").isalnum() else [])
    safe = node if node and "/" not in node and "*" not in node and node not in (".", "..") else None
    for point, version, _ctrls in mounts(mountinfo):
        if version == 1:
            roots = [f"slurm_{safe}", "slurm"] if safe else ["slurm*"]
            users = [f"uid_{uid}"] if uid is not None else ["uid_*"]
            pats = [(r, u, n) for r in roots for u in users for n in names]
        else:
            scopes = [f"{safe}_slurmstepd.scope", "slurmstepd.scope"] if safe else ["*slurmstepd.scope"]
            pats = [("system.slice", sc, n) for sc in scopes for n in names] + \
                   [(sc.replace(".scope", ""), n) for sc in scopes for n in names]
        found = [p for pat in pats for p in _expand(point, pat) if _root_dir(p)]
        if safe and found:
            out.append(found[0])            # this node's own name first
        elif len(set(found)) == 1:
            out.append(found[0])
    return out


def _expand(point: str, parts: tuple[str, ...]) -> list[str]:
    """The existing paths ``point/parts...``, sorted; a ``*`` in a part matches
    any name that does not start with a dot, as glob's would.

    Not glob: only the ``*`` this module writes is a wildcard; glob would
    also read the mount point (taken from mountinfo) and a node name (``[``,
    ``?``) as patterns, and another node's job must never match.
    """
    paths = [point]
    for part in parts:
        nxt = []
        for d in paths:
            if "*" not in part:
                if os.path.lexists(os.path.join(d, part)):
                    nxt.append(os.path.join(d, part))
                continue
            head, _, tail = part.partition("*")
            try:
                names = os.listdir(d)
            except OSError:
                continue
            nxt += [os.path.join(d, n) for n in names if not n.startswith(".") and
                    len(n) >= len(head) + len(tail) and n.startswith(head) and n.endswith(tail)]
        paths = nxt
    return sorted(paths)


def version(d: str) -> int:
    """The cgroup version of the hierarchy that holds directory *d* (its parent's files tell)."""
    return 2 if os.path.exists(os.path.join(os.path.dirname(d), "cgroup.subtree_control")) else 1


def make(dirs: Iterable[str]) -> list[str]:
    """Create ``slurm_gpu_mps`` under each job directory; returns the new directories."""
    out = []
    for d in dirs:
        c = os.path.join(d, NAME)
        try:
            os.mkdir(c, 0o755)
        except FileExistsError:
            if not _root_dir(c):
                raise
        for key in ("cpuset.cpus", "cpuset.mems"):   # v1 cpuset: a new child starts empty
            src = os.path.join(d, key)
            if os.path.exists(src) and version(c) == 1:
                with open(src) as f:
                    value = f.read().strip()
                with open(os.path.join(c, key), "w") as f:
                    f.write(value)
        out.append(c)
    return out


def procs_files(dirs: Iterable[str]) -> list[str]:
    return [os.path.join(d, "cgroup.procs") for d in dirs]


def join(pid: int, dirs: Iterable[str]) -> None:
    """Move *pid* (the whole process) into each cgroup of *dirs*."""
    for p in procs_files(dirs):
        with open(p, "w") as f:
            f.write(str(pid))


def members(dirs: Iterable[str]) -> set[int]:
    """Every process in the cgroups of *dirs*."""
    out: set[int] = set()
    for p in procs_files(dirs):
        try:
            with open(p) as f:
                out.update(int(x) for x in f.read().split() if x.isdigit())
        except OSError:
            pass
    return out


def _start(pid: int) -> int | None:
    from ..procfs import start_time
    return start_time(pid)


def kill_all(dirs: list[str], wait: float) -> set[int]:
    """SIGKILL every process in *dirs* until none is left or *wait* s pass; returns survivors.

    Each pass signals what is in the cgroup now, so a process forked during
    a pass is in the cgroup and caught by the next one.  v2's ``cgroup.kill``
    does it in one atomic write where the kernel has it (5.14+).
    """
    for d in dirs:
        kill = os.path.join(d, "cgroup.kill")
        if os.path.exists(kill):
            try:
                with open(kill, "w") as f:
                    f.write("1")
            except OSError:
                pass
    deadline = time.monotonic() + wait
    while True:
        left = {p for p in members(dirs) if p != os.getpid()}
        if not left or time.monotonic() > deadline:
            return left
        for pid in left:
            kill_pid(pid)
        time.sleep(0.01)


def kill_pid(pid: int) -> None:
    """SIGKILL *pid*, read from a cgroup we own, unless its PID was recycled meanwhile."""
    start = _start(pid)
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        try:
            os.kill(pid, signal.SIGKILL)    # no pidfds (Linux < 5.3): it is in our cgroup
        except ProcessLookupError:
            pass
        return
    try:
        if _start(pid) == start:            # still the process read from cgroup.procs
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


def remove(dirs: Iterable[str]) -> None:
    """Remove our cgroups, then the job's own directory if Slurm could not (ours was in it)."""
    for c in dirs:
        try:
            os.rmdir(c)
        except FileNotFoundError:
            pass
        parent = os.path.dirname(c)
        if os.path.basename(c) == NAME:
            # Slurm's own cleanup failed while ours was inside: the job's
            # directory, and v1's uid_<uid> above it, when nothing else is left
            # (rmdir fails, harmlessly, while the job or another one runs).
            for d in (parent, os.path.dirname(parent)):
                if d == parent or os.path.basename(d).startswith("uid_"):
                    try:
                        os.rmdir(d)
                    except OSError:
                        break
        elif os.path.basename(os.path.dirname(parent)) == HOLD:
            remove_hold_parents(c)


def remove_hold_parents(hold: str) -> None:
    """Remove ``<HOLD>/<node>`` and ``<HOLD>`` above a removed *hold* when empty
    (a prolog making its own meanwhile retries: :func:`make_hold`)."""
    for d in (os.path.dirname(hold), os.path.dirname(os.path.dirname(hold))):
        try:
            os.rmdir(d)
        except OSError:
            break


# Where the daemon waits for the job's cgroup when the prolog runs before
# Slurm makes it (no PrologFlags=RunInJob): <mount>/slurm_gpu_mps_hold/<node>/job_<id>.
HOLD = "slurm_gpu_mps_hold"
# One v1 hierarchy is enough to track membership (devices is added for the
# job's GPU limit): freezer first, where Slurm's proctrack/cgroup makes the job's cgroup (so
# the first step's move empties the hold); never cpuset: a new cpuset cgroup
# has no CPUs, so nothing could join it.
_HOLD_V1 = ("freezer", "memory", "devices", "pids", "cpuacct", "cpu")


def hold_dirs(jobid: str, node: str, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """The job's holding cgroup: in one v1 hierarchy where v1 controllers are
    mounted (Slurm uses v1 there, a hybrid host's too), else in the v2 one;
    empty when no cgroup filesystem is mounted or *jobid* / *node* cannot be
    a path component.

    Every process the daemon forks stays in it, wherever it goes in the
    process tree (a double fork, a process the user made it start through
    ptrace): only root can move a process out, and the hold is root's.  So
    the first step moves all of it into the job's cgroup and the epilog ends
    all of it (:func:`slurm_gpu.jobs.mps.adopt`, :func:`kill_all`).  Named
    after the node as well as the job: several slurmd may share a host.
    """
    if not (jobid and jobid.isdigit() and _safe(node)):
        return []
    found = mounts(mountinfo)
    v1 = [(p, c) for w in _HOLD_V1 for p, v, c in found if v == 1 and w in c and "cpuset" not in c]
    points = [p for p, _c in v1[:1]]
    if v1 and "devices" not in v1[0][1]:
        # And in the devices hierarchy, for the job's GPU limit
        # (:func:`slurm_gpu.jobs.mps._limit_hold`); the first step's move takes
        # the daemon into the job's devices cgroup where Slurm made one.
        points += [p for p, c in v1 if "devices" in c][:1]
    points = points or [p for p, v, _c in found if v == 2][:1]
    return [os.path.join(p, HOLD, node, f"job_{jobid}") for p in points]


def _safe(node: str | None) -> bool:
    return node is not None and node != "" and "/" not in node and "*" not in node \
        and not node.startswith(".")


def make_hold(dirs: Iterable[str]) -> list[str]:
    """Create the holding cgroups *dirs* (root's, mode 0755); returns them."""
    out = []
    for d in dirs:
        for _ in range(5):
            try:
                os.makedirs(d, 0o755, exist_ok=True)
                break
            except FileNotFoundError:
                continue            # an epilog removed the empty parents between two mkdirs
        if not _root_dir(d):
            raise OSError(f"{d} is not root's directory")
        out.append(d)
    return out


def is_hold(path: str, jobid: str, points: Iterable[str]) -> bool:
    """*path* has the shape :func:`hold_dirs` gives job *jobid* under one of *points*
    (a recorded path is checked before the epilog ends what is in it)."""
    parts = path.split("/")
    return len(parts) > 3 and parts[-1] == f"job_{jobid}" and _safe(parts[-2]) and \
        parts[-3] == HOLD and "/".join(parts[:-3]) in {p.rstrip("/") for p in points} \
        and ".." not in parts


def ours(jobid: str, uid: int | None, sluid: str | None = None, node: str | None = None) -> list[str]:
    """Our cgroups under the job's, where they exist (the epilog, without a state file too)."""
    return [os.path.join(d, NAME) for d in job_dirs(jobid, uid, sluid, node)
            if os.path.isdir(os.path.join(d, NAME))]


def descendants(pids: Iterable[int], proc: str = "/proc") -> set[int]:
    """*pids* and every process below them in the process tree."""
    children: dict[int, list[int]] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        ppid = parent(name, proc)
        if ppid is None:
            continue
        children.setdefault(ppid, []).append(int(name))
    out: set[int] = set()
    todo = list(pids)
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.add(p)
        todo.extend(children.get(p, ()))
    return out
