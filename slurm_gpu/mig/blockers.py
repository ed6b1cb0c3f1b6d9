"""What can stop MIG changes on a node, and how to fix each.

NVML refuses MIG mode changes, and GPU/compute-instance changes on busy
GPUs, with ``NVML_ERROR_IN_USE`` while another client holds the GPU.  The
usual holders on a Slurm node are listed here, each with its fix.  The
checks read ``/proc`` and slurm.conf only (no commands), so they are cheap
enough to run whenever an NVML MIG call answers IN_USE.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .. import slurmclient


@dataclass(frozen=True)
class Blocker:
    name: str
    evidence: str
    fix: str

    def line(self) -> str:
        return f"{self.name} ({self.evidence}): {self.fix}"


# comm (15 chars at most, as the kernel truncates it) -> (name, fix)
PROCESSES = {
    "nvidia-persiste": ("nvidia-persistenced",
                        "stop it for MIG mode changes (systemctl stop nvidia-persistenced), "
                        "start it again afterwards"),
    "nv-hostengine": ("DCGM host engine (nv-hostengine)",
                      "stop it (systemctl stop nvidia-dcgm) or make DCGM release MIG "
                      "devices before changing instances"),
    "dcgm-exporter": ("dcgm-exporter", "stop it while MIG instances change"),
    "dcgmi": ("dcgmi", "wait for it to finish"),
}


def find(proc: str = "/proc", slurm_conf: str | None = None) -> list[Blocker]:
    """The blockers present on this node."""
    out: list[Blocker] = []
    seen: set[str] = set()
    try:
        # numeric order: the report must not depend on the filesystem's listing order
        names = sorted((n for n in os.listdir(proc) if n.isdigit()), key=int)
    except OSError:
        names = []
    for pid in names:
        try:
            with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm in PROCESSES and comm not in seen:
            seen.add(comm)
            name, fix = PROCESSES[comm]
            out.append(Blocker(name, f"pid {pid}", fix))
    keys = slurmclient.read_conf(slurmclient.conf_path(slurm_conf)) or {}
    energy = keys.get("acctgatherenergytype", "")
    if "gpu" in energy:
        out.append(Blocker("slurmd GPU energy accounting", f"AcctGatherEnergyType={energy}",
                           "slurmd keeps NVML open; set AcctGatherEnergyType=acct_gather_energy/"
                           "none (or ipmi/rapl) and restart slurmd"))
    tres = keys.get("accountingstoragetres", "")
    if re.search(r"gres/gpu(mem|util)", tres):
        out.append(Blocker("slurmstepd GPU accounting", f"AccountingStorageTRES={tres}",
                           "slurmstepd polls the GPUs through NVML; drop gres/gpumem and "
                           "gres/gpuutil from AccountingStorageTRES"))
    return out


def explain(blockers: list[Blocker]) -> str:
    if not blockers:
        return "no known blocker found (a process may still be using the GPU: nvidia-smi)"
    return "; ".join(b.line() for b in blockers)
