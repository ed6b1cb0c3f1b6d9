"""topology.yaml from our CLI in a real Slurm 26.05 (Debian sid root, chroot).

topology.yaml exists since Slurm 25.05; Debian 12 has 22.05 and Debian 13
24.11, so this module runs munged, slurmctld and eight slurmd 26.05 from a
Debian sid root built once by ``scripts/debian-root.sh sid`` (see
``debianroot.py``).  Without a mirror the module is skipped with the reason
(fails under SLURM_GPU_REQUIRE_INTEGRATION=1).

One topology.yaml, rendered by ``slurm-gpu topology render --format yaml``,
holds both topologies of the eight nodes:

* ``tree`` (cluster default): the real NDR dump in tests/data/ibnetdiscover/
  restricted with ``--nodes`` to four DGX under leaf group A09-P1-IBLEAF-01-03
  and four under B09-P1-IBLEAF-01-05;
* ``block`` (partition ``nvl`` has ``Topology=block``): NVLink cliques from
  copies of the recorded GB200 snapshot, cut ACROSS the leaves (two nodes of
  each leaf per clique), so a job's placement shows which topology ruled it.

A second step applies topograph's placeholder layout with ``topology apply``
and ``scontrol reconfigure``: Slurm 26.05 accepts short and empty blocks
(24.11 does not) and honours them.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Iterator

import pytest

from debianroot import ChrootSlurm, debian_root, slurm_version
from sandboxlib import REPO, parse_kv
from slurm_gpu.confgen import hostlist, topocheck

DUMP = REPO / "tests" / "data" / "ibnetdiscover" / "topograph-example.out"
GB200 = REPO / "tests" / "data" / "machines" / "gb200-nvl" / "snapshot.json"
LEAF_A, LEAF_B = "A09-P1-IBLEAF-01-03", "B09-P1-IBLEAF-01-05"
A = [f"a07-p1-dgx-03-c{i:02d}" for i in range(1, 5)]      # under LEAF_A in the dump
B = [f"b05-p1-dgx-05-c{i:02d}" for i in range(1, 5)]      # under LEAF_B
NODES = A + B
HOSTLIST = hostlist.fold(NODES)
# Two NVLink domains of four, each with two nodes of each leaf.
CLIQUES = {A[0]: 1, A[1]: 1, B[0]: 1, B[1]: 1, A[2]: 2, A[3]: 2, B[2]: 2, B[3]: 2}
# For the placeholder step: domains of 3 and 5 nodes, cut into blocks of 2.
CLIQUES_UNEVEN = {A[0]: 1, A[1]: 1, A[2]: 1, A[3]: 2, B[0]: 2, B[1]: 2, B[2]: 2, B[3]: 2}
PARTITIONS = ["PartitionName=ib Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
              "PartitionName=nvl Nodes=ALL MaxTime=INFINITE State=UP Topology=block"]


def write_snapshots(d: Path, cliques: dict[str, int]) -> Path:
    """GB200 node snapshots (the real gb200-nvl record, re-labelled) in the given cliques."""
    d.mkdir(parents=True, exist_ok=True)
    base = json.loads(GB200.read_text())
    for name, clique in cliques.items():
        node = json.loads(json.dumps(base["node"]))
        node["hostname"] = name
        for g in node["gpus"]:
            g["fabric"]["clique_id"] = clique
        (d / f"{name}.json").write_text(json.dumps(dict(base, hostname=name, node=node)))
    return d


def inputs(snaps: Path, *extra: str) -> list[str]:
    return ["--ibnetdiscover", str(DUMP), "--nodes", HOSTLIST, "--snapshot", str(snaps), *extra]


@pytest.fixture(scope="module")
def sid_root() -> Path:
    return debian_root("sid", "Slurm 26.05")


@pytest.fixture(scope="module")
def snaps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_snapshots(tmp_path_factory.mktemp("snaps"), CLIQUES)


@pytest.fixture(scope="module")
def yaml_text(cli, snaps: Path) -> str:
    res = cli("topology", "render", "--format", "yaml", *inputs(snaps))
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture(scope="module")
def slurm(sid_root: Path, yaml_text: str) -> Iterator[ChrootSlurm]:
    # No TopologyPlugin line: topology.yaml next to slurm.conf is the whole configuration.
    s = ChrootSlurm(sid_root, NODES, name="sgyaml", etc_files={"topology.yaml": yaml_text},
                    partitions=PARTITIONS)
    try:
        s.start()
        yield s
    finally:
        s.stop()


def shown(s: ChrootSlurm, *topology: str) -> list[dict[str, str]]:
    """``scontrol show topology [NAME]`` as one dict per line."""
    res = s.cmd("scontrol", "show", "topology", *topology)
    assert res.returncode == 0, res.stderr
    return [parse_kv(line) for line in res.stdout.splitlines() if line.strip()]


def blocks_of(s: ChrootSlurm) -> list[set[str]]:
    """Base blocks of the ``block`` topology, in Slurm's order (placeholders as empty sets)."""
    return [set(hostlist.expand(b["Nodes"])) if b.get("Nodes") else set()
            for b in shown(s, "block") if "BlockName" in b]


