"""A job's leftovers (health/userproblem.py): found, drained apart, resumed once clean.

NVML is the simulator over the recorded mini-2numa machine; a "process on
the GPU" is the simulator's process list (a live pid given a context on a
GPU, as cuInit would); Slurm is a fake runner.run serving recorded
``scontrol show node -o`` text.
"""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_gpu import runner
from slurm_gpu.health import engine, userproblem as up
from slurm_gpu.health.nodestate import Memory, decide, parse_show_node
from slurm_gpu.health.settings import HealthSettings, RepairSettings
from slurm_gpu.hw import nvml_health
from slurm_gpu.hw.gpus_nvml import NvmlGpus
from slurm_gpu_devkit.sim import open_sim
from slurm_gpu_devkit.sim.nvml import add_process
from slurm_gpu_devkit.sim.state import init_state_for_machine
from paths import ROOT

DATA = ROOT / "tests" / "data"
MACHINE = DATA / "machines" / "mini-2numa"
SC = DATA / "xid" / "scontrol"
BUS0 = "0000:ad:00.0"


class Slurm:
    def __init__(self, state: str = "IDLE", reason: str | None = None) -> None:
        self.text = re.sub(r"^NodeName=\S+", "NodeName=n1", (SC / "idle.txt").read_text())
        self.text = re.sub(r"State=\S+", f"State={state}", self.text)
        self.set_reason(reason)
        self.updates: list[list[str]] = []

    def set_reason(self, reason: str | None) -> None:
        self.text = re.sub(r" Reason=.*$", "", self.text.rstrip("\n"))
        self.text += (f" Reason={reason} [root@2026-11-22T05:20:00]" if reason else "") + "\n"

    @property
    def node(self):
        return parse_show_node(self.text)

    def run(self, argv, timeout, **kw):
        argv = list(argv)
        if argv[1:3] == ["show", "node"]:
            return runner.Completed(tuple(argv), 0, self.text, "")
        if argv[0].endswith("squeue"):           # [health] on_fatal after a fatal drain: no job runs here
            return runner.Completed(tuple(argv), 0, "", "")
        assert argv[1] == "update", argv
        self.updates.append(argv)
        base = re.search(r"State=([A-Z_]+)", self.text).group(1)
        if "state=drain" in argv:
            self.text = re.sub(r"State=\S+", f"State={base}+DRAIN", self.text)
            self.set_reason(next(a for a in argv if a.startswith("reason="))[7:])
        else:
            self.text = re.sub(r"State=\S+", f"State={base}", self.text)
            self.set_reason(None)
        return runner.Completed(tuple(argv), 0, "", "")


@pytest.fixture
def sim(tmp_path):
    path = tmp_path / "sim.json"
    init_state_for_machine(str(MACHINE), str(path))
    return open_sim(str(path))


@pytest.fixture
def proc():
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


def gpu(pids=(), used_mib=0, bus=BUS0):
    return SimpleNamespace(bus_id=bus, lost=None, processes=tuple((p, None) for p in pids),
                           memory_used=used_mib * 1024 * 1024)


def test_leftovers_count_the_users_processes_and_held_memory():
    uid_of = {10: 1001, 11: 0, 12: 2002}.get
    assert up.leftovers([gpu([10, 11])], 1001, uid_of=uid_of) == [f"process 10 on GPU {BUS0}"]
    assert up.leftovers([gpu([11, 12])], 1001, uid_of=uid_of) == []          # root's, another user's
    assert up.leftovers([gpu([99])], 1001, uid_of=lambda p: None) == [f"process 99 on GPU {BUS0}"]
    assert up.leftovers([gpu(used_mib=4096)], 1001) == [f"4096 MiB held on GPU {BUS0} with no process left"]
    assert up.leftovers([gpu(used_mib=3)], 1001) == []


def test_simulator_lists_only_live_processes(sim, proc):
    add_process(sim, 0, proc.pid, 512)
    h = nvml_health.read_health(sim, include_processes=True)
    assert h.gpus[0].processes == ((proc.pid, 512 * 1024 * 1024),) and h.gpus[1].processes == ()
    assert h.gpus[0].memory_used == 512 * 1024 * 1024
    proc.kill()
    proc.wait()
    h = nvml_health.read_health(sim, include_processes=True)
    assert h.gpus[0].processes == () and h.gpus[0].memory_used == 0



