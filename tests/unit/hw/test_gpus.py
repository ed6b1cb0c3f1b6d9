"""The GPU interface (hw.gpus.Gpus) over its backends, through the one factory."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpu.errors import InputError
from slurm_gpu.hw import backend, live
from slurm_gpu.hw.gpus import COMPUTE_MODE_EXCLUSIVE_PROCESS, GpuError, GpuEvent, GpuInstance
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"


@pytest.fixture()
def sim_state(tmp_path: Path) -> str:
    from slurm_gpu_devkit.sim import init_state_for_machine
    path = tmp_path / "sim.json"
    init_state_for_machine(str(MACHINES / "h100-sxm-8x"), str(path))
    st = json.loads(path.read_text())
    st["facts"]["gpus"][1]["mig"] = {"mode": 1, "pending": 1, "max_devices": 7, "instances": []}
    path.write_text(json.dumps(st))
    return str(path)


def test_source_for_picks_one_backend_per_node_setting() -> None:
    assert backend.source_for(live.NodeSettings()) == backend.LIVE
    assert backend.source_for(live.NodeSettings(nvml="sim:/s")) == backend.GpuSource("sim", "/s")
    assert backend.source_for(live.NodeSettings(snapshot="/x.json")) == backend.GpuSource("snapshot", "/x.json")
    # A recording cannot change a GPU: writes go to the driver.
    assert backend.source_for(live.NodeSettings(snapshot="/x.json"), writes=True) == backend.LIVE
    assert backend.source_for(live.NodeSettings(nvml="sim:/s"), snapshot="/y.json").scheme == "snapshot"


def test_unknown_backend_is_one_line() -> None:
    with pytest.raises(InputError, match="unknown GPU backend 'nope'"):
        backend.open_gpus(backend.GpuSource("nope", "x"))


def test_sim_is_loaded_through_its_entry_point_when_first_needed(sim_state: str) -> None:
    # A fresh interpreter that never imported slurm_gpu_devkit.sim: the registry
    # finds the devkit's "sim" entry point (slurm_gpu.backends) and loads it.
    code = (f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'devkit')!r}]\n"
            "from slurm_gpu.hw import backend\n"
            "assert 'slurm_gpu_devkit.sim' not in sys.modules\n"
            f"g = backend.open_gpus(backend.GpuSource('sim', {sim_state!r}))\n"
            "print(g.count(), g.name(0))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "8" and "H100" in out.stdout


def test_reading_mig_and_compute_mode_over_the_simulator(sim_state: str) -> None:
    gpus = backend.open_gpus(backend.GpuSource("sim", sim_state))
    assert gpus.count() == 8
    assert gpus.name(1).startswith("NVIDIA H100")
    assert gpus.pci_device_id(1) & 0xFFFF == 0x10DE
    assert gpus.mig_mode(1) == 1 and gpus.gpu_instances(1) == []
    gid = gpus.create_gpu_instance(1, 9, 0, 4)              # 3g.40gb at slice 0
    cid = gpus.create_compute_instance(1, gid, 2, 0, 3)
    [inst] = gpus.gpu_instances(1)
    assert inst == GpuInstance(gid, 9, 0, 4, ((cid, 2, 0),))
    [dev] = gpus.mig_devices(1)
    assert (dev.gi_id, dev.ci_id) == (gid, cid) and dev.uuid.startswith("MIG-")
    with pytest.raises(GpuError) as ei:
        gpus.create_gpu_instance(1, 9, 0, 4)                # the same slices again
    assert ei.value.code is not None and ei.value.name.startswith("NVML_ERROR_")
    assert gpus.destroy_gpu_instance(1, gid) is True
    assert gpus.destroy_gpu_instance(1, gid) is False       # gone: not an error
    assert gpus.gpu_instances(1) == []
    gpus.set_compute_mode(2, COMPUTE_MODE_EXCLUSIVE_PROCESS)
    again = backend.open_gpus(backend.GpuSource("sim", sim_state))   # another process's view
    assert again.compute_mode(2) == COMPUTE_MODE_EXCLUSIVE_PROCESS
    assert again.read_view(mig_minors={}).gpus[2].bus_id == gpus.read_view(mig_minors={}).gpus[2].bus_id


def test_events_are_plain_data(sim_state: str) -> None:
    from slurm_gpu_devkit.sim import inject_event
    from slurm_gpu_devkit.sim.nvml import SimNvml
    gpus = backend.open_gpus(backend.GpuSource("sim", sim_state))
    events = gpus.listen()
    for i in range(gpus.count()):
        events.register(i)
    assert events.wait(10) is None                           # timeout: no event
    bus = gpus.read_view(mig_minors={}).gpus[3].bus_id
    inject_event(SimNvml.from_state_file(sim_state), bus, 79)
    ev = events.wait(1000)
    assert ev is not None and (ev.kind, ev.gpu, ev.data) == ("xid", bus, 79)
    assert isinstance(ev, GpuEvent)
    events.close()


def test_a_lost_gpu_is_a_gpu_error_saying_so(tmp_path: Path) -> None:
    overlay = tmp_path / "lost.json"
    overlay.write_text(json.dumps({"gpus": {"0": {"lost": True}}}))
    source = backend.GpuSource("snapshot", str(MACHINES / "h100-sxm-8x" / "snapshot.json"), str(overlay))
    gpus = backend.open_gpus(source)
    with pytest.raises(GpuError) as ei:
        gpus.name(0)
    assert ei.value.lost and ei.value.name == "NVML_ERROR_GPU_IS_LOST"
    assert gpus.name(1).startswith("NVIDIA H100")


class _Denied:
    """NVML that has one GPU and refuses every MIG query (NVML_ERROR_NO_PERMISSION)."""

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def _no(self, *args: object) -> None:
        from slurm_gpu.hw.nvml_api import NVMLError
        from slurm_gpu.hw.nvml_constants import NVML_ERROR_NO_PERMISSION
        raise NVMLError(NVML_ERROR_NO_PERMISSION)

    def nvmlDeviceGetMigMode(self, *args: object) -> None:
        self._no()

    def nvmlDeviceGetGpuInstanceById(self, *args: object) -> None:
        self._no()


def test_a_denied_mig_query_is_an_error_naming_its_call_not_no_mig() -> None:
    from slurm_gpu.hw.gpudata import INSTANCE_LOOKUP
    from slurm_gpu.hw.gpus_nvml import NvmlGpus
    gpus = NvmlGpus(_Denied())  # type: ignore[arg-type]
    for call, name in ((lambda: gpus.mig_mode(0), "nvmlDeviceGetMigMode"),
                       (lambda: gpus.gpu_instances(0), "nvmlDeviceGetGpuInstanceById"),
                       (lambda: gpus.destroy_gpu_instance(0, 1), INSTANCE_LOOKUP)):
        with pytest.raises(GpuError) as ei:
            call()
        assert (ei.value.call, ei.value.name) == (name, "NVML_ERROR_NO_PERMISSION")
