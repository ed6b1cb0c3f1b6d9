"""The sandbox's per-node NVML simulator and MPS control binary, and the machines the devkit ships."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from slurm_gpu.errors import InputError, UsageError
from slurm_gpu_devkit import MACHINES_DIR
from slurm_gpu_devkit.sandbox import nodesim
from slurm_gpu_devkit.sandbox.layout import Layout
from slurm_gpu_devkit.sandbox.machine import resolve
from configfile import use_config
from paths import ROOT

MACHINES = MACHINES_DIR


def test_recorded_machines_ship_in_the_devkit_with_provenance() -> None:
    names = sorted(p.name for p in MACHINES.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert {"h100-mig", "h100-sxm-8x", "dgx-h100", "mini-2numa", "dgx2"} <= set(names)
    for n in names:
        assert (MACHINES / n / "PROVENANCE.md").is_file(), n
    # The checkout's tests/data/machines is the same directory, not a copy.
    tests_dir = ROOT / "tests" / "data" / "machines"
    assert tests_dir.resolve() == MACHINES.resolve()


def test_a_machine_name_resolves_from_any_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SLURM_GPU_MACHINES", raising=False)
    m = resolve("h100-mig")
    assert m.directory == (MACHINES / "h100-mig").resolve()
    assert m.snapshot is not None and m.snapshot.name == "snapshot.json"
    with pytest.raises(InputError, match="unknown machine 'no-such-box'"):
        resolve("no-such-box")


def _state(machine: str) -> dict:
    from slurm_gpu_devkit.sim.state import new_state, load_facts
    return new_state(load_facts(str(MACHINES / machine / "facts.json")))


def test_per_job_mig_turns_on_free_gpus_and_keeps_recorded_instances() -> None:
    st = _state("h100-mig")
    assert nodesim.per_job_mig(st) == 2
    assert [(g["mig"]["mode"], g["mig"]["pending"], len(g["mig"]["instances"]))
            for g in st["facts"]["gpus"]] == [(1, 1, 0), (1, 1, 0), (1, 1, 4), (1, 1, 4)]


def test_per_job_mig_leaves_gpus_without_mig_alone() -> None:
    st = _state("dgx2")                # V100: no MIG at all
    assert nodesim.per_job_mig(st) == 0
    assert all("mig" not in g for g in st["facts"]["gpus"])


def test_available_only_with_nvml_facts() -> None:
    assert nodesim.available(MACHINES / "h100-mig")
    assert not nodesim.available(MACHINES / "uv-24numa")     # hwloc XML only
    assert not nodesim.available(None)
    assert nodesim.caller_configured({"node": {"nvml": "sim:/x"}})
    assert not nodesim.caller_configured({"node": {"state_dir": "/x"}, "mps": {}})


def test_prepare_writes_one_state_per_node_and_the_stand_in(tmp_path: Path) -> None:
    L = Layout.of(tmp_path / "sb")
    for d in (L.root, *L.dirs()):
        d.mkdir(parents=True)
    keys = nodesim.prepare(L, MACHINES / "mini-2numa", ["n1", "n2"], tmp_path / "no-venv")
    assert keys == {"node": {"nvml": f"sim:{L.var}/%n/sim.json"},
                    "mps": {"control": f"{L.lib}/nvidia-cuda-mps-control",
                            "base_dir": f"{L.var}/%n/mps"},
                    "health": {"kernel_log": f"{L.var}/%n/kernel.log", "fabric_root": f"{L.var}/%n/fabric",
                               "baseline": str(MACHINES / "mini-2numa" / "baseline.json")}}
    # Each node's healthy fabric root: up a day, one ACTIVE InfiniBand port (docs/health.md).
    assert (L.var / "n2" / "fabric" / "proc" / "uptime").read_text().startswith("86400")
    assert (L.var / "n2" / "fabric/sys/class/infiniband/mlx5_0/ports/1/state").read_text() == "4: ACTIVE\n"
    for n in ("n1", "n2"):   # each node's simulated kernel ring buffer: root's, empty
        st_ = (L.var / n / "kernel.log").stat()
        assert st_.st_size == 0 and st_.st_mode & 0o777 == 0o600
    a = json.loads((L.var / "n1" / "sim.json").read_text())
    b = json.loads((L.var / "n2" / "sim.json").read_text())
    assert a == b and [g["mig"]["mode"] for g in a["facts"]["gpus"]] == [1, 1]
    assert a["hwloc_xml"]                               # the whole machine, CPUs included
    for n in ("n1", "n2"):
        assert stat.S_IMODE(os.stat(L.var / n / "sim.json").st_mode) == 0o644
        assert stat.S_IMODE(os.stat(L.var / n / "mps").st_mode) == 0o755
    assert os.access(L.lib / "nvidia-cuda-mps-control", os.X_OK)


def test_prepare_installs_nvidias_real_mps_control_when_fetched(tmp_path: Path,
                                                               monkeypatch) -> None:
    """The sandbox runs NVIDIA's binary (scripts/fetch-mps.sh); the Python
    stand-in only when it was never fetched."""
    from mpsbinary import real_mps_control
    real = real_mps_control()
    L = Layout.of(tmp_path / "sb")
    for d in (L.root, *L.dirs()):
        d.mkdir(parents=True)
    nodesim.prepare(L, MACHINES / "mini-2numa", ["n1"], tmp_path / "no-venv")
    ctl = L.lib / "nvidia-cuda-mps-control"
    assert ctl.read_bytes() == real.read_bytes() and os.access(ctl, os.X_OK)
    monkeypatch.setenv("SLURM_GPU_MPS_CACHE", str(tmp_path / "empty-cache"))
    nodesim.prepare(L, MACHINES / "mini-2numa", ["n1"], tmp_path / "no-venv")
    assert b"slurm-gpu stand-in" in ctl.read_bytes()


def test_prepare_recorded_keeps_mig_as_recorded(tmp_path: Path) -> None:
    L = Layout.of(tmp_path / "sb")
    for d in (L.root, *L.dirs()):
        d.mkdir(parents=True)
    nodesim.prepare(L, MACHINES / "h100-mig", ["n1"], tmp_path, mig="recorded")
    st = json.loads((L.var / "n1" / "sim.json").read_text())
    assert [g["mig"]["mode"] for g in st["facts"]["gpus"]] == [0, 0, 1, 1]
    with pytest.raises(UsageError, match="MIG mode must be one of per-job, recorded"):
        nodesim.prepare(L, MACHINES / "h100-mig", ["n1"], tmp_path, mig="all")


def test_mps_base_dir_expands_the_node_name(tmp_path: Path, monkeypatch) -> None:
    from slurm_gpu import config
    from slurm_gpu.hw import live
    from slurm_gpu.jobs.settings import load
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text('[mps]\nbase_dir = "/run/x/%n/mps"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    config.clear_cache()
    live.use_node_name("n7")
    try:
        assert load()[1].base_dir == "/run/x/n7/mps"
    finally:
        live.use_node_name(None)
        config.clear_cache()


def test_set_fault_reaches_the_node_and_clears(tmp_path: Path) -> None:
    from slurm_gpu.errors import SlurmGpuError
    from slurm_gpu_devkit.sim import open_sim
    L = Layout.of(tmp_path / "sb")
    for d in (L.root, *L.dirs()):
        d.mkdir(parents=True)
    nodesim.prepare(L, MACHINES / "mini-2numa", ["n1", "n2"], tmp_path)
    ecc = {"calls": [{"fn": "nvmlDeviceGetTotalEccErrors", "gpu": 0, "args": [1, 0], "result": 3}]}
    nodesim.set_fault(L, "n2", ecc)
    n1, n2 = (open_sim(str(L.var / n / "sim.json")) for n in ("n1", "n2"))
    assert n2.nvmlDeviceGetTotalEccErrors(n2.nvmlDeviceGetHandleByIndex(0), 1, 0) == 3
    assert n1.nvmlDeviceGetTotalEccErrors(n1.nvmlDeviceGetHandleByIndex(0), 1, 0) == 0
    nodesim.set_fault(L, "n2", {})
    assert n2.nvmlDeviceGetTotalEccErrors(n2.nvmlDeviceGetHandleByIndex(0), 1, 0) == 0
    # A fabric drill writes its files into the node's fabric root; clearing restores it.
    port = L.var / "n2" / "fabric/sys/class/infiniband/mlx5_0/ports/1/state"
    nodesim.drill(L, "n2", "ib-port-down", 0)
    assert port.read_text() == "1: DOWN\n"
    assert (L.var / "n1" / "fabric/sys/class/infiniband/mlx5_0/ports/1/state").read_text() == "4: ACTIVE\n"
    nodesim.set_fault(L, "n2", {})
    assert port.read_text() == "4: ACTIVE\n"
    with pytest.raises(UsageError, match="fault fabric-clique-lost does not apply to n2 GPU 0: it needs a GPU "
                                         "in a multi-node NVLink domain"):
        nodesim.drill(L, "n2", "fabric-clique-lost", 0)
    with pytest.raises(InputError, match="bad overlay"):
        nodesim.set_fault(L, "n2", {"gpu": {}})
    with pytest.raises(SlurmGpuError, match="node n3 has no NVML simulator"):
        nodesim.set_fault(L, "n3", {})
    with pytest.raises(UsageError, match="bad node name"):
        nodesim.set_fault(L, "../n1", {})


def test_fabric_degraded_drill_reaches_the_nodes_nvml_and_warns_until_cleared(tmp_path: Path, monkeypatch,
                                                                              capsys) -> None:
    """`sandbox fault NODE fabric-degraded` as the sandbox node's own health
    check sees it (its `[node] nvml = "sim:..."`, its fabric root): the
    documented warnings, no drain; cleared, they go."""
    from slurm_gpu import config
    from slurm_gpu.cli import main
    from slurm_gpu_devkit.sim import drills
    L = Layout.of(tmp_path / "sb")
    for d in (L.root, *L.dirs()):
        d.mkdir(parents=True)
    nodesim.prepare(L, MACHINES / "gb200-nvl", ["n1", "n2"], tmp_path)
    node = L.var / "n2"
    use_config(monkeypatch, tmp_path / "slurm-gpu.toml",
               f'[node]\nnvml = "sim:{node}/sim.json"\nstate_dir = "{tmp_path}/state"\n[health]\n'
               f'kernel_log = "{node}/kernel.log"\nfabric_root = "{node}/fabric"\n'
               f'baseline = "{tmp_path}/none.json"\n')

    def fabric_findings() -> tuple[str, list[str]]:
        main(["health", "--no-drain", "--json", "--node", "n2"])
        doc = json.loads(capsys.readouterr().out)
        return doc["status"], sorted(f"{f['check']}: {f['message']}" for f in doc["findings"]
                                     if f["check"].startswith("gpu.fabric") and f["severity"] != "info")

    try:
        assert fabric_findings()[1] == []
        bus, reason = nodesim.drill(L, "n2", "fabric-degraded", 3)
        assert reason == ""                                   # nothing to drain with
        assert fabric_findings() == ("warn", sorted(drills.DRILLS["fabric-degraded"].warnings_for(bus)))
        nodesim.set_fault(L, "n2", {})
        assert fabric_findings()[1] == []
    finally:
        config.clear_cache()


def test_set_values_parse_toml_inline_tables() -> None:
    from slurm_gpu_devkit.commands.sandbox import config_settings

    def value(text: str) -> object:
        """What ``sandbox up --set s.k=TEXT`` sets s.k to."""
        return config_settings((f"s.k={text}",))["s"]["k"]

    assert value('{"1" = 0}') == {"1": 0}
    assert value("[1, 2]") == [1, 2]
    assert value("5") == 5 and value("true") is True and value("/x") == "/x"
    with pytest.raises(UsageError, match="bad TOML value"):
        value("{oops")
    assert config_settings(("mps.a=1", "mps.b=x", "health.c=false")) == {"mps": {"a": 1, "b": "x"},
                                                                        "health": {"c": False}}
    with pytest.raises(UsageError, match="expected SECTION.KEY=VALUE"):
        config_settings(("nodot=1",))
