"""PCI bus ids in one spelling: hwloc's and sysfs's ``0000:07:00.0``.

Its own module, free of imports: the health check's NVML reads need it
without loading the node model (:mod:`slurm_gpu.hw.model`, which re-exports it).
"""
from __future__ import annotations


def normalize_bus_id(bus_id: str) -> str:
    """``00000000:07:00.0`` (NVML) or ``07:00.0`` -> ``0000:07:00.0`` (hwloc/sysfs)."""
    s = bus_id.strip().lower()
    parts = s.split(":")
    if len(parts) == 2:
        parts = ["0000"] + parts
    if len(parts) != 3 or "." not in parts[2]:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    dom = int(parts[0], 16)
    bus = int(parts[1], 16)
    dev, fn = parts[2].split(".")
    return f"{dom:04x}:{bus:02x}:{int(dev, 16):02x}.{int(fn, 16):x}"
