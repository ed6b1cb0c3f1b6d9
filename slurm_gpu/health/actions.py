"""Apply a drain/resume plan through ``scontrol``, and keep the state file.

Every command goes through :func:`slurm_gpu.runner.run` with a timeout, so a
slow slurmctld makes this run *unknown*, never a drain.  The state file is
written atomically (``slurm_gpu.fsutil.atomic_write``) after the action, so
a crash repeats at most one scontrol call and never forgets a drain.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass

from .. import slurmclient
from ..errors import CommandError
from ..fsutil import atomic_write
from ..hw.kmsg import MARK_BYTES
from .nodestate import SAME, Memory, NodeState, Plan, decide, parse_show_node


def scontrol_path() -> str:
    """scontrol by absolute path: Slurm runs us with no PATH."""
    return slurmclient.command("scontrol")


@dataclass
class Outcome:
    """What acting on Slurm did: the plan carried out, the node as scontrol showed it, and any failure."""

    plan: Plan
    node: NodeState | None
    error: str | None = None         # scontrol failed: the run's status becomes unknown


def show_node(name: str, timeout: float) -> NodeState | None:
    res = slurmclient.show_node(name, timeout)
    if res.returncode != 0:
        if "not found" in (res.stdout + res.stderr):
            return None
        first = (res.stderr.strip() or res.stdout.strip() or f"exit {res.returncode}").splitlines()[0]
        raise CommandError(f"scontrol show node failed: {first}", name)
    return parse_show_node(res.stdout)


def act(name: str, want: str | None, mem: Memory, *, clean_runs_to_resume: int, timeout: float,
        dry_run: bool = False, owe: object = SAME, hold: bool = False,
        adopt: str | None = None, slurm_healthy: str | None = None) -> Outcome:
    """Look at the node, decide, and (unless *dry_run*) drain or resume it.

    *owe*: the part of *want* to remember when scontrol fails (see :func:`decide`).
    *adopt*: a drain reason another part of slurm-gpu set (the epilog's
    user-problem drain): when the node stands drained with exactly it, it is
    ours to resume.
    """
    owed = (want if owe is SAME else owe) or mem.pending_reason
    if slurm_healthy == "yes" and not want and not owed and not adopt and mem.drained_reason is None:
        # slurmctld says the node is in service (SLURM_NODE_IS_HEALTHY=yes), we
        # found nothing and drained nothing: no scontrol call at all, which on
        # a big cluster is one RPC per node per interval spared to slurmctld.
        return Outcome(Plan("none", "in service per SLURM_NODE_IS_HEALTHY; scontrol not called",
                            memory=mem), None)
    try:
        node = show_node(name, timeout)
    except CommandError as e:
        keep = Memory(mem.drained_reason, mem.clean_runs, owed, mem.slurmd, mem.isolated,
                      mem.boot_id)
        return Outcome(Plan("none", "could not read node state", memory=keep), None, e.what)
    if adopt and node is not None and node.drained and node.reason == adopt and mem.drained_reason != adopt:
        mem = Memory(adopt, 0, mem.pending_reason, mem.slurmd, mem.isolated, mem.boot_id)
    plan = decide(node, want, mem, clean_runs_to_resume, owe, hold)
    if dry_run or plan.action == "none":
        if dry_run:
            plan.memory = mem  # a dry run changes nothing, remembered state included
        return Outcome(plan, node)
    try:
        if plan.action == "drain":
            slurmclient.drain(name, plan.reason, timeout)
        else:
            slurmclient.resume(name, timeout)
    except CommandError as e:
        keep = Memory(mem.drained_reason, mem.clean_runs, owed, mem.slurmd, mem.isolated,
                      mem.boot_id)
        return Outcome(Plan("none", f"{plan.action} failed", memory=keep), node, e.what)
    return Outcome(plan, node)


# ----------------------------------------------------------------- state

def load_state(path: str | os.PathLike[str], notes: list[str] | None = None) -> dict:
    """The state file, with any malformed part dropped (treated as lost, never fatal).

    A part of the wrong shape or with absurd values (a hand edit, a torn
    disk, an old version) would otherwise break every later run, or blind
    the XID check, before the state could be rewritten.  Losing the memory
    is safe: a drain we no longer remember is never resumed; a dropped
    cursor rereads its source.  What was dropped goes into *notes*, once
    (the next save rewrites the file).
    """
    dropped: list[str] = []
    try:
        d = _read_json_file(path)
    except FileNotFoundError:
        return {}
    except _NotAFile:
        # A directory or FIFO where the file belongs would fail every save
        # (exit 3 forever) or block every read: it is moved aside.
        aside = f"{os.fspath(path)}.corrupt"
        try:
            os.replace(path, aside)
            dropped.append(f"the whole file (not a regular file; moved to {aside})")
        except OSError as e:
            dropped.append(f"the whole file (not a regular file; cannot move it: {e.strerror})")
        d = {}
    except (OSError, ValueError, RecursionError) as e:
        dropped.append(f"the whole file ({type(e).__name__})")
        d = {}
    if not isinstance(d, dict):
        dropped.append("the whole file (not an object)")
        d = {}
    try:
        Memory.from_json(d.get("memory") or {})
    except (TypeError, ValueError, OverflowError) as e:
        dropped.append(f"memory ({e})")
        d["memory"] = {}
    d["cursor"] = _valid_cursor(d.get("cursor"), dropped)
    if dropped and notes is not None:
        notes.append(f"dropped corrupt parts of the health state {os.fspath(path)}: {'; '.join(dropped)}")
    return d


class _NotAFile(Exception):
    pass


def _read_json_file(path: str | os.PathLike[str]) -> object:
    """JSON of a regular file; O_NONBLOCK so a FIFO planted there cannot block the run."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _NotAFile()
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_STATE_BYTES + 1)
    if len(raw) > MAX_STATE_BYTES:
        raise ValueError("state file too big")
    return json.loads(raw or b"null")


