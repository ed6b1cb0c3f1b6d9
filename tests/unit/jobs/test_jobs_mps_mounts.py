"""jobs/mps.py and mpsdir.py: what a job user can do to a node through the mounts and the
filesystem of their ``--gpu-mps`` directories fails that user's job, never drains the node.

Real mounts (tmpfs and bind mounts, as root: what the user's FUSE mount does to the
directories), real full filesystems (a small tmpfs) and NVIDIA's real control binary;
every mount a test makes is detached when it ends, whatever happened.
"""
from __future__ import annotations

import os
import pwd
import stat
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from test_jobs_lifecycle import Env

from slurm_gpu.errors import Consequence
from slurm_gpu.jobs import lifecycle, mps, mpsdir
from slurm_gpu.jobs import state as js
from slurm_gpu.jobs.settings import MpsSettings

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")

USER = mps.JobUser(65534, 65534, "nobody")


def _mounts_under(d: str | Path) -> list[str]:
    prefix = os.path.realpath(d).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        return [ln.split()[4] for ln in f if ln.split()[4].startswith(prefix)]


def _mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], check=True)


@pytest.fixture()
def base(tmp_path: Path) -> Iterator[Path]:
    """A root-owned directory for <base>/<jobid>; every mount below it, and any
    immutable flag a test set, is gone afterwards."""
    os.chmod(tmp_path, 0o755)
    try:
        yield tmp_path
    finally:
        for m in reversed(_mounts_under(tmp_path)):
            subprocess.run(["umount", "-l", m], capture_output=True)
        subprocess.run(["chattr", "-R", "-i", str(tmp_path)], capture_output=True)   # a test's immutable dir


def _settings(base_dir: Path) -> MpsSettings:
    return MpsSettings(base_dir=str(base_dir))


def _stop(s: MpsSettings, jobid: str = "7") -> list[str]:
    return mps.stop(s, None, jobid, USER, kill_wait=0.1)


# -- the epilog -------------------------------------------------------------

