"""The fabric checks (issue 28 §2) over recorded machines, real sysfs captures
(tests/data/ib, prometheus/procfs) and fixture trees: values against the
baseline, product-aware daemons, "not applicable", debounce and boot grace."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from slurm_gpu.cli import main
from slurm_gpu.errors import InputError
from slurm_gpu.health import baseline, engine, fabric, ib, services
from slurm_gpu.health.fabric_state import settle
from slurm_gpu.health.findings import DRAIN, INFO, WARN, Finding
from slurm_gpu.health.settings import HealthSettings
from slurm_gpu.hw.ib import read_ports
from slurm_gpu_devkit.sim import drills

from slurm_gpu.hw.nvml_health import read_health

from test_health_checks import gather, replay
from paths import ROOT

IB = ROOT / "tests" / "data" / "ib" / "procfs"
NDR = ROOT / "tests" / "data" / "ib" / "gpud-h100"         # an H100 node's NDR tree (tests/data/ib/README.md)
MACHINES = ROOT / "tests" / "data" / "machines"


pytestmark = pytest.mark.usefixtures("isolated_config")


# ------------------------------------------------------------ InfiniBand

def test_real_sysfs_capture_reads_every_port():
    ports = read_ports(str(IB))
    assert sorted(ports) == ["hfi1_0/1", "mlx4_0/1", "mlx4_0/2", "mlx5_0/1"]
    p = ports["mlx4_0/2"]
    assert (p.state, p.phys_state, p.rate, p.width, p.link_layer) == ("ACTIVE", "LinkUp", 40.0, "4X QDR",
                                                                      "InfiniBand")
    assert p.counters == {"link_downed": 0, "symbol_error": 0, "port_rcv_errors": 0}
    assert ports["hfi1_0/1"].rate == 100.0 and ports["mlx5_0/1"].phys_state == "ACTIVE"   # as captured
    assert read_ports(str(IB / "nowhere")) is None


def test_real_ndr_capture_reads_400_gbps_ports_and_leaves_the_roce_port_out(tmp_path):
    """An H100 node's 8 ConnectX-7 NDR ports at 400 Gb/sec (4X NDR) and a
    BlueField-3 RoCE bond at 200 (2X NDR), as captured: the IB check reads
    every IB port, holds each to a 400 Gb/s baseline without a finding, and a
    link_downed counter saturated at 255 (8 bits) is no rise; the baseline a
    node records from it names the InfiniBand ports only."""
    ports = read_ports(str(NDR))
    ib_names = [f"mlx5_{i}/1" for i in (0, 1, 4, 5, 6, 7, 8, 9)]
    assert sorted(ports) == sorted(ib_names + ["mlx5_bond_0/1"])
    for n in ib_names:
        p = ports[n]
        assert (p.state, p.phys_state, p.rate, p.width, p.link_layer) == ("ACTIVE", "LinkUp", 400.0, "4X NDR",
                                                                          "InfiniBand"), n
    bond = ports["mlx5_bond_0/1"]
    assert (bond.rate, bond.width, bond.link_layer) == (200.0, "2X NDR", "Ethernet")
    assert ports["mlx5_1/1"].counters == {"link_downed": 255, "symbol_error": 0, "port_rcv_errors": 14}
    want = {n: 400 for n in ib_names}
    fs, mem = ib.check_ports(ports, want, {}, 100, 1000.0)
    assert fs == [] and sorted(mem) == ib_names                   # the RoCE bond is not ib.port's
    fs, mem = ib.check_ports(read_ports(str(NDR)), want, mem, 100, 1060.0)
    assert fs == []
    fs, _ = ib.check_ports(ports, {**want, "mlx5_4/1": 800}, {}, 100, 0.0)
    assert [(f.check, f.severity, f.message) for f in fs] == [
        ("ib.port", DRAIN, "InfiniBand port mlx5_4/1 at 400 Gb/s (4X NDR), expected 800 Gb/s")]
    # The drills' healthy sandbox port is this capture's port, line for line.
    healthy = drills.fabric_root_files({})
    for f in ("state", "phys_state", "rate", "link_layer"):
        real = (NDR / "sys/class/infiniband/mlx5_0/ports/1" / f).read_text()
        assert healthy[f"{drills.IB_PORT}/{f}"] == real + "\n", f
    # A baseline recorded on this node holds its InfiniBand ports, not the RoCE bond.
    h = gather("h100-sxm-8x")
    (entry,) = baseline.entry_for(h, ports).values()
    assert entry["ib"] == want


def test_ib_ports_against_baseline_and_between_runs(tmp_path):
    root = tmp_path / "r"
    shutil.copytree(IB, root)
    ports = read_ports(str(root))
    fs, mem = ib.check_ports(ports, {"mlx4_0/1": 40, "hfi1_0/1": 200}, {}, 100, 1000.0)
    # A port below its baseline rate names the value, the expected value and the port.
    assert [(f.check, f.severity, f.message) for f in fs] == [
        ("ib.port", DRAIN, "InfiniBand port hfi1_0/1 at 100 Gb/s (4X EDR), expected 200 Gb/s")]
    port = root / "sys/class/infiniband/mlx4_0/ports/2"
    (port / "state").write_text("1: DOWN\n")
    (port / "phys_state").write_text("2: Polling\n")
    (port / "counters/symbol_error").write_text("150\n")
    fs, mem = ib.check_ports(read_ports(str(root)), {}, mem, 100, 1060.0)
    msgs = {(f.check, f.severity, f.message) for f in fs}
    # Seen ACTIVE before this boot's run: expected up, without a baseline.
    assert ("ib.port", DRAIN, "InfiniBand port mlx4_0/2 is DOWN (Polling), expected ACTIVE") in msgs
    assert ("ib.errors", DRAIN, "InfiniBand port mlx4_0/2 errors rising: symbol_error +150, port_rcv_errors +0 "
            "since the last run") in msgs
    fs, mem = ib.check_ports(read_ports(str(root)), {}, mem, 100, 1120.0)
    assert ("ib.port", INFO, "InfiniBand port mlx4_0/2 down for 60 s, 60 s in all this boot") in {
        (f.check, f.severity, f.message) for f in fs}
    assert not [f for f in fs if f.check == "ib.errors"]              # no new errors: no rise
    (port / "counters/symbol_error").write_text("3\n")                # reset: no delta, no alarm
    (port / "state").write_text("4: ACTIVE\n")
    fs, mem = ib.check_ports(read_ports(str(root)), {}, mem, 100, 1180.0)
    assert [f for f in fs if f.severity != INFO] == [] and mem["mlx4_0/2"]["down_total"] == 120.0


def test_ib_port_nobody_expects_is_info_and_no_ib_is_not_applicable(tmp_path):
    root = tmp_path / "r"
    shutil.copytree(IB, root)
    (root / "sys/class/infiniband/mlx5_0/ports/1/state").write_text("1: DOWN\n")
    fs, _ = ib.check_ports(read_ports(str(root)), {}, {}, 100, 0.0)
    assert [(f.severity, f.message) for f in fs] == [
        (INFO, "InfiniBand port mlx5_0/1 is DOWN (ACTIVE); no baseline expects it up")]
    fs, _ = ib.check_ports(None, {}, {}, 100, 0.0)
    assert [(f.check, f.applicable, f.to_json()["not_applicable"]) for f in fs] == [
        ("ib.port", False, True), ("ib.errors", False, True)]


# ------------------------------------------------------------- NVML side

def test_pcie_downtraining_against_max_and_baseline():
    h = gather("h100-sxm-8x", {"calls": [{"fn": "nvmlDeviceGetCurrPcieLinkWidth", "gpu": 2, "result": 8}]})
    bus = h.gpus[2].bus_id
    assert [(f.severity, f.message) for f in fabric.check_pcie_link(h) if f.gpu == bus] == [
        (DRAIN, f"PCIe link of {bus} is x8, expected x16")]
    # A GPU in an x8 slot: NVML's maximum says x8 too; only the baseline sees it.
    slot = gather("h100-sxm-8x", {"calls": [{"fn": "nvmlDeviceGetCurrPcieLinkWidth", "gpu": 2, "result": 8},
                                            {"fn": "nvmlDeviceGetMaxPcieLinkWidth", "gpu": 2, "result": 8}]})
    assert fabric.check_pcie_link(slot) == [] or all(f.gpu != bus for f in fabric.check_pcie_link(slot))
    base = {"models": {h.gpus[2].name: {"pcie_width": 16}}}
    assert [f.message for f in fabric.check_pcie_link(slot, base) if f.gpu == bus] == [
        f"PCIe link of {bus} is x8, expected x16"]


@pytest.mark.parametrize("reasons,severity", [(0x1, INFO), (0x0, DRAIN)])
def test_pcie_generation_drops_only_while_busy(reasons, severity):
    h = gather("h100-sxm-8x", {"calls": [
        {"fn": "nvmlDeviceGetCurrPcieLinkGeneration", "gpu": 1, "result": 1},
        {"fn": "nvmlDeviceGetCurrentClocksEventReasons", "gpu": 1, "result": reasons}]})
    fs = [f for f in fabric.check_pcie_link(h) if f.gpu == h.gpus[1].bus_id]
    assert [f.severity for f in fs] == [severity]
    assert fs[0].message.endswith("(idle)" if severity == INFO else "(busy)")


def test_nvlink_speed_against_peers_and_baseline():
    d = drills.DRILLS["nvlink-downtrained"]
    h0 = gather("h100-sxm-8x")
    bus = h0.gpus[4].bus_id
    h = read_health(replay("h100-sxm-8x", d.overlay_for(bus)), include_nvlink_speed=True)
    g = next(x for x in h.gpus if x.bus_id == bus)
    assert g.nvlink_speeds[3] == 13281 and g.nvlink_speeds[0] == 26562
    assert [f.message for f in fabric.check_nvlink_speed(h)] == [
        f"NVLink downtrained on {bus}: link 3 at 13281 MB/s, expected 26562 MB/s"]
    # The baseline says every link runs at 53125 (all alike degraded here): each one is named.
    base = {"models": {g.name: {"nvlink_speeds_mbps": [53125] * 18}}}
    (f,) = fabric.check_nvlink_speed(h, base)
    assert "link 0 at 26562 MB/s, expected 53125 MB/s" in f.message
    assert [x.applicable for x in fabric.check_nvlink_speed(h0)] == [False]   # no speeds recorded


def test_fabric_registration_on_gb200_and_hgx():
    h = gather("gb200-nvl")
    assert fabric.check_fabric_registration(h) == []
    lost = gather("gb200-nvl", drills.DRILLS["fabric-clique-lost"].overlay_for(h.gpus[1].bus_id))
    assert [f.message for f in fabric.check_fabric_registration(lost)] == [
        f"{h.gpus[1].bus_id} is in no NVLink domain: cluster UUID is zero, expected non-zero"]
    moved = gather("gb200-nvl", {"calls": [{"fn": "nvmlDeviceGetGpuFabricInfoV", "gpu": 2, "out": {"cliqueId": 7}}]})
    (f,) = fabric.check_fabric_registration(moved)
    assert f.severity == DRAIN and f.message.startswith(f"{h.gpus[2].bus_id} is in NVLink clique 7 of ")
    stuck = gather("gb200-nvl", {"calls": [{"fn": "nvmlDeviceGetGpuFabricInfoV", "gpu": 0,
                                            "out": {"state": 2, "status": 23}}]})
    assert [(f.severity, f.message) for f in fabric.check_fabric_registration(stuck)] == [
        (DRAIN, f"NVLink fabric registration of {h.gpus[0].bus_id} stuck: insufficient resources (NVML status 23)")]
    # An HGX board's fabric registers with a zero UUID: no fault there ...
    hgx = gather("gb200-nvl", {"calls": [{"fn": "nvmlDeviceGetGpuFabricInfoV", "out": {"clusterUuid": [0] * 16}}]})
    base = {"models": {h.gpus[0].name: {"fabric": False}}}
    assert fabric.check_fabric_registration(hgx, base) == []
    # ... and a GPU without fabric info makes the check not applicable.
    assert [f.applicable for f in fabric.check_fabric_registration(gather("h100-sxm-8x"))] == [False]


def test_fabric_health_summary_reports_degradation_and_drains_nothing_by_itself():
    """nvmlGpuFabricInfo_v3_t's healthSummary (nvml.h: NOT_SUPPORTED 0, HEALTHY 1,
    UNHEALTHY 2, LIMITED_CAPACITY 3) is read, and reported as a warning: the
    summary proves no fault; the mask fields that do (route unhealthy,
    incorrect configuration) drain in gpu.fabric."""
    h = gather("gb200-nvl")
    bus = h.gpus[1].bus_id
    limited = gather("gb200-nvl", {"calls": [{"fn": "nvmlDeviceGetGpuFabricInfoV", "gpu": 1,
                                              "out": {"healthSummary": 3}}]})
    assert limited.gpus[1].fabric_health_summary == 3
    assert [(f.severity, f.message) for f in fabric.check_fabric_registration(limited)] == [
        (WARN, f"NVLink fabric of {bus} at limited capacity (NVML fabric health summary)")]
    unhealthy = gather("gb200-nvl", {"calls": [{"fn": "nvmlDeviceGetGpuFabricInfoV", "gpu": 1,
                                                "out": {"healthSummary": 2}}]})
    assert [(f.severity, f.message) for f in fabric.check_fabric_registration(unhealthy)] == [
        (WARN, f"NVLink fabric of {bus} unhealthy (NVML fabric health summary)")]
    healthy = gather("gb200-nvl", {"calls": [{"fn": "nvmlDeviceGetGpuFabricInfoV", "out": {"healthSummary": 1}}]})
    assert fabric.check_fabric_registration(healthy) == []


class _VersionedFabricApi:
    """A driver's nvmlDeviceGetGpuFabricInfoV: it answers the structure versions
    it knows and ARGUMENT_VERSION_MISMATCH for a newer one (nvml.h)."""

    def __init__(self, known: int) -> None:
        self.known, self.asked = known, []

    def nvmlDeviceGetGpuFabricInfoV(self, device, ref):
        from slurm_gpu.hw import nvml_constants as C
        from slurm_gpu.hw.nvml_api import NVMLError
        info = ref._obj
        self.asked.append(info.version >> 24)
        if info.version >> 24 > self.known:
            raise NVMLError(C.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info.state, info.cliqueId, info.healthMask = 3, 5, 2
        if hasattr(info, "healthSummary"):
            info.healthSummary = 3
        return 0


def test_fabric_info_v3_then_v2_on_an_older_driver():
    import ctypes
    from slurm_gpu.hw import nvml_constants as C
    from slurm_gpu.hw.nvml import read_fabric_fields
    from slurm_gpu.hw.nvml_api import Reader
    from slurm_gpu.hw.nvml_structs import c_nvmlGpuFabricInfo_v3_t
    # NVML_STRUCT_VERSION(GpuFabricInfo, 3): sizeof | 3 << 24
    assert C.nvmlGpuFabricInfo_v3 == ctypes.sizeof(c_nvmlGpuFabricInfo_v3_t) | 3 << 24
    new = _VersionedFabricApi(3)
    assert read_fabric_fields(Reader(new), object())["health_summary"] == 3 and new.asked == [3]
    old = _VersionedFabricApi(2)
    f = read_fabric_fields(Reader(old), object())
    assert (f["health_mask"], f["health_summary"], old.asked) == (2, 0, [3, 2])


# ---------------------------------------------------------------- daemons

RUNS = iter(range(1, 10 ** 6))


class G:
    """What an OWN check gets: the run's options and its deadline (one process scan per run)."""

    def __init__(self, root, dcgm=0) -> None:
        self.opts = engine.Options("n1", HealthSettings(fabric_root=str(root), dcgm_level=dcgm), "")
        self.deadline = float(next(RUNS))


