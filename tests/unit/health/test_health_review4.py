"""Fourth review of the health check: a hostile user's angle on the drain path.

* a drain owed from events survives someone else's drain (Slurm's own
  "Kill task failed", an admin's FAIL) and is made once that is lifted;
* the user-problem drain leaves alone the states ``decide`` leaves alone;
* the run locks refuse a file a user planted or may write;
* a triggered run that finds slurmd's run holding the lock says so, and is
  asked again shortly.
"""
from __future__ import annotations


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


# ------------------------------------------- 2. the run locks refuse a planted file

def _plant(kind: str, path, tmp_path) -> None:
    import os
    if kind == "symlink":
        (tmp_path / "elsewhere").mkdir(exist_ok=True)
        os.symlink(tmp_path / "elsewhere" / "made-by-root", path)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path.write_text("")
        os.chmod(path, 0o600)
        if kind == "world-writable":
            os.chmod(path, 0o666)
        elif kind == "group-writable":
            os.chmod(path, 0o620)
        else:                                               # "a user's"
            if os.geteuid() != 0:
                pytest.skip("needs root to give the file away")
            os.chown(path, 65534, -1)


PLANTED = ["symlink", "fifo", "world-writable", "group-writable", "a user's"]


@pytest.mark.parametrize("kind", PLANTED)
def test_the_acting_run_refuses_a_planted_lock_file(kind, tmp_path, monkeypatch):
    from slurm_gpu.errors import InputError
    calls: list = []
    monkeypatch.setattr(runner, "run", lambda argv, *a, **k: calls.append(argv))
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    (tmp_path / "s").mkdir()
    _plant(kind, tmp_path / "s" / "health.n1.lock", tmp_path)
    o = engine.Options(node="n1", settings=HealthSettings(kernel_log=str(log)), state_dir=str(tmp_path / "s"),
                       only=["gpu.xid"])
    with pytest.raises(InputError, match=r"lock file .*refused"):
        engine.run(o)
    assert calls == [] and not (tmp_path / "elsewhere" / "made-by-root").exists()


@pytest.mark.parametrize("kind", ["symlink", "world-writable"])
def test_the_epilogs_lock_refuses_a_planted_lock_file(kind, tmp_path):
    from slurm_gpu.errors import InputError
    from slurm_gpu.health import userproblem as up
    _plant(kind, tmp_path / "health.n1.lock", tmp_path)
    with pytest.raises(InputError, match="lock file"):
        up.health_lock(str(tmp_path), "n1", wait=0)


def _cli(args, capsys):
    from slurm_gpu.cli import main
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.usefixtures("isolated_config")
@pytest.mark.parametrize("kind", ["symlink", "world-writable"])
def test_a_slurmd_run_refuses_a_planted_run_lock_in_one_line(kind, tmp_path, capsys, monkeypatch):
    from slurm_gpu.health.statefiles import slurmd_run_lock_file
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    ran: list = []
    monkeypatch.setattr(engine, "run", lambda opts: ran.append(opts))
    (tmp_path / "state").mkdir()
    lock = slurmd_run_lock_file(str(tmp_path / "state"), "n2")
    _plant(kind, __import__("pathlib").Path(lock), tmp_path)
    log = tmp_path / "k.log"
    log.write_text("")
    rc, out, err = _cli(["health", "--slurm", "--only", "gpu.xid", "--kernel-log", str(log)], capsys)
    assert (rc, out, ran) == (3, "", [])
    assert err.count("\n") == 1 and err.startswith("slurm-gpu: health check incomplete: lock file ")
    assert f"({lock})" in err and not (tmp_path / "elsewhere" / "made-by-root").exists()


