"""The NVML adapter, the pynvml-compatible surface and the simulator."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from nvmlfake import Patched

from slurm_gpu.hw import nvml, nvml_constants
from slurm_gpu.hw.nvml_api import ERROR_CLASSES, NVMLError, error_name
from slurm_gpu.hw.nvml_structs import c_nvmlGpuFabricInfo_t
from slurm_gpu.hw.nvml_record import RecordingNvml
from slurm_gpu.hw.nvml_replay import ReplayNvml
from slurm_gpu_devkit.sim import SimNvml
from slurm_gpu_devkit.sim.nvml import gi_id_for_placement, mig_minors_text
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"


def _sim(name: str) -> SimNvml:
    sim = SimNvml.from_facts(json.loads((MACHINES / name / "facts.json").read_text()))
    sim.nvmlInit()
    return sim


def test_constants_equal_pynvml() -> None:
    pynvml = pytest.importorskip("pynvml")
    names = [n for n in dir(nvml_constants) if n.startswith(("NVML_", "nvml"))]
    for n in names:
        assert getattr(pynvml, n) == getattr(nvml_constants, n), n


def test_constants_are_only_what_the_code_uses() -> None:
    """No dump of pynvml: each constant is read somewhere, by the runtime or the devkit's
    simulator (error codes name any error; architectures are looked up by name from the
    simulator's table)."""
    repo = ROOT
    code = "\n".join(p.read_text() for d in (repo / "slurm_gpu", repo / "devkit") for p in d.rglob("*.py")
                     if p.name != "nvml_constants.py")
    names = [n for n in dir(nvml_constants) if n.startswith(("NVML_", "nvml"))]
    unused = [n for n in names if not n.startswith(("NVML_ERROR_", "NVML_DEVICE_ARCH_")) and f"C.{n}" not in code]
    assert unused == []
    assert len(names) < 80


def test_error_classes_mirror_pynvml() -> None:
    pynvml = pytest.importorskip("pynvml")
    e = NVMLError(nvml_constants.NVML_ERROR_GPU_IS_LOST)
    assert type(e).__name__ == type(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)).__name__ == "NVMLError_GpuIsLost"
    assert e.value == 15 and str(e) == "GPU is lost"
    assert isinstance(e, ERROR_CLASSES["NVMLError_GpuIsLost"])
    assert error_name(12) == "NVML_ERROR_LIBRARY_NOT_FOUND"


def test_open_api_without_driver_is_one_line() -> None:
    """This machine has no NVIDIA driver: the real pynvml fails to load its library."""
    try:
        api = nvml.open_api()
    except nvml.NvmlUnavailable as e:
        assert e.line() == ("slurm-gpu: NVML unavailable: NVML Shared Library Not Found "
                            "(NVML_ERROR_LIBRARY_NOT_FOUND)")
        assert e.code == 12
    else:  # pragma: no cover - only on a GPU machine
        nvml.close_api(api)
        pytest.skip("NVML is available here")


def test_live_node_without_nvml_has_zero_gpus_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_gpu.hw import live
    monkeypatch.setattr(nvml, "open_api", lambda: (_ for _ in ()).throw(
        nvml.NvmlUnavailable("NVML unavailable: NVML Shared Library Not Found (NVML_ERROR_LIBRARY_NOT_FOUND)", 12)))
    node = live.this_node(live.NodeSettings())
    assert node.gpus == ()
    assert node.notes == ("NVML unavailable: NVML Shared Library Not Found (NVML_ERROR_LIBRARY_NOT_FOUND)",)
    assert node.cores


def test_read_view_h100_sxm_nvswitch() -> None:
    view = nvml.read_view(_sim("h100-sxm-8x"), mig_minors={})
    assert [g.bus_id for g in view.gpus][:2] == ["0000:18:00.0", "0000:2a:00.0"]
    g0 = view.gpus[0]
    assert g0.uuid == "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"
    assert g0.device_id == 0x2330 and g0.memory_bytes == 81559 * 2 ** 20
    assert [l.links for l in g0.nvlinks] == [5, 4, 4, 5]
    assert {l.peer_kind for l in g0.nvlinks} == {"nvswitch"}
    assert g0.mig_enabled is False and g0.fabric is None