def test_fabric_daemons_are_product_aware(tmp_path):
    hgx = json.loads((MACHINES / "h100-sxm-8x" / "facts.json").read_text())
    drills.write_files(str(tmp_path / "hgx"), drills.fabric_root_files(hgx))
    assert services.check_fabricmanager(G(tmp_path / "hgx")) == []
    drills.write_files(str(tmp_path / "hgx"), {"proc/4201/comm": None})
    assert [f.message for f in services.check_fabricmanager(G(tmp_path / "hgx"))] == [
        "nvidia-fabricmanager is not running on a node with NVSwitches"]
    gb = json.loads((MACHINES / "gb200-nvl" / "facts.json").read_text())
    drills.write_files(str(tmp_path / "gb"), drills.fabric_root_files(gb, node_wide_imex=True))
    # A GB200 compute tray has no local NVSwitch: Fabric Manager is not its.
    assert [f.applicable for f in services.check_fabricmanager(G(tmp_path / "gb"))] == [False]
    assert services.check_imex(G(tmp_path / "gb")) == []
    assert [f.applicable for f in services.check_imex(G(tmp_path / "hgx"))] == [False]
    assert [f.applicable for f in services.check_hostengine(G(tmp_path / "hgx"))] == [False]
    assert [f.severity for f in services.check_hostengine(G(tmp_path / "hgx", dcgm=1))] == [WARN]


