"""The fabric baseline: what a known-good node of a model has, for every node of it.

``slurm-gpu health baseline record`` on a known-good node writes (merges) one
entry per GPU model into ``[health] baseline`` (a file on shared storage, or
shipped with the image)::

    {"version": 1,
     "models": {"NVIDIA H100 80GB HBM3": {
         "nvlink_up": 18,                     # active NVLinks per GPU
         "nvlink_speeds_mbps": [26562, ...],  # per link slot (null: no link there)
         "pcie_gen": 5, "pcie_width": 16,     # what the GPUs trained to
         "fabric": false,                     # a multi-node NVLink domain (non-zero cluster UUID)
         "ib": {"mlx5_0/1": 400}}}}           # InfiniBand port -> rate, Gb/s

The checks compare against it rather than only against "the best GPU of the
same model" here, which is blind when every GPU degraded alike.  A node with
no entry for its model falls back to that comparison.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from ..errors import InputError

VERSION = 1


def load(path: str) -> dict[str, Any] | None:
    """The baseline at *path* (None: no file). A broken file is bad input, named."""
    if not path:
        return None
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise InputError(f"cannot read the health baseline: {e.strerror}", path) from None
    except ValueError as e:
        raise InputError(f"health baseline is not JSON: {e}", path) from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("models"), dict):
        raise InputError(f"health baseline must be version {VERSION} with a 'models' table", path)
    return doc


def entry_for(health: Any, ib_ports: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """model name -> the entry this node's healthy state gives (the best GPU of each model)."""
    out: dict[str, dict[str, Any]] = {}
    for g in getattr(health, "gpus", None) or []:
        if g.lost is not None or not g.name:
            continue
        e = out.setdefault(g.name, {})
        up = sum(1 for s in g.nvlink_states or () if s)
        if g.nvlink_states is not None:
            e["nvlink_up"] = max(e.get("nvlink_up", 0), up)
        if g.nvlink_speeds:
            old = e.get("nvlink_speeds_mbps") or [None] * len(g.nvlink_speeds)
            e["nvlink_speeds_mbps"] = [max((x for x in (a, b) if x is not None), default=None)
                                       for a, b in zip(old, g.nvlink_speeds)]
        if g.pcie_width:
            e["pcie_width"] = max(e.get("pcie_width", 0), g.pcie_width[0])
        if g.pcie_gen:
            # An idle GPU trains down: record the generation it can run at.
            e["pcie_gen"] = max(e.get("pcie_gen", 0), g.pcie_gen[1])
        if g.fabric_state not in (None, "not_supported"):
            e["fabric"] = e.get("fabric", False) or bool(
                g.fabric_cluster_uuid and g.fabric_cluster_uuid.strip("0-"))
        if ib_ports:
            e["ib"] = {name: p.rate for name, p in sorted(ib_ports.items())
                       if p.rate and p.state == "ACTIVE"}
    return out


def merged(old: Mapping[str, Any] | None, new: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """*old*'s models, with this node's models replaced (other models kept)."""
    models = dict((old or {}).get("models") or {})
    models.update(new)
    return {"version": VERSION, "models": dict(sorted(models.items()))}
