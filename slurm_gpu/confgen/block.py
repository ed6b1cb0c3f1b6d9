"""topology/block from NVLink fabric membership (NVL72-class domains).

A node's GPUs report the fabric they registered with: ``cluster_uuid`` plus
``clique_id``.  Nodes with the same pair share one NVLink domain, which is
what a Slurm *base block* should be.  Block sizes and partial domains follow
Slurm's rules and NVIDIA topograph's conventions (the expected outputs in
``tests/data/topograph``):

* Without ``--block-sizes`` every domain is one block and
  ``BlockSizes=D,2D,...,2^k*D`` with ``D`` the smallest domain and
  ``k = floor(log2(number of domains))``.
* With explicit sizes, domains are cut into base blocks of ``sizes[0]``
  nodes (sorted by name).  What happens to the remainder depends on what the
  Slurm in use accepts:

  - default (checked against a real Slurm 24.11): every block must hold at
    least ``sizes[0]`` nodes ("Block configuration (b1) children count lower
    than bblock_node_cnt" is fatal) and a block without nodes is fatal too
    ("block X hasn't got nodes").  A short last chunk joins the chunk
    before it; a domain smaller than ``sizes[0]`` is an error naming it,
    or, with ``drop_small``, is left out with a note.
  - ``placeholders=True`` (topograph's layout, checked against a real Slurm
    26.05, which accepts short and empty blocks): short chunks stay, every
    domain gets the same slot (the smallest ``sizes[0] * 2^n`` holding the
    largest domain) padded with bare ``BlockName=`` placeholder lines, and
    whole empty slots are added until the total is a multiple of the last
    size, so a missing rack does not shift later racks in Slurm's
    positional aggregation.  Only for a Slurm that accepts empty blocks
    (26.05 does, in topology.conf and topology.yaml; 24.11 does not).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import Mapping, Sequence

from ..errors import InputError, UsageError
from ..hw.model import Node
from . import hostlist


@dataclass(frozen=True)
class Block:
    name: str
    nodes: tuple[str, ...]         # empty for a placeholder
    domain: str                    # "<cluster uuid>/<clique id>", "" for a placeholder


@dataclass(frozen=True)
class BlockTopology:
    blocks: tuple[Block, ...]
    sizes: tuple[int, ...]
    notes: tuple[str, ...]


def node_domain(name: str, node: Node) -> tuple[str | None, str | None]:
    """(domain, why-not) for one node: ``("<uuid>/<clique>", None)`` or ``(None, reason)``."""
    from .confsafe import check_fabric
    fabrics = [g.fabric for g in node.gpus if g.fabric is not None]
    for g in node.gpus:
        if g.fabric is not None:    # printed in comments and notes: one node's file must not add lines
            check_fabric(g.fabric, f"{name}: GPU {g.pci_bus_id}")
    if not fabrics:
        return None, "no NVLink fabric"
    pairs = {(f.cluster_uuid, f.clique_id) for f in fabrics}
    if len(pairs) > 1:
        return None, f"GPUs report {len(pairs)} different fabric cliques"
    bad = [f for f in fabrics if f.state != "completed" or f.status != 0]
    if bad:
        return None, f"fabric registration {bad[0].state} (status {bad[0].status})"
    (uuid, clique), = pairs
    return f"{uuid}/{clique}", None


# Slurm aggregates blocks over at most 16 levels, base * 2^0 .. base * 2^15
# (block_record.c: "if (block_level > 15)" -> fatal "Invalid BlockSizes value").
MAX_LEVEL = 15


def slurm_sizes_problem(sizes: Sequence[int]) -> str | None:
    """Why slurmctld would refuse ``BlockSizes=sizes``, or None.

    Slurm's own rule (src/plugins/topology/block/block_record.c,
    ``_read_topo_file``): every size > 0, each a multiple of the first (the
    base block), the quotient a power of two of exponent at most 15.  The
    sizes are a *set* of levels there, so order and repeats are accepted.
    It is fatal in topology.conf since 24.05, and in topology.yaml since
    26.05.3 (25.05 to 26.05.2 silently ignored a bad one there).
    """
    if not sizes:
        return "no sizes"
    base = sizes[0]
    for s in sizes:
        if s <= 0:
            return f"{s} is not above 0"
        q, r = divmod(s, base)
        if r or q & (q - 1):
            return f"{s} is not the base {base} times a power of two"
        if q.bit_length() - 1 > MAX_LEVEL:
            return f"{s} is more than the base {base} times 2^{MAX_LEVEL}"
    return None


def validate_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    """``--block-sizes``: increasing, each a power-of-two multiple of the one
    before (what we write), and within Slurm's rule (:func:`slurm_sizes_problem`)."""
    out = tuple(int(s) for s in sizes)
    if not out or any(s <= 0 for s in out):
        raise UsageError("--block-sizes needs positive integers")
    for a, b in zip(out, out[1:]):
        q, r = divmod(b, a)
        if r or q < 2 or q & (q - 1):
            raise UsageError(f"--block-sizes: {b} is not a power of two times {a} (Slurm's BlockSizes rule)")
    why = slurm_sizes_problem(out)
    if why:
        raise UsageError(f"--block-sizes: {why} (Slurm's BlockSizes rule: at most the base times 2^{MAX_LEVEL})")
    return out


