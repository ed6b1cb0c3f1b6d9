#!/opt/slurm-gpu/venv/bin/python
"""Regenerate (or, with --check, compare) the golden config files.

Run by hand after an intended change, review the diff, commit.  The tests
never write here.
"""
from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def machine_options(name: str):  # -> GresOptions
    from slurm_gpu.confgen import GresOptions
    from slurm_gpu.confgen.pciids import load_nvidia_names

    type_map = {}
    if name == "power9-6xv100":
        # The hwloc test tarball zeroed the PCI vendor/device ids; these are
        # Tesla V100-SXM2-16GB (see the machine's PROVENANCE.md).
        type_map = {"0x0000": "tesla_v100-sxm2-16gb"}
    return GresOptions(pci_names=load_nvidia_names(str(HERE / "nvidia.pci.ids")), type_map=type_map)


def machine_source(name: str) -> str:
    from machinedata import machine_dir

    d = machine_dir(name)
    f = d / "snapshot.json" if (d / "snapshot.json").is_file() else d / "hwloc.xml"
    return str(f.relative_to(ROOT))


def golden_outputs() -> dict[str, Callable[[], str]]:
    """File name -> function producing its text."""
    from machinedata import all_machines, load_machine

    from slurm_gpu.confgen import render_gres_conf
    from slurm_gpu.confgen import ibnet, topology, tree

    out: dict[str, Callable[[], str]] = {}
    for m in all_machines():
        out[f"{m}.gres.conf"] = (lambda m=m: render_gres_conf(
            {m: load_machine(m)}, options=machine_options(m), inputs=[f"{m}={machine_source(m)}"]))
    dump = ROOT / "tests" / "data" / "ibnetdiscover" / "topograph-example.out"

    def topo(fmt: str) -> str:
        t = tree.build_tree([ibnet.parse_file(str(dump))])
        return topology.render_topology(t, None, fmt=fmt,
                                        inputs=[f"ibnetdiscover {dump.relative_to(ROOT)}"])

    out["topograph-example.topology.conf"] = lambda: topo("conf")
    out["topograph-example.topology.yaml"] = lambda: topo("yaml")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="only report files that would change")
    args = ap.parse_args()
    changed = 0
    for name, make in golden_outputs().items():
        path = HERE / name
        text = make()
        old = path.read_text() if path.exists() else ""
        if old == text:
            continue
        changed += 1
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                       f"a/{name}", f"b/{name}"))
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
