"""The accounting step driven without Slurm: sampler, prolog and epilog logic
over the simulator, 200 random job lifecycles with requeues and failed epilogs."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from slurm_gpu.acct import dbd, hooks
from slurm_gpu.acct.monitor import Monitor
from slurm_gpu.acct.settings import AcctSettings
from slurm_gpu.acct.store import Store
from slurm_gpu.hw.gpustats import StatsReader
from slurm_gpu_devkit.sim import SimNvml, load_facts
from slurm_gpu_devkit.sim.load import LOAD_SCHEMA
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"
T0 = 1_700_000_000.0
# h100-mig: GPUs 0-1 whole, GPUs 2-3 with MIG instances (GPU instance ids below).
DEVICES = ["0", "1", "2/gi2", "2/gi7", "2/gi8", "2/gi9", "3/gi2", "3/gi7"]


class Node:
    """A node: simulator, fake /proc, the set of jobs Slurm runs here, a fake slurmdbd."""

    def __init__(self, tmp: Path) -> None:
        self.sim = SimNvml.from_facts(load_facts(str(MACHINES / "h100-mig" / "facts.json")))
        self.sim.nvmlInit()
        self.clock = T0
        self.devices: dict[str, list] = {}
        self.proc = tmp / "proc"
        self.proc.mkdir()
        self.running: set[str] = set()
        self.db: dict[str, str] = {}
        self.s = AcctSettings(enabled=True, interval=10.0, dir=str(tmp / "acct"), proc_root=str(self.proc),
                              dcgm_mapping_dir=str(tmp / "map"), metrics_file=str(tmp / "gpu.prom"))
        self.store = Store(self.s.dir)
        self.mon = Monitor(self.s, self.store, StatsReader(self.sim), "n1", lambda: set(self.running),
                           now=lambda: self.clock, log=lambda m: None)
        self.mon.start()
        self._sync()

    def _sync(self) -> None:
        with self.sim.edit() as st:
            st["load"] = {"schema": LOAD_SCHEMA, "t0": T0, "devices": self.devices}
            st["clock"] = self.clock

    def script(self, key: str, sm: float, pids: list[int], mem_mib: int = 1000) -> None:
        self.devices[key] = [{"t": self.clock - T0, "sm": sm, "mem_mib": mem_mib,
                              "pids": [{"pid": p, "mem_mib": mem_mib} for p in pids]}]
        self._sync()

    def process(self, pid: int, jobid: str) -> None:
        (self.proc / str(pid)).mkdir(exist_ok=True)
        (self.proc / str(pid) / "cgroup").write_text(
            f"0::/system.slice/slurmstepd.scope/job_{jobid}/step_0/user/task_0\n")

    def advance(self, seconds: float = 10.0) -> None:
        self.clock += seconds
        self._sync()
        self.mon.tick()

    def process_sluid(self, pid: int, sluid: str) -> None:
        """A process in Slurm 26.05's SLUID-named cgroup v2 directory of a job."""
        (self.proc / str(pid)).mkdir(exist_ok=True)
        (self.proc / str(pid) / "cgroup").write_text(
            f"0::/system.slice/n1_slurmstepd.scope/{sluid}/step_0/user/task_0\n")

    def prolog(self, jobid: str, keys: list[str], sluid: str | None = None) -> None:
        self.running.add(jobid)
        order = DEVICES
        env = {"SLURM_JOB_ID": jobid, "SLURM_JOB_GPUS": ",".join(str(order.index(k)) for k in keys),
               "SLURM_JOB_USER": "u"}
        if sluid:
            env["SLURM_JOB_SLUID"] = sluid
        hooks.register(self.s, self.store, env, "n1", lambda: order, None, now=self.clock)

    def epilog(self, jobid: str) -> None:
        self.running.discard(jobid)
        hooks.finish(self.s, self.store, jobid, "n1", now=self.clock)

    def run_out(self, ticks: int, *jobids: str) -> list[dict]:
        """*ticks* sampling intervals, then each job's epilog: their summaries of n1 in slurmdbd."""
        for _ in range(ticks):
            self.advance()
        for jobid in jobids:
            self.epilog(jobid)
        return [dbd.parse(self.db[jobid])["n1"] for jobid in jobids]


