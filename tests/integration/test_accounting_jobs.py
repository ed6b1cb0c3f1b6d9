"""Per-job GPU accounting on a real Slurm with slurmdbd: the sampler, the
prolog/epilog step, the summary in sacct, `job report`, `report usage`,
metrics and dcgm-exporter mapping files.

The simulator's scripted load drives the GPUs; the project's own monitor
(`slurm-gpu monitor`, the installed venv) samples them every 0.3 s.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sandboxlib import REPO
from slurm_gpu.acct import dbd
from slurm_gpu_devkit.sandbox.accounting import BINARIES
from slurm_gpu_devkit.sim.load import LOAD_SCHEMA, write_load
from slurm_gpu_devkit.sim.state import init_state_for_machine

pytestmark = pytest.mark.skipif(
    any(not os.access(b, os.X_OK) for b in BINARIES) and os.environ.get("SLURM_GPU_REQUIRE_INTEGRATION") != "1",
    reason="slurmdbd or mariadb-server not installed")

MACHINES = REPO / "tests" / "data" / "machines"
INTERVAL = 0.3


class AcctNode:
    """A sandbox with accounting, one node, the simulator and a running monitor."""

    def __init__(self, make_sandbox, sandbox_dir, machine: str, tag: str, **opts) -> None:
        self.files = sandbox_dir(f"acct-{tag}")   # removed at the end of the session
        self.sim = self.files / "sim.json"
        self.load = self.files / "load.json"
        self.map = self.files / "map"
        self.prom = self.files / "gpu.prom"
        init_state_for_machine(str(MACHINES / machine), str(self.sim))
        st = json.loads(self.sim.read_text())
        st["load_file"] = str(self.load)
        self.sim.write_text(json.dumps(st))
        self.script({})
        for p in (self.files, self.sim, self.load):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        self.c = make_sandbox(1, MACHINES / machine, prolog=True, accounting=True, **opts, extra_config={
            "node": {"nvml": f"sim:{self.sim}"},
            # The scripted load keeps memory in use after a job ends, which the
            # epilog's leftover check would (rightly) drain for; not tested here.
            "repair": {"user_problem": False},
            "acct": {"enabled": True, "interval": INTERVAL, "dcgm_mapping_dir": str(self.map),
                     "metrics_file": str(self.prom), "job_labels": True}})
        self.node = self.c.nodes[0]
        argv, env = self.node_argv("monitor")
        self.monitor = subprocess.Popen(argv, env=env,
                                        stdout=subprocess.DEVNULL, stderr=open(self.files / "monitor.log", "wb"),
                                        start_new_session=True)
        self.acct = self.c.dir / "var" / self.node / "acct"

    def node_argv(self, *args: str) -> tuple[list[str], dict[str, str]]:
        """``slurm-gpu ARGS`` as it runs on the node: on a Debian root's Slurm
        inside the root (its venv, its sacct and sacctmgr, which the host's
        22.05 ones cannot replace: slurmdbd serves clients only a few releases back)."""
        venv = Path(os.environ.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv"))
        env = {**self.c.env, "SLURM_GPU_CONFIG": str(self.c.dir / "etc" / "slurm-gpu.toml"),
               "SLURMD_NODENAME": self.node}
        argv, _ = self.c.sb.client_argv([str(venv / "bin" / "slurm-gpu"), *args])
        if argv[0] != str(venv / "bin" / "slurm-gpu"):
            env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
        return argv, env

    def script(self, devices: dict, t0: float | None = None) -> None:
        write_load(str(self.load), {"schema": LOAD_SCHEMA, "t0": t0 or time.time(), "devices": devices})

    def stop(self) -> None:
        if self.monitor.poll() is None:
            os.killpg(self.monitor.pid, signal.SIGTERM)
            try:
                self.monitor.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.monitor.pid, signal.SIGKILL)
                self.monitor.wait()

    def comment(self, jobid: int, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            out = self.c.run(["sacct", "-n", "-P", "-X", "-j", str(jobid), "-o", "AdminComment"]).stdout.strip()
            if dbd.KEY in out or time.monotonic() > deadline:
                return out
            time.sleep(0.3)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv, env = self.node_argv(*args)
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)

    def left(self) -> dict[str, list[str]]:
        out = {k: sorted(p.name for p in (self.acct / k).glob("*.json")) for k in ("jobs", "agg")}
        out["map"] = sorted(p.name for p in self.map.iterdir() if not p.name.startswith(".")) \
            if self.map.exists() else []
        return out


@pytest.fixture(scope="module")
def whole(make_sandbox, sandbox_dir, job_users):
    n = AcctNode(make_sandbox, sandbox_dir, "h100-sxm-8x", "whole")
    yield n
    n.stop()


def wait_for(pred, timeout: float = 20.0, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(step)


def test_loaded_gpus_busy_idle_gpu_idle_in_sacct_and_job_report(whole):
    whole.script({"0": [{"t": 0, "sm": 80, "mem_mib": 20000, "power_w": 500}],
                  "1": [{"t": 0, "sm": 40, "mem_mib": 10000, "power_w": 300}]})
    jid = whole.c.sbatch("--gres=gpu:3", "--wrap", "sleep 3", user="sgtest1")
    # While it runs: mapping files name the job, metrics carry its id on its GPUs only.
    assert wait_for(lambda: whole.left()["map"] == ["0", "1", "2"]), whole.left()
    assert wait_for(lambda: whole.prom.exists() and f'jobid="{jid}"' in whole.prom.read_text())
    for line in whole.prom.read_text().splitlines():
        if 'jobid="' in line:
            assert f'jobid="{jid}"' in line and any(f'gpu="{g}"' in line for g in "012"), line
    live = whole.cli("job", "report", str(jid), "--json")
    assert live.returncode == 0, live.stderr
    assert any("live" in n for n in json.loads(live.stdout)["notes"])
    whole.c.wait_job(jid)
    comment = whole.comment(jid)
    part = dbd.parse(comment)["n1"]
    assert part["held"] == ["0", "1", "2"]
    rep = whole.cli("job", "report", str(jid), "--json")
    assert rep.returncode == 0, rep.stderr
    devs = {d["device"]: d for d in json.loads(rep.stdout)["devices"]}
    assert devs["0"]["sm"] == pytest.approx(80, abs=0.5) and devs["0"]["idle"] == 0
    assert devs["1"]["sm"] == pytest.approx(40, abs=0.5) and devs["1"]["idle"] == 0
    assert devs["2"]["sm"] == 0 and devs["2"]["idle"] == 1.0
    assert devs["0"]["mem"] == 20000 and devs["0"]["j"] > 0
    verdicts = json.loads(rep.stdout)["verdicts"]
    assert any(v.startswith("GPU 2 on n1: idle") for v in verdicts), verdicts
    assert not any(v.startswith("GPU 0 on n1: idle") for v in verdicts)
    text = whole.cli("job", "report", str(jid))
    assert "GPU 2 on n1: idle" in text.stdout
    assert wait_for(lambda: whole.left() == {"jobs": [], "agg": [], "map": []}), whole.left()


def test_unknown_job_is_one_line(whole):
    res = whole.cli("job", "report", "99999")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == ["slurm-gpu: job 99999 is unknown to slurmdbd (sacct)"]


def _job_with_admin_comment(whole, text: str) -> str:
    """A finished one-GPU job whose AdminComment another tool set to *text* while it ran."""
    whole.script({"0": [{"t": 0, "sm": 50}]})
    jid = whole.c.sbatch("--gres=gpu:1", "--wrap", "sleep 2")
    wait_for(lambda: whole.c.job(jid).get("JobState") == "RUNNING")
    res = whole.c.run(["scontrol", "update", f"jobid={jid}", f"AdminComment={text}"])
    assert res.returncode == 0, res.stderr
    whole.c.wait_job(jid)
    return jid


def test_another_tools_admin_comment_is_kept(whole):
    jid = _job_with_admin_comment(whole, "nhc:ok")
    comment = wait_for(lambda: (lambda c: c if dbd.KEY in c and "nhc:ok" in c else None)(whole.comment(jid)))
    assert comment and comment.startswith("nhc:ok slurm-gpu:"), comment


def test_another_tools_upper_case_admin_comment(whole):
    """sacctmgr lower-cased AdminComment before Slurm 23.02 and keeps its case
    since: on 24.11 and 26.05 the summary is stored beside ``NHC:OK`` as it
    is; on 22.05 that text is left alone and the summary stays on the node."""
    jid = _job_with_admin_comment(whole, "NHC:OK")
    pending = whole.acct / "pending" / f"{jid}.json"
    if tuple(int(x) for x in whole.c.slurm_version.split(".")[:2]) >= (23, 2):
        comment = wait_for(lambda: (lambda c: c if dbd.KEY in c else None)(whole.comment(jid)))
        assert comment and comment.startswith("NHC:OK slurm-gpu:"), comment
        assert len(dbd.parse(comment)["n1"]["held"]) == 1
    else:
        rec = wait_for(lambda: (lambda r: r if r.get("final") else None)(
            json.loads(pending.read_text()) if pending.exists() else {}))
        assert rec and rec["final"] and "would alter" in rec["why"], rec
        assert whole.c.run(["sacct", "-n", "-P", "-X", "-j", str(jid), "-o", "AdminComment"]
                           ).stdout.strip() == "NHC:OK"


def test_a_newline_or_deep_nesting_in_admin_comment_neither_crashes_nor_adds_a_row(whole):
    """AdminComment is stored as written, newlines included, and sacct -P prints
    it raw: a line of |-separated fields in it must not read as a job."""
    # Lower case: sacctmgr before 23.02 lower-cases AdminComment, and such text is never rewritten.
    forged = "nhc:ok\n999999|victim|acct|part|n1|completed|none|none|3600|cpu=1,gres/gpu=8|x"
    jid = _job_with_admin_comment(whole, forged)
    comment = wait_for(lambda: (lambda c: c if dbd.KEY in c else None)(whole.comment(jid)))
    assert comment and "999999|victim" in comment, comment
    deep = _job_with_admin_comment(whole, "slurm-gpu:" + "[" * 3000)
    start = whole.c.run(["sacct", "-n", "-P", "-X", "-j", str(jid), "-o", "Start"]).stdout.strip()
    res = whole.cli("report", "usage", "--since", start[:10], "--json")
    assert res.returncode == 0, res.stderr
    v = json.loads(res.stdout)
    assert "victim" not in {g["user"] for g in v["groups"]}, v
    for j in (jid, deep):
        rep = whole.cli("job", "report", str(j))
        assert rep.returncode == 0 and rep.stderr == "", rep.stderr
        assert "victim" not in rep.stdout and "999999" not in rep.stdout
    assert whole.cli("job", "report", "999999").returncode == 1


def test_the_registration_records_the_sluid_from_2605(whole):
    """26.05 names a job's cgroup v2 directory by its SLUID; the real prolog's
    SLURM_JOB_SLUID is recorded so a leak stays attributable (older Slurm has none)."""
    from slurm_gpu.acct.attribution import SLUID
    jid = whole.c.sbatch("--gres=gpu:1", "--wrap", "sleep 2")
    reg_file = whole.acct / "jobs" / f"{jid}.json"
    reg = wait_for(lambda: json.loads(reg_file.read_text()) if reg_file.exists() else None)
    assert reg, whole.left()
    if tuple(int(x) for x in whole.c.slurm_version.split(".")[:2]) >= (26, 5):
        assert SLUID.fullmatch(reg.get("sluid", "")), reg
        shown = whole.c.job(jid)
        if "SLUID" in shown:
            assert shown["SLUID"] == reg["sluid"]
    else:
        assert "sluid" not in reg
    whole.c.wait_job(jid)


def test_report_usage_ratios_match_the_scripted_load(whole):
    whole.script({"0": [{"t": 0, "sm": 90}], "1": [{"t": 0, "sm": 30}]})
    a = whole.c.sbatch("--gres=gpu:2", "--wrap", "sleep 3", user="sgtest1")
    b = whole.c.sbatch("--gres=gpu:1", "--wrap", "sleep 3", user="sgtest2")
    for j in (a, b):
        whole.c.wait_job(j)
        whole.comment(j)
    rows = {}
    for j in (a, b):
        out = whole.c.run(["sacct", "-n", "-P", "-X", "-j", str(j), "-o", "Start,End,ElapsedRaw,AdminComment"])
        start, end, elapsed, comment = out.stdout.strip().split("|", 3)
        rows[j] = (start, end, int(elapsed), dbd.parse(comment)["n1"])
    since = min(r[0] for r in rows.values())
    until = max(r[1] for r in rows.values())
    # By hand: job a held GPUs 0 (90 %) and 1 (30 %); job b held one other GPU, idle.
    ea, eb = rows[a][2], rows[b][2]
    assert set(rows[a][3]["held"]) == {"0", "1"}
    assert len(rows[b][3]["held"]) == 1 and rows[b][3]["held"][0] not in ("0", "1")
    used = ea * (0.90 + 0.30)
    alloc = 2 * ea + eb
    from datetime import datetime
    span = (datetime.fromisoformat(until) - datetime.fromisoformat(since)).total_seconds()
    res = whole.cli("report", "usage", "--since", since, "--until", until, "--json")
    assert res.returncode == 0, res.stderr
    v = json.loads(res.stdout)
    assert v["capacity_gpus"] == 8
    assert v["job_efficiency"] == pytest.approx(used / alloc, rel=0.01)
    assert v["cluster_utilisation"] == pytest.approx(used / (8 * span), rel=0.01)
    assert v["idle_gpu_hours"] == pytest.approx(eb / 3600, rel=0.01), (v, rows)
    assert v["top_idle"][0]["user"] == "sgtest2"


def test_requeues_and_cancels_leave_no_mapping_or_aggregate(whole):
    import random
    rng = random.Random(5)
    whole.script({str(g): [{"t": 0, "sm": 20}] for g in range(8)})
    ids = []
    for i in range(8):
        ids.append(whole.c.sbatch(f"--gres=gpu:{rng.randint(1, 2)}", "--requeue", "--wrap", "sleep 2"))
    for j in ids[:3]:
        wait_for(lambda: whole.c.job(j).get("JobState") == "RUNNING", timeout=15)
        whole.c.run(["scontrol", "requeue", str(j)])
        # A requeued job waits for a BeginTime about two minutes away: bring it forward.
        wait_for(lambda: whole.c.job(j).get("JobState") == "PENDING", timeout=15)
        whole.c.run(["scontrol", "update", f"jobid={j}", "StartTime=now"])
    whole.c.run(["scancel", str(ids[-1])])
    for j in ids:
        whole.c.wait_job(j, timeout=90)
    assert wait_for(lambda: whole.left() == {"jobs": [], "agg": [], "map": []}, timeout=30), whole.left()


def test_a_failed_epilog_leaves_nothing_once_the_sampler_sweeps(whole):
    """An epilog script before ours fails: slurmd drains the node and does not run ours.
    The sampler sees the job gone from squeue, finishes it and stores its summary."""
    bad = whole.c.dir / "etc" / "epilog.d" / "55-fails"
    bad.write_text("#!/bin/sh\nexit 1\n")
    bad.chmod(0o755)
    try:
        whole.script({"3": [{"t": 0, "sm": 65}]})
        jid = whole.c.sbatch("--gres=gpu:1", "--wrap", "sleep 2")
        assert wait_for(lambda: whole.left()["jobs"] == [f"{jid}.json"])
        whole.c.wait_node_state("n1", __import__("re").compile("drain.*"), timeout=30)
        assert wait_for(lambda: whole.left() == {"jobs": [], "agg": [], "map": []}, timeout=30), whole.left()
        part = dbd.parse(whole.comment(jid))["n1"]
        assert len(part["held"]) == 1 and part["dev"][part["held"][0]]["n"] >= 1
    finally:
        bad.unlink()
        whole.c.run(["scontrol", "update", "nodename=n1", "state=resume"])
        whole.c.wait_node_state("n1", "idle")


def test_two_mig_jobs_on_one_gpu_get_separate_figures(make_sandbox, sandbox_dir, job_users):
    n = AcctNode(make_sandbox, sandbox_dir, "h100-mig", "mig")
    try:
        # Slurm's indices 4 and 5 are GPU 2's 1g.10gb instances: GPU instances 7 and 8.
        n.script({"2/gi7": [{"t": 0, "sm": 70, "mem_mib": 3000}], "2/gi8": [{"t": 0, "sm": 10, "mem_mib": 500}]})
        a = n.c.sbatch("--gres=gpu:nvidia_h100_80gb_hbm3_1g.10gb:1", "--wrap", "sleep 3")
        b = n.c.sbatch("--gres=gpu:nvidia_h100_80gb_hbm3_1g.10gb:1", "--wrap", "sleep 3")
        assert wait_for(lambda: n.left()["map"] == ["2.7", "2.8"]), n.left()
        assert (n.map / "2.7").read_text().split() != (n.map / "2.8").read_text().split()
        for j in (a, b):
            n.c.wait_job(j)
        pa, pb = (dbd.parse(n.comment(j))["n1"] for j in (a, b))
        (ka, da), = pa["dev"].items()
        (kb, db), = pb["dev"].items()
        assert {ka, kb} == {"2/gi7", "2/gi8"}
        figures = {ka: da, kb: db}
        assert figures["2/gi7"]["sm"] == pytest.approx(70, abs=1) and figures["2/gi7"]["mem"] == 3000
        assert figures["2/gi8"]["sm"] == pytest.approx(10, abs=1) and figures["2/gi8"]["mem"] == 500
        assert figures["2/gi7"]["fr"] == pytest.approx(1 / 7, abs=0.01)
        assert wait_for(lambda: n.left() == {"jobs": [], "agg": [], "map": []}), n.left()
    finally:
        n.stop()


def test_two_gres_mps_jobs_on_one_gpu_are_split_by_process(make_sandbox, sandbox_dir, job_users):
    """gres/mps: two jobs on one GPU (Slurm's default one_sharing puts every MPS job
    of a node on the GPU already in use), only one computing.  The newest job got
    the whole GPU's use and energy, the computing one was "used but not allocated".
    With proctrack/cgroup each job's process is in its job cgroup, which the
    sampler reads from the real /proc.

    gres/shard goes through the same code (a GPU held by two jobs), but cannot
    be shown here: the only machine model whose CPUs match this host's for
    task/cgroup (mini-2numa, one core per socket) makes Slurm give each shard
    job the GPU local to its own socket (_pick_specific_topo)."""
    import random
    import string
    if not Path("/sys/fs/cgroup/freezer").is_dir() and not Path("/sys/fs/cgroup/cgroup.procs").exists():
        pytest.skip("no cgroup filesystem")
    prefix = "a" + "".join(random.choices(string.ascii_lowercase, k=5))   # cgroups are named by node
    n = AcctNode(make_sandbox, sandbox_dir, "mini-2numa", "mps", cgroup=True, node_prefix=prefix,
                 gres_options={"mps_count": 100})
    try:
        pids = n.files / "pids"
        pids.mkdir(mode=0o777)
        pids.chmod(0o777)
        jobs = [n.c.sbatch("--gres=mps:50", "--wrap", f"echo $$ >{pids}/$SLURM_JOB_ID; exec sleep 6",
                           user=u) for u in ("sgtest1", "sgtest2")]
        regs = [n.acct / "jobs" / f"{j}.json" for j in jobs]
        assert wait_for(lambda: all(r.exists() for r in regs), timeout=60), n.left()
        reg = [json.loads(r.read_text()) for r in regs]
        assert reg[0]["devices"] == reg[1]["devices"] and len(reg[0]["devices"]) == 1, reg
        assert reg[0]["shared"] is True and reg[1]["shared"] is True      # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
        gpu = reg[0]["devices"][0]
        pid = wait_for(lambda: (pids / str(jobs[0])).exists() and (pids / str(jobs[0])).read_text().strip())
        assert pid, "the first job did not start"
        n.script({gpu: [{"t": 0, "sm": 70, "mem_mib": 3000, "power_w": 400,
                         "pids": [{"pid": int(pid), "sm": 70, "mem_mib": 3000}]}]})
        for j in jobs:
            n.c.wait_job(j)
        a, b = (dbd.parse(n.comment(j))[n.node.lower()]["dev"][gpu] for j in jobs)
        assert "leak" not in a and "leak" not in b, (a, b)
        # Each job shared the GPU (its part 0.5) but for the samples it had it alone: the
        # one whose prolog ran first at the start, the one that started later at the end
        # (both sleep 6 s; on a loaded machine their starts lie a sample or more apart,
        # and both then read 0.5238: 20 shared samples of 21).
        assert a["sh"] == b["sh"] == 1 and min(a["fr"], b["fr"]) >= 0.5 and max(a["fr"], b["fr"]) < 1, (a, b)
        assert a["smx"] == 70 and a["idle"] < 1 and a["mem"] == 3000, a
        assert b["smx"] == 0 and b["idle"] == 1.0 and b["mem"] == 0, b
        assert a["j"] > b["j"], (a, b)
        rep = n.cli("job", "report", str(jobs[1]))
        assert rep.returncode == 0, rep.stderr
        assert f"GPU {gpu} on {n.node}: shared with other jobs; SM, memory and energy are this job's share " \
               "(by process)" in rep.stdout, rep.stdout
        assert f"GPU {gpu} on {n.node}: idle (100% of samples)" in rep.stdout, rep.stdout
        assert wait_for(lambda: n.left() == {"jobs": [], "agg": [], "map": []}), n.left()
    finally:
        n.stop()