def test_mig_instances_and_cap_minors_match_real_slurmd() -> None:
    """stackhpc's real `slurmd -G` lists nvidia-cap291/417/336/345/354/507/516/525."""
    sim = _sim("h100-mig")
    view = nvml.read_view(sim, mig_minors=nvml.parse_mig_minors(mig_minors_text(4)))
    g2, g3 = view.gpus[2], view.gpus[3]
    assert g2.mig_enabled and view.gpus[0].mig_enabled is False
    assert [(m.gi_id, m.profile, m.gi_cap_minor) for m in g2.mig_instances] == [
        (2, "4g.40gb", 291), (7, "1g.10gb", 336), (8, "1g.10gb", 345), (9, "1g.10gb", 354)]
    assert [(m.gi_id, m.gi_cap_minor) for m in g3.mig_instances] == [(1, 417), (11, 507), (12, 516), (13, 525)]
    big = g2.mig_instances[0]
    assert (big.gi_profile_id, big.placement_start, big.placement_size, big.sm_count) == (5, 0, 4, 64)
    assert big.ci_cap_minor == 292 and big.uuid.startswith("MIG-")


def test_gi_numbering_follows_real_drivers() -> None:
    # The real A100 `nvidia-smi mig -lgi` listing in tests/data/mig: 1g at 0:1..6:1
    # are GIs 7..13, 2g at 2:2 is GI 4, 3g at 4:4 is GI 2; whole GPU is GI 0.
    assert [gi_id_for_placement(s, 1) for s in range(7)] == [7, 8, 9, 10, 11, 12, 13]
    assert gi_id_for_placement(2, 2) == 4 and gi_id_for_placement(4, 4) == 2
    assert gi_id_for_placement(0, 4) == 1 and gi_id_for_placement(0, 8) == 0
    # A30 (4 memory slices): 1g.6gb at 0:1..3:1 are GIs 3..6.
    assert [gi_id_for_placement(s, 1, slices=4) for s in range(4)] == [3, 4, 5, 6]
    assert gi_id_for_placement(0, 4, slices=4) == 0


def test_h100_mig_machine_uses_only_valid_h100_placements() -> None:
    """Every recorded instance sits where NVIDIA's H100 placement table allows."""
    import json

    from slurm_gpu.mig.profiles import find_model
    facts = json.loads((ROOT / "tests" / "data" / "machines" / "h100-mig" / "facts.json").read_text())
    seen = 0
    for g in facts["gpus"]:
        model = find_model(g["name"])
        assert model is not None
        used: set[int] = set()
        for inst in g["mig"]["instances"]:
            prof = model.profile(inst["profile"])
            assert prof is not None and inst["start"] in prof.starts and inst["size"] == prof.size, inst
            slices = set(range(inst["start"], inst["start"] + inst["size"]))
            assert not slices & used, f"overlapping instances on GPU {g['bus_id']}"
            used |= slices
            seen += 1
    assert seen == 8


def test_profile_name_fallback_from_attributes() -> None:
    class A:
        gpuInstanceSliceCount, computeInstanceSliceCount, memorySizeMB = 3, 1, 40192
    assert nvml.mig_profile_name("NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb", A) == "1c.3g.40gb"
    assert nvml.mig_profile_name("", A) == "1c.3g.40gb"


def test_fabric_clique_and_v1_fallback() -> None:
    sim = _sim("gb200-nvl")
    f = nvml.read_view(sim).gpus[0].fabric
    assert f is not None and (f.cluster_uuid, f.clique_id, f.state) == (
        "7e3f1c22-5a9b-4d0e-8c61-2f4a9b7d3e10", 32766, "completed")
    assert f.health_mask == 0xAA
    # A driver without the versioned call: the adapter falls back to v1 (no health mask).
    from ctypes import byref
    rec = RecordingNvml(sim)
    nvml.read_view(rec)
    for i in range(4):
        rec.nvmlDeviceGetGpuFabricInfo(rec.nvmlDeviceGetHandleByIndex(i), byref(c_nvmlGpuFabricInfo_t()))
    calls = [c for c in rec.records() if c["fn"] != "nvmlDeviceGetGpuFabricInfoV"]
    old = nvml.read_view(ReplayNvml(calls + [{"fn": "nvmlDeviceGetGpuFabricInfoV", "dev": f"gpu{i}", "args": [],
                                              "error": 13} for i in range(4)]))
    assert old.gpus[0].fabric is not None and old.gpus[0].fabric.clique_id == 32766
    assert old.gpus[0].fabric.health_mask == 0


