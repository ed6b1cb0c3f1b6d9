"""The body of ``slurm-gpu inventory`` and its text rendering, free of click.

Reads the node only through :func:`slurm_gpu.hw.load_node` (live, snapshot
or hwloc XML).  This module is on the benchmarked path (``inventory
--snapshot F --json`` within 150 ms including interpreter start), so it
imports nothing heavy at module level (not even click: :mod:`slurm_gpu.fastcli`
runs it without): the hardware layer is imported inside
the command, and cffi/NVML only when the chosen source needs them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from ..echo import echo

if TYPE_CHECKING:
    from ..hw.model import Gpu, Node


def show(hwloc_xml: str | None = None, snapshot: str | None = None, overlay: str | None = None,
         as_json: bool = False) -> None:
    """Print the inventory (``slurm-gpu inventory``'s options)."""
    from ..errors import UsageError
    from ..hw import HwlocXml, Snapshot, ThisNode, load_node

    if hwloc_xml is not None and snapshot is not None:
        raise UsageError("give either --hwloc-xml or --snapshot, not both", "inventory")
    if overlay is not None and snapshot is None:
        raise UsageError("--overlay needs --snapshot", "inventory")
    faults = None
    if overlay is not None:
        from ..hw.snapshot import load_overlay
        faults = load_overlay(overlay)
    source = Snapshot(snapshot, faults) if snapshot is not None else \
        HwlocXml(hwloc_xml) if hwloc_xml is not None else ThisNode()
    node = load_node(source)
    node = _explain_no_gpus(node)
    if as_json:
        import json

        from ..hw.model import inventory_json

        echo(json.dumps(inventory_json(node), indent=2))
    else:
        echo("\n".join(render_text(node)))


def _explain_no_gpus(node: "Node") -> "Node":
    """Zero GPUs always comes with a one-line reason."""
    if node.gpus or any("GPU" in n or "NVML" in n for n in node.notes if not n.startswith("hwloc only")):
        return node
    import dataclasses

    if all(s.startswith("hwloc:") and s != "hwloc:live" for s in node.sources) and node.sources:
        why = "no GPUs: the hwloc topology has no NVIDIA PCI device (vendor 0x10de, class 0x0300/0x0302)"
    else:
        why = "no GPUs: no NVIDIA GPU was found on this node"
    return dataclasses.replace(node, notes=node.notes + (why,))


# -- text rendering (pure) ---------------------------------------------------------

def ranges(values: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2,5,7-8`` (``-`` when empty)."""
    vals = sorted(set(values))
    if not vals:
        return "-"
    out = []
    start = prev = vals[0]
    for v in vals[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(out)


def size(n: int | None) -> str:
    """Bytes as GiB/TiB with one decimal, like ``lstopo``'s memory figures."""
    if not n:
        return "-"
    gib = n / 2**30
    return f"{gib / 1024:.1f} TiB" if gib >= 1024 else f"{gib:.1f} GiB"


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths))).rstrip() for r in rows]


def _mig(g: "Gpu") -> str:
    if g.mig_enabled is None:
        return "-"
    if not g.mig_enabled:
        return "off"
    return f"on ({len(g.mig_instances)})"


