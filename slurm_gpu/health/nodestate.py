"""Drain bookkeeping, decided without side effects.

:func:`parse_show_node` reads ``scontrol show node -o`` (Slurm 22.05 has no
``--json`` for scontrol); :func:`decide` turns the node's state, the wanted
drain reason and our remembered state into one action.  The rules (NHC's,
with its field bugs fixed):

* drain with ``slurm-gpu: <check>: <detail>``; a node already drained,
  failed (``FAIL``) or down for another reason is left alone (its reason is
  never overwritten), and a drain found from events meanwhile stays owed
  until that is lifted; a reason on a node that is none of those holds no
  job off it (stale text, or a note), so a drain replaces it;
* resume only a node whose reason is exactly the one we set (remembered in
  the state file), and only after N clean runs in a row; an admin who
  changes our reason takes the drain over, even to text that starts like
  ours, and a lost state file never leads to a blind resume;
* no action while the node boots, powers up/down or awaits a reboot, or
  sits in a maintenance reservation (admins are working on it); reserved
  and planned nodes are drained like any other (jobs must avoid them).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

PREFIX = "slurm-gpu:"
USER_PROBLEM = "slurm-gpu: user-problem:"     # health/userproblem.py
_REASON_STAMP = re.compile(r"\s\[[^\]\[\s]*@[^\]\[\s]*\](?=\s|$)")
_AFTER_REASON = re.compile(r"\s(?:Comment|Extra)=")
_BOOTING = {"POWERING_UP", "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "POWER_UP", "REBOOT_ISSUED",
            "REBOOT_REQUESTED", "REBOOT"}
_NO_TOUCH_BASE = {"DOWN", "FUTURE", "UNKNOWN"}
_BUSY_BASES = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
_BUS_ID = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
MAX_REASON = 1024        # drain_reason() writes at most 200 characters
MAX_CLEAN_RUNS = 10_000


@dataclass(frozen=True)
class NodeState:
    """A node as ``scontrol show node`` shows it: base state, flags and reason."""

    name: str
    base: str                        # IDLE, MIXED, ALLOCATED, DOWN, ...
    flags: frozenset[str]            # DRAIN, RESERVED, MAINTENANCE, PLANNED, NOT_RESPONDING, ...
    reason: str | None = None        # without the trailing "[user@time]"

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.base in ("DRAINED", "DRAINING")

    @property
    def failed(self) -> bool:
        """An admin's ``state=fail``: the FAIL flag (``IDLE+FAIL``), or sinfo's words for it as the base."""
        return "FAIL" in self.flags or self.base in ("FAIL", "FAILING")

    @property
    def down(self) -> bool:
        return self.base in _NO_TOUCH_BASE

    @property
    def runs_jobs(self) -> bool:
        """Jobs run (or finish) here: ALLOCATED, MIXED or COMPLETING, as a base
        state or a flag (a drained node still running jobs is one of those)."""
        return self.base in _BUSY_BASES or "COMPLETING" in self.flags

    @property
    def ours(self) -> bool:
        return bool(self.reason) and self.reason.startswith(PREFIX)  # type: ignore[union-attr]


def parse_show_node(text: str) -> NodeState | None:
    """One node from ``scontrol show node -o NAME`` (None when not found)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    m = re.match(r"NodeName=(\S+)", line)
    if not m:
        return None
    st = re.search(r"(?:^|\s)State=(\S+)", line)
    parts = (st.group(1) if st else "UNKNOWN").rstrip("*~#!%$@^-").split("+")
    reason = None
    r = re.search(r"(?:^|\s)Reason=(.*)$", line)
    if r:
        # 22.05 prints "Reason=<text> [user@time]" and then, when set, the
        # node's Comment= and Extra= on the same -o line: cut at the
        # "[user@time]" stamp, or failing that before those fields.
        rest = r.group(1)
        stamp = _REASON_STAMP.search(rest)
        if stamp:
            rest = rest[:stamp.start()]
        else:
            rest = _AFTER_REASON.split(rest, 1)[0]
        reason = rest.strip() or None
    return NodeState(m.group(1), parts[0].upper(), frozenset(p.upper() for p in parts[1:]), reason)


