"""The hardware layer: the only code that touches NVML, hwloc, sysfs or /dev.

One narrow entry point, :func:`load_node`, returns a plain :class:`Node`
from a source (:mod:`slurm_gpu.hw.sources`):

* :class:`ThisNode`: the live machine (hwloc live topology + NVML through
  pynvml), or the snapshot or simulator ``[node]`` points this node at,
* :class:`Snapshot`: a snapshot file (recorded NVML answers + hwloc XML,
  replayed through the same adapter code, optionally with a fault overlay),
* :class:`HwlocXml`: an hwloc XML file alone (no NVML; GPUs are NVIDIA PCI devices),
* :class:`Snapshots`: many snapshot files at once (a cluster).

GPU calls go through the narrow :class:`slurm_gpu.hw.gpus.Gpus` interface
(:mod:`slurm_gpu.hw.backend`).

Heavy modules (cffi, pynvml) are imported lazily so that replaying a
snapshot with a derived model stays fast.
"""
from __future__ import annotations

TYPE_CHECKING = False   # not typing's: importing typing costs every prolog ~2 ms

from .sources import HwlocXml, NodeSource, Snapshot, Snapshots, ThisNode

if TYPE_CHECKING:
    from typing import Any, overload
    from .model import Node

__all__ = ["HwlocXml", "Node", "NodeSource", "Snapshot", "Snapshots", "ThisNode", "load_node"]


def __getattr__(name: str) -> Any:
    # The node model (ten dataclasses) loads with the first module that uses
    # it, not with every hw module: the health check's kernel-log reader and
    # node-name lookup build no node.
    if name == "Node":
        from .model import Node
        return Node
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:     # typing itself costs every prolog ~2 ms: its overloads are for checkers only
    @overload
    def load_node(source: ThisNode | Snapshot | HwlocXml | None = None) -> Node: ...
    @overload
    def load_node(source: Snapshots) -> list[Node]: ...


def load_node(source: Any = None) -> Any:
    """The node model of *source* (default: this node, :class:`ThisNode`).

    The one way to load a node: :class:`ThisNode` (live hardware, or what
    ``[node]`` points this node at), :class:`Snapshot` (optionally with a
    fault overlay), :class:`HwlocXml`, or :class:`Snapshots` (many files: a
    list of nodes, in order).
    """
    if source is None or isinstance(source, ThisNode):
        from . import live
        return live.this_node(source.settings if source is not None else None)
    if isinstance(source, Snapshot):
        from . import snapshot as snap
        return snap.node_from_file(source.path, source.overlay, overlay_source=source.overlay_source)
    if isinstance(source, HwlocXml):
        from . import hwloc
        from .merge import build_node
        cpu = hwloc.read_cpu_view(xml_path=source.path, hostname=source.hostname)
        return build_node(cpu, None, sources=(f"hwloc:{source.path}",),
                          notes=("hwloc only: GPU names, UUIDs, NVLink and MIG need NVML",))
    if isinstance(source, Snapshots):
        from .snapshot_bulk import SnapshotLoader, load_snapshot_node
        loader = SnapshotLoader()
        return [load_snapshot_node(p, loader) for p in source.paths]
    raise TypeError(f"not a node source: {source!r}")
