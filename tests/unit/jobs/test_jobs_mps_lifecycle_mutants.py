"""jobs.mps, what the prolog/epilog/SPANK tests left open of :func:`mps.start`,
:func:`mps.stop` and :func:`mps.adopt` (mutmut on those three, issue 24 §8).

:func:`mps.adopt` runs against a cgroup tree of the test's (``jobcgroup.mounts``
answers its root, as test_jobs_cgroup.py does) and real processes; where the
kernel's part matters (a process moved leaves its holding cgroup, a process
forks while the step moves its parent) the move is the real ``jobcgroup.join``
followed by what the kernel would do, written into the tree.
"""
from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from test_jobs_lifecycle import Env
from test_jobs_mps_mounts import _mount, _mounts_under, base  # noqa: F401 - base: a root-owned base dir
from test_jobs_mps_mutants import node  # noqa: F401 - the root + sgtest1 node fixture

from slurm_gpu.jobs import jobcgroup, mps
from slurm_gpu.jobs import state as js
from slurm_gpu.jobs.settings import MpsSettings
from slurm_gpu.procfs import start_time

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs processes as job users")


def _uid(name: str) -> int:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        pytest.skip(f"user {name} missing")


class Tree:
    """A cgroup v2 (or v1 freezer) tree of the test's, seen as node n1's."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, version: int = 2) -> None:
        self.root = root
        self.state_dir = str(root / "state")
        self.version = version
        point = root / ("cg" if version == 2 else "freezer")
        point.mkdir(parents=True)
        self.point = point
        monkeypatch.setattr(jobcgroup, "mounts", lambda mountinfo="": [
            (str(point), version, () if version == 2 else ("freezer",))])
        monkeypatch.setenv("SLURMD_NODENAME", "n1")

    def job(self, name: str = "job_7", uid: int | None = None) -> Path:
        """The job's cgroup, as slurmstepd makes it."""
        d = (self.point / "system.slice" / "n1_slurmstepd.scope" / name if self.version == 2
             else self.point / "slurm_n1" / f"uid_{uid}" / name)
        d.mkdir(parents=True)
        (d / "cgroup.procs").write_text("")
        return d

    def hold(self) -> Path:
        """The job's holding cgroup, made (as the prolog's make_hold does)."""
        h, = jobcgroup.hold_dirs("7", "n1")
        os.makedirs(h)
        (Path(h) / "cgroup.procs").write_text("")
        return Path(h)

    def record(self, uid: int | None, **mps_rec: Any) -> None:
        st = js.new("7", uid=uid, gid=uid, user="sgtest1")
        st.mps = mps_rec
        js.save(self.state_dir, st)

    def adopt(self) -> list[str]:
        return mps.adopt(self.state_dir, "7")

    def pipe(self) -> str:
        return str(self.root / "mps" / "7" / "pipe")


@pytest.fixture()
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Tree:
    return Tree(tmp_path, monkeypatch)


def _joins(monkeypatch: pytest.MonkeyPatch, after: Callable[[int], None] | None = None) -> list[int]:
    """Every PID the step moves, in order (the real move), then *after* (what the
    kernel or the process does meanwhile)."""
    real = jobcgroup.join
    moved: list[int] = []

    def join(pid: int, dirs: Any) -> None:
        dirs = list(dirs)
        real(pid, dirs)
        moved.append(pid)
        if after is not None:
            after(pid)
    monkeypatch.setattr(jobcgroup, "join", join)
    return moved


def _leave(hold: Path, pid: int) -> None:
    """What the kernel does to the holding cgroup when *pid* moves out of it."""
    f = hold / "cgroup.procs"
    f.write_text("".join(f"{p}\n" for p in f.read_text().split() if p != str(pid)))


def _sleeper(user: str = "sgtest1", env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["/bin/sleep", "60"], user=user, env=env or {})


# -- what adopt answers without moving anything -------------------------------------

def test_adopt_of_a_job_without_a_state_file_or_an_mps_daemon_makes_nothing(tree: Tree) -> None:
    job = tree.job()
    assert tree.adopt() == []                               # no state file
    tree.record(1001)                                       # a job without --gpu-mps
    assert tree.adopt() == []
    tree.record(1001, pipe_dir="")
    assert tree.adopt() == []
    assert sorted(p.name for p in job.iterdir()) == ["cgroup.procs"]


