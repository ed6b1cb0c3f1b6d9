"""Prolog/epilog: MPS daemon and MIG layout per job, failure policy, idempotent epilog.

These run the real code against the NVML simulator and NVIDIA's MPS control daemon
(started as the job user through runner.run(run_as=...)), as root.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_gpu.errors import InputError
from slurm_gpu.hw import nvml_constants
from slurm_gpu.hw.nvml_api import NVMLError
from slurm_gpu.jobs import lifecycle, migjob
from slurm_gpu.jobs import state as js
from slurm_gpu import procfs
from slurm_gpu.jobs.mps import daemon_pids
from slurm_gpu.jobs.settings import JobsSettings, MigSettings, MpsSettings
from slurm_gpu.jobs.state import JobFailed
from slurm_gpu.mig import blockers, instances
from slurm_gpu.hw import backend
from slurm_gpu_devkit.sim.mig import open_mig_sim, set_holder
from mpsbinary import mps_control_for_jobs
from useragent import PLANT_DIRS, REPLACE_SOCKETS, Agent
from slurm_gpu_devkit.sim.state import init_state_for_machine
from paths import ROOT

MACHINE = ROOT / "tests" / "data" / "machines" / "h100-mig"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="prolog/epilog run as root")


def _alive(pid: int) -> bool:
    """The process runs: it is there and no zombie."""
    return procfs.state(pid) not in (None, "Z")


def _uid(name: str) -> int:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        pytest.skip(f"user {name} missing")


def own_node_name(base: Path) -> None:
    """Name the test's node after its directory *base*: the name names the MPS
    daemons' holding cgroups on this host's real cgroup filesystem, so each
    test's are its own and runs side by side never meet."""
    from slurm_gpu import hostctx
    hostctx.node_name = f"sgt{os.getpid()}-{base.name[-8:]}"


def close_node(base: Path, mps_base_dir: str) -> None:
    """A test node's end: its MPS daemons killed, every holding cgroup under
    its name emptied and removed (a test that failed or skipped half-way left
    its job's), then its directory *base*."""
    from slurm_gpu import hostctx
    from slurm_gpu.jobs import jobcgroup
    for d in Path(mps_base_dir).glob("*/pipe") if Path(mps_base_dir).exists() else []:
        for p in daemon_pids(d):
            os.kill(p, 9)
    shutil.rmtree(base, ignore_errors=True)
    for top in {os.path.dirname(h) for h in jobcgroup.hold_dirs("1", hostctx.node_name or "")}:
        held = [str(h) for h in Path(top).glob("job_*") if h.is_dir()]
        jobcgroup.kill_all(held, 2.0)
        jobcgroup.remove(held)


class Env:
    """A node: simulator state, MPS control daemon, state dir, settings."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="sg-jobs-test-"))
        os.chmod(self.base, 0o755)
        self.sim = str(self.base / "sim.json")
        init_state_for_machine(str(MACHINE), self.sim)
        st = json.loads(Path(self.sim).read_text())
        # GPU 1: MIG on and empty; GPU 3's recorded 4g at 4:4 is not a real H100
        # placement ({0}:4 only), so give it a real baseline: 3g at 4 + 2g at 0.
        st["facts"]["gpus"][1]["mig"] = {"mode": 1, "pending": 1, "max_devices": 7, "instances": []}
        st["facts"]["gpus"][3]["mig"]["instances"] = []
        Path(self.sim).write_text(json.dumps(st))
        gpus = self.api()
        from slurm_gpu.mig.planner import plan
        from slurm_gpu.mig.profiles import find_model
        for p in plan("3g.40gb,2g.20gb", find_model("h100-80gb"))[0]:
            instances.create_placement(gpus, 3, p, "setup")
        self.ctl = mps_control_for_jobs(self.base / "nvidia-cuda-mps-control")
        self.jobs = JobsSettings(epilog_kill_wait=1.0)
        self.mps = MpsSettings(control=str(self.ctl), base_dir=str(self.base / "mps"),
                               start_timeout=10, quit_timeout=3)
        self.mig = MigSettings()
        self.state_dir = str(self.base / "state")
        self.logs: list[str] = []
        own_node_name(self.base)

    def api(self):
        return backend.open_gpus(backend.GpuSource("sim", self.sim))

    def node(self):
        """The simulated machine's GPUs (NVML index, minor, UUID) on a 2-core model."""
        api = open_mig_sim(self.sim)
        cores = [SimpleNamespace(index=0, pus=(0,)), SimpleNamespace(index=1, pus=(1,))]
        gpus = []
        for i in range(api.nvmlDeviceGetCount()):
            h = api.nvmlDeviceGetHandleByIndex(i)
            gpus.append(SimpleNamespace(index=i, minor=api.nvmlDeviceGetMinorNumber(h),
                                        uuid=api.nvmlDeviceGetUUID(h), name=api.nvmlDeviceGetName(h),
                                        cores=(i % 2,), numa_nodes=()))
        return SimpleNamespace(cores=cores, gpus=gpus, numa_nodes=())

    def ctx(self, **env: str) -> lifecycle.Context:
        e = {"SLURM_JOB_ID": "100", "SLURM_JOB_UID": str(_uid("sgtest1")),
             "SLURM_JOB_GID": str(pwd.getpwnam("sgtest1").pw_gid), "SLURM_JOB_USER": "sgtest1"}
        e.update(env)
        return lifecycle.Context(e, self.jobs, self.mps, self.mig, self.state_dir, self.api,
                                 self.node, self.logs.append)

    def layout(self, gpu: int) -> list[tuple[int, int, tuple]]:
        return sorted((e.profile_id, e.start, e.cis) for e in instances.list_instances(self.api(), gpu))

    def leftovers(self, jobid: str = "100") -> list[str]:
        out = []
        if js.load(self.state_dir, jobid) is not None:
            out.append("state file")
        if (Path(self.mps.base_dir) / jobid).exists():
            out.append("mps dir")
        pipe = Path(self.mps.base_dir) / jobid / "pipe"
        if daemon_pids(pipe):
            out.append("daemon")
        if any(os.path.exists(h) for h in self.hold(jobid)):
            out.append("holding cgroup")
        return out

    def close(self) -> None:
        close_node(self.base, self.mps.base_dir)

    def hold(self, jobid: str = "100") -> list[str]:
        """The job's holding cgroup on this host (no job cgroup: no PrologFlags=RunInJob)."""
        from slurm_gpu import hostctx
        from slurm_gpu.jobs import jobcgroup
        return jobcgroup.hold_dirs(jobid, hostctx.node_name or "")


@pytest.fixture()
def node():
    n = Env()
    yield n
    n.close()


def health_ctx(node: Env, **env: str) -> lifecycle.Context:
    """The context of a job on *node* with a [health] state dir: its epilog looks for leftovers."""
    c = node.ctx(**env)
    c.health_state_dir, c.node_name = str(node.base / "health"), "n1"
    return c


def processes_asked(monkeypatch) -> list[list[int]]:
    """NVML's process lists faked empty; returns the GPU indices each read asks about."""
    from slurm_gpu.hw import nvml_health
    seen: list[list[int]] = []

    def read_processes(gpus, indices):
        seen.append(list(indices))
        return nvml_health.NvmlHealth(available=True)
    monkeypatch.setattr(nvml_health, "read_processes", read_processes)
    return seen


def test_no_options_is_a_no_op(node: Env) -> None:
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="0")) == 0
    assert not Path(node.state_dir).exists()
    assert lifecycle.epilog(node.ctx()) == 0


def test_mps_job_lifecycle(node: Env) -> None:
    ctx = node.ctx(SLURM_JOB_GPUS="0,1", SPANK_SLURM_GPU_MPS="40")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st.phase == "ready" and st.mps["ready"]
    pipe = Path(st.mps["pipe_dir"])
    for d in (pipe, Path(st.mps["log_dir"])):
        s = os.lstat(d)
        assert (s.st_uid, stat.S_IMODE(s.st_mode)) == (_uid("sgtest1"), 0o700)
    assert os.lstat(node.mps.base_dir).st_uid == 0
    pids = daemon_pids(pipe)
    assert pids and st.mps["pids"] == pids
    status = Path(f"/proc/{pids[0]}/status").read_text()
    assert f"Uid:\t{_uid('sgtest1')}" in status          # never root
    assert "Cpus_allowed_list:\t0-1" in status          # GPUs 0,1 are local to CPUs 0 and 1
    env = js.task_env(st, 0, 2)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    # the percentage reached the daemon
    r = subprocess.run([str(node.ctl)], input="get_default_active_thread_percentage\n",
                       env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}, capture_output=True,
                       text=True, user="sgtest1")
    assert r.stdout.strip() == "40.0"
    assert lifecycle.epilog(ctx) == 0
    assert node.leftovers() == [] and not any(_alive(p) for p in pids)
    assert lifecycle.epilog(ctx) == 0                  # twice: still fine


