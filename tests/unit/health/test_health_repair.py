"""The repair ladder (health/repair.py) walked with a fault overlay, across simulated reboots.

NVML is the recorded h100-sxm-8x snapshot, replayed with a fault overlay
(the GPU falls off the bus); the kernel log carries the Xid 79; Slurm is a
fake runner.run serving recorded ``scontrol show node -o`` text and applying
``update``/``reboot`` the way slurmctld does; ``nvidia-smi -r`` is answered
by the same fake.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slurm_gpu import runner
from slurm_gpu.health import engine, repair
from slurm_gpu.health.nodestate import parse_show_node
from slurm_gpu.health.prom import render
from slurm_gpu.health.settings import HealthSettings, RepairSettings
from slurm_gpu.hw import kmsg
from slurm_gpu.jobs.state import gpus_held
from slurm_gpu.hw import snapshot as snap
from slurm_gpu.hw.gpus_nvml import NvmlGpus
from paths import ROOT

DATA = ROOT / "tests" / "data"
SNAP = str(DATA / "machines" / "h100-sxm-8x" / "snapshot.json")
SC = DATA / "xid" / "scontrol"
BUS = "0000:18:00.0"
UUID = "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"
XID79 = "[74889.644138] NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n"
LOST = {"gpus": {BUS: {"lost": True}}, "comment": "GPU 0 fell off the bus (Xid 79)"}


class Cluster:
    """slurmctld for one node, nvidia-smi, and the machine's boot id."""

    def __init__(self) -> None:
        self.text = re.sub(r"^NodeName=\S+", "NodeName=n1", (SC / "idle.txt").read_text())
        self.calls: list[list[str]] = []
        self.boot = "boot-1"
        self.overlay: dict | None = None
        self.reset_rc = 0
        self.reset_fixes = False        # whether nvidia-smi -r brings the GPU back
        self.dcgm = "dcgm4-r2-fail.json"   # what dcgmi diag -j prints

    def set_state(self, state: str) -> None:
        self.text = re.sub(r"State=\S+", f"State={state}", self.text)

    @property
    def node(self):
        return parse_show_node(self.text)

    def _reason(self, reason: str | None) -> None:
        self.text = re.sub(r" Reason=.*$", "", self.text.rstrip("\n"))
        self.text += (f" Reason={reason} [root@2026-11-22T05:20:00]" if reason else "") + "\n"

    def run(self, argv, timeout, **kw):
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == repair.NVIDIA_SMI:
            if self.reset_rc == 0 and self.reset_fixes:
                self.overlay = None
            return runner.Completed(tuple(argv), self.reset_rc,
                                    f"GPU {argv[-1]} was successfully reset.\n" if self.reset_rc == 0 else "",
                                    "" if self.reset_rc == 0 else "Unable to reset GPU\n")
        if argv[1:3] == ["show", "node"]:
            return runner.Completed(tuple(argv), 0, self.text, "")
        if argv[0].endswith("dcgmi"):
            return runner.Completed(tuple(argv), 0, (DATA / "dcgm" / self.dcgm).read_text(), "")
        if argv[0].endswith("squeue"):           # [health] on_fatal after a fatal drain: no job runs here
            return runner.Completed(tuple(argv), 0, "", "")
        st = re.search(r"State=(\S+)", self.text).group(1)
        parts = st.split("+")
        if argv[1] == "update":
            if "state=drain" in argv:
                self.set_state("+".join(dict.fromkeys(parts + ["DRAIN"])))
                self._reason(next(a for a in argv if a.startswith("reason="))[7:])
            elif "state=resume" in argv:
                self.set_state(parts[0])
                self._reason(None)
            return runner.Completed(tuple(argv), 0, "", "")
        if argv[1] == "reboot":
            self.set_state("+".join(dict.fromkeys(parts + ["DRAIN", "REBOOT_REQUESTED"])))
            self._reason(next(a for a in argv if a.startswith("reason="))[7:])
            return runner.Completed(tuple(argv), 0, "", "")
        raise AssertionError(argv)

    def reboot(self) -> None:
        """The node reboots: nextstate=RESUME puts it back in service, with a new boot id."""
        assert "REBOOT_REQUESTED" in self.node.flags
        self.set_state("IDLE")
        self._reason(None)
        self.boot = self.boot[:-1] + str(int(self.boot[-1]) + 1)

    def resets(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == repair.NVIDIA_SMI]

    def reboots(self) -> list[list[str]]:
        return [c for c in self.calls if len(c) > 1 and c[1] == "reboot"]


