"""Which devices a job holds: Slurm's GPU indices turned into device keys.

``SLURM_JOB_GPUS`` in the prolog holds Slurm's indices of the node's gpu
gres, not NVML indices.  Slurm 22.05 numbers the devices of gres.conf
grouped by type, types in order of first appearance, devices in file order
within a type (checked in the sandbox on h100-mig: whole H100s 0-1, the two
4g.40gb instances 2-3, the six 1g.10gb 4-9).  gres.conf comes from our
generator, so the same records, read from the node model, give the map:
a whole GPU (``/dev/nvidiaN``) is its NVML index, a MIG record
(``MultipleFiles=/dev/nvidiaN,.../nvidia-capG,...``) the GPU instance whose
access minor is ``G``.
"""
from __future__ import annotations

import re
from typing import Any

_DEV = re.compile(r"/nvidia([0-9]+)$")
_CAP = re.compile(r"/nvidia-cap([0-9]+)$")


def slurm_device_keys(node: Any, conf: Any = None) -> list[str]:
    """Device keys in Slurm's gpu index order (``"0"``, ``"2/gi7"``...).

    *conf* is this node's deployed gres.conf (:class:`~slurm_gpu.confgen.grescheck.NodeGres`):
    what slurmd numbered.  Without it the records are rendered from *node*,
    which only matches while the node has no instances a ``--gpu-mig`` job
    made (they are in the live model, never in gres.conf)."""
    by_minor = {g.minor: g for g in node.gpus}
    groups: dict[str | None, list[str]] = {}
    for gtype, files in _gpu_records(node, conf):
        keys = groups.setdefault(gtype, [])
        m = next((x for x in map(_DEV.search, files) if x), None)
        caps = [int(c.group(1)) for c in map(_CAP.search, files) if c]
        g = by_minor.get(int(m.group(1))) if m else None
        if g is None:
            keys.append("?")
        elif caps:
            gi = next((i.gi_id for i in g.mig_instances if i.gi_cap_minor in caps), None)
            keys.append(f"{g.index}/gi{gi}" if gi is not None else "?")
        else:
            keys.append(str(g.index))
    return [k for keys in groups.values() for k in keys]


def _gpu_records(node: Any, conf: Any) -> list[tuple[str | None, list[str]]]:
    """(type, device files) of each gres/gpu device, in file order: one per GPU or MIG record."""
    if conf is not None:
        return [(dev.type, files.split(",")) for (name, files), dev in conf.devices.items() if name == "gpu"]
    from ..confgen.gres import gres_records
    out: list[tuple[str | None, list[str]]] = []
    for rec in gres_records(node):
        if rec.name != "gpu":
            continue
        if rec.multiple_files:
            out.append((rec.type, list(rec.multiple_files)))
        else:
            out += [(rec.type, [f]) for f in rec.files]
    return out


def job_device_keys(slurm_indices: list[int], order: list[str], mig_state: dict[str, Any] | None) -> list[str]:
    """The job's device keys: its MIG instances (``--gpu-mig``) when the
    prolog made some, else its gres devices."""
    if mig_state and mig_state.get("gpus"):
        out = []
        for g in mig_state["gpus"]:
            for inst in g.get("instances", []):
                if inst.get("gi_id") is not None:
                    out.append(f"{int(g['index'])}/gi{int(inst['gi_id'])}")
        if out:
            return out
    return [order[i] for i in slurm_indices if 0 <= i < len(order) and order[i] != "?"]
