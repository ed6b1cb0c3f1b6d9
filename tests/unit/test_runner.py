"""The command chokepoint: no shell, timeouts kill the whole process group."""
from __future__ import annotations

import os
import time

import pytest

from slurm_gpu.errors import CommandError
from slurm_gpu.runner import RunAs, run


def test_runs_argv_without_a_shell() -> None:
    # A shell would expand this; argv passing must hand it over verbatim.
    res = run(["/bin/echo", "$(id -u); `id`"], timeout=5)
    assert res.stdout == "$(id -u); `id`\n"
    assert res.ok


def test_timeout_kills_the_process_group(tmp_path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 30 & echo $! > {pidfile}; wait"
    t0 = time.monotonic()
    with pytest.raises(CommandError, match="timed out after 0.5 s"):
        run(["/bin/sh", "-c", script], timeout=0.5)
    assert time.monotonic() - t0 < 5
    grandchild = int(pidfile.read_text())
    # The grandchild was in the same process group and must be gone too.
    for _ in range(50):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("grandchild survived the timeout")


def test_failure_carries_first_stderr_line() -> None:
    with pytest.raises(CommandError) as ei:
        run(["/bin/sh", "-c", "echo 'bad thing' >&2; echo more >&2; exit 3"], timeout=5)
    assert "sh failed: bad thing" in ei.value.line()
    assert ei.value.line().startswith("slurm-gpu: ")


def test_check_false_returns_status() -> None:
    res = run(["/bin/sh", "-c", "exit 4"], timeout=5, check=False)
    assert res.returncode == 4 and not res.ok


def test_missing_command() -> None:
    with pytest.raises(CommandError, match="command not found: /nonexistent/tool"):
        run(["/nonexistent/tool"], timeout=5)


def test_environment_is_not_inherited(monkeypatch) -> None:
    monkeypatch.setenv("LD_PRELOAD_EVIL", "x")
    res = run(["/usr/bin/env"], timeout=5)
    assert "LD_PRELOAD_EVIL" not in res.stdout
    assert "PATH=/usr/sbin:/usr/bin:/sbin:/bin" in res.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_run_as_drops_privileges() -> None:
    res = run(["/usr/bin/id", "-u"], timeout=5, run_as=RunAs(uid=65534, gid=65534))
    assert res.stdout.strip() == "65534"


def test_timeout_returns_although_a_daemon_holds_the_pipes(tmp_path) -> None:
    # The grandchild leaves the process group (setsid) and keeps stdout open:
    # killpg cannot reach it, and waiting for EOF would hang for its lifetime.
    pidfile = tmp_path / "daemon.pid"
    script = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 60' & sleep 30"
    t0 = time.monotonic()
    with pytest.raises(CommandError, match="timed out after 0.5 s"):
        run(["/bin/sh", "-c", script], timeout=0.5)
    took = time.monotonic() - t0
    try:
        os.kill(int(pidfile.read_text()), 9)
    except (OSError, ValueError):
        pass
    assert took < 5, f"run() waited {took:.1f} s for a daemon's pipes"
