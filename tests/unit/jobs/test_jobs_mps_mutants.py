"""jobs.mps, what the prolog/epilog tests left open in its pure parts (mutmut on
``_settings_commands`` and ``recorded_daemon``, issue 24 §8).

The settings are seen where the daemon logs them (``Cmd:`` lines of its
control.log, as NVIDIA's daemon writes them; the stand-in of
test_mps_control.py does the same); the recorded daemon through
:func:`mps.recorded_daemon`, the public reader of the state file's record.
"""
from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
from test_jobs_lifecycle import Env

from slurm_gpu.jobs import lifecycle, mps
from slurm_gpu.jobs import state as js
from slurm_gpu.jobs.settings import MpsSettings
from slurm_gpu.procfs import start_time


def _rec(daemon: Any) -> Any:
    """A state file's MPS record as JSON gives it (any shape: the reader checks)."""
    return {"daemon": daemon}


@pytest.fixture()
def node() -> Iterator[Env]:
    if os.geteuid() != 0:
        pytest.skip("runs the daemon as a job user")
    try:
        pwd.getpwnam("sgtest1")
    except KeyError:
        pytest.skip("user sgtest1 missing")
    n = Env()
    yield n
    n.close()


def _commands(node: Env, pct: int, pinned: str, **env: str) -> list[str]:
    node.mps = MpsSettings(control=node.mps.control, base_dir=node.mps.base_dir, start_timeout=10,
                           quit_timeout=3, default_active_thread_percentage=pct, pinned_mem_limit=pinned)
    ctx = node.ctx(**env)
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st is not None and st.mps is not None
    log = Path(st.mps["log_dir"]) / "control.log"
    cmds = [x.split("Cmd:", 1)[1] for x in log.read_text().splitlines() if "Cmd:set" in x]
    assert lifecycle.epilog(ctx) == 0
    return cmds


def test_the_admins_defaults_reach_the_daemon_for_every_device(node: Env) -> None:
    assert _commands(node, 30, "2G", SLURM_JOB_GPUS="0,1", SPANK_SLURM_GPU_MPS="default") == [
        "set_default_active_thread_percentage 30",
        "set_default_device_pinned_mem_limit 0 2G", "set_default_device_pinned_mem_limit 1 2G"]


def test_the_jobs_percentage_wins_and_one_device_gets_one_limit(node: Env) -> None:
    assert _commands(node, 30, "2G", SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="40") == [
        "set_default_active_thread_percentage 40", "set_default_device_pinned_mem_limit 0 2G"]


def test_no_defaults_send_nothing(node: Env) -> None:
    assert _commands(node, 0, "", SLURM_JOB_GPUS="0,1", SPANK_SLURM_GPU_MPS="default") == []


def test_recorded_daemon_believes_only_a_well_formed_record_of_a_live_process_of_the_user() -> None:
    u = pwd.getpwnam("sgtest1").pw_uid if os.geteuid() == 0 else os.getuid()
    if u == 0:
        pytest.skip("needs a user that is not root")
    kw: dict[str, Any] = {"user": "sgtest1"} if os.geteuid() == 0 else {}
    p = subprocess.Popen(["/bin/sleep", "60"], env={}, **kw)
    try:
        t = start_time(p.pid)
        assert t is not None
        good = [p.pid, t]
        assert mps.recorded_daemon(_rec([good]), u) == {p.pid: (t, u)}
        for bad in ([[p.pid, t + 1]], [[p.pid]], [[p.pid, t, 0]], [(p.pid, t)], [[str(p.pid), t]],
                    [[p.pid, float(t)]], [[p.pid, True]]):
            assert mps.recorded_daemon(_rec(bad + [1]), u) == {}, bad
        assert mps.recorded_daemon(_rec([good]), u + 1) == {}
        assert mps.recorded_daemon(_rec([good]), None) == {}
        assert mps.recorded_daemon(_rec([good]), 0) == {}
        assert mps.recorded_daemon(None, u) == mps.recorded_daemon({}, u) == {}
    finally:
        p.kill()
        p.wait()


def test_recorded_daemon_never_takes_a_root_process() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs a root process")
    p = subprocess.Popen(["/bin/sleep", "60"])
    try:
        assert mps.recorded_daemon(_rec([[p.pid, start_time(p.pid)]]), 0) == {}
        assert mps.recorded_daemon(_rec([[p.pid, start_time(p.pid)]]), 1) == {}
    finally:
        p.kill()
        p.wait()
