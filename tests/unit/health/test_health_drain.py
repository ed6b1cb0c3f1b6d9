"""Drain bookkeeping against recorded `scontrol show node -o` output, through a fake runner.run."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slurm_gpu import runner
from slurm_gpu.errors import CommandError
from slurm_gpu.health import actions, engine
from slurm_gpu.health.nodestate import Memory, decide, parse_show_node
from slurm_gpu.health.settings import HealthSettings
from paths import ROOT

SC = ROOT / "tests" / "data" / "xid" / "scontrol"
XID79 = "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n"
XID13 = "[74889.644138] NVRM: Xid (PCI:0000:02:00): 13, pid=1, name=a.out, Graphics SM Warp Exception\n"


def capture(name: str, node: str = "n1", state: str | None = None) -> str:
    text = (SC / f"{name}.txt").read_text()
    text = re.sub(r"^NodeName=\S+", f"NodeName={node}", text)
    if state:
        text = re.sub(r"State=\S+", f"State={state}", text)
    return text


class FakeSlurm:
    """Serves recorded `scontrol show node -o` text and applies `scontrol update` like slurmctld."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.calls: list[list[str]] = []
        self.fail_update = False
        self.hang = False

    def run(self, argv, timeout, **kw):
        argv = list(argv)
        self.calls.append(argv)
        if self.hang:
            raise CommandError(f"scontrol timed out after {timeout:g} s")
        if argv[1:3] == ["show", "node"]:
            if self.text.startswith("Node ") and "not found" in self.text:
                return runner.Completed(tuple(argv), 1, "", self.text)
            return runner.Completed(tuple(argv), 0, self.text, "")
        if argv[1] == "update":
            if self.fail_update:
                raise CommandError("scontrol failed: Unable to contact slurm controller")
            st = re.search(r"State=(\S+)", self.text).group(1)
            base = st.split("+")[0]
            if "state=drain" in argv:
                reason = next(a for a in argv if a.startswith("reason="))[7:]
                self.text = re.sub(r"State=\S+", f"State={base}+DRAIN", self.text)
                self.text = re.sub(r" Reason=.*$", "", self.text.rstrip("\n"))
                self.text += f" Reason={reason} [root@2026-11-22T05:20:00]\n"
            elif "state=resume" in argv:
                if "DRAIN" not in st:
                    raise CommandError("scontrol failed: Invalid node state specified")
                self.text = re.sub(r"State=\S+", f"State={base}", self.text)
                self.text = re.sub(r" Reason=.*$", "", self.text.rstrip("\n")) + "\n"
            return runner.Completed(tuple(argv), 0, "", "")
        raise AssertionError(argv)

    @property
    def updates(self):
        return [c for c in self.calls if c[1] == "update"]


@pytest.fixture
def slurm(monkeypatch):
    fake = FakeSlurm(capture("idle"))
    monkeypatch.setattr(runner, "run", fake.run)
    return fake


def opts(tmp_path, log, **kw):
    s = HealthSettings(kernel_log=str(log), clean_runs_to_resume=kw.pop("resume", 2))
    return engine.Options(node="n1", settings=s, state_dir=str(tmp_path / "state"), only=["gpu.xid"], **kw)


# ------------------------------------------------------------------ parsing

def test_parse_recorded_states():
    ours = parse_show_node(capture("draining_ours"))
    assert ours.base == "MIXED" and ours.drained and ours.ours
    assert ours.reason == "slurm-gpu: gpu.remap: row remapping pending on 0000:19:00.0: reset the GPU"
    admin = parse_show_node(capture("admin_drained"))
    assert admin.drained and not admin.ours and admin.reason == "disk replacement ticket 42"
    assert admin.flags == {"DRAIN", "RESERVED"}
    maint = parse_show_node(capture("maint_reserved_drained_ours"))
    assert {"MAINTENANCE", "RESERVED", "DRAIN"} <= maint.flags
    idle = parse_show_node(capture("idle"))
    assert idle.base == "IDLE" and not idle.flags and idle.reason is None
    assert parse_show_node("") is None


