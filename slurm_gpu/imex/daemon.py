"""Running NVIDIA's binaries: ``nvidia-imex`` started for one job, its state
through ``nvidia-imex-ctl``, and its stop.

The daemon runs in the foreground (``DAEMONIZE=0``) as a child we start in
its own session (``posix_spawn``: no Python runs between fork and exec, and
the prolog has a watchdog thread), so its PID and start time are known and
recorded; the epilog signals exactly that process, never one whose PID was
reused.  SIGTERM is the documented stop ("notify other nodes of the
shutdown", signals.html); SIGKILL only after ``stop_timeout``.
"""
from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

from .. import procfs, runner
from ..errors import CommandError, HardwareError
from . import domain, teardown


def start(exe: str, config: str, log: str) -> dict[str, Any]:
    """Start ``exe -c config`` detached; its output goes to *log*.  Returns ``{"pid", "start"}``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        pid = os.posix_spawn(exe, [exe, "-c", config], {"PATH": runner.SAFE_PATH},
                             file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                                           (os.POSIX_SPAWN_DUP2, fd, 1), (os.POSIX_SPAWN_DUP2, fd, 2)],
                             setsid=True)
    except OSError as e:
        raise HardwareError(f"cannot start {exe}: {e.strerror}", exe) from None
    finally:
        os.close(fd)
    return {"pid": pid, "start": procfs.start_time(pid)}


def reap(pid: int) -> int | None:
    return teardown.reap(pid)


def alive(rec: dict[str, Any] | None) -> bool:
    if not rec or not isinstance(rec.get("pid"), int):
        return False
    return teardown.alive(rec["pid"], rec.get("start"))


def stop(rec: dict[str, Any] | None, wait: float) -> str | None:
    """SIGTERM the recorded daemon, SIGKILL after *wait* s; a note, or None when nothing ran."""
    if not alive(rec):
        return None
    assert rec is not None
    return teardown.stop(rec["pid"], rec.get("start"), wait)


def query(ctl: str, config: str, timeout: float = 5.0) -> str:
    """``nvidia-imex-ctl -c config -q``: the daemon's state (UNAVAILABLE when it cannot say)."""
    try:
        res = runner.run([ctl, "-c", config, "-q"], timeout, check=False)
    except CommandError:
        return "UNAVAILABLE"
    return domain.parse_query(res.stdout)


def domain_status(ctl: str, config: str, timeout: float = 5.0) -> tuple[str | None, list[dict[str, str]]]:
    """``nvidia-imex-ctl -c config -N -j``: (domain status, nodes) as :func:`domain.parse_domain`."""
    try:
        res = runner.run([ctl, "-c", config, "-N", "-j"], timeout, check=False)
    except CommandError:
        return None, []
    return domain.parse_domain(res.stdout)
