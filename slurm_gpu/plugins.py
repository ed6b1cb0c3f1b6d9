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

import importlib
import os
import sys
from typing import Any, NamedTuple


class EntryPoint(NamedTuple):
    """One ``name = module:attr`` line of a distribution's ``entry_points.txt``."""
    name: str
    value: str
    group: str

    def load(self) -> Any:
        """Import the module and return the attribute the entry point names."""
        mod, _, attr = self.value.partition(":")
        obj: Any = importlib.import_module(mod.strip())
        for part in attr.strip().split(".") if attr.strip() else ():
            obj = getattr(obj, part)
        return obj


def _parse(text: str, group: str) -> list[EntryPoint]:
    """The entries of *group* in an ``entry_points.txt`` (the INI form of the
    PyPA entry-points specification: ``[group]`` then ``name = value`` lines)."""
    out: list[EntryPoint] = []
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line[0] == "[" and line[-1] == "]":
            current = line[1:-1].strip()
        elif current == group and "=" in line:
            name, _, value = line.partition("=")
            out.append(EntryPoint(name.strip(), value.strip(), group))
    return out


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points of *group* of the distributions on ``sys.path``; the
    first on the path wins per name, as with ``importlib.metadata``.

    Read here rather than through ``importlib.metadata``, whose import (email,
    zipfile, csv ...) costs ~30 ms: the sandbox's prolog and health check
    open the simulator backend on every run."""
    seen: dict[str, EntryPoint] = {}
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(entry or ".", name, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            for ep in _parse(text, group):
                seen.setdefault(ep.name, ep)
    return list(seen.values())


def find(group: str, name: str) -> EntryPoint | None:
    """The entry point *name* of *group*, or None when no installed distribution has it."""
    for ep in entry_points(group):
        if ep.name == name:
            return ep
    return None


def names(group: str) -> list[str]:
    """The names registered in *group*, sorted."""
    return sorted(ep.name for ep in entry_points(group))
