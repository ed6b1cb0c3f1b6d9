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

from .gres import GresOptions, gres_records, node_line, render_gres_conf
from .nodeline import SocketLayout, socket_layout

__all__ = ["GresOptions", "SocketLayout", "gres_records", "node_line", "render_gres_conf",
           "socket_layout"]