def test_mps_server_that_fails_to_start_leaves_a_clean_job(node: Env) -> None:
    """A job's CUDA client makes the control daemon start a server; on a
    node whose GPU cannot serve it, NVIDIA's daemon logs "Starting new server
    N for user U" then "Server N exited with status 1" (what the real binary
    does on a machine without a GPU).  The daemon itself stays up, the job
    goes on, and the epilog ends it cleanly: no drain, no stragglers."""
    from mpsbinary import real_mps_control
    real_mps_control()                                   # the real binary's behaviour
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    pipe, log = Path(st.mps["pipe_dir"]), Path(st.mps["log_dir"])
    r = subprocess.run([str(node.ctl)], input=f"start_server -uid {_uid('sgtest1')}\n",
                       env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe),
                            "CUDA_MPS_LOG_DIRECTORY": str(log)},
                       capture_output=True, text=True, user="sgtest1")
    assert (r.returncode, r.stdout) == (0, "")
    deadline = time.monotonic() + 5
    while "exited with status 1" not in (log / "control.log").read_text() and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    assert "exited with status 1" in (log / "control.log").read_text()
    assert daemon_pids(pipe) == st.mps["pids"]       # the control daemon is still up
    assert lifecycle.epilog(ctx) == 0
    assert not any("stragglers" in m for m in node.logs), node.logs
    assert node.leftovers() == []