@pytest.fixture
def cluster(monkeypatch):
    c = Cluster()
    monkeypatch.setattr(runner, "run", c.run)
    monkeypatch.setattr(kmsg, "boot_id", lambda: c.boot)
    return c


def _opts(tmp_path: Path, c: Cluster, rs: RepairSettings) -> engine.Options:
    s = HealthSettings(kernel_log=str(tmp_path / "kern.log"), clean_runs_to_resume=2)

    def opener():
        return NvmlGpus(snap.replay_api(snap.read_snapshot(SNAP), SNAP, c.overlay))

    return engine.Options(node="n1", settings=s, state_dir=str(tmp_path / "run"),
                          only=["gpu.xid", "gpu.recovery"], nvml_opener=opener, repair=rs,
                          job_gpus=lambda: gpus_held(str(tmp_path / "jobs")))


def _xid(tmp_path: Path) -> None:
    with open(tmp_path / "kern.log", "a") as f:
        f.write(XID79)


def _job_holds_gpu(tmp_path: Path, jobid: str) -> Path:
    d = tmp_path / "jobs" / "jobs"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    (tmp_path / "jobs").chmod(0o755)
    p = d / f"{jobid}.json"
    p.write_text(json.dumps({"jobid": jobid, "gpus": [{"index": 0, "uuid": UUID}]}))
    p.chmod(0o600)
    return p


def _steps(tmp_path: Path) -> list[tuple[str, str]]:
    log = Path(repair.log_path(RepairSettings(state_dir=str(tmp_path / "var")), "n1"))
    return [(r["step"], r["result"]) for r in map(json.loads, log.read_text().splitlines())] \
        if log.exists() else []


