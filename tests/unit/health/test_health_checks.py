"""NVML health reads and the gpu.*/os.* checks over recorded machines with fault overlays."""
from __future__ import annotations

import time

import pytest

from slurm_gpu.hw.gpus_nvml import NvmlGpus
from slurm_gpu.health import gpu_checks as gc
from slurm_gpu.health.findings import DRAIN, INFO, WARN, worst
from slurm_gpu.health.os_checks import run_os_checks
from slurm_gpu.health.osinfo import OsInfo, read_os
from slurm_gpu.health.settings import HealthSettings
from slurm_gpu.hw import nvml_health, snapshot as snap
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"
SNAPSHOT_MACHINES = sorted(p.parent.name for p in MACHINES.glob("*/snapshot.json"))


def replay(machine: str, overlay: dict | None = None):
    path = str(MACHINES / machine / "snapshot.json")
    return snap.replay_api(snap.read_snapshot(path), path, overlay)


def gather(machine: str, overlay: dict | None = None):
    return nvml_health.read_health(replay(machine, overlay))


def all_findings(h, expected=None, links=None):
    return gc.run_gpu_checks(h, expected, gc.NVML_CHECKS, 60, links)


def model_links(machine: str) -> dict[str, int]:
    node = snap.read_snapshot(str(MACHINES / machine / "snapshot.json"))["node"]
    return {g["pci_bus_id"]: sum(l["links"] for l in g["nvlinks"]) for g in node["gpus"]}


@pytest.mark.parametrize("machine", SNAPSHOT_MACHINES)
def test_recorded_machines_are_healthy(machine):
    h = gather(machine)
    assert h.available and h.gpus and all(g.lost is None for g in h.gpus)
    fs = all_findings(h, gc.ExpectedGpus(len(h.gpus)), model_links(machine))
    assert [f for f in fs if f.severity == DRAIN] == []


def test_h100_health_reads_are_real_answers():
    h = gather("h100-sxm-8x")
    g = h.gpus[0]
    assert g.bus_id and g.uuid.startswith("GPU-") and g.remapped_rows == (0, 0, 0, 0)
    assert g.nvlink_states is not None and sum(g.nvlink_states) == 18
    assert g.pcie_width is not None and g.persistence_mode in (0, 1)


def bus(machine: str, index: int) -> str:
    return gather(machine).gpus[index].bus_id


@pytest.mark.parametrize("overlay,check,severity", [
    ({"calls": [{"fn": "nvmlDeviceGetRemappedRows", "gpu": 2, "result": [0, 1, 1, 0]}]}, "gpu.remap", DRAIN),
    ({"calls": [{"fn": "nvmlDeviceGetRemappedRows", "gpu": 2, "result": [3, 5, 0, 1]}]}, "gpu.remap", DRAIN),
    ({"calls": [{"fn": "nvmlDeviceGetTotalEccErrors", "gpu": 2, "result": 4}]}, "gpu.ecc", DRAIN),
    ({"calls": [{"fn": "nvmlDeviceGetFieldValues", "gpu": 2,
                 "result": [{"fieldId": 230, "scopeId": 0, "timestamp": 0, "latencyUsec": 0, "valueType": 1,
                             "nvmlReturn": 0, "value": {"uiVal": 1, "ullVal": 1}}]}]}, "gpu.recovery", DRAIN),
    ({"calls": [{"fn": "nvmlDeviceGetNvLinkState", "gpu": 2, "args": [7], "result": 0}]}, "gpu.nvlink", DRAIN),
    ({"calls": [{"fn": "nvmlDeviceGetCurrPcieLinkWidth", "gpu": 2, "result": 8}]}, "gpu.pcie", DRAIN),
    ({"calls": [{"fn": "nvmlDeviceGetCurrentClocksEventReasons", "gpu": 2, "result": 0x40}]}, "gpu.thermal", WARN),
    ({"calls": [{"fn": "nvmlDeviceGetPersistenceMode", "gpu": 2, "result": 0}]}, "gpu.persistence", WARN),
    ({"gpus": {"gpu2": {"lost": True}}}, "gpu.count", DRAIN),
])
def test_fault_overlay_triggers_the_right_check(overlay, check, severity):
    h = gather("h100-sxm-8x", overlay)
    fs = all_findings(h, gc.ExpectedGpus(8, tuple(range(8))), model_links("h100-sxm-8x"))
    hit = [f for f in fs if f.check == check]
    assert [f.severity for f in hit] == [severity], fs
    assert all(f.check == check for f in fs if f.severity == DRAIN)   # nothing else fires
    if check != "gpu.count":
        assert hit[0].gpu == bus("h100-sxm-8x", 2)


