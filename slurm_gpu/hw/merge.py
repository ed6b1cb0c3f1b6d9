"""Join hwloc's CPU/PCI view and NVML's GPU view into one :class:`Node`."""
from __future__ import annotations

from typing import Any

from ..errors import HardwareError
from .model import Gpu, Node
from .nvml_api import NvmlApi
from .views import CpuView, NvmlView


def build_node(cpu: CpuView, nvml: NvmlView | None, *, sources: tuple[str, ...] = (),
               notes: tuple[str, ...] = ()) -> Node:
    """Build the node model.

    With NVML, GPUs are NVML's, ordered by minor number, and get their
    locality from the hwloc PCI device with the same bus id.  Without NVML
    (hwloc only), GPUs are hwloc's NVIDIA PCI devices in bus-id order; their
    minor number is taken from an ``nvidiaN`` OS device when hwloc has one,
    else from the position, which is how the driver numbers them by default.
    """
    notes_l = list(notes)
    gpus: list[Gpu] = []
    if nvml is not None:
        by_bus = {p.bus_id: p for p in cpu.pci_gpus}
        ordered = sorted(nvml.gpus, key=lambda g: (g.minor is None, g.minor if g.minor is not None else g.index))
        for g in ordered:
            loc = by_bus.get(g.bus_id)
            if loc is None:
                notes_l.append(f"GPU {g.bus_id} not found in hwloc topology: no CPU locality")
            gpus.append(Gpu(
                index=g.index, minor=g.minor, uuid=g.uuid, pci_bus_id=g.bus_id,
                pci_device_id=g.device_id if g.device_id is not None else (loc.device_id if loc else None),
                name=g.name, memory_bytes=g.memory_bytes,
                numa_nodes=loc.numa_nodes if loc else (), cores=loc.cores if loc else (),
                nvlinks=g.nvlinks, mig_enabled=g.mig_enabled, mig_instances=g.mig_instances,
                fabric=g.fabric, nics=loc.nics if loc else (),
            ))
    else:
        for pos, p in enumerate(sorted(cpu.pci_gpus, key=lambda p: p.bus_id)):
            gpus.append(Gpu(
                index=pos, minor=p.minor if p.minor is not None else pos, uuid=None,
                pci_bus_id=p.bus_id, pci_device_id=p.device_id, name=p.name, memory_bytes=None,
                numa_nodes=p.numa_nodes, cores=p.cores, nics=p.nics,
                pci_subsystem_id=p.subsystem_id,   # names the GPU when NVML cannot (confgen.pciids)
            ))
    return Node(
        hostname=cpu.hostname, packages=cpu.packages, numa_nodes=cpu.numa_nodes, cores=cpu.cores,
        gpus=tuple(gpus), memory_bytes=cpu.memory_bytes, gpu_memory_nodes=cpu.gpu_memory_nodes,
        nics=cpu.nics, sources=sources, notes=tuple(notes_l),
        phys_memory_bytes=cpu.phys_memory_bytes,
    )


def derive_node(cpu: Any, api: NvmlApi, *, mig_minors: Any, sources: tuple[str, ...], init: bool = False) -> Node:
    """Merge hwloc's view with what NVML (*api*, already opened) answers.

    An NVML that fails as a whole (``nvmlInit`` recorded as failing, the
    device count unreadable) gives a node with zero GPUs and a note saying
    why, like the live inventory on a machine without a driver.
    """
    from . import nvml
    from .nvml_api import NVMLError, describe
    try:
        if init:  # a replay answers nvmlInit as recorded (a GPU-less machine: an error)
            api.nvmlInit()
        view = nvml.read_view(api, mig_minors=mig_minors)
    except NVMLError as e:
        note = f"NVML unavailable: {describe(e)}"
        return build_node(cpu, NvmlView(None, ()), sources=sources, notes=(note,))
    except HardwareError as e:
        return build_node(cpu, NvmlView(None, ()), sources=sources, notes=(e.what,))
    return build_node(cpu, view, sources=sources, notes=view.notes)
