"""`report placement`: finished multi-node jobs against the deployed topology."""
from __future__ import annotations

import json
import stat

import pytest

from slurm_gpu.cli import main
from slurm_gpu.cluster import placement
from slurm_gpu.confgen import topocheck

TREE = """SwitchName=leaf1 Nodes=n[1-4]
SwitchName=leaf2 Nodes=n[5-8]
SwitchName=leaf3 Nodes=n[9-10]
SwitchName=spine Switches=leaf[1-3]
"""
BLOCK = "BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-8]\nBlockSizes=4,8\n"


def doms(text: str):
    return placement.domains(topocheck.parse_conf(text.splitlines(True), "t.conf"))


def test_tree_domains_are_the_leaf_switches():
    kind, ds = doms(TREE)
    assert kind == "tree" and [d.name for d in ds] == ["leaf1", "leaf2", "leaf3"]
    assert ds[2].nodes == {"n9", "n10"}


@pytest.mark.parametrize("n,sizes,want", [
    (4, [4, 4, 2], 1), (5, [4, 4, 2], 2), (6, [2, 4, 4], 2), (9, [4, 4, 2], 3), (11, [4, 4, 2], None),
    (1, [], None), (2, [2], 1),
])
def test_fewest_domains_largest_first(n, sizes, want):
    assert placement.min_domains(n, sizes) == want


def test_jobs_against_the_tree():
    kind, ds = doms(TREE)
    s = placement.summarize(kind, ds, [
        ("1", ["n1", "n2", "n3"]),             # one leaf: the minimum
        ("2", ["n4", "n5"]),                   # two leaves where one would do
        ("3", ["n1", "n2", "n3", "n4", "n5"]),  # 5 nodes need 2 leaves: at the minimum
        ("4", ["n9", "n11"]),                  # n11 is under no switch
        ("5", ["n7"]),                         # one node: not a multi-node job
    ])
    got = {j.job: (j.spanned, j.minimum, j.outside, j.at_minimum, j.excess) for j in s.jobs}
    assert got == {"1": (1, 1, 0, True, 0), "2": (2, 1, 0, False, 1), "3": (2, 2, 0, True, 0),
                   "4": (1, 1, 1, False, 1)}
    assert s.at_minimum_share == 0.5 and s.mean_excess == 0.5


def test_blocks_and_what_each_can_still_serve():
    kind, ds = doms(BLOCK)
    assert kind == "block" and [sorted(d.nodes) for d in ds][0] == ["n1", "n2", "n3", "n4"]
    now = placement.free_now(ds, {"n1": "idle", "n2": "alloc", "n3": "idle", "n4": "drain",
                                  "n5": "idle", "n6": "idle", "n7": "idle", "n8": "idle*"}, kind)
    assert now == [{"domain": "block #1", "nodes": 4, "free": 2, "free_nodes": "n[1,3]", "largest_segment": 2},
                   {"domain": "block #2", "nodes": 4, "free": 3, "free_nodes": "n[5-7]", "largest_segment": 3}]


def test_cli_json_and_text(tmp_path, monkeypatch, capsys):
    topo = tmp_path / "topology.conf"
    topo.write_text(TREE)
    sacct = tmp_path / "sacct"
    # What sacct -n -P -X prints: a 1-node job, a pending one, and two multi-node jobs.
    sacct.write_text("#!/bin/sh\nprintf '%s\\n' '10|1|n1' '11|0|None assigned' '12|3|n[1-3]' '13|2|n[4-5]'\n")
    sacct.chmod(sacct.stat().st_mode | stat.S_IXUSR)
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\n[acct]\nsacct = "{sacct}"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    from slurm_gpu import config
    config.clear_cache()
    assert main(["report", "placement", "--topology", str(topo), "--json"]) in (0, None)
    v = json.loads(capsys.readouterr().out)
    assert v["topology"] == "tree" and [j["job"] for j in v["jobs"]] == ["12", "13"]
    assert v["cluster"] == {"jobs": 2, "at_minimum_share": 0.5, "mean_excess": 0.5}
    assert main(["report", "placement", "--topology", str(topo)]) in (0, None)
    out = capsys.readouterr().out
    assert "placed on the fewest leaf switches possible: 50.0% of jobs; mean excess 0.50" in out


def test_cli_bad_topology_is_one_line(tmp_path, capsys):
    bad = tmp_path / "topology.conf"
    bad.write_text("SwitchName=s1 Nodes=n[1-\n")
    rc = main(["report", "placement", "--topology", str(bad)])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("slurm-gpu: ") and err.count("\n") == 1 and "Traceback" not in err
    rc = main(["report", "placement", "--topology", str(tmp_path / "none.conf")])
    err = capsys.readouterr().err
    assert rc == 1 and "cannot read the topology file" in err
