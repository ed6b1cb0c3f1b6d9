"""Compare every collected node with what Slurm believes (pure; no I/O).

For each node, one list of differences, each a short stable sentence:

* ``scontrol show node``: CPUs, Sockets, CoresPerSocket, ThreadsPerCore (as
  :func:`slurm_gpu.confgen.nodeline.socket_layout` would write them), a
  RealMemory above what is installed (slurmd would drain the node; below is
  the usual reserve for the OS), and the GPU counts of ``Gres=``;
* the deployed gres.conf, per node, with the same meaning-level comparison
  as ``slurm-gpu gres check`` (:mod:`slurm_gpu.confgen.grescheck`), plus a
  headline ``GPU N missing`` for a device file gres.conf promises and the
  node no longer has;
* the hardware layer's notes (a GPU NVML could not read).

Nodes with the same list are folded into one hostlist (ClusterShell's
NodeSet).  The topology (blocks from the collected NVLink cliques against the
deployed topology.conf) is compared once for the cluster.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..confgen import hostlist
from ..confgen.gres import GresLine, GresOptions, gres_records, node_gres_summary
from ..confgen.grescheck import NodeGres, effective, node_differences, parse_gres_conf
from ..confgen.nodeline import real_memory_mib, socket_layout
from .slurmview import SlurmNode, gpu_counts

_MINOR = re.compile(r"/nvidia(\d+)$")


@dataclass
class Report:
    """The folded result; ``groups`` is ``[(folded nodes, differences)]``."""

    nodes: dict[str, list[str]]                 # every node in scope -> differences ([] = match)
    groups: list[tuple[str, tuple[str, ...]]]
    topology: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def drift(self) -> bool:
        return bool(self.groups or self.topology)

    def summary(self) -> dict[str, int]:
        bad = sum(1 for d in self.nodes.values() if d)
        return {"nodes": len(self.nodes), "match": len(self.nodes) - bad, "differ": bad}

    def lines(self) -> list[str]:
        """``<hostlist>: <difference>`` lines, then the topology."""
        out = [f"{ns}: {d}" for ns, diffs in self.groups for d in diffs]
        out += [f"topology: {t}" for t in self.topology]
        return out

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary(), "drift": self.drift,
                "groups": [{"nodes": ns, "differences": list(d)} for ns, d in self.groups],
                "topology": list(self.topology), "notes": list(self.notes),
                "nodes": {n: d for n, d in self.nodes.items()}}


def _fmt_counts(c: Mapping[str, int]) -> str:
    return ",".join(f"gpu:{t}:{n}" if t else f"gpu:{n}" for t, n in sorted(c.items())) or "no GPUs"


class _Memo:
    """Identical hardware (thousands of nodes, a few shapes) is worked out once."""

    def __init__(self, opts: GresOptions) -> None:
        self.opts = opts
        self.layouts: dict[Any, Any] = {}
        self.records: dict[Any, tuple[GresLine, ...]] = {}
        self.wanted: dict[tuple[GresLine, ...], NodeGres] = {}
        self.counts: dict[tuple[GresLine, ...], dict[str, int]] = {}

    def layout(self, node: Any) -> Any:
        key = (id(node.packages), id(node.numa_nodes), id(node.cores), tuple(g.cores for g in node.gpus))
        lay = self.layouts.get(key)
        if lay is None:
            lay = self.layouts[key] = socket_layout(node, self.opts.socket_mode)
        return lay

    def gres(self, name: str, node: Any) -> tuple[NodeGres, dict[str, int]]:
        from ..confgen.gres import _gpu_key
        key = tuple(_gpu_key(g) for g in node.gpus)
        recs = self.records.get(key)
        if recs is None:
            recs = self.records[key] = gres_records(node, self.opts, where=name)
        wanted = self.wanted.get(recs)
        if wanted is None:
            text = "".join(r.text() + "\n" for r in recs)
            wanted = self.wanted[recs] = parse_gres_conf(text.splitlines(True), "generated").get("*", NodeGres())
            self.counts[recs] = gpu_counts(node_gres_summary(node, self.opts, records=recs))
        return wanted, self.counts[recs]


def node_drift(name: str, node: Any, slurm: SlurmNode | None, current: NodeGres | None,
               memo: _Memo) -> list[str]:
    """The differences of one collected node ([] when everything matches).

    *current* is the deployed gres.conf's meaning for this node (None: no
    gres.conf to check).
    """
    out: list[str] = []
    wanted, counts = memo.gres(name, node)
    if current is not None and current.autodetect in ("nvml", "nvidia") and not any(
            n == "gpu" for n, _ in current.devices):
        # slurmd finds the GPUs itself: there are no device lines to compare,
        # and a missing GPU shows in Slurm's Gres= count below.
        current = None
    if current is not None:
        have = {int(m.group(1)) for (n, f) in current.devices if n == "gpu" for m in [_MINOR.search(f)] if m}
        minors = {g.minor for g in node.gpus if g.minor is not None}
        for minor in sorted(have - minors):
            out.append(f"GPU {minor} missing (gres.conf has /dev/nvidia{minor}, the node does not)")
        for minor in sorted(minors - have):
            out.append(f"GPU {minor} not in gres.conf")
    if slurm is not None:
        lay = memo.layout(node)
        for label, theirs, ours in (("CPUs", slurm.cpus, lay.cpus), ("Sockets", slurm.sockets, lay.sockets),
                                    ("CoresPerSocket", slurm.cores_per_socket, lay.cores_per_socket),
                                    ("ThreadsPerCore", slurm.threads_per_core, lay.threads_per_core)):
            if theirs is not None and theirs != ours:
                out.append(f"{label}: Slurm {theirs}, hardware {ours}")
        installed = real_memory_mib(node)
        if slurm.real_memory is not None and installed and slurm.real_memory > installed:
            out.append(f"RealMemory: Slurm {slurm.real_memory} MiB, more than the {installed} MiB installed")
        theirs_gpus = gpu_counts(slurm.gres)
        if theirs_gpus != counts:
            out.append(f"Gres: Slurm {_fmt_counts(theirs_gpus)}, hardware {_fmt_counts(counts)}")
    if current is not None and not any(d.startswith("GPU ") for d in out):
        # With a GPU gone every other GPU's Links= shifts too: the headline
        # above is the news, those consequences would only bury it.
        out += [f"gres.conf {d.strip()}" for d in node_differences(current, wanted)]
    out += [f"hardware: {n}" for n in node.notes]
    return out


def _gres_key(g: NodeGres | None) -> Any:
    if g is None:
        return None
    return (g.autodetect, tuple(sorted(g.devices.items())), tuple(sorted(g.counts.items())))


def _slurm_key(s: SlurmNode) -> Any:
    return (s.cpus, s.sockets, s.cores_per_socket, s.threads_per_core, s.real_memory, s.gres)


def compare(nodes: Mapping[str, Any], slurm: Mapping[str, SlurmNode], *,
            gres_conf: Mapping[str, NodeGres] | None, opts: GresOptions | None = None,
            unreadable: Mapping[str, str] | None = None, scope: Sequence[str] | None = None,
            topology: Sequence[str] = (), notes: Sequence[str] = ()) -> Report:
    """The folded report for every node in *scope* (default: collected plus Slurm's nodes)."""
    memo = _Memo(opts or GresOptions())
    unreadable = unreadable or {}
    names = list(scope) if scope is not None else list(dict.fromkeys([*slurm, *nodes, *unreadable]))
    per: dict[str, list[str]] = {}
    seen: dict[Any, list[str]] = {}
    for name in names:
        node = nodes.get(name)
        s = slurm.get(name)
        if name in unreadable:
            per[name] = [f"unreadable entry: {unreadable[name]}"]
        elif node is None:
            why = f" (node {s.unusable})" if s is not None and s.unusable else ""
            per[name] = [f"no model collected{why}"]
        elif s is None:
            per[name] = ["collected, but Slurm does not know this node"]
        else:
            current = effective(gres_conf, name) if gres_conf is not None else None
            # Nodes of one kind share their model's parts (store.load_dir): the
            # same hardware against the same Slurm line and gres.conf is worked
            # out once, whatever the number of nodes.
            key = (id(node.gpus), id(node.packages), id(node.notes), node.memory_bytes, _slurm_key(s),
                   _gres_key(current))
            diffs = seen.get(key)
            if diffs is None:
                diffs = seen[key] = node_drift(name, node, s, current, memo)
            per[name] = list(diffs)
    by: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for name, diffs in per.items():
        if diffs:
            by[tuple(diffs)].append(name)
    groups = sorted(((hostlist.fold(ns), diffs) for diffs, ns in by.items()),
                    key=lambda g: hostlist.natural_key(g[0]))
    return Report(nodes=per, groups=groups, topology=list(topology), notes=list(notes))


def topology_drift(nodes: Mapping[str, Any], current: Any | None, source: str) -> tuple[list[str], list[str]]:
    """(differences, notes): blocks from the collected NVLink cliques against the deployed topology.

    The deployed file's own BlockSizes (and its placeholders, when it has
    any) are kept, so only membership drifts; a tree-only file cannot be
    checked from node models (it needs ``ibnetdiscover``).
    """
    from ..confgen import block, topocheck
    from ..errors import SlurmGpuError
    has_fabric = any(g.fabric is not None for n in nodes.values() for g in n.gpus)
    if current is None:
        return [], ([f"no topology file ({source}): NVLink cliques collected but not checked"] if has_fabric else [])
    if not current.blocks:
        if current.switches:
            return [], [f"{source} is a tree topology: check it with `slurm-gpu topology check --ibnetdiscover`"]
        return ([f"{source} has no blocks, the collected nodes report NVLink cliques"] if has_fabric else []), []
    try:
        placeholders = any(not b for b in current.blocks)
        want = block.build_blocks(nodes, current.block_sizes or None, placeholders=placeholders,
                                  drop_small=not placeholders)
    except SlurmGpuError as e:
        return [f"{source} has blocks, but the collected nodes give none: {e.what}"], []
    wanted = topocheck.TopoMeaning(blocks=[frozenset(b.nodes) for b in want.blocks], block_sizes=want.sizes)
    return [f"{source} {d}" for d in topocheck.compare(current, wanted)], list(want.notes)
