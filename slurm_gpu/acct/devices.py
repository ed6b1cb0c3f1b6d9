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


def slurm_device_keys(node: Any) -> list[str]:
    """Device keys in Slurm's gpu index order (``"0"``, ``"2/gi7"``...)."""
    from ..confgen.gres import gres_records
    by_minor = {g.minor: g for g in node.gpus}
    groups: dict[str | None, list[str]] = {}
    for rec in gres_records(node):
        if rec.name != "gpu":
            continue
        keys = groups.setdefault(rec.type, [])
        if rec.multiple_files:
            m = _DEV.search(rec.multiple_files[0])
            caps = [int(c.group(1)) for c in map(_CAP.search, rec.multiple_files) if c]
            g = by_minor.get(int(m.group(1))) if m else None
            if g is None or not caps:
                keys.append("?")
                continue
            gi = next((i.gi_id for i in g.mig_instances if i.gi_cap_minor in caps), None)
            keys.append(f"{g.index}/gi{gi}" if gi is not None else "?")
        else:
            for f in rec.files:
                m = _DEV.search(f)
                g = by_minor.get(int(m.group(1))) if m else None
                keys.append(str(g.index) if g is not None else "?")
    return [k for keys in groups.values() for k in keys]


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