def test_adopt_done_once_answers_the_recorded_cgroups(tree: Tree) -> None:
    """The first step records where it moved the daemon; the others answer that and
    touch nothing (the job's cgroup may have gone, or differ, by then)."""
    job = tree.job()
    recorded = [str(tree.root / "elsewhere" / jobcgroup.NAME)]
    tree.record(1001, pipe_dir=tree.pipe(), cgroup=recorded)
    assert tree.adopt() == recorded
    assert sorted(p.name for p in job.iterdir()) == ["cgroup.procs"]
    assert js.load(tree.state_dir, "7").mps["cgroup"] == recorded


# -- which cgroup -----------------------------------------------------------------------

def test_adopt_on_cgroup_v1_takes_the_job_users_directory_never_a_stale_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """22.05's v1 layout has the uid in the path: an earlier job 7 of another user
    (uid_1000 sorts first) is not this one."""
    tree = Tree(tmp_path, monkeypatch, version=1)
    tree.job(uid=1000)
    job = tree.job(uid=1001)
    tree.record(1001, pipe_dir=tree.pipe())
    assert tree.adopt() == [str(job / jobcgroup.NAME)]


def test_adopt_ignores_a_recorded_sluid_that_is_no_string(tree: Tree) -> None:
    job = tree.job()
    tree.record(1001, pipe_dir=tree.pipe(), sluid=7)
    assert tree.adopt() == [str(job / jobcgroup.NAME)]
    assert js.load(tree.state_dir, "7").mps["cgroup"] == [str(job / jobcgroup.NAME)]


# -- what is moved ----------------------------------------------------------------------