def test_xid79_walks_reset_reboot_and_rma_across_reboots(tmp_path, cluster):
    rs = RepairSettings(reset=True, reboot=True, rma=True, rma_failures=3, state_dir=str(tmp_path / "var"))
    (tmp_path / "kern.log").write_text("")
    run = lambda: engine.run(_opts(tmp_path, cluster, rs))  # noqa: E731

    # A healthy run first: the ladder learns which UUID sits at which bus id.
    assert run().status == "ok" and _steps(tmp_path) == []

    # 1. Xid 79 while a job holds the GPU: drained, reset refused.
    cluster.set_state("ALLOCATED")
    job = _job_holds_gpu(tmp_path, "4242")
    cluster.overlay = LOST
    _xid(tmp_path)
    r = run()
    assert r.action == "drain" and cluster.node.reason.startswith("slurm-gpu: gpu.xid: Xid 79")
    assert _steps(tmp_path) == [("reset", "refused")]
    assert cluster.resets() == []
    assert any("refused: GPU busy: jobs run on the node (ALLOCATED)" in n for n in r.notes), r.notes

    # ...and again while the job still runs: still refused, still drained.
    run()
    assert cluster.resets() == [] and _steps(tmp_path)[-1] == ("reset", "refused")

    # 2. The job ends: the reset runs, a fresh NVML read still misses the GPU -> reboot.
    job.unlink(missing_ok=True)
    cluster.set_state("IDLE+DRAIN")
    r = run()
    assert cluster.resets() == [[repair.NVIDIA_SMI, "-r", "-i", BUS]]
    assert _steps(tmp_path)[-2:] == [("reset", "failed"), ("reboot", "requested")], _steps(tmp_path)
    (reboot,) = cluster.reboots()
    assert reboot[2:4] == ["ASAP", "nextstate=RESUME"] and reboot[-1] == "n1"
    assert reboot[4].startswith("reason=slurm-gpu: reboot: GPU 0000:18:00.0 Xid 79")
    assert "REBOOT_REQUESTED" in cluster.node.flags

    # Waiting for the reboot: nothing is touched, nothing asked twice.
    run()
    assert len(cluster.reboots()) == 1 and len(cluster.resets()) == 1

    # The reboot happens (simulated): the GPU is back, Slurm resumed the node.
    cluster.reboot()
    cluster.overlay = None
    r = run()
    assert r.status == "ok" and _steps(tmp_path)[-1] == ("reboot", "done")
    assert not cluster.node.drained

    # 3. The fault repeats (2nd failure) on the idle node: reset at once, and it helps
    #    this time; the node resumes after the clean runs, like any drain of ours.
    cluster.overlay = LOST
    cluster.reset_fixes = True
    _xid(tmp_path)
    run()
    assert _steps(tmp_path)[-1] == ("reset", "ok") and len(cluster.resets()) == 2
    assert cluster.node.drained
    run()
    assert cluster.node.drained
    run()
    assert not cluster.node.drained

    # 4. The 3rd failure of the same GPU in the window: RMA, never resumed.
    cluster.overlay = LOST
    _xid(tmp_path)
    r = run()
    assert _steps(tmp_path)[-1] == ("rma", "drained")
    assert cluster.node.reason.startswith(f"slurm-gpu: rma: GPU {BUS} ({UUID}) failed 3 times")
    for _ in range(5):
        r = run()
    assert cluster.node.reason.startswith("slurm-gpu: rma:") and cluster.node.drained
    assert len(cluster.resets()) == 2 and len(cluster.reboots()) == 1
    text = render(r)
    assert f'slurm_gpu_repair_rma{{node="n1",gpu="{BUS}",uuid="{UUID}"}} 1' in text
    assert 'slurm_gpu_repair_steps_total{node="n1",step="reset",result="refused"} 2' in text
    assert f'slurm_gpu_repair_gpu_failures{{node="n1",gpu="{BUS}",uuid="{UUID}"}} 3' in text


def test_all_steps_off_by_default_only_counts(tmp_path, cluster):
    rs = RepairSettings(state_dir=str(tmp_path / "var"))
    (tmp_path / "kern.log").write_text("")
    engine.run(_opts(tmp_path, cluster, rs))
    cluster.overlay = LOST
    for _ in range(4):
        _xid(tmp_path)
        engine.run(_opts(tmp_path, cluster, rs))
    assert cluster.resets() == [] and cluster.reboots() == []
    assert cluster.node.reason.startswith("slurm-gpu: gpu.xid:")
    st = repair.load(repair.state_path(rs, "n1"))
    # Off, the ladder learns no GPU identities (it writes nothing on a clean run):
    # failures are counted by bus id.
    assert len(st.failures[f"bus:{BUS}"]) == 4 and st.rma == {}
    assert ("reset", "skipped") in _steps(tmp_path) and ("reboot", "skipped") in _steps(tmp_path)