def test_parse_reason_followed_by_comment_and_extra():
    # 22.05's node_info.c prints Comment= and Extra= after "Reason=... [user@time]"
    # on the same -o line (see the format strings in libslurmfull.so).
    text = capture("draining_ours").rstrip("\n") + " Comment=rack 3 row 7 Extra=owner=ops\n"
    node = parse_show_node(text)
    assert node.reason == "slurm-gpu: gpu.remap: row remapping pending on 0000:19:00.0: reset the GPU"
    admin = parse_show_node(capture("admin_drained").rstrip("\n") + " Comment=x\n")
    assert admin.reason == "disk replacement ticket 42"
    no_stamp = parse_show_node("NodeName=n1 State=IDLE+DRAIN Reason=bad fan Comment=c")
    assert no_stamp.reason == "bad fan"


# ------------------------------------------------------------------- decide

R = "slurm-gpu: gpu.xid: Xid 79 on 0000:02:00.0: GPU has fallen off the bus"


@pytest.mark.parametrize("state", ["IDLE+RESERVED", "MIXED+PLANNED", "ALLOCATED", "IDLE"])
def test_drains_idle_reserved_planned_and_busy_nodes(state):
    p = decide(parse_show_node(capture("idle", state=state)), R, Memory(), 3)
    assert p.action == "drain" and p.reason == R


@pytest.mark.parametrize("state", ["IDLE+POWERING_UP", "IDLE+REBOOT_REQUESTED", "DOWN", "IDLE+NOT_RESPONDING",
                                   "FUTURE", "IDLE+MAINTENANCE+RESERVED"])
def test_no_action_while_booting_down_or_in_maintenance(state):
    p = decide(parse_show_node(capture("idle", state=state)), R, Memory(), 3)
    assert p.action == "none" and p.memory.pending_reason == R   # owed for later


@pytest.mark.parametrize("state", ["IDLE+FAIL", "MIXED+FAIL"])
def test_failed_node_reason_is_never_overwritten(state):
    # `scontrol update state=fail reason=...` sets FAIL without DRAIN in 22.05.
    node = parse_show_node(capture("admin_drained", state=state))
    assert not node.drained and node.reason == "disk replacement ticket 42"
    p = decide(node, R, Memory(), 1)
    assert p.action == "none" and p.memory.drained_reason is None


def test_admin_drain_is_never_overwritten_or_resumed():
    node = parse_show_node(capture("admin_drained"))
    assert decide(node, R, Memory(), 1).action == "none"
    p = decide(node, None, Memory(drained_reason=R, clean_runs=5), 1)
    assert p.action == "none" and p.memory.drained_reason is None


def test_admin_reason_that_starts_like_ours_is_never_resumed():
    # The admin re-drains with text in our format (or our state file was lost):
    # only the exact reason this node's state remembers is ours to lift.
    node = parse_show_node(capture("draining_ours"))
    admin = "slurm-gpu: gpu.remap: keep drained until the RMA, ticket 77"
    node_admin = parse_show_node(capture("draining_ours").replace(node.reason, admin))
    mem = Memory(drained_reason=node.reason)
    for _ in range(5):
        p = decide(node_admin, None, mem, 1)
        assert p.action == "none" and p.memory.drained_reason is None
        mem = p.memory
    for _ in range(5):                                  # state file lost: nothing remembered
        p = decide(node, None, Memory(), 1)
        assert p.action == "none" and "state does not record" in p.note


def test_admin_redrain_with_our_prefix_after_our_drain_is_not_resumed(tmp_path, slurm):
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    assert engine.run(opts(tmp_path, log, resume=1)).action == "drain"
    slurm.text = slurm.text.replace(R, "slurm-gpu: manual hold by ops")
    for _ in range(3):
        assert engine.run(opts(tmp_path, log, resume=1)).action == "none"
    assert len(slurm.updates) == 1


def test_lost_state_file_never_resumes_blindly(tmp_path, slurm):
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    assert engine.run(opts(tmp_path, log, resume=1)).action == "drain"
    (Path(engine.state_file(tmp_path / "state", "n1"))).write_text("{corrupt")
    for _ in range(3):
        engine.run(opts(tmp_path, log, resume=1))
    assert [u[-1] for u in slurm.updates] == [f"reason={R}"]   # drained once, never resumed
    assert parse_show_node(slurm.text).drained


def test_resume_only_after_n_clean_runs_in_a_row():
    node = parse_show_node(capture("draining_ours"))
    mem = Memory(drained_reason=node.reason)
    for i in range(1, 3):
        p = decide(node, None, mem, 3)
        assert p.action == "none" and p.memory.clean_runs == i
        mem = p.memory
    p = decide(node, R, mem, 3)                       # a fault again: the count starts over
    assert p.action == "none" and p.memory.clean_runs == 0
    mem = p.memory
    for _ in range(2):
        mem = decide(node, None, mem, 3).memory
    assert decide(node, None, mem, 3).action == "resume"