def test_a_mount_made_while_the_epilog_runs_is_detached_before_the_removal(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user mounts in pipe/ after the epilog's first detach (while the daemon quits):
    the directory is made root's, the mount detached, the directory removed, no drain.
    Its contents are never walked (a FUSE mount of the user's home would lose files)."""
    s = _settings(base / "mps")
    pipe, _log = mps.make_dirs(s, "7", USER)
    late = os.path.join(pipe, "late")
    real = mps.daemon_tree          # the epilog's scan for the daemon, after its first detach

    def mount_late(*a: Any, **k: Any) -> Any:
        os.mkdir(late)
        _mount("-t", "tmpfs", "sg-late", late)
        Path(late, "theirs").write_text("x")
        return real(*a, **k)
    monkeypatch.setattr(mps, "daemon_tree", mount_late)
    notes = _stop(s)
    assert notes == [f"MPS: detached mounts the job's user made in {base}/mps/7: {late}"]
    assert not os.path.lexists(base / "mps" / "7")
    assert _mounts_under(base) == []


def test_a_mount_that_cannot_be_detached_leaves_a_roots_directory_not_a_drain(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """umount2 refused (a kernel that says EBUSY/EPERM): the directory is left, root's and
    mode 0700 all the way down (the user can add nothing), the mount's contents
    untouched; the next sweep or epilog tries again and removes it."""
    from slurm_gpu.jobs import libc
    s = _settings(base / "mps")
    pipe, _log = mps.make_dirs(s, "7", USER)
    os.mkdir(os.path.join(pipe, "sub"))
    os.chown(os.path.join(pipe, "sub"), USER.uid, USER.gid)
    m = os.path.join(pipe, "m")
    os.mkdir(m)
    _mount("-t", "tmpfs", "sg-stuck", m)
    Path(m, "theirs").write_text("x")

    def refuse(path: str) -> None:
        raise OSError(16, os.strerror(16))
    monkeypatch.setattr(libc, "detach_mount", refuse)
    notes = _stop(s)
    assert notes == [f"MPS: mounts in {base}/mps/7 could not be detached ({m}: {os.strerror(16)}): "
                     "the directory is left"]
    for d in (pipe, os.path.join(pipe, "sub")):
        st = os.lstat(d)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o700), d
    assert Path(m, "theirs").read_text() == "x"
    monkeypatch.undo()
    assert _stop(s) == [f"MPS: detached mounts the job's user made in {base}/mps/7: {m}"]
    assert not os.path.lexists(base / "mps" / "7") and _mounts_under(base) == []


def test_a_mount_on_a_file_is_detached(base: Path) -> None:
    """fusermount3 mounts on a regular file the user owns: reached without O_DIRECTORY,
    detached, and the directory removed."""
    s = _settings(base / "mps")
    pipe, _log = mps.make_dirs(s, "7", USER)
    f = os.path.join(pipe, "f")
    Path(f).write_text("")
    _mount("--bind", "/etc/hostname", f)
    assert _stop(s) == [f"MPS: detached mounts the job's user made in {base}/mps/7: {f}"]
    assert not os.path.lexists(base / "mps" / "7") and _mounts_under(base) == []


def test_mounts_are_found_below_a_base_dir_reached_through_a_symlink(base: Path) -> None:
    """base_dir = /var/run/slurm-gpu/mps where /var/run -> /run (root's symlink):
    mountinfo names the real path, which is what is compared."""
    (base / "real").mkdir(mode=0o755)
    (base / "link").symlink_to(base / "real")
    s = _settings(base / "link" / "mps")
    pipe, _log = mps.make_dirs(s, "7", USER)
    os.mkdir(os.path.join(pipe, "m"))
    _mount("-t", "tmpfs", "sg-sym", os.path.join(pipe, "m"))
    jd = str(base / "link" / "mps" / "7")
    assert mpsdir.mounts_below(jd) == [f"{base}/real/mps/7/pipe/m"]
    assert _stop(s) == [f"MPS: detached mounts the job's user made in {jd}: {base}/real/mps/7/pipe/m"]
    assert not os.path.lexists(jd) and _mounts_under(base) == []


def test_a_requeued_jobs_prolog_detaches_what_its_earlier_run_left_mounted(base: Path) -> None:
    """An earlier run's directory (its epilog left it: a mount it could not detach then)
    is made afresh for the same job: the mount detached, never walked, never a drain."""
    s = _settings(base / "mps")
    pipe, _log = mps.make_dirs(s, "7", USER)
    m = os.path.join(pipe, "m")
    os.mkdir(m)
    _mount("-t", "tmpfs", "sg-left", m)
    Path(m, "theirs").write_text("x")
    assert mps.make_dirs(s, "7", USER) == (pipe, _log)
    assert os.listdir(pipe) == [] and _mounts_under(base) == []


def test_mounted_over_names_what_is_mounted_in_the_job_directory(base: Path) -> None:
    """From mountinfo (odd names quoted), else from a directory on another device."""
    jd = base / "7"
    (jd / "pipe").mkdir(parents=True)
    (jd / "log").mkdir()
    mi = base / "mountinfo"
    mi.write_text(f"40 22 0:40 / {jd}/log rw - fuse f rw\n"
                  f"41 22 0:41 / {jd}/pipe/a\\012b rw - fuse f rw\n")
    assert mpsdir.mounted_over(str(jd), str(mi)) == "log, 'pipe/a\\nb'"
    mi.write_text("")
    assert mpsdir.mounted_over(str(jd), str(mi)) is None
    _mount("-t", "tmpfs", "sg-over", str(jd / "pipe"))
    assert mpsdir.mounted_over(str(jd), str(mi)) == "pipe"      # not in that mountinfo: by device
    assert mpsdir.mounted_over(str(jd)) == "pipe"


# -- the prolog -------------------------------------------------------------

@pytest.fixture()
def node(base: Path) -> Iterator[Env]:
    n = Env()
    try:
        yield n
    finally:
        for m in reversed(_mounts_under(n.base)):
            subprocess.run(["umount", "-l", m], capture_output=True)
        n.close()


def _after_make_dirs(monkeypatch: pytest.MonkeyPatch, act: Callable[[str, str], None]) -> None:
    """Run *act(pipe, log)* right after the prolog made (and chowned) the job's directories:
    what another process of the job's user can do there before the daemon starts."""
    real = mps.make_dirs

    def made(*a: Any) -> tuple[str, str]:
        pipe, log = real(*a)
        act(pipe, log)
        return pipe, log
    monkeypatch.setattr(mps, "make_dirs", made)


def _prolog_fails_the_job(node: Env) -> str:
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st is not None and st.phase == "failed" and st.consequence == Consequence.USER, node.logs
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == [] and _mounts_under(node.mps.base_dir) == []
    return str(st.error)


def test_the_pipe_directory_mounted_over_in_the_prolog_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mount over <job>/pipe (squashfuse, fusermount3 -o ro), made as soon as the
    prolog chowned it: NVIDIA's daemon says "Cannot access CUDA_MPS_PIPE_DIRECTORY"."""
    node.mps = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir,
                           start_timeout=5, quit_timeout=1)
    _after_make_dirs(monkeypatch, lambda pipe, log: _mount(
        "-t", "tmpfs", "-o", "ro,mode=0700", "sg-over", pipe))
    assert _prolog_fails_the_job(node) == (
        "MPS control daemon could not start: pipe was mounted over by a process of the "
        "job's user (job 100)")


def test_the_log_directory_mounted_over_leaves_the_job_running(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVIDIA's daemon starts without its log directory; the epilog detaches the mount."""
    node.mps = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir,
                           start_timeout=5, quit_timeout=1)
    _after_make_dirs(monkeypatch, lambda pipe, log: _mount(
        "-t", "tmpfs", "-o", "ro,mode=0700", "sg-over", log))
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st is not None and st.phase == "ready", node.logs
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == [] and _mounts_under(node.mps.base_dir) == []


def _fill(d: str) -> None:
    i = 0
    try:
        while True:
            Path(d, f"f{i}").write_text("")
            i += 1
    except OSError as e:
        assert e.errno == 28


def _small_run(node: Env) -> Path:
    """A 16-inode tmpfs as the node's /run, the MPS base directory on it."""
    run = node.base / "run"
    run.mkdir(mode=0o755)
    _mount("-t", "tmpfs", "-o", "nr_inodes=16,mode=0755", "sg-run", str(run))
    node.mps = MpsSettings(control=node.mps.control, base_dir=str(run / "mps"),
                           start_timeout=5, quit_timeout=1)
    (run / "mps").mkdir(mode=0o755)
    return run


@pytest.mark.parametrize("when", ["dirs", "daemon"])
def test_a_full_filesystem_under_the_mps_dirs_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """/run (a small tmpfs) filled through a pipe directory: making the next job's
    directories, or its daemon's start, fails that job with one line naming the
    filesystem; the node stays up."""
    run = _small_run(node)
    if when == "dirs":
        _fill(str(run))
        want = (f"--gpu-mps: the filesystem {run} is full (No space left on device): "
                "the job's MPS directories cannot be made (job 100)")
    else:
        _after_make_dirs(monkeypatch, lambda pipe, log: _fill(str(run)))
        want = (f"MPS control daemon could not start: the filesystem {run} of its directories "
                "is full (job 100)")
    assert _prolog_fails_the_job(node) == want


# -- the user's directories, changed before the daemon starts: evidence from the failure --

def test_a_filesystem_freed_before_the_prolog_looks_still_fails_only_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's user fills /run once the directories are made, so NVIDIA's launcher
    cannot use the pipe directory, and empties it again before the prolog looks
    (statvfs then shows room): the launcher's own word is the evidence, so the job
    fails and the node stays up."""
    run = _small_run(node)
    _after_make_dirs(monkeypatch, lambda pipe, log: _fill(str(run)))
    real = mpsdir.full_filesystem

    def freed_first(d: str) -> str | None:
        for f in run.glob("f*"):
            f.unlink()
        return real(d)
    monkeypatch.setattr(mpsdir, "full_filesystem", freed_first)
    assert _prolog_fails_the_job(node) == (
        "MPS control daemon could not start: it cannot access its pipe directory, which is the "
        "job's user's (changed by a process of theirs?) (job 100)")


def test_a_pipe_directory_its_user_made_unreadable_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """chmod 000 on the pipe directory (its owner may): NVIDIA's launcher says
    "Cannot access CUDA_MPS_PIPE_DIRECTORY" and exits 1."""
    node.mps = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir,
                           start_timeout=5, quit_timeout=1)
    _after_make_dirs(monkeypatch, lambda pipe, log: os.chmod(pipe, 0))
    assert _prolog_fails_the_job(node) == (
        "MPS control daemon could not start: it cannot access its pipe directory, which is the "
        "job's user's (changed by a process of theirs?) (job 100)")


def test_a_fifo_planted_as_the_control_lock_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO at pipe/control_lock: NVIDIA's launcher blocks opening it until its
    time is up (seen with the real binary); the prolog finds what was planted."""
    node.mps = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir,
                           start_timeout=1, quit_timeout=1)

    def plant(pipe: str, log: str) -> None:
        fifo = os.path.join(pipe, "control_lock")
        os.mkfifo(fifo)
        os.chown(fifo, os.stat(pipe).st_uid, -1)        # the user's own, as they would make it
    _after_make_dirs(monkeypatch, plant)
    assert _prolog_fails_the_job(node) == (
        "MPS control daemon could not start: its pipe directory was changed by a process of "
        "the job's user (found 'control_lock') (job 100)")


