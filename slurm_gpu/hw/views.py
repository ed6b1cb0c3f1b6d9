"""What each hardware backend returns before the two views are merged.

hwloc knows CPUs, NUMA, PCI locality and NICs; NVML knows GPU identity,
NVLink, MIG and fabric.  ``merge.build_node`` joins them on the PCI bus id.
"""
from __future__ import annotations

from dataclasses import dataclass

from .model import Core, Fabric, GpuMemoryNode, MigInstance, Nic, NumaNode, NvLink, Package


@dataclass(frozen=True)
class PciGpu:
    """An NVIDIA GPU seen by hwloc as a PCI device."""

    bus_id: str                       # normalized, 0000:07:00.0
    vendor_id: int                    # 0x10de
    device_id: int                    # e.g. 0x2330
    class_id: int                     # 0x0300 VGA or 0x0302 3D controller
    name: str | None                  # hwloc's GPUModel/PCIDevice info, if any
    minor: int | None                 # from an "nvidiaN" OS device, if present
    numa_nodes: tuple[int, ...]       # local CPU NUMA nodes (logical)
    cores: tuple[int, ...]            # local cores (logical)
    nics: tuple[str, ...] = ()        # nearest NICs, closest first
    subsystem_id: int | None = None   # (subsystem device << 16) | subsystem vendor, as NVML's pciSubSystemId


@dataclass(frozen=True)
class CpuView:
    """hwloc's answer: everything but GPU identity."""

    hostname: str
    packages: tuple[Package, ...]
    numa_nodes: tuple[NumaNode, ...]
    cores: tuple[Core, ...]
    memory_bytes: int
    gpu_memory_nodes: tuple[GpuMemoryNode, ...]
    pci_gpus: tuple[PciGpu, ...]      # ordered by PCI bus id
    nics: tuple[Nic, ...]
    phys_memory_bytes: int | None = None   # the kernel's count (Node.phys_memory_bytes)


@dataclass(frozen=True)
class NvmlGpu:
    """NVML's answer for one GPU (no locality: that comes from hwloc)."""

    index: int
    minor: int | None
    uuid: str | None
    bus_id: str                       # normalized
    device_id: int | None
    name: str | None
    memory_bytes: int | None
    nvlinks: tuple[NvLink, ...] = ()
    mig_enabled: bool | None = None
    mig_instances: tuple[MigInstance, ...] = ()
    fabric: Fabric | None = None


@dataclass(frozen=True)
class NvmlView:
    driver_version: str | None
    gpus: tuple[NvmlGpu, ...]
    notes: tuple[str, ...] = ()       # e.g. a GPU that could not be read (lost)
