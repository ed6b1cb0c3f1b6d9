"""GPU identity and local CPUs for the prolog, cached per boot.

Reading the node model (hwloc topology + NVML) costs ~100 ms, more than a
whole MPS prolog should; GPUs and their CPU locality do not change while
the machine is up.  So the first prolog on a node reads the model and
writes ``<state_dir>/gpu-locality.json`` (atomically); later prologs read that
small file.  The cache is keyed on the kernel's boot id and the ``[node]``
sources, so a reboot or a config change re-reads the hardware.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from ..fsutil import atomic_write

NAME = "gpu-locality.json"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def gpu_table(state_dir: str, key: str, read_node: Callable[[], Any]) -> dict[int, dict[str, Any]]:
    """{GPU minor (or index): {"uuid", "name", "cpus"}} from the cache or *read_node*."""
    want = f"{_boot_id()}|{key}"
    p = Path(state_dir) / NAME
    try:
        data = json.loads(p.read_text())
        if data.get("key") == want:
            return {int(k): v for k, v in data["gpus"].items()}
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    node = read_node()
    pus_of = {c.index: c.pus for c in node.cores}
    table: dict[int, dict[str, Any]] = {}
    for g in node.gpus:
        k = g.minor if g.minor is not None else g.index
        table[int(k)] = {"uuid": g.uuid, "name": g.name,
                         "cpus": sorted({pu for c in g.cores for pu in pus_of.get(c, ())})}
    os.makedirs(state_dir, exist_ok=True)
    atomic_write(p, json.dumps({"key": want, "gpus": table}, indent=1))
    return table
