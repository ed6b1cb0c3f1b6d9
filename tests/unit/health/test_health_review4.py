"""Fourth review of the health check: a hostile user's angle on the drain path.

* a drain owed from events survives someone else's drain (Slurm's own
  "Kill task failed", an admin's FAIL) and is made once that is lifted;
* the user-problem drain leaves alone the states ``decide`` leaves alone;
* the run locks refuse a file a user planted or may write;
* a triggered run that finds slurmd's run holding the lock says so, and is
  asked again shortly.
"""
from __future__ import annotations

import re

import pytest

from slurm_gpu import runner
from slurm_gpu.health import engine
from slurm_gpu.health.nodestate import Memory, decide, parse_show_node
from slurm_gpu.health.settings import HealthSettings

R = "slurm-gpu: gpu.xid: Xid 79 on 0000:02:00.0: GPU has fallen off the bus"
XID79 = "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n"
# 22.05's `scontrol show node -o` line, cut to the fields the check reads.
LINE = ("NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 Gres=gpu:h100:4 Version=22.05.8 "
        "State={state} ThreadsPerCore=1 Partitions=debug{reason}\n")
KILL_TASK = " Reason=Kill task failed [slurm@2026-11-29T03:00:00]"


def node(state: str, reason: str = "") -> str:
    return LINE.format(state=state, reason=reason)


# ------------------------------------------- 1. an owed drain outlives others' drains

@pytest.mark.parametrize("state,reason", [
    ("IDLE+DRAIN", KILL_TASK),                                          # slurmd's own drain
    ("MIXED+DRAIN", " Reason=disk ticket 42 [root@2026-11-29T03:00:00]"),  # an admin's
    ("IDLE+FAIL", " Reason=bad fan [root@2026-11-29T03:00:00]"),           # state=fail, no DRAIN
    ("IDLE+DRAIN", " Reason=slurm-gpu: gpu.ecc: not ours [root@2026-11-29T03:00:00]"),  # ours, unrecorded
])
def test_an_event_drain_owed_while_someone_else_holds_the_node_is_made_after(state, reason):
    p = decide(parse_show_node(node(state, reason)), R, Memory(), 3)
    assert p.action == "none" and p.memory.pending_reason == R
    # The run after the resume finds no new event (the cursors consumed it): still owed.
    p2 = decide(parse_show_node(node("IDLE")), None, p.memory, 3)
    assert p2.action == "drain" and p2.reason == R and p2.memory.pending_reason is None


def test_a_condition_is_not_owed_under_someone_elses_drain():
    p = decide(parse_show_node(node("IDLE+DRAIN", KILL_TASK)), R, Memory(), 3, owe=None)
    assert p.memory.pending_reason is None       # seen again by the next run if it persists


class _Slurm:
    """scontrol as slurmctld answers it: show node, drain, resume."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.updates: list[list[str]] = []

    def run(self, argv, timeout, **kw):
        argv = list(argv)
        if argv[1:3] == ["show", "node"]:
            return runner.Completed(tuple(argv), 0, self.text, "")
        assert argv[1] == "update", argv
        self.updates.append(argv)
        if "state=drain" in argv:
            reason = next(a for a in argv if a.startswith("reason="))[7:]
            self.text = node("IDLE+DRAIN", f" Reason={reason} [root@2026-11-29T03:01:00]")
        return runner.Completed(tuple(argv), 0, "", "")


def test_kill_task_failed_drain_then_resume_still_drains_for_the_xid(tmp_path, monkeypatch):
    """A user's unkillable process makes slurmd drain "Kill task failed"; the Xid
    79 read meanwhile must drain the node once the admin resumes it."""
    fake = _Slurm(node("IDLE+DRAIN", KILL_TASK))
    monkeypatch.setattr(runner, "run", fake.run)
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    o = engine.Options(node="n1", settings=HealthSettings(kernel_log=str(log)), state_dir=str(tmp_path / "s"),
                       only=["gpu.xid"])
    assert engine.run(o).action == "none" and fake.updates == []
    fake.text = node("IDLE")                      # scontrol update state=resume by the admin
    rep = engine.run(o)
    assert rep.action == "drain", rep.notes
    assert fake.updates and f"reason={R}" in fake.updates[0]


# ------------------------------- 4. the user-problem drain keeps decide's hands-off rule

# Slurm's flag names (node_state_flags[] in src/common/slurm_protocol_defs.c,
# the same in 22.05.8, 24.11.5 and 26.05.3).
HANDS_OFF = ["IDLE+MAINTENANCE+RESERVED", "MIXED+NOT_RESPONDING", "IDLE+REBOOT_REQUESTED",
             "IDLE+REBOOT_ISSUED", "IDLE+POWERING_DOWN", "IDLE+POWER_DOWN", "IDLE+POWERING_UP",
             "IDLE+POWERED_DOWN", "FUTURE"]


@pytest.mark.parametrize("state", HANDS_OFF)
def test_user_problem_drain_leaves_alone_what_decide_leaves_alone(state, monkeypatch):
    from slurm_gpu.health import userproblem as up
    fake = _Slurm(node(state))
    monkeypatch.setattr(runner, "run", fake.run)
    assert decide(parse_show_node(fake.text), R, Memory(), 3).action == "none"
    note = up.drain("n1", "slurm-gpu: user-problem: job 7 left process 99 on GPU 0000:02:00.0", 5)
    assert note.startswith("not drained: node ") and fake.updates == [], note


@pytest.mark.parametrize("state", ["IDLE", "MIXED+RESERVED", "ALLOCATED+PLANNED", "COMPLETING"])
def test_user_problem_drain_still_drains_a_node_in_service(state, monkeypatch):
    from slurm_gpu.health import userproblem as up
    fake = _Slurm(node(state))
    monkeypatch.setattr(runner, "run", fake.run)
    assert up.drain("n1", "slurm-gpu: user-problem: job 7 left x", 5) == "drained" and fake.updates