def test_pcie_gpu_without_nvlink_or_mig_degrades() -> None:
    facts = json.loads((MACHINES / "mini-2numa" / "facts.json").read_text())
    for g in facts["gpus"]:
        g.pop("nvlink", None)
        g.pop("mig", None)
    sim = SimNvml.from_facts(facts)
    sim.nvmlInit()
    view = nvml.read_view(sim)
    assert [(g.nvlinks, g.mig_enabled) for g in view.gpus] == [((), None), ((), None)]


def test_whole_library_failure_is_hardware_error() -> None:
    from slurm_gpu.errors import HardwareError
    api = ReplayNvml([{"fn": "nvmlDeviceGetCount", "dev": "", "args": [], "error": 999}])
    with pytest.raises(HardwareError, match=r"nvmlDeviceGetCount failed: Unknown Error \(NVML_ERROR_UNKNOWN\)"):
        nvml.read_view(api)


def test_uninitialised_sim_answers_like_pynvml() -> None:
    sim = SimNvml.from_facts(json.loads((MACHINES / "mini-2numa" / "facts.json").read_text()))
    with pytest.raises(NVMLError) as ei:
        sim.nvmlDeviceGetCount()
    assert ei.value.value == nvml_constants.NVML_ERROR_UNINITIALIZED
    sim.nvmlInit()
    with pytest.raises(ERROR_CLASSES["NVMLError_InvalidArgument"]):
        sim.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(ERROR_CLASSES["NVMLError_NotSupported"]):     # a call of the contract it does not model
        sim.nvmlDeviceSetMigMode(sim.nvmlDeviceGetHandleByIndex(0), 1)
    with pytest.raises(AttributeError):                              # a call outside the contract
        sim.nvmlDeviceGetFanSpeed(sim.nvmlDeviceGetHandleByIndex(0))
    # Power is modelled (the scripted load; idle power without one).
    assert sim.nvmlDeviceGetPowerUsage(sim.nvmlDeviceGetHandleByIndex(0)) == 60_000