def test_mps_exclusive_process_set_and_restored(node: Env) -> None:
    node.mps.exclusive_process = True
    ctx = node.ctx(SLURM_JOB_GPUS="2", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    gpus = node.api()
    assert gpus.compute_mode(2) == 3
    assert lifecycle.epilog(ctx) == 0
    assert gpus.compute_mode(2) == 0


def test_mig_job_distinct_uuids_and_baseline_restored(node: Env) -> None:
    before = {g: node.layout(g) for g in (1, 2, 3)}
    ctx = node.ctx(SLURM_JOB_GPUS="2,3", SPANK_SLURM_GPU_MIG="3g.40gb,2x2g.20gb")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    envs = [js.task_env(st, t, 6)["CUDA_VISIBLE_DEVICES"] for t in range(6)]
    assert len(set(envs)) == 6 and all(e.startswith("MIG-") for e in envs)
    assert sorted(p for p, _, _ in node.layout(2)) == [9, 14, 14]
    assert lifecycle.epilog(ctx) == 0
    assert {g: node.layout(g) for g in (1, 2, 3)} == before
    assert node.leftovers() == []


def test_bad_layout_fails_job_not_node_and_touches_nothing(node: Env) -> None:
    before = node.layout(2)
    ctx = node.ctx(SLURM_JOB_GPUS="2", SPANK_SLURM_GPU_MIG="4g.40gb,4g.40gb")
    assert lifecycle.prolog(ctx) == 0
    st = js.load(node.state_dir, "100")
    assert st.error.startswith("MIG layout 2x4g.40gb asks for 2 x 4g.40gb")
    with pytest.raises(JobFailed, match="2x4g.40gb"):
        js.task_env(st, 0, 1)
    assert node.layout(2) == before
    assert lifecycle.epilog(ctx) == 0 and node.leftovers() == []


@pytest.mark.parametrize("env,why", [
    ({"SLURM_JOB_GPUS": "0", "SPANK_SLURM_GPU_MIG": "1g.10gb"}, "does not have MIG mode enabled"),
    ({"CUDA_VISIBLE_DEVICES": "1", "SPANK_SLURM_GPU_MIG": "1g.10gb"}, "needs whole GPUs"),
    ({"SLURM_JOB_GPUS": "1", "SPANK_SLURM_GPU_MPS": "150"}, "bad --gpu-mps value"),
    # any value reaches the prolog through a user's own SPANK plugin: never a node fault
    ({"SLURM_JOB_GPUS": "1", "SPANK_SLURM_GPU_MPS": "\u00b2"}, "bad --gpu-mps value"),
    ({"SLURM_JOB_GPUS": "1", "SPANK_SLURM_GPU_MPS": "\u0665\u0660"}, "bad --gpu-mps value"),
    ({"SPANK_SLURM_GPU_MPS": "default"}, "need GPUs"),
    ({"SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_GPUS": "0",
      "SPANK_SLURM_GPU_MPS": "default"}, "refused for root"),
])
def test_user_errors_fail_the_job(node: Env, env: dict, why: str) -> None:
    assert lifecycle.prolog(node.ctx(**env)) == 0
    st = js.load(node.state_dir, "100")
    assert why in st.error and st.phase == "failed"
    assert (Path(node.mps.base_dir) / "100").exists() is False
    assert lifecycle.epilog(node.ctx(**env)) == 0 and node.leftovers() == []


@pytest.mark.parametrize("policy,rc", [("drain", 1), ("pass", 0)])
def test_node_fault_policy_and_blocker_named(node: Env, policy: str, rc: int,
                                             monkeypatch) -> None:
    node.jobs.on_internal_error = policy
    before = node.layout(2)
    set_holder(node.sim, "dcgm", gpus=[2], blocks=("create",))
    monkeypatch.setattr(blockers, "find", lambda *a, **k: [blockers.Blocker(
        "DCGM host engine (nv-hostengine)", "pid 4242", "stop it (systemctl stop nvidia-dcgm)")])
    ctx = node.ctx(SLURM_JOB_GPUS="2", SPANK_SLURM_GPU_MIG="7g.80gb", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == rc
    assert any("nv-hostengine" in m and "systemctl stop nvidia-dcgm" in m for m in node.logs)
    # the blocker also stops the baseline from coming back: the record stays for the epilog
    st = js.load(node.state_dir, "100")
    assert st is not None and "In use" in st.error
    assert node.layout(2) != before
    from slurm_gpu_devkit.sim.mig import clear_holder
    clear_holder(node.sim, "dcgm")
    assert lifecycle.epilog(ctx) == 0
    assert node.layout(2) == before and node.leftovers() == []


def test_node_fault_undone_in_prolog(node: Env, monkeypatch) -> None:
    """A fault after some instances exist: the prolog itself puts the node back."""
    before = node.layout(3)
    real = instances.create_placement
    calls = {"n": 0}

    def failing(api, dev, p, where):
        calls["n"] += 1
        if calls["n"] == 2:
            raise instances.MigError("cannot create GPU instance: Unknown Error", where, 999)
        return real(api, dev, p, where)

    monkeypatch.setattr(migjob.instances, "create_placement", failing)
    ctx = node.ctx(SLURM_JOB_GPUS="3", SPANK_SLURM_GPU_MIG="3g.40gb,2g.20gb")
    assert lifecycle.prolog(ctx) == 1                  # drain: the node is at fault
    assert node.layout(3) == before and node.leftovers() == []


class Killed(BaseException):
    """What SIGKILL looks like to the code: nothing after it runs."""


def die_after_creating(monkeypatch, n: int) -> None:
    """The process is SIGKILLed right after its *n*-th MIG instance is created."""
    real = instances.create_placement
    calls = {"n": 0}

    def dying(api, dev, p, where):
        calls["n"] += 1
        ids = real(api, dev, p, where)
        if calls["n"] == n:
            raise Killed()
        return ids

    monkeypatch.setattr(migjob.instances, "create_placement", dying)


def test_killed_mid_mig_prolog_before_id_recorded(node: Env, monkeypatch) -> None:
    before = node.layout(3)
    die_after_creating(monkeypatch, 2)   # the 2nd instance exists; its id never reached the state file
    ctx = node.ctx(SLURM_JOB_GPUS="3", SPANK_SLURM_GPU_MIG="4g.40gb,2g.20gb,1g.10gb")
    with pytest.raises(Killed):
        lifecycle.prolog(ctx)
    assert node.layout(3) != before
    monkeypatch.undo()
    assert lifecycle.epilog(node.ctx()) == 0           # a fresh epilog (slurmd restarted)
    assert node.layout(3) == before and node.leftovers() == []


def test_killed_mid_mps_start_daemon_found_by_pipe(node: Env, monkeypatch) -> None:
    from slurm_gpu.jobs import mps
    real = mps.control

    def dying(*a, **k):             # the prolog dies right after the daemon started
        raise Killed()

    monkeypatch.setattr(mps, "control", dying)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    with pytest.raises(Killed):
        lifecycle.prolog(ctx)
    monkeypatch.setattr(mps, "control", real)
    assert daemon_pids(Path(node.mps.base_dir) / "100" / "pipe")   # it is running
    js.remove(node.state_dir, "100")                 # even with the state file lost
    assert lifecycle.epilog(node.ctx()) == 0
    assert node.leftovers() == []


def test_user_killing_the_starting_daemon_fails_the_job_not_the_node(node: Env, monkeypatch) -> None:
    """The daemon runs as the job user, so the user can kill it before it
    answers: that is the user's doing and must not drain the node."""
    from slurm_gpu.jobs import mps
    real = mps.control

    def user_kills_it_first(settings, user, pipe, log, cmd, **kw):
        for pid in daemon_pids(pipe):
            os.kill(pid, 9)
        monkeypatch.setattr(mps, "control", real)
        return real(settings, user, pipe, log, cmd, **kw)

    monkeypatch.setattr(mps, "control", user_kills_it_first)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0                       # the node stays up
    st = js.load(node.state_dir, "100")
    assert st.phase == "failed" and "exited before it answered" in st.error
    with pytest.raises(js.JobFailed):
        js.task_env(st, 0, 1)                                # ... and the job's tasks fail
    assert lifecycle.epilog(ctx) == 0
    assert node.leftovers() == []


def test_user_stopping_the_starting_daemon_fails_the_job_not_the_node(node: Env, monkeypatch) -> None:
    """SIGSTOP (or a ptrace stop) from another process of the job user keeps
    the daemon from answering until the prolog's session times out: the
    user's doing, so the job fails and the node stays up."""
    from slurm_gpu.jobs import mps
    real = mps.control

    def user_stops_it_first(settings, user, pipe, log, cmd, **kw):
        for pid in daemon_pids(pipe):
            os.kill(pid, 19)                                # SIGSTOP
        monkeypatch.setattr(mps, "control", real)
        return real(settings, user, pipe, log, cmd, **kw)

    node.mps = MpsSettings(control=str(node.ctl), base_dir=node.mps.base_dir, start_timeout=1.0,
                           quit_timeout=1)
    monkeypatch.setattr(mps, "control", user_stops_it_first)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs            # the node stays up
    st = js.load(node.state_dir, "100")
    assert st.phase == "failed" and "stopped before it answered" in st.error
    assert lifecycle.epilog(ctx) == 0                       # the stopped daemon is ended
    assert node.leftovers() == []


def test_daemon_that_never_starts_is_a_node_fault(node: Env) -> None:
    ctl = node.base / "broken-mps-control"
    ctl.write_text('#!/bin/sh\n[ "$1" = -d ] && exit 0\nexit 1\n')   # starts nothing, never answers
    ctl.chmod(0o755)
    node.mps = MpsSettings(control=str(ctl), base_dir=node.mps.base_dir, start_timeout=0.5,
                           quit_timeout=1)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 1                       # on_internal_error = drain
    assert any("did not answer within 0.5 s" in m for m in node.logs)
    assert lifecycle.epilog(ctx) == 0
    assert node.leftovers() == []


def _mps_job_with_straggler(node: Env) -> tuple[lifecycle.Context, subprocess.Popen]:
    """An MPS job plus a server that ignores quit: a user process bound to the pipe."""
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0
    pipe = Path(js.load(node.state_dir, "100").mps["pipe_dir"])
    straggler = subprocess.Popen(["/bin/sleep", "60"], env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
                                 user="sgtest1")
    return ctx, straggler


def test_straggler_killed_by_pid(node: Env) -> None:
    ctx, straggler = _mps_job_with_straggler(node)
    assert lifecycle.epilog(ctx) == 0
    assert straggler.wait(timeout=5) == -9
    assert any("killed stragglers" in m for m in node.logs)
    assert node.leftovers() == []


def test_epilog_ends_children_that_dropped_the_pipe_variable(node: Env) -> None:
    """Issue 10 point 2 without a job cgroup: a process of the daemon's tree
    that dropped CUDA_MPS_PIPE_DIRECTORY is found through its parent (one
    /proc pass, mpsprocs.daemon_tree) and ended with it."""
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0
    pipe = Path(js.load(node.state_dir, "100").mps["pipe_dir"])
    # Nothing here execs after it has been seen: /proc/PID/environ reads empty
    # while a process is inside execve (issue 24: this test once failed under
    # load when a poll of the child's environment, or the scan, fell into
    # that window).  The child prints its PID once it runs without the
    # variable; the parent stays the shell that has it.
    parent = subprocess.Popen(["/bin/sh", "-c", "env -i /bin/sh -c 'echo $$; exec /bin/sleep 60' & wait"],
                              env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "PATH": "/usr/bin:/bin"},
                              user="sgtest1", stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert b"CUDA_MPS_PIPE_DIRECTORY" not in Path(f"/proc/{child}/environ").read_bytes()
        assert child not in daemon_pids(pipe) and parent.pid in daemon_pids(pipe)
        assert lifecycle.epilog(ctx) == 0
        assert parent.wait(timeout=5) == -9
        assert not _alive(child)            # the epilog returns 0 only once both are gone
    finally:
        for p in (parent.pid, child):
            try:
                os.kill(p, 9)
            except ProcessLookupError:
                pass
        parent.wait()
    assert node.leftovers() == []


def test_entry_point_and_scripts(node: Env, tmp_path: Path) -> None:
    conf = node.base / "slurm-gpu.toml"
    conf.write_text(f'[node]\nnvml = "sim:{node.sim}"\nstate_dir = "{node.state_dir}"\n'
                    f'[mps]\ncontrol = "{node.ctl}"\nbase_dir = "{node.mps.base_dir}"\n')
    py = node.base / "python"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; sys.path.insert(0, "
                  f"\"{ROOT}\"); sys.argv[0] = \"x\"; from slurm_gpu.jobs.__main__ import main; "
                  "sys.exit(main(sys.argv[-1:]))' \"$@\"\n")
    py.chmod(0o755)
    env = {"SLURM_GPU_CONFIG": str(conf), "SLURM_GPU_PYTHON": str(py), "SLURM_JOB_ID": "7",
           "SLURM_JOB_UID": str(_uid("sgtest1")), "SLURM_JOB_USER": "sgtest1",
           "SLURM_JOB_GPUS": "1", "SPANK_SLURM_GPU_MIG": "2x3g.40gb", "SPANK_SLURM_GPU_PROLOG": "1"}
    run = lambda script, e: subprocess.run(["/bin/sh", str(ROOT / script)], env=e,  # noqa: E731
                                           capture_output=True, text=True, timeout=60)
    r = run("prolog.d/50-slurm-gpu-jobs", env)
    assert r.returncode == 0, r.stderr
    assert len(node.layout(1)) == 2
    # the epilog without SPANK_* still finds the job through its state file
    e2 = {k: v for k, v in env.items() if not k.startswith("SPANK_")}
    r = run("epilog.d/50-slurm-gpu-jobs", e2)
    assert r.returncode == 0, r.stderr
    assert node.layout(1) == [] and node.leftovers("7") == []
    # fast path: nothing asked, nothing on record: no Python at all
    e3 = dict(e2, SLURM_GPU_PYTHON="/nonexistent/python")
    assert run("prolog.d/50-slurm-gpu-jobs", e3).returncode == 0
    assert run("epilog.d/50-slurm-gpu-jobs", e3).returncode == 0
    # [repair] user_problem = true: the epilog of a GPU job starts Python to look for leftovers
    conf.write_text(conf.read_text() + "[repair]\nuser_problem = true\n")
    assert run("epilog.d/50-slurm-gpu-jobs", e3).returncode != 0        # Python was started
    e4 = {k: v for k, v in e3.items() if k != "SLURM_JOB_GPUS"}
    assert run("epilog.d/50-slurm-gpu-jobs", e4).returncode == 0


# What a --gpu-mps prolog and epilog may not import once the node-fact entry
# holds their settings: reading the TOML again on every job, typing, runpy
# (-m) and setuptools' shim.  The standard library's json, pathlib, functools
# and subprocess (and what they import) are allowed (issue 25: a few ms a job
# buy nothing a user feels).  dataclasses is allowed elsewhere but not here:
# it imports inspect (with ast, dis, tokenize), about a fifth of each of these
# two processes, for the one record both build (jobs/state.py, docs/mps-mig.md).
HEAVY = {"tomllib", "typing", "runpy", "dataclasses", "inspect",
         # setuptools' .pth in the venv imports its distutils shim into every start
         # unless the hook says SETUPTOOLS_USE_DISTUTILS=stdlib (~0.5 ms)
         "_distutils_hack"}


@pytest.mark.skipif(os.geteuid() != 0, reason="the node-fact cache is root's")
def test_mps_prolog_and_epilog_import_nothing_heavy(node: Env) -> None:
    conf = node.base / "slurm-gpu.toml"
    conf.write_text(f'[node]\nnvml = "sim:{node.sim}"\nstate_dir = "{node.state_dir}"\n'
                    f'[mps]\ncontrol = "{node.ctl}"\nbase_dir = "{node.mps.base_dir}"\n')
    out = node.base / "loaded"
    py = node.base / "python"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} -I -c 'import sys; sys.path.insert(0, "
                  f"\"{ROOT}\"); from slurm_gpu.jobs.__main__ import main; rc = main(sys.argv[-1:]); "
                  f"open(\"{out}\", \"a\").write(\" \".join(sys.modules) + \"\\n\"); "
                  "sys.exit(rc)' \"$@\"\n")
    py.chmod(0o755)
    from slurm_gpu import nodefacts

    def entry() -> list[tuple[str, int, int]]:
        # this node's node-fact entry, as it is on disk now
        d = Path(nodefacts.CACHE_DIR)
        return sorted((p.name, p.stat().st_ino, p.stat().st_mtime_ns)
                      for p in (d.glob("imports1-*") if d.is_dir() else ()))

    def job(jobid: str) -> list[set[str]]:
        out.write_text("")
        env = {"SLURM_GPU_CONFIG": str(conf), "SLURM_GPU_PYTHON": str(py), "SLURM_JOB_ID": jobid,
               "SLURM_JOB_UID": str(_uid("sgtest1")), "SLURM_JOB_USER": "sgtest1",
               "SLURMD_NODENAME": "imports1", "SLURM_JOB_GPUS": "0",
               "SPANK_SLURM_GPU_MPS": "50", "SPANK_SLURM_GPU_PROLOG": "1"}
        for script in ("prolog.d/50-slurm-gpu-jobs", "epilog.d/50-slurm-gpu-jobs"):
            r = subprocess.run(["/bin/sh", str(ROOT / script)], env=env, capture_output=True,
                               text=True, timeout=60)
            assert r.returncode == 0, r.stderr
        # the job ran and was torn down
        assert not (Path(node.state_dir) / "jobs" / f"{jobid}.json").exists()
        assert node.leftovers(jobid) == []
        runs = out.read_text().splitlines()
        assert len(runs) == 2
        return [set(loaded.split()) for loaded in runs]

    job("7")                        # fills the node-fact entry
    # A warm job: one that found the entry and left it as it was.  Another
    # process on this host (a test's or a benchmark's clean-up of /run) may
    # remove the entry meanwhile; that job rebuilt it, so it is not the one
    # judged, and the next one is.
    for jobid in ("8", "9", "10", "11", "12"):
        before = entry()
        mods = job(jobid)
        if before and entry() == before:
            break
    else:
        pytest.fail("the node-fact entry was rebuilt during every job: something removes "
                    f"entries from {nodefacts.CACHE_DIR}")
    for loaded in mods:
        assert "slurm_gpu.jobs.mps" in loaded and "slurm_gpu.runner" in loaded   # the MPS path ran
        assert not loaded & HEAVY, sorted(loaded & HEAVY)


