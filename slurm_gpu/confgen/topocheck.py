"""Parse topology.conf / topology.yaml and compare meaning.

Tree: each switch's node set and child-switch set (names matter, order does
not).  Block: the ordered list of node sets and BlockSizes (block *names*
are arbitrary labels, positions are what Slurm aggregates).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from ..errors import InputError
from . import hostlist
from .slurmconf import change_line, records


@dataclass
class TopoMeaning:
    """What a topology file means: switches (nodes, child switches), blocks as node sets, BlockSizes."""

    switches: dict[str, tuple[frozenset[str], frozenset[str]]] = field(default_factory=dict)
    blocks: list[frozenset[str]] = field(default_factory=list)
    block_sizes: tuple[int, ...] = ()


def parse_conf(lines: Iterable[str], source: str = "topology.conf") -> TopoMeaning:
    """Parse topology.conf (tree or block lines); InputError names ``source:line``."""
    m = TopoMeaning()
    for rec in records(lines, source):
        where = f"{source}:{rec.line}"
        k = rec.first_key
        if k == "switchname":
            name = rec.get("switchname") or ""
            if name in m.switches:
                raise InputError(f"switch {name} defined twice", where)
            nodes = rec.get("nodes")
            sw = rec.get("switches")
            m.switches[name] = (frozenset(hostlist.expand(nodes, where)) if nodes else frozenset(),
                                frozenset(hostlist.expand(sw, where)) if sw else frozenset())
        elif k == "blockname":
            nodes = rec.get("nodes")
            m.blocks.append(frozenset(hostlist.expand(nodes, where)) if nodes else frozenset())
        elif k == "blocksizes":
            try:
                m.block_sizes = tuple(int(x) for x in (rec.get("blocksizes") or "").split(","))
            except ValueError:
                raise InputError("bad BlockSizes", where) from None
            _slurm_sizes(m.block_sizes, where)
        else:
            raise InputError(f"unknown topology.conf line starting {k!r}", where)
    return m


def _hl(v: Any, where: str) -> frozenset[str]:
    if v is None:
        return frozenset()
    # Only scalars name hosts: a nested list (or a YAML alias of one, which
    # str() would print exponentially) is a mistake, said in one line.
    items = v if isinstance(v, list) else [v]
    if not all(isinstance(i, (str, int)) and not isinstance(i, bool) for i in items):
        raise InputError("a host list must be names or a list of names", where)
    return frozenset(x for item in items for x in hostlist.expand(str(item), where))


def _records(v: Any, what: str, where: str) -> list[dict[str, Any]]:
    """A YAML list of mappings (``switches``, ``blocks``), or one line saying it is not."""
    v = v or []
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise InputError(f"{what} must be a list of mappings", where)
    return v


def parse_yaml(text: str, source: str = "topology.yaml") -> TopoMeaning:
    """Parse topology.yaml (Slurm >= 25.05) into the same meaning as :func:`parse_conf`."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise InputError(f"unreadable YAML: {getattr(e, 'problem', e)}", where) from None
    except RecursionError:
        raise InputError("unreadable YAML: nested too deeply", source) from None
    except ValueError as e:          # PyYAML's int() of a 4,300+ digit number
        raise InputError(f"unreadable YAML: {str(e)[:80]}", source) from None
    if not isinstance(data, list):
        raise InputError("topology.yaml must be a list of topologies", source)
    m = TopoMeaning()
    for topo in data:
        if not isinstance(topo, dict):
            raise InputError("topology entry is not a mapping", source)
        # Slurm's own dump (`scontrol show topoconf`, 26.05) gives every
        # topology all five kinds, the unused ones as `{}`: only a non-empty
        # section counts, or a later `block: {}` would erase BlockSizes.
        tree = topo.get("tree")
        if isinstance(tree, dict) and tree:
            for sw in _records(tree.get("switches"), "tree.switches", source):
                name = str(sw.get("switch"))
                m.switches[name] = (_hl(sw.get("nodes"), source), _hl(sw.get("children"), source))
        blk = topo.get("block")
        if isinstance(blk, dict) and blk:
            sizes = blk.get("block_sizes", []) or []
            # ints, or digit strings as a dump may quote them; bounded before int()
            if not isinstance(sizes, list) or not all(
                    (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, str) and x.strip().isascii()
                                                                         and x.strip().isdigit() and len(x) <= 7)
                    for x in sizes) or not all(0 < int(x) < 1 << 20 for x in sizes):
                raise InputError(f"bad block_sizes in topology {str(topo.get('topology'))[:40]!r}", source)
            m.block_sizes = tuple(int(x) for x in sizes)
            if m.block_sizes:  # none: Slurm's default levels
                _slurm_sizes(m.block_sizes, source)
            for b in _records(blk.get("blocks"), "block.blocks", source):
                m.blocks.append(_hl(b.get("nodes"), source))
    return m


def _slurm_sizes(sizes: tuple[int, ...], where: str) -> None:
    """A deployed BlockSizes that slurmctld would refuse (fatal) is bad input."""
    from .block import slurm_sizes_problem

    why = slurm_sizes_problem(sizes)
    if why:
        raise InputError(f"BlockSizes={_ints(sizes)}: slurmctld refuses it ({why})", where)


def compare(current: TopoMeaning, wanted: TopoMeaning) -> list[str]:
    """Readable ``+``/``-``/``~`` lines for every difference; [] when the meaning is equal."""
    out: list[str] = []
    for name in sorted(set(current.switches) | set(wanted.switches), key=hostlist.natural_key):
        line = change_line(f"switch {name}", current.switches.get(name), wanted.switches.get(name), _sw)
        if line:
            out.append(line)
    if current.block_sizes != wanted.block_sizes:
        out.append(f"~ BlockSizes: {_ints(current.block_sizes)} -> {_ints(wanted.block_sizes)}")
    for i in range(max(len(current.blocks), len(wanted.blocks))):
        a = current.blocks[i] if i < len(current.blocks) else None
        b = wanted.blocks[i] if i < len(wanted.blocks) else None
        if a != b:
            out.append(f"~ block #{i + 1}: {_bl(a)} -> {_bl(b)}")
    return out


def _sw(v: tuple[frozenset[str], frozenset[str]]) -> str:
    nodes, sws = v
    parts = []
    if nodes:
        parts.append(f"Nodes={hostlist.fold(nodes)}")
    if sws:
        parts.append(f"Switches={hostlist.fold(sws)}")
    return " ".join(parts) or "(empty)"


def _bl(v: frozenset[str] | None) -> str:
    if v is None:
        return "(none)"
    return f"Nodes={hostlist.fold(v)}" if v else "(placeholder)"


def _ints(v: tuple[int, ...]) -> str:
    return ",".join(map(str, v)) or "(unset)"
