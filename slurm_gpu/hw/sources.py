"""Where a node model comes from: the argument of :func:`slurm_gpu.hw.load_node`.

Plain, immutable values; loading happens in ``hw/__init__.py`` (one entry
point), which imports the heavy readers (cffi, pynvml) only for the source
that needs them.  :class:`~slurm_gpu.hw.plain.Plain` values, not dataclasses:
every health check and inventory imports this.
"""
from __future__ import annotations


TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping

from .plain import Plain


class ThisNode(Plain):
    """This node as every component should see it: ``[node]`` *settings*
    (None: from the config file) pick the live hardware, a snapshot or the simulator."""

    __slots__ = ("settings",)
    _defaults = {"settings": None}
    settings: Any


class Snapshot(Plain):
    """A snapshot file, optionally replayed with a fault *overlay*."""

    __slots__ = ("path", "overlay", "overlay_source")
    _defaults = {"overlay": None, "overlay_source": "overlay"}
    path: str
    overlay: Mapping[str, Any] | None
    overlay_source: str


class HwlocXml(Plain):
    """An lstopo XML alone: no NVML, GPUs are NVIDIA PCI devices in bus order."""

    __slots__ = ("path", "hostname")
    _defaults = {"hostname": None}
    path: str
    hostname: str | None


class Snapshots(Plain):
    """Many snapshot files at once (a cluster): each file's derived model read
    from its tail, CPU parts shared between identical machines."""

    __slots__ = ("paths",)
    paths: tuple[str, ...]


NodeSource = ThisNode | Snapshot | HwlocXml | Snapshots
