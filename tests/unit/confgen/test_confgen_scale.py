"""A generated cluster (bench_confgen's shape, 360 nodes) renders byte for byte as it did.

The golden files in tests/data/golden/scale/360.* were rendered by main
before issue 15's confgen speed-up (the template loader, the faster tree
build and gres grouping); every later change must keep them.  The cluster
mixes node kinds, NVLink cliques of 18 with stragglers outside any fabric,
and a rail-optimised InfiniBand fabric (8 HCAs per node, 32-node scalable
units, 16 spines per rail) with one host left off the fabric.

Regenerate only after an intended change: ``PYTHONPATH=tests python tests/unit/confgen/test_confgen_scale.py --write``.
"""
from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"
GOLDEN = ROOT / "tests" / "data" / "golden" / "scale"
N = 360
KINDS = ("h100-sxm-8x", "gb200-nvl", "h100-sxm-8x", "dgx-a100-permuted")


def make_snapshots(d: Path) -> list[str]:
    """Snapshots whose raw part is empty: the cluster-wide reader takes the model from the tail."""
    names = []
    for i in range(1, N + 1):
        name = f"gpu{i:04d}"
        kind = KINDS[(i - 1) // 72 % len(KINDS)]
        node = json.loads((MACHINES / kind / "snapshot.json").read_text())["node"]
        node = dict(node, hostname=name)
        clique = None if i % 50 == 0 else (i - 1) // 18
        node["gpus"] = [dict(g, uuid=f"GPU-{uuid.UUID(int=i * 64 + k)}",
                             fabric=None if clique is None else
                             {"cluster_uuid": str(uuid.UUID(int=0xC1A5 + i // 180)), "clique_id": clique,
                              "state": "completed", "status": 0, "health_mask": 0})
                        for k, g in enumerate(node["gpus"])]
        doc = {"schema": "slurm-gpu.snapshot/1", "hostname": name, "nvml": {"calls": []}, "hwloc_xml": "",
               "node": node}
        (d / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        names.append(name)
    return names


def render(tmp: Path) -> dict[str, str]:
    from slurm_gpu.commands.confgen_io import load_nodes
    from slurm_gpu.confgen import block, ibnet, render_gres_conf, topology, tree
    from slurm_gpu_devkit.fabricgen import write_rail_fabric

    snaps = tmp / "snapshots"
    snaps.mkdir()
    names = make_snapshots(snaps)
    # one host whose cables are unplugged: in no leaf
    write_rail_fabric(tmp / "fabric.out", names, unplugged={names[7]}, generator="test_confgen_scale.py")
    nodes, where = load_nodes([str(snaps)], [], None)
    fab = ibnet.parse_file(str(tmp / "fabric.out"))
    return {
        "gres.conf": render_gres_conf(nodes, inputs=["snapshots"], where=where),
        "tree.topology.conf": topology.render_topology(tree.build_tree([fab]), None, inputs=["fabric.out"]),
        "block.topology.conf": topology.render_topology(
            None, block.build_blocks(nodes, [18, 36, 72], drop_small=True), inputs=["snapshots"]),
    }


def test_generated_cluster_renders_as_golden(tmp_path: Path) -> None:
    got = render(tmp_path)
    for name, text in got.items():
        assert text == (GOLDEN / f"{N}.{name}").read_text(), name
    # The shape is what it claims: every kind, stragglers, a host off the fabric.
    assert "gpu0050" not in got["block.topology.conf"] and "Nodes=" in got["tree.topology.conf"]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as t:
        for name, text in render(Path(t)).items():
            (GOLDEN / f"{N}.{name}").write_text(text)
            print("wrote", GOLDEN / f"{N}.{name}")
