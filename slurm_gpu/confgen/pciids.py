"""A small reader for the PCI ID database (Debian's ``/usr/share/misc/pci.ids``).

Only NVIDIA's device names are needed (to name GPUs when only hwloc is
known), so the reader stops after the 0x10de vendor block instead of building
the whole 30,000-line table.
"""
from __future__ import annotations

from typing import Iterable

from ..errors import InputError

DEFAULT_PATH = "/usr/share/misc/pci.ids"


def parse_vendor(lines: Iterable[str], vendor: int = 0x10DE) -> dict[int, str]:
    """Device id -> name for one vendor, from pci.ids lines (pure)."""
    want = f"{vendor:04x}"
    out: dict[int, str] = {}
    inside = False
    for line in lines:
        if not line or line[0] == "#":
            continue
        if line[0] not in "\t":
            if inside:
                break  # vendor blocks are contiguous; the next vendor ends ours
            inside = line[:4].lower() == want and line[4:5] in (" ", "\t")
            continue
        if inside and line[1] != "\t":  # a device, not a subsystem line
            dev, _, name = line[1:].rstrip("\n").partition(" ")
            try:
                out[int(dev, 16)] = name.strip()
            except ValueError:
                continue
    return out


def load_nvidia_names(path: str = DEFAULT_PATH) -> dict[int, str]:
    """NVIDIA device id -> name from a pci.ids file."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_vendor(f)
    except OSError as e:
        raise InputError(f"cannot read PCI id database: {e.strerror}", path) from None
