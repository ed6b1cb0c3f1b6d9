"""gres.conf over every recorded machine: golden files, check round-trips, hwloc-calc oracle."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from machinedata import ROOT, all_machines, hwloc_machines, machine_xml

sys.path.insert(0, str(ROOT / "tests" / "data" / "golden"))
import regenerate  # noqa: E402  (the golden generator: same options the goldens were made with)

from slurm_gpu.cli import main  # noqa: E402
from slurm_gpu.confgen import render_gres_conf  # noqa: E402
from slurm_gpu.confgen.grescheck import compare, parse_gres_conf  # noqa: E402
from slurm_gpu.confgen.hostlist import expand_files  # noqa: E402
from slurm_gpu.confgen.slurmconf import records  # noqa: E402

GOLDEN = ROOT / "tests" / "data" / "golden"
HWLOC_CALC = shutil.which("hwloc-calc") or "/usr/bin/hwloc-calc"


def rendered(name: str) -> str:
    return regenerate.golden_outputs()[f"{name}.gres.conf"]()


def test_every_machine_has_a_golden_file() -> None:
    missing = [m for m in all_machines() if not (GOLDEN / f"{m}.gres.conf").is_file()]
    assert not missing, f"run tests/data/golden/regenerate.py and review: {missing}"


@pytest.mark.parametrize("name", all_machines())
def test_render_equals_golden(name: str) -> None:
    golden = GOLDEN / f"{name}.gres.conf"
    if not golden.is_file():
        pytest.fail(f"no golden file for {name}")
    assert rendered(name) == golden.read_text()


@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("*.gres.conf")), ids=lambda p: p.stem)
def test_check_round_trips_golden(golden: Path) -> None:
    name = golden.name[:-len(".gres.conf")]
    text = golden.read_text()
    # Meaning survives a parse of the golden file against a fresh render...
    assert compare(parse_gres_conf(text.splitlines(True), str(golden)),
                   parse_gres_conf(rendered(name).splitlines(True), "generated")) == []
    # ...and the CLI agrees (exit 0), using the machine's own input.
    d = ROOT / "tests" / "data" / "machines" / name
    src = ["--snapshot", str(d / "snapshot.json")] if (d / "snapshot.json").is_file() else \
        ["--hwloc-xml", str(d / "hwloc.xml")]
    extra = ["--type-map", "0x0000=tesla_v100-sxm2-16gb"] if name == "power9-6xv100" else []
    rc = main(["gres", "check", "--config", str(golden), *src, "--node", name,
               "--pci-ids", str(GOLDEN / "nvidia.pci.ids"), *extra])
    assert rc == 0


@pytest.mark.parametrize("name", all_machines())
def test_slurm_syntax_of_every_line(name: str) -> None:
    """Every non-comment line is Slurm key=value with ranges Slurm's hostlist code reads."""
    text = rendered(name)
    for rec in records(text.splitlines(True), name):
        keys = [k for k, _ in rec.fields]
        assert keys[0] in ("nodename", "autodetect")
        for k, v in rec.fields:
            if k == "file":
                assert v.startswith("/dev/nvidia") and all(p.startswith("/dev/nvidia") for p in expand_files(v))
            if k == "cores":
                assert all(part.replace("-", "").isdigit() for part in v.split(","))


def _calc(xml: str, bus: str) -> list[int]:
    out = subprocess.run([HWLOC_CALC, "-i", xml, "--li", "--intersect", "core", f"pci={bus}"],
                         capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    return [int(x) for x in out.split(",") if x]


@pytest.mark.parametrize("name", hwloc_machines())
def test_cores_equal_hwloc_calc(name: str) -> None:
    """Cores= of /dev/nvidiaN (GPUs in PCI bus order) == hwloc-calc --li --intersect core pci=<bus>."""
    from slurm_gpu.hw import HwlocXml, load_node

    node = load_node(HwlocXml(str(machine_xml(name)), hostname=name))
    text = render_gres_conf({name: node}, options=regenerate.machine_options(name))
    from slurm_gpu.confgen.grescheck import NodeGres
    conf = parse_gres_conf(text.splitlines(True), name).get(name, NodeGres())
    files = [k[1] for k in conf.devices]          # insertion order = line order
    gpus = sorted(node.gpus, key=lambda g: g.pci_bus_id)
    assert len(files) == len(gpus)
    for f, g in zip(files, gpus):
        assert f == f"/dev/nvidia{g.minor}"
        assert list(conf.devices[("gpu", f)].cores) == _calc(str(machine_xml(name)), g.pci_bus_id), f
