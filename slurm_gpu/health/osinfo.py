"""Read the OS settings the ``os.*`` audit looks at (one gather, plain data).

Every reader takes a *root* so tests point it at a fixture tree.  This is the
health check's only sysfs/procfs reader besides the kernel log; it lives here
rather than in ``slurm_gpu/hw/`` because it reads OS tuning, not hardware.
"""
from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field


@dataclass
class OsInfo:
    """The OS settings the ``os.*`` checks audit (None: not readable here)."""

    thp: str | None = None                 # "always" | "madvise" | "never"
    swappiness: int | None = None
    governors: dict[str, int] = field(default_factory=dict)  # governor -> number of CPUs
    memlock_soft: int | None = None        # bytes; -1 = unlimited
    persistenced: bool | None = None       # nvidia-persistenced running


def _read(root: str, rel: str) -> str | None:
    try:
        with open(os.path.join(root, rel)) as f:
            return f.read()
    except OSError:
        return None


def read_thp(root: str = "/") -> str | None:
    text = _read(root, "sys/kernel/mm/transparent_hugepage/enabled")
    if not text:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def read_governors(root: str = "/") -> dict[str, int]:
    out: dict[str, int] = {}
    base = os.path.join(root, "sys/devices/system/cpu")
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for n in names:
        if n.startswith("cpu") and n[3:].isdigit():
            g = _read(root, f"sys/devices/system/cpu/{n}/cpufreq/scaling_governor")
            if g:
                out[g.strip()] = out.get(g.strip(), 0) + 1
    return out


def persistenced_running(root: str = "/") -> bool:
    proc = os.path.join(root, "proc")
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return False
    for p in pids:
        comm = _read(root, f"proc/{p}/comm")
        if comm and comm.strip().startswith("nvidia-persiste"):  # comm is cut at 15 characters
            return True
    return False


def read_os(root: str = "/", *, want: set[str] | None = None) -> OsInfo:
    """Gather what the selected ``os.*`` checks need (all when *want* is None)."""
    def w(name: str) -> bool:
        return want is None or name in want

    info = OsInfo()
    if w("os.thp"):
        info.thp = read_thp(root)
    if w("os.swappiness"):
        s = _read(root, "proc/sys/vm/swappiness")
        info.swappiness = int(s) if s and s.strip().isdigit() else None
    if w("os.governor"):
        info.governors = read_governors(root)
    if w("os.memlock"):
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        info.memlock_soft = -1 if soft == resource.RLIM_INFINITY else soft
    if w("os.persistenced"):
        info.persistenced = persistenced_running(root)
    return info
