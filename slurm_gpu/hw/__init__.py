"""The hardware layer: the only code that touches NVML, hwloc, sysfs or /dev.

One narrow entry point, :func:`load_node`, returns a plain :class:`Node`
from one of three sources:

* the live machine (hwloc live topology + NVML through pynvml),
* a snapshot file (recorded NVML answers + hwloc XML, replayed through the
  same adapter code, optionally with a fault overlay),
* an hwloc XML file alone (no NVML; GPUs are NVIDIA PCI devices).

Heavy modules (cffi, pynvml) are imported lazily so that replaying a
snapshot with a derived model stays fast.
"""
from __future__ import annotations

from typing import Any

from .model import Node


def load_node(*, hwloc_xml: str | None = None, snapshot: str | None = None,
              overlay: dict[str, Any] | None = None, hostname: str | None = None) -> Node:
    """Return the node model from the live machine, a snapshot or an hwloc XML."""
    if snapshot is not None:
        from . import snapshot as snap
        return snap.load_node(snapshot, overlay=overlay)
    if hwloc_xml is not None:
        from . import hwloc
        from .merge import build_node
        cpu = hwloc.read_cpu_view(xml_path=hwloc_xml, hostname=hostname)
        return build_node(cpu, None, sources=(f"hwloc:{hwloc_xml}",),
                          notes=("hwloc only: GPU names, UUIDs, NVLink and MIG need NVML",))
    from . import live
    return live.load_node()