def test_simulator_lists_no_zombie(sim, proc):
    """A process that exited but is not reaped yet (a zombie) holds no GPU
    context: the driver frees it at exit, as NVML then shows."""
    add_process(sim, 0, proc.pid, 512)
    proc.kill()
    while open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    h = nvml_health.read_health(sim, include_processes=True)
    assert h.gpus[0].processes == () and h.gpus[0].memory_used == 0

def _opts(tmp_path, sim):
    s = HealthSettings(kernel_log=str(tmp_path / "kern.log"), clean_runs_to_resume=3)
    return engine.Options(node="n1", settings=s, state_dir=str(tmp_path / "run"), only=["gpu.xid", "gpu.recovery"],
                          nvml_opener=lambda: NvmlGpus(sim),
                          repair=RepairSettings(state_dir=str(tmp_path / "var"), user_problem=True))


def _marker(tmp_path, reason):
    path = up.marker_path(str(tmp_path / "run"), "n1")
    up.save_marker(path, up.Marker(reason, "77", 0, (BUS0,)))
    return Path(path)


def test_user_problem_resumes_on_the_first_clean_run(tmp_path, sim, proc, monkeypatch):
    reason = up.reason_for("77", [f"process {proc.pid} on GPU {BUS0}"])
    slurm = Slurm("IDLE+DRAIN", reason)
    monkeypatch.setattr(runner, "run", slurm.run)
    (tmp_path / "kern.log").write_text("")
    add_process(sim, 0, proc.pid)
    marker = _marker(tmp_path, reason)
    for _ in range(3):
        r = engine.run(_opts(tmp_path, sim))
        assert any("stays drained" in n for n in r.notes), r.notes
    assert slurm.node.reason == reason and slurm.updates == [] and marker.exists()
    proc.kill()
    proc.wait()
    r = engine.run(_opts(tmp_path, sim))
    assert r.action == "resume" and not slurm.node.drained and not marker.exists()
    assert any("GPUs are clean" in n for n in r.notes)


def test_node_fault_replaces_user_problem_and_needs_clean_runs(tmp_path, sim, proc, monkeypatch):
    reason = up.reason_for("77", [f"process {proc.pid} on GPU {BUS0}"])
    slurm = Slurm("IDLE+DRAIN", reason)
    monkeypatch.setattr(runner, "run", slurm.run)
    marker = _marker(tmp_path, reason)
    (tmp_path / "kern.log").write_text("[1.0] NVRM: Xid (PCI:0000:ad:00): 79, GPU has fallen off the bus.\n")
    r = engine.run(_opts(tmp_path, sim))
    assert r.action == "drain" and slurm.node.reason.startswith("slurm-gpu: gpu.xid: Xid 79")
    assert not marker.exists()
    engine.run(_opts(tmp_path, sim))
    assert slurm.node.drained                      # 1 clean run is not enough for a node fault


def test_admin_resume_or_redrain_drops_the_marker(tmp_path, sim, proc, monkeypatch):
    reason = up.reason_for("77", [f"process {proc.pid} on GPU {BUS0}"])
    slurm = Slurm("IDLE+DRAIN", "admin: looking at it")
    monkeypatch.setattr(runner, "run", slurm.run)
    (tmp_path / "kern.log").write_text("")
    marker = _marker(tmp_path, reason)
    engine.run(_opts(tmp_path, sim))
    assert not marker.exists() and slurm.updates == [] and slurm.node.reason == "admin: looking at it"


def test_decide_replaces_only_a_user_problem_reason():
    ns = parse_show_node("NodeName=n1 State=IDLE+DRAIN Reason=slurm-gpu: user-problem: job 1 left x [root@t]")
    p = decide(ns, "slurm-gpu: gpu.xid: Xid 79", Memory(drained_reason=ns.reason), 3)
    assert p.action == "drain" and p.reason == "slurm-gpu: gpu.xid: Xid 79"
    ns2 = parse_show_node("NodeName=n1 State=IDLE+DRAIN Reason=slurm-gpu: gpu.ecc: x [root@t]")
    assert decide(ns2, "slurm-gpu: gpu.xid: y", Memory(drained_reason=ns2.reason), 3).action == "none"


