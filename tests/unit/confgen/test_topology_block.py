"""topology/block from NVLink fabric cliques: topograph's expectations and Slurm's BlockSizes rules."""
from __future__ import annotations

import dataclasses

import pytest

from slurm_gpu.confgen import block, topocheck, topology
from slurm_gpu.errors import InputError, UsageError
from slurm_gpu.hw.model import Fabric
from test_gres_generate import make_node

UUID = "8c2e4f6a-0000-4000-8000-000000000001"


def cluster(domains: dict[int, list[str]], *, state: str = "completed", uuid: str = UUID) -> dict:
    out = {}
    for clique, names in domains.items():
        node = make_node(gpus=4, fabric=Fabric(uuid, clique, state, 0))
        for n in names:
            out[n] = node
    return out


def names(prefix: str, a: int, b: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(a, b + 1)]


@pytest.mark.parametrize("n,sizes", [(1, (8,)), (2, (8, 16)), (3, (8, 16)), (4, (8, 16, 32)), (8, (8, 16, 32, 64))])
def test_inferred_block_sizes_follow_topograph(n: int, sizes: tuple[int, ...]) -> None:
    assert block.infer_sizes([8] * n) == sizes


def test_inferred_uses_smallest_domain() -> None:
    assert block.infer_sizes([2, 3]) == (2, 4)


def test_one_block_per_clique_ordered_by_node_name() -> None:
    nodes = cluster({7: names("srv2", 101, 108), 3: names("srv1", 101, 108)})
    bt = block.build_blocks(nodes)
    assert [(b.name, b.nodes[0], len(b.nodes)) for b in bt.blocks] == [("block001", "srv1101", 8),
                                                                        ("block002", "srv2101", 8)]
    assert bt.sizes == (8, 16)
    text = topology.render_topology(None, bt)
    assert "BlockName=block001 Nodes=srv[1101-1108]" in text and text.rstrip().endswith("BlockSizes=8,16")
    assert f"# block002={UUID}/7" in text


def test_explicit_sizes_split_partial_domains_like_topograph() -> None:
    """topograph TestGenerateTopologyConfig: BlockSizes=2,4,8, four 3-node domains -> 8 blocks."""
    nodes = cluster({1: ["Node104", "Node105", "Node106"], 2: ["Node201", "Node202", "Node205"],
                     3: ["Node304", "Node305", "Node306"], 4: ["Node401", "Node402", "Node403"]})
    bt = block.build_blocks(nodes, [2, 4, 8], placeholders=True)
    got = [tuple(b.nodes) for b in bt.blocks]
    assert got == [("Node104", "Node105"), ("Node106",), ("Node201", "Node202"), ("Node205",),
                   ("Node304", "Node305"), ("Node306",), ("Node401", "Node402"), ("Node403",)]
    assert bt.sizes == (2, 4, 8)


def test_missing_racks_become_placeholders_keeping_positions() -> None:
    """NVL72 sizes 18,36,72 with 3 racks (one partial): each rack one slot, pad to a whole 72."""
    nodes = cluster({1: names("a", 1, 18), 2: names("b", 1, 17), 3: names("c", 1, 18)})
    bt = block.build_blocks(nodes, [18, 36, 72], placeholders=True)
    assert [len(b.nodes) for b in bt.blocks] == [18, 17, 18, 0]
    text = topology.render_topology(None, bt)
    assert "\nBlockName=block004\n" in text and "BlockSizes=18,36,72" in text
    m = topocheck.parse_conf(text.splitlines(True))
    assert m.blocks[3] == frozenset() and m.block_sizes == (18, 36, 72)
    assert topocheck.compare(m, topocheck.parse_yaml(topology.render_topology(None, bt, fmt="yaml"))) == []


def test_default_layout_is_what_slurm_24_11_accepts() -> None:
    """No block below BlockSizes[0] and no empty block (both fatal in slurmctld 24.11.5)."""
    nodes = cluster({1: names("a", 1, 10), 2: names("b", 1, 8)})
    bt = block.build_blocks(nodes, [4, 8])
    assert [b.nodes for b in bt.blocks] == [tuple(names("a", 1, 4)), tuple(names("a", 5, 10)),
                                           tuple(names("b", 1, 4)), tuple(names("b", 5, 8))]
    assert all(len(b.nodes) >= 4 for b in bt.blocks)
    small = cluster({1: names("a", 1, 8), 2: names("b", 1, 3)})
    with pytest.raises(InputError, match=r"has 3 nodes \(b\[1-3\]\), fewer than BlockSizes\[0\]=4"):
        block.build_blocks(small, [4, 8])
    bt = block.build_blocks(small, [4, 8], drop_small=True)
    assert [len(b.nodes) for b in bt.blocks] == [4, 4] and any("left out" in n for n in bt.notes)


def test_nodes_without_completed_fabric_are_left_out_and_named() -> None:
    nodes = cluster({1: names("a", 1, 4)}) | cluster({2: names("z", 1, 2)}, state="in_progress")
    nodes["cpu1"] = make_node(gpus=0)
    bt = block.build_blocks(nodes)
    assert [b.nodes for b in bt.blocks] == [tuple(names("a", 1, 4))]
    assert any("in_progress" in n and "z[1-2]" in n for n in bt.notes)
    assert any("no NVLink fabric" in n and "cpu1" in n for n in bt.notes)


def test_gpus_of_one_node_in_two_cliques_are_not_trusted() -> None:
    node = make_node(gpus=2, fabric=Fabric(UUID, 1, "completed", 0))
    g = dataclasses.replace(node.gpus[1], fabric=Fabric(UUID, 2, "completed", 0))
    node = dataclasses.replace(node, gpus=(node.gpus[0], g))
    assert block.node_domain("x", node) == (None, "GPUs report 2 different fabric cliques")