MAX_STATE_BYTES = 4 << 20      # the state of one node is a few KB
_MAX_OFFSET = 1 << 62          # no log or event file is this big
_MAX_INODE = 1 << 64


def _int_in(doc: dict, name: str, lo: int, hi: int) -> bool:
    v = doc.get(name)
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi


def _file_cursor_ok(v: object) -> bool:
    if not isinstance(v, dict) or not (_int_in(v, "inode", 0, _MAX_INODE) and _int_in(v, "offset", 0, _MAX_OFFSET)):
        return False
    mark = v.get("mark", "")
    return isinstance(mark, str) and len(mark) <= 2 * MARK_BYTES and all(c in "0123456789abcdef" for c in mark)


def _valid_cursor(c: object, dropped: list[str] | None = None) -> dict:
    """Keep only the cursor entries of the right shape (a dropped one rereads its source)."""
    bad: list[str] = [] if dropped is None else dropped
    if c is None:
        return {}
    if not isinstance(c, dict):
        bad.append("cursor")
        return {}
    out: dict = {}
    k = c.get("kmsg")
    if k is not None:
        if (isinstance(k, dict) and _int_in(k, "seq", -1, _MAX_OFFSET) and isinstance(k.get("boot_id"), str)
                and len(k["boot_id"]) <= 64):
            out["kmsg"] = k
        else:
            bad.append("kmsg cursor")
    files = c.get("files")
    if isinstance(files, dict):
        good = {p: v for p, v in files.items() if isinstance(p, str) and _file_cursor_ok(v)}
        if len(good) != len(files):
            bad.append("kernel log cursor")
        out["files"] = good
    elif files is not None:
        bad.append("kernel log cursor")
    ev = c.get("events")
    if ev is not None:
        if _file_cursor_ok(ev):
            out["events"] = ev
        else:
            bad.append("event file cursor")
    return out


def save_state(path: str | os.PathLike[str], doc: dict) -> None:
    os.makedirs(os.path.dirname(os.fspath(path)) or ".", mode=0o755, exist_ok=True)
    atomic_write(path, json.dumps(doc, indent=1, sort_keys=True) + "\n", mode=0o600)
