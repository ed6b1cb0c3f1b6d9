"""Plain data describing one node: CPUs, memory, GPUs and how they connect.

These dataclasses are the contract between the hardware layer (which fills
them from NVML + hwloc, or from a snapshot) and everything else (generators,
planners, checks), which never touches hardware.  All indices of cores and
NUMA nodes are hwloc *logical* indices: that is what Slurm calls abstract core
IDs and what gres.conf ``Cores=`` uses.  PU (hardware thread) numbers are OS
indices, because that is what sched_setaffinity and /proc use.

Every class converts to and from plain JSON-able dicts (``to_dict`` /
``from_dict``) so snapshots can carry a derived model that loads without
parsing hwloc XML again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable

from .busid import normalize_bus_id  # noqa: F401 - its public name here too

# NVLink peer kinds.
PEER_GPU = "gpu"
PEER_NVSWITCH = "nvswitch"
PEER_CPU = "cpu"  # POWER/Grace CPU<->GPU NVLink


@dataclass(frozen=True)
class Core:
    index: int                 # hwloc logical index == Slurm abstract core id
    os_index: int
    package: int               # logical index of its package
    numa_node: int | None      # logical index of its CPU NUMA node
    pus: tuple[int, ...]       # OS indices of its hardware threads


@dataclass(frozen=True)
class NumaNode:
    index: int                 # logical index among CPU NUMA nodes
    os_index: int              # what the kernel calls it (node<N> in sysfs, MPOL masks)
    memory_bytes: int
    cores: tuple[int, ...]     # logical core indices
    pus: tuple[int, ...]       # OS PU indices


@dataclass(frozen=True)
class GpuMemoryNode:
    """A NUMA node that is GPU memory (POWER9/Grace), never a CPU node."""

    os_index: int
    memory_bytes: int
    gpu_bus_id: str | None


@dataclass(frozen=True)
class Package:
    index: int
    os_index: int
    cores: tuple[int, ...]


@dataclass(frozen=True)
class NvLink:
    """Links from a GPU to one peer.

    ``peer`` is the peer GPU's PCI bus id for PEER_GPU; for NVSwitch links it
    is the switch's bus id (or ``"nvswitch"`` when unknown); for CPU links it
    is the CPU's bus id or ``"cpu"``.
    """

    peer_kind: str
    peer: str
    links: int


@dataclass(frozen=True)
class MigInstance:
    """One MIG device: a GPU instance plus one compute instance."""

    gi_id: int
    ci_id: int
    profile: str               # e.g. "3g.40gb" or "1c.3g.40gb" for a CI smaller than its GI
    gi_profile_id: int         # NVML GPU-instance profile id (nvidia-smi -lgip "ID")
    ci_profile_id: int
    placement_start: int
    placement_size: int
    memory_bytes: int
    sm_count: int
    uuid: str                  # MIG-...
    gi_cap_minor: int | None   # /dev/nvidia-caps/nvidia-cap<N> for the GI
    ci_cap_minor: int | None   # ... and for the CI


@dataclass(frozen=True)
class Fabric:
    """NVLink fabric (multi-node NVLink, e.g. GB200 NVL72) membership."""

    cluster_uuid: str
    clique_id: int
    state: str                 # "completed", "in_progress", "not_started", "not_supported"
    status: int                # NVML return code of the registration (0 = success)
    health_mask: int = 0


@dataclass(frozen=True)
class Nic:
    name: str                  # e.g. "mlx5_0" or "ib0"
    pci_bus_id: str
    numa_nodes: tuple[int, ...]


@dataclass(frozen=True)
class Gpu:
    index: int                 # NVML index, or position in PCI order with hwloc only
    minor: int | None          # /dev/nvidia<minor>
    uuid: str | None
    pci_bus_id: str            # 0000:07:00.0
    pci_device_id: int | None  # e.g. 0x2330 (H100 SXM5)
    name: str | None           # NVML product name, e.g. "NVIDIA H100 80GB HBM3"
    memory_bytes: int | None
    numa_nodes: tuple[int, ...]      # local CPU NUMA nodes (logical)
    cores: tuple[int, ...]           # local cores (logical)
    nvlinks: tuple[NvLink, ...] = ()
    mig_enabled: bool | None = None  # None: not MIG-capable / unknown
    mig_instances: tuple[MigInstance, ...] = ()
    fabric: Fabric | None = None
    nics: tuple[str, ...] = ()       # names of the nearest NICs
    # PCI subsystem id in NVML's pciSubSystemId layout (0x18be10de: subsystem 10de:18be);
    # set for GPUs known from hwloc alone, whose name it gives (confgen.pciids)
    pci_subsystem_id: int | None = None

    def nvlink_to(self, other: "Gpu", switch_links: dict[str, int] | None = None) -> int:
        """Number of NVLinks towards *other*, counting NVSwitch paths.

        GPUs joined through NVSwitch are all-to-all connected: the usable
        link count is this GPU's number of switch links.
        """
        direct = sum(l.links for l in self.nvlinks
                     if l.peer_kind == PEER_GPU and l.peer == other.pci_bus_id)
        mine = sum(l.links for l in self.nvlinks if l.peer_kind == PEER_NVSWITCH)
        theirs = sum(l.links for l in other.nvlinks if l.peer_kind == PEER_NVSWITCH)
        return direct + (min(mine, theirs) if mine and theirs else 0)


@dataclass(frozen=True)
class Node:
    hostname: str
    packages: tuple[Package, ...]
    numa_nodes: tuple[NumaNode, ...]
    cores: tuple[Core, ...]
    gpus: tuple[Gpu, ...]
    memory_bytes: int
    gpu_memory_nodes: tuple[GpuMemoryNode, ...] = ()
    nics: tuple[Nic, ...] = ()
    sources: tuple[str, ...] = ()      # e.g. ("hwloc:live", "nvml:live") or ("snapshot:FILE",)
    notes: tuple[str, ...] = ()        # one-line explanations, e.g. why there are no GPUs
    # sysconf(_SC_PHYS_PAGES) x page size, what slurmd -C's RealMemory is
    # computed from: the kernel's MemTotal, GPU memory the driver onlined
    # (Grace) included.  None where unknown (an hwloc XML, an older snapshot).
    phys_memory_bytes: int | None = None

    @property
    def threads_per_core(self) -> int:
        return max((len(c.pus) for c in self.cores), default=1)

    @property
    def cpu_count(self) -> int:
        return sum(len(c.pus) for c in self.cores)

    def core(self, index: int) -> Core:
        return self.cores[index]

    def pus_of_cores(self, cores: Iterable[int]) -> tuple[int, ...]:
        return tuple(sorted(pu for c in cores for pu in self.cores[c].pus))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Node":
        return _node_from_dict(d)


def _tuple(x: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(x)


def _node_from_dict(d: dict[str, Any]) -> Node:
    def gpu(g: dict[str, Any]) -> Gpu:
        return Gpu(
            index=g["index"], minor=g["minor"], uuid=g["uuid"], pci_bus_id=g["pci_bus_id"],
            pci_device_id=g["pci_device_id"], name=g["name"], memory_bytes=g["memory_bytes"],
            numa_nodes=_tuple(g["numa_nodes"]), cores=_tuple(g["cores"]),
            nvlinks=tuple(NvLink(**l) for l in g.get("nvlinks", ())),
            mig_enabled=g.get("mig_enabled"),
            mig_instances=tuple(MigInstance(**m) for m in g.get("mig_instances", ())),
            fabric=Fabric(**g["fabric"]) if g.get("fabric") else None,
            nics=_tuple(g.get("nics", ())), pci_subsystem_id=g.get("pci_subsystem_id"),
        )

    return Node(
        hostname=d["hostname"],
        packages=tuple(Package(p["index"], p["os_index"], _tuple(p["cores"])) for p in d["packages"]),
        numa_nodes=tuple(NumaNode(n["index"], n["os_index"], n["memory_bytes"], _tuple(n["cores"]),
                                  _tuple(n["pus"])) for n in d["numa_nodes"]),
        cores=tuple(Core(c["index"], c["os_index"], c["package"], c["numa_node"], _tuple(c["pus"]))
                    for c in d["cores"]),
        gpus=tuple(gpu(g) for g in d["gpus"]),
        memory_bytes=d["memory_bytes"],
        gpu_memory_nodes=tuple(GpuMemoryNode(**m) for m in d.get("gpu_memory_nodes", ())),
        nics=tuple(Nic(n["name"], n["pci_bus_id"], _tuple(n["numa_nodes"])) for n in d.get("nics", ())),
        sources=_tuple(d.get("sources", ())),
        notes=_tuple(d.get("notes", ())),
        phys_memory_bytes=d.get("phys_memory_bytes"),
    )


def inventory_json(node: Node) -> dict[str, Any]:
    """The ``inventory --json`` contract: keep these keys stable."""
    return {
        "hostname": node.hostname,
        "sources": list(node.sources),
        "notes": list(node.notes),
        "packages": len(node.packages),
        "numa_nodes": [{"index": n.index, "os_index": n.os_index, "cores": list(n.cores),
                        "memory_bytes": n.memory_bytes} for n in node.numa_nodes],
        "cores": len(node.cores),
        "threads_per_core": node.threads_per_core,
        "memory_bytes": node.memory_bytes,
        "gpus": [
            {
                "index": g.index,
                "minor": g.minor,
                "pci_bus_id": g.pci_bus_id,
                "uuid": g.uuid,
                "name": g.name,
                "memory_bytes": g.memory_bytes,
                "numa_nodes": list(g.numa_nodes),
                "cores": list(g.cores),
                "nvlinks": [dataclasses.asdict(l) for l in g.nvlinks],
                "mig_enabled": g.mig_enabled,
                "mig_instances": [dataclasses.asdict(m) for m in g.mig_instances],
                "fabric": dataclasses.asdict(g.fabric) if g.fabric else None,
                "nics": list(g.nics),
            }
            for g in node.gpus
        ],
    }
