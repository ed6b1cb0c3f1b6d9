"""topology/block from NVLink cliques in a real Slurm 24.11 (Debian 13 root, chroot).

Debian 12's Slurm 22.05 has no topology/block, so this module builds (once,
cached under /var/cache/slurm-gpu) a Debian 13 root with
``scripts/debian-root.sh trixie`` and runs munged, slurmctld and eight
slurmd from it (``debianroot.py``).  Without network (debootstrap cannot
fetch) the module is skipped with the reason (fails under
SLURM_GPU_REQUIRE_INTEGRATION=1).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import pytest

from debianroot import ChrootSlurm, debian_root, slurm_version
from sandboxlib import REPO
from slurm_gpu.confgen import hostlist

GB200 = REPO / "tests" / "data" / "machines" / "gb200-nvl" / "snapshot.json"
NODES = [f"n{i}" for i in range(1, 9)]
CLIQUES = {"n1": 1, "n2": 1, "n3": 1, "n4": 1, "n5": 2, "n6": 2, "n7": 2, "n8": 2}


@pytest.fixture(scope="module")
def trixie_root() -> Path:
    return debian_root("trixie", "Slurm 24.11")


def snapshots(d: Path) -> None:
    """Eight GB200-style node snapshots in two NVLink cliques (the real gb200-nvl record, re-labelled)."""
    base = json.loads(GB200.read_text())
    for name, clique in CLIQUES.items():
        snap = dict(base, hostname=name)
        node = json.loads(json.dumps(base["node"]))
        node["hostname"] = name
        for g in node["gpus"]:
            g["fabric"]["clique_id"] = clique
        snap["node"] = node
        (d / f"{name}.json").write_text(json.dumps(snap))


@pytest.fixture(scope="module")
def topo_text(tmp_path_factory, cli) -> str:
    d = tmp_path_factory.mktemp("snaps")
    snapshots(d)
    res = cli("topology", "render", "--snapshot", str(d), "--block-sizes", "4,8")
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture(scope="module")
def slurm(trixie_root: Path, topo_text: str) -> Iterator[ChrootSlurm]:
    s = ChrootSlurm(trixie_root, NODES, name="sgblock", slurm_conf={"TopologyPlugin": "topology/block"},
                    etc_files={"topology.conf": topo_text})
    try:
        s.start()
        yield s
    finally:
        s.stop()


def blocks_shown(s: ChrootSlurm) -> dict[str, set[str]]:
    res = s.cmd("scontrol", "show", "topology")
    assert res.returncode == 0, res.stderr
    out = {}
    for line in res.stdout.splitlines():
        m = re.match(r"BlockName=(\S+) .*Nodes=(\S+)", line)
        if m:
            out[m.group(1)] = set(hostlist.expand(m.group(2)))
    return out


def test_block_topology_loads_in_slurm_24_11(slurm: ChrootSlurm, topo_text: str) -> None:
    assert slurm_version(slurm.root).startswith("24.11")
    assert "BlockName=block001 Nodes=n[1-4]" in topo_text and "BlockSizes=4,8" in topo_text
    assert blocks_shown(slurm) == {"block001": {"n1", "n2", "n3", "n4"}, "block002": {"n5", "n6", "n7", "n8"}}


def test_segment_jobs_land_inside_one_block(slurm: ChrootSlurm) -> None:
    blocks = list(blocks_shown(slurm).values())
    hold = slurm.sbatch("-w", "n[1-3]", "--exclusive", "--wrap", "sleep 60")
    try:
        slurm.job(hold)
        # Lowest free pair would be n[4-5], across both blocks; --segment=2 must keep it in one.
        j = slurm.sbatch("-N2", "--segment=2", "--exclusive", "--wrap", "sleep 5")
        nodes = set(hostlist.expand(slurm.job(j)["NodeList"]))
        assert any(nodes <= b for b in blocks), nodes
        j2 = slurm.sbatch("-N2", "--segment=2", "--exclusive", "--wrap", "sleep 5")
        nodes2 = set(hostlist.expand(slurm.job(j2)["NodeList"]))
        assert any(nodes2 <= b for b in blocks) and not nodes & nodes2, nodes2
    finally:
        slurm.cancel_all()



@pytest.mark.parametrize("missing, line, fatal", [
    (["n8"], "BlockName=block004 Nodes=n7\n", r"children count lower than bblock_node_cnt"),
    (["n7", "n8"], "BlockName=block004\n", r"block block004 hasn't got nodes"),
], ids=["short-block", "empty-block"])
def test_placeholder_layout_is_fatal_in_slurm_24_11(trixie_root: Path, tmp_path: Path, cli,
                                                    missing: list[str], line: str, fatal: str) -> None:
    """Why the default block layout has no short and no empty block (26.05 accepts both: see
    test_topology_yaml_slurm2605.py): slurmctld 24.11 refuses topograph's layout at start-up."""
    d = tmp_path / "snaps"
    d.mkdir()
    snapshots(d)
    for n in missing:                 # a rack with nodes missing
        (d / f"{n}.json").unlink()
    res = cli("topology", "render", "--snapshot", str(d), "--block-sizes", "2,8", "--placeholders")
    assert res.returncode == 0, res.stderr
    assert line in res.stdout
    s = ChrootSlurm(trixie_root, [n for n in NODES if n not in missing], name="sgblockph",
                    slurm_conf={"TopologyPlugin": "topology/block"}, etc_files={"topology.conf": res.stdout})
    try:
        s.launch()
        m = s.wait_log("slurmctld", r"fatal: .*", timeout=30)
        assert m is not None, s.log("slurmctld")[-2000:]
        # The reason is the fatal line itself or the error just before it.
        assert re.search(fatal, s.log("slurmctld")), s.log("slurmctld")[-2000:]
    finally:
        s.stop()
