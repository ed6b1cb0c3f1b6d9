"""NVIDIA's real nvidia-cuda-mps-control and the stand-in, side by side.

Every protocol test runs against both: the real binary (fetched by
scripts/fetch-mps.sh, no GPU needed) and the Python stand-in, which must
answer and log exactly as the real one does.
"""
from __future__ import annotations

import os
import pwd
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from mpsbinary import install_real_mps_control, real_mps_control
from slurm_gpu import runner
from slurm_gpu.jobs.mps import daemon_pids
from slurm_gpu.runner import RunAs
from slurm_gpu_devkit.sim.mps_control import write_wrapper

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")

LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} Control +\d+\] ")


def _user(name: str) -> RunAs:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        pytest.skip(f"user {name} missing")
    return RunAs(pw.pw_uid, pw.pw_gid)


def _mpsdir(kind: str):
    if kind == "real":
        real_mps_control()          # fails or skips before anything is made
    base = Path(tempfile.mkdtemp(prefix=f"sg-mps-test-{kind}-"))
    os.chmod(base, 0o755)
    ctl = base / "nvidia-cuda-mps-control"
    if kind == "real":
        install_real_mps_control(ctl)
    else:
        write_wrapper(ctl)
    pipe, log = base / "pipe", base / "log"
    u = _user("sgtest1")
    for d in (pipe, log):
        d.mkdir(mode=0o700)
        os.chown(d, u.uid, u.gid)
    env = {"PATH": runner.SAFE_PATH, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
           "CUDA_MPS_LOG_DIRECTORY": str(log)}
    return base, (ctl, env, u, pipe, log)


def _cleanup(base: Path, pipe: Path) -> None:
    for p in daemon_pids(pipe):
        os.kill(p, 9)
    shutil.rmtree(base)


@pytest.fixture(params=["real", "stand-in"])
def mpsdir(request):
    base, t = _mpsdir(request.param)
    yield t
    _cleanup(base, t[3])


def _ctl(ctl, env, u, text, check=False):
    return runner.run([str(ctl)], 5, input=text, env=env, run_as=u, check=check)


def _wait_gone(pipe: Path) -> None:
    deadline = time.monotonic() + 5
    while daemon_pids(pipe) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert daemon_pids(pipe) == []


def test_daemon_client_protocol(mpsdir) -> None:
    ctl, env, u, pipe, log = mpsdir
    # no daemon yet: the real client's message and status
    r = _ctl(ctl, env, u, "get_server_list\n")
    assert r.returncode == 1 and "Cannot find MPS control daemon process" in r.stderr
    assert runner.run([str(ctl), "-d"], 5, env=env, run_as=u).returncode == 0
    pids = daemon_pids(pipe)
    assert len(pids) == 1
    assert os.stat(f"/proc/{pids[0]}").st_uid == u.uid          # runs as the user
    again = runner.run([str(ctl), "-d"], 5, env=env, run_as=u, check=False)
    assert again.returncode == 1 and "already running" in again.stdout
    # one command per client, as slurm-gpu sends them
    for cmd, want in (("set_default_active_thread_percentage 25", "25.0\n"),
                      ("get_default_active_thread_percentage", "25.0\n"),
                      ("get_server_list", "")):
        assert _ctl(ctl, env, u, cmd + "\n", check=True).stdout == want, cmd
    _ctl(ctl, env, u, "quit\n", check=True)
    _wait_gone(pipe)
    lines = (log / "control.log").read_text().splitlines()
    assert lines and all(LOG_LINE.match(x) for x in lines), lines
    text = "\n".join(LOG_LINE.sub("", x) for x in lines)
    assert f"Starting control daemon using socket {pipe}/control" in text
    assert "Cmd:set_default_active_thread_percentage 25\n25.0" in text
    assert "Exit with status 0" in text


