"""Test helpers over every recorded machine in ``tests/data/machines/``.

A machine directory holds ``hwloc.xml`` (a real lstopo export) and/or
``snapshot.json`` (recorded NVML answers + hwloc XML), plus PROVENANCE.md.

Use them in any test area:

* parametrize at collection time: ``from machinedata import all_machines`` then
  ``@pytest.mark.parametrize("name", all_machines())``;
* or just name a fixture argument: ``machine_name`` (every machine),
  ``hwloc_machine_name`` (machines with an hwloc.xml), ``gpu_machine_name``
  (machines with at least one GPU); ``machine_node`` gives the loaded
  :class:`~slurm_gpu.hw.model.Node` of the ``machine_name`` being run.
"""
from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path

from paths import ROOT

if str(ROOT) not in sys.path:  # tests import the checkout, not the installed copy
    sys.path.insert(0, str(ROOT))

MACHINES_DIR = ROOT / "tests" / "data" / "machines"


def all_machines() -> list[str]:
    """Names of every machine directory that has a snapshot or an hwloc XML."""
    if not MACHINES_DIR.is_dir():
        return []
    return sorted(d.name for d in MACHINES_DIR.iterdir()
                  if d.is_dir() and ((d / "snapshot.json").is_file() or (d / "hwloc.xml").is_file()))


def hwloc_machines() -> list[str]:
    """Machines that have a real hwloc XML."""
    return [m for m in all_machines() if (MACHINES_DIR / m / "hwloc.xml").is_file()]


def machine_dir(name: str) -> Path:
    """The directory of machine *name*."""
    return MACHINES_DIR / name


def machine_xml(name: str) -> Path:
    """Path of machine *name*'s hwloc.xml."""
    return MACHINES_DIR / name / "hwloc.xml"


@functools.lru_cache(maxsize=None)
def load_machine(name: str):  # -> slurm_gpu.hw.model.Node (frozen, safe to share)
    """The machine's Node: from snapshot.json when present, else from hwloc.xml."""
    from slurm_gpu.hw import HwlocXml, Snapshot, load_node

    d = MACHINES_DIR / name
    if (d / "snapshot.json").is_file():
        return load_node(Snapshot(str(d / "snapshot.json")))
    return load_node(HwlocXml(str(d / "hwloc.xml"), hostname=name))


@functools.lru_cache(maxsize=None)
def load_machine_from_xml(name: str):
    """The machine's Node from its hwloc.xml alone (no NVML answers)."""
    from slurm_gpu.hw import HwlocXml, load_node

    return load_node(HwlocXml(str(machine_xml(name)), hostname=name))


def hwloc_calc(xml: str, *args: str) -> list[int]:
    """Run the real ``hwloc-calc -i XML ARGS...`` (the oracle) and parse its comma list."""
    exe = shutil.which("hwloc-calc") or "/usr/bin/hwloc-calc"
    out = subprocess.run([exe, "-i", xml, *args], capture_output=True, text=True,
                         check=True, timeout=30).stdout.strip()
    return [int(x) for x in out.split(",") if x]


def gpu_machines() -> list[str]:
    """Machines whose model has at least one GPU."""
    return [m for m in all_machines() if load_machine(m).gpus]
