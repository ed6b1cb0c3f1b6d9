"""Apply a drain/resume plan through ``scontrol``, and keep the state file.

Every command goes through :func:`slurm_gpu.runner.run` with a timeout, so a
slow slurmctld makes this run *unknown*, never a drain.  The state file is
written atomically (``slurm_gpu.fsutil.atomic_write``) after the action, so
a crash repeats at most one scontrol call and never forgets a drain.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .. import runner
from ..errors import CommandError
from ..fsutil import atomic_write
from .nodestate import SAME, Memory, NodeState, Plan, decide, parse_show_node

SCONTROL = "scontrol"


def scontrol_path() -> str:
    """scontrol by absolute path: Slurm runs us with no PATH."""
    for d in runner.SAFE_PATH.split(":") + ["/usr/local/bin", "/usr/local/sbin"]:
        p = os.path.join(d, SCONTROL)
        if os.access(p, os.X_OK):
            return p
    return SCONTROL


@dataclass
class Outcome:
    plan: Plan
    node: NodeState | None
    error: str | None = None         # scontrol failed: the run's status becomes unknown


def show_node(name: str, timeout: float) -> NodeState | None:
    res = runner.run([scontrol_path(), "show", "node", "-o", name], timeout, check=False)
    if res.returncode != 0:
        if "not found" in (res.stdout + res.stderr):
            return None
        first = (res.stderr.strip() or res.stdout.strip() or f"exit {res.returncode}").splitlines()[0]
        raise CommandError(f"scontrol show node failed: {first}", name)
    return parse_show_node(res.stdout)


def act(name: str, want: str | None, mem: Memory, *, clean_runs_to_resume: int, timeout: float,
        dry_run: bool = False, owe: object = SAME) -> Outcome:
    """Look at the node, decide, and (unless *dry_run*) drain or resume it.

    *owe*: the part of *want* to remember when scontrol fails (see :func:`decide`).
    """
    owed = (want if owe is SAME else owe) or mem.pending_reason
    try:
        node = show_node(name, timeout)
    except CommandError as e:
        keep = Memory(mem.drained_reason, mem.clean_runs, owed, mem.slurmd, mem.isolated,
                      mem.boot_id)
        return Outcome(Plan("none", "could not read node state", memory=keep), None, e.what)
    plan = decide(node, want, mem, clean_runs_to_resume, owe)
    if dry_run or plan.action == "none":
        if dry_run:
            plan.memory = mem  # a dry run changes nothing, remembered state included
        return Outcome(plan, node)
    if plan.action == "drain":
        argv = [scontrol_path(), "update", f"nodename={name}", "state=drain", f"reason={plan.reason}"]
    else:
        argv = [scontrol_path(), "update", f"nodename={name}", "state=resume"]
    try:
        runner.run(argv, timeout)
    except CommandError as e:
        keep = Memory(mem.drained_reason, mem.clean_runs, owed, mem.slurmd, mem.isolated,
                      mem.boot_id)
        return Outcome(Plan("none", f"{plan.action} failed", memory=keep), node, e.what)
    return Outcome(plan, node)


# ----------------------------------------------------------------- state

def load_state(path: str | os.PathLike[str]) -> dict:
    """The state file, with any malformed part dropped (treated as lost, never fatal).

    A part of the wrong shape (a hand edit, a torn disk) would otherwise break
    every later run before the state could be rewritten.  Losing the memory
    is safe: a drain we no longer remember is never resumed.
    """
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(d, dict):
        return {}
    try:
        Memory.from_json(d.get("memory") or {})
    except (TypeError, ValueError, AttributeError):
        d["memory"] = {}
    d["cursor"] = _valid_cursor(d.get("cursor"))
    return d


def _int_fields(doc: object, *names: str) -> bool:
    return isinstance(doc, dict) and all(isinstance(doc.get(n), int) and not isinstance(doc.get(n), bool)
                                         for n in names)


def _valid_cursor(c: object) -> dict:
    """Keep only the cursor entries of the right shape (a dropped one rereads its source)."""
    if not isinstance(c, dict):
        return {}
    out: dict = {}
    k = c.get("kmsg")
    if _int_fields(k, "seq") and isinstance(k.get("boot_id"), str):  # type: ignore[union-attr]
        out["kmsg"] = k
    files = c.get("files")
    if isinstance(files, dict):
        out["files"] = {p: v for p, v in files.items() if _int_fields(v, "inode", "offset")}
    if _int_fields(c.get("events"), "inode", "offset"):
        out["events"] = c["events"]
    return out


def save_state(path: str | os.PathLike[str], doc: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    atomic_write(path, json.dumps(doc, indent=1, sort_keys=True) + "\n", mode=0o600)
