"""``--isolate-bad-gpu``: take one bad GPU out of gres.conf instead of draining the node.

Off by default; the trade-off is in docs/health.md.  :func:`bad_gpus` is
pure (which GPUs, if isolating is allowed at all); :func:`isolate` rewrites
this node's gres.conf through the confgen API and tells Slurm.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Iterable

from .. import runner
from ..errors import SlurmGpuError
from .findings import DRAIN, WARN, Finding

BACKUP = ".slurm-gpu.orig"      # beside the real file: gres.conf as it was before we isolated anything
# Faults that hurt the other GPUs too (bus, fabric, the NVML library): never isolated.
_NODE_WIDE = {"gpu.nvml", "gpu.nvlink", "gpu.fabric"}


def bad_gpus(findings: Iterable[Finding], all_gpus: Iterable[str]) -> set[str] | None:
    """The GPUs to isolate, or None when the node must be drained instead."""
    drains = [f for f in findings if f.severity == DRAIN]
    if not drains:
        return None
    bad = {f.gpu for f in drains}
    if None in bad or any(f.check in _NODE_WIDE for f in drains):
        return None
    if any(f.check == "gpu.xid" and f.xid == 79 for f in drains):
        return None  # a GPU off the bus can take the PCIe tree with it
    gpus = set(all_gpus)
    if not bad <= gpus or bad == gpus:
        return None
    return bad  # type: ignore[return-value]


def soften(findings: list[Finding], isolated: set[str]) -> list[Finding]:
    """Findings on already isolated GPUs are warnings: that GPU is out of service."""
    out = []
    for f in findings:
        if f.gpu in isolated and f.severity == DRAIN and f.check not in _NODE_WIDE:
            f = dataclasses.replace(f, severity=WARN, message=f"{f.message} [GPU isolated from gres.conf]")
        out.append(f)
    return out


def isolate(node_name: str, bad: set[str], gres_path: str, scontrol: str, timeout: float) -> str:
    """Rewrite gres.conf for *node_name* without *bad* GPUs; update Slurm.  Returns a note.

    Raises SlurmGpuError when isolating is not possible (the caller drains).
    """
    from ..confgen import gres as cg
    from ..confgen import gresconf
    from ..hw import load_node
    with open(gres_path) as f:
        text = f.read()
    conf = gresconf.parse(text.splitlines(), gres_path)
    gresconf.refuse_shared(conf, node_name, ": cannot isolate one GPU", gres_path)
    files = [k for (name, k) in gresconf.node_gres(conf, node_name).devices if name == "gpu"]
    m = next((re.match(r"(.*)/nvidia\d+$", f) for f in files if re.match(r"(.*)/nvidia\d+$", f)), None)
    dev_dir = m.group(1) if m else "/dev"
    node = load_node()
    kept = dataclasses.replace(node, gpus=tuple(g for g in node.gpus if g.pci_bus_id not in bad))
    if len(kept.gpus) == len(node.gpus):
        raise SlurmGpuError("the bad GPU is not in this node's model: cannot isolate it")
    opts = cg.GresOptions(dev_dir=dev_dir)
    new_text = gresconf.render({node_name: kept}, opts)
    gres = cg.node_gres_summary(kept, opts)
    # Slurm first: if slurmctld refuses the new count, nothing has changed yet.
    # (Slurm 22.05 refuses for File= GRES: "Attempt to change gres/gpu Count
    # on node ... invalid with File configuration"; the caller then drains.)
    try:
        runner.run([scontrol, "update", f"nodename={node_name}", f"gres={gres}"], timeout)
    except SlurmGpuError as e:
        raise SlurmGpuError(f"slurmctld refused Gres={gres} ({e.what})") from None
    try:
        # The original (before any isolation) is kept; a symlink's target is written.
        target = gresconf.apply(gres_path, new_text, backup=BACKUP, keep_first_backup=True)
        runner.run([scontrol, "reconfigure"], timeout)
    except SlurmGpuError:
        # Put everything back as it was, then let the caller drain.
        gresconf.apply(gres_path, text, backup=None)
        old = cg.node_gres_summary(node, opts)
        runner.run([scontrol, "update", f"nodename={node_name}", f"gres={old}"], timeout, check=False)
        raise
    return f"isolated {', '.join(sorted(bad))}: gres.conf rewritten ({target}{BACKUP} kept), Gres={gres}"
