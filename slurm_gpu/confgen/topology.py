"""topology.conf / topology.yaml view model and rendering (pure).

The tree comes from :mod:`.tree` (InfiniBand dumps), the blocks from
:mod:`.block` (NVLink fabric cliques).  topology.conf holds one plugin's
description; topology.yaml (Slurm >= 25.05) can hold both as separate named
topologies, the first one being the cluster default.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Sequence

from .. import __version__
from ..errors import InputError, UsageError
from . import confsafe, hostlist
from .block import BlockTopology
from .tree import Tree

GENERATOR = "slurm-gpu topology render"
FORMATS = ("conf", "yaml")


@dataclass(frozen=True)
class ConfLine:
    comment: str
    text: str


@dataclass(frozen=True)
class YamlSwitch:
    switch: str                    # already quoted for YAML
    nodes: str                     # quoted hostlist or ""
    children: str                  # quoted hostlist or ""
    comment: str


@dataclass(frozen=True)
class YamlBlock:
    block: str
    nodes: str                     # quoted hostlist, "" for a placeholder
    comment: str


@dataclass(frozen=True)
class TopologyView:
    generator: str
    version: str
    inputs: tuple[str, ...]
    notes: tuple[str, ...]
    plugin: str                    # "topology/tree", "topology/block" or both joined by " + "
    lines: tuple[ConfLine, ...]    # topology.conf
    tree_name: str
    block_name: str
    tree_default: bool
    switches: tuple[YamlSwitch, ...]
    blocks: tuple[YamlBlock, ...]
    block_sizes: tuple[int, ...]


def _q(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid YAML double-quoted scalar


def build_view(tree: Tree | None, blocks: BlockTopology | None, *, fmt: str = "conf",
               inputs: Sequence[str] = ()) -> TopologyView:
    """Finish every line for the template."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown --format {fmt!r} (choose conf or yaml)")
    if tree is None and blocks is None:
        raise UsageError("nothing to render: give --ibnetdiscover (tree) and/or snapshots (block)")
    if fmt == "conf" and tree is not None and blocks is not None:
        raise UsageError("topology.conf holds one plugin: choose --plugin tree or block, or --format yaml")
    notes: list[str] = []
    lines: list[ConfLine] = []
    switches: list[YamlSwitch] = []
    yblocks: list[YamlBlock] = []
    plugins: list[str] = []
    folded: dict[tuple[str, ...], str] = {}

    def fold(names: tuple[str, ...], check: Callable[[str, str], str] = confsafe.node_name) -> str:
        # Every spine of a rail lists the same leaves: fold each list once.
        text = folded.get(names)
        if text is None:
            for n in names:     # names come from fabric descriptions and node files: input
                check(n, "topology")
            text = folded[names] = hostlist.fold(names) if names else ""
        return text

    if tree is not None:
        plugins.append("topology/tree")
        notes.extend(tree.notes)
        for sw in tree.switches:
            nodes = fold(sw.nodes)
            children = fold(sw.switches, confsafe.switch_name)
            text = f"SwitchName={sw.name}" + (f" Nodes={nodes}" if nodes else "") + (
                f" Switches={children}" if children else "")
            confsafe.switch_name(sw.name, "topology")
            comment = confsafe.comment(sw.comment)
            lines.append(ConfLine(comment, confsafe.record(text)))
            switches.append(YamlSwitch(_q(sw.name), _q(nodes) if nodes else "",
                                       _q(children) if children else "", comment))
    if blocks is not None:
        plugins.append("topology/block")
        notes.extend(blocks.notes)
        for b in blocks.blocks:
            nodes = fold(b.nodes)
            comment = confsafe.comment(f"{b.name}={b.domain}" if b.domain else
                                       (f"{b.name}: placeholder" if not nodes else ""))
            line = f"BlockName={b.name}" + (f" Nodes={nodes}" if nodes else "")
            lines.append(ConfLine(comment, confsafe.record(line)))
            yblocks.append(YamlBlock(_q(b.name), _q(nodes) if nodes else "", comment))
        lines.append(ConfLine("", "BlockSizes=" + ",".join(str(s) for s in blocks.sizes)))
    return TopologyView(
        generator=GENERATOR, version=__version__, inputs=tuple(confsafe.comment(i) for i in inputs),
        notes=tuple(confsafe.comment(n) for n in notes),
        plugin=" + ".join(plugins), lines=tuple(lines), tree_name="tree", block_name="block",
        tree_default=tree is not None, switches=tuple(switches), blocks=tuple(yblocks),
        block_sizes=blocks.sizes if blocks is not None else ())


def render_topology(tree: Tree | None, blocks: BlockTopology | None, *, fmt: str = "conf",
                    inputs: Sequence[str] = ()) -> str:
    """topology.conf (``fmt="conf"``) or topology.yaml (``fmt="yaml"``) text."""
    from .block import slurm_sizes_problem
    from .templating import render

    # The last gate before a file slurmctld reads: a BlockSizes it refuses is
    # fatal for it (topology.conf since 24.05, topology.yaml since 26.05.3).
    why = slurm_sizes_problem(blocks.sizes) if blocks is not None else None
    if why:
        raise InputError(f"BlockSizes={','.join(map(str, blocks.sizes))}: slurmctld refuses it ({why})",
                         "topology render")
    view = build_view(tree, blocks, fmt=fmt, inputs=inputs)
    return render(f"topology.{fmt}.j2", {"v": view})
