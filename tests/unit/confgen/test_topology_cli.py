"""`slurm-gpu topology` front end."""
from __future__ import annotations

import json
from pathlib import Path

from machinedata import ROOT
from slurm_gpu.cli import main
from slurm_gpu.hw import snapshot as snap
from slurm_gpu.hw.model import Fabric
from test_gres_generate import make_node

DUMP = str(ROOT / "tests" / "data" / "ibnetdiscover" / "topograph-example.out")


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_render_check_apply_tree(tmp_path: Path, capsys) -> None:
    conf = tmp_path / "topology.conf"
    rc, out, err = run(capsys, "topology", "apply", "--ibnetdiscover", DUMP, "--config", str(conf))
    assert rc == 0 and "scontrol reconfigure" in out and "note:" in err
    rc, out, _ = run(capsys, "topology", "apply", "--ibnetdiscover", DUMP, "--config", str(conf))
    assert rc == 0 and "nothing written" in out
    rc, out, _ = run(capsys, "topology", "check", "--ibnetdiscover", DUMP, "--config", str(conf))
    assert rc == 0
    conf.write_text(conf.read_text().replace("c[01-18]", "c[01-16]", 1))
    rc, out, _ = run(capsys, "topology", "check", "--ibnetdiscover", DUMP, "--config", str(conf))
    assert rc == 1 and "~ switch A09-P1-IBLEAF-01-03: Nodes=a07-p1-dgx-03-c[01-16] -> " in out
    yml = tmp_path / "topology.yaml"
    rc, _, _ = run(capsys, "topology", "render", "--ibnetdiscover", DUMP, "--format", "yaml", "-o", str(yml))
    rc, out, _ = run(capsys, "topology", "check", "--ibnetdiscover", DUMP, "--config", str(yml))
    assert rc == 0 and "matches" in out


def test_truncated_dump_never_writes(tmp_path: Path, capsys) -> None:
    cut = tmp_path / "cut.out"
    cut.write_text(Path(DUMP).read_text()[:100000])
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=s Nodes=n1\n")
    rc, out, err = run(capsys, "topology", "apply", "--ibnetdiscover", str(cut), "--config", str(conf))
    assert rc == 1 and out == "" and err.count("\n") == 1 and f"({cut}:" in err and "truncated" in err
    assert conf.read_text() == "SwitchName=s Nodes=n1\n" and not (tmp_path / "topology.conf.bak").exists()


def test_block_from_snapshot_directory(tmp_path: Path, capsys) -> None:
    d = tmp_path / "snaps"
    d.mkdir()
    for rack in (1, 2):
        node = make_node(gpus=4, fabric=Fabric("uuid-1", rack, "completed", 0))
        for i in range(1, 5):
            (d / f"r{rack}n{i}.json").write_text(json.dumps({
                "schema": snap.SCHEMA, "hostname": f"r{rack}n{i}", "nvml": {"calls": []},
                "hwloc_xml": "<x/>", "node": node.to_dict()}))
    rc, out, _ = run(capsys, "topology", "render", "--snapshot", str(d))
    assert rc == 0
    assert "BlockName=block001 Nodes=r1n[1-4]\n" in out and "BlockName=block002 Nodes=r2n[1-4]\n" in out
    assert out.rstrip().endswith("BlockSizes=4,8")
    rc, out, err = run(capsys, "topology", "render", "--snapshot", str(d), "--block-sizes", "4,6")
    assert rc == 2 and "power of two" in err


def test_usage_errors(capsys) -> None:
    rc, _, err = run(capsys, "topology", "render")
    assert rc == 2 and err.startswith("slurm-gpu: nothing to render")
    rc, _, err = run(capsys, "topology", "render", "--plugin", "block", "--ibnetdiscover", DUMP)
    assert rc == 2 and "snapshots" in err


def test_apply_replaces_a_file_it_cannot_parse(tmp_path: Path, capsys) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=s1 Nodes=n[1-\n")
    rc, out, err = run(capsys, "topology", "apply", "--ibnetdiscover", DUMP, "--config", str(conf))
    assert rc == 0 and f"wrote {conf}" in out and "scontrol reconfigure" in out
    assert "slurm-gpu: note: previous file not understood: " in err and f"({conf}:1)" in err
    assert "SwitchName=" in conf.read_text() and "n[1-" not in conf.read_text()
    assert (tmp_path / "topology.conf.bak").read_text() == "SwitchName=s1 Nodes=n[1-\n"


def test_bad_option_values_are_usage_errors(capsys) -> None:
    rc, out, err = run(capsys, "topology", "render", "--ibnetdiscover", DUMP, "--host-regex", "([")
    assert rc == 2 and out == "" and err.startswith("slurm-gpu: bad --host-regex: ") and err.count("\n") == 1
    rc, out, err = run(capsys, "topology", "render", "--ibnetdiscover", DUMP, "--nodes", "n[1-")
    assert rc == 2 and out == "" and err.startswith("slurm-gpu: --nodes: bad hostlist 'n[1-'") and err.count("\n") == 1
