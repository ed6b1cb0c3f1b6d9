"""Finding and loading the machine a sandbox models.

A machine is a directory ``<name>/`` holding ``snapshot.json`` (NVML answers
+ hwloc XML), ``facts.json`` (what the NVML simulator answers from) and/or
``hwloc.xml``.  The recorded machines ship inside the devkit
(``devkit/slurm_gpu_devkit/machines/``, each with its PROVENANCE.md; a checkout's
``tests/data/machines`` points there), so a name works from any directory
and in an installed package.  A name is looked up in ``$SLURM_GPU_MACHINES``
(colon-separated directories), then in the package, then under the current
directory's ``tests/data/machines`` (a checkout's newer recordings), then in
``<venv>/share/slurm-gpu/machines``; a path is taken as is.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from slurm_gpu.errors import InputError
from slurm_gpu.hw.model import Node

DEFAULT_MACHINE = "h100-sxm-8x"
ENV_VAR = "SLURM_GPU_MACHINES"


@dataclass(frozen=True)
class Machine:
    label: str                 # what the user gave
    directory: Path | None
    snapshot: Path | None
    hwloc_xml: Path | None


def search_dirs() -> list[Path]:
    from slurm_gpu_devkit import MACHINES_DIR
    dirs = []
    if os.environ.get(ENV_VAR):
        dirs += [Path(p) for p in os.environ[ENV_VAR].split(":") if p]
    dirs += [MACHINES_DIR, Path.cwd() / "tests" / "data" / "machines",
             Path(sys.prefix) / "share" / "slurm-gpu" / "machines"]
    out: list[Path] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


def resolve(name_or_path: str | os.PathLike[str] | None) -> Machine:
    """The machine directory (or snapshot/XML file) for a name or path."""
    label = str(name_or_path or DEFAULT_MACHINE)
    p = Path(label).expanduser()
    candidates = [p] if (os.sep in label or p.exists()) else [d / label for d in search_dirs()]
    for c in candidates:
        if c.is_file():
            c = c.resolve()
            if c.suffix == ".xml":
                return Machine(label, c.parent, None, c)
            return Machine(label, c.parent, c, None)
        if c.is_dir():
            c = c.resolve()
            snap = c / "snapshot.json"
            xml = c / "hwloc.xml"
            if not snap.is_file() and not xml.is_file():
                raise InputError("machine directory has neither snapshot.json nor hwloc.xml", str(c))
            return Machine(label, c, snap if snap.is_file() else None, xml if xml.is_file() else None)
    looked = ", ".join(str(c) for c in candidates)
    raise InputError(f"unknown machine {label!r}", f"looked in {looked}")


def load(machine: Machine) -> Node:
    """The machine's node model (snapshot preferred: it carries NVML's view)."""
    from slurm_gpu import hw
    if machine.snapshot is not None:
        return hw.load_node(hw.Snapshot(str(machine.snapshot)))
    return hw.load_node(hw.HwlocXml(str(machine.hwloc_xml)))