@pytest.mark.parametrize("state,reason,runs", [
    ("IDLE+DRAIN", "disk swap ticket 7", 1),                                      # an admin's drain
    ("IDLE+DRAIN+REBOOT_REQUESTED", "firmware update, reboot queued by the admin", 3),  # someone else's reboot
])
def test_admin_drain_and_other_reboots_are_never_touched(tmp_path, cluster, state, reason, runs):
    rs = RepairSettings(reset=True, reboot=True, rma=True, rma_failures=1, state_dir=str(tmp_path / "var"))
    (tmp_path / "kern.log").write_text("")
    engine.run(_opts(tmp_path, cluster, rs))
    cluster.set_state(state)
    cluster._reason(reason)
    cluster.overlay = LOST
    _xid(tmp_path)
    for _ in range(runs):
        engine.run(_opts(tmp_path, cluster, rs))
    assert cluster.node.reason == reason
    assert [c for c in cluster.calls if c[0] == repair.NVIDIA_SMI or c[1] in ("update", "reboot")] == []
    assert _steps(tmp_path)[-1] == ("rma", "recorded")


def test_our_reboot_is_asked_once(tmp_path, cluster):
    rs = RepairSettings(reboot=True, state_dir=str(tmp_path / "var"))
    (tmp_path / "kern.log").write_text("")
    engine.run(_opts(tmp_path, cluster, rs))
    cluster.overlay = LOST
    _xid(tmp_path)
    engine.run(_opts(tmp_path, cluster, rs))       # drained by us; reset off -> reboot step
    assert len(cluster.reboots()) == 1
    # Runs while it is pending: nothing more asked.
    engine.run(_opts(tmp_path, cluster, rs))
    assert len(cluster.reboots()) == 1


@pytest.mark.parametrize("text", ["{", "[]", '{"schema": 1, "failures": {"x": "y"}, "episodes": 3}',
                                  '{"schema": 99}'])
def test_corrupt_repair_state_is_dropped(tmp_path, text):
    p = tmp_path / "repair-state.n1.json"
    p.write_text(text)
    st = repair.load(str(p))
    assert not st.episodes and not st.holding


def test_first_step_follows_bucket_and_recovery_action():
    s = RepairSettings()
    assert repair.first_step("RESET_GPU", None, s) == "reset"
    assert repair.first_step("RESTART_BM", None, s) == "reset"
    assert repair.first_step("RESTART_BM", 2, s) == "reboot"        # NODE_REBOOT
    assert repair.first_step("CONTACT_SUPPORT", None, s) is None
    assert repair.first_step("CONTACT_SUPPORT", 1, s) == "reset"    # the driver says GPU_RESET


def test_dcgm_gate_holds_the_resume_until_the_diagnostic_passes(tmp_path, cluster, monkeypatch):
    from slurm_gpu.health import dcgm
    monkeypatch.setattr(dcgm, "dcgmi_path", lambda: "/usr/bin/dcgmi")
    rs = RepairSettings(dcgm_gate=1, state_dir=str(tmp_path / "var"))
    (tmp_path / "kern.log").write_text("")
    run = lambda: engine.run(_opts(tmp_path, cluster, rs))  # noqa: E731
    run()
    _xid(tmp_path)
    run()
    assert cluster.node.drained
    notes = []
    for _ in range(3):                    # clean runs, but DCGM fails GPU 1: no resume
        notes += run().notes
    assert cluster.node.drained and any("resume gate: dcgmi diag memory failed" in n for n in notes)
    assert [c for c in cluster.calls if c[0].endswith("dcgmi")][0][1:] == ["diag", "-r", "1", "-j"]
    cluster.dcgm = "dcgm4-r1-pass.json"
    run()
    run()
    assert not cluster.node.drained


def test_a_cancelled_reboot_is_left_to_whoever_cancelled_it(tmp_path, cluster):
    rs = RepairSettings(reboot=True, state_dir=str(tmp_path / "var"))
    (tmp_path / "kern.log").write_text("")
    run = lambda: engine.run(_opts(tmp_path, cluster, rs))  # noqa: E731
    run()
    cluster.overlay = LOST
    _xid(tmp_path)
    run()
    assert _steps(tmp_path)[-1] == ("reboot", "requested")
    cluster.set_state("IDLE+DRAIN")            # scontrol cancel_reboot: drained, same boot
    cluster.overlay = None
    run()
    assert _steps(tmp_path)[-1] == ("reboot", "cancelled")
    for _ in range(4):
        run()
    assert cluster.node.drained and cluster.node.reason.startswith("slurm-gpu: reboot:")
    assert len(cluster.reboots()) == 1


