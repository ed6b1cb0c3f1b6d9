"""jobs.mps, what the prolog/epilog tests left open of its process-starting parts
(mutmut on the rest of the module, issue 24 §8).

Everything through the public functions: the prolog's :func:`lifecycle.prolog`
(the job's error, whole, as the state file keeps it), :func:`mps.start`,
:func:`mps.stop`, :func:`mps.control`, :func:`mps.make_dirs`.  What a process of
the job's user does to the daemon, its launcher or its client is done for real
(SIGSTOP, a socket removed) or, where only the runner's answer matters (a
launcher killed by a signal, a client stopped until it timed out: test_runner.py
shows both on real processes), by the runner's answer itself.
"""
from __future__ import annotations

import os
import pwd
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from test_jobs_lifecycle import Env
from test_jobs_mps_mounts import base  # noqa: F401 - a root-owned base, its mounts undone afterwards
from test_jobs_mps_mutants import node  # noqa: F401 - the same root + sgtest1 node fixture

from slurm_gpu import runner
from slurm_gpu.errors import CommandError, Consequence, HardwareError
from slurm_gpu.jobs import lifecycle, mps
from slurm_gpu.jobs import state as js
from slurm_gpu.jobs.mpsprocs import daemon_pids
from slurm_gpu.jobs.settings import MpsSettings
from slurm_gpu.procfs import state

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs the daemon as a job user")

USER_TAG = "(by a process of the job's user?) (job 100)"


def _user() -> mps.JobUser:
    pw = pwd.getpwnam("sgtest1")
    return mps.JobUser(pw.pw_uid, pw.pw_gid, "sgtest1", (pw.pw_gid,))


def _short(node: Env, control: str | None = None, timeout: float = 1.0) -> None:
    node.mps = MpsSettings(control=control or str(node.ctl), base_dir=node.mps.base_dir,
                           start_timeout=timeout, quit_timeout=0.3)   # a stopped daemon never quits


def _script(node: Env, name: str, body: str) -> str:
    p = node.base / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return str(p)


def _prolog(node: Env) -> tuple[int, js.JobRecord | None]:
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    rc = lifecycle.prolog(ctx)
    return rc, js.load(node.state_dir, "100")


def _user_failed(node: Env) -> str:
    """The prolog fails the job (the user's doing), the node stays up, the epilog cleans up."""
    rc, st = _prolog(node)
    assert rc == 0, node.logs
    assert st is not None and st.phase == "failed" and st.consequence == Consequence.USER, node.logs
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert node.leftovers() == []
    return str(st.error)


def _node_fault(node: Env) -> str:
    """The prolog fails the node (on_internal_error = drain); returns its one line."""
    rc, _st = _prolog(node)
    assert rc == 1 and len(node.logs) == 1, node.logs
    line = node.logs[0]
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert node.leftovers() == []
    tail = " [job 100: node fault, on_internal_error=drain]"
    assert line.endswith(tail), line
    return line[:-len(tail)]


def _patch_run(monkeypatch: pytest.MonkeyPatch, launcher: Callable[[Any], Any] | None = None,
               client: Callable[[Any], Any] | None = None) -> None:
    """The runner's answer to the launcher (``-d``) or to the first client, replaced by
    what *launcher*/*client* make of the real one (raise, or return another)."""
    real = runner.run
    done: list[bool] = []

    def run(argv: Any, *a: Any, **kw: Any) -> Any:
        res = real(argv, *a, **kw)
        if list(argv)[1:] == ["-d"] and launcher:
            return launcher(res)
        if list(argv)[1:] == [] and client and not done:
            done.append(True)
            return client(res)
        return res
    monkeypatch.setattr(runner, "run", run)


def _stopped_timeout(res: Any) -> Any:
    raise runner.TimedOut("nvidia-cuda-mps-control timed out after 1 s (it was stopped)",
                          "nvidia-cuda-mps-control", stopped=True)


# -- the launcher and the client, signalled by the job's user -----------------

@pytest.mark.parametrize("which", ["launcher", "client"])
def test_a_launcher_or_client_killed_by_a_signal_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch, which: str) -> None:
    _short(node)
    _patch_run(monkeypatch, **{which: lambda res: res._replace(returncode=-15)})
    assert _user_failed(node) == (f"MPS control {which} was killed by signal 15 before the "
                                  f"daemon answered {USER_TAG}")