def test_adopt_uses_only_the_holding_cgroup_the_prolog_recorded(
        tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    """A state file without a hold (written before holds were made) keeps to the
    daemon's process tree: whatever sits in an unrecorded holding cgroup is not moved."""
    _uid("sgtest1")
    job = tree.job()
    hold = tree.hold()
    other = _sleeper()
    try:
        (hold / "cgroup.procs").write_text(f"{other.pid}\n")
        tree.record(1001, pipe_dir=tree.pipe())
        moved = _joins(monkeypatch)
        assert tree.adopt() == [str(job / jobcgroup.NAME)]
        assert moved == []
        assert hold.is_dir()
    finally:
        other.kill()
        other.wait()


def test_adopt_without_a_hold_moves_the_job_users_processes_bound_to_the_pipe(
        tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    """No hold and no daemon recorded (a kernel without subreapers): the job user's
    processes that name the pipe directory, never another user's that names it."""
    uid = _uid("sgtest1")
    _uid("nobody")
    job = tree.job()
    env = {"CUDA_MPS_PIPE_DIRECTORY": tree.pipe()}
    daemon, other = _sleeper(env=env), _sleeper("nobody", env=env)
    try:
        tree.record(uid, pipe_dir=tree.pipe())
        moved = _joins(monkeypatch)
        assert tree.adopt() == [str(job / jobcgroup.NAME)]
        assert moved == [daemon.pid]
    finally:
        for p in (daemon, other):
            p.kill()
            p.wait()


def test_adopt_fails_when_the_kernel_refuses_a_move(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a process that exited meanwhile (ESRCH) is passed over; any other refusal
    (here EISDIR: the job cgroup's cgroup.procs is no file) is raised to the step."""
    uid = _uid("sgtest1")
    job = tree.job()
    (job / jobcgroup.NAME / "cgroup.procs").mkdir(parents=True)
    daemon = _sleeper(env={"CUDA_MPS_PIPE_DIRECTORY": tree.pipe()})
    try:
        tree.record(uid, pipe_dir=tree.pipe())
        with pytest.raises(IsADirectoryError):
            tree.adopt()
        assert "cgroup" not in js.load(tree.state_dir, "7").mps
    finally:
        daemon.kill()
        daemon.wait()


def _kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_adopt_ends_what_still_forks_in_the_hold_after_eight_passes(
        tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each move lets the held process fork one more into the hold (the kernel takes
    the moved one out of it): 8 passes move 8 generations, the 9th is killed."""
    uid = _uid("sgtest1")
    job = tree.job()
    hold = tree.hold()
    procs = [_sleeper()]
    (hold / "cgroup.procs").write_text(f"{procs[0].pid}\n")

    def fork(pid: int) -> None:
        _leave(hold, pid)
        procs.append(_sleeper())
        with open(hold / "cgroup.procs", "a") as f:
            f.write(f"{procs[-1].pid}\n")
    try:
        tree.record(uid, pipe_dir=tree.pipe(), hold=[str(hold)])
        moved = _joins(monkeypatch, fork)
        assert tree.adopt() == [str(job / jobcgroup.NAME)]
        assert len(procs) == 9 and moved == [p.pid for p in procs[:8]]
        assert procs[8].wait(timeout=10) == -signal.SIGKILL
        assert [p.poll() for p in procs[:8]] == [None] * 8
        assert js.load(tree.state_dir, "7").mps["cgroup"] == [str(job / jobcgroup.NAME)]
    finally:
        _kill_all(procs)


# A daemon (as the job user, bound to the pipe) that forks one child, bound too,
# each time it gets SIGUSR1.
_FORKER = """import os, signal, time
def fork(s, f):
    if os.fork() == 0:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        time.sleep(60)
        os._exit(0)
signal.signal(signal.SIGUSR1, fork)
while True:
    time.sleep(60)
"""


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def test_adopt_without_a_hold_follows_the_daemons_forks_for_three_passes(
        tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    uid = _uid("sgtest1")
    job = tree.job()
    daemon = subprocess.Popen(["/usr/bin/python3", "-c", _FORKER], user="sgtest1",
                              env={"CUDA_MPS_PIPE_DIRECTORY": tree.pipe()})

    def catches_usr1() -> bool:
        with open(f"/proc/{daemon.pid}/status") as f:
            cgt = next(x for x in f if x.startswith("SigCgt:")).split()[1]
        return bool(int(cgt, 16) & (1 << (signal.SIGUSR1 - 1)))

    def fork(_pid: int) -> None:
        n = len(_children(daemon.pid))
        os.kill(daemon.pid, signal.SIGUSR1)
        while len(_children(daemon.pid)) == n:
            time.sleep(0.001)
    try:
        while not catches_usr1():
            time.sleep(0.001)
        tree.record(uid, pipe_dir=tree.pipe())
        moved = _joins(monkeypatch, fork)
        assert tree.adopt() == [str(job / jobcgroup.NAME)]
        kids = _children(daemon.pid)
        assert len(kids) == 3 and moved == [daemon.pid] + kids[:2]
    finally:
        for k in _children(daemon.pid):
            os.kill(k, signal.SIGKILL)
        daemon.kill()
        daemon.wait()


# -- stop ----------------------------------------------------------------------------------

def _user() -> mps.JobUser:
    uid = _uid("sgtest1")
    return mps.JobUser(uid, uid, "sgtest1", (uid,))


def _orphan(env: dict[str, str], user: str = "sgtest1") -> int:
    """A process of *user*'s that is nobody's child here (init reaps it)."""
    out = subprocess.run(["/bin/sh", "-c", "/bin/sleep 60 >/dev/null 2>&1 & echo $!"], user=user,
                         env=env, capture_output=True, text=True, check=True).stdout
    return int(out)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_stop_names_every_mount_it_detached(base: Path) -> None:
    s = MpsSettings(base_dir=str(base / "mps"))
    pipe, log = mps.make_dirs(s, "7", _user())
    for d in (pipe, log):
        os.mkdir(os.path.join(d, "m"))
        _mount("-t", "tmpfs", "sg-m", os.path.join(d, "m"))
    assert mps.stop(s, None, "7", _user(), kill_wait=0.1) == [
        f"MPS: detached mounts the job's user made in {base}/mps/7: {log}/m, {pipe}/m"]
    assert not os.path.lexists(base / "mps" / "7") and _mounts_under(base) == []


def test_stop_ends_the_recorded_daemon_of_the_job_user_when_its_pipe_directory_is_gone(
        base: Path) -> None:
    """The job user, not the pipe directory's owner, says whose processes count."""
    s = MpsSettings(base_dir=str(base / "mps"))
    pipe, _log = mps.make_dirs(s, "7", _user())
    os.rmdir(pipe)
    daemon = _orphan({})
    try:
        info = {"job_dir": f"{base}/mps/7", "daemon": [[daemon, start_time(daemon)]]}
        assert mps.stop(s, info, "7", _user(), kill_wait=2) == [f"MPS: killed stragglers {daemon}"]
        assert _gone(daemon)
    finally:
        if not _gone(daemon):
            os.kill(daemon, signal.SIGKILL)
    assert not os.path.lexists(base / "mps" / "7")


def test_stop_without_the_job_user_takes_the_pipe_directorys_owner(base: Path) -> None:
    """An epilog that lost the job user (no SLURM_JOB_UID, no state): the pipe
    directory's owner's processes bound to it are ended, no quit sent (as whom?),
    never another user's process that names the directory."""
    s = MpsSettings(base_dir=str(base / "mps"))
    pipe, _log = mps.make_dirs(s, "7", _user())
    daemon = _orphan({"CUDA_MPS_PIPE_DIRECTORY": pipe})
    other = _orphan({"CUDA_MPS_PIPE_DIRECTORY": pipe}, "nobody")
    try:
        assert mps.stop(s, None, "7", None, kill_wait=2) == [f"MPS: killed stragglers {daemon}"]
        assert _gone(daemon) and not _gone(other)
    finally:
        for p in (daemon, other):
            if not _gone(p):
                os.kill(p, signal.SIGKILL)
    assert not os.path.lexists(base / "mps" / "7")


def test_stop_ends_the_daemon_of_a_job_user_with_uid_1(base: Path) -> None:
    """Only root's processes are never signalled: uid 1 (``daemon``) is a user like any."""
    s = MpsSettings(base_dir=str(base / "mps"))
    user = mps.JobUser(1, 1, "daemon", (1,))
    pipe, _log = mps.make_dirs(s, "7", user)
    daemon = _orphan({"CUDA_MPS_PIPE_DIRECTORY": pipe}, "daemon")
    try:        # no job user: no quit, the pipe directory's owner's processes are killed
        assert mps.stop(s, None, "7", None, kill_wait=2) == [f"MPS: killed stragglers {daemon}"]
        assert _gone(daemon)
    finally:
        if not _gone(daemon):
            os.kill(daemon, signal.SIGKILL)


def test_stop_without_a_job_directory_scans_for_no_daemon(base: Path) -> None:
    """A job without --gpu-mps (every epilog calls stop): a process of its user that
    names the pipe directory this job never had is none of its daemon's."""
    s = MpsSettings(base_dir=str(base / "mps"))
    theirs = _orphan({"CUDA_MPS_PIPE_DIRECTORY": f"{base}/mps/7/pipe"})
    try:
        assert mps.stop(s, None, "7", _user(), kill_wait=0.1) == []
        assert not _gone(theirs)
    finally:
        os.kill(theirs, signal.SIGKILL)


def test_stop_without_the_job_user_and_no_daemon_left_sends_nothing(base: Path) -> None:
    s = MpsSettings(base_dir=str(base / "mps"), control="/bin/false")
    mps.make_dirs(s, "7", _user())
    assert mps.stop(s, None, "7", None, kill_wait=0.1) == []
    assert not os.path.lexists(base / "mps" / "7")


def test_a_quit_that_hangs_is_bounded_by_quit_timeout_and_the_daemon_killed(node: Env) -> None:
    hang = node.base / "hanging-mps-control"
    hang.write_text("#!/bin/sh\nexec /bin/sleep 60\n")
    hang.chmod(0o755)
    s = MpsSettings(control=str(hang), base_dir=node.mps.base_dir, quit_timeout=0.3)
    pipe, _log = mps.make_dirs(s, "100", _user())
    daemon = _orphan({"CUDA_MPS_PIPE_DIRECTORY": pipe})
    try:
        notes = mps.stop(s, None, "100", _user(), kill_wait=2)
        assert notes == [f"MPS quit: {hang.name} timed out after 0.3 s",     # not the client's 5 s
                         f"MPS: killed stragglers {daemon}"]
        assert _gone(daemon)
    finally:
        if not _gone(daemon):
            os.kill(daemon, signal.SIGKILL)


# -- start: through the prolog -------------------------------------------------------------

def _prolog(node: Env, **env: str) -> js.JobRecord:
    from slurm_gpu.jobs import lifecycle
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default", **env)
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st is not None and st.mps is not None and st.phase == "ready", node.logs
    return st


def _epilog(node: Env) -> None:
    from slurm_gpu.jobs import lifecycle
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert node.leftovers() == []


def _job_tree(node: Env, monkeypatch: pytest.MonkeyPatch, jobs: list[str], version: int = 2) -> Path:
    """Slurm's job cgroups *jobs* (paths below the mount point), made before the
    prolog (PrologFlags=RunInJob) in a cgroup tree of the test's."""
    point = node.base / "cg"
    for j in jobs:
        (point / j / jobcgroup.NAME).mkdir(parents=True)
        for d in (point / j, point / j / jobcgroup.NAME):      # a cgroup's procs file comes with it
            (d / "cgroup.procs").write_text("")
    monkeypatch.setattr(jobcgroup, "mounts", lambda mountinfo="": [
        (str(point), version, () if version == 2 else ("freezer",))])
    return point


def _in_job_cgroup(node: Env, monkeypatch: pytest.MonkeyPatch, jobs: list[str], want: str,
                   version: int = 2, **env: str) -> js.JobRecord:
    """The prolog runs the daemon in ``<want>/slurm_gpu_mps`` and records it, no hold."""
    with monkeypatch.context() as m:
        point = _job_tree(node, m, jobs, version)
        st = _prolog(node, **env)
    cg = point / want / jobcgroup.NAME
    assert st.mps["cgroup"] == [str(cg)] and st.mps["hold"] is None
    # The launcher joined it (its children, the daemon, follow in a real cgroup).
    assert [j for j in jobs if (point / j / jobcgroup.NAME / "cgroup.procs").read_text()] == [want]
    assert not any(os.path.exists(h) for h in node.hold())
    _epilog(node)
    return st


def test_the_daemon_runs_in_the_jobs_cgroup_named_by_its_sluid(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """26.05 names the job's cgroup by SLURM_JOB_SLUID; the prolog records the SLUID."""
    from slurm_gpu import hostctx
    scope = f"system.slice/{hostctx.node_name}_slurmstepd.scope"
    st = _in_job_cgroup(node, monkeypatch, [f"{scope}/s100sluid"], f"{scope}/s100sluid",
                        SLURM_JOB_SLUID="s100sluid")
    assert st.mps["sluid"] == "s100sluid"


def test_the_daemon_runs_in_this_nodes_job_cgroup_never_another_slurmds(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_gpu import hostctx
    mine = f"system.slice/{hostctx.node_name}_slurmstepd.scope/job_100"
    st = _in_job_cgroup(node, monkeypatch, ["system.slice/other_slurmstepd.scope/job_100", mine], mine)
    assert st.mps["sluid"] is None


def test_the_daemon_runs_in_the_job_users_v1_cgroup_never_a_stale_one(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_gpu import hostctx
    top = f"slurm_{hostctx.node_name}"
    mine = f"{top}/uid_{_uid('sgtest1')}/job_100"
    _in_job_cgroup(node, monkeypatch, [f"{top}/uid_0/job_100", mine], mine, version=1)


def test_a_job_of_root_gets_no_daemon(node: Env) -> None:
    root = mps.JobUser(0, 0, "root", (0,))
    with pytest.raises(js.JobFailed) as e:
        mps.start(node.mps, "100", root, "0", [0], None, lambda rec: None)
    assert str(e.value) == "--gpu-mps is refused for root's jobs: the daemon never runs as root (job 100)"
    assert not os.path.exists(f"{node.mps.base_dir}/100")


def _subreaper() -> int:
    import ctypes
    v = ctypes.c_int(-1)
    assert ctypes.CDLL(None, use_errno=True).prctl(37, ctypes.byref(v), 0, 0, 0) == 0   # PR_GET_CHILD_SUBREAPER
    return v.value


def test_the_prolog_is_a_subreaper_only_while_it_starts_the_daemon(node: Env) -> None:
    """Orphans of whatever the prolog runs later (nvidia-smi, scontrol) are never its own."""
    assert _subreaper() == 0
    st = _prolog(node)
    assert _subreaper() == 0 and len(st.mps["daemon"]) == 1
    _epilog(node)


def test_a_quit_no_daemon_answers_is_no_note_its_stragglers_are_killed(node: Env) -> None:
    """What is bound to the pipe may be no daemon (a server or client left over):
    NVIDIA's client then finds none and exits 1, which the epilog does not report."""
    s = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir, quit_timeout=1)
    pipe, _log = mps.make_dirs(s, "100", _user())
    left = _orphan({"CUDA_MPS_PIPE_DIRECTORY": pipe})
    try:
        assert mps.stop(s, None, "100", _user(), kill_wait=2) == [f"MPS: killed stragglers {left}"]
        assert _gone(left)
    finally:
        if not _gone(left):
            os.kill(left, signal.SIGKILL)


def test_start_records_the_daemon_step_by_step(node: Env) -> None:
    """The first record (made before the launch, kept if the prolog dies there) says
    where everything is and that nothing is ready (SPANK gives tasks the daemon only
    once it is); the last adds the daemon.  The state file keeps these fields."""
    seen: list[dict[str, Any]] = []
    info = mps.start(node.mps, "100", _user(), None, [1, 0, 1], 40, lambda r: seen.append(dict(r)))
    jd = f"{node.mps.base_dir}/100"
    try:
        assert seen[0] == {"pipe_dir": f"{jd}/pipe", "log_dir": f"{jd}/log", "job_dir": jd,
                           "control": node.mps.control, "devices": "", "cpus": "0,1", "pids": [],
                           "ready": False, "percentage": 40, "sluid": None, "cgroup": None,
                           "hold": node.hold(),
                           "hold_devices": "not limited: the job's GPU minor numbers are unknown"}
        assert seen[-1] == info and info["ready"] is True and len(info["pids"]) == 1
        assert sorted(info) == sorted([*seen[0], "daemon", "start_s"])
    finally:
        assert mps.stop(node.mps, info, "100", _user(), kill_wait=1) == []
    assert node.leftovers() == []


@pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1")
def test_the_daemon_is_pinned_only_to_cpus_the_prolog_may_use(node: Env) -> None:
    """slurmd (and so its prolog) kept off the GPU's CPU 0: the daemon is not moved
    there, it stays where the prolog may run (pid 1's CPUs are not the prolog's)."""
    was = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {1})
    try:
        st = _prolog(node)                          # GPU 0: local to CPU 0 (Env.node)
    finally:
        os.sched_setaffinity(0, was)
    assert st.mps["cpus"] == "0"
    assert [os.sched_getaffinity(p) for p in st.mps["pids"]] == [{1}]
    _epilog(node)


@pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1")
def test_bind_cpus_off_leaves_the_daemon_on_the_prologs_cpus(node: Env) -> None:
    node.mps = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir, bind_cpus=False)
    st = _prolog(node)                              # GPU 0: local to CPU 0 (Env.node)
    assert [os.sched_getaffinity(p) for p in st.mps["pids"]] == [os.sched_getaffinity(0)]
    _epilog(node)


def test_a_mount_left_after_the_last_detach_leaves_the_directory_with_a_note(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mount the detaches never saw (made after the last one) keeps the directory:
    a note, no drain; the next epilog or sweep removes it."""
    from slurm_gpu.jobs import mpsdir
    s = MpsSettings(base_dir=str(base / "mps"))
    pipe, _log = mps.make_dirs(s, "7", _user())
    m = os.path.join(pipe, "m")
    os.mkdir(m)
    _mount("-t", "tmpfs", "sg-after", m)
    monkeypatch.setattr(mpsdir, "detach_mounts", lambda d, mountinfo="": ([], []))
    assert mps.stop(s, None, "7", _user(), kill_wait=0.1) == [
        f"MPS: mounts in {base}/mps/7 could not be detached (a mount is left below it): "
        "the directory is left"]
    assert _mounts_under(base) == [m]
    monkeypatch.undo()
    assert mps.stop(s, None, "7", _user(), kill_wait=0.1) == [
        f"MPS: detached mounts the job's user made in {base}/mps/7: {m}"]
    assert not os.path.lexists(base / "mps" / "7") and _mounts_under(base) == []


@pytest.fixture()
def two_stragglers(base: Path) -> Iterator[tuple[MpsSettings, str, list[int]]]:
    """Two processes bound to the pipe; stopped without a job user: no quit, killed.
    Whatever a test left of them is killed after it."""
    s = MpsSettings(base_dir=str(base / "mps"))
    pipe, _log = mps.make_dirs(s, "7", _user())
    left = sorted(_orphan({"CUDA_MPS_PIPE_DIRECTORY": pipe}) for _ in range(2))
    try:
        yield s, pipe, left
    finally:
        for p in left:
            if not _gone(p):
                os.kill(p, signal.SIGKILL)


def test_stop_names_every_straggler_it_killed(two_stragglers: tuple[MpsSettings, str, list[int]]) -> None:
    s, _pipe, left = two_stragglers
    assert mps.stop(s, None, "7", None, kill_wait=2) == [f"MPS: killed stragglers {left[0]},{left[1]}"]
    assert all(_gone(p) for p in left)


def test_stragglers_that_survive_sigkill_are_named_in_the_node_fault(
        two_stragglers: tuple[MpsSettings, str, list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Stuck in the driver: SIGKILL is not heard (as test_jobs_lifecycle's daemon)."""
    from slurm_gpu.errors import HardwareError
    s, pipe, left = two_stragglers
    with monkeypatch.context() as m:
        m.setattr(os, "kill", lambda *a: None)
        m.setattr(signal, "pidfd_send_signal", lambda *a: None)
        with pytest.raises(HardwareError) as e:
            mps.stop(s, None, "7", None, kill_wait=0.1)
    assert str(e.value) == f"MPS processes {left[0]},{left[1]} survive SIGKILL for 0.1 s ({pipe})"
    assert os.path.isdir(pipe)                  # left for the next epilog
    assert mps.stop(s, None, "7", None, kill_wait=2) == [f"MPS: killed stragglers {left[0]},{left[1]}"]


def test_stop_ends_the_daemons_cgroup_of_the_job_user_never_a_stale_one(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """v1 (22.05): uid_<uid>/job_<id>/slurm_gpu_mps, found without a record (a lost
    state file); an earlier job 7 of another user (uid_0 sorts first) is not this one."""
    from slurm_gpu import hostctx
    monkeypatch.setattr(hostctx, "node_name", "n1")
    point = base / "freezer"
    mine, stale = (point / "slurm_n1" / f"uid_{u}" / "job_7" / jobcgroup.NAME
                   for u in (_uid("sgtest1"), 0))
    for d in (mine, stale):
        d.mkdir(parents=True)                       # empty: nothing runs in them
    monkeypatch.setattr(jobcgroup, "mounts", lambda mountinfo="": [(str(point), 1, ("freezer",))])
    s = MpsSettings(base_dir=str(base / "mps"))
    mps.make_dirs(s, "7", _user())
    assert mps.stop(s, None, "7", _user(), kill_wait=0.1) == []
    assert not mine.parent.parent.exists() and stale.is_dir()


def test_stop_names_every_late_mount_and_every_one_it_could_not_detach(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two mounts made while the daemon quits (after the first detach): both named; two
    a kernel refuses to detach: both named, with why, and the directory left."""
    from slurm_gpu.jobs import libc
    s = MpsSettings(base_dir=str(base / "mps"))
    pipe, log = mps.make_dirs(s, "7", _user())
    late = [os.path.join(d, "late") for d in (log, pipe)]
    real = mps.daemon_tree

    def mount_late(*a: Any, **k: Any) -> Any:
        for m in late:
            os.mkdir(m)
            _mount("-t", "tmpfs", "sg-late", m)
        return real(*a, **k)
    with monkeypatch.context() as mp:
        mp.setattr(mps, "daemon_tree", mount_late)
        assert mps.stop(s, None, "7", _user(), kill_wait=0.1) == [
            f"MPS: detached mounts the job's user made in {base}/mps/7: {late[0]}, {late[1]}"]
    assert not os.path.lexists(base / "mps" / "7") and _mounts_under(base) == []

    pipe, log = mps.make_dirs(s, "7", _user())
    stuck = [os.path.join(d, "m") for d in (log, pipe)]
    for m in stuck:
        os.mkdir(m)
        _mount("-t", "tmpfs", "sg-stuck", m)

    def refuse(path: str) -> None:
        raise OSError(16, os.strerror(16))
    with monkeypatch.context() as mp:
        mp.setattr(libc, "detach_mount", refuse)
        busy = os.strerror(16)
        assert mps.stop(s, None, "7", _user(), kill_wait=0.1) == [
            f"MPS: mounts in {base}/mps/7 could not be detached ({stuck[0]}: {busy}; {stuck[1]}: {busy}): "
            "the directory is left"]
    assert mps.stop(s, None, "7", _user(), kill_wait=0.1) == [
        f"MPS: detached mounts the job's user made in {base}/mps/7: {stuck[0]}, {stuck[1]}"]
    assert not os.path.lexists(base / "mps" / "7") and _mounts_under(base) == []


def test_stop_ends_the_recorded_cgroup_the_job_names_by_its_sluid(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """26.05: the job's cgroup is named by its SLUID, which only the record keeps."""
    from slurm_gpu import hostctx
    monkeypatch.setattr(hostctx, "node_name", "n1")
    point = base / "cg"
    cg = point / "system.slice" / "n1_slurmstepd.scope" / "s7sluid" / jobcgroup.NAME
    cg.mkdir(parents=True)                          # empty: nothing runs in it
    monkeypatch.setattr(jobcgroup, "mounts", lambda mountinfo="": [(str(point), 2, ())])
    s = MpsSettings(base_dir=str(base / "mps"))
    mps.make_dirs(s, "7", _user())
    info = {"job_dir": f"{base}/mps/7", "cgroup": [str(cg)], "sluid": "s7sluid"}
    assert mps.stop(s, info, "7", _user(), kill_wait=0.1) == []
    assert not cg.parent.exists() and cg.parent.parent.is_dir()


def test_stop_ends_the_recorded_holding_cgroup_of_an_earlier_node_name(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hold the prolog recorded is ended even when the node's name now differs
    (slurmd restarted with another -N): it has the holding cgroup's shape for this job."""
    from slurm_gpu import hostctx
    monkeypatch.setattr(hostctx, "node_name", "n1")
    point = base / "cg"
    hold = point / jobcgroup.HOLD / "n0" / "job_7"
    hold.mkdir(parents=True)                        # empty: nothing runs in it
    monkeypatch.setattr(jobcgroup, "mounts", lambda mountinfo="": [(str(point), 2, ())])
    s = MpsSettings(base_dir=str(base / "mps"))
    mps.make_dirs(s, "7", _user())
    info = {"job_dir": f"{base}/mps/7", "hold": [str(hold)]}
    assert mps.stop(s, info, "7", _user(), kill_wait=0.1) == []
    assert not (point / jobcgroup.HOLD).exists()


def test_stop_leaves_another_slurmds_job_of_the_same_id_alone(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several slurmd on one host (the sandbox's n1, n2): job 7's epilog on n1 never
    ends n2's job 7's slurm_gpu_mps."""
    from slurm_gpu import hostctx
    monkeypatch.setattr(hostctx, "node_name", "n1")
    point = base / "freezer"
    theirs = point / "slurm_n2" / f"uid_{_uid('sgtest1')}" / "job_7" / jobcgroup.NAME
    theirs.mkdir(parents=True)
    monkeypatch.setattr(jobcgroup, "mounts", lambda mountinfo="": [(str(point), 1, ("freezer",))])
    s = MpsSettings(base_dir=str(base / "mps"))
    mps.make_dirs(s, "7", _user())
    assert mps.stop(s, None, "7", _user(), kill_wait=0.1) == []
    assert theirs.is_dir()


def test_processes_in_the_daemons_cgroup_that_survive_sigkill_are_a_node_fault(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever is in the daemon's cgroup is its tree; stuck in the driver it ignores
    SIGKILL: the node's fault, every one named, the cgroup named."""
    from slurm_gpu import hostctx
    from slurm_gpu.errors import HardwareError
    monkeypatch.setattr(hostctx, "node_name", "n1")
    point = base / "cg"
    cg = point / "system.slice" / "n1_slurmstepd.scope" / "job_7" / jobcgroup.NAME
    cg.mkdir(parents=True)
    monkeypatch.setattr(jobcgroup, "mounts", lambda mountinfo="": [(str(point), 2, ())])
    s = MpsSettings(base_dir=str(base / "mps"))
    mps.make_dirs(s, "7", _user())
    stuck = sorted(_orphan({}) for _ in range(2))
    try:
        (cg / "cgroup.procs").write_text("".join(f"{p}\n" for p in stuck))
        with monkeypatch.context() as m:
            m.setattr(os, "kill", lambda *a: None)
            m.setattr(signal, "pidfd_send_signal", lambda *a: None)
            with pytest.raises(HardwareError) as e:
                mps.stop(s, None, "7", _user(), kill_wait=0.1)
        assert str(e.value) == (f"processes {stuck[0]},{stuck[1]} in the MPS cgroup survive SIGKILL "
                                f"for 0.1 s ({cg})")
        assert cg.is_dir() and not any(_gone(p) for p in stuck)
    finally:
        for p in stuck:
            if not _gone(p):
                os.kill(p, signal.SIGKILL)