@pytest.fixture
def node(tmp_path, monkeypatch):
    n = Node(tmp_path)

    def fake_store(settings, jobid, node_name, part, env=None):
        cur = n.db.get(jobid)
        if cur is None:
            return dbd.Outcome(False, "job not in slurmdbd yet")
        new = dbd.merged(cur, node_name, part)
        if new is None:
            return dbd.Outcome(False, "would alter", final=True)
        n.db[jobid] = new
        return dbd.Outcome(True)

    monkeypatch.setattr(dbd, "store", fake_store)
    return n


def test_loaded_gpus_busy_and_held_idle_gpu_idle(node):
    node.db["7"] = ""
    node.prolog("7", ["0", "1"])
    node.process(100, "7")
    node.script("0", 90, [100])
    node.script("1", 60, [100])
    # GPU 1 is the job's too, but job 8 holds "2/gi2" idle and leaks onto GPU 1.
    node.db["8"] = "nhc: fine"
    node.prolog("8", ["2/gi2"])
    node.process(200, "8")
    node.script("1", 60, [100, 200])
    s7, s8 = node.run_out(6, "7", "8")
    assert s7["dev"]["0"]["sm"] == 90.0 and s7["dev"]["1"]["sm"] == 60.0
    assert s7["dev"]["0"]["idle"] == 0.0 and s7["held"] == ["0", "1"]
    assert dbd.split(node.db["8"])[0] == "nhc: fine"       # another tool's text kept
    assert s8["dev"]["2/gi2"]["idle"] == 1.0 or s8["dev"]["2/gi2"]["sm"] is None
    assert s8["dev"]["1"]["leak"] == 1                     # seen through its process's cgroup
    assert "leak" not in s7["dev"]["1"]


def test_a_leak_is_seen_through_slurm_2605_sluid_cgroups(node):
    """Slurm 26.05 names a job's cgroup v2 directory by its SLUID, which does
    not hold the job id: the leak went unseen.  The prolog records the SLUID
    (SLURM_JOB_SLUID) and the sampler maps it back."""
    node.db["7"] = ""
    node.db["8"] = ""
    node.prolog("7", ["0"], sluid="sEKNKTV3WPV500")
    node.prolog("8", ["2/gi2"], sluid="sEKNKTV3WPV501")
    node.process_sluid(100, "sEKNKTV3WPV500")
    node.process_sluid(200, "sEKNKTV3WPV501")
    node.process_sluid(300, "sEKNKTV3WPV599")            # a job not registered here: nobody's
    node.script("0", 90, [100, 200, 300])
    s7, s8 = node.run_out(3, "7", "8")
    assert "leak" not in s7["dev"]["0"] and s7["dev"]["0"]["sm"] == 90.0
    assert s8["dev"]["0"]["leak"] == 1 and s8["dev"]["0"]["mem"] == 1000


@pytest.mark.parametrize("epilog_ran", [True, False])
def test_a_requeued_jobs_earlier_sluid_directories_stay_its(node, epilog_ran):
    """26.05 gives a job a new SLUID at each requeue (job_record_set_sluid(job_ptr,
    requeue=true), src/common/job_record.c), so one job id has several cgroup
    directories: a process the first run left behind, in the first SLUID's
    directory, is still the job's (here a leak onto job 8's GPU), whether the
    first run's epilog ran (its tombstone keeps the SLUID) or failed (the
    registration the prolog replaces does)."""
    first, second = "sEKNKTV3WPV500", "sEKNKTV3WPV5ZZ"
    node.db["7"] = ""
    node.db["8"] = ""
    node.prolog("7", ["0"], sluid=first)
    if epilog_ran:
        node.epilog("7")
    node.prolog("7", ["0"], sluid=second)                  # the requeued run, same GPU
    node.prolog("8", ["1"])
    node.process_sluid(100, first)                         # left by the first run
    node.process_sluid(101, second)
    node.script("0", 80, [101])
    node.script("1", 40, [100])
    s7, s8 = node.run_out(3, "7", "8")
    assert s7["dev"]["1"]["leak"] == 1 and s7["dev"]["1"]["mem"] == 1000
    assert s7["dev"]["0"]["sm"] == 80.0
    assert "leak" not in s8["dev"]["1"]


