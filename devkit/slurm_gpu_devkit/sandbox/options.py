"""What a sandbox is made of, and what ``up`` needs of the host."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.hw.model import Node
from . import install

BINARIES = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sinfo")


@dataclass
class SandboxOptions:
    """What a sandbox is made of (every field has a usable default)."""

    nodes: int = 1
    machine: str | os.PathLike[str] | None = None        # name or path; default h100-sxm-8x
    model: Node | None = None                             # use this model instead of a machine
    netns: bool = False
    prolog: bool | None = False                           # None: when the project has scripts
    health: bool | None = False                           # None: when the venv has `health`
    health_interval: int = 5
    health_args: Sequence[str] = ()
    spank: bool | None = False                            # None: when the venv has `spank`
    spank_args: Mapping[str, str] = field(default_factory=dict)
    simulate: bool | None = False                         # NVML simulator + MPS stand-in per node;
                                                          # None: when the machine has facts.json and
                                                          # extra_config sets no [node] nvml
    sim_mig: str = "per-job"                              # nodesim.MIG_MODES
    extra_config: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # slurm-gpu.toml
    slurm_conf: Mapping[str, str] = field(default_factory=dict)   # slurm.conf Key=Value overrides
    etc_files: Mapping[str, str] = field(default_factory=dict)    # extra files in DIR/etc
    gres_options: Mapping[str, Any] = field(default_factory=dict)  # confgen.GresOptions fields
    node_prefix: str = "n"
    cgroup: bool = False
    accounting: bool = False                              # slurmdbd + private MariaDB
    accounting_users: Sequence[str] = ("root", "sgtest1", "sgtest2")  # added when they exist
    timeout: float = 30.0
    venv: Path = install.DEFAULT_VENV
    slurm: str | None = None                              # "24.11", "26.05"; None: the host's
    vm: bool = False                                      # the nodes in a systemd + cgroup v2 VM
    boot_timeout: float = 240.0                           # --vm: seconds until the guest answers


def require_root(what: str = "sandbox") -> None:
    if os.geteuid() != 0:
        raise SlurmGpuError(f"{what} needs root",
                            "it makes device files and namespaces and runs Slurm's daemons; "
                            "run it as root")


def require_slurm(root: Path | None = None) -> None:
    """Slurm's daemons and munge installed (in *root*, a Debian root, when given)."""
    base = str(root or "")
    missing = [b for b in BINARIES if not os.access(base + b, os.X_OK)]
    if missing:
        raise SlurmGpuError("Slurm or munge is not installed (apt-get install slurmctld slurmd "
                            "slurm-client munge)", missing[0])
