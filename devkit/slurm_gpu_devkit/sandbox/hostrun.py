"""What a test or benchmark run adds under this host's ``/run``, removed when it ends.

Tests and benchmarks reach the product's real runtime directories through
the installed commands (prologs, health runs, SPANK hooks run with their
own config): the node-fact cache, the SPANK cache, MPS directories.  The
sandbox registry (reservations of ports, nets and cgroups) is removed only
when the run made it and holds no reservation: where it was there before,
a sandbox started by hand (``make demo``, ``sandbox up``) may still use it.

``scripts/test.sh`` runs two pytest processes side by side (unit beside
integration): the first to end would remove what the other still uses, so
the script takes the snapshot itself (``python -m
slurm_gpu_devkit.sandbox.hostrun save FILE`` / ``restore FILE``) and sets
:data:`OUTER` for both, which makes :func:`left_as_found` a no-op.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from contextlib import contextmanager

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator

RUN_DIRS = ("/run/slurm-gpu/node-facts", "/run/slurm-gpu/spank-cache", "/run/slurm-gpu/mps",
            "/run/slurm-gpu")       # deepest first: a directory the run made goes once emptied
REGISTRY = "/run/slurm-gpu-sandbox"
OUTER = "SLURM_GPU_HOST_RUN_SAVED"   # set: an outer process saved /run and restores it


def _listing(path: str) -> set[str] | None:
    try:
        return set(os.listdir(path))
    except OSError:
        return None


def snapshot(dirs: tuple[str, ...] = RUN_DIRS, registry: str = REGISTRY) -> dict[str, object]:
    """What is there now: each dir's entries (None: no dir), and whether the registry was."""
    return {"dirs": {d: sorted(e) if (e := _listing(d)) is not None else None for d in dirs},
            "registry": os.path.lexists(registry)}


def restore(snap: dict[str, object], registry: str = REGISTRY) -> None:
    """Remove every entry the run added since *snap* (see the module's docstring)."""
    before: dict[str, list[str] | None] = snap["dirs"]   # type: ignore[assignment]
    dirs = tuple(before)
    if not snap["registry"] and os.path.isdir(registry) and not os.path.islink(registry):
        if not any(os.listdir(os.path.join(registry, d)) for d in os.listdir(registry)
                   if os.path.isdir(os.path.join(registry, d))):
            shutil.rmtree(registry, ignore_errors=True)   # only our own bookkeeping
    for d in dirs:
        was, now = before[d], _listing(d)
        if now is None:
            continue
        for name in now - set(was or ()):
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


@contextmanager
def left_as_found(dirs: tuple[str, ...] = RUN_DIRS, registry: str = REGISTRY) -> Iterator[None]:
    """Remove, on the way out, every entry of *dirs* that was not there on the way in."""
    if os.environ.get(OUTER) == "1":
        yield
        return
    snap = snapshot(dirs, registry)
    try:
        yield
    finally:
        restore(snap, registry)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("save", "restore"):
        print("usage: python -m slurm_gpu_devkit.sandbox.hostrun save|restore FILE", file=sys.stderr)
        return 2
    if argv[0] == "save":
        with open(argv[1], "w") as f:
            json.dump(snapshot(), f)
    else:
        with open(argv[1]) as f:
            restore(json.load(f))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
