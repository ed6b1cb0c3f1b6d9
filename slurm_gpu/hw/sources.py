"""Where a node model comes from: the argument of :func:`slurm_gpu.hw.load_node`.

Plain, frozen values; loading happens in ``hw/__init__.py`` (one entry
point), which imports the heavy readers (cffi, pynvml) only for the source
that needs them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class ThisNode:
    """This node as every component should see it: ``[node]`` *settings*
    (None: from the config file) pick the live hardware, a snapshot or the simulator."""

    settings: Any = None


@dataclass(frozen=True)
class Snapshot:
    """A snapshot file, optionally replayed with a fault *overlay*."""

    path: str
    overlay: Mapping[str, Any] | None = None
    overlay_source: str = "overlay"


@dataclass(frozen=True)
class HwlocXml:
    """An lstopo XML alone: no NVML, GPUs are NVIDIA PCI devices in bus order."""

    path: str
    hostname: str | None = None


@dataclass(frozen=True)
class Snapshots:
    """Many snapshot files at once (a cluster): each file's derived model read
    from its tail, CPU parts shared between identical machines."""

    paths: tuple[str, ...]


NodeSource = ThisNode | Snapshot | HwlocXml | Snapshots