def test_default_context_takes_settings_from_the_node_fact_entry(tmp_path: Path, monkeypatch) -> None:
    """The prolog's entry (no health part) serves the epilog once its health
    part is added; a config edit is seen by the next run."""
    from slurm_gpu import config, nodefacts
    monkeypatch.setattr(nodefacts, "CACHE_DIR", str(tmp_path / "facts"))
    conf = tmp_path / "c.toml"
    conf.write_text(f'[node]\nstate_dir = "{tmp_path}/s"\n[repair]\nuser_problem = true\n'
                    f'[health]\nstate_dir = "{tmp_path}/h/%n"\n[jobs]\ntimeout = 7.0\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(conf))
    monkeypatch.setenv("SLURMD_NODENAME", "ctx1")
    config.clear_cache()
    env = {"SLURMD_NODENAME": "ctx1"}
    pro = lifecycle.default_context(env, health=False)
    assert (pro.jobs.timeout, pro.health_state_dir, pro.state_dir) == (7.0, "", f"{tmp_path}/s")
    epi = lifecycle.default_context(env, health=True)
    assert epi.health_state_dir == f"{tmp_path}/h/ctx1" and epi.jobs.timeout == 7.0
    # served from the entry now: the TOML is not read again.  An edit the entry's
    # stamps cannot see (same inode, size and mtime) proves it: a read would take 8.0.
    st = conf.stat()
    conf.write_text(conf.read_text().replace("timeout = 7.0", "timeout = 8.0"))
    os.utime(conf, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (conf.stat().st_size, conf.stat().st_ino) == (st.st_size, st.st_ino)
    config.clear_cache()
    hit = lifecycle.default_context(env, health=True)
    assert (hit.jobs.timeout, hit.health_state_dir) == (7.0, f"{tmp_path}/h/ctx1")
    conf.write_text(f'[node]\nstate_dir = "{tmp_path}/s"\n[jobs]\ntimeout = 9.0\n')
    config.clear_cache()
    again = lifecycle.default_context(env, health=True)
    assert (again.jobs.timeout, again.health_state_dir) == (9.0, "")
    config.clear_cache()


def test_settings_reject_bad_policy(tmp_path: Path, monkeypatch) -> None:
    from slurm_gpu import config
    from slurm_gpu.jobs.settings import load
    p = tmp_path / "c.toml"
    p.write_text('[jobs]\non_internal_error = "ignore"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(p))
    config.clear_cache()
    with pytest.raises(InputError, match="on_internal_error must be one of drain, pass"):
        load()
    config.clear_cache()


def test_user_error_cancel_policy(node: Env, monkeypatch) -> None:
    from slurm_gpu import runner
    calls = []
    monkeypatch.setattr(runner, "run", lambda argv, timeout, **kw: calls.append(list(argv)))
    node.jobs.user_error = "cancel"
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MIG="9g.1gb")) == 0
    assert calls == [["/usr/bin/scancel", "100"]]
    assert lifecycle.epilog(node.ctx()) == 0 and node.leftovers() == []


def test_epilog_script_finds_state_with_node_name(node: Env) -> None:
    """The sh fast path reads [node] state_dir with %n, skipping comments."""
    conf = node.base / "c.toml"
    conf.write_text('# state_dir = "/nowhere"\n[node]\nstate_dir = "' + str(node.base) +
                    '/var/%n"\n[mps]\nbase_dir = "' + node.mps.base_dir + '"\n')
    marker = node.base / "ran"
    py = node.base / "fakepy"
    py.write_text(f"#!/bin/sh\ntouch {marker}\n")
    py.chmod(0o755)
    env = {"SLURM_GPU_CONFIG": str(conf), "SLURM_GPU_PYTHON": str(py), "SLURM_JOB_ID": "31",
           "SLURMD_NODENAME": "gpu-n7"}
    script = str(ROOT / "epilog.d" / "50-slurm-gpu-jobs")
    subprocess.run(["/bin/sh", script], env=env, check=True)
    assert not marker.exists()
    (node.base / "var" / "gpu-n7" / "jobs").mkdir(parents=True)
    (node.base / "var" / "gpu-n7" / "jobs" / "31.json").write_text("{}")
    subprocess.run(["/bin/sh", script], env=env, check=True)
    assert marker.exists()
    marker.unlink()
    subprocess.run(["/bin/sh", script], env=dict(env, SLURM_JOB_ID="../31"), check=True)
    assert not marker.exists()


def test_epilog_signals_only_the_job_users_processes(node: Env) -> None:
    """Anyone can put the pipe directory into an environment; root's and other users'
    processes carrying it (a setuid program, a planted process) are never killed."""
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    pipe = js.load(node.state_dir, "100").mps["pipe_dir"]
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe}
    as_root = subprocess.Popen(["/bin/sleep", "60"], env=env)
    other = subprocess.Popen(["/bin/sleep", "60"], env=env, user=_uid("sgtest2"))
    try:
        assert as_root.pid not in daemon_pids(pipe) and other.pid not in daemon_pids(pipe)
        assert lifecycle.epilog(ctx) == 0
        assert as_root.poll() is None and other.poll() is None
    finally:
        as_root.kill()
        other.kill()
        as_root.wait()
        other.wait()
    assert node.leftovers() == []


def test_epilog_never_kills_a_recycled_pid(node: Env, monkeypatch) -> None:
    """The daemon's PID is reused by an unrelated process between the scan and the kill."""
    from slurm_gpu.jobs import mps
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("cannot steer PID allocation here")
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    pipe = Path(js.load(node.state_dir, "100").mps["pipe_dir"])
    (daemon,) = daemon_pids(pipe)
    intruder: list[subprocess.Popen] = []

    def quit_then_reuse(*a, **k):
        # The daemon dies without answering; the next process the node starts gets its PID.
        os.kill(daemon, 9)
        t = time.monotonic()
        while os.path.exists(f"/proc/{daemon}"):      # until init has reaped it
            if time.monotonic() - t > 5:
                pytest.skip("nothing reaps orphans here")
            time.sleep(0.001)
        for _ in range(50):
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(daemon - 1))
            p = subprocess.Popen(["/bin/sleep", "60"], user="sgtest1")
            if p.pid == daemon:
                intruder.append(p)
                return None
            p.kill()
            p.wait()
        pytest.skip("the PID was taken by another process on this busy machine")

    monkeypatch.setattr(mps, "control", quit_then_reuse)
    try:
        assert lifecycle.epilog(ctx) == 0
        assert intruder and intruder[0].poll() is None      # same PID, same user, not ours
    finally:
        for p in intruder:
            p.kill()


@pytest.mark.parametrize("policy,rc", [("drain", 1), ("pass", 0)])
def test_epilog_believes_no_state_file_a_user_could_write(node: Env, policy: str, rc: int) -> None:
    """A job user who could write the state file would steer root's cleanup: refused."""
    node.jobs.on_internal_error = policy
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    victim = node.base / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    f = Path(node.state_dir) / "jobs" / "100.json"
    st = json.loads(f.read_text())
    st["mps"]["job_dir"] = str(victim)
    f.write_text(json.dumps(st))
    os.chown(f, _uid("sgtest1"), -1)
    assert lifecycle.epilog(ctx) == rc                 # a node fault for the admin to see
    assert (victim / "keep").exists() and f.exists()
    assert any("state file ignored" in m for m in node.logs)
    assert not (Path(node.mps.base_dir) / "100").exists()   # the daemon is stopped anyway
    assert not daemon_pids(Path(node.mps.base_dir) / "100" / "pipe")


def test_epilog_removes_only_a_job_directory(node: Env) -> None:
    """Whatever directory the state names, root's rmtree reaches only <base>/<jobid>."""
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    victim = node.base / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    st = js.load(node.state_dir, "100")
    st.mps["job_dir"] = str(victim)               # root's own file, wrong content
    js.save(node.state_dir, st)
    assert lifecycle.epilog(ctx) == 0
    assert (victim / "keep").exists()
    assert node.leftovers() == []
    assert any("ignored recorded directory" in m for m in node.logs)


