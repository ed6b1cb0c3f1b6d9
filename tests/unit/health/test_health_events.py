"""Health events out: one JSON line per finding, drain, resume and job step, size-rotated;
[health] event_command gets them on stdin, bounded, counted, never failing the check."""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

from slurm_gpu import runner
from slurm_gpu.health import engine, events, prom
from slurm_gpu.health.settings import HealthSettings

from test_health_drain import XID79, FakeSlurm, capture


@pytest.fixture
def slurm(monkeypatch):
    fake = FakeSlurm(capture("idle"))
    real = runner.run

    def run(argv, timeout, **kw):
        if argv[0].endswith(("scontrol", "squeue")):
            return fake.run(argv, timeout, **kw) if "squeue" not in argv[0] else runner.Completed(
                tuple(argv), 0, "", "")
        return real(argv, timeout, **kw)      # the event command really runs
    monkeypatch.setattr(runner, "run", run)
    return fake


def run(tmp_path, log, **kw):
    s = HealthSettings(kernel_log=str(log), clean_runs_to_resume=1, **kw)
    return engine.run(engine.Options(node="n1", settings=s, state_dir=str(tmp_path / "state"), only=["gpu.xid"]))


def lines(tmp_path):
    return events.read(str(tmp_path / "state" / "health-events.n1.jsonl"))


def test_a_fault_writes_its_finding_and_drain_once_and_the_resume(tmp_path, slurm):
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    rep = run(tmp_path, log)
    assert rep.action == "drain"
    got = lines(tmp_path)
    assert [e["action"] for e in got] == ["finding", "drain"]
    f, d = got
    assert (f["node"], f["check"], f["gpu"], f["xid"], f["severity"]) == ("n1", "gpu.xid", "0000:02:00.0", 79, "drain")
    assert d["reason"].startswith("slurm-gpu: gpu.xid: Xid 79 on 0000:02:00.0") and d["xid"] == 79
    assert set(events.FIELDS) <= set(d) and abs(d["time"] - time.time()) < 60
    rep = run(tmp_path, log)                      # clean: the event was counted once
    assert rep.action == "resume"
    assert [e["action"] for e in lines(tmp_path)] == ["finding", "drain", "resume"]
    run(tmp_path, log)
    assert len(lines(tmp_path)) == 3              # a clean run writes nothing


def test_the_log_is_rotated_by_size_and_bounded(tmp_path):
    p = str(tmp_path / "ev.jsonl")
    rec = events.record("n1", "finding", check="gpu.xid", reason="x" * 100)
    for _ in range(50):
        events.append(p, [rec], max_bytes=1000, keep=2)
    names = sorted(os.listdir(tmp_path))
    assert names == ["ev.jsonl", "ev.jsonl.1", "ev.jsonl.2"]
    assert all(os.path.getsize(tmp_path / n) < 1300 for n in names)
    assert 10 < len(events.read(p)) < 50          # the oldest are gone; what is kept reads back


def test_the_event_command_gets_the_lines_on_stdin(tmp_path, slurm):
    out = tmp_path / "got.jsonl"
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    cmd = [sys.executable, "-c", f"import sys; open({str(out)!r}, 'w').write(sys.stdin.read())"]
    rep = run(tmp_path, log, event_command=cmd)
    assert [json.loads(x)["action"] for x in out.read_text().splitlines()] == ["finding", "drain"]
    assert rep.event_command == {"ok": 1} and rep.broken is None


def test_a_hanging_event_command_is_killed_at_its_bound_counted_and_the_check_unaffected(tmp_path, slurm):
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    rep = run(tmp_path, log, event_command=[sys.executable, "-c", "import time; time.sleep(60)"],
              event_command_timeout=0.5)
    assert rep.action == "drain" and rep.broken is None and rep.status == "drain"
    assert rep.event_command == {"timeout": 1} and rep.elapsed < 10
    assert "event_command timeout" in " ".join(rep.notes)
    with open(log, "a") as f:
        f.write(XID79)
    rep = run(tmp_path, log, event_command=[sys.executable, "-c", "raise SystemExit(3)"])
    assert rep.event_command == {"timeout": 1, "failed": 1}           # kept across runs
    text = prom.render(rep)
    assert 'slurm_gpu_health_event_command_total{node="n1",result="timeout"} 1' in text
    assert 'slurm_gpu_health_event_command_total{node="n1",result="failed"} 1' in text


def test_an_unwritable_event_log_is_a_note_never_a_failed_check(tmp_path, slurm):
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    (tmp_path / "file").write_text("")
    rep = run(tmp_path, log, event_log=str(tmp_path / "file" / "ev.jsonl"))
    assert rep.action == "drain" and rep.broken is None
    assert any(n.startswith("health events not written to") for n in rep.notes)


def test_event_command_is_an_argv_list_never_a_shell_string():
    with pytest.raises(ValueError):
        HealthSettings(event_command=["/bin/sh", 3])


def test_a_reboot_between_two_runs_is_an_event(tmp_path, slurm, monkeypatch):
    from slurm_gpu.hw import kmsg
    log = tmp_path / "kern.log"
    log.write_text("")
    monkeypatch.setattr(kmsg, "boot_id", lambda: "boot-a")
    run(tmp_path, log)
    assert lines(tmp_path) == []
    monkeypatch.setattr(kmsg, "boot_id", lambda: "boot-b")
    run(tmp_path, log)
    assert [e["action"] for e in lines(tmp_path)] == ["boot"]