def render_text(node: "Node") -> list[str]:
    """The human-readable inventory, as lines."""
    lines = [f"Node {node.hostname}" + (f"  (from {', '.join(node.sources)})" if node.sources else "")]
    tpc = node.threads_per_core
    lines.append(f"CPU: {len(node.packages)} package(s), {len(node.numa_nodes)} NUMA node(s), "
                 f"{len(node.cores)} cores, {tpc} thread(s) per core, {node.cpu_count} CPUs; "
                 f"memory {size(node.memory_bytes)}")
    for p in node.packages:
        lines.append(f"  package {p.index} (P#{p.os_index}): cores {ranges(p.cores)}")
    for n in node.numa_nodes:
        lines.append(f"  NUMA {n.index} (P#{n.os_index}): cores {ranges(n.cores)}, "
                     f"CPUs {ranges(n.pus)}, {size(n.memory_bytes)}")
    for m in node.gpu_memory_nodes:
        lines.append(f"  GPU memory NUMA P#{m.os_index}: {size(m.memory_bytes)}"
                     + (f", GPU {m.gpu_bus_id}" if m.gpu_bus_id else "") + " (not a CPU NUMA node)")

    lines.append(f"GPUs: {len(node.gpus)}")
    if node.gpus:
        rows = [["IDX", "MINOR", "BUS ID", "NAME", "MEMORY", "NUMA", "CORES", "MIG", "NICS"]]
        for g in node.gpus:
            rows.append([str(g.index), "-" if g.minor is None else str(g.minor), g.pci_bus_id,
                         g.name or "-", size(g.memory_bytes), ranges(g.numa_nodes), ranges(g.cores),
                         _mig(g), ",".join(g.nics) or "-"])
        lines += _table(rows)
        lines += _nvlink_lines(node)
        lines += _mig_lines(node)
        lines += _fabric_lines(node)
    if node.nics:
        lines.append(f"NICs: {len(node.nics)}")
        lines += _table([["NAME", "BUS ID", "NUMA"]]
                        + [[n.name, n.pci_bus_id, ranges(n.numa_nodes)] for n in node.nics])
    if node.notes:
        lines.append("Notes:")
        lines += [f"  - {n}" for n in node.notes]
    return lines


def _nvlink_lines(node: "Node") -> list[str]:
    gpus = node.gpus
    if not any(g.nvlinks for g in gpus):
        return ["NVLink: none reported" + ("" if any(s.startswith(("nvml", "snapshot")) for s in node.sources)
                                            else " (NVLink needs NVML)")]
    switched = [g for g in gpus if any(l.peer_kind == "nvswitch" for l in g.nvlinks)]
    out = ["NVLink (links between GPUs, NVSwitch paths counted):"]
    if len(switched) == len(gpus) and not any(l.peer_kind == "gpu" for g in gpus for l in g.nvlinks):
        counts = sorted({sum(l.links for l in g.nvlinks if l.peer_kind == "nvswitch") for g in gpus})
        out[0] = (f"NVLink: all {len(gpus)} GPUs through NVSwitch, "
                  f"{'/'.join(map(str, counts))} links per GPU")
        return out
    rows = [[""] + [f"GPU{g.index}" for g in gpus]]
    for g in gpus:
        row = [f"GPU{g.index}"]
        for o in gpus:
            n = g.nvlink_to(o) if o is not g else 0
            row.append("X" if o is g else (f"NV{n}" if n else "-"))
        rows.append(row)
    out += _table(rows)
    cpu = [g for g in gpus if any(l.peer_kind == "cpu" for l in g.nvlinks)]
    if cpu:
        out.append("  CPU NVLink: " + ", ".join(
            f"GPU{g.index} x{sum(l.links for l in g.nvlinks if l.peer_kind == 'cpu')}" for g in cpu))
    return out


def _mig_lines(node: "Node") -> list[str]:
    out = []
    for g in node.gpus:
        if g.mig_enabled and g.mig_instances:
            inst = ", ".join(f"{m.profile} (GI {m.gi_id} CI {m.ci_id})" for m in g.mig_instances)
            out.append(f"MIG GPU{g.index}: {inst}")
        elif g.mig_enabled:
            out.append(f"MIG GPU{g.index}: enabled, no instances")
    return out


def _fabric_lines(node: "Node") -> list[str]:
    fab = [(g, g.fabric) for g in node.gpus if g.fabric is not None]
    if not fab:
        return []
    groups: dict[tuple[str, int, str], list[int]] = {}
    for g, f in fab:
        groups.setdefault((f.cluster_uuid, f.clique_id, f.state), []).append(g.index)
    return [f"Fabric: cluster {u} clique {c}, {s}: GPUs {ranges(ix)}" for (u, c, s), ix in groups.items()]
