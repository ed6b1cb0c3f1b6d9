"""Slurm releases as the SPANK plugin, the sandbox and ``doctor`` name them.

A plugin is tied to the Slurm it was compiled against: Slurm loads a SPANK
plugin only when its ``plugin_version`` has the same major.minor.  Each
release also bumps libslurm's API number (``API_CURRENT`` in Slurm's META
file; also the soname of libslurm.so), which a loaded plugin can read from
``slurm_api_version()`` to name the Slurm it runs under.
"""
from __future__ import annotations

import re
from pathlib import Path

# API_CURRENT of each release's META file (SchedMD/slurm tags slurm-YY-MM-0-1).
API_RELEASES = {38: "22.05", 39: "23.02", 40: "23.11", 41: "24.05", 42: "24.11",
                43: "25.05", 44: "25.11", 45: "26.05"}
RELEASE_APIS = {v: k for k, v in API_RELEASES.items()}


def parse(text: str) -> str | None:
    """The first ``X.Y[.Z]`` in *text* (``"slurm-wlm 24.11.5"`` -> ``"24.11.5"``)."""
    m = re.search(r"\b(\d+)\.(\d+)(?:\.(\d+))?\b", text)
    return m.group(0) if m else None


def major_minor(version: str) -> str:
    """``"24.11.5"`` -> ``"24.11"``."""
    return ".".join(version.split(".")[:2])


def from_header(include_dir: str | Path = "/usr/include") -> str | None:
    """``24.11.5`` from ``slurm/slurm_version.h``'s SLURM_VERSION_NUMBER (None if absent)."""
    try:
        text = (Path(include_dir) / "slurm" / "slurm_version.h").read_text()
    except OSError:
        return None
    m = re.search(r"#define\s+SLURM_VERSION_NUMBER\s+0x([0-9a-fA-F]+)", text)
    if not m:
        return None
    n = int(m.group(1), 16)
    return f"{(n >> 16) & 0xff}.{(n >> 8) & 0xff:02d}.{n & 0xff}"


def api_of(version: str, lib_dir: str | Path = "/usr/lib/x86_64-linux-gnu") -> int | None:
    """libslurm's API number for *version*: the table, else the installed soname."""
    api = RELEASE_APIS.get(major_minor(version))
    if api is not None:
        return api
    try:
        target = Path(lib_dir, "libslurm.so").resolve().name      # libslurm.so.42.0.0
    except OSError:
        return None
    m = re.match(r"libslurm\.so\.(\d+)", target)
    return int(m.group(1)) if m else None
