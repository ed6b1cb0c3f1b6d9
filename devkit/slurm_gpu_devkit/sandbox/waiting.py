"""Waiting for the sandbox to be usable, and saying why when it is not."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable, Mapping

from slurm_gpu.errors import CommandError, SlurmGpuError
from slurm_gpu.runner import run

POLL_S = 0.1


def tail(path: Path, lines: int = 5) -> str:
    """The last *lines* of a log, joined with `` | `` to fit one error line."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(f.tell() - 8192, 0))
            text = f.read().decode(errors="replace")
    except OSError:
        return f"(no log at {path})"
    got = [l.strip() for l in text.splitlines() if l.strip()][-lines:]
    return " | ".join(got) if got else f"(empty log {path})"


def node_states(env: Mapping[str, str], timeout: float = 5.0) -> dict[str, str]:
    """Node name -> sinfo's long state (``idle``, ``idle*``, ``drained``...)."""
    res = run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=timeout, env=env, check=False)
    if res.returncode != 0:
        return {}
    out: dict[str, str] = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def wait_idle(nodes: Iterable[str], env: Mapping[str, str], *, timeout: float,
              logs: Callable[[str], Path], check_alive: Callable[[], str | None]) -> float:
    """Poll sinfo until every node is plainly ``idle``; return the seconds waited.

    A state with a suffix (``idle*`` not responding, ``idle~``...) does not
    count.  *check_alive* returns the name of a daemon that died, so a crash
    fails at once instead of after the timeout.
    """
    want = list(nodes)
    t0 = time.monotonic()
    states: dict[str, str] = {}
    while True:
        try:
            states = node_states(env)
        except CommandError:
            states = {}
        if all(states.get(n) == "idle" for n in want):
            return time.monotonic() - t0
        dead = check_alive()
        if dead is not None:
            name = dead.split(":", 1)[-1] if dead.startswith("slurmd:") else dead
            raise SlurmGpuError(f"sandbox: {dead} exited during start-up: {tail(logs(name))}",
                                str(logs(name)))
        if time.monotonic() - t0 > timeout:
            bad = [n for n in want if states.get(n) != "idle"]
            n = bad[0]
            raise SlurmGpuError(
                f"sandbox: node {n} not idle after {timeout:g} s "
                f"(state {states.get(n, 'unknown')}): {tail(logs(n))}", str(logs(n)))
        time.sleep(POLL_S)


def wait_listening(addr: str, port: int, timeout: float, what: str, log: Path,
                   check_alive: Callable[[], str | None]) -> None:
    """Wait until something accepts TCP connections on *addr*:*port*.

    Clients and slurmd retry a refused connection only after about a second,
    so starting them before slurmctld listens costs a second of start-up.
    """
    import socket
    t0 = time.monotonic()
    while True:
        try:
            with socket.create_connection((addr, port), timeout=0.5):
                return
        except OSError:
            pass
        if check_alive() is not None or time.monotonic() - t0 > timeout:
            raise SlurmGpuError(f"sandbox: {what} is not listening on port {port}: {tail(log)}",
                                str(log))
        time.sleep(0.005)


def wait_path(path: Path, timeout: float, what: str, log: Path,
              check_alive: Callable[[], str | None]) -> None:
    t0 = time.monotonic()
    while not path.exists():
        if check_alive() is not None or time.monotonic() - t0 > timeout:
            raise SlurmGpuError(f"sandbox: {what} did not start: {tail(log)}", str(log))
        time.sleep(0.005)