def test_drain_never_overwrites_someone_elses_reason(monkeypatch):
    slurm = Slurm("IDLE+DRAIN", "admin")
    monkeypatch.setattr(runner, "run", slurm.run)
    assert up.drain("n1", "slurm-gpu: user-problem: job 1 left x", 5).startswith("not drained")
    slurm = Slurm("ALLOCATED")
    monkeypatch.setattr(runner, "run", slurm.run)
    assert up.drain("n1", "slurm-gpu: user-problem: job 1 left x", 5) == "drained"
    assert slurm.node.reason == "slurm-gpu: user-problem: job 1 left x"


def test_a_user_problem_drains_over_a_reason_that_holds_nothing(monkeypatch):
    # 24.11.5 keeps Reason= after a resume from DRAINING: the node runs jobs, so
    # the epilog's user-problem drain replaces that text as the health check does
    for state in ("IDLE", "MIXED"):
        slurm = Slurm(state, "slurm-gpu: gpu.xid: Xid 79 on 0000:02:00.0")
        monkeypatch.setattr(runner, "run", slurm.run)
        assert up.drain("n1", "slurm-gpu: user-problem: job 1 left x", 5) == "drained"
        assert slurm.node.reason == "slurm-gpu: user-problem: job 1 left x"
    # failed, down or drained: left alone, whatever the base state says
    for state, what in (("IDLE+FAIL", "flagged"), ("FAIL", "flagged"), ("FAILING", "flagged"),
                        ("DOWN", "flagged"), ("DOWN+NOT_RESPONDING", "flagged"), ("DRAINED", "drained")):
        slurm = Slurm(state, "admin")
        monkeypatch.setattr(runner, "run", slurm.run)
        assert up.drain("n1", "slurm-gpu: user-problem: job 1 left x", 5) == f"not drained: node already {what} (admin)"
        assert slurm.updates == []


@pytest.mark.parametrize("text", ["{", "[]", '{"reason": "admin", "gpus": []}', '{"reason": "slurm-gpu: user-problem: x"}'])
def test_malformed_marker_is_not_acted_on(tmp_path, text):
    p = tmp_path / "m.json"
    p.write_text(text)
    assert up.load_marker(str(p)) is None


def test_a_process_in_another_jobs_cgroup_is_no_leftover_of_this_job(tmp_path):
    """The same user's other job, still running, that leaked onto this job's GPU
    (devices not constrained): its process is in that job's cgroup, so it is
    not this job's leftover.  One in this job's own directory (job_<id>, or its
    SLUID on 26.05), or in no job's (escaped to a login session or the user's
    own subtree, whatever names it made there), still is."""
    scope = "0::/system.slice/n1_slurmstepd.scope"
    cgroups = {10: f"{scope}/job_7/step_batch/user/task_0\n",           # this job
               11: f"{scope}/job_8/step_0/user/task_0\n",               # the user's other job
               12: f"{scope}/sEKNKTV3WPV500/step_batch/user/task_0\n",  # this job on 26.05 (its SLUID)
               13: f"{scope}/s0123456789ABC/step_0/user/task_0\n",      # another job on 26.05
               14: "0::/user.slice/user-1001.slice/user@1001.service/app.slice"
                   "/system.slice/n1_slurmstepd.scope/job_8/step_0/user/task_0\n"}   # escaped, named as job 8
    for pid, text in {**cgroups, 1: "0::/init.scope\n"}.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    elsewhere = up.in_other_job("7", "sEKNKTV3WPV500", proc=str(tmp_path))
    found = up.leftovers([gpu(cgroups)], 1001, uid_of=lambda p: 1001, elsewhere=elsewhere)
    assert found == [f"processes 10,12,14 on GPU {BUS0}"]
    # Before 26.05 (no SLUID): only job_7 is this job's.
    assert up.leftovers([gpu([10, 12, 99])], 1001, uid_of=lambda p: 1001,
                        elsewhere=up.in_other_job("7", None, proc=str(tmp_path))) == \
        [f"processes 10,99 on GPU {BUS0}"]
