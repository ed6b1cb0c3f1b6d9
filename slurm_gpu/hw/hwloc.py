"""hwloc backend: CPUs, NUMA nodes, PCI locality of GPUs and NICs.

Reads the live topology or an ``lstopo`` XML export (hwloc 2.x or 1.x
format) through our cffi bindings (:mod:`.hwloc_ffi`) and returns a plain
:class:`~slurm_gpu.hw.views.CpuView`.

Numbering, chosen so that it equals what Slurm and ``hwloc-calc --li`` say:

* cores: hwloc logical index (Slurm's abstract core id, gres.conf ``Cores=``);
* CPU NUMA nodes: position in hwloc's logical order *among CPU NUMA nodes*.
  GPU-memory NUMA nodes (POWER9/Grace HBM, subtype ``GPUMemory``, or nodes
  without CPUs as hwloc 1.x exports them) are left out of that numbering.
  Live hwloc hides those nodes by default, so on the real machine Slurm and
  ``hwloc-calc`` number the CPU nodes 0..n-1 exactly like this;
* PUs: OS indices (what ``sched_setaffinity`` uses).

A device's locality is the cpuset of its first ancestor that has one (the
non-I/O ancestor); its local cores and NUMA nodes are those whose cpuset
intersects it.  That is ``hwloc-calc --intersect core|numa pci=<bus id>``.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from . import hwloc_ffi as H
from .hwloc_xml import _malformed, _why_rejected
from .busid import normalize_bus_id
from .model import Core, GpuMemoryNode, Nic, NumaNode, Package
from .views import CpuView, PciGpu

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)   # VGA compatible controller, 3D controller
GPU_MEMORY_SUBTYPE = "GPUMemory"
BRIDGE_HOST = 0                  # hwloc_obj_bridge_type_t HWLOC_OBJ_BRIDGE_HOST
_NVIDIA_DEV = re.compile(r"nvidia(\d+)$")


def read_cpu_view(xml_path: str | None = None, xml_text: str | bytes | None = None,
                  hostname: str | None = None, *, source: str | None = None,
                  phys_memory_bytes: int | None = None) -> CpuView:
    """Read CPUs, NUMA nodes, NVIDIA GPUs and NICs.

    From the file *xml_path*, from *xml_text* (an XML export held in memory,
    e.g. from a snapshot; *source* names it in error messages), or from the
    live machine when both are None.  *hostname* overrides the host name
    recorded in the topology.  Unreadable or malformed XML raises
    :class:`~slurm_gpu.errors.InputError` naming the file and line.
    *phys_memory_bytes* is the kernel's memory count recorded with an XML
    (a snapshot's); the live machine's is read here.
    """
    if xml_path is not None and xml_text is not None:
        raise ValueError("give xml_path or xml_text, not both")
    if xml_path is not None:
        try:
            with open(xml_path, "rb") as f:
                data: bytes | None = f.read()
        except OSError as e:
            raise InputError(f"cannot read hwloc XML: {e.strerror}", xml_path) from e
        where = xml_path
    elif xml_text is not None:
        # A lone surrogate (a JSON "\udcff" escape in a snapshot) cannot be
        # UTF-8: it becomes "?" and libhwloc's parser names the bad XML.
        data = xml_text.encode("utf-8", "replace") if isinstance(xml_text, str) else xml_text
        where = source or "hwloc XML text"
    else:
        data, where = None, "live topology"
        phys_memory_bytes = phys_memory()
    topo = _load(data, where)
    try:
        view = _cpu_view(topo, hostname)
    finally:
        topo.close()
    if phys_memory_bytes is None:
        return view
    return dataclasses.replace(view, phys_memory_bytes=phys_memory_bytes)


def phys_memory() -> int | None:
    """This machine's memory as slurmd counts it: sysconf(_SC_PHYS_PAGES) x page size.

    Not hwloc's NUMA nodes: their sum can fall short of the kernel's total
    (memory of no node's, seen in VMs), and slurmd -C reads sysconf
    (src/slurmd/slurmd/get_mach_stat.c, get_memory).  None when hwloc is
    told to read another machine (a sysfs tree, an XML, a synthetic one).
    """
    if any(os.environ.get(v) for v in ("HWLOC_FSROOT", "HWLOC_XMLFILE", "HWLOC_SYNTHETIC")):
        return None
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def live_xml() -> str:
    """Export the live topology as hwloc 2.x XML text (for snapshots)."""
    topo = _load(None, "live topology")
    try:
        return topo.export_xml()
    finally:
        topo.close()


# -- loading -------------------------------------------------------------------

def _load(data: bytes | None, where: str) -> H.Topology:
    if data is not None and not data.strip():
        raise InputError("hwloc XML is empty", where)
    if data is not None:
        # libhwloc's own XML reader is not made for broken input: hwloc 2.9.0
        # crashes (SIGSEGV, lstopo too) on some malformed attributes.  Only
        # well-formed XML reaches it; expat names the first error and line.
        bad = _malformed(data)
        if bad is not None:
            raise InputError(bad[0], f"{where} line {bad[1]}")
    try:
        if data is None:
            return _load_live()
        # XML keeps every object, I/O included, like hwloc-calc: the file is
        # the whole truth and filtering could hide a GPU's bridge.
        return H.Topology(data, keep_all=True)
    except H.HwlocLoadError as e:
        if data is None:
            from ..errors import HardwareError
            raise HardwareError(f"hwloc cannot load the live topology: {e}") from e
        what, line = _why_rejected(data)
        raise InputError(what, f"{where} line {line}" if line else where) from e


def _load_live() -> H.Topology:
    """Load this machine, keeping NVIDIA GPU-memory NUMA nodes (POWER9, Grace).

    hwloc 2.9 drops them unless HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES=1; kept, they
    carry subtype GPUMemory and the GPU's bus id, so the model can list them
    in ``gpu_memory_nodes``.  The CPU NUMA numbering is unchanged because
    they are taken out of it.  The variable is set only around the load (hwloc
    reads it then) and restored, so nothing leaks into job environments; an
    admin's own setting wins.
    """
    name = "HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES"
    if name in os.environ:
        return H.Topology(None)
    os.environ[name] = "1"
    try:
        return H.Topology(None)
    finally:
        os.environ.pop(name, None)


# -- building the view ---------------------------------------------------------

@dataclass
class _Numa:
    os_index: int
    mask: int
    complete: int                 # complete_cpuset: also offline/disallowed PUs
    memory: int
    subtype: str | None
    infos: dict[str, str]
    index: int = -1               # dense index among CPU NUMA nodes (set for CPU nodes)


@dataclass
class _Pci:
    bus_id: str
    vendor: int
    device: int
    class_id: int
    locality: int                 # cpuset of the non-I/O ancestor
    path: tuple[tuple[int, bool], ...]   # ancestors (gp_index, is host bridge), nearest first
    subsystem: int = 0                   # (subsystem device << 16) | subsystem vendor
    osdevs: list[tuple[str, int, dict[str, str]]] = field(default_factory=list)


def _cpu_view(t: H.Topology, hostname: str | None) -> CpuView:
    root = t.root()
    root_infos = t.infos(root)

    numas = [_Numa(o.os_index, t.bitmap(o.cpuset), t.bitmap(o.complete_cpuset),
                   int(o.attr.numanode.local_memory),
                   t.string(o.subtype), t.infos(o)) for o in t.objects(H.OBJ_NUMANODE)]
    pcis = _pci_devices(t)
    has_nvidia = any(_is_nvidia_gpu(p) for p in pcis)
    cpu_numas: list[_Numa] = []
    gpu_mem: list[GpuMemoryNode] = []
    for n in numas:
        kind = _numa_kind(n, has_nvidia)
        if kind == "cpu":
            n.index = len(cpu_numas)
            cpu_numas.append(n)
        elif kind == "gpu":
            bus = n.infos.get("PCIBusID")
            gpu_mem.append(GpuMemoryNode(os_index=n.os_index, memory_bytes=n.memory,
                                         gpu_bus_id=_norm_bus(bus) if bus else None))

    pkg_objs = t.objects(H.OBJ_PACKAGE)
    pkgs = [(o.logical_index, o.os_index, t.bitmap(o.cpuset)) for o in pkg_objs]
    if not pkgs:  # some XMLs (VMs, trimmed exports) have no Package: one socket
        pkgs = [(0, 0, t.bitmap(root.cpuset))]

    core_objs = t.objects(H.OBJ_CORE) or t.objects(H.OBJ_PU)  # no Core level: PUs are cores
    cores: list[Core] = []
    core_masks: list[int] = []
    for o in core_objs:
        mask = t.bitmap(o.cpuset)
        pkg = next((p[0] for p in pkgs if p[2] & mask), 0)
        numa = next((n.index for n in cpu_numas if n.mask & mask), None)
        cores.append(Core(index=o.logical_index, os_index=o.os_index, package=pkg, numa_node=numa,
                          pus=H.mask_bits(mask)))
        core_masks.append(mask)

    def cores_in(mask: int) -> tuple[int, ...]:
        return tuple(c.index for c, m in zip(cores, core_masks) if m & mask)

    packages = tuple(Package(index=p[0], os_index=p[1], cores=cores_in(p[2])) for p in pkgs)
    numa_nodes = tuple(NumaNode(index=n.index, os_index=n.os_index, memory_bytes=n.memory,
                                cores=cores_in(n.mask), pus=H.mask_bits(n.mask)) for n in cpu_numas)

    def numa_in(mask: int) -> tuple[int, ...]:
        return tuple(n.index for n in cpu_numas if n.mask & mask)

    gpu_mem_buses = {g.gpu_bus_id for g in gpu_mem if g.gpu_bus_id}
    nic_pcis = [p for p in pcis if any(k in (H.OSDEV_NETWORK, H.OSDEV_OPENFABRICS) for _, k, _ in p.osdevs)]
    nics = tuple(Nic(name=_nic_name(p), pci_bus_id=p.bus_id, numa_nodes=numa_in(p.locality))
                 for p in nic_pcis)
    # GPUDirect RDMA only uses RDMA-capable NICs; rank plain Ethernet only when there are none.
    rdma = [p for p in nic_pcis if any(k == H.OSDEV_OPENFABRICS for _, k, _ in p.osdevs)]
    candidates = rdma or nic_pcis

    gpus = []
    for p in pcis:
        if not (_is_nvidia_gpu(p) or p.bus_id in gpu_mem_buses):
            continue
        gpus.append(PciGpu(
            bus_id=p.bus_id, vendor_id=p.vendor, device_id=p.device, class_id=p.class_id,
            name=_gpu_model(p), minor=_minor(p),
            numa_nodes=numa_in(p.locality), cores=cores_in(p.locality),
            nics=_nearest_nics(p, candidates, numa_in), subsystem_id=p.subsystem,
        ))
    gpus.sort(key=lambda g: g.bus_id)

    return CpuView(
        hostname=hostname or root_infos.get("HostName") or "localhost",
        packages=packages, numa_nodes=numa_nodes, cores=tuple(cores),
        memory_bytes=sum(n.memory for n in cpu_numas),
        gpu_memory_nodes=tuple(gpu_mem), pci_gpus=tuple(gpus), nics=nics,
    )


def _numa_kind(n: _Numa, has_nvidia: bool) -> str:
    """``cpu``, ``gpu`` (GPU memory) or ``other`` (CPU-less memory: HBM, NVM, CXL ...).

    hwloc 2 marks NVIDIA GPU memory with the subtype ``GPUMemory``.  hwloc
    1.x exported POWER9 GPU memory as CPU-less nodes without a subtype, so
    a CPU-less, subtype-less node on a machine with NVIDIA GPUs is taken as
    GPU memory too.  hwloc gives a subtype other than ``DRAM`` (HBM, NVM,
    SPM, MCDRAM, CXL...) only to memory tiers the kernel lists without CPUs,
    even when hwloc attaches them below CPUs.  A node whose CPUs are merely
    offline or disallowed keeps them in ``complete_cpuset``: it stays a CPU
    node, as hwloc-calc counts it.
    """
    if n.subtype == GPU_MEMORY_SUBTYPE:
        return "gpu"
    if n.complete == 0:
        return "gpu" if has_nvidia and not n.subtype else "other"
    if n.subtype and n.subtype != "DRAM":
        return "other"
    return "cpu"


def _pci_devices(t: H.Topology) -> list[_Pci]:
    out = []
    for o in t.objects(H.OBJ_PCI_DEVICE):
        a = o.attr.pcidev
        path = []
        anc = o.parent
        while not t.is_null(anc) and t.is_null(anc.cpuset):
            is_host = anc.type == H.OBJ_BRIDGE and anc.attr.bridge.upstream_type == BRIDGE_HOST
            path.append((int(anc.gp_index), is_host))
            anc = anc.parent
        locality = 0 if t.is_null(anc) else t.bitmap(anc.cpuset)
        if not t.is_null(anc):
            path.append((int(anc.gp_index), False))
        p = _Pci(bus_id=f"{a.domain:04x}:{a.bus:02x}:{a.dev:02x}.{a.func:x}", vendor=a.vendor_id,
                 device=a.device_id, class_id=a.class_id, locality=locality, path=tuple(path),
                 subsystem=(a.subdevice_id << 16) | a.subvendor_id)
        for c in t.io_children(o):
            if c.type == H.OBJ_OS_DEVICE:
                p.osdevs.append((t.string(c.name) or "", int(c.attr.osdev.type), t.infos(c)))
        out.append(p)
    return out


def _is_nvidia_gpu(p: _Pci) -> bool:
    return p.vendor == NVIDIA_VENDOR and p.class_id in GPU_CLASSES


def _gpu_model(p: _Pci) -> str | None:
    """The CUDA/NVML OS device's GPUModel: the same string NVML reports.

    The PCI device's ``PCIDevice`` info is the pci.ids marketing name, not
    the NVML product name, so it is not used.
    """
    for _, _, infos in p.osdevs:
        if infos.get("GPUModel"):
            return infos["GPUModel"]
    return None


def _minor(p: _Pci) -> int | None:
    for name, _, _ in p.osdevs:
        m = _NVIDIA_DEV.match(name)
        if m:
            return int(m.group(1))
    return None


def _nic_name(p: _Pci) -> str:
    """The RDMA device name (mlx5_0) when there is one, else the netdev (eth0)."""
    for want in (H.OSDEV_OPENFABRICS, H.OSDEV_NETWORK):
        for name, kind, _ in p.osdevs:
            if kind == want and name:
                return name
    return p.bus_id


def _nearest_nics(gpu: _Pci, nics: list[_Pci], numa_in: Any) -> tuple[str, ...]:
    """NICs by PCI closeness, then NICs on the same NUMA node; remote ones left out.

    Ranks follow ``nvidia-smi topo``: a shared PCIe switch (PIX/PXB, fewest
    hops first), then a shared host bridge (PHB), then the same CPU
    locality object, then the same NUMA node (NODE).
    """
    gpu_numa = set(numa_in(gpu.locality))
    gpos = {gp: i for i, (gp, _) in enumerate(gpu.path)}
    ranked = []
    for n in nics:
        if n.bus_id == gpu.bus_id:
            continue
        rank = None
        for j, (gp, is_host) in enumerate(n.path):
            if gp in gpos:
                i = gpos[gp]
                last = i == len(gpu.path) - 1   # the non-I/O ancestor
                if is_host:
                    rank = (1, i + j)
                elif not last:
                    rank = (0, i + j)
                else:
                    rank = (2, 0)
                break
        if rank is None and gpu_numa & set(numa_in(n.locality)):
            rank = (3, 0)
        if rank is not None:
            ranked.append((rank, n.bus_id, _nic_name(n)))
    return tuple(name for _, _, name in sorted(ranked))


def _norm_bus(bus: str) -> str:
    try:
        return normalize_bus_id(bus)
    except ValueError:
        return bus