def hands_off(node: NodeState) -> str | None:
    """Why no slurm-gpu drain or resume may touch *node* now, or None.

    It boots, powers up or down, awaits a reboot (which cures what a drain
    would hold off), is down, not responding or a FUTURE node, or sits in a
    maintenance reservation (admins are working on it).  One rule for the
    health check's drains (:func:`decide`) and the epilog's user-problem
    drain (health/userproblem.py).
    """
    if node.flags & _BOOTING or node.base in _NO_TOUCH_BASE or "NOT_RESPONDING" in node.flags:
        return f"node is {'+'.join([node.base, *sorted(node.flags)])}"
    if "MAINTENANCE" in node.flags:
        return "node is in a maintenance reservation"
    return None


@dataclass
class Memory:
    """What the health check remembers between runs (the state file)."""

    drained_reason: str | None = None   # the reason we set, while our drain stands
    clean_runs: int = 0
    pending_reason: str | None = None   # a drain we could not apply yet (first run, scontrol failure)
    slurmd: str | None = None           # the slurmd instance whose first run we have seen
    isolated: list[str] = field(default_factory=list)  # GPUs taken out of gres.conf (--isolate-bad-gpu)
    boot_id: str | None = None          # the boot this memory was written in (a pending drain dies with it)

    def to_json(self) -> dict:
        return {"drained_reason": self.drained_reason, "clean_runs": self.clean_runs,
                "pending_reason": self.pending_reason, "slurmd": self.slurmd, "isolated": list(self.isolated),
                "boot_id": self.boot_id}

    @classmethod
    def from_json(cls, d: dict) -> "Memory":
        """From the state file; ValueError/TypeError when a field has the wrong type or an absurd value.

        A reason we did not write (not ours, multi-line, overlong) would be
        sent to scontrol as a drain or compared as ours: it is refused too.
        """
        if not isinstance(d, dict):
            raise TypeError("memory is not an object")

        def text(k: str, limit: int = 64) -> str | None:
            v = d.get(k)
            if v is not None and (not isinstance(v, str) or len(v) > limit or not v.isprintable()):
                raise TypeError(f"{k} is not a short printable string")
            return v

        def reason(k: str) -> str | None:
            v = text(k, MAX_REASON)
            if v is not None and not v.startswith(PREFIX):
                raise ValueError(f"{k} is not a {PREFIX} reason")
            return v
        runs = d.get("clean_runs") or 0
        if not isinstance(runs, int) or isinstance(runs, bool) or not 0 <= runs <= MAX_CLEAN_RUNS:
            raise ValueError("clean_runs is not a small count")
        isolated = d.get("isolated") or []
        if not isinstance(isolated, list) or not all(isinstance(g, str) and _BUS_ID.fullmatch(g) for g in isolated):
            raise TypeError("isolated is not a list of bus ids")
        return cls(reason("drained_reason"), runs, reason("pending_reason"),
                   text("slurmd"), list(isolated), text("boot_id"))


@dataclass
class Plan:
    """What to do on Slurm this run (drain, resume or nothing), and the memory to save."""

    action: str                      # "drain" | "resume" | "none"
    note: str
    reason: str | None = None
    memory: Memory = field(default_factory=Memory)


SAME = object()   # decide(owe=SAME): what is owed is the whole wanted drain