def test_other_user_cannot_connect(mpsdir) -> None:
    ctl, env, u, pipe, log = mpsdir
    runner.run([str(ctl), "-d"], 5, env=env, run_as=u)
    other = _user("sgtest2")
    r = _ctl(ctl, env, other, "get_server_list\n")
    assert r.returncode == 1 and "Cannot find MPS control daemon" in r.stderr
    assert _ctl(ctl, env, u, "quit\n").returncode == 0


# What slurm-gpu and an admin send, one client call each (start_server apart:
# it needs a GPU, see below).
SCRIPT = ["get_default_active_thread_percentage",
          "set_default_active_thread_percentage 50",
          "set_default_active_thread_percentage 500",
          "set_default_active_thread_percentage abc",
          "get_default_active_thread_percentage",
          "set_default_device_pinned_mem_limit 0 2G",
          "get_default_device_pinned_mem_limit 0",
          "get_default_device_pinned_mem_limit 1",
          "get_server_list",
          "shutdown_server 99",
          "frobnicate now",
          "get_server_status 1"]


def _run_script(kind: str) -> tuple[list[tuple[int, str, str]], list[str]]:
    base, (ctl, env, u, pipe, log) = _mpsdir(kind)
    try:
        runner.run([str(ctl), "-d"], 5, env=env, run_as=u)
        out = []
        for cmd in SCRIPT:
            r = _ctl(ctl, env, u, cmd + "\n")
            out.append((r.returncode, r.stdout, r.stderr))
        _ctl(ctl, env, u, "quit\n")
        _wait_gone(pipe)
        keep = ("Cmd:", "Unknown", "Invalid", "Server", "No default", "50.0", "100.0", "2G")
        logged = [LOG_LINE.sub("", x) for x in (log / "control.log").read_text().splitlines()]
        return out, [x for x in logged if x.startswith(keep)]
    finally:
        _cleanup(base, pipe)


def test_stand_in_answers_and_logs_as_the_real_daemon() -> None:
    real, real_log = _run_script("real")
    stand, stand_log = _run_script("stand-in")
    for cmd, a, b in zip(SCRIPT, real, stand):
        assert a == b, cmd
    assert stand_log == real_log
    # what the issue names, from the real binary itself
    assert real[1][1] == "50.0\n" and real[10][1] == 'Unknown command "frobnicate"\n'


# The prolog's one client session (mps.start): readiness and every setting
# over one connection, then what an admin asks after it; quit ends a session.
SESSION = ("get_server_list\nset_default_active_thread_percentage 50\n"
           "set_default_device_pinned_mem_limit 0 2G\nset_default_device_pinned_mem_limit 1 2G\n")
CHECK = "get_default_active_thread_percentage\nget_default_device_pinned_mem_limit 1\n"


def _run_session(kind: str) -> tuple[list[tuple[int, str, str]], list[str]]:
    base, (ctl, env, u, pipe, log) = _mpsdir(kind)
    try:
        early = _ctl(ctl, env, u, SESSION)           # no daemon yet: nothing is sent
        runner.run([str(ctl), "-d"], 5, env=env, run_as=u)
        out = [(early.returncode, early.stdout, early.stderr)]
        for text in (SESSION, CHECK):
            r = _ctl(ctl, env, u, text)
            out.append((r.returncode, r.stdout, r.stderr))
        _ctl(ctl, env, u, "quit\n")
        _wait_gone(pipe)
        logged = [LOG_LINE.sub("", x) for x in (log / "control.log").read_text().splitlines()]
        return out, [x for x in logged if not x.startswith(("Starting control", "To connect"))]
    finally:
        _cleanup(base, pipe)