def test_retired_pages_on_pre_ampere_dgx2():
    pending = {"calls": [{"fn": "nvmlDeviceGetRetiredPagesPendingStatus", "gpu": 3, "result": 1}]}
    fs = gc.check_retired_pages(gather("dgx2", pending))
    assert [(f.check, f.severity) for f in fs] == [("gpu.retired_pages", DRAIN)]
    many = {"calls": [{"fn": "nvmlDeviceGetRetiredPages", "gpu": 3, "args": [1], "result": list(range(0, 70 * 4096, 4096))}]}
    fs = gc.check_retired_pages(gather("dgx2", many))
    assert fs and fs[0].severity == DRAIN and "70 pages" in fs[0].message


def test_fabric_state_and_health_mask_on_gb200():
    h = gather("gb200-nvl")
    assert {g.fabric_state for g in h.gpus} == {"completed"}
    bad = {"calls": [{"fn": "nvmlDeviceGetGpuFabricInfoV", "gpu": 1, "out": {"healthMask": 1 << 4}}]}
    fs = gc.check_fabric(gather("gb200-nvl", bad))
    assert [(f.severity, "route unhealthy" in f.message) for f in fs] == [(DRAIN, True)]
    starting = {"calls": [{"fn": "nvmlDeviceGetGpuFabricInfoV", "gpu": 0, "out": {"state": 2}}]}
    assert [f.severity for f in gc.check_fabric(gather("gb200-nvl", starting))] == [WARN]


def test_fabric_health_mask_fields_are_nvml_h_s():
    # nvml.h's mask ends with "partition assigned" at bits 12-13 (NOT_SUPPORTED 0,
    # TRUE 1, FALSE 2); bits 14 and up name nothing, so they raise nothing.
    def findings(mask: int) -> list[tuple[str, str]]:
        o = {"calls": [{"fn": "nvmlDeviceGetGpuFabricInfoV", "gpu": 1, "out": {"healthMask": mask}}]}
        return [(f.severity, f.message) for f in gc.check_fabric(gather("gb200-nvl", o))]
    bus = gather("gb200-nvl").gpus[1].bus_id
    assert findings(2 << 12) == [(WARN, f"NVLink fabric partition not assigned to {bus}")]
    assert findings(1 << 12) == findings(2 << 14) == []


def test_nvlink_pair_with_unwired_slots_is_not_down():
    # mini-2numa: an NVLink-bridged pair, 12 of 18 link slots wired: healthy.
    assert gc.check_nvlink(gather("mini-2numa"), model_links("mini-2numa")) == []
    assert gc.check_nvlink(gather("mini-2numa")) == []


def test_gres_count_and_identity():
    h = gather("h100-sxm-8x")
    assert gc.check_count(h, gc.ExpectedGpus(8, tuple(range(8)))) == []
    fs = gc.check_count(h, gc.ExpectedGpus(9, tuple(range(9))))
    assert {f.severity for f in fs} == {DRAIN} and any("/dev/nvidia8" in f.message for f in fs)
    assert [f.severity for f in gc.check_count(h, gc.ExpectedGpus(4, (0, 1, 2, 3)))] == [WARN]


