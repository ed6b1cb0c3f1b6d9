"""Stopping a sandbox: cancel its jobs, remove the cgroups Slurm made for its nodes."""
from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from ..errors import SlurmGpuError
from . import procs


def cancel_jobs(daemons: list[procs.Proc], state: dict[str, Any], env: dict[str, str],
                timeout: float = 15.0) -> None:
    """scancel every job and wait (bounded) until none is left running."""
    from ..runner import run
    alive = {p.name for p in daemons if procs.alive(p)}
    if "slurmctld" not in alive or "munged" not in alive:
        return
    # A slurmctld that does not accept connections would make squeue retry for seconds.
    try:
        with socket.create_connection((state.get("ctld_addr", "127.0.0.1"),
                                       int(state.get("ctld_port", 0))), timeout=0.5):
            pass
    except (OSError, ValueError):
        return
    try:
        res = run(["squeue", "-h", "-o", "%A"], timeout=3, env=env, check=False)
        ids = res.stdout.split()
        if not ids:
            return
        run(["scancel", *ids], timeout=5, env=env, check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            res = run(["squeue", "-h", "-o", "%A"], timeout=5, env=env, check=False)
            if res.returncode != 0 or not res.stdout.split():
                return
            time.sleep(0.1)
    except SlurmGpuError:
        return  # slurmctld not answering: the daemons are stopped anyway

def remove_cgroups(node_names: list[str]) -> None:
    """Remove the empty cgroup directories proctrack/cgroup made for our nodes."""
    root = Path("/sys/fs/cgroup")
    for name in node_names:
        for d in root.glob(f"*/slurm_{name}"):
            for sub in sorted(d.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if sub.is_dir():
                    try:
                        sub.rmdir()
                    except OSError:
                        pass
            try:
                d.rmdir()
            except OSError:
                pass