@pytest.mark.parametrize("which", ["launcher", "client"])
def test_a_launcher_or_client_stopped_until_it_timed_out_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch, which: str) -> None:
    _short(node)
    _patch_run(monkeypatch, **{which: _stopped_timeout})
    assert _user_failed(node) == (f"MPS control {which} was stopped before the daemon "
                                  f"answered {USER_TAG}")


def test_a_launcher_that_timed_out_running_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher waits only on what is the user's (their daemon, which a stopped
    or traced child of -d holds back without the launcher being stopped): no proven
    node fault (hostile review, this session: HIGH-4)."""
    _short(node)

    def timed_out(res: Any) -> Any:
        raise runner.TimedOut("nvidia-cuda-mps-control timed out after 1 s", "launcher")
    _patch_run(monkeypatch, launcher=timed_out)
    assert _user_failed(node) == ("MPS control daemon could not start: nvidia-cuda-mps-control -d timed out "
                                  "after 1 s (its directories and daemon are the job's user's) (job 100)")


# -- a client that gets no answer: the daemon stopped, its sockets gone, or the node's fault --

def _client_fails_after(monkeypatch: pytest.MonkeyPatch, act: Callable[[str], None]) -> None:
    """The first client session gets no answer (the runner's CommandError: a plain one,
    never 'stopped') after *act(pipe)*."""
    real = mps.control

    def control(settings: Any, user: Any, pipe: str, log: str, cmd: str, **kw: Any) -> Any:
        monkeypatch.setattr(mps, "control", real)
        act(pipe)
        raise CommandError("nvidia-cuda-mps-control timed out after 1 s", "client")
    monkeypatch.setattr(mps, "control", control)


def stop_daemon(pipe: str) -> None:
    """SIGSTOP the daemon bound to *pipe*, as a process of its user can; back once it is stopped."""
    pids = daemon_pids(pipe)
    assert pids
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    for p in pids:                  # the signal is delivered once the daemon runs again
        while state(p) != "T":
            time.sleep(0.01)


def test_a_daemon_stopped_by_its_user_fails_the_job(node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    _short(node)
    _client_fails_after(monkeypatch, stop_daemon)
    assert _user_failed(node) == f"MPS control daemon was stopped before it answered {USER_TAG}"


def test_a_daemon_traced_by_its_user_fails_the_job(node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ptrace stop (``t`` in /proc/PID/stat: a debugger of the user's attached) is a stop too."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    traced: list[int] = []

    def trace_it(pipe: str) -> None:
        for p in daemon_pids(pipe):
            assert libc.ptrace(0x4206, p, None, None) == 0          # PTRACE_SEIZE
            traced.append(p)
            assert libc.ptrace(0x4207, p, None, None) == 0          # PTRACE_INTERRUPT
            os.waitpid(p, 0x40000000)                               # __WALL: in its trap stop
            assert state(p) == "t"
    _short(node)
    _client_fails_after(monkeypatch, trace_it)
    rc, st = _prolog(node)
    assert traced
    for p in traced:
        libc.ptrace(17, p, None, None)                               # PTRACE_DETACH
    assert rc == 0 and st is not None and st.error == (
        f"MPS control daemon was stopped before it answered {USER_TAG}"), node.logs
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert node.leftovers() == []


def test_a_running_daemon_whose_log_directory_its_user_mounted_over_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    _short(node)

    def mount(pipe: str) -> None:
        assert daemon_pids(pipe)
        log = os.path.join(os.path.dirname(pipe), "log")
        subprocess.run(["mount", "-t", "tmpfs", "sg-over", log], check=True)
    _client_fails_after(monkeypatch, mount)
    try:
        assert _user_failed(node) == ("MPS control daemon could not start: log was mounted over "
                                      "by a process of the job's user (job 100)")
    finally:
        subprocess.run(["umount", "-l", f"{node.mps.base_dir}/100/log"], capture_output=True)


def test_a_daemon_whose_socket_its_user_removed_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    _short(node)

    def unlink(pipe: str) -> None:
        assert daemon_pids(pipe)
        os.unlink(os.path.join(pipe, "control"))
    _client_fails_after(monkeypatch, unlink)
    assert _user_failed(node) == ("MPS control daemon runs but its sockets are gone "
                                  "(control moved away; by a process of the job's user?) (job 100)")


def test_a_running_daemon_that_never_answers_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process of its user can hold the daemon's control socket with a silent
    connection: a running, silent daemon proves no node fault (second hostile review)."""
    _short(node)
    _client_fails_after(monkeypatch, lambda pipe: None)
    assert _user_failed(node) == ("MPS control daemon runs but did not answer (nvidia-cuda-mps-control "
                                  "timed out after 1 s; a process of the job's user may hold its socket) "
                                  "(job 100)")