def test_one_client_session_carries_several_commands() -> None:
    """What mps.start relies on, from the real binary itself: a client sends
    every stdin line over one connection, answers in order, exit 0; before
    the daemon listens it exits 1 having sent nothing.  The stand-in does and
    logs the same.  (quit in a session with other commands is a race in the
    real client: their answers, or a "Cannot send command" after it, may be
    lost; the epilog sends quit alone.)"""
    real, real_log = _run_session("real")
    stand, stand_log = _run_session("stand-in")
    assert real == stand
    assert stand_log == real_log
    assert real[0][0] == 1 and "Cannot find MPS control daemon" in real[0][2]
    assert real[1] == (0, "50.0\n", "") and real[2] == (0, "50.0\n2G\n", "")
    assert real_log.count("NEW UI") == 3 and real_log.count("UI closed") == 2
    assert real_log[-2:] == ["Cmd:quit", "Exit with status 0"]
    assert not any("Cmd:set" in x or "Cmd:get" in x for x in real_log[:2])   # nothing from the early client


def test_real_start_server_without_a_gpu_exits_with_status_1() -> None:
    """No GPU: the real daemon forks a server that exits with status 1 at
    once; the client gets no answer and get_server_list stays empty."""
    base, (ctl, env, u, pipe, log) = _mpsdir("real")
    try:
        runner.run([str(ctl), "-d"], 5, env=env, run_as=u)
        r = _ctl(ctl, env, u, f"start_server -uid {u.uid}\n")
        assert (r.returncode, r.stdout) == (0, "")
        deadline = time.monotonic() + 5
        text = ""
        while "exited with status" not in text and time.monotonic() < deadline:
            time.sleep(0.02)
            text = (log / "control.log").read_text()
        m = re.search(rf"Starting new server (\d+) for user {u.uid}\n", text)
        assert m, text
        assert f"Server {m.group(1)} exited with status 1" in text
        assert _ctl(ctl, env, u, "get_server_list\n").stdout == ""
        assert len(daemon_pids(pipe)) == 1                  # the control daemon alone
        _ctl(ctl, env, u, "quit\n")
        _wait_gone(pipe)
    finally:
        _cleanup(base, pipe)


def test_bad_option(mpsdir) -> None:
    ctl, env, u, pipe, log = mpsdir
    bad = runner.run([str(ctl), "-x"], 5, env=env, check=False)
    assert bad.returncode == 1


@pytest.mark.parametrize("shut", ["mode 000", "missing"])
def test_a_pipe_directory_it_cannot_use_is_one_line_on_stdout_and_exit_1(mpsdir, shut: str) -> None:
    """What the prolog reads as the job user's doing (slurm_gpu.jobs.mps.PIPE_INACCESSIBLE):
    the launcher's one line, on stdout, and no daemon left."""
    ctl, env, u, pipe, log = mpsdir
    if shut == "mode 000":
        os.chmod(pipe, 0)
    else:
        pipe.rmdir()
    try:
        res = runner.run([str(ctl), "-d"], 5, env=env, run_as=u, check=False)
    finally:
        pipe.mkdir(mode=0o700, exist_ok=True)
        os.chmod(pipe, 0o700)
        os.chown(pipe, u.uid, u.gid)
    assert (res.returncode, res.stdout, res.stderr) == (1, f"Cannot access CUDA_MPS_PIPE_DIRECTORY={pipe}\n", "")
    assert daemon_pids(pipe) == []


def test_a_control_lock_someone_holds_is_another_instance(mpsdir) -> None:
    """The launcher tells another instance by the write lock on pipe/control_lock (what
    a user's process can hold: slurm_gpu.jobs.mps fails that job, not the node)."""
    import fcntl
    ctl, env, u, pipe, log = mpsdir
    fd = os.open(pipe / "control_lock", os.O_WRONLY | os.O_CREAT, 0o666)
    os.fchown(fd, u.uid, u.gid)                 # the user's own, as their process makes it
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        res = runner.run([str(ctl), "-d"], 5, env=env, run_as=u, check=False)
    finally:
        os.close(fd)
    assert (res.returncode, res.stdout, res.stderr) == (1, "An instance of this daemon is already running\n", "")
    assert daemon_pids(pipe) == []
