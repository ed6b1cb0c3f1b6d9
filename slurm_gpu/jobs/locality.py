"""GPU identity and local CPUs for the prolog, cached per boot.

Reading the node model (hwloc topology + NVML) costs ~100 ms, more than a
whole MPS prolog should; GPUs and their CPU locality do not change while
the machine is up.  So the first prolog on a node reads the model and
writes ``<state_dir>/gpu-locality.json`` (atomically); later prologs read that
small file.  The cache is keyed on the kernel's boot id, the ``[node]``
sources and gres.conf, so a reboot or a config change re-reads the hardware.

The table is keyed by Slurm's GPU index (what ``SLURM_JOB_GPUS`` holds, see
:mod:`slurm_gpu.confgen.gresorder`), and each entry names its GPU by UUID
and device minor: never by NVML index, which is neither.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from ..fsutil import atomic_write
from ..procfs import boot_id

NAME = "gpu-locality.json"


def _stamp(path: str | None) -> str:
    try:
        st = os.stat(path) if path else None
    except OSError:
        return f"{path}:absent"
    return f"{path}:{st.st_mtime_ns}:{st.st_size}:{st.st_ino}" if st else ""


def gpu_table(state_dir: str, key: str, read_node: Callable[[], Any], gres_conf: str | None = None,
              node_name: str = "") -> dict[int, dict[str, Any]]:
    """{Slurm GPU index: {"minor", "uuid", "name", "cpus"}} from the cache or *read_node*."""
    want = f"{boot_id()}|{key}|{node_name}|{_stamp(gres_conf)}"
    p = Path(state_dir) / NAME
    try:
        data = json.loads(p.read_text())
        if data.get("key") == want:
            return {int(k): v for k, v in data["gpus"].items()}
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    from ..confgen.gresorder import node_minors, read_conf
    node = read_node()
    pus_of = {c.index: c.pus for c in node.cores}
    by_minor = {int(g.minor if g.minor is not None else g.index): g for g in node.gpus}
    order = node_minors(node.gpus, read_conf(gres_conf, node_name))
    table: dict[int, dict[str, Any]] = {}
    for k, minor in enumerate(order):
        g = by_minor.get(minor)
        if g is None:
            continue                       # in gres.conf, not on this node: Slurm drains it
        table[k] = {"minor": minor, "uuid": g.uuid, "name": g.name,
                    "cpus": sorted({pu for c in g.cores for pu in pus_of.get(c, ())})}
    os.makedirs(state_dir, exist_ok=True)
    atomic_write(p, json.dumps({"key": want, "gpus": table}, indent=1))
    return table