# ------------------------------------------------------- engine + fake runner

def test_injected_79_drains_then_resumes_after_clean_runs(tmp_path, slurm):
    log = tmp_path / "kern.log"
    log.write_text(XID13)
    r = engine.run(opts(tmp_path, log))
    assert r.status == "ok" and slurm.updates == []
    with open(log, "a") as f:
        f.write(XID79)
    r = engine.run(opts(tmp_path, log))
    assert r.status == "drain" and r.action == "drain"
    assert slurm.updates[-1][:4] == [actions.scontrol_path(), "update", "nodename=n1", "state=drain"]
    assert slurm.updates[-1][4] == f"reason={R}"
    assert parse_show_node(slurm.text).ours
    # the event counted once: next runs are clean; resume after 2 of them
    r = engine.run(opts(tmp_path, log))
    assert r.status == "ok" and r.action == "none" and len(slurm.updates) == 1
    r = engine.run(opts(tmp_path, log))
    assert r.action == "resume" and slurm.updates[-1][-1] == "state=resume"
    assert not parse_show_node(slurm.text).drained


def test_admin_drained_node_stays_drained(tmp_path, slurm):
    slurm.text = capture("admin_drained")
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    for _ in range(4):
        engine.run(opts(tmp_path, log, resume=1))
    assert slurm.updates == []
    assert parse_show_node(slurm.text).reason == "disk replacement ticket 42"


def test_app_xids_never_drain(tmp_path, slurm):
    log = tmp_path / "kern.log"
    log.write_text(XID13 * 50)
    r = engine.run(opts(tmp_path, log))
    assert r.status == "ok" and slurm.updates == []


def test_first_run_of_slurmd_never_calls_scontrol_and_applies_later(tmp_path, slurm):
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    o = opts(tmp_path, log, slurm_mode=True, parent_slurmd="4242:1000")
    r = engine.run(o)
    assert slurm.calls == [] and r.action == "deferred"
    o = opts(tmp_path, log, slurm_mode=True, parent_slurmd="4242:1000")
    r = engine.run(o)                                  # registered now: the owed drain happens
    assert r.action == "drain" and slurm.updates[-1][4] == f"reason={R}"
    o = opts(tmp_path, log, slurm_mode=True, parent_slurmd="5555:2000")   # slurmd restarted
    engine.run(o)
    assert len(slurm.calls) == 2                      # only show+update from the second run


def test_scontrol_timeout_is_unknown_never_a_drain_and_keeps_the_event(tmp_path, slurm):
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    slurm.hang = True
    r = engine.run(opts(tmp_path, log))
    assert r.broken and "timed out" in r.broken
    slurm.hang = False
    r = engine.run(opts(tmp_path, log))                # the owed drain is applied on the next run
    assert r.action == "drain"


def test_failed_drain_is_retried(tmp_path, slurm):
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    slurm.fail_update = True
    r = engine.run(opts(tmp_path, log))
    assert r.broken and r.action == "none"
    slurm.fail_update = False
    assert engine.run(opts(tmp_path, log)).action == "drain"


def test_no_drain_reports_without_consuming_events(tmp_path, slurm):
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    r = engine.run(opts(tmp_path, log, no_drain=True))
    assert r.status == "drain" and slurm.calls == []
    r = engine.run(opts(tmp_path, log))
    assert r.action == "drain"


def test_state_file_is_json_and_private(tmp_path, slurm):
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    engine.run(opts(tmp_path, log))
    p = Path(engine.state_file(tmp_path / "state", "n1"))
    doc = json.loads(p.read_text())
    assert doc["memory"]["drained_reason"] == R
    assert doc["cursor"]["files"][str(log)]["offset"] == len(XID79)
    assert (p.stat().st_mode & 0o777) == 0o600


def test_watchdog_expiry_changes_nothing(tmp_path, slurm, monkeypatch):
    import time as _t
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    from slurm_gpu.health import xid

    def slow(events, *memo):
        _t.sleep(5)
        return []
    monkeypatch.setattr(xid, "check_xid", slow)
    o = opts(tmp_path, log)
    o.settings.watchdog_seconds = 0.3
    t = _t.monotonic()
    r = engine.run(o)
    assert _t.monotonic() - t < 2 and r.broken == "watchdog expired" and slurm.calls == []
    assert not (Path(engine.state_file(tmp_path / "state", "n1"))).exists()