def nodes_of(s: ChrootSlurm, jobid: int) -> set[str]:
    return set(hostlist.expand(s.job(jobid)["NodeList"]))


def test_tree_and_block_in_one_yaml_load_in_slurm_26_05(slurm: ChrootSlurm, yaml_text: str) -> None:
    assert slurm_version(slurm.root).startswith("26.05")
    ours = topocheck.parse_yaml(yaml_text)
    # The tree is the real dump's two leaf groups under its nine spines; nothing else.
    assert {n for n, (nodes, _) in ours.switches.items() if nodes} == {LEAF_A, LEAF_B}
    assert len(ours.switches) == 11 and len(ours.blocks) == 2 and ours.block_sizes == (4, 8)
    # The default topology is the tree: scontrol lists every node below a switch.
    tree = {d["SwitchName"]: d for d in shown(slurm) if "SwitchName" in d}

    def below(name: str) -> set[str]:
        nodes, children = ours.switches[name]
        return set(nodes).union(*(below(c) for c in children))

    assert set(tree) == set(ours.switches)
    for name, d in tree.items():
        assert set(hostlist.expand(d["Nodes"])) == below(name), name
        assert set(hostlist.expand(d.get("Switches", ""))) == set(ours.switches[name][1]), name
        assert d["Level"] == ("0" if ours.switches[name][0] else "1"), name
    # The named second topology holds our blocks, in our order.
    assert blocks_of(slurm) == [set(b) for b in ours.blocks]
    assert "Topology=block" in slurm.cmd("scontrol", "show", "partition", "nvl").stdout
    assert not re.search(r"(error|fatal):.*(topolog|block|switch)", slurm.log("slurmctld"), re.I)


def test_slurms_own_dump_matches_the_generated_file(cli, slurm: ChrootSlurm, snaps: Path,
                                                    tmp_path: Path) -> None:
    """`scontrol show topoconf` (what slurmctld understood) means what we generated."""
    res = slurm.cmd("scontrol", "show", "topoconf")
    assert res.returncode == 0, res.stderr
    dump = tmp_path / "topoconf.yaml"
    dump.write_text(res.stdout)
    check = cli("topology", "check", "--config", str(dump), *inputs(snaps))
    assert check.returncode == 0, check.stdout + check.stderr
    # ... and check can tell: the same dump against other cliques differs.
    other = write_snapshots(tmp_path / "other", CLIQUES_UNEVEN)
    check = cli("topology", "check", "--config", str(dump), *inputs(other))
    assert check.returncode == 1 and "~ block #1" in check.stdout, check.stdout + check.stderr