def _hgx_without_fabricmanager_but_a_process_named_like_it(root):
    """An HGX fabric root whose Fabric Manager is gone, and /proc/31337 named nv-fabricmanager."""
    hgx = json.loads((MACHINES / "h100-sxm-8x" / "facts.json").read_text())
    drills.write_files(str(root), drills.fabric_root_files(hgx))
    drills.write_files(str(root), {"proc/4201/comm": None})
    fake = root / "proc" / "31337"
    fake.mkdir()
    (fake / "comm").write_text("nv-fabricmanager\n")
    return fake


def test_a_users_process_named_like_the_service_does_not_hide_it(tmp_path):
    # Any user can call a process nv-fabricmanager: only the proc tree's owner's
    # (root's on a real node) count.
    fake = _hgx_without_fabricmanager_but_a_process_named_like_it(tmp_path)
    os.chown(fake, 4242, 4242)
    assert [f.message for f in services.check_fabricmanager(G(tmp_path))] == [
        "nvidia-fabricmanager is not running on a node with NVSwitches"]
    os.chown(fake, os.stat(tmp_path / "proc").st_uid, -1)
    (fake / "status").write_text("Name:\tnv-fabricmanager\nUid:\t0\t0\t0\t0\n")
    assert services.check_fabricmanager(G(tmp_path)) == []