def test_mps_base_under_a_user_writable_directory_is_a_node_fault(node: Env) -> None:
    """A user who can rename entries above the base could redirect root's mkdir/chown."""
    shared = node.base / "shared"
    shared.mkdir()
    os.chown(shared, _uid("sgtest1"), -1)
    node.mps.base_dir = str(shared / "mps")
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 1                  # the admin's setup, not the job
    assert any("users other than root can change" in m for m in node.logs)
    assert list(shared.iterdir()) == []


@pytest.mark.parametrize("fail_at", ["second gi", "gi after its cis"])
def test_baseline_half_removed_is_restored(node: Env, monkeypatch, fail_at: str) -> None:
    """NVML fails while the job's prolog clears the node's baseline instances."""
    before = node.layout(3)
    assert len(before) == 2 and all(cis for _, _, cis in before)
    from slurm_gpu_devkit.sim.mig import MigSimNvml
    real = MigSimNvml.nvmlGpuInstanceDestroy
    calls = {"gi": 0}

    def gi_destroy(self, gi):
        # the second GI of the baseline, or the first one after its CIs went
        calls["gi"] += 1
        if calls["gi"] == (2 if fail_at == "second gi" else 1):
            raise NVMLError(nvml_constants.NVML_ERROR_UNKNOWN)
        return real(self, gi)

    monkeypatch.setattr(MigSimNvml, "nvmlGpuInstanceDestroy", gi_destroy)
    ctx = node.ctx(SLURM_JOB_GPUS="3", SPANK_SLURM_GPU_MIG="7g.80gb")
    assert lifecycle.prolog(ctx) == 1                  # an NVML failure: node fault
    assert node.layout(3) == before                    # the prolog's own undo
    monkeypatch.undo()
    assert lifecycle.epilog(ctx) == 0
    assert node.layout(3) == before and node.leftovers() == []


def test_daemon_that_survives_sigkill_is_a_node_fault(node: Env, monkeypatch) -> None:
    """A daemon stuck in the driver ignores SIGKILL: nothing may be reported clean."""
    import signal as signal_mod    # what mpsprocs and jobcgroup signal through
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    pipe = Path(js.load(node.state_dir, "100").mps["pipe_dir"])
    from slurm_gpu.jobs import mps
    monkeypatch.setattr(mps, "control", lambda *a, **k: None)     # quit is not heard
    monkeypatch.setattr(os, "kill", lambda *a: None)              # nor is SIGKILL
    monkeypatch.setattr(signal_mod, "pidfd_send_signal", lambda *a: None)
    assert lifecycle.epilog(ctx) == 1
    import re
    assert re.fullmatch(rf"slurm-gpu: MPS processes [0-9,]+ survive SIGKILL for 1 s \({re.escape(str(pipe))}\) "
                        r"\[epilog job 100: cleanup incomplete, on_internal_error=drain\]", node.logs[-1]), node.logs
    assert js.load(node.state_dir, "100") is not None and daemon_pids(pipe)
    monkeypatch.undo()
    assert lifecycle.epilog(ctx) == 0                  # once it can be killed, all goes
    assert node.leftovers() == []


def _entry_env(node: Env, sections: str, jobid: str, state_dir: str = "", **env: str) -> dict[str, str]:
    """The environment of ``python -m slurm_gpu.jobs`` for job *jobid* of sgtest1 on
    *node*: a config file of its own (the simulator, the state dir, *sections*)."""
    conf = node.base / "slurm-gpu.toml"
    conf.write_text(f'[node]\nnvml = "sim:{node.sim}"\nstate_dir = "{state_dir or node.state_dir}"\n' + sections)
    return {"SLURM_GPU_CONFIG": str(conf), "SLURM_JOB_ID": jobid, "PYTHONPATH": str(ROOT),
            "SLURM_JOB_UID": str(_uid("sgtest1")), "SLURM_JOB_USER": "sgtest1", **env}


def test_entry_point_sets_its_own_umask(node: Env) -> None:
    """slurmd's umask (here 002) must not make root's directories group-writable."""
    env = _entry_env(node, f'[mps]\ncontrol = "{node.ctl}"\nbase_dir = "{node.base}/var/mps"\n', "8",
                     state_dir=f"{node.base}/var/state", SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    run = lambda what: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "slurm_gpu.jobs", what], env=env, cwd="/", umask=0o002,
        capture_output=True, text=True, timeout=60)
    r = run("prolog")
    assert r.returncode == 0, r.stderr
    for d in ("var", "var/state", "var/state/jobs", "var/mps", "var/mps/8"):
        assert stat.S_IMODE(os.lstat(node.base / d).st_mode) == 0o755, d
    assert run("epilog").returncode == 0
    assert not (node.base / "var" / "mps" / "8").exists()


def test_prolog_rerun_first_cleans_what_an_earlier_run_left(node: Env, monkeypatch) -> None:
    """Requeued onto the same node before an epilog cleaned up: the old record is not lost."""
    before = node.layout(3)
    die_after_creating(monkeypatch, 2)
    ctx = node.ctx(SLURM_JOB_GPUS="3", SPANK_SLURM_GPU_MIG="4g.40gb,2g.20gb,1g.10gb")
    with pytest.raises(Killed):
        lifecycle.prolog(ctx)
    monkeypatch.undo()
    ctx2 = node.ctx(SLURM_JOB_GPUS="3", SPANK_SLURM_GPU_MIG="7g.80gb")
    assert lifecycle.prolog(ctx2) == 0, node.logs
    assert [p for p, _, _ in node.layout(3)] == [0]    # 7g.80gb alone (profile id 0)
    assert lifecycle.epilog(ctx2) == 0
    assert node.layout(3) == before and node.leftovers() == []


@pytest.mark.parametrize("policy,rc", [("drain", 1), ("pass", 0)])
def test_prolog_rerun_that_cannot_clean_up_follows_the_policy(node: Env, policy: str, rc: int,
                                                               monkeypatch) -> None:
    node.jobs.on_internal_error = policy
    old = js.new("100", uid=_uid("sgtest1"), gid=0, user="sgtest1")
    old.mig = {"layout": "7g.80gb", "ready": True, "gpus": [{"index": 3, "instances": [
        {"gi_id": 1, "gi_profile_id": 0, "start": 0, "size": 8}]}]}
    js.save(node.state_dir, old)
    monkeypatch.setattr(migjob, "teardown", lambda *a: (_ for _ in ()).throw(
        instances.MigError("cannot destroy GPU instance 1: In use", "GPU 3", 19)))
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")) == rc
    st = js.load(node.state_dir, "100")
    assert st.mig == old.mig and "In use" in st.error     # the old record stays
    assert st.consequence == "node" and node.logs[-1] == (
        "slurm-gpu: cannot destroy GPU instance 1: In use (GPU 3) "
        f"[job 100: earlier run not cleaned up, on_internal_error={policy}]")
    assert not (Path(node.mps.base_dir) / "100").exists()        # nothing new was started


@pytest.mark.parametrize("conf", [
    "[node]\n  # state_dir = \"/nowhere\"\nstate_dir = '{d}'\n",       # indented comment, literal
    "[node]\n  state_dir=\"{d}\"  # here\n[mps]\nbase_dir = \"/x\"\n",  # indented key
    "[health]\nstate_dir = \"/nowhere\"\n[node]\nsnapshot = \"/s\"\nstate_dir = \"{d}\"\n",
])
def test_epilog_script_reads_toml_like_python(node: Env, conf: str) -> None:
    """The sh fast path must find the state where Python's TOML reader says it is."""
    d = node.base / "var"
    cfg = node.base / "c.toml"
    cfg.write_text(conf.format(d=d))
    import tomllib
    assert tomllib.loads(cfg.read_text())["node"]["state_dir"] == str(d)
    (d / "jobs").mkdir(parents=True)
    (d / "jobs" / "31.json").write_text("{}")
    marker = node.base / "ran"
    py = node.base / "fakepy"
    py.write_text(f"#!/bin/sh\ntouch {marker}\n")
    py.chmod(0o755)
    env = {"SLURM_GPU_CONFIG": str(cfg), "SLURM_GPU_PYTHON": str(py), "SLURM_JOB_ID": "31"}
    subprocess.run(["/bin/sh", str(ROOT / "epilog.d" / "50-slurm-gpu-jobs")], env=env, check=True)
    assert marker.exists()


def test_the_watchdog_runs_before_the_step_can_end() -> None:
    """The watchdog thread has started before the step goes on: a prolog or epilog that
    had nothing to do exited while a loaded node had not yet scheduled it, and the
    thread then started in a torn-down interpreter (SIGSEGV in
    _PyThreadState_SetCurrent, CPython 3.11: 'epilog killed by signal 11', the
    drained node of stop 32's CI).  Here: its frame is there as soon as it returns."""
    code = ("import sys\n"
            "from slurm_gpu.jobs.__main__ import _watchdog\n"
            "_watchdog(30, 'epilog', 0, lambda line: None)\n"
            "print(sum(f.f_code.co_name == 'wait_then_fire' for f in sys._current_frames().values()))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True,
                       timeout=30)
    assert (r.returncode, r.stdout) == (0, "1\n"), r.stderr


