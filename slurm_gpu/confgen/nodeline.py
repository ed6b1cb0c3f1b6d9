"""The slurm.conf ``NodeName=`` line and the socket/core alignment it implies.

Slurm co-schedules GPUs with CPUs at *socket* granularity: gres.conf says
"all the cores in a socket must be specified together".  On an 8-NUMA EPYC
(NPS4 x 2 sockets) a GPU is local to one NUMA node, a quarter of a socket,
so its ``Cores=`` cannot be whole sockets.  Slurm's answer is
``SlurmdParameters=numa_node_as_socket``: each NUMA node becomes a "socket",
and the node line must then say ``Sockets=<NUMA nodes>`` so that slurmctld's
view matches what slurmd finds.  :func:`socket_layout` picks that mode and
:func:`node_line` writes the matching line.
"""
from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import UsageError
from ..hw.model import Node

MIB = 1024 * 1024

SOCKET_MODES = ("auto", "package", "numa")


@dataclass(frozen=True)
class SocketLayout:
    """How Slurm should count sockets on a node, and why."""

    mode: str                    # "package" or "numa"
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    cpus: int
    aligned: bool                # every GPU's Cores= is a union of whole "sockets"
    slurmd_parameters: str | None  # e.g. "numa_node_as_socket"
    notes: tuple[str, ...] = ()


def _groups(node: Node, mode: str) -> list[frozenset[int]]:
    if mode == "numa":
        return [frozenset(n.cores) for n in node.numa_nodes if n.cores]
    return [frozenset(p.cores) for p in node.packages if p.cores]


def _covers_whole(groups: Sequence[frozenset[int]], cores: frozenset[int]) -> bool:
    """True when *cores* is exactly a union of some of *groups*."""
    covered: set[int] = set()
    for g in groups:
        inter = g & cores
        if inter and inter != g:
            return False
        covered |= inter
    return covered == cores


def socket_layout(node: Node, mode: str = "auto") -> SocketLayout:
    """Choose package or NUMA sockets so GPU cores cover whole sockets.

    ``auto`` keeps packages when every GPU's local cores are whole packages
    (or the GPU has no locality), else switches to NUMA nodes when those fit,
    else keeps packages and says that binding will be partial.
    """
    if mode not in SOCKET_MODES:
        raise UsageError(f"unknown socket mode {mode!r} (choose {', '.join(SOCKET_MODES)})")
    gpu_cores = [frozenset(g.cores) for g in node.gpus if g.cores]
    notes: list[str] = []
    chosen = mode
    if mode == "auto":
        chosen = "package"
        if not all(_covers_whole(_groups(node, "package"), c) for c in gpu_cores):
            if len(node.numa_nodes) > len(node.packages) and all(
                    _covers_whole(_groups(node, "numa"), c) for c in gpu_cores):
                chosen = "numa"
    groups = _groups(node, chosen)
    aligned = all(_covers_whole(groups, c) for c in gpu_cores)
    if chosen == "numa":
        notes.append("GPU-local cores do not cover whole sockets: set "
                     "SlurmdParameters=numa_node_as_socket in slurm.conf (the NodeName line "
                     "counts NUMA nodes as sockets)")
    if not aligned:
        notes.append(f"GPU-local cores do not cover whole {'NUMA nodes' if chosen == 'numa' else 'sockets'}: "
                     "Slurm binds GPUs at socket granularity, so --gres-flags=enforce-binding may "
                     "give CPUs outside the GPU's cores (consider SlurmdParameters=l3cache_as_socket "
                     "if L3 domains match the GPUs)")
    ncores = len(node.cores)
    sockets = max(len(groups), 1)
    sizes = Counter(len(g) for g in groups)
    if len(sizes) > 1:
        notes.append(f"sockets have different core counts ({', '.join(str(s) for s in sorted(sizes))}): "
                     "slurm.conf can only say one CoresPerSocket")
    cps = max(ncores // sockets, 1)
    return SocketLayout(
        mode=chosen, sockets=sockets, cores_per_socket=cps, threads_per_core=node.threads_per_core,
        cpus=node.cpu_count, aligned=aligned,
        slurmd_parameters="numa_node_as_socket" if chosen == "numa" else None,
        notes=tuple(notes))


def gres_counts(types_in_order: Sequence[str], *, mps_total: int = 0, shard_total: int = 0) -> str:
    """``gpu:<type>:<n>,...,mps:<n>,shard:<n>`` for slurm.conf ``Gres=``."""
    counts: dict[str, int] = {}
    for t in types_in_order:
        counts[t] = counts.get(t, 0) + 1
    parts = [f"gpu:{t}:{n}" for t, n in counts.items()]
    if mps_total:
        parts.append(f"mps:{mps_total}")
    if shard_total:
        parts.append(f"shard:{shard_total}")
    return ",".join(parts)


def real_memory_mib(node: Node) -> int:
    """``RealMemory=`` as ``slurmd -C`` prints it for *node*.

    slurmd computes ``(uint64_t)((float)pages * (page_size / 1048576.0))``
    (src/slurmd/slurmd/get_mach_stat.c, get_memory, 22.05 to 26.05): the
    page count goes through a C float, so above 64 GiB the figure loses up
    to a few MiB.  Page sizes are powers of two, so rounding the byte count
    to a float is the same.  Without the kernel's count (an hwloc XML, an
    older snapshot) the CPU NUMA nodes' memory, which is never more than
    slurmd's figure: a RealMemory above it would drain the node.
    """
    if node.phys_memory_bytes is None:
        return node.memory_bytes // MIB
    as_float = struct.unpack("=f", struct.pack("=f", float(node.phys_memory_bytes)))[0]
    return int(as_float) // MIB


def node_line(name: str, node: Node, *, gres: str | None = None, socket_mode: str = "auto",
              extra: Mapping[str, str] | None = None, layout: SocketLayout | None = None) -> str:
    """The slurm.conf line for *node*, like ``slurmd -C`` plus ``Gres=``.

    ``NodeName=<name> CPUs= Sockets= CoresPerSocket= ThreadsPerCore=
    RealMemory=<MiB> Gres=gpu:<type>:<n>[,mps:<n>][,shard:<n>]``.  *gres* is
    the Gres= value (none when empty); :func:`slurm_gpu.confgen.gres.node_line`
    computes it from the node's GPUs.  *extra* appends keys such as
    ``NodeAddr``/``Port``.  *name* may be a hostlist.
    """
    lay = layout or socket_layout(node, socket_mode)
    parts = [f"NodeName={name}", f"CPUs={lay.cpus}", f"Sockets={lay.sockets}",
             f"CoresPerSocket={lay.cores_per_socket}", f"ThreadsPerCore={lay.threads_per_core}",
             f"RealMemory={real_memory_mib(node)}"]
    if gres:
        parts.append(f"Gres={gres}")
    for k, v in (extra or {}).items():
        parts.append(f"{k}={v}")
    return " ".join(parts)
