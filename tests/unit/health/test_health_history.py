"""A node's fault history and the cluster's (`report node`, `report faults`) from the health events."""
from __future__ import annotations

import json
import stat

import pytest

from slurm_gpu.cli import main
from slurm_gpu.health import events, history

T = 1_795_000_000.0
BUS = "0000:18:00.0"


def ev(dt: float, action: str, **kw):
    return events.record("n1", action, when=T + dt, **kw)


def fault(node: str, t: float, xid: int = 79, job: str | None = None):
    recs = [events.record(node, "finding", check="gpu.xid", gpu=BUS, xid=xid, when=t, severity="drain",
                          reason=f"Xid {xid} on {BUS}"),
            events.record(node, "drain", check="gpu.xid", gpu=BUS, xid=xid, when=t + 0.4,
                          reason=f"slurm-gpu: gpu.xid: Xid {xid} on {BUS}: ...")]
    if job:
        recs += [events.record(node, "requeue", gpu=BUS, xid=xid, job=job, when=t + 0.6),
                 events.record(node, "release", job=job, when=t + 1.2)]
    return recs + [events.record(node, "resume", when=t + 600)]


def test_episodes_run_from_the_first_signal_to_the_drain_and_carry_the_steps():
    recs = [ev(0, "finding", check="gpu.pcie", severity="warn")]        # a warning alone: no episode
    recs += [ev(10, "resume")]
    recs += fault("n1", T + 100, job="41")
    recs += [ev(900, "finding", check="gpu.remap", gpu=BUS, severity="drain"),
             ev(960, "drain", check="gpu.remap", gpu=BUS, reason="slurm-gpu: gpu.remap: ..."),
             ev(961, "reset", gpu=BUS, result="ok")]
    eps = history.episodes(recs)
    assert len(eps) == 2                          # the warning drained nothing: no episode
    xid, remap = eps
    assert (xid.first_signal, xid.drain, xid.resume, xid.xids, xid.holders) == (T + 100, T + 100.4, T + 700,
                                                                                [79], ["41"])
    assert [s["action"] for s in xid.steps] == ["requeue", "release"]
    assert (remap.first_signal, remap.drain, remap.resume) == (T + 900, T + 960, None)
    assert remap.steps == [{"time": T + 961, "action": "reset", "gpu": BUS, "job": None, "result": "ok"}]


def test_faults_name_the_repeat_offenders_and_the_classes():
    by = {"n1": fault("n1", T) + fault("n1", T + 1000) + fault("n1", T + 2000, xid=48),
          "n2": fault("n2", T, job="7"), "n3": fault("n3", T, xid=95), "n4": []}
    v = history.faults_summary(by)
    assert v["drains"] == 5 and v["nodes_drained"] == 3 and v["nodes_with_history"] == 4
    assert [(o["node"], o["drains"]) for o in v["offenders"]] == [("n1", 3), ("n2", 1), ("n3", 1)]
    assert v["nodes_causing_half"] == 1 and v["offenders"][0]["share"] == 0.6
    assert v["classes"] == [{"class": "Xid 79", "drains": 3}, {"class": "Xid 48", "drains": 1},
                            {"class": "Xid 95", "drains": 1}]
    assert v["gpus"] == [{"node": "n1", "gpu": BUS, "drains": 3}] and v["jobs_requeued_or_cancelled"] == 1


@pytest.fixture
def published(tmp_path, monkeypatch):
    d = tmp_path / "pub" / "health-events"
    events.append(str(d / "n1.jsonl"), fault("n1", T, job="41") + fault("n1", T + 5000), 10 ** 6, 3)
    events.append(str(d / "n2.jsonl"), fault("n2", T), 10 ** 6, 3)
    sacct = tmp_path / "sacct"
    # sacct -n -P -X: JobID|User|Account|Start|End|State|AllocTRES; the argv goes to a file.
    sacct.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {tmp_path}/sacct.argv\n"
                     "printf '%s\\n' '41|alice|physics|2026-11-20T10:00:00|Unknown|REQUEUED|gres/gpu=1' "
                     "'42|bob|bio|2026-11-20T10:01:00|2026-11-20T10:30:00|COMPLETED|gres/gpu=2'\n")
    sacct.chmod(sacct.stat().st_mode | stat.S_IXUSR)
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\n[acct]\nsacct = "{sacct}"\n'
                   f'[cluster]\npublish_dir = "{tmp_path}/pub"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    from slurm_gpu import config
    config.clear_cache()
    yield tmp_path
    config.clear_cache()


def test_report_node_shows_the_history_and_the_jobs_between_first_signal_and_drain(published, capsys):
    assert main(["report", "node", "n1", "--json"]) in (0, None)
    v = json.loads(capsys.readouterr().out)
    assert v["node"] == "n1" and len(v["episodes"]) == 2 and v["events"] == 8
    ep = v["episodes"][0]
    assert ep["first_signal"] == T and ep["drain"] == T + 0.4 and ep["holders"] == ["41"]
    assert [j["jobid"] for j in ep["jobs"]] == ["41", "42"] and ep["jobs"][0]["user"] == "alice"
    argv = (published / "sacct.argv").read_text().splitlines()[0].split()
    assert argv[:6] == ["-n", "-P", "-X", "-a", "-N", "n1"]
    assert main(["report", "node", "n1", "--since", "2026-11-25"]) in (0, None)    # T is 2026-11-18
    assert capsys.readouterr().out.startswith("n1: 0 fault(s) since 2026-11-25T00:00:00")
    assert main(["report", "node", "n1"]) in (0, None)
    out = capsys.readouterr().out
    assert "first signal" in out and "requeue job 41" in out and "41  alice" in out


def test_report_node_for_an_unknown_node_is_one_line_exit_2(published, capsys):
    rc = main(["report", "node", "nosuch"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("slurm-gpu: unknown node 'nosuch'") and err.count("\n") == 1
    rc = main(["report", "node", "../etc/passwd"])
    assert rc == 2 and "not a node name" in capsys.readouterr().err


def test_report_faults_over_the_published_histories(published, capsys):
    assert main(["report", "faults", "--json"]) in (0, None)
    v = json.loads(capsys.readouterr().out)
    assert [(o["node"], o["drains"]) for o in v["offenders"]] == [("n1", 2), ("n2", 1)]
    assert main(["report", "faults"]) in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("3 drain(s) on 2 of 2 node(s)") and "Xid 79" in out


def test_report_faults_survives_what_a_writer_of_the_publish_directory_plants(published, capsys):
    # Another node's root (or `nobody` on a root-squashed share) can add files
    # there: a FIFO must not hang the report, a badly typed record must not
    # crash it, and one odd file name must not refuse the whole cluster's report.
    import os
    d = published / "pub" / "health-events"
    os.mkfifo(d / "n3.jsonl")
    bad = [dict(r, gpu=["x"]) for r in fault("n4", T)] + [dict(r, xid="79") for r in fault("n4", T + 1)] \
        + [dict(r, time=float("nan")) for r in fault("n4", T + 2)]
    (d / "n4.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    os.chmod(d / "n4.jsonl", 0o644)
    (d / "bad name.jsonl").write_text("")
    (d / "n5.jsonl").symlink_to(d / "n1.jsonl")
    assert main(["report", "faults", "--json"]) in (0, None)
    cap = capsys.readouterr()
    v = json.loads(cap.out)
    assert [(o["node"], o["drains"]) for o in v["offenders"]] == [("n1", 2), ("n2", 1)]
    assert "skipped 1 file(s) not named <node>.jsonl: 'bad name.jsonl'" in cap.err
