"""The drain/resume etiquette's edges, asserted whole (issue 24 §8).

mutmut 3 over ``health/actions.py`` and ``health/nodestate.py``
(``parse_show_node``, ``Memory``) left these behaviours unpinned by
test_health_drain.py, test_health_slurm_versions.py and
test_nodestate_mutants.py: how ``scontrol show node -o`` is read, which
remembered state is refused, the exact ``scontrol`` argv and drain reason,
what a failed scontrol keeps, and the state file's repair.  Each test
states the behaviour through the public functions, with exact values.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from slurm_gpu import runner, slurmclient
from slurm_gpu.errors import CommandError
from slurm_gpu.health import actions
from slurm_gpu.health.actions import Outcome, act, load_state, save_state, show_node
from slurm_gpu.health.nodestate import (MAX_CLEAN_RUNS, MAX_REASON, Memory, NodeState, Plan,
                                        parse_show_node)

R = "slurm-gpu: gpu.xid: GPU 0000:17:00.0 Xid 79 (fallen off the bus)"


# ---------------------------------------------------------- parse_show_node

def test_parse_reads_name_base_flags_and_reason() -> None:
    n = parse_show_node("NodeName=n1 Arch=x86_64 State=IDLE+DRAIN* Reason=" + R + " [root@2026-01-01T00:00:00]\n")
    assert n == NodeState("n1", "IDLE", frozenset({"DRAIN"}), R)


@pytest.mark.parametrize("text", ["", "   \n", "Node n1 not found\n", "x NodeName=n1 State=IDLE"])
def test_parse_without_a_node_line_is_none(text: str) -> None:
    # The line must start with the field, as scontrol -o prints it.
    assert parse_show_node(text) is None


def test_parse_reads_only_the_first_line() -> None:
    text = "NodeName=n1 State=MIXED\nNodeName=n2 State=DOWN Reason=x [a@b]\n"
    assert parse_show_node(text) == NodeState("n1", "MIXED", frozenset(), None)


def test_parse_without_a_state_is_unknown_and_state_must_be_its_own_field() -> None:
    assert parse_show_node("NodeName=n1 CPUs=4") == NodeState("n1", "UNKNOWN", frozenset(), None)
    # NextState= (a reboot's) is not State=.
    assert parse_show_node("NodeName=n1 NextState=RESUME") == NodeState("n1", "UNKNOWN", frozenset(), None)
    assert parse_show_node("NodeName=n1 NextState=RESUME State=allocated+completing") == \
        NodeState("n1", "ALLOCATED", frozenset({"COMPLETING"}), None)


@pytest.mark.parametrize("suffix", list("*~#!%$@^-") + ["*~"])
def test_parse_strips_every_state_suffix(suffix: str) -> None:
    assert parse_show_node(f"NodeName=n1 State=IDLE+DRAIN{suffix}") == \
        NodeState("n1", "IDLE", frozenset({"DRAIN"}), None)


def test_parse_upper_cases_flags_and_keeps_several() -> None:
    n = parse_show_node("NodeName=n1 State=mixed+drain+maintenance+reserved")
    assert n == NodeState("n1", "MIXED", frozenset({"DRAIN", "MAINTENANCE", "RESERVED"}), None)


def test_parse_reason_cut_at_the_stamp_else_before_comment_or_extra() -> None:
    base = "NodeName=n1 State=IDLE+DRAIN Reason="
    assert parse_show_node(base + "a b [slurm@2026-01-01T00:00:00] Comment=c").reason == "a b"
    assert parse_show_node(base + "a b Comment=c d").reason == "a b"
    assert parse_show_node(base + "a b Extra=e").reason == "a b"
    # A bracket without "@" is part of the reason; so is "x=y" that is no such field.
    assert parse_show_node(base + "a [b] c=d").reason == "a [b] c=d"
    # Only a stamp that ends the reason or stands before a field counts.
    assert parse_show_node(base + "a [u@t]x [u@t]").reason == "a [u@t]x"
    assert parse_show_node(base + "   [root@t]").reason is None
    assert parse_show_node("NodeName=n1 State=IDLE XReason=foo").reason is None


# ------------------------------------------------------------------ Memory

def test_memory_round_trips_and_defaults() -> None:
    m = Memory(R, 3, "slurm-gpu: gpu.ecc: x", "slurmd-1", ["0000:17:00.0"], "boot")
    assert Memory.from_json(m.to_json()) == m
    assert m.to_json() == {"drained_reason": R, "clean_runs": 3, "pending_reason": "slurm-gpu: gpu.ecc: x",
                           "slurmd": "slurmd-1", "isolated": ["0000:17:00.0"], "boot_id": "boot"}
    assert Memory.from_json({}) == Memory()
    assert Memory.from_json({"clean_runs": None, "isolated": None}) == Memory()


def _refused(d: object) -> tuple[type, str]:
    with pytest.raises((TypeError, ValueError)) as e:
        Memory.from_json(d)  # type: ignore[arg-type]
    return type(e.value), str(e.value)


def test_memory_refusals_name_the_field() -> None:
    assert _refused([]) == (TypeError, "memory is not an object")
    assert _refused({"slurmd": 1}) == (TypeError, "slurmd is not a short printable string")
    assert _refused({"boot_id": "a\nb"}) == (TypeError, "boot_id is not a short printable string")
    assert _refused({"slurmd": "x" * 65}) == (TypeError, "slurmd is not a short printable string")
    assert _refused({"drained_reason": "admin: broken"}) == \
        (ValueError, "drained_reason is not a slurm-gpu: reason")
    assert _refused({"pending_reason": "other"}) == (ValueError, "pending_reason is not a slurm-gpu: reason")
    assert _refused({"drained_reason": "slurm-gpu: x\ny"}) == \
        (TypeError, "drained_reason is not a short printable string")
    for runs in (-1, MAX_CLEAN_RUNS + 1, True, 1.0, "1"):
        assert _refused({"clean_runs": runs}) == (ValueError, "clean_runs is not a small count")
    for iso in ("0000:17:00.0", [1], ["17:00.0"], ["0000:17:00.0 "]):
        assert _refused({"isolated": iso}) == (TypeError, "isolated is not a list of bus ids")


def test_memory_limits_are_inclusive() -> None:
    assert Memory.from_json({"slurmd": "x" * 64}).slurmd == "x" * 64
    long = "slurm-gpu: " + "x" * (MAX_REASON - len("slurm-gpu: "))
    assert Memory.from_json({"drained_reason": long}).drained_reason == long
    assert _refused({"drained_reason": long + "x"})[0] is TypeError
    assert Memory.from_json({"clean_runs": MAX_CLEAN_RUNS}).clean_runs == MAX_CLEAN_RUNS
    assert Memory.from_json({"clean_runs": 0}).clean_runs == 0
    assert Memory.from_json({"isolated": ["00000000:17:00.7"]}).isolated == ["00000000:17:00.7"]


def test_memory_from_json_copies_the_isolated_list() -> None:
    iso = ["0000:17:00.0"]
    m = Memory.from_json({"isolated": iso})
    iso.append("0000:18:00.0")
    assert m.isolated == ["0000:17:00.0"]


# ------------------------------------------------------- scontrol, faked

class Scontrol:
    """``runner.run`` for scontrol: *show* is its answer, every call recorded."""

    def __init__(self, show: runner.Completed | Exception, update: Exception | None = None) -> None:
        self.show, self.update, self.calls = show, update, []

    def run(self, argv, timeout, check=True, **kw):
        self.calls.append((list(argv), timeout, check))
        if argv[1] == "show":
            if isinstance(self.show, Exception):
                raise self.show
            return self.show
        if self.update is not None:
            raise self.update
        return runner.Completed(tuple(argv), 0, "", "")


def done(rc: int, out: str = "", err: str = "") -> runner.Completed:
    return runner.Completed(("scontrol",), rc, out, err)


@pytest.fixture
def sc(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(slurmclient, "command", lambda name, configured=None: configured or f"/slurm/bin/{name}")

    def install(show, update=None) -> Scontrol:
        s = Scontrol(show, update)
        monkeypatch.setattr(runner, "run", s.run)
        return s
    return install


def test_scontrol_path_is_the_first_executable_on_the_safe_path(tmp_path: Path, monkeypatch) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
    (a / "scontrol").write_text("")                    # not executable: skipped
    (b / "scontrol").write_text("#!/bin/sh\n")
    os.chmod(b / "scontrol", 0o755)
    dirs = slurmclient.SEARCH_DIRS
    monkeypatch.setattr(slurmclient, "SEARCH_DIRS", (str(a), str(b)))
    assert actions.scontrol_path() == f"{b}/scontrol"
    monkeypatch.setattr(slurmclient, "SEARCH_DIRS", dirs)
    monkeypatch.setattr(os, "access", lambda p, m: False)
    assert actions.scontrol_path() == "scontrol"
    # A site's own Slurm build in /usr/local is found after the safe path.
    for where in ("/usr/local/bin/scontrol", "/usr/local/sbin/scontrol"):
        monkeypatch.setattr(os, "access", lambda p, m, where=where: p == where and m == os.X_OK)
        assert actions.scontrol_path() == where


def test_show_node_argv_and_answers(sc) -> None:
    s = sc(done(0, "NodeName=n1 State=IDLE\n"))
    assert show_node("n1", 7.5) == NodeState("n1", "IDLE", frozenset(), None)
    assert s.calls == [(["/slurm/bin/scontrol", "show", "node", "-o", "n1"], 7.5, False)]
    sc(done(1, "", "Node n9 not found"))
    assert show_node("n9", 1) is None
    sc(done(1, "Node n9 not found", ""))
    assert show_node("n9", 1) is None


@pytest.mark.parametrize("res, what", [
    (done(1, "out\n", " Unable to contact slurm controller\nmore\n"),
     "scontrol show node failed: Unable to contact slurm controller"),
    (done(1, "only stdout\nsecond", ""), "scontrol show node failed: only stdout"),
    (done(2, "", "  "), "scontrol show node failed: exit 2"),
])
def test_show_node_failure_is_one_line_naming_the_node(sc, res, what) -> None:
    sc(res)
    with pytest.raises(CommandError) as e:
        show_node("n1", 1)
    assert (e.value.what, e.value.where) == (what, "n1")


NODE_IDLE = done(0, "NodeName=n1 State=IDLE\n")
NODE_OURS = done(0, f"NodeName=n1 State=IDLE+DRAIN Reason={R} [root@t]\n")


def test_act_drains_with_the_exact_argv_and_reason(sc) -> None:
    s = sc(NODE_IDLE)
    out = act("n1", R, Memory(), clean_runs_to_resume=2, timeout=4.0)
    assert s.calls[1] == (["/slurm/bin/scontrol", "update", "nodename=n1", "state=drain", f"reason={R}"], 4.0, True)
    assert out == Outcome(Plan("drain", "draining", reason=R, memory=Memory(drained_reason=R)),
                          NodeState("n1", "IDLE", frozenset(), None))


def test_act_resumes_with_the_exact_argv(sc) -> None:
    s = sc(NODE_OURS)
    out = act("n1", None, Memory(R, 1), clean_runs_to_resume=2, timeout=4.0)
    assert s.calls[1] == (["/slurm/bin/scontrol", "update", "nodename=n1", "state=resume"], 4.0, True)
    assert out.plan.action == "resume" and out.error is None
    assert out.plan.memory == Memory()


def test_act_dry_run_calls_only_show_and_keeps_memory(sc) -> None:
    s = sc(NODE_IDLE)
    mem = Memory(None, 0, None, "slurmd-1")
    out = act("n1", R, mem, clean_runs_to_resume=2, timeout=4.0, dry_run=True)
    assert [c[0][1] for c in s.calls] == ["show"]
    assert (out.plan.action, out.plan.reason, out.plan.memory) == ("drain", R, mem)
    # No action planned: no update, the plan's own memory.
    s = sc(NODE_IDLE)
    out = act("n1", None, Memory(), clean_runs_to_resume=2, timeout=4.0)
    assert [c[0][1] for c in s.calls] == ["show"]
    assert out == Outcome(Plan("none", "healthy", memory=Memory()), NodeState("n1", "IDLE", frozenset(), None))


def test_act_failed_show_keeps_memory_and_owes_the_drain(sc) -> None:
    sc(CommandError("timed out", "scontrol"))
    mem = Memory(None, 2, None, "slurmd-1", ["0000:17:00.0"], "boot")
    out = act("n1", R, mem, clean_runs_to_resume=2, timeout=1)
    assert out == Outcome(Plan("none", "could not read node state",
                               memory=Memory(None, 2, R, "slurmd-1", ["0000:17:00.0"], "boot")),
                          None, "timed out")
    ours = Memory(R, 1, None, "slurmd-1", [], "boot")
    out = act("n1", None, ours, clean_runs_to_resume=2, timeout=1)
    assert out.plan.memory == ours
    # owe= names what is owed; without a wanted drain the pending one stays owed.
    out = act("n1", R, mem, clean_runs_to_resume=2, timeout=1, owe=None)
    assert out.plan.memory.pending_reason is None
    pending = Memory(pending_reason="slurm-gpu: gpu.ecc: x")
    out = act("n1", None, pending, clean_runs_to_resume=2, timeout=1)
    assert out.plan.memory.pending_reason == "slurm-gpu: gpu.ecc: x"


def test_act_failed_update_keeps_memory_and_owes_the_drain(sc) -> None:
    sc(NODE_IDLE, CommandError("scontrol update failed", "n1"))
    mem = Memory(None, 0, None, "slurmd-1", [], "boot")
    out = act("n1", R, mem, clean_runs_to_resume=2, timeout=1)
    assert out == Outcome(Plan("none", "drain failed", memory=Memory(None, 0, R, "slurmd-1", [], "boot")),
                          NodeState("n1", "IDLE", frozenset(), None), "scontrol update failed")
    sc(NODE_OURS, CommandError("no", "n1"))
    out = act("n1", None, Memory(R, 1), clean_runs_to_resume=2, timeout=1)
    assert (out.plan.action, out.plan.note, out.plan.memory) == ("none", "resume failed", Memory(R, 1))


@pytest.mark.parametrize("want, mem, adopt", [
    (R, Memory(), None),
    (None, Memory(pending_reason=R), None),
    (None, Memory(), "slurm-gpu: user-problem: job 1"),
    (None, Memory(drained_reason=R), None),
])
def test_slurm_healthy_skips_scontrol_only_when_nothing_is_wanted_or_ours(sc, want, mem, adopt) -> None:
    s = sc(NODE_IDLE)
    act("n1", want, mem, clean_runs_to_resume=2, timeout=1, slurm_healthy="yes", adopt=adopt)
    assert s.calls and s.calls[0][0][1] == "show"


def test_slurm_healthy_yes_spares_the_rpc(sc) -> None:
    s = sc(NODE_IDLE)
    mem = Memory(slurmd="slurmd-1")
    out = act("n1", None, mem, clean_runs_to_resume=2, timeout=1, slurm_healthy="yes", owe=None)
    assert s.calls == []
    assert out == Outcome(Plan("none", "in service per SLURM_NODE_IS_HEALTHY; scontrol not called",
                               memory=mem), None)
    act("n1", None, mem, clean_runs_to_resume=2, timeout=1, slurm_healthy="no")
    assert len(s.calls) == 1


def test_act_passes_what_is_owed_and_the_repair_hold_to_decide(sc) -> None:
    sc(done(0, "NodeName=n1 State=IDLE+POWERING_UP\n"))
    out = act("n1", R, Memory(), clean_runs_to_resume=2, timeout=1)
    assert (out.plan.action, out.plan.memory.pending_reason) == ("none", R)
    out = act("n1", R, Memory(), clean_runs_to_resume=2, timeout=1, owe=None)
    assert out.plan.memory.pending_reason is None
    sc(NODE_OURS)
    out = act("n1", None, Memory(R, 0), clean_runs_to_resume=1, timeout=1, hold=True)
    assert (out.plan.action, out.plan.note, out.plan.memory) == \
        ("none", "repair under way: stays drained", Memory(R, 0))


UP = "slurm-gpu: user-problem: job 42 left processes on GPU 0"


def test_adopting_the_epilogs_drain_makes_it_ours_to_resume(sc) -> None:
    sc(done(0, f"NodeName=n1 State=IDLE+DRAIN Reason={UP} [root@t]\n"))
    out = act("n1", None, Memory(), clean_runs_to_resume=1, timeout=1, adopt=UP)
    assert (out.plan.action, out.plan.memory) == ("resume", Memory())
    # Adopted with a fresh count; the rest of the memory is kept.
    mem = Memory(None, 5, None, "slurmd-1", ["0000:17:00.0"], "boot")
    out = act("n1", None, mem, clean_runs_to_resume=2, timeout=1, adopt=UP)
    assert out.plan == Plan("none", "clean run 1 of 2 before resume",
                            memory=Memory(UP, 1, None, "slurmd-1", ["0000:17:00.0"], "boot"))
    # A node fault still owed replaces the adopted user-problem drain.
    out = act("n1", None, Memory(pending_reason=R), clean_runs_to_resume=2, timeout=1, adopt=UP)
    assert (out.plan.action, out.plan.reason) == ("drain", R)
    # Only that exact reason, only while drained.
    sc(done(0, f"NodeName=n1 State=IDLE+DRAIN Reason={UP}x [root@t]\n"))
    out = act("n1", None, Memory(), clean_runs_to_resume=1, timeout=1, adopt=UP)
    assert out.plan.action == "none" and out.plan.memory.drained_reason is None
    sc(done(0, f"NodeName=n1 State=IDLE Reason={UP} [root@t]\n"))
    out = act("n1", None, Memory(), clean_runs_to_resume=1, timeout=1, adopt=UP)
    assert out.plan.action == "none"
    # Already ours: the clean-run count is kept, not restarted.
    sc(done(0, f"NodeName=n1 State=IDLE+DRAIN Reason={UP} [root@t]\n"))
    out = act("n1", None, Memory(UP, 1), clean_runs_to_resume=3, timeout=1, adopt=UP)
    assert out.plan.memory.clean_runs == 2


# ------------------------------------------------------------- state file

def test_state_missing_is_empty_and_a_good_one_is_read_whole(tmp_path: Path) -> None:
    notes: list[str] = []
    assert load_state(tmp_path / "none.json", notes) == {}
    doc = {"memory": Memory(R, 1).to_json(), "x": 1,
           "cursor": {"kmsg": {"seq": -1, "boot_id": "b" * 64},
                      "files": {"/var/log/kern.log": {"inode": 5, "offset": 0, "mark": "0a" * 8}},
                      "events": {"inode": 0, "offset": 7}}}
    save_state(tmp_path / "sub" / "s.json", doc)
    assert load_state(tmp_path / "sub" / "s.json", notes) == doc
    assert notes == []


def test_save_state_is_roots_sorted_indented_json(tmp_path: Path) -> None:
    p = tmp_path / "a" / "b" / "state.json"
    save_state(p, {"b": 1, "a": [2]})
    assert p.read_text() == '{\n "a": [\n  2\n ],\n "b": 1\n}\n'
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert stat.S_IMODE(p.parent.stat().st_mode) == 0o755 & ~_umask()


def test_save_state_makes_its_directory_0755_and_none_beside_a_bare_name(tmp_path: Path,
                                                                         monkeypatch) -> None:
    old = os.umask(0)
    try:
        save_state(tmp_path / "d" / "s.json", {})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755
    monkeypatch.chdir(tmp_path / "d")
    save_state("t.json", {"a": 1})
    assert sorted(os.listdir(".")) == ["s.json", "t.json"]
    assert load_state("t.json") == {"a": 1, "cursor": {}}


def _umask() -> int:
    u = os.umask(0)
    os.umask(u)
    return u


@pytest.mark.parametrize("raw, part", [
    (b"{", "the whole file (JSONDecodeError)"),
    (b"\xff", "the whole file (UnicodeDecodeError)"),
    (b"[1]", "the whole file (not an object)"),
    (b"", "the whole file (not an object)"),
    (b"[" * 100000, "the whole file (RecursionError)"),
])
def test_a_corrupt_file_is_dropped_with_one_note(tmp_path: Path, raw: bytes, part: str) -> None:
    p = tmp_path / "s.json"
    p.write_bytes(raw)
    notes: list[str] = []
    assert load_state(p, notes) == {"cursor": {}}
    assert notes == [f"dropped corrupt parts of the health state {p}: {part}"]
    assert load_state(p) == {"cursor": {}}     # no notes list: still no crash


def test_an_oversized_file_is_dropped(tmp_path: Path) -> None:
    p = tmp_path / "s.json"
    p.write_bytes(b" " * actions.MAX_STATE_BYTES + b"{}")
    notes: list[str] = []
    assert load_state(p, notes) == {"cursor": {}}
    assert notes == [f"dropped corrupt parts of the health state {p}: the whole file (ValueError)"]
    notes.clear()
    p.write_bytes(b" " * (actions.MAX_STATE_BYTES - 2) + b"{}")
    assert load_state(p, notes) == {"cursor": {}}
    assert notes == []
    # The limit counts bytes, not characters.
    p.write_bytes(b'{"x": "' + "\u00e9".encode() * (actions.MAX_STATE_BYTES // 2) + b'"}')
    assert load_state(p, notes) == {"cursor": {}}
    assert notes == [f"dropped corrupt parts of the health state {p}: the whole file (ValueError)"]


def test_a_directory_or_fifo_is_moved_aside(tmp_path: Path) -> None:
    for make in (os.mkdir, os.mkfifo):
        p = tmp_path / f"s-{make.__name__}.json"
        make(p)
        notes: list[str] = []
        assert load_state(p, notes) == {"cursor": {}}
        assert notes == [f"dropped corrupt parts of the health state {p}: "
                         f"the whole file (not a regular file; moved to {p}.corrupt)"]
        assert not p.exists() and Path(f"{p}.corrupt").exists()


def test_a_directory_that_cannot_be_moved_is_named(tmp_path: Path, monkeypatch) -> None:
    p = tmp_path / "s.json"
    p.mkdir()

    def refuse(a, b):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "replace", refuse)
    notes: list[str] = []
    load_state(p, notes)
    assert notes == [f"dropped corrupt parts of the health state {p}: "
                     "the whole file (not a regular file; cannot move it: Operation not permitted)"]


def test_bad_memory_is_dropped_and_the_rest_kept(tmp_path: Path) -> None:
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"memory": {"clean_runs": -1}, "y": 2}))
    notes: list[str] = []
    assert load_state(p, notes) == {"memory": {}, "cursor": {}, "y": 2}
    assert notes == [f"dropped corrupt parts of the health state {p}: memory (clean_runs is not a small count)"]
    p.write_text(json.dumps({"memory": None}))
    assert load_state(p, notes[:0]) == {"memory": None, "cursor": {}}


@pytest.mark.parametrize("cursor, kept, part", [
    ([], {}, "cursor"),
    ({"kmsg": {"seq": -2, "boot_id": "b"}}, {}, "kmsg cursor"),
    ({"kmsg": {"seq": 1 << 62, "boot_id": "b"}}, {}, "kmsg cursor"),
    ({"kmsg": {"seq": 0, "boot_id": "b" * 65}}, {}, "kmsg cursor"),
    ({"kmsg": {"seq": 0, "boot_id": 1}}, {}, "kmsg cursor"),
    ({"kmsg": {"seq": True, "boot_id": "b"}}, {}, "kmsg cursor"),
    ({"kmsg": [1]}, {}, "kmsg cursor"),
    ({"files": []}, {}, "kernel log cursor"),
    ({"files": {"a": {"inode": 1, "offset": 0}, "b": {"inode": -1, "offset": 0}}},
     {"files": {"a": {"inode": 1, "offset": 0}}}, "kernel log cursor"),
    ({"files": {"a": {"inode": 1 << 64, "offset": 0}}}, {"files": {}}, "kernel log cursor"),
    ({"files": {"a": {"inode": 1, "offset": 1 << 62}}}, {"files": {}}, "kernel log cursor"),
    ({"files": {"a": {"inode": 1, "offset": 0, "mark": "0A"}}}, {"files": {}}, "kernel log cursor"),
    ({"files": {"a": {"inode": 1, "offset": 0, "mark": 5}}}, {"files": {}}, "kernel log cursor"),
    ({"files": {"a": {"inode": 1, "offset": 0, "mark": "XX"}}}, {"files": {}}, "kernel log cursor"),
    ({"files": {"a": {"inode": 1, "offset": 0, "mark": "0" * (2 * actions.MARK_BYTES + 1)}}},
     {"files": {}}, "kernel log cursor"),
    ({"files": {"a": [1]}}, {"files": {}}, "kernel log cursor"),
    ({"events": {"inode": 1}}, {}, "event file cursor"),
])
def test_bad_cursor_entries_are_dropped_one_by_one(tmp_path: Path, cursor, kept, part) -> None:
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"cursor": cursor}))
    notes: list[str] = []
    assert load_state(p, notes)["cursor"] == kept
    assert notes == [f"dropped corrupt parts of the health state {p}: {part}"]


def test_cursor_bounds_that_are_kept(tmp_path: Path) -> None:
    edge = {"kmsg": {"seq": (1 << 62) - 1, "boot_id": ""},
            "files": {"a": {"inode": (1 << 64) - 1, "offset": (1 << 62) - 1,
                            "mark": "f" * (2 * actions.MARK_BYTES)}},
            "events": {"inode": 0, "offset": 0, "mark": ""}}
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"cursor": edge}))
    notes: list[str] = []
    assert load_state(p, notes)["cursor"] == edge
    assert notes == []


def test_several_dropped_parts_share_one_note(tmp_path: Path) -> None:
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"memory": {"slurmd": 5}, "cursor": {"kmsg": 1, "files": 1, "events": 1}}))
    notes: list[str] = []
    load_state(p, notes)
    assert notes == [f"dropped corrupt parts of the health state {p}: memory (slurmd is not a short "
                     "printable string); kmsg cursor; kernel log cursor; event file cursor"]
