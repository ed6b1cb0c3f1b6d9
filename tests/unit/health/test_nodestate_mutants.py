"""Issue 24 §8: the drain/resume etiquette of ``health/nodestate.decide``, pinned as whole plans.

Mutation testing (mutmut, docs/development.md) found 73 of decide()'s
mutants surviving test_health_drain.py and test_health_slurm_versions.py:
among them a FAIL node with our reason, a user-problem drain replaced by a
node fault the other way round, and a drain owed on an unknown node
forgotten.  Each case here is one node state and the exact plan.
"""
from __future__ import annotations

from slurm_gpu.health.nodestate import Memory, NodeState, Plan, decide

OURS = "slurm-gpu: gpu.xid: Xid 79 on 0000:02:00.0: GPU has fallen off the bus"
USER = "slurm-gpu: user-problem: job 7 left a process on GPU 0"


def node(base: str = "IDLE", *flags: str, reason: str | None = None) -> NodeState:
    return NodeState("n1", base, frozenset(flags), reason)


def test_an_unknown_or_untouchable_node_keeps_what_is_owed():
    mem = Memory(pending_reason=OURS)
    assert decide(None, None, mem, 3) == Plan("none", "node unknown to Slurm: no action",
                                              memory=Memory(pending_reason=OURS))
    assert decide(None, OURS, Memory(), 3) == Plan("none", "node unknown to Slurm: no action",
                                                   memory=Memory(pending_reason=OURS))
    assert decide(None, OURS, Memory(), 3, owe=None) == Plan("none", "node unknown to Slurm: no action",
                                                             memory=Memory())
    assert decide(node("IDLE", "POWERING_UP", "DRAIN"), OURS, Memory(), 3) == Plan(
        "none", "node is IDLE+DRAIN+POWERING_UP: no action", memory=Memory(pending_reason=OURS))
    assert decide(node("DOWN", "NOT_RESPONDING"), OURS, Memory(), 3) == Plan(
        "none", "node is DOWN+NOT_RESPONDING: no action", memory=Memory(pending_reason=OURS))
    assert decide(node("IDLE", "MAINTENANCE", "RESERVED"), OURS, Memory(), 3) == Plan(
        "none", "node is in a maintenance reservation: no action", memory=Memory(pending_reason=OURS))
    # what was owed is drained once the node can be
    assert decide(node("IDLE"), None, Memory(pending_reason=OURS), 3) == Plan(
        "drain", "draining", reason=OURS, memory=Memory(drained_reason=OURS))


def test_someone_elses_fail_or_reason_is_left_alone():
    mem = Memory(drained_reason=OURS, clean_runs=2)
    for n, shown in ((node("IDLE", "FAIL"), "IDLE+FAIL"), (node("IDLE", "FAIL", reason=OURS), "IDLE+FAIL"),
                     (node("MIXED", "FAIL", reason="bad fan"), "MIXED+FAIL")):
        why = n.reason or "no reason"
        assert decide(n, OURS, mem, 3) == Plan(
            "none", f"node is {shown} for someone else's reason ({why}): left alone",
            memory=Memory(pending_reason=OURS))     # an event's drain stays owed until the FAIL is lifted
    # our reason on a node that is not drained (an admin resumed it half-way): start over, drain again
    assert decide(node("IDLE", reason=OURS), OURS, mem, 3) == Plan(
        "drain", "draining", reason=OURS, memory=Memory(drained_reason=OURS))


def test_a_reason_on_a_node_that_is_not_drained_holds_nothing():
    # Slurm 24.11.5 keeps Reason= after "scontrol update state=resume" of a
    # DRAINING node (seen in the VM tier; 22.05.8 and 26.05 clear it).  The
    # node runs jobs, so a GPU fault there must still drain it.
    stale = "bad fan"
    for n in (node("MIXED", reason=stale), node("IDLE", reason=stale), node("ALLOCATED", reason=stale)):
        assert decide(n, OURS, Memory(drained_reason=OURS, clean_runs=2), 3) == Plan(
            "drain", f"draining (replaces the reason of a node that was not drained: {stale})",
            reason=OURS, memory=Memory(drained_reason=OURS))
        # with nothing wrong, the stale text is not ours to touch
        assert decide(n, None, Memory(), 3) == Plan("none", "healthy", memory=Memory())


def test_a_failed_base_state_is_left_alone_like_the_fail_flag():
    # sinfo's words for the FAIL flag (FAIL, FAILING) as a base state: never drained over, never resumed
    for n in (node("FAIL", reason="psu"), node("FAILING", reason="psu")):
        assert decide(n, OURS, Memory(), 3).action == "none"
        assert n.failed


