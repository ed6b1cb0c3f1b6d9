"""The nvidia-cuda-mps-control stand-in speaks the real binary's protocol."""
from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from slurm_gpu import runner
from slurm_gpu.jobs.mps import daemon_pids
from slurm_gpu.runner import RunAs
from slurm_gpu.sim.mps_control import write_wrapper

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")


def _user(name: str) -> RunAs:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        pytest.skip(f"user {name} missing")
    return RunAs(pw.pw_uid, pw.pw_gid)


@pytest.fixture()
def mpsdir():
    base = Path(tempfile.mkdtemp(prefix="sg-mps-test-"))
    os.chmod(base, 0o755)
    ctl = write_wrapper(base / "nvidia-cuda-mps-control")
    pipe, log = base / "pipe", base / "log"
    u = _user("sgtest1")
    for d in (pipe, log):
        d.mkdir(mode=0o700)
        os.chown(d, u.uid, u.gid)
    env = {"PATH": runner.SAFE_PATH, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
           "CUDA_MPS_LOG_DIRECTORY": str(log)}
    yield ctl, env, u, pipe, log
    for p in daemon_pids(pipe):
        os.kill(p, 9)
    shutil.rmtree(base)


def _ctl(ctl, env, u, text, check=False):
    return runner.run([str(ctl)], 5, input=text, env=env, run_as=u, check=check)


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
    assert again.returncode == 1 and "already running" in again.stderr
    r = _ctl(ctl, env, u, "set_default_active_thread_percentage 25\n"
                          "get_default_active_thread_percentage\n"
                          "start_server -uid %d\nget_server_list\n" % u.uid, check=True)
    lines = r.stdout.split()
    assert lines[:2] == ["25", "25.0"] and lines[2].isdigit()
    server = int(lines[2])
    assert server in daemon_pids(pipe)
    _ctl(ctl, env, u, "quit\n", check=True)
    deadline = time.monotonic() + 5
    while daemon_pids(pipe) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert daemon_pids(pipe) == []
    text = (log / "control.log").read_text()
    assert "Startup" in text and "Exit" in text


def test_other_user_cannot_connect(mpsdir) -> None:
    ctl, env, u, pipe, log = mpsdir
    runner.run([str(ctl), "-d"], 5, env=env, run_as=u)
    other = _user("sgtest2")
    r = _ctl(ctl, env, other, "get_server_list\n")
    assert r.returncode == 1 and "Cannot find MPS control daemon" in r.stderr
    assert _ctl(ctl, env, u, "quit\n").returncode == 0


def test_invalid_command_and_option(mpsdir) -> None:
    ctl, env, u, pipe, log = mpsdir
    runner.run([str(ctl), "-d"], 5, env=env, run_as=u)
    r = _ctl(ctl, env, u, "set_default_active_thread_percentage 500\nfrobnicate\nquit\n")
    assert "Invalid value" in r.stdout and "Invalid command" in r.stdout
    bad = runner.run([str(ctl), "-x"], 5, env=env, check=False)
    assert bad.returncode == 1