def test_a_base_directory_job_users_cannot_search_is_the_nodes_fault(node: Env) -> None:
    """Where the admin's base shuts job users out, every --gpu-mps job would fail with
    "Cannot access CUDA_MPS_PIPE_DIRECTORY": the node's fault, said before any start,
    so that message from the launcher can only ever be the job user's doing."""
    closed = node.base / "closed"
    closed.mkdir(mode=0o700)
    node.mps = MpsSettings(control=node.mps.control, base_dir=str(closed / "mps"),
                           start_timeout=5, quit_timeout=1)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 1
    assert node.logs == [f"slurm-gpu: MPS base directory is not searchable by job users ({closed} "
                         f"lacks the x bit for others) ({closed / 'mps'}) [job 100: node fault, "
                         "on_internal_error=drain]"], node.logs
    assert lifecycle.epilog(ctx) == 0, node.logs


def test_a_base_directory_made_under_umask_077_lets_the_job_in(node: Env) -> None:
    """slurmd may run the prolog with umask 077: the base and its missing parents
    are made 0755 all the same, and the daemon starts."""
    base = node.base / "made" / "mps"
    node.mps = MpsSettings(control=node.mps.control, base_dir=str(base),
                           start_timeout=5, quit_timeout=1)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    old = os.umask(0o077)
    try:
        assert lifecycle.prolog(ctx) == 0, node.logs
    finally:
        os.umask(old)
    st = js.load(node.state_dir, "100")
    assert st is not None and st.phase != "failed", st
    assert [stat.S_IMODE(os.stat(d).st_mode) for d in (base.parent, base)] == [0o755, 0o755]
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == []


def test_a_control_lock_its_user_holds_fails_the_job(node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process of the job's user makes pipe/control_lock and holds a write lock
    on it, the lock NVIDIA's daemon takes: the launcher says "An instance of this daemon
    is already running" and exits 1 (hostile review, this session: HIGH-1)."""
    from useragent import Agent
    node.mps = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir,
                           start_timeout=5, quit_timeout=1)
    agent = Agent("import fcntl\nfd = os.open(arg + '/control_lock', os.O_WRONLY | os.O_CREAT, 0o666)\n"
                  "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nkeep.append(fd)\n")
    try:
        _after_make_dirs(monkeypatch, lambda pipe, log: agent.do(pipe))
        assert _prolog_fails_the_job(node) == (
            "MPS control daemon could not start: nvidia-cuda-mps-control -d failed: An instance of this "
            "daemon is already running (its directories and daemon are the job's user's) (job 100)")
    finally:
        agent.close()


@pytest.mark.parametrize("how, status", [("kill", "killed by signal 9"), ("quit", "exit status 0")])
def test_a_daemon_its_user_ended_before_the_prolog_saw_it_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch, how: str, status: str) -> None:
    """As soon as -d returns, another process of the job's user kills the daemon, or
    tells it to quit (it exits 0), and removes its control.log: nothing the user can
    reach says it started, but the prolog, its subreaper, collects it and how it
    ended (the daemon leads its own session) (hostile review, this session: HIGH-3)."""
    import time

    from slurm_gpu import runner
    from slurm_gpu.jobs.mps import daemon_pids
    node.mps = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir,
                           start_timeout=2, quit_timeout=1)
    real = runner.run

    def launched(argv: list[str], *a: Any, **k: Any) -> Any:
        res = real(argv, *a, **k)
        if argv[1:] == ["-d"]:
            pipe, log = k["env"]["CUDA_MPS_PIPE_DIRECTORY"], k["env"]["CUDA_MPS_LOG_DIRECTORY"]
            if how == "kill":
                for pid in daemon_pids(pipe):
                    os.kill(pid, 9)
            else:
                assert real([argv[0]], 5, input="quit\n", env=k["env"], run_as=k["run_as"], check=False).ok
            deadline = time.monotonic() + 5          # ended before the prolog's first look
            while daemon_pids(pipe) and time.monotonic() < deadline:
                time.sleep(0.01)
            Path(log, "control.log").unlink(missing_ok=True)
        return res
    monkeypatch.setattr(runner, "run", launched)
    assert _prolog_fails_the_job(node) == (
        f"MPS control daemon exited before it answered ({status}; by a process of the job's user?) (job 100)")