def test_watchdog_never_cuts_a_drain_off_from_its_state(tmp_path, slurm, monkeypatch):
    # A slow gather leaves little of the watchdog; a slow but successful
    # scontrol update must not be interrupted after slurmctld applied it,
    # or the drain is made and never remembered (and never resumed).
    import time as _t
    from slurm_gpu.health import xid
    real_check, real_run = xid.check_xid, slurm.run

    def slow_check(events, *memo):
        _t.sleep(0.6)
        return real_check(events, *memo)

    def slow_update(argv, timeout, **kw):
        res = real_run(argv, timeout, **kw)
        if argv[1] == "update":
            _t.sleep(min(timeout, 0.45))
        return res
    monkeypatch.setattr(xid, "check_xid", slow_check)
    monkeypatch.setattr(runner, "run", slow_update)
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    o = opts(tmp_path, log)
    o.settings.watchdog_seconds = 1.0
    r = engine.run(o)
    drained = parse_show_node(slurm.text).drained
    p = Path(engine.state_file(tmp_path / "state", "n1"))
    remembered = p.exists() and json.loads(p.read_text())["memory"]["drained_reason"] == R
    assert drained == remembered, (r.broken, drained, remembered)
    assert r.broken   # too little time to act: unknown, retried next run
    monkeypatch.setattr(xid, "check_xid", real_check)
    o.settings.watchdog_seconds = 20
    assert engine.run(o).action == "drain"


def test_slow_nvml_neither_drains_nor_counts_as_clean(tmp_path, slurm, monkeypatch):
    from slurm_gpu.hw import nvml_health
    slow = nvml_health.NvmlHealth(available=True, hung="NVML reads took longer than 12 s (still in nvmlInit)",
                                  slow=True)
    monkeypatch.setattr(nvml_health, "read_health_bounded", lambda *a, **k: slow)
    slurm.text = capture("draining_ours", node="n1")
    reason = parse_show_node(slurm.text).reason
    state = tmp_path / "state"
    state.mkdir()
    (Path(engine.state_file(state, "n1"))).write_text(json.dumps({"memory": {"drained_reason": reason, "clean_runs": 0}}))
    log = tmp_path / "kern.log"
    log.write_text("")
    for _ in range(3):
        o = opts(tmp_path, log, resume=1, nvml_opener=lambda: None)
        o.only = ["gpu.xid", "gpu.nvml", "gpu.ecc"]
        r = engine.run(o)
        assert r.broken and "too slow" in r.broken and r.status == "warn"
    assert slurm.updates == []                 # our drain stays: no clean run was proven


def test_first_run_with_slow_nvml_still_records_its_slurmd(tmp_path, slurm, monkeypatch):
    from slurm_gpu.hw import nvml_health
    slow = nvml_health.NvmlHealth(available=True, hung="NVML reads took longer than 12 s", slow=True)
    monkeypatch.setattr(nvml_health, "read_health_bounded", lambda *a, **k: slow)
    log = tmp_path / "kern.log"
    log.write_text("")
    o = opts(tmp_path, log, slurm_mode=True, parent_slurmd="4242:1000", nvml_opener=lambda: None)
    o.only = ["gpu.xid", "gpu.nvml"]
    engine.run(o)
    doc = json.loads((Path(engine.state_file(tmp_path / "state", "n1"))).read_text())
    assert doc["memory"]["slurmd"] == "4242:1000" and slurm.calls == []


@pytest.mark.parametrize("doc", [[1, 2], {"memory": "x"}, {"memory": {"clean_runs": "many"}},
                                 {"cursor": [1]}, {"cursor": {"files": {"LOG": {"offset": "x"}}}},
                                 {"cursor": {"kmsg": {"seq": None}}}])
def test_malformed_state_counts_as_lost_not_a_broken_check(tmp_path, slurm, doc):
    # Valid JSON of the wrong shape (a hand edit, an old version) must not break
    # every later run: it is treated like a lost state file (no blind resume).
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    state = tmp_path / "state"
    state.mkdir()
    (Path(engine.state_file(state, "n1"))).write_text(json.dumps(doc).replace("LOG", str(log)))
    r = engine.run(opts(tmp_path, log))
    assert r.broken is None and r.action == "drain"
    assert json.loads((Path(engine.state_file(state, "n1"))).read_text())["memory"]["drained_reason"] == R