def infer_sizes(domain_sizes: Sequence[int]) -> tuple[int, ...]:
    """topograph's inference: ``[D, 2D, ..., 2^k D]``, ``k = floor(log2 N)``,
    capped at Slurm's last level (``k <= 15``)."""
    if not domain_sizes:
        raise InputError("cannot determine BlockSizes: topology contains no blocks")
    d = min(domain_sizes)
    k = min(len(domain_sizes).bit_length() - 1, MAX_LEVEL)
    return tuple(d << i for i in range(k + 1))


def _slot(n: int, base: int) -> int:
    """Smallest ``base * 2^k`` >= n."""
    s = base
    while s < n:
        s *= 2
    return s


def build_blocks(nodes: Mapping[str, Node], sizes: Sequence[int] | None = None, *,
                 name_format: str = "block{:03d}", placeholders: bool = False,
                 drop_small: bool = False) -> BlockTopology:
    """Blocks for the nodes that belong to an NVLink fabric clique."""
    notes: list[str] = []
    domains: dict[str, list[str]] = {}
    left_out: dict[str, list[str]] = {}
    for name, node in nodes.items():
        dom, why = node_domain(name, node)
        if dom is None:
            left_out.setdefault(why or "", []).append(name)
        else:
            domains.setdefault(dom, []).append(name)
    for why, names in sorted(left_out.items()):
        notes.append(f"not in any block ({why}): {hostlist.fold(names)}")
    if not domains:
        raise InputError("cannot determine BlockSizes: topology contains no blocks "
                         "(no node reports a completed NVLink fabric clique)")
    ordered = sorted(((sorted(ns, key=hostlist.natural_key), d) for d, ns in domains.items()),
                     key=lambda t: hostlist.natural_key(t[0][0]))
    slots: list[tuple[tuple[str, ...], str]] = []
    if sizes and not placeholders:
        sz = validate_sizes(sizes)
        base = sz[0]
        small = [(ns, d) for ns, d in ordered if len(ns) < base]
        if small and not drop_small:
            ns, d = small[0]
            raise InputError(f"NVLink domain {d} has {len(ns)} nodes ({hostlist.fold(ns)}), fewer than "
                             f"BlockSizes[0]={base}: Slurm 24.11 refuses such a block; lower --block-sizes, "
                             f"pass --drop-small-blocks, or --placeholders (Slurm >= 26.05)")
        for ns, d in small:
            notes.append(f"left out domain {d} ({hostlist.fold(ns)}): {len(ns)} nodes < BlockSizes[0]={base}")
        for ns, d in ordered:
            if len(ns) < base:
                continue
            chunks = [list(ns[i:i + base]) for i in range(0, len(ns), base)]
            if len(chunks[-1]) < base:
                chunks[-2].extend(chunks.pop())
                notes.append(f"domain {d} has {len(ns)} nodes, not a multiple of {base}: its last "
                             f"block holds {len(chunks[-1])}")
            slots.extend((tuple(c), d) for c in chunks)
        if not slots:
            raise InputError("cannot determine BlockSizes: topology contains no blocks "
                             f"(every domain is smaller than {base})")
    elif sizes:
        sz = validate_sizes(sizes)
        base = sz[0]
        largest = max(len(ns) for ns, _ in ordered)
        per_domain = _slot(min(sz[-1], largest), base) // base if len(sz) > 1 else 0
        for ns, d in ordered:
            chunks = [tuple(ns[i:i + base]) for i in range(0, len(ns), base)]
            want = max(per_domain, len(chunks))
            if len(sz) > 1 and want > per_domain:
                # A domain larger than the slot: round up to an aggregate boundary.
                want = _slot(want * base, base) // base
            slots.extend((c, d) for c in chunks)
            slots.extend(((), d) for _ in range(want - len(chunks)))
            if len(ns) % base:
                notes.append(f"domain {d} has {len(ns)} nodes, not a multiple of {base}: "
                             f"its last base block is partial")
        if len(sz) > 1:
            slot_nodes = per_domain * base
            step = slot_nodes * sz[-1] // gcd(slot_nodes, sz[-1])
            total = len(slots) * base
            pad = (-total) % step if total % sz[-1] else 0
            slots.extend(((), "") for _ in range(pad // base))
            if pad:
                notes.append(f"added {pad // base} empty placeholder blocks so the last aggregate "
                             f"({sz[-1]} nodes) is whole")
    else:
        sz = infer_sizes([len(ns) for ns, _ in ordered])
        slots = [(tuple(ns), d) for ns, d in ordered]
    blocks = tuple(Block(name_format.format(i + 1), ns, d) for i, (ns, d) in enumerate(slots))
    return BlockTopology(blocks, sz, tuple(notes))