def _dcgmi_calls(cluster: Cluster) -> list[list[str]]:
    return [c[1:] for c in cluster.calls if c[0].endswith("dcgmi")]


def test_intrusive_dcgm_levels_run_only_on_an_idle_node(tmp_path, cluster, monkeypatch):
    """dcgmi diag -r 2/3 takes every GPU for minutes: never beside a job (level 1 runs as before)."""
    from slurm_gpu.health import dcgm
    monkeypatch.setattr(dcgm, "dcgmi_path", lambda: "/usr/bin/dcgmi")
    (tmp_path / "kern.log").write_text("")
    cluster.dcgm = "dcgm4-r1-pass.json"

    held: dict[str, str] = {}

    def run(level: int):
        o = _opts(tmp_path, cluster, RepairSettings(state_dir=str(tmp_path / "var")))
        o.settings.dcgm_level = level
        o.only = ["gpu.dcgm"]
        o.job_gpus = lambda: dict(held)      # our job state (jobs.state.gpus_held)
        return [f for f in engine.run(o).findings if f.check == "gpu.dcgm"]

    for state in ("ALLOCATED", "MIXED", "IDLE+COMPLETING", "MIXED+DRAIN"):
        cluster.set_state(state)
        found = run(2)
        assert [f.severity for f in found] == ["info"], (state, found)
        assert "deferred to an idle run: jobs run on the node" in found[0].message
    assert _dcgmi_calls(cluster) == []
    run(1)                                   # the quick level runs beside jobs, as before
    assert _dcgmi_calls(cluster) == [["diag", "-r", "1", "-j"]]

    cluster.set_state("IDLE")
    held[UUID] = "77"                        # Slurm says idle, our job state says job 77 holds a GPU
    found = run(3)
    assert "deferred to an idle run: job 77 holds a GPU" in found[0].message
    held.clear()
    found = run(3)
    assert "dcgmi diag passed" in found[0].message
    assert _dcgmi_calls(cluster)[-1] == ["diag", "-r", "3", "-j"]


def test_an_intrusive_dcgm_gate_waits_for_the_drained_node_to_empty(tmp_path, cluster, monkeypatch):
    from slurm_gpu.health import dcgm
    monkeypatch.setattr(dcgm, "dcgmi_path", lambda: "/usr/bin/dcgmi")
    rs = RepairSettings(dcgm_gate=2, state_dir=str(tmp_path / "var"))
    (tmp_path / "kern.log").write_text("")
    cluster.dcgm = "dcgm4-r1-pass.json"
    run = lambda: engine.run(_opts(tmp_path, cluster, rs))  # noqa: E731
    run()
    cluster.set_state("MIXED")
    _xid(tmp_path)
    run()
    assert cluster.node.drained and "MIXED" in cluster.text      # DRAINING: its jobs still run
    notes = []
    for _ in range(3):
        notes += run().notes
    assert cluster.node.drained and _dcgmi_calls(cluster) == []
    assert any("resume gate: dcgmi diag -r 2 waits for an idle node: jobs run on the node (MIXED)" in n
               for n in notes)
    cluster.set_state("IDLE+DRAIN")                               # the jobs ended: DRAINED
    run()
    assert _dcgmi_calls(cluster) == [["diag", "-r", "2", "-j"]]
    assert not cluster.node.drained


def _job_runs_on_gpu(tmp_path: Path, jobid: str) -> None:
    """A job state record as the prolog writes it (jobs/state.py), holding GPU 0."""
    from slurm_gpu.jobs import state
    st = state.new(jobid, uid=1000, gid=1000, user="alice")
    st.phase, st.gpus = state.Phase.READY, [{"index": 0, "uuid": UUID}]
    state.save(str(tmp_path / "jobs"), st)
    assert gpus_held(str(tmp_path / "jobs"))[UUID] == jobid