@pytest.mark.parametrize("policy,rc", [("drain", 1), ("pass", 0)])
def test_watchdog_ends_a_prolog_stuck_in_nvml(node: Env, policy: str, rc: int) -> None:
    """An NVML call that never returns (here: the simulator's lock held by someone else)."""
    import fcntl
    env = _entry_env(node, f'[jobs]\ntimeout = 2\non_internal_error = "{policy}"\n', "9",
                     SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MIG="7g.80gb")
    fd = os.open(node.sim + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        r = subprocess.run([sys.executable, "-m", "slurm_gpu.jobs", "prolog"], env=env,
                           cwd="/", capture_output=True, text=True, timeout=30)
    finally:
        os.close(fd)
    assert r.returncode == rc and "stopped by its watchdog" in r.stderr
    st = js.load(node.state_dir, "9")
    if policy == "pass":                              # the job fails, not silently without MIG
        with pytest.raises(JobFailed, match="watchdog"):
            js.task_env(st, 0, 1)
    assert lifecycle.epilog(node.ctx(SLURM_JOB_ID="9")) == 0
    assert node.layout(1) == [] and node.leftovers("9") == []


def test_user_writing_into_the_mps_dirs_cannot_make_the_epilog_fail(node: Env) -> None:
    """Another process of the job user (not bound to the pipe, say from another job)
    keeps creating files in the job's log directory while the epilog removes it."""
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    log = Path(js.load(node.state_dir, "100").mps["log_dir"])
    writer = subprocess.Popen(
        [sys.executable, "-I", "-c",
         "import os\nos.mkdir('sub')\nos.chdir('sub')\nopen('../ready', 'w').close()\n"
         "i = 0\nwhile True:\n"
         "    i += 1\n"
         "    try:\n        open(f'f{i}', 'w').close()\n        os.mkdir(f'd{i}')\n"
         "    except OSError:\n        pass\n"],
        cwd=str(log), env={}, user="sgtest1")
    try:
        t = time.monotonic()
        while not (log / "ready").exists() and time.monotonic() - t < 10:
            time.sleep(0.01)
        time.sleep(0.2)
        assert lifecycle.epilog(ctx) == 0, node.logs
        assert node.leftovers() == []
        assert writer.poll() is None                     # not ours to kill: it lives on
    finally:
        writer.kill()
        writer.wait()


def test_symlinks_the_user_plants_in_the_mps_dirs_are_not_followed(node: Env) -> None:
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    log = Path(js.load(node.state_dir, "100").mps["log_dir"])
    victim = node.base / "victim"
    victim.mkdir()
    os.chown(victim, _uid("sgtest2"), -1)
    (victim / "keep").write_text("x")
    subprocess.run(["/bin/ln", "-s", str(victim), str(log / "evil")], user="sgtest1", check=True)
    subprocess.run(["/bin/ln", "-s", str(victim / "keep"), str(log / "evil2")], user="sgtest1",
                   check=True)
    assert lifecycle.epilog(ctx) == 0
    assert (victim / "keep").read_text() == "x" and os.lstat(victim).st_uid == _uid("sgtest2")
    assert os.lstat(victim).st_mode & 0o777 == 0o755
    assert node.leftovers() == []


def test_straggler_killed_on_a_kernel_without_pidfd(node: Env, monkeypatch) -> None:
    """RHEL 8 (Linux 4.18) has no pidfd_open: stragglers must still die."""
    import errno

    def enosys(pid, flags=0):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", enosys)
    ctx, straggler = _mps_job_with_straggler(node)
    assert lifecycle.epilog(ctx) == 0
    assert straggler.wait(timeout=5) == -9
    assert node.leftovers() == []


def test_leftovers_are_looked_at_only_on_gpus_the_job_held_whole(node: Env, monkeypatch) -> None:
    """A shard (CUDA_VISIBLE_DEVICES alone: gres/shard, gres/mps) shares its GPU with other
    jobs, the user's own included: their processes are no leftover, and no user-problem drain."""
    seen = processes_asked(monkeypatch)

    def ctx(**env: str) -> lifecycle.Context:
        return health_ctx(node, **env)
    assert lifecycle.prolog(ctx(CUDA_VISIBLE_DEVICES="1", SPANK_SLURM_GPU_MPS="default")) == 0, node.logs
    assert lifecycle.epilog(ctx(CUDA_VISIBLE_DEVICES="1")) == 0, node.logs
    assert lifecycle.epilog(ctx(SLURM_JOB_ID="101", CUDA_VISIBLE_DEVICES="1")) == 0, node.logs
    assert seen == []
    assert lifecycle.epilog(ctx(SLURM_JOB_ID="102", SLURM_JOB_GPUS="1", CUDA_VISIBLE_DEVICES="1")) == 0
    assert seen == [[1]]


# -- issue 24 §1: a job user must not be able to drain the node through --gpu-mps ------

def _as_user(*argv: str) -> None:
    subprocess.run(list(argv), user="sgtest1", check=True)


def _hook_first_control(monkeypatch, act) -> None:
    """Run *act(pipe, log)* just before the prolog's first client session: what
    another process of the job user can do while the daemon starts."""
    from slurm_gpu.jobs import mps
    real = mps.control

    def first(settings, user, pipe, log, cmd, **kw):
        monkeypatch.setattr(mps, "control", real)
        act(Path(pipe), Path(log))
        return real(settings, user, pipe, log, cmd, **kw)
    monkeypatch.setattr(mps, "control", first)


def _short_start(node: Env, **kw) -> None:
    node.mps = MpsSettings(control=kw.pop("control", str(node.ctl)), base_dir=node.mps.base_dir,
                           start_timeout=1.0, quit_timeout=1, **kw)


def test_renamed_sockets_fail_the_job_not_the_node(node: Env, monkeypatch) -> None:
    """The daemon lives on, unreachable, because another process of the job user
    moved its sockets away as they appeared: the user's doing (issue 24 §1)."""
    _short_start(node)

    def rename(pipe: Path, log: Path) -> None:
        _as_user("/bin/mv", str(pipe / "control"), str(pipe / "elsewhere"))
        _as_user("/bin/mv", str(pipe / "control_privileged"), str(pipe / "elsewhere2"))
    _hook_first_control(monkeypatch, rename)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs                 # the node stays up
    st = js.load(node.state_dir, "100")
    assert st.phase == "failed" and "sockets" in st.error, st.error
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == []


def test_replaced_sockets_fail_the_job_not_the_node(node: Env, monkeypatch) -> None:
    """The user binds sockets of their own, which never answer, in place of the daemon's."""
    _short_start(node)
    agent = Agent(REPLACE_SOCKETS)
    try:
        _hook_first_control(monkeypatch, lambda pipe, log: agent.do(str(pipe)))
        ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
        assert lifecycle.prolog(ctx) == 0, node.logs
        st = js.load(node.state_dir, "100")
        assert st.phase == "failed" and "sockets" in st.error, st.error
        assert lifecycle.epilog(ctx) == 0, node.logs
        assert node.leftovers() == []
    finally:
        agent.close()


def test_look_alike_process_is_not_the_daemon(node: Env, monkeypatch) -> None:
    """Kill the daemon, keep a process whose environment names the pipe directory:
    the daemon is the process the prolog started, not whatever claims the pipe."""
    _short_start(node)
    pipe = Path(node.mps.base_dir) / "100" / "pipe"
    look = Agent("", env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})

    def kill_daemon(pipe: Path, log: Path) -> None:
        for pid in daemon_pids(pipe):
            if pid != look.pid:
                os.kill(pid, 9)
    try:
        _hook_first_control(monkeypatch, kill_daemon)
        ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
        assert lifecycle.prolog(ctx) == 0, node.logs
        st = js.load(node.state_dir, "100")
        assert st.phase == "failed" and "exited before it answered" in st.error, st.error
        assert lifecycle.epilog(ctx) == 0, node.logs                # the look-alike is ended too
        assert not _alive(look.pid)
        assert node.leftovers() == []
    finally:
        look.close()


def _fake_daemon(path: Path) -> Path:
    """A control daemon that daemonizes as NVIDIA's does (fork, setsid, fork), binds
    both sockets and then never answers: a hung daemon, the node's fault."""
    path.write_text(
        "#!/usr/bin/python3 -I\nimport os, socket, sys, time\n"
        "pipe = os.environ['CUDA_MPS_PIPE_DIRECTORY']\n"
        "if sys.argv[1:] == ['-d']:\n"
        "    if os.fork():\n        sys.exit(0)\n"
        "    os.setsid()\n"
        "    if os.fork():\n        os._exit(0)\n"
        "    ss = []\n"
        "    for n in ('control', 'control_privileged'):\n"
        "        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "        s.bind(pipe + '/' + n)\n        s.listen(8)\n        ss.append(s)\n"
        "    os.close(0); os.close(1); os.close(2)\n"
        "    time.sleep(600)\n"
        "    sys.exit(0)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "try:\n    s.connect(pipe + '/control_privileged')\n"
        "except OSError:\n    print('Cannot find MPS control daemon process'); sys.exit(1)\n"
        "s.send(sys.stdin.read().encode())\ns.recv(100)\n")
    path.chmod(0o755)
    return path


def test_daemon_alive_with_its_own_sockets_but_silent_fails_the_job(node: Env) -> None:
    """A process of its user can hold its socket (a silent connection): no node fault."""
    _short_start(node, control=str(_fake_daemon(node.base / "hung-mps-control")))
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs                 # the node stays up
    st = js.load(node.state_dir, "100")
    assert st.phase == "failed" and st.error.startswith("MPS control daemon runs but did not answer ("), st
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == []


