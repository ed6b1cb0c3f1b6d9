"""GPU type names as Slurm's AutoDetect=nvml spells them.

Slurm (``src/plugins/gpu/nvml/gpu_nvml.c``) takes NVML's device name,
lower-cases it and turns spaces into ``_`` (``gpu_common_underscorify_tolower``):
``NVIDIA H100 80GB HBM3`` -> ``nvidia_h100_80gb_hbm3``.  For a MIG device it
cuts the parent's name at the first ``-`` and appends ``_<profile>``:
``NVIDIA A100-SXM4-40GB`` + ``3g.20gb`` -> ``nvidia_a100_3g.20gb``.  We follow
that exactly so a generated gres.conf matches what slurmd would detect and a
later switch to AutoDetect keeps job scripts working.
"""
from __future__ import annotations

from typing import Mapping

from ..errors import InputError
from ..hw.model import Gpu, MigInstance

NVIDIA_VENDOR = 0x10DE


def autodetect_name(name: str) -> str:
    """Slurm's ``gpu_common_underscorify_tolower`` applied to an NVML name."""
    return name.lower().replace(" ", "_")


def pci_ids_name(device_name: str) -> str:
    """A type from a pci.ids device name: ``GH100 [H100 SXM5 80GB]`` -> ``h100_sxm5_80gb``.

    pci.ids puts the marketing name in brackets after the chip name; that is
    the part an admin recognises.  Several names separated by ``/`` keep the
    first.
    """
    s = device_name
    if "[" in s and "]" in s:
        s = s[s.index("[") + 1:s.rindex("]")]
    s = s.split("/")[0].strip()
    return autodetect_name(" ".join(s.split()))


def gpu_type(gpu: Gpu, *, pci_names: Mapping[int, str] | None = None,
             type_map: Mapping[str, str] | None = None, where: str = "") -> str:
    """The Slurm GRES ``Type`` of a whole GPU.

    Order: NVML name (AutoDetect naming); else the name NVIDIA's driver
    gives the PCI device and subsystem id (:func:`pciids.driver_name`, the
    same AutoDetect naming); else the device id looked up in *pci_names*
    (device id -> pci.ids name of vendor 0x10de; a different spelling, kept
    for GPUs NVIDIA's table does not name).  *type_map* then maps the result
    (or the bus id, or ``0x<device id>``) to an admin's name.  An unknown GPU
    is an error, never a guessed name.
    """
    from . import pciids

    dev = gpu.pci_device_id
    t = ""
    if gpu.name:
        t = autodetect_name(gpu.name)
    elif (driver := pciids.driver_name(dev, gpu.pci_subsystem_id)) is not None:
        t = autodetect_name(driver)
    elif dev is not None and pci_names and dev in pci_names:
        t = pci_ids_name(pci_names[dev])
    if type_map:
        for key in (gpu.pci_bus_id, f"0x{dev:04x}" if dev is not None else None, t or None):
            if key is not None and key in type_map:
                return type_map[key]
    if not t:
        raise InputError(_unknown(gpu), where or None)
    return t


def _unknown(gpu: Gpu) -> str:
    from . import pciids

    dev = gpu.pci_device_id
    if dev is None:
        return f"unknown GPU at {gpu.pci_bus_id}: no NVML name and no PCI device id; give --type-map"
    listed = pciids.listed_subsystems(dev)
    if listed:
        sub = (f" (subsystem {pciids.format_subsystem(gpu.pci_subsystem_id)})"
               if gpu.pci_subsystem_id is not None else "")
        return (f"unknown GPU 10de:{dev:04x}{sub} at {gpu.pci_bus_id}: no NVML name, NVIDIA's name table "
                f"lists this device only with subsystems {', '.join(listed)}, and it is not in pci.ids; "
                f"give --type-map")
    return f"unknown GPU 10de:{dev:04x} at {gpu.pci_bus_id}: no NVML name and not in pci.ids; give --type-map"


def mig_type(parent_type: str, mig: MigInstance) -> str:
    """``<parent type cut at first '-'>_<profile>``, as gpu_nvml.c builds it."""
    base = parent_type.split("-", 1)[0]
    return f"{base}_{mig.profile}"