def test_nvml_unavailable_drains_only_where_gpus_are_promised():
    down = nvml_health.NvmlHealth(available=False, error="NVML Shared Library Not Found")
    assert [f.severity for f in gc.check_nvml(down, gc.ExpectedGpus(8))] == [DRAIN]
    assert [f.severity for f in gc.check_nvml(down, gc.ExpectedGpus(0))] == [INFO]
    assert [f.severity for f in gc.check_nvml(down, None)] == [INFO]


def test_hung_nvml_call_is_cut_off():
    api = replay("h100-sxm-8x", {"calls": [{"fn": "nvmlDeviceGetRemappedRows", "gpu": 3, "hang": 30}]})
    t = time.monotonic()
    h = nvml_health.read_health_bounded(lambda: NvmlGpus(api), call_timeout=0.3, total_timeout=5)
    assert time.monotonic() - t < 2.0
    assert h.hung and "nvmlDeviceGetRemappedRows" in h.hung
    assert h.hung_gpu == bus("h100-sxm-8x", 3)
    fs = gc.check_nvml(h, gc.ExpectedGpus(8))
    assert [(f.check, f.severity, f.gpu) for f in fs] == [("gpu.nvml", DRAIN, h.hung_gpu)]


def test_slow_nvml_is_incomplete_not_a_drain():
    # Every call answers within its own timeout, but together they exceed the
    # budget (nvmlInit without persistence mode, a loaded node): no drain.
    calls = [{"fn": "nvmlDeviceGetTotalEccErrors", "gpu": g, "hang": 0.15} for g in range(8)]
    api = replay("h100-sxm-8x", {"calls": calls})
    h = nvml_health.read_health_bounded(lambda: NvmlGpus(api), call_timeout=1.0, total_timeout=0.5)
    assert h.hung and h.slow
    assert [(f.check, f.severity) for f in gc.check_nvml(h, gc.ExpectedGpus(8))] == [("gpu.nvml", WARN)]

    def slow_init():
        time.sleep(0.8)
        return NvmlGpus(api)
    h = nvml_health.read_health_bounded(slow_init, call_timeout=0.2, total_timeout=0.5)
    assert h.slow and "nvmlInit" in h.hung


def test_nvml_init_failure_becomes_unavailable():
    from slurm_gpu.errors import HardwareError

    def fail():
        raise HardwareError("NVML unavailable: NVML Shared Library Not Found")
    h = nvml_health.read_health_bounded(fail, call_timeout=1, total_timeout=2)
    assert not h.available and "Library Not Found" in h.error


def test_os_reader_and_checks(tmp_path):
    (tmp_path / "sys/kernel/mm/transparent_hugepage").mkdir(parents=True)
    (tmp_path / "sys/kernel/mm/transparent_hugepage/enabled").write_text("[always] madvise never\n")
    (tmp_path / "proc/sys/vm").mkdir(parents=True)
    (tmp_path / "proc/sys/vm/swappiness").write_text("60\n")
    for i, gov in enumerate(["performance", "powersave", "powersave"]):
        d = tmp_path / f"sys/devices/system/cpu/cpu{i}/cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text(gov + "\n")
    (tmp_path / "proc/4242").mkdir()
    (tmp_path / "proc/4242/comm").write_text("nvidia-persiste\n")
    info = read_os(str(tmp_path))
    assert info.thp == "always" and info.swappiness == 60 and info.governors == {"performance": 1, "powersave": 2}
    assert info.persistenced is True
    s = HealthSettings()
    fs = run_os_checks(info, s, ["os.thp", "os.swappiness", "os.governor", "os.persistenced"], True)
    assert {f.check for f in fs} == {"os.thp", "os.swappiness", "os.governor"}
    assert {f.severity for f in fs} == {WARN}


def test_os_checks_are_warnings_only_and_switchable():
    info = OsInfo(thp="never", swappiness=100, governors={"ondemand": 4}, memlock_soft=65536, persistenced=False)
    s = HealthSettings(os_thp=False, os_memlock=False)
    from slurm_gpu.health.os_checks import enabled_os_checks
    sel = enabled_os_checks(s)
    fs = run_os_checks(info, s, sel, True)
    assert {f.check for f in fs} == {"os.swappiness", "os.governor", "os.persistenced"}
    assert worst(fs) == "warn"
    assert run_os_checks(info, s, sel, False) == [f for f in fs if f.check != "os.persistenced"]


