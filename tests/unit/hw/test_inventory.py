"""``slurm-gpu inventory``: the JSON contract, the text form and the error contract.

Run in-process through ``slurm_gpu.cli.main`` and as a real subprocess of the
venv's ``slurm-gpu`` (pointed at this checkout).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from machinedata import ROOT, all_machines, hwloc_machines, machine_dir, machine_xml
from machinedata import hwloc_calc as calc

from slurm_gpu import cli
from slurm_gpu.commands.inventory import ranges

VENV_BIN = Path(sys.executable).parent
CONTRACT_KEYS = {"index", "pci_bus_id", "name", "numa_nodes", "cores"}


def run_json(capsys, *args: str) -> dict:
    assert cli.main(["inventory", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)




@pytest.mark.parametrize("name", hwloc_machines())
def test_hwloc_json_matches_hwloc_calc(capsys, name: str) -> None:
    xml = str(machine_xml(name))
    inv = run_json(capsys, "--hwloc-xml", xml)
    gpus = inv["gpus"]
    assert [g["pci_bus_id"] for g in gpus] == sorted(g["pci_bus_id"] for g in gpus)
    assert [g["index"] for g in gpus] == list(range(len(gpus)))
    by_os = {n["os_index"]: n["index"] for n in inv["numa_nodes"]}
    for g in gpus:
        assert CONTRACT_KEYS <= set(g)
        assert isinstance(g["index"], int) and (g["name"] is None or isinstance(g["name"], str))
        assert g["cores"] == calc(xml, "--li", "--intersect", "core", f"pci={g['pci_bus_id']}")
        numa_os = calc(xml, "--po", "--intersect", "numa", f"pci={g['pci_bus_id']}")
        assert g["numa_nodes"] == [by_os[n] for n in numa_os if n in by_os]


def test_power9_json_excludes_gpu_memory_numa(capsys) -> None:
    inv = run_json(capsys, "--hwloc-xml", str(machine_xml("power9-6xv100")))
    assert [n["os_index"] for n in inv["numa_nodes"]] == [0, 8]
    assert {tuple(g["numa_nodes"]) for g in inv["gpus"]} == {(0,), (1,)}
    assert len(inv["gpus"]) == 6


SNAPSHOT_MACHINES = [m for m in all_machines() if (machine_dir(m) / "snapshot.json").is_file()]


@pytest.mark.parametrize("name", SNAPSHOT_MACHINES)
def test_snapshot_json_ordered_by_minor(capsys, name: str) -> None:
    inv = run_json(capsys, "--snapshot", str(machine_dir(name) / "snapshot.json"))
    minors = [g["minor"] for g in inv["gpus"]]
    assert minors == sorted(minors)
    for g in inv["gpus"]:
        assert CONTRACT_KEYS <= set(g)
        assert len(g["pci_bus_id"]) == 12 and g["pci_bus_id"][4] == ":"


def test_text_form_dgx2(capsys) -> None:
    assert cli.main(["inventory", "--hwloc-xml", str(machine_xml("dgx2"))]) == 0
    out = capsys.readouterr().out
    assert "GPUs: 16" in out
    row = next(l for l in out.splitlines() if "0000:b7:00.0" in l).split()
    # IDX MINOR BUS NAME MEMORY NUMA CORES MIG NICS
    assert row[:3] == ["8", "8", "0000:b7:00.0"] and row[-4:-2] == ["1", "2-3"]
    assert "NUMA 1 (P#1): cores 2-3, CPUs 24-25" in out


def test_text_form_gpu_memory_and_no_gpus(capsys) -> None:
    assert cli.main(["inventory", "--hwloc-xml", str(machine_xml("power9-6xv100"))]) == 0
    out = capsys.readouterr().out
    assert "GPU memory NUMA P#250: 15.0 GiB, GPU 0035:05:00.0 (not a CPU NUMA node)" in out
    assert "NUMA 1 (P#8): cores 4-7" in out
    assert cli.main(["inventory", "--hwloc-xml", str(machine_xml("gh200"))]) == 0
    out = capsys.readouterr().out
    assert "GPUs: 0" in out and "no GPUs: the hwloc topology has no NVIDIA PCI device" in out


def test_zero_gpu_json_says_why(capsys) -> None:
    inv = run_json(capsys, "--hwloc-xml", str(machine_xml("epyc-corona")))
    assert inv["gpus"] == [] and any(n.startswith("no GPUs:") for n in inv["notes"])


def test_bad_file_is_one_line_exit_1(capsys, tmp_path) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text("<topology><object")
    assert cli.main(["inventory", "--hwloc-xml", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("slurm-gpu: malformed hwloc XML") and err.count("\n") == 1
    assert str(bad) in err and "Traceback" not in err


def test_both_sources_is_a_usage_error(capsys) -> None:
    assert cli.main(["inventory", "--hwloc-xml", "a", "--snapshot", "b"]) == 2
    assert capsys.readouterr().err.startswith("slurm-gpu: give either --hwloc-xml or --snapshot")


def test_ranges() -> None:
    assert ranges([]) == "-"
    assert ranges([3]) == "3"
    assert ranges([5, 0, 1, 2, 7, 8, 2]) == "0-2,5,7-8"


# -- as a real command ----------------------------------------------------------

def _slurm_gpu(*args: str) -> subprocess.CompletedProcess[str]:
    exe = VENV_BIN / "slurm-gpu"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "slurm_gpu"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout, not the installed copy
    env.pop("SLURM_GPU_DEBUG", None)
    return subprocess.run(argv + list(args), capture_output=True, text=True, env=env, timeout=60)


def test_subprocess_json_contract() -> None:
    p = _slurm_gpu("inventory", "--hwloc-xml", str(machine_xml("cts1-pascal")), "--json")
    assert p.returncode == 0, p.stderr
    inv = json.loads(p.stdout)
    assert [(g["index"], g["pci_bus_id"], g["name"], g["numa_nodes"], g["cores"]) for g in inv["gpus"]] == [
        (0, "0000:04:00.0", "Tesla P100-PCIE-16GB", [0], list(range(18))),
        (1, "0000:07:00.0", "Tesla P100-PCIE-16GB", [0], list(range(18))),
    ]


def test_subprocess_bad_file_and_debug(tmp_path) -> None:
    missing = tmp_path / "missing.xml"
    p = _slurm_gpu("inventory", "--hwloc-xml", str(missing))
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr == f"slurm-gpu: cannot read hwloc XML: No such file or directory ({missing})\n"
    p = _slurm_gpu("--debug", "inventory", "--hwloc-xml", str(missing))
    assert p.returncode == 1 and "Traceback (most recent call last)" in p.stderr
    assert p.stderr.rstrip().endswith(f"({missing})")


def test_command_module_imports_nothing_heavy() -> None:
    code = ("import sys, slurm_gpu.cli, slurm_gpu.commands.inventory, slurm_gpu.hw; "
            "print(sorted(m for m in ('cffi', 'pynvml', 'jinja2', 'yaml', 'ClusterShell') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def _node(nvlinks_of, gpu_extra=None):
    from slurm_gpu.hw.model import Core, Gpu, Node, NumaNode, Package

    cores = tuple(Core(i, i, 0, 0, (i,)) for i in range(4))
    gpus = tuple(Gpu(index=i, minor=i, uuid=f"GPU-{i}", pci_bus_id=f"0000:0{i + 1}:00.0",
                     pci_device_id=0x2330, name="NVIDIA H100 80GB HBM3", memory_bytes=80 * 2**30,
                     numa_nodes=(0,), cores=(0, 1, 2, 3), nvlinks=nvlinks_of(i), **(gpu_extra or {}).get(i, {}))
                 for i in range(3))
    return Node(hostname="n1", packages=(Package(0, 0, (0, 1, 2, 3)),),
                numa_nodes=(NumaNode(0, 0, 2**30, (0, 1, 2, 3), (0, 1, 2, 3)),), cores=cores,
                gpus=gpus, memory_bytes=2**30, sources=("snapshot:x.json",))


def test_text_nvswitch_mig_and_fabric() -> None:
    from slurm_gpu.commands.inventory import render_text
    from slurm_gpu.hw.model import Fabric, MigInstance, NvLink

    mig = MigInstance(gi_id=1, ci_id=0, profile="3g.40gb", gi_profile_id=9, ci_profile_id=2,
                      placement_start=0, placement_size=4, memory_bytes=40 * 2**30, sm_count=60,
                      uuid="MIG-1", gi_cap_minor=12, ci_cap_minor=13)
    fab = Fabric(cluster_uuid="c0ffee", clique_id=7, state="completed", status=0)
    node = _node(lambda i: (NvLink("nvswitch", "nvswitch", 18),),
                 {0: {"mig_enabled": True, "mig_instances": (mig,)}, 1: {"mig_enabled": False},
                  2: {"fabric": fab}})
    out = "\n".join(render_text(node))
    assert "NVLink: all 3 GPUs through NVSwitch, 18 links per GPU" in out
    assert "MIG GPU0: 3g.40gb (GI 1 CI 0)" in out
    assert "Fabric: cluster c0ffee clique 7, completed: GPUs 2" in out
    rows = {l.split()[2]: l.split() for l in out.splitlines() if "0000:0" in l}
    assert rows["0000:01:00.0"][-2:] == ["(1)", "-"] and rows["0000:02:00.0"][-2] == "off"


def test_text_direct_nvlink_matrix() -> None:
    from slurm_gpu.commands.inventory import render_text
    from slurm_gpu.hw.model import NvLink

    pairs = {0: (NvLink("gpu", "0000:02:00.0", 4),), 1: (NvLink("gpu", "0000:01:00.0", 4),), 2: ()}
    out = render_text(_node(lambda i: pairs[i]))
    i = out.index("NVLink (links between GPUs, NVSwitch paths counted):")
    assert out[i + 1].split() == ["GPU0", "GPU1", "GPU2"]
    assert out[i + 2].split() == ["GPU0", "X", "NV4", "-"]
    assert out[i + 4].split() == ["GPU2", "-", "-", "X"]


def test_overlay_lost_gpu_drops_it(tmp_path, capsys) -> None:
    """A fault overlay replays through the adapter: a lost GPU leaves the inventory."""
    import json as _json

    from slurm_gpu.cli import main as _main
    snap = ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json"
    assert _main(["inventory", "--snapshot", str(snap), "--json"]) == 0
    full = _json.loads(capsys.readouterr().out)
    lost = full["gpus"][3]["pci_bus_id"]
    ov = tmp_path / "ov.json"
    ov.write_text(_json.dumps({"gpus": {lost: {"lost": True}}}))
    assert _main(["inventory", "--snapshot", str(snap), "--overlay", str(ov), "--json"]) == 0
    faulty = _json.loads(capsys.readouterr().out)
    assert [g["pci_bus_id"] for g in faulty["gpus"]] == [g["pci_bus_id"] for g in full["gpus"] if g["pci_bus_id"] != lost]
    # A lost GPU cannot even report its bus id, so the note names its index.
    assert any("GPU index 3" in n and "GPU_IS_LOST" in n for n in faulty["notes"])


def test_overlay_without_snapshot_is_usage_error(tmp_path, capsys) -> None:
    from slurm_gpu.cli import main as _main
    ov = tmp_path / "ov.json"
    ov.write_text("{}")
    assert _main(["inventory", "--overlay", str(ov)]) == 2
    assert capsys.readouterr().err.startswith("slurm-gpu: --overlay needs --snapshot")