def test_unreadable_kernel_log_does_not_blind_the_other_checks(tmp_path, slurm):
    # [health] kernel_log names a file that is gone (journald-only node): the
    # run is unknown, but a fault another source sees still drains.
    state = tmp_path / "state"
    state.mkdir()
    (state / engine.EVENTS_FILE).write_text(json.dumps({"time": 1, "event": "dbe", "gpu": "0000:07:00.0"}) + "\n")
    r = engine.run(opts(tmp_path, tmp_path / "gone.log"))
    assert r.broken and "kernel log not found" in r.broken
    assert r.action == "drain" and "gpu.ecc" in slurm.updates[-1][4]
    # and with nothing to drain, it is no clean run: our drain is not resumed
    for _ in range(3):
        r = engine.run(opts(tmp_path, tmp_path / "gone.log", resume=1))
        assert r.broken and r.action == "none"
    assert len(slurm.updates) == 1


def test_nodes_sharing_a_state_dir_keep_their_own_memory(tmp_path, monkeypatch):
    # Two slurmd on one host with one state_dir (no %n): n1's drain, slurmd and
    # cursor must not become n2's (each run would look like a first run, or
    # n2 would resume n1's drain bookkeeping).
    texts = {"n1": capture("idle", node="n1"), "n2": capture("idle", node="n2")}
    updates = []

    def run(argv, timeout, **kw):
        name = argv[-1] if argv[1] == "show" else argv[2].split("=", 1)[1]
        if argv[1] == "update":
            updates.append(argv)
            reason = next(a for a in argv if a.startswith("reason="))[7:]
            texts[name] = texts[name].rstrip("\n").replace("State=IDLE", "State=IDLE+DRAIN") + \
                f" Reason={reason} [root@2026-11-22T05:20:00]\n"
        return runner.Completed(tuple(argv), 0, texts[name] if argv[1] == "show" else "", "")
    monkeypatch.setattr(runner, "run", run)
    bad, good = tmp_path / "n1.log", tmp_path / "n2.log"
    bad.write_text(XID79)
    good.write_text(XID13)
    for i in range(3):
        for node, log, pid in (("n1", bad, "1:1"), ("n2", good, "2:2")):
            o = opts(tmp_path, log, slurm_mode=True, parent_slurmd=pid)
            o.node = node
            engine.run(o)
    assert [u[2] for u in updates] == ["nodename=n1"]       # n1 drained on its 2nd run, n2 never
    assert json.loads(Path(engine.state_file(tmp_path / "state", "n1")).read_text())["memory"]["slurmd"] == "1:1"
    assert json.loads(Path(engine.state_file(tmp_path / "state", "n2")).read_text())["memory"]["slurmd"] == "2:2"


def test_legacy_state_file_is_migrated_not_lost(tmp_path, slurm):
    state = tmp_path / "state"
    state.mkdir()
    reason = parse_show_node(capture("draining_ours")).reason
    slurm.text = capture("draining_ours", node="n1")
    (state / engine.STATE_FILE).write_text(json.dumps({"memory": {"drained_reason": reason}}))
    log = tmp_path / "kern.log"
    log.write_text("")
    assert engine.run(opts(tmp_path, log, resume=1)).action == "resume"


@pytest.mark.parametrize("boot,drains", [("boot-a", True), ("boot-b", False)])
def test_drain_owed_from_a_previous_boot_is_dropped(tmp_path, slurm, monkeypatch, boot, drains):
    # Owed while the node was REBOOT_REQUESTED/booting/in maintenance; after the
    # reboot (a persistent state_dir) it must not drain the repaired node.
    from slurm_gpu.hw import kmsg
    monkeypatch.setattr(kmsg, "boot_id", lambda: boot)
    state = tmp_path / "state"
    state.mkdir()
    Path(engine.state_file(state, "n1")).write_text(json.dumps(
        {"memory": {"pending_reason": R, "boot_id": "boot-a"}}))
    log = tmp_path / "kern.log"
    log.write_text("")
    r = engine.run(opts(tmp_path, log))
    assert (r.action == "drain") is drains