def test_expected_gpus_from_gres_conf(tmp_path):
    from slurm_gpu.health.engine import expected_gpus
    p = tmp_path / "gres.conf"
    p.write_text("AutoDetect=off\nNodeName=n[1-2] Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-3\n"
                 "NodeName=n3 Name=gpu File=/dev/nvidia[0-1]\nNodeName=n[1-3] Name=mps Count=200\n")
    e = expected_gpus(str(p), "n2")
    assert (e.count, e.minors, e.types) == (4, (0, 1, 2, 3), ("h100",) * 4)
    assert expected_gpus(str(p), "n3").count == 2
    assert expected_gpus(str(p), "cpu1").count == 0
    p.write_text("AutoDetect=nvml\n")
    assert expected_gpus(str(p), "n1") is None
    assert expected_gpus(str(tmp_path / "missing"), "n1") is None


def test_the_drain_reasons_count_is_of_faults_not_of_the_sources_that_saw_them():
    """An NVML double-bit ECC event and the ECC counter are one fault on one GPU:
    whether xid-watch's event was read before the check must not change the
    reason (the demo's Xid 48 drill read "+1 more" or "+2 more" by timing)."""
    from slurm_gpu.health.findings import Finding, drain_reason
    from slurm_gpu.health.xid import events_from_nvml
    bus = "0000:ad:00.0"
    counter = Finding("gpu.ecc", DRAIN, f"1 uncorrectable ECC errors on {bus} since the driver loaded", bus)
    xid = Finding("gpu.xid", DRAIN, f"Xid 48 on {bus}", bus, 48)
    _, (event,) = events_from_nvml([{"event": "dbe", "gpu": bus}])
    without = drain_reason([counter, xid])
    assert without == f"slurm-gpu: gpu.ecc: 1 uncorrectable ECC errors on {bus} since the driver loaded (+1 more)"
    assert drain_reason([event, counter, xid]) == without
    # A second GPU's fault is another fault, and counts.
    other = Finding("gpu.ecc", DRAIN, "NVML double-bit ECC event on 0000:ae:00.0", "0000:ae:00.0")
    assert drain_reason([counter, xid, other]).endswith("(+2 more)")
    # Findings with no GPU are told apart by their words: two ports are two faults.
    ports = [Finding("ib.port", DRAIN, f"InfiniBand port mlx5_{i}/1 is DOWN") for i in (0, 1)]
    assert drain_reason(ports).endswith("mlx5_0/1 is DOWN (+1 more)")


def test_a_long_drain_reason_keeps_its_count_when_cut():
    """Slurm keeps the reason whole, but we cut it at 200 characters: the cut
    falls in the first fault's words, never on "(+N more)"."""
    from slurm_gpu.health.findings import Finding, drain_reason
    long = Finding("gpu.ecc", DRAIN, "uncorrectable ECC errors on 0000:18:00.0: " + "detail " * 40, "0000:18:00.0")
    other = Finding("gpu.xid", DRAIN, "Xid 79 on 0000:19:00.0", "0000:19:00.0", 79)
    reason = drain_reason([long, other])
    assert len(reason) == 200 and reason.endswith("... (+1 more)"), reason
    assert reason.startswith("slurm-gpu: gpu.ecc: uncorrectable ECC errors on 0000:18:00.0: detail")
    # Words that differ only in spacing are one fault (the reason is printed with spaces collapsed).
    a = Finding("svc.imex", DRAIN, "nvidia-imex is not running")
    b = Finding("svc.imex", DRAIN, "nvidia-imex  is not\nrunning")
    assert drain_reason([a, b]) == "slurm-gpu: svc.imex: nvidia-imex is not running"