def test_fifo_log_never_blocks_the_prolog(node: Env) -> None:
    """A FIFO at log/control.log (planted here by the "binary", which runs as the
    job user) is never opened with a blocking open(): the prolog is not stuck until
    its watchdog."""
    ctl = node.base / "fifo-mps-control"
    ctl.write_text('#!/bin/sh\nif [ "$1" = -d ]; then mkfifo "$CUDA_MPS_LOG_DIRECTORY/control.log"; '
                   'exit 0; fi\necho "Cannot find MPS control daemon process"; exit 1\n')
    ctl.chmod(0o755)
    env = _entry_env(node, f'[jobs]\ntimeout = 5\n'
                           f'[mps]\ncontrol = "{ctl}"\nbase_dir = "{node.mps.base_dir}"\nstart_timeout = 1\n',
                     "9", SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    r = subprocess.run([sys.executable, "-m", "slurm_gpu.jobs", "prolog"], env=env,
                       cwd="/", capture_output=True, text=True, timeout=60)
    assert "watchdog" not in r.stderr, r.stderr
    assert "did not answer within 1 s" in r.stderr, r.stderr  # nothing started: the binary's fault
    assert lifecycle.epilog(node.ctx(SLURM_JOB_ID="9")) == 0
    assert node.leftovers("9") == []


def _mounts_under(d: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [ln.split()[4] for ln in f if ln.split()[4].startswith(d.rstrip("/") + "/")]


@pytest.mark.parametrize("where", ["pipe/mnt", "log"])
def test_mount_in_the_mps_dirs_does_not_fail_the_epilog(node: Env, where: str) -> None:
    """A mount the user made inside the job's MPS directory (FUSE; here tmpfs, as root)
    is detached by the epilog, which then removes the directory: no drain."""
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    target = Path(node.mps.base_dir) / "100" / where
    if not target.exists():
        _as_user("/bin/mkdir", str(target))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "sg-test", str(target)], check=True)
    try:
        (target / "inside").write_text("x")
        assert lifecycle.epilog(ctx) == 0, node.logs
        assert _mounts_under(node.mps.base_dir) == [] and node.leftovers() == []
    finally:
        for m in reversed(_mounts_under(node.mps.base_dir)):
            subprocess.run(["umount", "-l", m])


def test_missing_mps_binary_fails_the_job_not_the_node(node: Env) -> None:
    """Issue 23 #5: a node without NVIDIA's binary must not drain on a user's --gpu-mps."""
    _short_start(node, control=str(node.base / "no-such-mps-control"))
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st.phase == "failed"
    assert st.error == (f"--gpu-mps: this node has no MPS control binary "
                           f"({node.base / 'no-such-mps-control'})")
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == []


def test_mps_disabled_fails_the_job_with_one_line(node: Env) -> None:
    _short_start(node, enabled=False)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st.error == "--gpu-mps is disabled on this cluster ([mps] enabled)"
    assert not (Path(node.mps.base_dir) / "100").exists()
    assert lifecycle.epilog(ctx) == 0 and node.leftovers() == []


def _leftover_on_gpu0(monkeypatch) -> tuple[subprocess.Popen, list[str]]:
    """A process of the job user's left on GPU 0 (as NVML lists it), and the
    drains the epilog's user-problem check asks for, recorded instead of made."""
    from slurm_gpu.health import userproblem as up
    from slurm_gpu.hw import nvml_health
    left = subprocess.Popen(["/bin/sleep", "60"], user="sgtest1")   # the job's leftover on GPU 0
    monkeypatch.setattr(nvml_health, "read_processes", lambda gpus, idx: nvml_health.NvmlHealth(
        available=True, gpus=[SimpleNamespace(bus_id="00000000:1B:00.0", lost=None, memory_used=0,
                                              processes=((left.pid, None),))]))
    drains: list[str] = []
    monkeypatch.setattr(up, "drain", lambda node_, reason, timeout: drains.append(reason) or "drained")
    return left, drains