# -- a daemon gone before it answered: its log says whether it started ---------

@pytest.mark.parametrize("logged", [True, False])
def test_a_daemon_gone_before_it_answered_is_the_users_doing_if_its_log_says_it_started(
        node: Env, logged: bool) -> None:
    # -d starts nothing that lives on (as if the daemon was killed at once), and
    # the client never finds it.
    line = "Starting control daemon using socket" if logged else "Starting control"
    ctl = _script(node, "gone-mps-control",
                  f'[ "$1" = -d ] && {{ echo "[x] {line} $CUDA_MPS_PIPE_DIRECTORY/control" '
                  '> "$CUDA_MPS_LOG_DIRECTORY/control.log"; exit 0; }\n'
                  'echo "Cannot find MPS control daemon process" >&2; exit 1\n')
    _short(node, ctl, 0.3)
    if logged:
        assert _user_failed(node) == ("MPS control daemon exited before it answered (stopped "
                                      "by a process of the job's user?) (job 100)")
    else:
        pipe = f"{node.mps.base_dir}/100/pipe"
        assert _node_fault(node) == f"slurm-gpu: MPS control daemon did not answer within 0.3 s ({pipe})"


# -- control: one client session, as the job's user ---------------------------

def test_control_runs_the_client_as_the_user_with_the_pipe_and_log_only(node: Env) -> None:
    ctl = _script(node, "echo-control",
                  'read cmd\necho "$(id -u) $(id -g) $(id -G) $cmd|$CUDA_MPS_PIPE_DIRECTORY|'
                  '$CUDA_MPS_LOG_DIRECTORY|${CUDA_VISIBLE_DEVICES-none}|$HOME|$PATH"\n'
                  '[ "$cmd" = fail ] && exit 3\nexit 0\n')
    u = _user()
    s = MpsSettings(control=ctl, base_dir=node.mps.base_dir)
    res = mps.control(s, u, "/p/pipe", "/p/log", "get_server_list")
    assert res.returncode == 0
    assert res.stdout == (f"{u.uid} {u.gid} {u.gid} get_server_list|/p/pipe|/p/log|none|/|"
                          f"{runner.SAFE_PATH}\n")
    assert mps.control(s, u, "/p/pipe", "/p/log", "fail", check=False).returncode == 3
    with pytest.raises(CommandError):
        mps.control(s, u, "/p/pipe", "/p/log", "fail")


# -- stop: a recorded job directory elsewhere ------------------------------------

@pytest.mark.parametrize("mode,owner,taken", [(0o755, 0, True), (0o775, 0, False), (0o757, 0, False),
                                              (0o755, 1, False), ("file", 0, False),
                                              ("link", 0, False), ("missing", 0, False)])
def test_stop_takes_a_recorded_job_directory_only_below_a_roots_base(
        node: Env, mode: Any, owner: int, taken: bool) -> None:
    old = node.base / "old"
    real = node.base / "real"
    real.mkdir(mode=0o755)
    if mode == "file":
        old.write_text("")
    elif mode == "link":
        old.symlink_to(real)
    elif mode != "missing":
        old.mkdir()
        os.chmod(old, mode)
        os.chown(old, owner, 0)
    if mode in (0o755, "link"):
        (real if mode == "link" else old).joinpath("100").mkdir(mode=0o755)
    rec = str(old / "100")
    notes = mps.stop(node.mps, {"job_dir": rec}, "100", _user(), kill_wait=0.1)
    assert notes == ([] if taken else [f"MPS: ignored recorded directory {rec!r}"])
    assert os.path.lexists(rec) == (mode in (0o755, "link") and not taken)


# -- check_usable --------------------------------------------------------------

def test_check_usable_finds_the_binary_by_path_or_on_the_safe_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mps.check_usable(MpsSettings(control="sh"))                   # /usr/bin/sh or /bin/sh
    mps.check_usable(MpsSettings(control="/bin/sh"))
    monkeypatch.chdir("/")                  # a relative path is found as exec finds it
    mps.check_usable(MpsSettings(control="bin/sh"))
    (tmp_path / "noexec").write_text("#!/bin/sh\n")
    for bad in ("no-such-mps-control", "/no/such/mps-control", str(tmp_path),
                str(tmp_path / "noexec")):
        with pytest.raises(js.JobFailed) as e:
            mps.check_usable(MpsSettings(control=bad))
        assert str(e.value) == f"--gpu-mps: this node has no MPS control binary ({bad})"
    with pytest.raises(js.JobFailed) as e:
        mps.check_usable(MpsSettings(enabled=False, control="/bin/sh"))
    assert str(e.value) == "--gpu-mps is disabled on this cluster ([mps] enabled)"


