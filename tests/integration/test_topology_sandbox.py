"""Generated topology.conf (tree, from an ibnetdiscover dump) in a real slurmctld 22.05."""
from __future__ import annotations

import re

import pytest

from slurm_gpu.confgen import hostlist, ibnet, topocheck, topology, tree


def rail_dump(units: dict[str, list[str]], rails: int = 2) -> str:
    """An ibnetdiscover text: per scalable unit one leaf per rail, hosts with one HCA per rail,
    two spines cabled to every leaf (the shape of tests/data/ibnetdiscover/topograph-example.out)."""
    leaves = {(su, r): f"S-{su}{r}" for su in units for r in range(rails)}
    spines = ["S-spine1", "S-spine2"]
    ports: dict[str, list[tuple[str, int]]] = {s: [] for s in list(leaves.values()) + spines}
    hosts: list[str] = []

    def link(a: str, b: str) -> None:
        ports[a].append((b, len(ports[b]) + 1))
        ports[b].append((a, len(ports[a])))

    for (su, r), leaf in leaves.items():
        for h in units[su]:
            hid = f"H-{h}-{r}"
            ports[hid] = []
            hosts.append(hid)
            link(leaf, hid)
        for sp in spines:
            link(leaf, sp)
    out = []
    for sid in list(leaves.values()) + spines:
        desc = f"MF0;{sid[2:]}:MQM9701/U1"
        out.append(f'switchguid=0x1\nSwitch\t65 "{sid}"\t\t# "{desc}" enhanced port 0 lid 1 lmc 0\n')
        out += [f'[{i}]\t"{p}"[{pp}]\t\t# "x" lid 2 4xNDR\n' for i, (p, pp) in enumerate(ports[sid], 1)]
        out.append("\n")
    for hid in hosts:
        _, name, rail = hid.split("-")
        (peer, pp), = ports[hid]
        out.append(f'caguid=0x2\nCa\t1 "{hid}"\t\t# "{name} mlx5_{rail}"\n[1](2)\t"{peer}"[{pp}]\t\t# lid 3\n\n')
    return "".join(out)


@pytest.fixture(scope="module")
def topo_text() -> str:
    dump = rail_dump({"su1": ["n1", "n2"], "su2": ["n3", "n4"]})
    t = tree.build_tree([ibnet.parse(dump.splitlines(True), "rails.out")])
    return topology.render_topology(t, None, inputs=["rails.out"])


@pytest.fixture(scope="module")
def cluster(make_sandbox, topo_text):
    return make_sandbox(nodes=4, machine="mini-2numa", slurm_conf={"TopologyPlugin": "topology/tree"},
                        etc_files={"topology.conf": topo_text})


def test_generated_tree_is_what_slurmctld_shows(cluster, topo_text) -> None:
    assert "SwitchName=su10 Nodes=n[1-2]" in topo_text and "SwitchName=spine1 Switches=su[10,20]" in topo_text
    res = cluster.run(["scontrol", "show", "topology"], timeout=10)
    assert res.returncode == 0, res.stderr
    shown = topocheck.TopoMeaning()
    for line in res.stdout.splitlines():
        kv = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "SwitchName" in kv:
            shown.switches[kv["SwitchName"]] = (
                frozenset(hostlist.expand(kv["Nodes"])) if kv.get("Nodes") else frozenset(),
                frozenset(hostlist.expand(kv["Switches"])) if kv.get("Switches") else frozenset())
    conf = topocheck.parse_conf(topo_text.splitlines(True))

    def below(name: str) -> frozenset[str]:  # scontrol lists every node under a switch
        nodes, children = conf.switches[name]
        return nodes.union(*(below(c) for c in children))

    expected = {name: (below(name), children) for name, (_, children) in conf.switches.items()}
    assert shown.switches == expected
    assert not re.search(r"error:.*(topology\.conf|topology/tree|switch)", cluster.log("slurmctld"), re.I)


def test_two_node_job_with_switches_1_lands_under_one_leaf(cluster) -> None:
    # Take n1: the lowest free pair is now n[2-3], which spans both leaves.
    hold = cluster.sbatch("-w", "n1", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 30")
    try:
        cluster.wait_job(hold, states={"RUNNING"}, timeout=30)
        j = cluster.sbatch("-N2", "--switches=1", "--exclusive", "-o", "/dev/null", "--wrap", "true")
        info = cluster.wait_job(j, timeout=60)
        assert info["JobState"] == "COMPLETED", info
        assert info["NodeList"] == "n[3-4]", info
    finally:
        cluster.run(["scancel", str(hold)])