def test_45_follows_a_nonfatal_145_decoded_in_the_previous_run(tmp_path, slurm):
    # The cursor may split "145 ... Nonfatal" and the "45 ... caused by previous
    # Xid 145" that follows it into two runs; the 45 must still follow the
    # decoded 145 (IGNORE: no drain), not the catalog's generic NVLink5 drain.
    log = tmp_path / "kern.log"
    log.write_text("[1.0] NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 "
                   "0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)\n")
    assert engine.run(opts(tmp_path, log)).status == "ok"
    with open(log, "a") as f:
        f.write("[1.1] NVRM: Xid (PCI:0018:01:00): 45, pid=1, name=python3, Ch 00000001 caused by previous Xid 145\n")
    r = engine.run(opts(tmp_path, log))
    assert r.status == "ok" and slurm.updates == [], [f.message for f in r.findings]


@pytest.mark.parametrize("kernel_log,drained", [("", False), (XID79, True)], ids=["condition", "event"])
def test_on_the_first_run_a_condition_is_not_owed_an_event_is(tmp_path, slurm, monkeypatch, kernel_log, drained):
    # At boot slurmd's first run may see the NVLink fabric not started yet (the
    # fabric manager comes up later). That condition is checked again next run;
    # only events (which the cursor consumes) are owed. A clean second run must
    # not drain the node for the boot-time state; an Xid the first run read must.
    from slurm_gpu.health.findings import Finding
    from slurm_gpu.hw import nvml_health
    monkeypatch.setattr(nvml_health, "read_health_bounded", lambda *a, **k: nvml_health.NvmlHealth(available=True))
    fabric = [Finding("gpu.fabric", "drain", "NVLink fabric not started on 0000:18:00.0", "0000:18:00.0")]
    seen = iter([fabric, []])
    monkeypatch.setattr(engine, "run_gpu_checks", lambda *a, **k: next(seen))
    log = tmp_path / "kern.log"
    log.write_text(kernel_log)
    for expect in ("deferred", "drain" if drained else "none"):
        o = opts(tmp_path, log, slurm_mode=True, parent_slurmd="4242:1000", nvml_opener=lambda: None)
        o.only = ["gpu.xid", "gpu.fabric"]
        assert engine.run(o).action == expect
    if drained:
        assert slurm.updates[-1][4] == f"reason={R}"
    else:
        assert slurm.updates == []


def test_condition_while_booting_is_not_owed_but_an_event_is():
    booting = parse_show_node(capture("idle", state="IDLE+POWERING_UP"))
    p = decide(booting, "slurm-gpu: gpu.fabric: not started", Memory(), 3, owe=None)
    assert p.action == "none" and p.memory.pending_reason is None
    p = decide(booting, "slurm-gpu: gpu.fabric: not started", Memory(), 3, owe=R)
    assert p.memory.pending_reason == R


def test_xid_watch_events_are_read_once(tmp_path, slurm):
    log = tmp_path / "kern.log"
    log.write_text("")
    state = tmp_path / "state"
    state.mkdir()
    (state / engine.EVENTS_FILE).write_text(json.dumps({"time": 1, "event": "xid", "xid": 48, "gpu": "0000:07:00.0"}) + "\n")
    r = engine.run(opts(tmp_path, log))
    assert r.action == "drain" and "Xid 48" in slurm.updates[-1][4]
    r = engine.run(opts(tmp_path, log))
    assert r.status == "ok"


def test_parent_slurmd_is_found_through_a_wrapper(tmp_path):
    import subprocess
    import sys
    import shutil
    # A process named "slurmd" (a copy of sh) whose child shell runs us: found a level or two up.
    fake = tmp_path / "slurmd"
    shutil.copy("/bin/sh", fake)
    code = "from slurm_gpu.health.engine import parent_slurmd; print(parent_slurmd())"
    root = ROOT
    out = subprocess.run([str(fake), "-c", f"/bin/sh -c '{sys.executable} -c \"{code}\"'; true"],
                         capture_output=True, text=True, cwd=str(root), timeout=30)
    ident = out.stdout.strip()
    assert re.fullmatch(r"\d+:\d+", ident), (out.stdout, out.stderr)
    assert engine.parent_slurmd() is None          # pytest is not run by slurmd


def test_one_acting_run_at_a_time(tmp_path, slurm):
    import fcntl
    import os as _os
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    (tmp_path / "state").mkdir()
    fd = _os.open(engine.lock_file(tmp_path / "state", "n1"), _os.O_RDWR | _os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        r = engine.run(opts(tmp_path, log))
        assert r.broken and "another health check" in r.broken and slurm.calls == []
        assert engine.run(opts(tmp_path, log, no_drain=True)).status == "drain"   # reports need no lock
    finally:
        _os.close(fd)
    assert engine.run(opts(tmp_path, log)).action == "drain"