def test_a_requeued_jobs_sluids_are_bounded(node):
    """A job requeued many times keeps its last SLUIDs only (the registration stays small)."""
    for i in range(20):
        node.prolog("7", ["0"], sluid=f"sEKNKTV3WPV5{i:02d}")
        node.epilog("7")
    node.prolog("7", ["0"], sluid="sEKNKTV3WPV5ZZ")
    reg = node.store.read("jobs", "7")
    assert reg["sluid"] == "sEKNKTV3WPV5ZZ" and reg["sluids"][-1] == "sEKNKTV3WPV5ZZ"
    assert len(reg["sluids"]) == 16 and reg["sluids"][0] == "sEKNKTV3WPV505"


def test_a_malformed_sluid_is_not_recorded(node):
    node.prolog("9", ["0"], sluid="../../job_1")
    assert "sluid" not in node.store.read("jobs", "9")
    node.prolog("10", ["1"], sluid="sEKNKTV3WPV500")
    assert node.store.read("jobs", "10")["sluid"] == "sEKNKTV3WPV500"


def test_unreachable_dbd_keeps_the_summary_and_a_later_tick_stores_it(node):
    node.prolog("9", ["0"])
    node.script("0", 50, [])
    node.advance()
    node.advance()
    node.epilog("9")                                       # job not in the db yet
    assert node.store.ids("pending") == ["9"]
    node.db["9"] = ""
    for _ in range(7):
        node.advance()
    assert node.store.read("pending", "9")["confirmed"]        # stored, to be checked once more
    node.db["9"] = "other: late"                                 # a late record replaced it
    for _ in range(6):                                           # the check a minute later
        node.advance()
    other, ours = dbd.split(node.db["9"])
    assert other == "other: late" and ours["n1"]["dev"]["0"]["sm"] == 50.0   # put back
    assert node.store.ids("pending") == []
    assert dbd.parse(node.db["9"])["n1"]["dev"]["0"]["sm"] == 50.0


def test_two_hundred_random_lifecycles_leave_nothing_behind(node):
    rng = random.Random(14)
    free = list(DEVICES)
    live: dict[str, list[str]] = {}
    next_id, pid = 1000, 5000
    ended: set[str] = set()
    started = 0
    while started < 200 or live:
        op = rng.random()
        if started < 200 and free and op < 0.4:
            jid = str(next_id)
            next_id += 1
            started += 1
            keys = rng.sample(free, rng.randint(1, min(3, len(free))))
            for k in keys:
                free.remove(k)
            node.db[jid] = ""
            node.prolog(jid, keys)
            live[jid] = keys
            pid += 1
            node.process(pid, jid)
            node.script(keys[0], rng.choice([0, 30, 95]), [pid])
        elif live and op < 0.7:
            jid = rng.choice(sorted(live))
            kind = rng.random()
            if kind < 0.2:                                 # requeue: epilog fails, prolog runs again
                node.running.discard(jid)
                node.prolog(jid, live[jid])
                continue
            keys = live.pop(jid)
            free.extend(keys)
            for k in keys:
                node.devices.pop(k, None)
            if kind < 0.5:                                 # failed epilog: Slurm forgets the job
                node.running.discard(jid)
            else:
                node.epilog(jid)
            ended.add(jid)
        node.advance(rng.choice([5, 10, 10, 20]))
    for _ in range(12):                                    # the sampler's sweeps
        node.advance()
    assert node.store.ids("jobs") == [] and node.store.ids("agg") == []
    left = [p.name for p in Path(node.s.dcgm_mapping_dir).iterdir() if not p.name.startswith(".")]
    assert left == []
    assert node.store.ids("pending") == []
    assert all(j in node.db for j in ended)


def test_idle_policy_is_off_by_default_then_logs_flags_and_cancels(node, monkeypatch):
    node.prolog("21", ["0", "1"])
    node.script("0", 90, [])
    for _ in range(4):
        node.advance()
    assert "slurm_gpu_idle_held" in Path(node.s.metrics_file).read_text()
    assert 'slurm_gpu_idle_held{gpu="1"' in Path(node.s.metrics_file).read_text()
    assert not any(line.endswith(" 1") for line in Path(node.s.metrics_file).read_text().splitlines()
                   if line.startswith("slurm_gpu_idle_held"))               # off by default
    logged, ran = [], []
    node.mon.log = logged.append
    node.s.idle_minutes = 0.5                                             # 3 samples at 10 s
    node.s.idle_action = "cancel"
    import slurm_gpu.runner as runner
    monkeypatch.setattr(runner, "run", lambda argv, timeout, **kw: ran.append(list(argv)))
    node.advance()
    flagged = [l for l in Path(node.s.metrics_file).read_text().splitlines()
               if l.startswith("slurm_gpu_idle_held") and l.endswith(" 1")]
    assert len(flagged) == 1 and 'gpu="1"' in flagged[0]                  # GPU 0 is busy
    assert logged == ["slurm-gpu: monitor: job 21 has held GPU 1 idle for 0.5 min"]
    assert ran == [[node.s.scancel, "21"]]
    node.advance()
    assert len(logged) == 1 and len(ran) == 1                              # once per job and GPU


