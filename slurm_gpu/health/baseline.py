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


# Bounds a real GPU can reach (NVML_NVLINK_MAX_LINKS is 18; PCIe x16 is the
# widest a GPU trains to, Gen 6 the newest; NDR/XDR ports run 400/800 Gb/s):
# a value beyond them is no node's measurement, and a baseline must never make
# every node of a model drain for a link it cannot have.
MAX_LINKS = 18
MAX_LINK_MBPS = 200_000
MAX_PCIE_GEN = 6
MAX_PCIE_WIDTH = 16
MAX_IB_GBPS = 3200
LIMIT = 4 << 20


def _int_in(v: Any, hi: int, lo: int = 0) -> bool:
    return type(v) is int and lo <= v <= hi


def check_entry(e: Any) -> str | None:
    """Why one model's entry is not a baseline (None: it is)."""
    if not isinstance(e, dict):
        return "not a table"
    if "nvlink_up" in e and not _int_in(e["nvlink_up"], MAX_LINKS):
        return f"nvlink_up must be 0..{MAX_LINKS}"
    sp = e.get("nvlink_speeds_mbps")
    if sp is not None and not (isinstance(sp, list) and len(sp) <= MAX_LINKS
                               and all(x is None or _int_in(x, MAX_LINK_MBPS) for x in sp)):
        return f"nvlink_speeds_mbps must list at most {MAX_LINKS} speeds of 0..{MAX_LINK_MBPS} (or null)"
    if "pcie_gen" in e and not _int_in(e["pcie_gen"], MAX_PCIE_GEN, 1):
        return f"pcie_gen must be 1..{MAX_PCIE_GEN}"
    if "pcie_width" in e and not _int_in(e["pcie_width"], MAX_PCIE_WIDTH, 1):
        return f"pcie_width must be 1..{MAX_PCIE_WIDTH}"
    if "fabric" in e and type(e["fabric"]) is not bool:
        return "fabric must be true or false"
    ib = e.get("ib")
    if ib is not None and not (isinstance(ib, dict) and all(
            isinstance(k, str) and type(v) in (int, float) and 0 < v <= MAX_IB_GBPS for k, v in ib.items())):
        return f"ib must map ports to rates of 0..{MAX_IB_GBPS} Gb/s"
    return None


def parse(data: bytes, path: str) -> dict[str, Any]:
    """A baseline document from *data*; InputError naming what is wrong."""
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise InputError(f"health baseline is not JSON: {e}", path) from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("models"), dict):
        raise InputError(f"health baseline must be version {VERSION} with a 'models' table", path)
    for model, entry in doc["models"].items():
        why = check_entry(entry)
        if why:
            raise InputError(f"health baseline model {model!r}: {why}", path)
    return doc


def load(path: str) -> dict[str, Any] | None:
    """The baseline at *path* (None: no file), for `health baseline record`,
    which merges into it: anything wrong with it is bad input, named."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(LIMIT + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise InputError(f"cannot read the health baseline: {e.strerror}", path) from None
    if len(data) > LIMIT:
        raise InputError(f"health baseline is larger than {LIMIT >> 20} MiB", path)
    return parse(data, path)


def load_for_check(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the baseline the health check may compare against, or None; a warning).

    The file usually sits on shared storage, which a user or another node may
    reach: it is read only when it is a regular file root (or we) own that
    nobody else may write, never through a symlink, never blocking on a FIFO,
    and within :data:`LIMIT`; its values must lie within what hardware can
    reach.  Anything else is ignored with a warning (the checks fall back to
    comparing GPUs of the same model here): a baseline must never stop the
    health check, nor drain a node by itself.
    """
    import os

    from ..fsutil import read_trusted
    if not path:
        return None, None
    if not os.path.lexists(path):
        return None, None
    data = read_trusted(path, LIMIT + 1)
    if data is None:
        return None, (f"health baseline {path} ignored: not a regular file that root owns and "
                      "only root may write (a symlink, a FIFO, or another user's file)")
    if len(data) > LIMIT:
        return None, f"health baseline {path} ignored: larger than {LIMIT >> 20} MiB"
    try:
        return parse(data, path), None
    except InputError as e:
        return None, f"{e.what} ({path}): ignored"


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
            # InfiniBand ports only: ib.port checks no Ethernet (RoCE) port, and an
            # H100 node's BlueField-3 bond is one (tests/data/ib/gpud-h100).
            e["ib"] = {name: p.rate for name, p in sorted(ib_ports.items())
                       if p.rate and p.state == "ACTIVE" and p.link_layer == "InfiniBand"}
    return out


def merged(old: Mapping[str, Any] | None, new: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """*old*'s models, with this node's models replaced (other models kept)."""
    models = dict((old or {}).get("models") or {})
    models.update(new)
    return {"version": VERSION, "models": dict(sorted(models.items()))}