def test_a_drain_we_do_not_remember_is_never_ours_to_lift():
    assert decide(node("IDLE", "DRAIN", reason=OURS), None, Memory(), 1) == Plan(
        "none", "drained with a slurm-gpu: reason this node's state does not record: left for an admin",
        memory=Memory())
    assert decide(node("IDLE", "DRAIN"), None, Memory(drained_reason=OURS, clean_runs=4), 1) == Plan(
        "none", "drained by someone else (no reason): left alone", memory=Memory())
    assert decide(node("DRAINED", reason="disk"), OURS, Memory(drained_reason=OURS), 1) == Plan(
        "none", "drained by someone else (disk): left alone", memory=Memory(pending_reason=OURS))  # owed


def test_our_drain_counts_clean_runs_then_resumes():
    drained = node("IDLE", "DRAIN", reason=OURS)
    mem = Memory(drained_reason=OURS)
    p1 = decide(drained, None, mem, 3)
    assert p1 == Plan("none", "clean run 1 of 3 before resume", memory=Memory(drained_reason=OURS, clean_runs=1))
    p2 = decide(drained, None, p1.memory, 3)
    assert p2 == Plan("none", "clean run 2 of 3 before resume", memory=Memory(drained_reason=OURS, clean_runs=2))
    assert decide(drained, None, p2.memory, 3) == Plan("resume", "3 clean runs in a row: resuming", memory=Memory())
    assert mem == Memory(drained_reason=OURS)                       # the caller's memory is not changed
    # a fault again: the count starts over
    assert decide(drained, OURS, p2.memory, 3) == Plan(
        "none", "already drained by slurm-gpu", memory=Memory(drained_reason=OURS))
    # a repair under way: neither counted nor reset
    assert decide(drained, None, p2.memory, 3, hold=True) == Plan(
        "none", "repair under way: stays drained", memory=Memory(drained_reason=OURS, clean_runs=2))
    assert decide(node("DRAINING", reason=OURS), None, Memory(drained_reason=OURS), 1) == Plan(
        "resume", "1 clean runs in a row: resuming", memory=Memory())


def test_a_node_fault_replaces_a_user_problem_drain_and_not_the_other_way():
    user = node("IDLE", "DRAIN", reason=USER)
    assert decide(user, OURS, Memory(drained_reason=USER), 3) == Plan(
        "drain", "a node fault replaces the user-problem drain", reason=OURS, memory=Memory(drained_reason=OURS))
    other = USER.replace("job 7", "job 8")
    assert decide(user, other, Memory(drained_reason=USER), 3) == Plan(
        "none", "already drained by slurm-gpu", memory=Memory(drained_reason=USER))
    fault = node("IDLE", "DRAIN", reason=OURS)
    assert decide(fault, USER, Memory(drained_reason=OURS), 3) == Plan(
        "none", "already drained by slurm-gpu", memory=Memory(drained_reason=OURS))


def test_healthy_and_other_memory_is_kept():
    mem = Memory(slurmd="s1", isolated=["0000:02:00.0"], boot_id="b")
    assert decide(node("IDLE"), None, mem, 3) == Plan("none", "healthy", memory=mem)
    assert decide(node("ALLOCATED", "RESERVED"), OURS, mem, 3) == Plan(
        "drain", "draining", reason=OURS, memory=Memory(OURS, 0, None, "s1", ["0000:02:00.0"], "b"))


def test_a_new_fault_is_drained_with_its_own_reason_over_an_owed_one():
    older = OURS.replace("Xid 79", "Xid 48")
    assert decide(node("IDLE"), OURS, Memory(pending_reason=older), 3) == Plan(
        "drain", "draining", reason=OURS, memory=Memory(drained_reason=OURS))


def test_leaving_a_node_alone_or_resuming_keeps_the_rest_of_the_memory():
    keep = dict(slurmd="s1", isolated=["0000:02:00.0"], boot_id="b")
    mem = Memory(drained_reason=OURS, clean_runs=2, **keep)
    assert decide(node("IDLE", "FAIL"), None, mem, 3).memory == Memory(**keep)
    assert decide(node("IDLE", "DRAIN", reason="disk"), None, mem, 3).memory == Memory(**keep)
    assert decide(node("IDLE", "DRAIN", reason=OURS), None, mem, 3) == Plan(
        "resume", "3 clean runs in a row: resuming", memory=Memory(**keep))
    assert Memory.from_json(mem.to_json()) == mem
    assert mem.to_json() == {"drained_reason": OURS, "clean_runs": 2, "pending_reason": None, "slurmd": "s1",
                             "isolated": ["0000:02:00.0"], "boot_id": "b"}
