"""A job's leftovers, kept apart from broken hardware.

The epilog looks at the GPUs the job held once its own cleanup is done: a
process of the job's user still has a context on one (it escaped the job's
process tracking), or GPU memory is still held while no process is left.
That is the user's problem, not the node's: the epilog drains with
``slurm-gpu: user-problem: ...`` and leaves a marker (the reason, the GPUs)
in the health check's state directory.  The health check then looks at
those GPUs on every run (one extra NVML read, only while a marker exists)
and resumes the node by itself on the first clean run; a node fault found
meanwhile replaces the reason and is resumed only by the usual clean runs.

A node someone else drained is never drained again, nor one the health
check leaves alone (rebooting, powering up or down, not responding, in a
maintenance reservation: :func:`nodestate.hands_off`), and a marker whose
reason no longer stands (an admin resumed or re-drained the node) is
dropped.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Callable

from ..fsutil import atomic_write
from ..hw.plain import Plain

PREFIX = "slurm-gpu: user-problem:"
MARKER = "user-problem.{}.json"
# Used GPU memory with no process left that counts as held by the job (MiB):
# an idle GPU reports a few MiB on current drivers (more on old ones).
HELD_MIB = 1024


def marker_path(state_dir: str, node: str) -> str:
    return os.path.join(state_dir, MARKER.format(re.sub(r"[^A-Za-z0-9._-]", "_", node) or "_"))


class Marker(Plain):
    # A Plain value, not a dataclass: the epilog imports no dataclasses.
    __slots__ = ("reason", "jobid", "uid", "gpus")
    reason: str
    jobid: str
    uid: int | None
    gpus: tuple[str, ...]            # bus ids

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "jobid": self.jobid, "uid": self.uid, "gpus": list(self.gpus)}


def load_marker(path: str) -> Marker | None:
    """The marker, or None when missing or malformed (a malformed one is not acted on)."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        if not (isinstance(d, dict) and isinstance(d.get("reason"), str) and d["reason"].startswith(PREFIX)
                and isinstance(d.get("gpus"), list) and all(isinstance(g, str) for g in d["gpus"])):
            return None
        uid = d.get("uid")
        return Marker(d["reason"], str(d.get("jobid", "")), uid if isinstance(uid, int) else None,
                      tuple(d["gpus"]))
    except (OSError, ValueError):
        return None


def save_marker(path: str, m: Marker) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    atomic_write(path, json.dumps(m.to_json(), sort_keys=True) + "\n", mode=0o600)


# How long the epilog waits for a running health check before it gives up the drain.
LOCK_WAIT = 10.0


def health_lock(state_dir: str, node: str, wait: float | None = None) -> int | None:
    """The health check's own lock (:func:`slurm_gpu.health.statefiles.lock_file`), held
    on the returned fd until it is closed; None when a health check keeps it for
    *wait* seconds (default :data:`LOCK_WAIT`).

    The epilog marks and drains under it: a health check deciding a fault
    drain meanwhile must not see its reason relabelled a user problem, which
    resumes after one clean run and skips the DCGM gate.  A lock file a
    user planted is InputError (:func:`slurm_gpu.health.statefiles.open_lock`).
    """
    import fcntl
    import time
    from .statefiles import lock_file, open_lock
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    fd = open_lock(lock_file(state_dir, node))
    end = time.monotonic() + (LOCK_WAIT if wait is None else wait)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= end:
                os.close(fd)
                return None
            time.sleep(0.05)


def drop_marker(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def process_uid(pid: int, proc: str = "/proc") -> int | None:
    """The real uid of *pid*, or None when /proc does not show it (another pid namespace)."""
    try:
        with open(f"{proc}/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def leftovers(gpus: list[Any], uid: int | None, *, held_mib: int = HELD_MIB,
              uid_of: Any = process_uid,
              elsewhere: Callable[[int], bool] | None = None) -> list[str]:
    """What is left on *gpus* (GpuHealth read with processes), one phrase per GPU.

    A process counts when it is the job user's, or its owner cannot be seen
    (it may be); root's and other users' processes are someone else's, and
    so is one that *elsewhere(pid)* says lies in another job's cgroup (the
    same user's other job, running on: by cgroup, where Slurm tracks jobs
    so).  Without any process, used memory above *held_mib* counts as held.
    """
    out = []
    for g in gpus:
        if g.lost or g.processes is None:
            continue
        mine = [p for p, _ in g.processes if (uid is None or uid_of(p) in (uid, None))
                and not (elsewhere is not None and elsewhere(p))]
        if mine:
            out.append(f"process{'es' if len(mine) > 1 else ''} {','.join(map(str, mine))} on GPU {g.bus_id}")
        elif not g.processes and g.memory_used is not None and g.memory_used > held_mib * 1024 * 1024:
            out.append(f"{g.memory_used // (1024 * 1024)} MiB held on GPU {g.bus_id} with no process left")
    return out


def in_other_job(jobid: str, sluid: str | None, proc: str = "/proc") -> Callable[[int], bool]:
    """``elsewhere`` for :func:`leftovers`: whether a pid's cgroup is a Slurm job
    directory that is not job *jobid*'s (``job_<id>``, or its SLUID on 26.05)."""
    from ..slurmcgroup import job_dir_of_pid
    own = {f"job_{jobid}"} | ({sluid} if sluid else set())

    def elsewhere(pid: int) -> bool:
        d = job_dir_of_pid(proc, pid)
        return d is not None and d not in own
    return elsewhere


def reason_for(jobid: str, found: list[str]) -> str:
    text = f"{PREFIX} job {jobid} left {'; '.join(found)}"
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:197] + "..."


def drain(node: str, reason: str, timeout: float) -> str:
    """Drain *node* for a user problem unless someone (we included) already has; returns a note."""
    from .. import slurmclient
    from ..errors import CommandError
    from .actions import show_node
    from .nodestate import hands_off
    try:
        ns = show_node(node, timeout)
    except CommandError as e:
        return f"not drained: {e.what}"
    if ns is None:
        return "not drained: node unknown to Slurm"
    # As nodestate.decide: a reason on a node that is neither drained, failed
    # nor down holds nothing (24.11.5 keeps it after a resume), so it is replaced.
    if ns.drained or ns.failed or ns.down:
        return f"not drained: node already {'drained' if ns.drained else 'flagged'} ({ns.reason or 'no reason'})"
    # And, as decide, nothing while it reboots, powers down or up, does not
    # respond, or sits in a maintenance reservation.
    why = hands_off(ns)
    if why:
        return f"not drained: {why}"
    try:
        slurmclient.drain(node, reason, timeout)
    except CommandError as e:
        return f"not drained: {e.what}"
    return "drained"