# -- make_dirs: the base, the job directory, an earlier run's -------------------

def _make(base_dir: Path, jobid: str = "7") -> tuple[str, str]:
    return mps.make_dirs(MpsSettings(base_dir=str(base_dir)), jobid, _user())


def test_make_dirs_gives_the_user_pipe_and_log_under_roots_job_dir(base: Path) -> None:
    old = os.umask(0)                       # slurmd's umask is not ours to rely on
    try:
        pipe, log = _make(base / "mps")
    finally:
        os.umask(old)
    u = _user()
    assert (pipe, log) == (f"{base}/mps/7/pipe", f"{base}/mps/7/log")
    want = {base / "mps": (0, 0o755), base / "mps/7": (0, 0o755), Path(pipe): (u.uid, 0o700),
            Path(log): (u.uid, 0o700)}
    assert {p: (os.lstat(p).st_uid, stat.S_IMODE(os.lstat(p).st_mode)) for p in want} == want


@pytest.mark.parametrize("how", ["others", "group", "user"])
def test_make_dirs_refuses_a_base_others_can_change(base: Path, how: str) -> None:
    b = base / "mps"
    if how == "user":
        b.mkdir(mode=0o755)
        os.chown(b, _user().uid, 0)
    else:
        b.mkdir()
        os.chmod(b, 0o757 if how == "others" else 0o775)
    with pytest.raises(HardwareError) as e:
        _make(b)
    assert str(e.value) == f"MPS base directory must be a root-owned directory not writable by others ({b})"
    assert os.listdir(b) == []


def test_make_dirs_refuses_a_base_below_a_directory_others_can_change(base: Path) -> None:
    (base / "w").mkdir()
    os.chmod(base / "w", 0o777)
    b = base / "w" / "mps"
    with pytest.raises(HardwareError) as e:
        _make(b)
    assert str(e.value) == ("MPS base directory lies under a directory that users other than root "
                            f"can change ({base}/w) ({b})")
    assert not b.exists()


@pytest.mark.parametrize("what", ["users", "link"])
def test_make_dirs_refuses_a_job_directory_root_did_not_make(base: Path, what: str) -> None:
    (base / "mps").mkdir(mode=0o755)
    jd = base / "mps" / "7"
    if what == "users":
        jd.mkdir(mode=0o755)
        os.chown(jd, _user().uid, 0)
    else:
        (base / "elsewhere").mkdir(mode=0o755)
        jd.symlink_to(base / "elsewhere")
    with pytest.raises(HardwareError) as e:
        _make(base / "mps")
    assert str(e.value) == f"unexpected MPS job directory ({jd})"
    assert os.listdir(base / "elsewhere" if what == "link" else jd) == []


def test_make_dirs_again_replaces_a_pipe_the_user_turned_into_a_symlink(base: Path) -> None:
    pipe, log = _make(base / "mps")
    (base / "theirs").mkdir(mode=0o755)
    (base / "theirs" / "keep").write_text("x")
    os.rmdir(pipe)
    os.symlink(base / "theirs", pipe)
    Path(log, "control.log").write_text("old")
    assert _make(base / "mps") == (pipe, log)
    assert os.listdir(pipe) == [] and os.listdir(log) == [] and not os.path.islink(pipe)
    assert (base / "theirs" / "keep").read_text() == "x"