def test_a_set_user_id_program_run_by_a_user_under_the_service_name_does_not_hide_it(tmp_path):
    # `ln -s /usr/bin/su ~/nv-fabricmanager` run by uid 4242: /proc/PID is
    # root's (the effective uid), comm is the link's name, the real uid the user's.
    fake = _hgx_without_fabricmanager_but_a_process_named_like_it(tmp_path)
    (fake / "status").write_text("Name:\tnv-fabricmanager\nUid:\t4242\t0\t0\t0\n")
    assert [f.message for f in services.check_fabricmanager(G(tmp_path))] == [
        "nvidia-fabricmanager is not running on a node with NVSwitches"]


# -------------------------------------------------- debounce, grace, config

def test_debounce_counts_per_check_and_resets(tmp_path):
    s = HealthSettings(fabric_root=str(tmp_path), debounce={"gpu.ecc": 2})
    opts = engine.Options("n1", s, str(tmp_path / "state"))
    bad = [Finding("gpu.ecc", DRAIN, "3 uncorrectable ECC errors on X", "X")]
    assert [f.severity for f in settle(list(bad), opts)] == [WARN]
    assert [f.severity for f in settle([Finding("gpu.ecc", DRAIN, "4 uncorrectable ECC errors on X", "X")],
                                       opts)] == [DRAIN]        # same fault, other numbers
    settle([], opts)                                              # a clean run starts over
    assert [f.severity for f in settle(list(bad), opts)] == [WARN]
    nod = engine.Options("n1", s, str(tmp_path / "state"), no_drain=True)
    assert [f.severity for f in settle(list(bad), nod)] == [DRAIN]   # shows the next count ...
    assert [f.severity for f in settle(list(bad), nod)] == [DRAIN]   # ... and saves nothing
    with pytest.raises(ValueError, match="debounce.gpu.ecc must be a count"):
        HealthSettings(debounce={"gpu.ecc": 0})


