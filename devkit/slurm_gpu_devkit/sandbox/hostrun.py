"""What a test or benchmark run adds under this host's ``/run``, removed when it ends.

Tests and benchmarks reach the product's real runtime directories through
the installed commands (prologs, health runs, SPANK hooks run with their
own config): the node-fact cache, the SPANK cache, MPS directories.  The
sandbox registry (reservations of ports, nets and cgroups) is removed only
when the run made it and holds no reservation: where it was there before,
a sandbox started by hand (``make demo``, ``sandbox up``) may still use it.
"""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator

RUN_DIRS = ("/run/slurm-gpu/node-facts", "/run/slurm-gpu/spank-cache", "/run/slurm-gpu/mps",
            "/run/slurm-gpu")       # deepest first: a directory the run made goes once emptied
REGISTRY = "/run/slurm-gpu-sandbox"


def _listing(path: str) -> set[str] | None:
    try:
        return set(os.listdir(path))
    except OSError:
        return None


@contextmanager
def left_as_found(dirs: tuple[str, ...] = RUN_DIRS, registry: str = REGISTRY) -> Iterator[None]:
    """Remove, on the way out, every entry of *dirs* that was not there on the way in."""
    before = {d: _listing(d) for d in dirs}
    registry_was = os.path.lexists(registry)
    try:
        yield
    finally:
        if not registry_was and os.path.isdir(registry) and not os.path.islink(registry):
            if not any(os.listdir(os.path.join(registry, d)) for d in os.listdir(registry)
                       if os.path.isdir(os.path.join(registry, d))):
                shutil.rmtree(registry, ignore_errors=True)   # only our own bookkeeping
        for d in dirs:
            was, now = before[d], _listing(d)
            if now is None:
                continue
            for name in now - (was or set()):
                p = os.path.join(d, name)
                if os.path.isdir(p) and not os.path.islink(p):
                    if p not in dirs:
                        shutil.rmtree(p, ignore_errors=True)
                else:
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
            if was is None:
                try:
                    os.rmdir(d)
                except OSError:
                    pass
