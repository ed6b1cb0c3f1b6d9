"""Fake GPU device files: real character devices with NVIDIA's numbers.

``/dev/nvidiaN`` is char major 195, minor N; ``nvidiactl`` is 195/255.  With
no driver loaded, ``open()`` of such a node fails with ENXIO, while a device
cgroup that blocks it gives EPERM, so GPU isolation is testable without a GPU.
MIG capability files (``/dev/nvidia-caps/nvidia-capN``) use the
``nvidia-caps`` major from /proc/devices when the driver is loaded, else a
fixed stand-in.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.hw.model import Node

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
# Unassigned in Linux's devices.txt "local/experimental" range (240-254).
FALLBACK_CAPS_MAJOR = 241


def caps_major(proc_devices: str = "/proc/devices") -> int:
    """The char major the kernel gave ``nvidia-caps``, or the stand-in."""
    try:
        with open(proc_devices) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[1] == "nvidia-caps":
                    return int(parts[0])
    except OSError:
        pass
    return FALLBACK_CAPS_MAJOR


def _mknod(path: Path, major: int, minor: int) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == major and os.minor(st.st_rdev) == minor:
            return
        path.unlink()
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(path, 0o666)  # mknod honours the umask
    except OSError as e:
        raise SlurmGpuError(f"cannot create fake device: {e.strerror}", str(path)) from None


def gpu_minors(node: Node) -> list[int]:
    return [g.minor if g.minor is not None else g.index for g in node.gpus]


def cap_minors(node: Node) -> list[int]:
    out: set[int] = set()
    for g in node.gpus:
        for m in g.mig_instances:
            out.update(x for x in (m.gi_cap_minor, m.ci_cap_minor) if x is not None)
    return sorted(out)


def make_devices(dev: Path, node: Node) -> list[Path]:
    """Create the device files *node*'s GPUs (and MIG instances) need under *dev*."""
    dev.mkdir(parents=True, exist_ok=True)
    made = []
    for minor in gpu_minors(node):
        p = dev / f"nvidia{minor}"
        _mknod(p, NVIDIA_MAJOR, minor)
        made.append(p)
    _mknod(dev / "nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR)
    made.append(dev / "nvidiactl")
    caps = cap_minors(node)
    if caps:
        (dev / "nvidia-caps").mkdir(exist_ok=True)
        major = caps_major()
        for minor in caps:
            p = dev / "nvidia-caps" / f"nvidia-cap{minor}"
            _mknod(p, major, minor)
            made.append(p)
    return made
