"""Snapshots: record -> replay equality on every machine, overlays, bad files, the CLI."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from slurm_gpu.errors import InputError
from slurm_gpu.hw import snapshot as snap
from slurm_gpu.hw.nvml_api import ERROR_CLASSES
from paths import ROOT

sys.path.insert(0, str(ROOT / "tests"))
from machinedata import MACHINES_DIR  # noqa: E402

SNAPSHOT_MACHINES = sorted(d.name for d in MACHINES_DIR.iterdir() if (d / "snapshot.json").is_file())
H100 = str(MACHINES_DIR / "h100-sxm-8x" / "snapshot.json")


def test_every_constructed_machine_has_a_snapshot() -> None:
    assert {"h100-sxm-8x", "dgx-h100", "epyc-a100-8numa", "gb200-nvl", "h100-mig", "mini-2numa",
            "dgx2"} <= set(SNAPSHOT_MACHINES)


@pytest.mark.parametrize("name", SNAPSHOT_MACHINES)
def test_nvswitch_addresses_are_no_other_pci_device(name: str) -> None:
    """A constructed NVSwitch must not sit at a GPU's (or any hwloc PCI device's) address:
    the adapter tells GPU peers from switches by address when the driver cannot say."""
    import re
    node = snap.node_from_file(str(MACHINES_DIR / name / "snapshot.json"))
    xml = snap.read_snapshot(str(MACHINES_DIR / name / "snapshot.json"))["hwloc_xml"]
    taken = {g.pci_bus_id for g in node.gpus} | {b.lower() for b in re.findall(r'pci_busid="([^"]+)"', xml)}
    switches = {l.peer for g in node.gpus for l in g.nvlinks if l.peer_kind == "nvswitch" and ":" in l.peer}
    assert not switches & taken


@pytest.mark.parametrize("name", SNAPSHOT_MACHINES)
def test_replay_equals_recorded_model(name: str) -> None:
    path = str(MACHINES_DIR / name / "snapshot.json")
    fast = snap.node_from_file(path)
    data = snap.read_snapshot(path)
    replayed = snap.replay(data, path)
    assert replayed == fast
    assert fast.gpus and all(g.uuid for g in fast.gpus)


@pytest.mark.parametrize("name", [n for n in SNAPSHOT_MACHINES if (MACHINES_DIR / n / "facts.json").is_file()])
def test_record_then_replay_round_trip(name: str, tmp_path: Path) -> None:
    """Record the simulator through the real adapter, write, load: same node as live."""
    from slurm_gpu.hw import hwloc, merge
    from slurm_gpu_devkit.sim import SimNvml
    d = MACHINES_DIR / name
    facts = json.loads((d / "facts.json").read_text())
    xml = snap.read_snapshot(str(d / "snapshot.json"))["hwloc_xml"]
    sim = SimNvml.from_facts(facts)
    sim.nvmlInit()
    data = snap.record(api=sim, hwloc_xml=xml, hostname="h", mig_minors=sim.mig_minors(), source="sim")
    out = tmp_path / "s.json"
    snap.write(str(out), data)
    live = merge.derive_node(hwloc.read_cpu_view(xml_text=xml, hostname="h"), sim, mig_minors=sim.mig_minors,
                             sources=(f"snapshot:{out}",))
    assert snap.node_from_file(str(out)) == live
    assert snap.replay(snap.read_snapshot(str(out)), str(out)) == live


def test_snapshot_carries_health_reads() -> None:
    fns = {c["fn"] for c in snap.read_snapshot(H100)["nvml"]["calls"]}
    assert {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPciInfo"} <= fns


def test_overlay_lost_gpu() -> None:
    node = snap.node_from_file(H100, {"gpus": {"0000:3a:00.0": {"lost": True}}})
    assert [g.pci_bus_id for g in node.gpus].count("0000:3a:00.0") == 0 and len(node.gpus) == 7
    assert "GPU index 2 unreadable: GPU is lost (NVML_ERROR_GPU_IS_LOST)" in node.notes
    assert node.sources[-1] == "overlay:overlay"


def test_overlay_changes_health_answers() -> None:
    data = snap.read_snapshot(H100)
    api = snap.replay_api(data, H100, {"calls": [
        {"fn": "nvmlDeviceGetTotalEccErrors", "gpu": "0000:9a:00.0", "args": [1, 0], "result": 3},
        {"fn": "nvmlDeviceGetRemappedRows", "gpu": "0000:18:00.0", "result": [0, 2, 1, 0]}]})
    h4 = api.nvmlDeviceGetHandleByIndex(4)
    assert api.nvmlDeviceGetTotalEccErrors(h4, 1, 0) == 3
    assert api.nvmlDeviceGetTotalEccErrors(api.nvmlDeviceGetHandleByIndex(5), 1, 0) == 0
    assert list(api.nvmlDeviceGetRemappedRows(api.nvmlDeviceGetHandleByIndex(0))) == [0, 2, 1, 0]


def test_overlay_patches_structures_and_errors() -> None:
    gb = str(MACHINES_DIR / "gb200-nvl" / "snapshot.json")
    node = snap.node_from_file(gb, {"calls": [{"fn": "nvmlDeviceGetGpuFabricInfoV", "gpu": 1, "out": {"state": 2}}]})
    assert [g.fabric.state for g in node.gpus] == ["completed", "in_progress", "completed", "completed"]
    node = snap.node_from_file(H100, {"calls": [{"fn": "nvmlDeviceGetNvLinkState", "gpu": "0000:18:00.0",
                                            "args": [0], "result": 0}]})
    assert [l.links for l in node.gpus[0].nvlinks] == [4, 4, 4, 5]


def test_overlay_events_and_hang() -> None:
    import time
    data = snap.read_snapshot(H100)
    api = snap.replay_api(data, H100, {"events": [{"gpu": "0000:db:00.0", "type": "xid", "data": 79}],
                                       "calls": [{"fn": "nvmlDeviceGetPowerUsage", "hang": 0.2}]})
    ev = api.nvmlEventSetWait_v2(api.nvmlEventSetCreate(), 100)
    assert (ev.eventData, ev.device.key) == (79, "gpu7")
    t = time.monotonic()
    with pytest.raises(ERROR_CLASSES["NVMLError_NotSupported"]):     # not recorded
        api.nvmlDeviceGetPowerUsage(api.nvmlDeviceGetHandleByIndex(0))
    assert time.monotonic() - t >= 0.2


@pytest.mark.parametrize("overlay,msg", [
    ({"gpu": {}}, "unknown overlay key 'gpu'"),
    ({"gpus": {"0000:99:00.0": {"lost": True}}}, "which the machine does not have"),
    ({"calls": [{"fn": "x", "error": "NVML_ERROR_BOGUS"}]}, "unknown NVML error"),
    ({"calls": [{"fn": "nvmlDeviceGetFanSpeed", "error": 3}]},
     "'nvmlDeviceGetFanSpeed' is no NVML call slurm-gpu makes"),
    ({"calls": [{"result": 1}]}, "needs \"fn\""),
])
def test_bad_overlay_is_one_line(overlay: dict, msg: str) -> None:
    with pytest.raises(InputError, match=msg) as ei:
        snap.node_from_file(H100, overlay, overlay_source="o.json")
    assert ei.value.line().endswith("(o.json)")


@pytest.mark.parametrize("content,where", [
    ("{not json", "s.json:1:2"),
    ('{"schema": "slurm-gpu.snapshot/0"}', "s.json: schema"),
    ('[1]', "s.json"),
    ('{"schema": "slurm-gpu.snapshot/1", "hostname": "h", "hwloc_xml": "", "nvml": {"calls": [{"fn": "f"}]}}',
     "s.json: nvml.calls[0]"),
    ('{"schema": "slurm-gpu.snapshot/1", "hostname": "h", "hwloc_xml": "", "nvml": {"calls": []}, "node": {}}',
     "s.json: node"),
])
def test_corrupt_snapshot_names_file_and_place(tmp_path: Path, content: str, where: str) -> None:
    p = tmp_path / "s.json"
    p.write_text(content)
    with pytest.raises(InputError) as ei:
        snap.node_from_file(str(p))
    assert ei.value.where is not None and ei.value.where.endswith(where)
    with pytest.raises(InputError):
        snap.node_from_file(str(tmp_path / "missing.json"))


@pytest.mark.parametrize("reader", ["read_snapshot", "load_snapshot_node"])
def test_a_snapshot_that_cannot_be_opened_is_one_line(tmp_path: Path, reader: str) -> None:
    """Both readers say the same words for a path that is missing, a directory, or not under a directory."""
    from slurm_gpu.hw import snapshot_bulk
    read = getattr(snap, reader, None) or getattr(snapshot_bulk, reader)
    (tmp_path / "file").write_text("")
    for path, words in ((tmp_path / "missing.json", "snapshot not found"),
                        (tmp_path, "snapshot is a directory"),
                        (tmp_path / "file" / "s.json", "cannot read snapshot: Not a directory")):
        with pytest.raises(InputError) as ei:
            read(str(path))
        assert ei.value.line() == f"slurm-gpu: {words} ({path})"


def test_truncated_snapshot(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    p.write_text(Path(H100).read_text()[:5000])
    with pytest.raises(InputError, match="bad snapshot JSON"):
        snap.node_from_file(str(p))


def test_record_this_gpu_less_machine(tmp_path: Path) -> None:
    """The real pynvml finds no library here: recorded as such, replayed as zero GPUs."""
    from slurm_gpu.hw import nvml
    try:
        nvml.close_api(nvml.open_api())
        pytest.skip("NVML is available here")
    except nvml.NvmlUnavailable:
        pass
    data = snap.record()
    assert data["nvml"]["calls"] == [{"fn": "nvmlInit", "dev": "", "args": [], "error": 12}]
    out = tmp_path / "me.json"
    snap.write(str(out), data)
    for node in (snap.node_from_file(str(out)), snap.replay(snap.read_snapshot(str(out)), str(out))):
        assert node.gpus == ()
        assert node.notes == ("NVML unavailable: NVML Shared Library Not Found (NVML_ERROR_LIBRARY_NOT_FOUND)",)


def test_cli_record_sim_and_show_overlay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from slurm_gpu.cli import main
    from slurm_gpu_devkit.sim import init_state
    state = tmp_path / "state.json"
    d = MACHINES_DIR / "h100-mig"
    init_state(str(d / "facts.json"), str(state), hwloc_xml_path=str(d / "hwloc.xml"))
    out = tmp_path / "rec.json"
    assert main(["snapshot", "record", "--nvml", f"sim:{state}", "-o", str(out)]) == 0
    assert "recorded 4 GPU(s)" in capsys.readouterr().out
    ov = tmp_path / "ov.json"
    ov.write_text(json.dumps({"gpus": {"0000:46:00.0": {"lost": True}}}))
    assert main(["snapshot", "show", str(out), "--overlay", str(ov), "--json"]) == 0
    inv = json.loads(capsys.readouterr().out)
    assert [g["pci_bus_id"] for g in inv["gpus"]] == ["0000:06:00.0", "0000:0c:00.0", "0000:4c:00.0"]
    assert [m["gi_cap_minor"] for m in inv["gpus"][2]["mig_instances"]] == [417, 507, 516, 525]
    ov.write_text("{")
    assert main(["snapshot", "show", str(out), "--overlay", str(ov)]) == 1
    assert capsys.readouterr().err.startswith("slurm-gpu: bad overlay JSON: ")


def test_cli_record_bad_hwloc_xml_names_that_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from slurm_gpu.cli import main
    from slurm_gpu_devkit.sim import init_state
    state = tmp_path / "state.json"
    init_state(str(MACHINES_DIR / "mini-2numa" / "facts.json"), str(state))
    bad = tmp_path / "cut.xml"
    bad.write_text('<?xml version="1.0"?>\n<topology version="2.0">\n<object type="Machine"')
    out = tmp_path / "rec.json"
    assert main(["snapshot", "record", "--nvml", f"sim:{state}", "--hwloc-xml", str(bad), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("slurm-gpu: malformed hwloc XML") and f"({bad} line " in err
    assert not out.exists()


def test_node_config_snapshot_and_sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_gpu import config
    from slurm_gpu.hw import live
    from slurm_gpu_devkit.sim import init_state
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    s = live.settings({"node": {"snapshot": "/x/%n.json", "state_dir": "/run/sg/%n"}})
    assert (s.snapshot, s.state_dir, s.nvml) == ("/x/n7.json", "/run/sg/n7", "live")
    with pytest.raises(InputError, match="node.nvml must be"):
        live.settings({"node": {"nvml": "fake"}})
    with pytest.raises(InputError, match="unknown config key node.snapshots"):
        live.settings({"node": {"snapshots": ""}})
    assert live.this_node(live.NodeSettings(snapshot=H100)) == snap.node_from_file(H100)
    state = tmp_path / "n7.state"
    d = MACHINES_DIR / "h100-mig"
    init_state(str(d / "facts.json"), str(state), hwloc_xml_path=str(d / "hwloc.xml"))
    node = live.this_node(live.settings({"node": {"nvml": f"sim:{tmp_path}/%n.state"}}))
    recorded = snap.node_from_file(str(d / "snapshot.json"))
    assert node.gpus == recorded.gpus
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[node]\nsnapshot = "{H100}"\n')
    monkeypatch.setenv(config.ENV_VAR, str(cfg))
    from slurm_gpu.hw import load_node
    assert len(load_node().gpus) == 8


def test_load_node_is_the_one_way_in_for_every_source(tmp_path):
    """hw.load_node(source): this node, a snapshot (with faults), an hwloc XML, many snapshots."""
    from slurm_gpu import hw
    from slurm_gpu.hw import live
    gb = str(MACHINES_DIR / "gb200-nvl" / "snapshot.json")
    one = hw.load_node(hw.Snapshot(H100))
    assert one == snap.node_from_file(H100) and len(one.gpus) == 8
    assert hw.load_node(hw.ThisNode(live.NodeSettings(snapshot=H100))) == one
    lost = hw.load_node(hw.Snapshot(H100, {"gpus": {"0000:3a:00.0": {"lost": True}}}))
    assert len(lost.gpus) == 7
    many = hw.load_node(hw.Snapshots((H100, gb)))
    assert many == [one, hw.load_node(hw.Snapshot(gb))]
    xml = tmp_path / "h.xml"
    xml.write_text(snap.read_snapshot(H100)["hwloc_xml"])
    bare = hw.load_node(hw.HwlocXml(str(xml), hostname="h"))
    assert [g.pci_bus_id for g in bare.gpus] == [g.pci_bus_id for g in one.gpus] and bare.gpus[0].uuid is None
    with pytest.raises(TypeError):
        hw.load_node(H100)    # a bare path is no source: say which kind it is