def _job_ends(tmp_path: Path, jobid: str) -> None:
    for p in (tmp_path / "jobs" / "jobs").glob(f"{jobid}.json*"):
        p.unlink()


def test_one_job_s_repeated_faults_count_once_toward_an_rma(tmp_path, cluster):
    # Issue 24 §5: a job that keeps causing reset-class Xids (its own doing, or
    # a user's attack) must not push a healthy GPU to RMA.  Failures under the
    # same job count once, and the ladder names the job.
    rs = RepairSettings(rma=True, rma_failures=3, state_dir=str(tmp_path / "var"))
    (tmp_path / "kern.log").write_text("")
    run = lambda: engine.run(_opts(tmp_path, cluster, rs))  # noqa: E731
    run()
    cluster.set_state("ALLOCATED")
    _job_runs_on_gpu(tmp_path, "4242")
    notes: list[str] = []
    for _ in range(4):
        _xid(tmp_path)
        notes += run().notes
    assert not cluster.node.reason.startswith("slurm-gpu: rma:")
    st = repair.load(repair.state_path(rs, "n1"))
    assert st.rma == {} and len(st.failures[UUID]) == 4
    assert st.failure_jobs[UUID] == ["4242"] * 4
    assert any("under job 4242 again" in n and "count once" in n for n in notes), notes
    assert _steps(tmp_path).count(("rma", "same job")) == 3

    # Another job's failure and one on the idle GPU are failures of their own: the 3rd is the RMA.
    _job_ends(tmp_path, "4242")
    _job_runs_on_gpu(tmp_path, "5151")
    _xid(tmp_path)
    run()
    assert not cluster.node.reason.startswith("slurm-gpu: rma:")
    _job_ends(tmp_path, "5151")
    _xid(tmp_path)
    run()
    assert cluster.node.reason.startswith(f"slurm-gpu: rma: GPU {BUS} ({UUID}) failed 3 times in 168 h, last Xid 79"), \
        cluster.node.reason
    st = repair.load(repair.state_path(rs, "n1"))
    assert st.rma[UUID]["jobs"] == ["4242", "5151"] and st.rma[UUID]["failures"] == 3


def test_the_rma_reason_names_the_job_of_the_last_failure(tmp_path, cluster):
    rs = RepairSettings(rma=True, rma_failures=2, state_dir=str(tmp_path / "var"))
    (tmp_path / "kern.log").write_text("")
    run = lambda: engine.run(_opts(tmp_path, cluster, rs))  # noqa: E731
    run()
    _xid(tmp_path)
    run()                                           # idle GPU: a failure of its own
    cluster.set_state("ALLOCATED")
    _job_runs_on_gpu(tmp_path, "777")
    _xid(tmp_path)
    run()
    assert cluster.node.reason.startswith(f"slurm-gpu: rma: GPU {BUS} ({UUID}) failed 2 times"), cluster.node.reason
    assert cluster.node.reason.endswith("last Xid 79 under job 777"), cluster.node.reason


def test_old_repair_state_without_jobs_still_loads(tmp_path):
    p = tmp_path / "repair-state.n1.json"
    p.write_text(json.dumps({"schema": 1, "failures": {UUID: [1.0, 2.0]}, "failure_jobs": {UUID: ["1"]}}))
    st = repair.load(str(p))
    assert st.failures[UUID] == [1.0, 2.0] and st.failure_jobs.get(UUID, []) in ([], ["", ""])
    p.write_text(json.dumps({"schema": 1, "failures": {UUID: [1.0]}, "failure_jobs": {UUID: ["1;rm -rf"]}}))
    assert repair.load(str(p)).failure_jobs.get(UUID, [""]) == [""]