def test_user_problem_drain_waits_for_the_health_checks_lock(node: Env, monkeypatch) -> None:
    """Issue 24 §5: the epilog's user-problem drain and the health check take the same
    lock, so a fault drain the health check is making is never relabelled a user problem
    (which would resume after one clean run, without the DCGM gate)."""
    import fcntl
    from slurm_gpu.health import engine
    from slurm_gpu.health import userproblem as up
    left, drains = _leftover_on_gpu0(monkeypatch)
    monkeypatch.setattr(up, "LOCK_WAIT", 0.0, raising=False)
    health = node.base / "health"
    health.mkdir()

    def ctx(jobid: str) -> lifecycle.Context:
        c = node.ctx(SLURM_JOB_ID=jobid, SLURM_JOB_GPUS="0")
        c.health_state_dir, c.node_name = str(health), "n1"
        return c
    fd = os.open(engine.lock_file(str(health), "n1"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)                  # a health check is running
        assert lifecycle.epilog(ctx("101")) == 0, node.logs
        assert drains == [] and up.load_marker(up.marker_path(str(health), "n1")) is None
        assert any("health check" in m and "not drained" in m for m in node.logs), node.logs
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert lifecycle.epilog(ctx("102")) == 0, node.logs
        assert len(drains) == 1 and drains[0].startswith("slurm-gpu: user-problem: job 102 left")
        assert up.load_marker(up.marker_path(str(health), "n1")).jobid == "102"
    finally:
        os.close(fd)
        left.kill()
        left.wait()


@pytest.mark.parametrize("plant", ["dirs", "dir_with_entry"])
def test_entries_planted_before_the_daemon_starts_fail_the_job_not_the_node(
        node: Env, monkeypatch, plant: str) -> None:
    """Between the prolog's mkdir of pipe/ and the daemon's start, another process of the
    job user makes directories (or binds a socket of its own) at the daemon's socket
    paths: NVIDIA's daemon then exits 1 with no word, which is the user's doing (a
    file or socket there it unlinks and binds over)."""
    from slurm_gpu import runner
    _short_start(node)
    code = (PLANT_DIRS if plant == "dirs" else
            "os.mkdir(arg + '/control_privileged')\nos.mkdir(arg + '/control_privileged/x')\n")
    agent = Agent(code)
    real = runner.run

    def run(argv, *a, **kw):
        if list(argv)[1:] == ["-d"]:
            agent.do(kw["env"]["CUDA_MPS_PIPE_DIRECTORY"])
        return real(argv, *a, **kw)
    monkeypatch.setattr(runner, "run", run)
    try:
        ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
        assert lifecycle.prolog(ctx) == 0, node.logs
        st = js.load(node.state_dir, "100")
        assert st.phase == "failed" and "pipe directory" in st.error, st.error
        monkeypatch.setattr(runner, "run", real)
        assert lifecycle.epilog(ctx) == 0, node.logs
        assert node.leftovers() == []
    finally:
        agent.close()


def _our_clients(ctl: Path) -> list[int]:
    """PIDs of this process's children running *ctl* as a client (no ``-d``)."""
    out = []
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            children = Path(f"/proc/{os.getpid()}/task/{tid}/children").read_text().split()
        except OSError:
            # A thread that ended since the listing (procfs.read_each's
            # workers, in the prolog's scans): the attack must not die of it.
            continue
        for pid in children:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
            except OSError:
                continue
            if argv == [str(ctl).encode()]:
                out.append(int(pid))
    return out


@pytest.mark.parametrize("sig", [9, 19])            # SIGKILL, SIGSTOP
def test_user_signalling_the_prologs_clients_fails_the_job_not_the_node(
        node: Env, monkeypatch, sig: int) -> None:
    """The client sessions run as the job user, so any other process of theirs can kill
    or stop them (issue 24 §1, reproduced with NVIDIA's 535 binary): the job fails, the
    node stays up.  The daemon is held (as root) until the first client is caught, so
    the attack always lands; the user's agent then signals every client it sees."""
    import threading
    _short_start(node)
    agent = Agent(f"os.kill(int(arg), {sig})")
    done = threading.Event()
    held: list[int] = []

    def attack() -> None:
        hit: set[int] = set()
        while not done.is_set():
            for pid in _our_clients(node.ctl):
                if pid not in hit:
                    hit.add(pid)
                    try:
                        agent.do(str(pid))
                    except (AssertionError, BrokenPipeError):
                        return
            if hit and held:
                os.kill(held.pop(), 18)             # SIGCONT: root lets the daemon go on
            time.sleep(0.001)

    def hold_daemon(pipe: Path, log: Path) -> None:
        held.extend(daemon_pids(pipe))
        for pid in held:
            os.kill(pid, 19)
    _hook_first_control(monkeypatch, hold_daemon)
    t = threading.Thread(target=attack)
    t.start()
    try:
        ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
        assert lifecycle.prolog(ctx) == 0, node.logs                 # the node stays up
        st = js.load(node.state_dir, "100")
        assert st.phase == "failed" and "control client was" in st.error, st.error
    finally:
        done.set()
        t.join()
        agent.close()
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == []


@pytest.mark.parametrize("sig", [9, 19])            # SIGKILL, SIGSTOP
def test_user_signalling_the_launcher_fails_the_job_not_the_node(
        node: Env, monkeypatch, sig: int) -> None:
    """``nvidia-cuda-mps-control -d`` runs as the job user: a process of theirs killing
    it (a kill(-1, SIGKILL) loop, reproduced with NVIDIA's binary) ends it by a signal,
    which the runner returns as a negative status; stopping it makes the runner time
    out on a stopped process (test_runner.py shows both on real processes).  Here the
    launcher is hit right after it forked the daemon, as the loop does; the job fails,
    the node stays up."""
    from slurm_gpu import runner
    _short_start(node)
    real = runner.run

    def run(argv, *a, **kw):
        res = real(argv, *a, **kw)
        if list(argv)[1:] == ["-d"] and sig == 19:
            raise runner.TimedOut("nvidia-cuda-mps-control timed out after 1 s (it was stopped)",
                                  " ".join(argv), stopped=True)
        if list(argv)[1:] == ["-d"]:
            return res._replace(returncode=-9)
        return res
    monkeypatch.setattr(runner, "run", run)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    want = "launcher was killed by signal 9" if sig == 9 else "launcher was stopped"
    assert st.phase == "failed" and want in st.error, st.error
    monkeypatch.setattr(runner, "run", real)
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == []


# -- issue 24: without PrologFlags=RunInJob the daemon waits for the job's cgroup ------

def _cgroup_of(pid: int, point: str) -> str:
    """*pid*'s cgroup in the hierarchy mounted at *point*, as a path under it."""
    from slurm_gpu.jobs import jobcgroup
    version, ctrls = next((v, c) for p, v, c in jobcgroup.mounts() if p == point)
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _id, names, path = line.split(":", 2)
        if (version == 2 and names == "") or (version == 1 and set(ctrls) & set(names.split(","))):
            return point + path
    raise AssertionError(f"{pid} in no cgroup of {point}")


def _orphan_from(daemon: int, how: str, hold: list[str]) -> int:
    """A process of the job user's that the daemon started and orphaned: no
    pipe variable, parent init, outside the daemon's process tree.

    ``gdb``: the review's attack, another process of the user attaching to the
    daemon (same uid, no Yama) and making it call system().  ``joined``: a
    process started in the daemon's cgroup as the daemon was, which double-forks
    (what the kernel does to the daemon's own children, without ptrace)."""
    from slurm_gpu import runner
    from slurm_gpu.jobs import jobcgroup
    u = pwd.getpwnam("sgtest1")
    code = "env -i setsid /bin/sleep 777 </dev/null >/dev/null 2>&1 &"
    if how == "gdb":
        gdb = shutil.which("gdb")
        if gdb is None:
            pytest.skip("no gdb here")
        r = subprocess.run([gdb, "-nx", "-batch", "-p", str(daemon), "-ex",
                            f'call (int)system("{code}")'], user=u.pw_uid, group=u.pw_gid,
                           extra_groups=[], env={},
                           capture_output=True, text=True, timeout=60)
        if "$1 = 0" not in r.stdout:
            pytest.skip(f"the job user cannot ptrace here: {r.stderr.strip()[-200:]}")
    else:
        runner.run(["/bin/sh", "-c", code], 10, env={"PATH": runner.SAFE_PATH},
                   run_as=runner.RunAs(u.pw_uid, u.pw_gid), join_cgroups=jobcgroup.procs_files(hold))
    for _ in range(1000):
        for pid in os.listdir("/proc"):
            try:
                if pid.isdigit() and Path(f"/proc/{pid}/cmdline").read_bytes() == \
                        b"/bin/sleep\x00777\x00" and os.stat(f"/proc/{pid}").st_uid == u.pw_uid:
                    return int(pid)
            except OSError:
                pass
        time.sleep(0.01)
    raise AssertionError("the orphan never started")


@pytest.mark.parametrize("how", ["gdb", "joined"])
@pytest.mark.parametrize("first_step", [False, True], ids=["no step", "first step"])
def test_what_the_daemon_orphans_before_the_jobs_cgroup_exists_stays_in_the_job(
        node: Env, how: str, first_step: bool) -> None:
    """Without RunInJob (22.05) the prolog runs before Slurm makes the job's cgroup.
    A process the daemon started and orphaned (``gdb -p <daemon> -ex 'call
    system("env -i setsid sleep 777 &")'`` from another process of the user) left
    the daemon's process tree: it must still be moved into the job's cgroup by the
    first step, and ended by the epilog, never run on in slurmd's cgroup after the job."""
    from slurm_gpu import hostctx
    from slurm_gpu.jobs import jobcgroup, mps
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    (daemon, _start), = st.mps["daemon"]
    hold = node.hold()
    assert hold and st.mps["hold"] == hold
    point = hold[0][:hold[0].index("/" + jobcgroup.HOLD + "/")]
    assert _cgroup_of(daemon, point) == hold[0]                  # held from its exec on
    orphan = _orphan_from(daemon, how, hold)
    job = None
    try:
        assert _cgroup_of(orphan, point) == hold[0]
        if first_step:
            # Slurm makes the job's cgroup after the prolog; the first step adopts.
            v2 = next(v for p, v, _c in jobcgroup.mounts() if p == point) == 2
            job = Path(point) / (f"{hostctx.node_name}_slurmstepd" if v2 else
                                 f"slurm_{hostctx.node_name}/uid_{_uid('sgtest1')}") / "job_100"
            job.mkdir(parents=True)
            assert mps.adopt(node.state_dir, "100") == [str(job / jobcgroup.NAME)]
            for pid in (daemon, orphan):
                assert _cgroup_of(pid, point) == str(job / jobcgroup.NAME)
            assert not os.path.exists(hold[0])
        assert lifecycle.epilog(ctx) == 0, node.logs
        assert not _alive(orphan)
        assert node.leftovers() == []
    finally:
        if _alive(orphan):
            os.kill(orphan, 9)
        if job is not None:
            for d in (job / jobcgroup.NAME, job, job.parent, job.parent.parent):
                try:
                    d.rmdir()
                except OSError:
                    pass


def _prolog_on_mixed_gres(node: Env, slurm_gpus: str) -> tuple[lifecycle.Context, js.JobRecord]:
    """An MPS job's prolog on a node whose gres.conf lists MIG slices before whole GPUs.

    Slurm's GPU index counts every gres/gpu line, a MIG slice too (here:
    GPU minor 0's two slices are indices 0 and 1, then whole GPUs by minor)."""
    minors = sorted(g.minor for g in node.node().gpus)
    lines = ["AutoDetect=off"]
    lines += [f"NodeName=sgmix Name=gpu Type=h100_1g.10gb MultipleFiles=/dev/nvidia{minors[0]},"
              f"/dev/nvidia-caps/nvidia-cap{c},/dev/nvidia-caps/nvidia-cap{c + 1}" for c in (21, 30)]
    lines += [f"NodeName=sgmix Name=gpu Type=h100 File=/dev/nvidia{m}" for m in minors[1:]]
    p = node.base / "gres.conf"
    p.write_text("\n".join(lines) + "\n")
    ctx = node.ctx(SLURM_JOB_GPUS=slurm_gpus, SPANK_SLURM_GPU_MPS="40")
    ctx.gres_conf, ctx.node_name = str(p), "sgmix"
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st is not None
    return ctx, st


def test_a_whole_gpu_listed_after_mig_slices_keeps_slurms_index(node: Env) -> None:
    # The slices once collapsed into their GPU: Slurm's index 2 (whole GPU
    # minor 1) was read as minor 2, another job's GPU.
    ctx, st = _prolog_on_mixed_gres(node, "2")
    want = sorted(node.node().gpus, key=lambda g: g.minor)[1]
    assert st.phase == "ready" and [g["uuid"] for g in st.gpus] == [want.uuid]
    assert lifecycle.epilog(ctx) == 0 and node.leftovers() == []


def test_a_whole_gpu_option_on_a_mig_slice_fails_the_job_never_the_node(node: Env) -> None:
    ctx, st = _prolog_on_mixed_gres(node, "1")
    assert st.phase == "failed" and "Slurm GPU index 1 is a MIG slice" in st.error, st.error
    assert st.consequence == "user"
    assert lifecycle.epilog(ctx) == 0 and node.leftovers() == []


@pytest.mark.parametrize("plant", ["symlink", "world-writable"])
def test_a_planted_health_lock_file_is_one_line_and_no_drain(node: Env, monkeypatch, plant: str) -> None:
    """A lock file a user planted in the health state dir (a link, one others may
    write) is refused by the epilog's user-problem drain: one line, no drain, no
    marker, and the epilog still succeeds."""
    from slurm_gpu.health import engine
    from slurm_gpu.health import userproblem as up
    left, drains = _leftover_on_gpu0(monkeypatch)
    health = node.base / "health"
    health.mkdir()
    lock = engine.lock_file(str(health), "n1")
    if plant == "symlink":
        os.symlink(node.base / "elsewhere", lock)
    else:
        Path(lock).write_text("")
        os.chmod(lock, 0o666)
    try:
        assert lifecycle.epilog(health_ctx(node, SLURM_JOB_GPUS="0")) == 0, node.logs
    finally:
        left.kill()
        left.wait()
    assert drains == [] and up.load_marker(up.marker_path(str(health), "n1")) is None
    assert [m for m in node.logs if "user-problem" in m and "[not drained: lock file " in m], node.logs
    assert not (node.base / "elsewhere").exists()