def test_bad_debounce_config_is_one_line(tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[health]\ndebounce = {"gpu.pcie" = "x"}\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    from slurm_gpu import config
    config.clear_cache()
    rc = main(["health", "--no-drain", "--only", "gpu.xid", "--kernel-log", str(cfg)])
    err = capsys.readouterr().err
    assert rc != 0 and err.startswith("slurm-gpu: ") and "Traceback" not in err and "debounce" in err


def test_baseline_record_merges_and_names_models(tmp_path, capsys):
    out = tmp_path / "base.json"
    out.write_text(json.dumps({"version": 1, "models": {"Other GPU": {"nvlink_up": 4}}}))
    assert main(["health", "baseline", "record", "--out", str(out),
                 "--snapshot", str(MACHINES / "gb200-nvl" / "snapshot.json")]) == 0
    doc = baseline.load(str(out))
    (name,) = set(doc["models"]) - {"Other GPU"}
    assert doc["models"]["Other GPU"] == {"nvlink_up": 4}
    assert doc["models"][name]["nvlink_up"] == 18 and doc["models"][name]["fabric"] is True
    assert "written to" in capsys.readouterr().out
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(InputError, match="not JSON"):
        baseline.load(str(tmp_path / "broken.json"))
    assert main(["health", "baseline", "forget"]) != 0


BASELINED = sorted(p.parent.name for p in MACHINES.glob("*/baseline.json"))


@pytest.mark.parametrize("machine", BASELINED)
def test_packaged_machines_carry_their_baseline_and_pass_it(machine):
    assert BASELINED and (MACHINES / machine / "snapshot.json").is_file()
    doc = baseline.load(str(MACHINES / machine / "baseline.json"))
    h = gather(machine)
    assert {k: {x: y for x, y in v.items() if x != "ib"} for k, v in doc["models"].items()} == baseline.entry_for(h)
    from slurm_gpu.health import gpu_checks as gc
    fs = gc.run_gpu_checks(h, None, gc.NVML_CHECKS, 60, None, doc)
    assert [f for f in fs if f.severity == DRAIN] == []


def _health_with_baseline(tmp_path, monkeypatch, capsys, write) -> tuple[int, dict]:
    from slurm_gpu import config
    bl = tmp_path / "shared" / "baseline.json"
    bl.parent.mkdir()
    write(bl)
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\n[health]\nbaseline = "{bl}"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    config.clear_cache()
    rc = main(["health", "--snapshot", str(MACHINES / "h100-sxm-8x" / "snapshot.json"),
               "--only", "gpu.pcie,gpu.nvlink", "--json", "--no-drain"])
    out = capsys.readouterr().out
    config.clear_cache()
    return rc, json.loads(out)


def _forged(bl: Path) -> None:
    # Another node's root (or `nobody` on a root-squashed share) says every
    # H100 of the cluster trained to x32: every node of the model would drain.
    doc = json.loads((MACHINES / "h100-sxm-8x" / "baseline.json").read_text())
    for e in doc["models"].values():
        e["pcie_width"] = 32
    bl.write_text(json.dumps(doc))


@pytest.mark.parametrize("write, why", [
    (lambda p: os.mkfifo(p), "not a regular file that root owns"),
    (lambda p: (p.write_text("{"), os.chmod(p, 0o644)), "not JSON"),
    (lambda p: (p.write_text("{}"), os.chmod(p, 0o666)), "not a regular file that root owns"),
    (lambda p: (p.parent.joinpath("real.json").write_text("{}"), p.symlink_to("real.json")),
     "not a regular file that root owns"),
    (_forged, "pcie_width must be 1..16"),
], ids=["fifo", "not-json", "world-writable", "symlink", "forged-width"])
def test_a_baseline_that_cannot_be_trusted_is_ignored_with_a_warning_and_drains_nothing(
        tmp_path, monkeypatch, capsys, write, why):
    rc, rep = _health_with_baseline(tmp_path, monkeypatch, capsys, write)
    warn = [f for f in rep["findings"] if f["check"] == "health.baseline"]
    assert len(warn) == 1 and warn[0]["severity"] == WARN and why in warn[0]["message"], rep
    assert [f for f in rep["findings"] if f["severity"] == DRAIN] == []
    assert rc == 1          # WARNING: the run finished, and is not "incomplete"
