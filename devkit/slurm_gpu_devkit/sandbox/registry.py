"""Host-wide reservations of TCP ports and namespace subnets.

Several sandboxes run at once on one machine (each test module, each
developer).  A port that is free when chosen can be taken by another sandbox
before its slurmctld binds it, so choices are made under one lock and
recorded as small files naming the owning sandbox directory.  ``down``
releases them; a reservation whose owner directory no longer records it (the
sandbox crashed, or its directory was deleted) is stale and reused.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import random
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

REGISTRY = Path(os.environ.get("SLURM_GPU_SANDBOX_REGISTRY", "/run/slurm-gpu-sandbox"))

# Below the kernel's ephemeral range (32768-60999), so outgoing connections
# do not grab a port between our check and slurmctld's bind.
PORT_RANGE = (20000, 32000)
# One /30 per namespaced node inside 10.214.0.0/16: 16384 blocks.
NET_RANGE = "10.214.0.0/16"
NET_BLOCKS = 16384
# An entry younger than this belongs to a sandbox still starting up.
FRESH_S = 120.0


@contextmanager
def _locked() -> Iterator[None]:
    REGISTRY.mkdir(parents=True, exist_ok=True)
    with open(REGISTRY / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _owner_holds(entry: Path, kind: str, value: int | str) -> bool:
    """True unless the entry is stale.

    Fresh entries always hold: their owner may not have written its state
    file yet.  Older ones hold while the owner's state file lists them.
    """
    try:
        if time.time() - entry.stat().st_mtime < FRESH_S:
            return True
        owner = Path(entry.read_text().strip())
        state = json.loads((owner / "run" / "sandbox.json").read_text())
    except (OSError, ValueError):
        return False
    return value in state.get("reservations", {}).get(kind, [])


def _port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("0.0.0.0", port))
        return True
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            return False
        raise
    finally:
        s.close()


def _reserve(kind: str, count: int, owner: Path, candidates: list[int],
             usable: Callable[[int], bool]) -> list[int]:
    d = REGISTRY / kind
    d.mkdir(parents=True, exist_ok=True)
    got: list[int] = []
    for value in candidates:
        if len(got) == count:
            break
        entry = d / str(value)
        if entry.exists() and _owner_holds(entry, kind, value):
            continue
        if not usable(value):
            continue
        entry.write_text(str(owner) + "\n")
        got.append(value)
    if len(got) < count:
        for value in got:
            (d / str(value)).unlink(missing_ok=True)
        from slurm_gpu.errors import SlurmGpuError
        raise SlurmGpuError(f"no free {kind} left for the sandbox", str(d))
    return got


def reserve_ports(count: int, owner: Path) -> list[int]:
    """Reserve *count* TCP ports nobody listens on, for the sandbox at *owner*."""
    lo, hi = PORT_RANGE
    start = random.randrange(lo, hi)
    candidates = list(range(start, hi)) + list(range(lo, start))
    with _locked():
        return _reserve("ports", count, owner, candidates, _port_free)


def reserve_nets(count: int, owner: Path, in_use: set[str]) -> list[int]:
    """Reserve *count* /30 blocks of 10.214.0.0/16 not configured on this host."""
    start = random.randrange(NET_BLOCKS)
    candidates = list(range(start, NET_BLOCKS)) + list(range(0, start))
    with _locked():
        return _reserve("nets", count, owner, candidates,
                        lambda b: net_addrs(b)[0] not in in_use and net_addrs(b)[1] not in in_use)


def net_addrs(block: int) -> tuple[str, str]:
    """(host side, node side) addresses of /30 block *block*."""
    base = block * 4
    third, fourth = divmod(base, 256)
    return f"10.214.{third}.{fourth + 1}", f"10.214.{third}.{fourth + 2}"


def reserve_names(kind: str, names: list[str], owner: Path) -> list[str]:
    """Claim *names* for *owner*, or fail naming the sandbox that holds one.

    Used for cgroup node names: Slurm's cgroup plugins put node ``n1``'s jobs
    under ``/sys/fs/cgroup/<controller>/slurm_n1`` whichever cluster it
    belongs to, so two cgroup sandboxes must not share a node name.
    """
    from slurm_gpu.errors import SlurmGpuError
    d = REGISTRY / kind
    with _locked():
        d.mkdir(parents=True, exist_ok=True)
        for name in names:
            entry = d / name
            if entry.exists() and _owner_holds(entry, kind, name):
                holder = entry.read_text().strip()
                if Path(holder) != owner:
                    raise SlurmGpuError(f"node name {name} is in use by another cgroup sandbox; "
                                        "choose another node prefix", holder)
        for name in names:
            (d / name).write_text(str(owner) + "\n")
    return names


def release(kind: str, values: list[int] | list[str], owner: Path) -> None:
    """Drop reservations of *owner* (others' entries are left alone)."""
    d = REGISTRY / kind
    with _locked():
        for value in values:
            entry = d / str(value)
            try:
                if Path(entry.read_text().strip()) == owner:
                    entry.unlink()
            except FileNotFoundError:
                pass