def test_a_state_dir_others_may_change_is_a_warning(tmp_path, monkeypatch, capsys):
    import json
    import os
    from slurm_gpu import config
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)                       # not sticky: a user may rename state/ away
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(f'[node]\nstate_dir = "{tmp_path}/node"\n[health]\nstate_dir = "{shared}/state"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    config.clear_cache()
    log = tmp_path / "kern.log"
    log.write_text("")
    argv = ["health", "--no-drain", "--json", "--only", "gpu.xid", "--kernel-log", str(log), "--node", "n1"]
    try:
        rc, out, _ = _cli(argv, capsys)
        (f,) = [f for f in json.loads(out)["findings"] if f["check"] == "health.state_dir"]
        assert (rc, f["severity"]) == (1, "warn") and str(shared) in f["message"]
        os.chmod(shared, 0o1777)                  # sticky, like /tmp: trusted
        rc, out, _ = _cli(argv, capsys)
        assert rc == 0 and json.loads(out)["findings"] == [], out
    finally:
        config.clear_cache()


# ------------------------- 3. xid-watch's run, skipped while slurmd's holds the node

@pytest.mark.usefixtures("isolated_config")
def test_a_skip_is_0_for_slurmd_and_its_own_code_for_anyone_else(tmp_path, capsys, monkeypatch):
    import fcntl
    import os
    from slurm_gpu import procfs
    from slurm_gpu.health.findings import EXIT_SKIPPED
    from slurm_gpu.health.statefiles import slurmd_run_lock_file
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    (tmp_path / "state").mkdir()
    fd = os.open(slurmd_run_lock_file(str(tmp_path / "state"), "n2"), os.O_RDWR | os.O_CREAT, 0o600)
    log = tmp_path / "k.log"
    log.write_text("")
    argv = ["health", "--slurm", "--only", "gpu.xid", "--kernel-log", str(log)]
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert _cli(argv, capsys)[0] == EXIT_SKIPPED == 75          # xid-watch's run: try again
        monkeypatch.setattr(procfs, "parent_slurmd", lambda *a, **k: "4242:99")
        rc, out, _ = _cli(argv, capsys)
        assert rc == 0 and "skipped" in out                         # slurmd's: its contract
    finally:
        os.close(fd)


def test_xid_watch_asks_again_soon_after_a_skipped_run(monkeypatch):
    from slurm_gpu.health import watch
    seen: list = []

    def fake_run(argv, timeout, **kw):
        seen.append(1)
        return runner.Completed(argv=tuple(argv), returncode=75, stdout="slurm-gpu: health n1: skipped", stderr="")
    monkeypatch.setattr(runner, "run", fake_run)
    monkeypatch.setattr(watch.time, "sleep", lambda s: None)
    # drained by someone else (settled) says nothing of this event: the run checked nothing
    assert watch.health_trigger("n1", timeout=30, settled=lambda: True)("x") is False
    assert len(seen) == 1                  # no 0.5 s retries: slurmd's run lasts seconds; _Retry asks again


@pytest.mark.usefixtures("isolated_config")
def test_the_stale_job_sweep_runs_after_the_run_lock_is_released(tmp_path, capsys, monkeypatch):
    import fcntl
    import os
    from slurm_gpu.health.statefiles import slurmd_run_lock_file
    from slurm_gpu.jobs import state as jobstate
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    monkeypatch.setattr(runner, "run", lambda argv, *a, **k: runner.Completed(tuple(argv), 1, "", "no Slurm"))
    free: list[bool] = []

    def list_jobs(state_dir):      # the sweep's first look: which jobs have state here
        fd = os.open(slurmd_run_lock_file(str(tmp_path / "state"), "n2"), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free.append(True)
        except BlockingIOError:
            free.append(False)
        finally:
            os.close(fd)
        return []
    monkeypatch.setattr(jobstate, "list_jobs", list_jobs)
    log = tmp_path / "k.log"
    log.write_text("")
    _cli(["health", "--slurm", "--only", "gpu.xid", "--kernel-log", str(log)], capsys)
    assert free == [True]


def test_the_owed_drain_itself_standing_unrecorded_is_no_longer_owed():
    """scontrol timed out after slurmctld drained: the node stands drained with
    exactly the owed reason, which the state does not record.  That is the
    drain made; an admin who lifts it is not drained over again."""
    stamp = " [root@2026-11-29T03:00:00]"
    p = decide(parse_show_node(node("IDLE+DRAIN", f" Reason={R}{stamp}")), None, Memory(pending_reason=R), 3)
    assert p.action == "none" and p.memory.pending_reason is None
    assert decide(parse_show_node(node("IDLE")), None, p.memory, 3).action == "none"
