"""The fabric fault drills (issue 28): each one, injected as the sandbox injects
it (an NVML overlay and/or files of the node's fabric root), drains with the
drain reason docs/health.md shows once its debounce count is reached, not
before, not inside the boot grace, and resumes when cleared.  Acting runs of
the real CLI against a fake scontrol (tests/unit/health/test_health_drain.py's)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slurm_gpu import runner
from slurm_gpu.cli import main
from slurm_gpu_devkit.sim import drills

from test_health_drain import FakeSlurm, capture
from configfile import use_config
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"
# Each drill on a machine it fits: local NVSwitches for Fabric Manager, a
# multi-node NVLink domain for the clique and node-wide IMEX.
WHERE = {"nvlink-down": ("h100-sxm-8x", 2), "nvlink-downtrained": ("h100-sxm-8x", 5),
         "fabric-clique-lost": ("gb200-nvl", 1), "pcie-downtrained": ("h100-sxm-8x", 0),
         "fabricmanager-down": ("h100-sxm-8x", 0), "imex-down": ("gb200-nvl", 0),
         "ib-port-down": ("h100-sxm-8x", 0), "ib-errors-rising": ("h100-sxm-8x", 0)}
# The drills whose fault is degradation, not proof of one: they warn, never drain.
WARN_ONLY = {"fabric-degraded": ("gb200-nvl", 2)}
GRACE = {"nvlink-down", "nvlink-downtrained", "fabric-clique-lost", "imex-down", "fabricmanager-down",
         "ib-port-down", "ib-errors-rising"}


class Node:
    def __init__(self, tmp: Path, machine: str, monkeypatch, capsys) -> None:
        self.tmp, self.machine, self.capsys = tmp, machine, capsys
        self.facts = json.loads((MACHINES / machine / "facts.json").read_text())
        self.root = tmp / "root"
        self.base = drills.fabric_root_files(self.facts, node_wide_imex=machine == "gb200-nvl")
        drills.write_files(str(self.root), self.base)
        (tmp / "kernel.log").write_text("")
        self.overlay = tmp / "ov.json"
        self.overlay.write_text("{}")
        use_config(monkeypatch, tmp / "slurm-gpu.toml",
                   f'[node]\nstate_dir = "{tmp}/state"\n[health]\nkernel_log = "{tmp}/kernel.log"\n'
                   f'fabric_root = "{self.root}"\nbaseline = "{tmp}/none.json"\nclean_runs_to_resume = 1\n')
        self.slurm = FakeSlurm(capture("idle"))
        monkeypatch.setattr(runner, "run", self.slurm.run)

    def run(self) -> dict:
        main(["health", "--json", "--node", "n1", "--snapshot", str(MACHINES / self.machine / "snapshot.json"),
              "--overlay", str(self.overlay)])
        return json.loads(self.capsys.readouterr().out)

    @property
    def reason(self) -> str | None:
        m = re.search(r" Reason=(.*) \[root@", self.slurm.text)
        return m.group(1) if m and "DRAIN" in self.slurm.text else None

    def inject(self, d: drills.Drill, bus: str) -> None:
        self.overlay.write_text(json.dumps(d.overlay_for(bus)))
        drills.write_files(str(self.root), d.files())

    def clear(self) -> None:
        self.overlay.write_text("{}")
        drills.write_files(str(self.root), self.base)


@pytest.mark.parametrize("name", list(WHERE))
def test_fabric_drill_drains_after_its_debounce_and_resumes(tmp_path, monkeypatch, capsys, name):
    d = drills.DRILLS[name]
    assert d.fabric
    machine, gpu = WHERE[name]
    node = Node(tmp_path, machine, monkeypatch, capsys)
    bus = drills.gpu_bus(node.facts, gpu)
    assert node.run()["status"] != "drain" and node.reason is None       # healthy first: ports seen up
    node.inject(d, bus)
    for i in range(1, d.runs):
        doc = node.run()
        assert doc["status"] == "warn" and node.reason is None, (i, doc)
        assert any(f"seen in {i} of the {d.runs} runs" in f["message"] for f in doc["findings"]), doc
    doc = node.run()
    assert doc["status"] == "drain", doc
    assert d.matches(node.reason, bus, gpu), (node.reason, doc)
    node.clear()
    node.run()
    assert node.reason is None and "DRAIN" not in node.slurm.text


@pytest.mark.parametrize("name", list(WARN_ONLY))
def test_warn_only_drill_warns_with_its_documented_text_never_drains_and_clears(tmp_path, monkeypatch, capsys, name):
    """fabric-degraded: NVML's fabric health mask says degraded bandwidth and
    the v3 summary says limited capacity, as a real degraded fabric shows
    both; every acting run warns with the texts docs/health.md shows, none
    drains (past every debounce count and outside the boot grace), and once
    cleared the warnings go."""
    d = drills.DRILLS[name]
    assert d.fabric and not d.drains and d.warns
    machine, gpu = WARN_ONLY[name]
    node = Node(tmp_path, machine, monkeypatch, capsys)
    bus = drills.gpu_bus(node.facts, gpu)
    fabric_checks = {"gpu.fabric", "gpu.fabric_registration"}

    def warnings(doc: dict) -> list[str]:
        return sorted(f"{f['check']}: {f['message']}" for f in doc["findings"]
                      if f["check"] in fabric_checks and f["severity"] != "info")

    assert warnings(node.run()) == [] and node.reason is None
    node.inject(d, bus)
    for _ in range(4):
        doc = node.run()
        assert doc["status"] == "warn" and node.reason is None, doc
        assert warnings(doc) == sorted(d.warnings_for(bus)), doc
    assert "DRAIN" not in node.slurm.text and d.matches(node.reason, bus, gpu)
    doc_text = (ROOT / "docs" / "health.md").read_text()
    shown = [w.replace(": ", " [BUS]: ", 1) for w in d.warnings_for("BUS")]   # the text output's form
    assert all(f"warn  {w}" in doc_text for w in shown), "docs/health.md shows each warning"
    node.clear()
    doc = node.run()
    assert warnings(doc) == [] and node.reason is None and "DRAIN" not in node.slurm.text, doc


@pytest.mark.parametrize("name", sorted(GRACE))
def test_fabric_drill_inside_boot_grace_does_not_drain(tmp_path, monkeypatch, capsys, name):
    d = drills.DRILLS[name]
    machine, gpu = WHERE[name]
    node = Node(tmp_path, machine, monkeypatch, capsys)
    bus = drills.gpu_bus(node.facts, gpu)
    node.run()
    drills.write_files(str(node.root), {"proc/uptime": "42.00 300.00\n"})   # rebooted 42 s ago
    node.inject(d, bus)
    for _ in range(d.runs):
        doc = node.run()
        assert doc["status"] == "warn" and node.reason is None, doc
        assert any("boot grace: 558 s left" in f["message"] for f in doc["findings"]), doc


def test_a_drill_says_which_machines_it_fits():
    hgx = json.loads((MACHINES / "h100-sxm-8x" / "facts.json").read_text())
    gb = json.loads((MACHINES / "gb200-nvl" / "facts.json").read_text())
    a100 = json.loads((MACHINES / "dgx-a100-permuted" / "facts.json").read_text())
    clique, fm, down = (drills.DRILLS[n] for n in ("fabric-clique-lost", "fabricmanager-down", "nvlink-down"))
    assert clique.applies(gb, 0) is None and "multi-node NVLink domain" in clique.applies(hgx, 0)
    assert fm.applies(hgx, 0) is None and fm.applies(gb, 0) == "needs NVSwitches on the node"
    assert down.applies(hgx, 1) is None and down.applies(a100, 1) == "needs a GPU with 18 NVLinks (this one has 12)"
    assert drills.DRILLS["fabric-degraded"].applies(hgx, 0) == clique.applies(hgx, 0)
    for name, (machine, gpu) in {**WHERE, **WARN_ONLY}.items():
        facts = json.loads((MACHINES / machine / "facts.json").read_text())
        assert drills.DRILLS[name].applies(facts, gpu) is None, name


def test_listing_names_every_fabric_drill():
    text = drills.listing()
    assert {n for n, d in drills.DRILLS.items() if d.fabric} == {*WHERE, *WARN_ONLY}
    for name in [*WHERE, *WARN_ONLY]:
        assert re.search(rf"^{re.escape(name)} ", text, re.M), name