def test_make_dirs_again_fails_the_job_when_the_earlier_runs_mount_stays(
        base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_gpu.jobs import libc
    pipe, log = _make(base / "mps")
    m, n = os.path.join(pipe, "m"), os.path.join(log, "n")
    for d in (m, n):
        os.mkdir(d)
        subprocess.run(["mount", "-t", "tmpfs", "sg-stuck", d], check=True)

    def refuse(path: str) -> None:
        raise OSError(16, os.strerror(16))
    monkeypatch.setattr(libc, "detach_mount", refuse)
    with pytest.raises(js.JobFailed) as e:
        _make(base / "mps")
    busy = os.strerror(16)
    assert str(e.value) == (f"--gpu-mps: mounts the job's user made in {base}/mps/7 cannot be "
                            f"detached ({n}: {busy}; {m}: {busy}) (job 7)")


# -- stop: what the user left in their directories ------------------------------

def test_stop_never_follows_a_symlink_the_user_left_in_the_pipe_directory(base: Path) -> None:
    s = MpsSettings(base_dir=str(base / "mps"))
    pipe, _log = mps.make_dirs(s, "7", _user())
    theirs = base / "theirs"
    theirs.mkdir(mode=0o750)
    os.chown(theirs, _user().uid, _user().gid)
    os.symlink(theirs, os.path.join(pipe, "l"))
    assert mps.stop(s, None, "7", _user(), kill_wait=0.1) == []
    st = os.lstat(theirs)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (_user().uid, _user().gid, 0o750)
    assert not os.path.lexists(base / "mps" / "7")


def test_a_job_directory_root_cannot_remove_is_a_node_fault(base: Path) -> None:
    s = MpsSettings(base_dir=str(base / "mps"))
    pipe, _log = mps.make_dirs(s, "7", _user())
    Path(pipe, "f").write_text("")
    subprocess.run(["chattr", "+i", os.path.join(pipe, "f")], check=True)   # a kernel that refuses
    with pytest.raises(HardwareError) as e:
        mps.stop(s, None, "7", _user(), kill_wait=0.1)
    assert str(e.value) == f"cannot remove MPS job directory ({base}/mps/7)"
    subprocess.run(["chattr", "-i", os.path.join(pipe, "f")], check=True)
    assert mps.stop(s, None, "7", _user(), kill_wait=0.1) == []
    assert not os.path.lexists(base / "mps" / "7")


# -- the holding cgroup ------------------------------------------------------------

def test_the_daemon_waits_in_the_jobs_own_holding_cgroup(node: Env) -> None:
    hold = node.hold("100")
    if not hold:
        pytest.skip("no cgroup filesystem here")
    rc, st = _prolog(node)
    assert rc == 0 and st is not None and st.mps is not None, node.logs
    assert st.mps["hold"] == hold and st.mps["cgroup"] is None
    assert all(os.path.isdir(h) for h in hold)
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert node.leftovers() == []


@pytest.mark.parametrize("err,text", [(PermissionError(13, "Permission denied"), "Permission denied"),
                                      (OSError("no cgroup"), "no cgroup")])
def test_a_holding_cgroup_that_cannot_be_made_is_the_nodes_fault(
        node: Env, monkeypatch: pytest.MonkeyPatch, err: OSError, text: str) -> None:
    from slurm_gpu.jobs import jobcgroup
    hold = node.hold("100")
    if not hold:
        pytest.skip("no cgroup filesystem here")

    def refuse(dirs: list[str]) -> list[str]:
        raise err
    monkeypatch.setattr(jobcgroup, "make_hold", refuse)
    assert _node_fault(node) == f"slurm-gpu: cannot make the MPS daemon's holding cgroup: {text} ({hold[0]})"


def test_what_a_failed_launcher_printed_is_quoted_short_and_printable(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher runs as the job's user, who can trace it and make it print
    anything: a line of terminal escapes and 2 MB reaches the job's record and
    slurmd's log as at most 200 characters, escaped (second hostile review, LOW)."""
    _short(node)
    _patch_run(monkeypatch, launcher=lambda res: res._replace(
        returncode=1, stdout="\x1b[2J\x07" + "A" * 2_000_000 + "\n", stderr=""))
    assert _user_failed(node) == (
        "MPS control daemon could not start: nvidia-cuda-mps-control -d failed: '\\x1b[2J\\x07"
        + "A" * 194 + "…' (its directories and daemon are the job's user's) (job 100)")


@pytest.mark.parametrize("which", ["launcher", "client"])
@pytest.mark.parametrize("blocked", ["request_wait_answer", "nv_wait_for_gpu", ""])
def test_a_launcher_or_client_stuck_in_the_kernel_with_no_fuse_of_the_users_is_the_nodes(
        node: Env, monkeypatch: pytest.MonkeyPatch, which: str, blocked: str) -> None:
    """Given up by the runner after its kill (runner.KILL_WAIT): with no FUSE mount of
    the job's user on the node, whatever holds it (a site's FUSE, a driver, a disk)
    is the node's (review round 4, H1).  The user's own FUSE is tested with a real
    server in test_jobs_mps_mounts."""
    _short(node)

    def held(res: Any) -> Any:
        raise runner.TimedOut("nvidia-cuda-mps-control timed out after 1 s and could not be ended",
                              "x", stuck=True, blocked_in=blocked)
    _patch_run(monkeypatch, **{which: held})
    where = f", in {blocked}" if blocked else ""
    assert _node_fault(node) == (f"slurm-gpu: MPS control {which} could not be ended after its time "
                                 f"out (blocked in the kernel{where}) (job 100)")