def _shared(node, key: str, procs: dict[int, float], power_w: float = 400.0) -> None:
    """GPU *key* with processes pid -> own SM %: the GPU's SM is their sum."""
    node.devices[key] = [{"t": node.clock - T0, "sm": min(sum(procs.values()), 100), "power_w": power_w,
                          "mem_mib": 1000 * len(procs),
                          "pids": [{"pid": p, "sm": sm, "mem_mib": 1000} for p, sm in procs.items()]}]
    node._sync()


def _energy(node, key: str) -> int:
    return int(node.sim.nvmlDeviceGetTotalEnergyConsumption(node.sim.nvmlDeviceGetHandleByIndex(int(key))))


def _jobs_7_and_8_on_gpu_0(node, procs: dict[int, tuple[str, float]], ticks: int) -> tuple[dict, dict, int]:
    """Jobs 7 and 8 both hold GPU 0 (gres/shard) with processes pid -> (job, SM %):
    their devices' summaries and the GPU's energy (J) over the ticks after the first."""
    for j in ("7", "8"):
        node.db[j] = ""
        node.prolog(j, ["0"])
    for pid, (job, _) in procs.items():
        node.process(pid, job)
    _shared(node, "0", {pid: sm for pid, (_, sm) in procs.items()})
    node.advance()
    e0 = _energy(node, "0")
    s7, s8 = node.run_out(ticks, "7", "8")
    return s7["dev"]["0"], s8["dev"]["0"], (_energy(node, "0") - e0) // 1000


def test_a_shared_gpu_is_split_by_process_and_the_idle_job_looks_idle(node):
    """gres/shard: jobs 7 and 8 both hold GPU 0.  Only 7 computes.  The newest
    (8) got the whole GPU's use and energy, and 7 was "used but not allocated"."""
    d7, d8, energy = _jobs_7_and_8_on_gpu_0(node, {100: ("7", 70.0)}, ticks=6)
    assert "leak" not in d7 and "leak" not in d8
    assert d7["sm"] == 70.0 and d7["idle"] == 0.0 and d7["mem"] == 1000 and d7["sh"] == 1
    assert d8["sm"] == 0.0 and d8["idle"] == 1.0 and d8["mem"] == 0 and d8["sh"] == 1
    assert d7["fr"] == d8["fr"] == 0.5
    assert d7["j"] == energy and d8["j"] == 0         # all of it the computing job's


def test_two_computing_jobs_share_energy_by_their_sm(node):
    d7, d8, energy = _jobs_7_and_8_on_gpu_0(node, {100: ("7", 60.0), 200: ("8", 20.0)}, ticks=4)
    assert (d7["sm"], d8["sm"]) == (60.0, 20.0)
    assert d7["j"] + d8["j"] in (energy, energy - 1)
    assert d7["j"] == pytest.approx(3 * d8["j"], abs=2)
    from slurm_gpu.acct import report
    view = report.job_view(report.JobRow("7", summary=dbd.parse(node.db["7"])), "7", None, None)
    assert "GPU 0 on n1: shared with other jobs; SM, memory and energy are this job's share (by process)" \
        in view["verdicts"]
    assert "(shared)" in report.format_job(view)


def test_a_gres_mps_job_alone_is_still_counted_by_its_processes(node):
    """gres/mps: the prolog's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE marks the GPU as shared
    even while the job is alone on it; another process on the GPU is not its use."""
    node.db["7"] = ""
    node.running.add("7")
    hooks.register(node.s, node.store, {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0",
                                        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}, "n1", lambda: DEVICES,
                   None, now=node.clock)
    node.process(100, "7")
    _shared(node, "0", {100: 30.0, 999: 50.0})          # 999: not a job's process
    d7 = node.run_out(3, "7")[0]["dev"]["0"]
    assert d7["sm"] == 30.0 and d7["sh"] == 1 and d7["fr"] == 1.0