def test_a_silent_connection_its_user_holds_on_the_control_socket_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process of the job's user connects to pipe/control as it appears and
    holds the connection silent: NVIDIA's daemon then never answers the prolog's
    client (second hostile review, HIGH-1).  Its silence proves no node fault."""
    import time

    from useragent import Agent

    from slurm_gpu import runner
    node.mps = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir,
                           start_timeout=2, quit_timeout=1)
    agent = Agent("s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\ns.connect(arg + '/control')\n"
                  "keep.append(s)\n")
    real = runner.run

    def launched(argv: list[str], *a: Any, **k: Any) -> Any:
        res = real(argv, *a, **k)
        if argv[1:] == ["-d"]:
            monkeypatch.setattr(runner, "run", real)
            agent.do(k["env"]["CUDA_MPS_PIPE_DIRECTORY"])
            time.sleep(0.1)
        return res
    try:
        monkeypatch.setattr(runner, "run", launched)
        error = _prolog_fails_the_job(node)
    finally:
        agent.close()
    assert error.startswith("MPS control daemon runs but did not answer (") and error.endswith(
        "a process of the job's user may hold its socket) (job 100)"), error


@pytest.fixture()
def nproc_limit() -> Iterator[Callable[[bool], None]]:
    """slurmd's LimitNPROC, as the job's user (Env's: sgtest1) reaches it: one
    process of theirs runs, and calling the fixture's value with True sets this process's
    RLIMIT_NPROC to 0, with False back (root is not limited, the user is: the
    kernel compares the user's count)."""
    import resource
    import pwd
    pw = pwd.getpwnam("sgtest1")
    other = subprocess.Popen(["/bin/sleep", "60"], user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    old = resource.getrlimit(resource.RLIMIT_NPROC)
    try:
        yield lambda on: resource.setrlimit(resource.RLIMIT_NPROC, (0, old[1]) if on else old)
    finally:
        resource.setrlimit(resource.RLIMIT_NPROC, old)
        other.kill()
        other.wait()


@pytest.mark.parametrize("when", ["launcher", "client"])
def test_a_user_at_their_process_limit_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch, nproc_limit: Callable[[bool], None],
        when: str) -> None:
    """Under slurmd's finite LimitNPROC, a job's user with as many processes as it allows
    (a fork bomb in an earlier job of theirs) makes the launcher's or the client's exec
    fail with EAGAIN after the identity is dropped: their doing, never the node's
    (second hostile review, HIGH-2)."""
    import pwd

    from slurm_gpu import runner
    node.mps = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir,
                           start_timeout=2, quit_timeout=1)
    real = runner.run

    def launched(argv: list[str], *a: Any, **k: Any) -> Any:
        if argv[1:] == ["-d"] and when == "launcher":
            nproc_limit(True)
        res = real(argv, *a, **k)
        if argv[1:] == ["-d"] and when == "client":
            nproc_limit(True)
        return res
    monkeypatch.setattr(runner, "run", launched)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    try:
        assert lifecycle.prolog(ctx) == 0, node.logs
    finally:
        nproc_limit(False)
    monkeypatch.setattr(runner, "run", real)
    st = js.load(node.state_dir, "100")
    assert st is not None and st.phase == "failed" and st.consequence == Consequence.USER, node.logs
    assert st.error == (f"cannot run {node.mps.control} as uid {pwd.getpwnam('sgtest1').pw_uid}: that user has as many processes "
                        "as its limit allows (RLIMIT_NPROC)"), st.error
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == []


def test_a_pipe_directory_shut_once_the_daemon_listens_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once -d has returned (the daemon listens), another process of the job's user
    makes pipe/ mode 000: every client is refused ("Cannot find MPS control daemon
    process") until the prolog's time is up (review round 3, H1: it drained the node)."""
    from useragent import CHMOD_DIR, Agent

    from slurm_gpu import runner
    node.mps = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir,
                           start_timeout=2, quit_timeout=1)
    agent = Agent(CHMOD_DIR)
    real = runner.run

    def launched(argv: list[str], *a: Any, **k: Any) -> Any:
        res = real(argv, *a, **k)
        if argv[1:] == ["-d"]:
            agent.do(k["env"]["CUDA_MPS_PIPE_DIRECTORY"])
        return res
    monkeypatch.setattr(runner, "run", launched)
    try:
        error = _prolog_fails_the_job(node)
    finally:
        agent.close()
    assert error == ("MPS control daemon cannot be reached: its pipe directory was made mode 000 "
                     "by a process of the job's user (job 100)"), error


def test_a_daemon_alive_but_never_reached_fails_the_job(node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every client refused until the prolog's time is up, with the daemon (ours) alive
    and its directories as they were made (put back by the user's process, say): the
    control daemon touches no GPU before a client's server, so its silence proves no
    node fault (review round 3, H1)."""
    from slurm_gpu import runner
    node.mps = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir,
                           start_timeout=1, quit_timeout=1)
    real = runner.run

    def refused(argv: list[str], *a: Any, **k: Any) -> Any:
        res = real(argv, *a, **k)
        if argv[1:] == [] and k.get("input", "").startswith("get_server_list"):
            return res._replace(returncode=1, stdout="Cannot find MPS control daemon process\n")
        return res
    monkeypatch.setattr(runner, "run", refused)
    assert _prolog_fails_the_job(node) == (
        "MPS control daemon runs but did not answer within 1 s (its directories are the job's "
        "user's) (job 100)")


# -- the epilog and processes it must not end, or cannot ----------------------

@pytest.fixture()
def other_job_cgroup() -> Iterator[Callable[[int], None]]:
    """Move a pid into another job's cgroup (v1 freezer: Slurm's
    /slurm_<node>/uid_<uid>/job_999, as proctrack/cgroup makes it); removed after."""
    from slurm_gpu.jobs import jobcgroup
    found = [p for p, v, c in jobcgroup.mounts() if v == 1 and "freezer" in c]
    if not found:
        pytest.skip("no cgroup v1 freezer hierarchy here")
    top = Path(found[0]) / f"slurm_sgtest{os.getpid()}"
    job = top / "uid_1001" / "job_999"
    job.mkdir(parents=True)
    try:
        yield lambda pid: (job / "cgroup.procs").write_text(str(pid))
    finally:
        for pid in (job / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        import time
        deadline = time.monotonic() + 5
        while (job / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.02)
        for d in (job, job.parent, top):
            d.rmdir()


def test_the_epilog_leaves_another_jobs_process_that_names_this_pipe_alone(
        node: Env, other_job_cgroup: Callable[[int], None]) -> None:
    """A process of the same user in another job of theirs, with this job's pipe
    directory in its environment, is that job's: this job's epilog does not kill
    it (review round 3, H3: it did, with its children)."""
    from useragent import Agent
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st is not None and st.mps
    agent = Agent("pass", env={"CUDA_MPS_PIPE_DIRECTORY": st.mps["pipe_dir"]})
    try:
        other_job_cgroup(agent.pid)
        assert lifecycle.epilog(ctx) == 0, node.logs
        # what names the pipe now is the other job's process alone
        assert node.leftovers() == ["daemon"] and mps.daemon_pids(st.mps["pipe_dir"]) == [agent.pid]
        agent.do("still alive")
    finally:
        agent.close()


@pytest.fixture()
def fusectl() -> Iterator[bool]:
    """fusectl at /sys/fs/fuse/connections (systemd mounts it at boot); mounted for the
    test where it is not, and unmounted after."""
    d = "/sys/fs/fuse/connections"
    with open("/proc/self/mountinfo") as f:
        there = any(ln.split()[4] == d for ln in f)
    if not there:
        if subprocess.run(["mount", "-t", "fusectl", "fusectl", d], capture_output=True).returncode:
            pytest.skip("cannot mount fusectl")
    try:
        yield True
    finally:
        if not there:
            subprocess.run(["umount", d], capture_output=True)


# The job user of the FUSE tests: one the integration tests, which may run beside
# these (make test), never run jobs as, so that no job of theirs elsewhere on the
# host turns the abort these tests expect into a note (mps._users_other_jobs).
FUSE_USER = "nobody"
FUSE_UID = pwd.getpwnam(FUSE_USER).pw_uid
FUSE_GID = pwd.getpwnam(FUSE_USER).pw_gid


def _mps_job_where_fuse_runs(node: Env) -> tuple[Any, Any]:
    """Skip where FUSE cannot run; else a --gpu-mps job's context (of :data:`FUSE_USER`)
    and record, its prolog done."""
    from fusestall import available
    if not available():
        pytest.skip("no FUSE here")
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default", SLURM_JOB_UID=str(FUSE_UID),
                   SLURM_JOB_GID=str(FUSE_GID), SLURM_JOB_USER=FUSE_USER)
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st is not None and st.mps
    return ctx, st


def _blocked_in_fuse(node: Env, uid: int,
                     code: str = "if not os.fork():\n    open(arg)\n",
                     _and_then: Callable[[Path], None] | None = None) -> tuple[list[str], int, Any]:
    """Prolog a --gpu-mps job, then a process of its user's, bound to its pipe directory,
    blocks in a FUSE filesystem mounted for *uid* whose server never answers; the
    epilog runs.  Returns (the epilog's log lines, its exit status, the agent)."""
    from fusestall import StallingFuse
    from useragent import Agent
    ctx, st = _mps_job_where_fuse_runs(node)
    mnt = node.base / "fuse"
    mnt.mkdir()
    fs = StallingFuse(str(mnt), uid=uid, gid=uid)
    agent = Agent(code, env={"CUDA_MPS_PIPE_DIRECTORY": st.mps["pipe_dir"]},
                  user=FUSE_USER)
    try:
        agent.do(str(mnt / "x"))
        assert fs.taken.wait(10)
        if _and_then is not None:
            _and_then(mnt)
        rc = lifecycle.epilog(ctx)
        return list(node.logs), rc, agent
    finally:
        fs.close()
        agent.close()


def test_a_process_blocked_in_the_users_fuse_at_the_epilog_is_no_node_fault(node: Env) -> None:
    """A process of the job's, bound to its pipe directory, blocked in a FUSE request
    of its user's server, survives SIGKILL: without fusectl the epilog notes it and
    ends without a drain (review round 3, H3)."""
    import re
    with open("/proc/self/mountinfo") as f:
        if any(ln.split()[4] == "/sys/fs/fuse/connections" for ln in f):
            pytest.skip("fusectl is mounted here: the abort is tested below")
    logs, rc, _agent = _blocked_in_fuse(node, FUSE_UID)
    assert rc == 0, logs
    assert [ln for ln in logs if re.fullmatch(
        r"slurm-gpu: epilog job 100: MPS: processes \d+ survive SIGKILL, blocked in a FUSE request "
        r"\(request_wait_answer\) while the job's user has FUSE mounts: left to end when their "
        r"server answers", ln)], logs
    assert js.load(node.state_dir, "100") is None


def test_the_epilog_aborts_the_users_fuse_that_holds_a_process_past_sigkill(
        node: Env, fusectl: bool) -> None:
    """With fusectl (systemd mounts it), the job's user's FUSE connections with requests
    waiting are aborted: the held process ends, nothing is left, no drain (review
    round 4, H2: a process that holds its own server's /dev/fuse never ends otherwise)."""
    logs, rc, _agent = _blocked_in_fuse(node, FUSE_UID)
    assert rc == 0, logs
    assert [ln for ln in logs if "FUSE" in ln] == [
        f"slurm-gpu: epilog job 100: MPS: aborted FUSE connections of the job's user that held "
        f"processes past SIGKILL: {node.base}/fuse"], logs
    assert node.leftovers() == []


def test_a_thread_that_waits_behind_the_users_fuse_request_is_no_node_fault(
        node: Env, fusectl: bool) -> None:
    """One thread of the process waits in its user's FUSE request (a lookup, under its
    directory's lock); another waits for that lock, in the VFS (``filename_create``),
    not in FUSE: the process is still held by its user's FUSE, whose abort ends both
    (review round 5, H2: it drained the node)."""
    code = ("if not os.fork():\n"
            "    import threading, time\n"
            "    threading.Thread(target=os.mkdir, args=(arg,), daemon=True).start()\n"
            "    time.sleep(0.5)\n"
            "    os.mkdir(arg)\n")
    logs, rc, _agent = _blocked_in_fuse(node, FUSE_UID, code)
    assert rc == 0, logs
    assert [ln for ln in logs if "FUSE" in ln] == [
        f"slurm-gpu: epilog job 100: MPS: aborted FUSE connections of the job's user that held "
        f"processes past SIGKILL: {node.base}/fuse"], logs
    assert node.leftovers() == []


# Run as the job's user inside ``unshare -Urm`` (their own user and mount namespaces,
# what rootless apptainer and podman make): a FUSE filesystem of theirs mounted
# there, invisible from the node's namespace, and a process bound to the pipe
# directory (its own environment: the server's is not) blocked in it.
_IN_USERNS = """
import os, sys, time
sys.path.insert(0, sys.argv[3])
from fusestall import StallingFuse
mnt, pipe, dev, child = sys.argv[1], sys.argv[2], sys.argv[4], sys.argv[5]
fs = StallingFuse(mnt, uid=0, gid=0, dev=dev)
if not os.fork():
    os.execve("/usr/bin/python3", ["python3", "-I", "-c", child, mnt + "/x"],
              {"CUDA_MPS_PIPE_DIRECTORY": pipe})
assert fs.taken.wait(10)
time.sleep(0.6)                     # the leaderless child's main thread has exited
print("ready", flush=True)
sys.stdin.read()
fs.close()
"""


# The bound process forks one whose other thread waits in the FUSE request and whose
# main thread then exits (pthread_exit): its /proc/PID/ns/mnt and mountinfo are gone,
# its thread's are not (review round 5's second look, R2).
_LEADERLESS = ("import os, sys, threading, ctypes, time\n"
               "if os.fork() == 0:\n"
               "    threading.Thread(target=open, args=(sys.argv[1],)).start()\n"
               "    time.sleep(0.3)\n"
               "    ctypes.CDLL(None).pthread_exit(None)\n"
               "time.sleep(3600)\n")


@pytest.mark.parametrize("child", ["import sys; open(sys.argv[1])", _LEADERLESS],
                         ids=["plain", "leaderless"])
def test_a_process_held_by_the_users_fuse_in_their_own_namespaces_is_no_node_fault(
        node: Env, fusectl: bool, child: str) -> None:
    """The job's user's FUSE lives in a mount namespace of theirs (unshare -Urm, rootless
    containers): the node's mountinfo does not show it, the held process's does; in a
    user namespace of theirs every FUSE mount is theirs, whatever ``user_id=`` it
    prints (0 there).  Aborted, no drain (review round 5, H1), also when the held
    process's main thread has exited (its waiting thread's namespace is read)."""
    ctx, st = _mps_job_where_fuse_runs(node)
    mnt = node.base / "userfuse"
    mnt.mkdir()
    os.chown(mnt, FUSE_UID, FUSE_GID)
    # /dev/fuse is 0666 on a node (fuse3's udev rule), 0600 in some containers:
    # the user's own node of that device, then (the opener's user namespace must
    # be the mount's: fs/fuse/inode.c, fuse_fill_super).
    dev = node.base / "fuse-dev"
    os.mknod(dev, stat.S_IFCHR | 0o600, os.stat("/dev/fuse").st_rdev)
    os.chown(dev, FUSE_UID, FUSE_GID)
    tests = str(Path(__file__).resolve().parents[2])
    server = subprocess.Popen(["/usr/bin/unshare", "-Urm", "/usr/bin/python3", "-I", "-c", _IN_USERNS,
                               str(mnt), st.mps["pipe_dir"], tests, str(dev), child],
                              user=FUSE_UID, group=FUSE_GID, extra_groups=[], env={"PATH": "/usr/bin:/bin"},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        with open("/proc/self/mountinfo") as f:
            assert str(mnt) not in f.read()              # not in the node's namespace
        rc = lifecycle.epilog(ctx)
        assert rc == 0, node.logs
        assert [ln for ln in node.logs if "FUSE" in ln] == [
            f"slurm-gpu: epilog job 100: MPS: aborted FUSE connections of the job's user that held "
            f"processes past SIGKILL: {mnt}"], node.logs
        assert node.leftovers() == []
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(10)


def test_a_sites_fuse_seen_through_the_users_own_namespaces_is_still_the_nodes(
        node: Env, fusectl: bool) -> None:
    """``unshare -Urm`` copies the node's mounts, a site's FUSE filesystem (root's:
    CVMFS) among them, into the user's namespaces: a process of the job blocked there
    is the node's fault, and the site's connection is never aborted (its copy in the
    user's namespace is not the user's mount)."""
    from fusestall import StallingFuse
    ctx, st = _mps_job_where_fuse_runs(node)
    mnt = node.base / "site"
    mnt.mkdir()
    fs = StallingFuse(str(mnt), uid=0, gid=0)
    held = subprocess.Popen(["/usr/bin/unshare", "-Urm", "/usr/bin/python3", "-I", "-c",
                             "import sys; open(sys.argv[1])", str(mnt / "x")],
                            user=FUSE_UID, group=FUSE_GID, extra_groups=[],
                            env={"PATH": "/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": st.mps["pipe_dir"]})
    try:
        assert fs.taken.wait(10)
        rc = lifecycle.epilog(ctx)
        assert rc == 1, node.logs
        assert len(node.logs) == 1 and "survive SIGKILL" in node.logs[0], node.logs
        assert held.poll() is None                    # nothing aborted the site's connection
    finally:
        fs.close()
        held.wait(10)
    assert lifecycle.epilog(ctx) == 0, node.logs      # the retry, once the site's server answers


def test_the_users_fuse_is_not_aborted_while_another_job_of_theirs_runs_here(
        node: Env, fusectl: bool, other_job_cgroup: Callable[[int], None]) -> None:
    """fusectl cannot tell which of the user's FUSE connections serve which job: while
    another job of theirs has processes on the node, none is aborted (that job's
    filesystem would fail under it); the held process is noted, no drain (review
    round 5, M1)."""
    from useragent import Agent
    other = Agent("pass", user=FUSE_USER)
    try:
        other_job_cgroup(other.pid)
        logs, rc, _agent = _blocked_in_fuse(node, FUSE_UID)
        assert rc == 0, logs
        fuse = [ln for ln in logs if "FUSE" in ln]
        assert len(fuse) == 1 and "MPS: aborted FUSE" not in fuse[0], logs
        assert fuse[0].endswith("left to end when their server answers (not aborted: the job's user "
                                "has processes in job_999 here)"), logs
        other.do("still alive")
    finally:
        other.close()


def test_a_held_leftover_in_another_job_does_not_keep_the_users_fuse_from_abort(
        node: Env, fusectl: bool, other_job_cgroup: Callable[[int], None]) -> None:
    """What counts as another job of the user's running here is a process that runs:
    one of theirs in another job's cgroup that is itself held in FUSE (a leftover an
    earlier epilog noted) turned the abort off for every later job of theirs on the
    node (review round 5, M1's second look)."""
    stuck: list[Any] = []
    logs, rc, _agent = _blocked_in_fuse(node, FUSE_UID, _and_then=lambda mnt: stuck.append(
        _held_in(other_job_cgroup, str(mnt / "y"))))
    for a in stuck:
        a.close()
    assert rc == 0, logs
    assert [ln for ln in logs if "FUSE" in ln] == [
        f"slurm-gpu: epilog job 100: MPS: aborted FUSE connections of the job's user that held "
        f"processes past SIGKILL: {node.base}/fuse"], logs


def _held_in(other_job_cgroup: Callable[[int], None], path: str) -> Any:
    """A process of sgtest1's in another job's cgroup, blocked opening *path*, and
    nothing else of theirs there."""
    import time

    from useragent import Agent

    from slurm_gpu.procfs import in_fuse_request, parent
    a = Agent("if not os.fork():\n    open(arg)\n", user=FUSE_USER)
    other_job_cgroup(a.pid)
    a.do(path)                          # its child, in the same cgroup, opens and waits

    def held() -> list[int]:
        return [int(d) for d in os.listdir("/proc") if d.isdigit() and parent(d) == a.pid
                and in_fuse_request(d)]
    deadline = time.monotonic() + 10
    while not held() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held()
    a.close()                           # the child alone is left there, held
    return a


def test_a_process_stuck_in_a_sites_fuse_at_the_epilog_is_the_nodes_fault(node: Env, fusectl: bool) -> None:
    """A FUSE filesystem of root's (a site's: CVMFS, a virtiofs root) that holds a
    process past SIGKILL is the node's fault, and is never aborted (review round 4, H1)."""
    logs, rc, _agent = _blocked_in_fuse(node, 0)
    assert rc == 1, logs
    assert len(logs) == 1 and "survive SIGKILL" in logs[0] and "cleanup incomplete" in logs[0], logs


def test_a_fuse_mount_over_the_pipe_directory_that_never_answers_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once -d has returned, the job's user mounts a FUSE filesystem of theirs over
    pipe/ whose server takes each request and never answers: the prolog's client
    (run as the user) waits uninterruptibly, SIGKILL stays pending.  The prolog
    gives it up and fails the job (review round 3, H2: the prolog never returned)."""
    import threading

    from fusestall import StallingFuse, available

    from slurm_gpu import runner
    if not available():
        pytest.skip("no FUSE here")
    node.mps = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir,
                           start_timeout=1, quit_timeout=1)
    real = runner.run
    mounted: list[StallingFuse] = []

    def launched(argv: list[str], *a: Any, **k: Any) -> Any:
        res = real(argv, *a, **k)
        if argv[1:] == ["-d"]:
            mounted.append(StallingFuse(k["env"]["CUDA_MPS_PIPE_DIRECTORY"], uid=1001, gid=1001,
                                        allow_other=False))
        return res
    monkeypatch.setattr(runner, "run", launched)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    box: list[int] = []
    try:
        t = threading.Thread(target=lambda: box.append(lifecycle.prolog(ctx)), daemon=True)
        t.start()
        t.join(60)
        assert box == [0], ("the prolog did not return", node.logs)
        assert mounted and mounted[0].requests >= 1
        st = js.load(node.state_dir, "100")
        assert st is not None and st.phase == "failed" and st.consequence == Consequence.USER, node.logs
        assert st.error == ("MPS control client could not be ended after its time out: it is blocked "
                            "in a FUSE request (request_wait_answer) (by a process of the job's user?) "
                            "(job 100)"), st.error
    finally:
        for fs in mounted:
            fs.close()
    monkeypatch.setattr(runner, "run", real)
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == []


def test_a_lost_record_epilog_still_ends_a_daemon_in_a_sluid_named_cgroup(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """26.05 names a job's cgroup by its SLUID.  With the record lost, the epilog does
    not know its job's SLUID: a process in a SLUID-named directory may be its own
    daemon, which must still be ended (review round 4, H3).  No cgroup hierarchy
    here (the daemon is found by its environment), every process in a SLUID's."""
    from slurm_gpu import slurmcgroup
    from slurm_gpu.jobs import jobcgroup
    monkeypatch.setattr(jobcgroup, "mounts", lambda *a, **k: [])
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st is not None and st.mps and mps.daemon_pids(st.mps["pipe_dir"])
    monkeypatch.setattr(slurmcgroup, "job_dir_of_pid", lambda proc, pid: "sEKNKTV3WPV500")
    js.remove(node.state_dir, "100")                 # lost: a reinstalled node, a wiped /run
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert mps.daemon_pids(st.mps["pipe_dir"]) == [] and node.leftovers() == []