@pytest.mark.parametrize("sizes", [[0], [8, 12], [8, 8], [16, 8]])
def test_bad_block_sizes(sizes: list[int]) -> None:
    with pytest.raises(UsageError):
        block.validate_sizes(sizes)


def test_no_blocks_is_an_error() -> None:
    with pytest.raises(InputError, match="no blocks"):
        block.build_blocks({"c": make_node(gpus=1)})


def test_yaml_holds_tree_and_block_conf_only_one() -> None:
    from slurm_gpu.confgen.tree import Switch, Tree
    t = Tree((Switch("s1", 0, ("a1", "a2")),), (), 1)
    bt = block.build_blocks(cluster({1: ["a1", "a2"]}))
    import yaml
    doc = yaml.safe_load(topology.render_topology(t, bt, fmt="yaml"))
    assert [d["topology"] for d in doc] == ["tree", "block"]
    assert doc[0]["cluster_default"] is True and doc[1]["cluster_default"] is False
    assert doc[1]["block"] == {"block_sizes": [2], "blocks": [{"block": "block001", "nodes": "a[1-2]"}]}
    with pytest.raises(UsageError):
        topology.render_topology(t, bt, fmt="conf")


# The shape of `scontrol show topoconf` in a real Slurm 26.05.5 (captured in
# tests/integration/test_topology_yaml_slurm2605.py's cluster): every topology
# lists all five kinds, the unused ones as `{}`, and empty values as nulls.
SLURM_TOPOCONF = """%YAML 1.1
---
- topology: nvl
  cluster_default: true
  block:
    block_sizes:
    - 2
    - 4
    blocks:
    - block: block001
      nodes: n[1-2]
    - block: block002
      nodes:
  flat: {}
  ring: {}
  torus3d: {}
  tree: {}
- topology: ib
  cluster_default: false
  block: {}
  flat: {}
  ring: {}
  torus3d: {}
  tree:
    switches:
    - switch: leaf1
      children:
      nodes: n[1-2]
...
"""


def test_slurm_topoconf_dump_parses_like_our_yaml() -> None:
    m = topocheck.parse_yaml(SLURM_TOPOCONF, "topoconf")
    assert m.block_sizes == (2, 4), "a later `block: {}` must not erase BlockSizes"
    assert m.blocks == [frozenset({"n1", "n2"}), frozenset()]
    assert m.switches == {"leaf1": (frozenset({"n1", "n2"}), frozenset())}


# Slurm's own BlockSizes rule (src/plugins/topology/block/block_record.c,
# _read_topo_file): every size > 0, a multiple of the first, the quotient a
# power of two of exponent <= 15; anything else is fatal for slurmctld
# ("Invalid BlockSizes value") in topology.conf since 24.05 and in
# topology.yaml since 26.05.3.
@pytest.mark.parametrize("sizes,ok", [
    ((8,), True), ((8, 16, 64), True), ((1, 1 << 15), True),
    ((4, 4), True), ((4, 16, 8), True),            # Slurm takes a set of levels
    ((1, 1 << 16), False), ((3, 3 << 16), False),  # level 16 > 15
    ((8, 12), False), ((8, 24), False), ((0,), False), ((8, -16), False), ((), False),
])
def test_slurm_block_sizes_rule(sizes: tuple[int, ...], ok: bool) -> None:
    assert (block.slurm_sizes_problem(sizes) is None) is ok


def test_explicit_sizes_beyond_slurms_levels_are_refused() -> None:
    with pytest.raises(UsageError, match=r"2\^15"):
        block.validate_sizes([1, 1 << 16])


def test_inferred_sizes_never_pass_slurms_16_levels() -> None:
    """topograph's floor(log2 N) levels, capped at Slurm's 16 (2^0..2^15)."""
    sizes = block.infer_sizes([1] * 70000)
    assert sizes == tuple(1 << i for i in range(16))
    assert block.slurm_sizes_problem(sizes) is None


@pytest.mark.parametrize("text", [
    "BlockName=b1 Nodes=n[1-2]\nBlockSizes=2,3\n",
    "BlockName=b1 Nodes=n[1-2]\nBlockSizes=1,65536\n",
    "BlockName=b1 Nodes=n[1-2]\nBlockSizes=0\n",
])
def test_deployed_conf_with_fatal_block_sizes_is_refused(text: str) -> None:
    with pytest.raises(InputError, match=r"BlockSizes.*slurmctld refuses"):
        topocheck.parse_conf(text.splitlines(True), "topology.conf")


def test_deployed_yaml_with_fatal_block_sizes_is_refused() -> None:
    text = ("- topology: t\n  cluster_default: true\n  block:\n    block_sizes: [4, 12]\n"
            "    blocks:\n      - block: b1\n        nodes: n[1-4]\n")
    with pytest.raises(InputError, match=r"BlockSizes.*slurmctld refuses"):
        topocheck.parse_yaml(text, "topology.yaml")


@pytest.mark.parametrize("fmt", ["conf", "yaml"])
def test_render_refuses_block_sizes_slurm_would_refuse(fmt: str) -> None:
    bt = block.build_blocks(cluster({1: ["a1", "a2"]}))
    bad = dataclasses.replace(bt, sizes=(2, 6))
    with pytest.raises(InputError, match=r"BlockSizes=2,6: slurmctld refuses it"):
        topology.render_topology(None, bad, fmt=fmt)