def decide(node: NodeState | None, want: str | None, mem: Memory, clean_runs_to_resume: int,
           owe: object = SAME, hold: bool = False) -> Plan:
    """The one action to take now, and what to remember afterwards.

    *owe* is the part of *want* that must be remembered when nothing can be
    done now: the drain found from events (XIDs), which the cursors consume.
    A condition (a pending remap, a fabric not yet started at boot) is seen
    again by the next run if it persists, so it is not owed.

    *hold*: a repair of ours is under way (health/repair.py): our drain is
    kept, clean runs are not counted; it never drains a node by itself.
    """
    mem = replace(mem)
    owed: str | None = want if owe is SAME else owe  # type: ignore[assignment]
    if want is None and mem.pending_reason:
        want = owed = mem.pending_reason        # a drain found earlier that is still owed
    owed = owed or mem.pending_reason
    if node is None:
        mem.pending_reason = owed
        return Plan("none", "node unknown to Slurm: no action", memory=mem)
    why = hands_off(node)
    if why:
        mem.pending_reason = owed
        return Plan("none", f"{why}: no action", memory=mem)
    mem.pending_reason = None
    if not node.drained and node.failed:
        # "scontrol update state=fail reason=..." sets FAIL without DRAIN; our
        # drain would replace the admin's reason (and we would later resume it).
        # What the events found stays owed (see below).
        mem.drained_reason, mem.clean_runs, mem.pending_reason = None, 0, owed
        return Plan("none", f"node is {'+'.join([node.base, *sorted(node.flags)])} for someone else's "
                    f"reason ({node.reason or 'no reason'}): left alone", memory=mem)
    if node.drained:
        if not node.ours or node.reason != mem.drained_reason:
            # Someone else's drain (or they rewrote ours): theirs to lift, never
            # ours.  The prefix alone proves nothing: an admin may write a reason
            # that starts like ours, and after a lost or corrupt state file we no
            # longer know what we set, so only the exact reason we remember counts.
            note = (f"drained with a {PREFIX} reason this node's state does not record: left for an admin"
                    if node.ours else f"drained by someone else ({node.reason or 'no reason'}): left alone")
            # A fault the events found meanwhile stays owed (the cursors have
            # consumed it): once their drain is lifted ("Kill task failed",
            # which a user's unkillable process provokes, is resumed by an
            # admin who knows nothing of the Xid), ours is made.  It dies
            # with the boot, like any owed drain.  A drain with exactly the owed
            # reason is that drain made (a scontrol that timed out after
            # slurmctld applied it): nothing is owed, whoever lifts it.
            mem.drained_reason, mem.clean_runs = None, 0
            mem.pending_reason = owed if owed != node.reason else None
            return Plan("none", note, memory=mem)
        mem.drained_reason = node.reason
        if want is not None:
            mem.clean_runs = 0
            if node.reason.startswith(USER_PROBLEM) and not want.startswith(USER_PROBLEM):  # type: ignore[union-attr]
                # A node fault outranks a job's leftovers: its reason, and its way back.
                mem.drained_reason = want
                return Plan("drain", "a node fault replaces the user-problem drain", reason=want, memory=mem)
            return Plan("none", "already drained by slurm-gpu", memory=mem)
        if hold:
            # Not counted, not reset: a resume gate that fails is asked again next run.
            return Plan("none", "repair under way: stays drained", memory=mem)
        mem.clean_runs += 1
        if mem.clean_runs >= clean_runs_to_resume:
            mem.drained_reason, mem.clean_runs = None, 0
            return Plan("resume", f"{clean_runs_to_resume} clean runs in a row: resuming", memory=mem)
        return Plan("none", f"clean run {mem.clean_runs} of {clean_runs_to_resume} before resume", memory=mem)
    # Not drained: an admin may have resumed our drain; start over either way.
    mem.drained_reason, mem.clean_runs = None, 0
    if want is not None:
        mem.drained_reason = want
        if node.reason and not node.ours:
            # A reason on a node that is neither drained nor failed holds
            # nothing: Slurm schedules jobs there.  It is stale text (24.11.5
            # keeps Reason= after a resume from DRAINING; 22.05.8 and 26.05
            # clear it) or an admin's note; leaving the node alone for it
            # would keep a broken GPU taking jobs.  The drain replaces it,
            # and the note keeps what it said.
            return Plan("drain", f"draining (replaces the reason of a node that was not drained: "
                        f"{node.reason})", reason=want, memory=mem)
        return Plan("drain", "draining", reason=want, memory=mem)
    return Plan("none", "healthy", memory=mem)