def test_sim_state_file_is_shared_between_processes(tmp_path: Path) -> None:
    from slurm_gpu_devkit.sim import init_state, inject_event, open_sim, set_overlay
    state = tmp_path / "state.json"
    init_state(str(MACHINES / "mini-2numa" / "facts.json"), str(state))
    a, b = open_sim(str(state)), open_sim(str(state))
    h = a.nvmlDeviceGetHandleByIndex(1)
    a.nvmlDeviceSetComputeMode(h, nvml_constants.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    assert b.nvmlDeviceGetComputeMode(b.nvmlDeviceGetHandleByIndex(1)) == 3
    inject_event(a, "0000:ae:00.0", 79)
    es = b.nvmlEventSetCreate()
    ev = b.nvmlEventSetWait_v2(es, 100)
    assert (ev.eventType, ev.eventData, ev.device.key) == (nvml_constants.nvmlEventTypeXidCriticalError, 79, "gpu1")
    with pytest.raises(ERROR_CLASSES["NVMLError_Timeout"]):
        a.nvmlEventSetWait_v2(es, 10)   # consumed once, by either process
    set_overlay(a, {"gpus": {"0000:ad:00.0": {"lost": True}}})
    with pytest.raises(ERROR_CLASSES["NVMLError_GpuIsLost"]):
        b.nvmlDeviceGetUUID(b.nvmlDeviceGetHandleByIndex(0))


def test_sim_state_for_machine_models_whole_node(tmp_path: Path) -> None:
    from slurm_gpu.hw import live, snapshot
    from slurm_gpu_devkit.sim import init_state_for_machine
    state = tmp_path / "dgx2.state"
    init_state_for_machine(str(MACHINES / "dgx2"), str(state))
    node = live.this_node(live.NodeSettings(nvml=f"sim:{state}"))
    recorded = snapshot.node_from_file(str(MACHINES / "dgx2" / "snapshot.json"))
    assert node.gpus == recorded.gpus and node.cores == recorded.cores and len(node.gpus) == 16


def test_sim_faults_use_the_snapshot_overlay_format(tmp_path: Path) -> None:
    import time
    from slurm_gpu.errors import InputError
    from slurm_gpu_devkit.sim import init_state_for_machine, open_sim, set_overlay
    state = tmp_path / "gb.state"
    init_state_for_machine(str(MACHINES / "gb200-nvl"), str(state))
    sim = open_sim(str(state))
    set_overlay(sim, {"calls": [{"fn": "nvmlDeviceGetGpuFabricInfoV", "gpu": "0009:01:00.0", "out": {"state": 2}},
                                {"fn": "nvmlDeviceGetRemappedRows", "gpu": 0, "result": [0, 1, 1, 0]},
                                {"fn": "nvmlDeviceGetPersistenceMode", "hang": 0.2}]})
    other = open_sim(str(state))   # another process's view of the same state
    view = nvml.read_view(other)
    assert [g.fabric.state for g in view.gpus] == ["completed", "in_progress", "completed", "completed"]
    assert view.gpus[1].fabric.clique_id == 32766          # only the patched field changed
    assert other.nvmlDeviceGetRemappedRows(other.nvmlDeviceGetHandleByIndex(0)) == [0, 1, 1, 0]
    t = time.monotonic()
    assert other.nvmlDeviceGetPersistenceMode(other.nvmlDeviceGetHandleByIndex(0)) == 1
    assert time.monotonic() - t >= 0.2
    with pytest.raises(InputError, match="which the machine does not have"):
        set_overlay(sim, {"gpus": {"0000:01:00.0": {"lost": True}}})
    set_overlay(sim, {})
    assert nvml.read_view(other).gpus[1].fabric.state == "completed"


def _old_stack(sim: SimNvml) -> nvml.PynvmlApi:
    """The simulator as an old nvidia-ml-py on an old driver answers, through the pynvml adapter.

    * char arrays come back as ``bytes`` (pynvml before 11.515);
    * ``nvmlDeviceGetNvLinkRemoteDeviceType`` does not exist in the module;
    * the driver refuses the v2 fabric structure (ARGUMENT_VERSION_MISMATCH);
    * MIG device handles refuse ``nvmlDeviceGetAttributes`` (NOT_SUPPORTED).
    """
    import types
    from slurm_gpu.hw.nvml_api import CALLS

    def refuse(code):
        def f(*a):
            raise NVMLError(code)
        return f

    def attrs(real):
        def f(h):
            if "/mig" in h.key:
                raise NVMLError(nvml_constants.NVML_ERROR_NOT_SUPPORTED)
            return real(h)
        return f

    module = types.SimpleNamespace(NVMLError=NVMLError)
    for name in CALLS - {"nvmlDeviceGetNvLinkRemoteDeviceType"}:
        real = getattr(sim, name)
        if name in ("nvmlSystemGetDriverVersion", "nvmlDeviceGetName", "nvmlDeviceGetUUID"):
            real = (lambda r: lambda *a: r(*a).encode())(real)
        elif name == "nvmlDeviceGetGpuFabricInfoV":
            real = refuse(nvml_constants.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        elif name == "nvmlDeviceGetAttributes":
            real = attrs(real)
        setattr(module, name, real)
    return nvml.PynvmlApi(module)


@pytest.mark.parametrize("name", ["h100-sxm-8x", "gb200-nvl", "h100-mig", "dgx2"])
def test_old_pynvml_and_old_driver_give_the_same_gpus(name: str) -> None:
    minors = nvml.parse_mig_minors(mig_minors_text(16))
    new = nvml.read_view(_sim(name), mig_minors=minors)
    old = nvml.read_view(_old_stack(_sim(name)), mig_minors=minors)
    assert isinstance(old.driver_version, str) and old.driver_version == new.driver_version
    assert len(old.gpus) == len(new.gpus) and old.notes == new.notes
    for o, n in zip(old.gpus, new.gpus):
        assert (o.uuid, o.name, o.bus_id, o.minor, o.nvlinks, o.mig_enabled) == (
            n.uuid, n.name, n.bus_id, n.minor, n.nvlinks, n.mig_enabled)
        assert isinstance(o.uuid, str) and isinstance(o.name, str)
        # v1 fabric fallback: same clique, no health mask in the old structure.
        assert (o.fabric and (o.fabric.cluster_uuid, o.fabric.clique_id)) == (
            n.fabric and (n.fabric.cluster_uuid, n.fabric.clique_id))
        # MIG devices without attributes: identity, profile, placement and caps all still known.
        assert [(m.gi_id, m.ci_id, m.profile, m.uuid, m.placement_start, m.placement_size, m.gi_cap_minor,
                 m.ci_cap_minor) for m in o.mig_instances] == [
            (m.gi_id, m.ci_id, m.profile, m.uuid, m.placement_start, m.placement_size, m.gi_cap_minor,
             m.ci_cap_minor) for m in n.mig_instances]
    if name == "h100-mig":
        assert sum(len(g.mig_instances) for g in old.gpus) == 8


def test_gpu_lost_mid_read_is_left_out_with_a_note() -> None:
    """GPU_IS_LOST after the identity reads (during NVLink) drops that GPU only, saying which."""
    sim = _sim("h100-sxm-8x")

    def state(real, h, link):
        if h.key == "gpu3" and link == 2:
            raise NVMLError(nvml_constants.NVML_ERROR_GPU_IS_LOST)
        return real(h, link)

    full = nvml.read_view(sim, mig_minors={})
    view = nvml.read_view(Patched(sim, nvmlDeviceGetNvLinkState=state), mig_minors={})
    lost = full.gpus[3].bus_id
    assert [g.bus_id for g in view.gpus] == [g.bus_id for g in full.gpus if g.bus_id != lost]
    assert view.notes == (f"GPU {lost} unreadable: GPU is lost (NVML_ERROR_GPU_IS_LOST)",)


def test_mig_profile_follows_slurms_lowercase_rule() -> None:
    """gpu_nvml.c lower-cases the MIG device name and takes what follows ``mig_``."""
    assert nvml.mig_profile_name("NVIDIA A100-SXM4-40GB MIG 1g.5gb+me", None) == "1g.5gb+me"
    assert nvml.mig_profile_name("NVIDIA H100 80GB HBM3 MIG 1C.2G.20GB", None) == "1c.2g.20gb"
    with pytest.raises(ValueError):
        nvml.mig_profile_name("NVIDIA H100 80GB HBM3", None)


@pytest.mark.parametrize("name", ["mini-2numa", "h100-sxm-8x"])
def test_remote_type_unknown_is_judged_by_pci_address(name: str) -> None:
    """A driver answering NVLINK_DEVICE_TYPE_UNKNOWN: a peer at a local GPU's address is a GPU, else a switch."""
    sim = _sim(name)

    unknown = Patched(sim, nvmlDeviceGetNvLinkRemoteDeviceType=lambda real, h, link:
                       nvml_constants.NVML_NVLINK_DEVICE_TYPE_UNKNOWN)
    expected = nvml.read_view(sim, mig_minors={})
    got = nvml.read_view(unknown, mig_minors={})
    assert [g.nvlinks for g in got.gpus] == [g.nvlinks for g in expected.gpus]
    kinds = {l.peer_kind for g in got.gpus for l in g.nvlinks}
    assert kinds == ({"gpu"} if name == "mini-2numa" else {"nvswitch"})


def test_fabric_info_v3_is_v2_then_the_health_summary_as_nvml_h_lays_them_out() -> None:
    import ctypes

    from slurm_gpu.hw.nvml_structs import c_nvmlGpuFabricInfo_v2_t as V2
    from slurm_gpu.hw.nvml_structs import c_nvmlGpuFabricInfo_v3_t as V3
    assert [f[0] for f in V3._fields_] == [f[0] for f in V2._fields_] + ["healthSummary"]
    assert (ctypes.sizeof(V2), ctypes.sizeof(V3), V3.healthSummary.offset) == (36, 40, 36)
    # NVML_STRUCT_VERSION(GpuFabricInfo, N): sizeof | N << 24
    assert (V2().version, V3().version) == (36 | 2 << 24, 40 | 3 << 24)
