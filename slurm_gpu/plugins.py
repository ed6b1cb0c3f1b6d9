"""What other installed distributions add to slurm-gpu, through entry points.

Two groups, both read only when asked for (the scan of installed metadata
costs a few milliseconds, which the prolog and the health check never pay):

* ``slurm_gpu.backends``: GPU backends, ``<scheme> = "module:opener"``
  (:mod:`slurm_gpu.hw.backend`; ``[node] nvml = "<scheme>:<path>"``);
* ``slurm_gpu.commands``: ``slurm-gpu`` subcommands, ``<name> = "module:command"``
  (:mod:`slurm_gpu.cli`).

The runtime ships none: the devkit (``slurm_gpu_devkit``: simulator, sandbox,
recorded machines) registers its own, and the runtime never imports it.
"""
from __future__ import annotations

import sys
from typing import Any


def entry_points(group: str) -> list[Any]:
    """The installed entry points of *group* (``importlib.metadata.EntryPoint``), first wins per name."""
    from importlib import metadata
    if sys.version_info >= (3, 10):
        eps = list(metadata.entry_points(group=group))
    else:   # 3.9 (EL9): a dict of group -> entry points
        eps = list(metadata.entry_points().get(group, ()))
    seen: dict[str, Any] = {}
    for ep in eps:
        seen.setdefault(ep.name, ep)
    return list(seen.values())


def find(group: str, name: str) -> Any | None:
    """The entry point *name* of *group*, or None when no installed distribution has it."""
    for ep in entry_points(group):
        if ep.name == name:
            return ep
    return None


def names(group: str) -> list[str]:
    """The names registered in *group*, sorted."""
    return sorted(ep.name for ep in entry_points(group))