def test_switches_1_lands_under_one_leaf(slurm: ChrootSlurm) -> None:
    hold = slurm.sbatch("-w", hostlist.fold(A[:3]), "--exclusive", "--wrap", "sleep 60")
    try:
        slurm.job(hold)
        # The lowest free pair is A[3],B[0]: across both leaves.
        j = slurm.sbatch("-N2", "--switches=1", "--exclusive", "--wrap", "sleep 30")
        got = nodes_of(slurm, j)
        assert got <= set(A) or got <= set(B), got
    finally:
        slurm.cancel_all()


def test_segment_lands_inside_one_block(slurm: ChrootSlurm) -> None:
    blocks = blocks_of(slurm)
    hold = slurm.sbatch("-p", "nvl", "-w", A[0], "--exclusive", "--wrap", "sleep 60")
    try:
        slurm.job(hold)
        # The lowest free pair is A[1],A[2]: one leaf, but two NVLink domains.
        j1 = slurm.sbatch("-p", "nvl", "-N2", "--segment=2", "--exclusive", "--wrap", "sleep 30")
        j2 = slurm.sbatch("-p", "nvl", "-N2", "--segment=2", "--exclusive", "--wrap", "sleep 30")
        n1, n2 = nodes_of(slurm, j1), nodes_of(slurm, j2)
        assert any(n1 <= b for b in blocks) and any(n2 <= b for b in blocks) and not n1 & n2, (n1, n2)
    finally:
        slurm.cancel_all()


def test_placeholder_blocks_apply_reconfigure_and_are_honoured(cli, slurm: ChrootSlurm,
                                                               tmp_path: Path) -> None:
    """topograph's layout (short + empty blocks): Slurm 26.05 loads it and keeps jobs out of short blocks."""
    uneven = write_snapshots(tmp_path / "uneven", CLIQUES_UNEVEN)
    etc = slurm.host(f"{slurm.rel}/etc/topology.yaml")
    res = cli("topology", "apply", "--config", str(etc),
              *inputs(uneven, "--block-sizes", "2,4", "--placeholders"))
    assert res.returncode == 0 and "scontrol reconfigure" in res.stdout, res.stdout + res.stderr
    try:
        assert slurm.cmd("scontrol", "reconfigure").returncode == 0
        want = [set(A[0:2]), {A[2]}, {A[3], B[0]}, set(B[1:3]), {B[3]}, set()]
        deadline = time.monotonic() + 30
        while (got := blocks_of(slurm)) != want and time.monotonic() < deadline:
            time.sleep(0.2)
        assert got == want
        slurm.wait_idle(NODES)
        # The only whole aggregate of 4 is A[3],B[0..2]: a 4-node job goes there, not to A[0..3].
        j = slurm.sbatch("-p", "nvl", "-N4", "--exclusive", "--wrap", "sleep 30")
        assert nodes_of(slurm, j) == {A[3], *B[:3]}
        slurm.cancel_all()
        hold = slurm.sbatch("-p", "nvl", "-w", A[0], "--exclusive", "--wrap", "sleep 60")
        slurm.job(hold)
        full = [b for b in want if len(b) == 2]
        j1 = slurm.sbatch("-p", "nvl", "-N2", "--segment=2", "--exclusive", "--wrap", "sleep 30")
        j2 = slurm.sbatch("-p", "nvl", "-N2", "--segment=2", "--exclusive", "--wrap", "sleep 30")
        n1, n2 = nodes_of(slurm, j1), nodes_of(slurm, j2)
        assert all(any(n <= b for b in full[1:]) for n in (n1, n2)) and not n1 & n2, (n1, n2)
        # Three nodes are free (A[1], A[2], B[3]) but no whole block of 2: the job waits.
        j3 = slurm.sbatch("-p", "nvl", "-N2", "--segment=2", "--exclusive", "--wrap", "sleep 30")
        deadline = time.monotonic() + 5
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = parse_kv(slurm.cmd("scontrol", "show", "job", "-o", str(j3)).stdout)
            if info.get("Reason") not in (None, "None", "Priority"):
                break
            time.sleep(0.2)
        assert info.get("JobState") == "PENDING" and info.get("Reason") == "No_suitable_topology_unit_found", info
    finally:
        slurm.cancel_all()
