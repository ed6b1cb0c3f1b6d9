"""GPU types from hwloc XML alone: NVIDIA's name table by PCI device and subsystem id.

Debian 12's pci.ids lacks H200, B200, L40S and RTX PRO 6000 Blackwell; the
shipped table (slurm_gpu/data/nvidia_gpu_names.json, from NVIDIA's driver
sources) names them as the driver and NVML do, so ``gres render
--hwloc-xml`` writes the Type= slurmd's AutoDetect would.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from machinedata import ROOT, machine_dir, machine_xml
from slurm_gpu.cli import main

PCI = str(ROOT / "tests" / "data" / "golden" / "nvidia.pci.ids")      # Debian's NVIDIA block
EDITED = ROOT / "tests" / "data" / "hwloc-edited" / "pci-2n6c-h200-b200-l40s.xml"
H200 = 'pci_type="0302 [10de:2335] [10de:18be] a1"'


def render(capsys, xml: Path, *extra: str) -> tuple[int, str, str]:
    rc = main(["gres", "render", "--hwloc-xml", f"n1={xml}", "--pci-ids", PCI, *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def edited(tmp_path: Path, pci_type: str) -> Path:
    """The edited real XML with its H200 (0000:06:00.0) given another PCI id."""
    text = EDITED.read_text()
    assert text.count(H200) == 1
    p = tmp_path / "edited.xml"
    p.write_text(text.replace(H200, pci_type))
    return p


def test_debian_pci_ids_lacks_these_gpus() -> None:
    """The premise: pci.ids alone cannot name them (why the table exists)."""
    from slurm_gpu.confgen.pciids import load_nvidia_names
    names = load_nvidia_names(PCI)
    for dev in (0x2335, 0x233B, 0x2901, 0x26B9, 0x2BB5, 0x2BB1, 0x2BB4):
        assert dev not in names


def test_h200_b200_l40s_from_hwloc_xml_alone(capsys) -> None:
    rc, out, err = render(capsys, EDITED)
    assert rc == 0, err
    lines = [l for l in out.splitlines() if l.startswith("NodeName=")]
    # one line per type, in bus-id order (06 H200, 11 L40S, 14 B200) and its minor
    assert lines == ["NodeName=n1 Name=gpu Type=nvidia_h200 File=/dev/nvidia0 Cores=0-5",
                     "NodeName=n1 Name=gpu Type=nvidia_l40s File=/dev/nvidia1 Cores=6-11",
                     "NodeName=n1 Name=gpu Type=nvidia_b200 File=/dev/nvidia2 Cores=6-11"]


@pytest.mark.parametrize("pci_type,gpu_type", [
    ('pci_type="0302 [10de:233b] [10de:1996] a1"', "nvidia_h200_nvl"),
    ('pci_type="0302 [10de:2bb5] [10de:204e] a1"', "nvidia_rtx_pro_6000_blackwell_server_edition"),
    ('pci_type="0302 [10de:2bb1] [17aa:204b] a1"', "nvidia_rtx_pro_6000_blackwell_workstation_edition"),
    ('pci_type="0302 [10de:2bb4] [1028:204c] a1"', "nvidia_rtx_pro_6000_blackwell_max-q_workstation_edition"),
    ('pci_type="0302 [10de:2342] [10de:1809] a1"', "nvidia_gh200_480gb"),
    ('pci_type="0302 [10de:2342] [10de:16eb] a1"', "nvidia_gh200_120gb"),
    # the driver's subsystem-less row matches any subsystem; an exact row wins
    ('pci_type="0302 [10de:20b0] [10de:134f] a1"', "nvidia_a100-sxm4-40gb"),
    ('pci_type="0302 [10de:20b0] [10de:1450] a1"', "nvidia_a100-pg509-200"),
])
def test_subsystem_picks_the_name(capsys, tmp_path, pci_type: str, gpu_type: str) -> None:
    rc, out, err = render(capsys, edited(tmp_path, pci_type))
    assert rc == 0, err
    assert f"NodeName=n1 Name=gpu Type={gpu_type} File=/dev/nvidia0 Cores=0-5" in out


def test_mig_type_of_a_table_named_gpu() -> None:
    """MIG types cut the parent at its first '-' as gpu_nvml.c does."""
    import dataclasses
    from slurm_gpu.confgen import naming
    from slurm_gpu.hw import HwlocXml, load_node
    from slurm_gpu.hw.model import MigInstance
    g = load_node(HwlocXml(str(EDITED))).gpus[0]
    assert naming.gpu_type(g) == "nvidia_h200"
    fields = {f.name: 0 for f in dataclasses.fields(MigInstance)}
    mig = MigInstance(**{**fields, "profile": "1g.18gb", "uuid": "MIG-x"})
    assert naming.mig_type(naming.gpu_type(g), mig) == "nvidia_h200_1g.18gb"


@pytest.mark.parametrize("pci_type,why", [
    # a device id in neither the table nor pci.ids
    ('pci_type="0302 [10de:2dff] [10de:0000] a1"', "unknown GPU 10de:2dff at 0000:06:00.0: no NVML name"),
    # a known device with a subsystem NVIDIA's table does not list: the driver says "Unknown"
    ('pci_type="0302 [10de:2335] [1028:abcd] a1"',
     "unknown GPU 10de:2335 (subsystem 1028:abcd) at 0000:06:00.0: no NVML name, NVIDIA's name table "
     "lists this device only with subsystems 10de:18be, 10de:18bf, and it is not in pci.ids"),
])
def test_unknown_ids_still_refused(capsys, tmp_path, pci_type: str, why: str) -> None:
    rc, out, err = render(capsys, edited(tmp_path, pci_type))
    assert rc != 0 and out == ""
    assert err.startswith(f"slurm-gpu: {why}"), err
    assert "--type-map" in err and "Traceback" not in err


def test_type_map_still_names_an_unknown_subsystem(capsys, tmp_path) -> None:
    xml = edited(tmp_path, 'pci_type="0302 [10de:2335] [1028:abcd] a1"')
    rc, out, err = render(capsys, xml, "--type-map", "0x2335=h200")
    assert rc == 0, err
    assert "NodeName=n1 Name=gpu Type=h200 File=/dev/nvidia0 Cores=0-5" in out


def test_no_pci_ids_file_needed_when_the_table_names_every_gpu(capsys, tmp_path) -> None:
    rc, out, err = main(["gres", "render", "--hwloc-xml", f"n1={EDITED}",
                         "--pci-ids", str(tmp_path / "absent.ids")]), *capsys.readouterr()
    assert rc == 0, err
    assert "Type=nvidia_b200" in out


# Machines whose PCI subsystem ids and NVML names are both real (PROVENANCE.md),
# plus those whose GPUs' ids are published: hwloc alone must give NVML's type.
@pytest.mark.parametrize("name", ["h100-sxm-8x", "a100-sxm4-minors", "mini-2numa", "dgx-h100",
                                  "dgx-a100-permuted", "gb200-nvl", "h100-mig", "epyc-a100-8numa"])
def test_hwloc_only_type_equals_nvml_type(tmp_path, name: str) -> None:
    from slurm_gpu.confgen import naming
    from slurm_gpu.hw import HwlocXml, Snapshot, load_node
    nvml = load_node(Snapshot(str(machine_dir(name) / "snapshot.json")))
    text = machine_xml(name).read_text()
    stripped = re.sub(r'<info name="GPUModel" value="[^"]*" ?/>', "", text)
    assert stripped != text
    xml = tmp_path / "hwloc.xml"
    xml.write_text(stripped)
    alone = load_node(HwlocXml(str(xml)))
    assert [g.name for g in alone.gpus] == [None] * len(nvml.gpus)
    by_bus = {g.pci_bus_id: naming.gpu_type(g) for g in nvml.gpus}
    assert {g.pci_bus_id: naming.gpu_type(g) for g in alone.gpus} == by_bus


def test_table_is_well_formed() -> None:
    from slurm_gpu.paths import data_file
    doc = json.loads(data_file("nvidia_gpu_names.json").read_text())
    assert doc["schema"] == 1
    prov = doc["provenance"]
    assert prov["repository"] == "NVIDIA/open-gpu-kernel-modules" and re.fullmatch(r"[0-9a-f]{40}", prov["commit"])
    seen = set()
    for e in doc["gpus"]:
        key = (e["device"], e["subsystem"])
        assert key not in seen
        seen.add(key)
        assert re.fullmatch(r"0x[0-9a-f]{4}", e["device"])
        assert e["subsystem"] is None or re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{4}", e["subsystem"])
        # a name that is a safe gres.conf Type once underscorified
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._-]*", e["name"]), e
        assert re.fullmatch(r"[0-9]+(\.[0-9]+)+", e["since"])
    # the models the issue names
    names = {(e["device"], e["subsystem"]): e["name"] for e in doc["gpus"]}
    assert names[("0x2335", "10de:18be")] == "NVIDIA H200"
    assert names[("0x233b", "10de:1996")] == "NVIDIA H200 NVL"
    assert names[("0x2901", "10de:1999")] == "NVIDIA B200"
    assert names[("0x26b9", "10de:1851")] == "NVIDIA L40S"
    assert names[("0x2bb5", "10de:204e")] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
