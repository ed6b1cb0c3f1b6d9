"""Names of GPUs that only hwloc knows: NVIDIA's own table, then pci.ids.

NVIDIA's names by PCI device and subsystem id ship with the package
(``slurm_gpu/data/nvidia_gpu_names.json``, from the driver's source): they
are the names NVML and ``/proc/driver/nvidia`` give, so they make the types
slurmd's AutoDetect would.  Debian's ``/usr/share/misc/pci.ids`` (which lacks
H200, B200, L40S ...) names the older GPUs; only NVIDIA's device names are
needed, so its reader stops after the 0x10de vendor block instead of
building the whole 30,000-line table.
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


# NVIDIA's own names by PCI device and subsystem id (slurm_gpu/data/nvidia_gpu_names.json,
# from the driver's sChipsReleased table; tests/data/nvidia-names/PROVENANCE.md).
NAMES_FILE = "nvidia_gpu_names.json"
_names: dict[int, dict[int | None, str]] | None = None


def subsystem_id(vendor: int, device: int) -> int:
    """NVML's ``pciSubSystemId`` layout: subsystem device in the high half, vendor in the low."""
    return (device << 16) | vendor


def format_subsystem(subsystem: int) -> str:
    """``vendor:device`` as lspci prints it: 0x18be10de -> ``10de:18be``."""
    return f"{subsystem & 0xFFFF:04x}:{subsystem >> 16:04x}"


def driver_names() -> dict[int, dict[int | None, str]]:
    """Device id -> {subsystem id (or None: any subsystem) -> NVIDIA's product name}."""
    global _names
    if _names is None:
        import json

        from ..paths import data_path
        with open(data_path(NAMES_FILE), encoding="utf-8") as f:
            doc = json.load(f)
        out: dict[int, dict[int | None, str]] = {}
        for e in doc["gpus"]:
            sub = None
            if e["subsystem"] is not None:
                ven, dev = e["subsystem"].split(":")
                sub = subsystem_id(int(ven, 16), int(dev, 16))
            out.setdefault(int(e["device"], 16), {})[sub] = e["name"]
        _names = out
    return _names


def driver_name(device: int | None, subsystem: int | None) -> str | None:
    """The name NVIDIA's driver gives this GPU, or None when its table has none.

    As ``rm_get_device_name()`` searches it: a row for this exact subsystem
    wins, else a row without subsystem, else there is no name (the driver
    prints ``Unknown``).
    """
    rows = driver_names().get(device) if device is not None else None
    if not rows:
        return None
    if subsystem is not None and subsystem in rows:
        return rows[subsystem]
    return rows.get(None)


def listed_subsystems(device: int) -> list[str]:
    """The subsystems NVIDIA's table names *device* with (``vendor:device``), for messages."""
    return sorted(format_subsystem(s) for s in driver_names().get(device, {}) if s is not None)
