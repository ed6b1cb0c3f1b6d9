"""Pure generators for Slurm configuration: gres.conf, slurm.conf node lines, topology.

Everything here is data in, text (or data) out: no file, device or network
I/O.  Front ends (``slurm_gpu/commands/gres.py``, ``topology.py``) load the
hardware model, call these functions and write the results atomically.

Public API (stable, used by the sandbox):

* :func:`render_gres_conf` -- gres.conf text for many nodes, identical nodes
  folded into hostlist ranges.
* :func:`node_line` -- the slurm.conf ``NodeName=`` line for one node, like
  ``slurmd -C`` plus ``Gres=``.
* :class:`GresOptions` -- naming, device directory, sharing counts.
"""
from __future__ import annotations

from typing import Any

# Loaded on first use (PEP 562): the prolog and the SPANK plugin import only
# confgen.gresorder, and this package's generators (gres: hw.model, ClusterShell)
# cost them about 15 ms per run (python -X importtime).
_LAZY = {"GresOptions": "gres", "gres_records": "gres", "node_line": "gres",
         "render_gres_conf": "gres", "SocketLayout": "nodeline", "socket_layout": "nodeline"}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f".{mod}", __name__), name)


__all__ = ["GresOptions", "SocketLayout", "gres_records", "node_line", "render_gres_conf",
           "socket_layout"]
