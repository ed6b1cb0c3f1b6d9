"""The MIG NVML simulator: real placement rules and NVML's error codes."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpu.hw import nvml_constants as C
from slurm_gpu.hw.nvml_api import NVMLError
from slurm_gpu.hw.nvml_structs import c_nvmlGpuInstancePlacement_t
from slurm_gpu.mig import instances
from slurm_gpu.mig.planner import plan
from slurm_gpu.mig.profiles import find_model
from slurm_gpu.hw.gpus_nvml import NvmlGpus
from slurm_gpu_devkit.sim.mig import MigSimNvml, clear_holder, open_mig_sim, set_holder
from slurm_gpu_devkit.sim.state import init_state_for_machine
from paths import ROOT

MACHINE = ROOT / "tests" / "data" / "machines" / "h100-mig"

GPU_INSTANCE_PROFILE_3_SLICE = 2      # nvml.h

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="MIG changes need root (as NVML)")


@pytest.fixture()
def sim(tmp_path: Path):
    path = tmp_path / "sim.json"
    init_state_for_machine(str(MACHINE), str(path))
    # GPU 1: MIG on, empty (a clean GPU for placement checks)
    st = json.loads(path.read_text())
    st["facts"]["gpus"][1]["mig"] = {"mode": 1, "pending": 1, "max_devices": 7, "instances": []}
    path.write_text(json.dumps(st))
    return str(path), open_mig_sim(str(path))


def _code(api, fn, *args) -> int:
    with pytest.raises(NVMLError) as ei:
        fn(*args)
    return ei.value.value


def _pl(api, start: int, size: int):
    p = c_nvmlGpuInstancePlacement_t()
    p.start, p.size = start, size
    return ctypes.byref(p)


def test_possible_placements_v2_protocol(sim) -> None:
    _, api = sim
    h = api.nvmlDeviceGetHandleByIndex(1)
    info = api.nvmlDeviceGetGpuInstanceProfileInfo(h, GPU_INSTANCE_PROFILE_3_SLICE)
    assert (info.id, info.sliceCount, info.instanceCount) == (9, 3, 2)
    n = ctypes.c_uint(0)
    api.sim.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, None, ctypes.byref(n))
    assert n.value == 2
    small = ctypes.c_uint(1)
    arr = (c_nvmlGpuInstancePlacement_t * 2)()
    assert _code(api, api.sim.nvmlDeviceGetGpuInstancePossiblePlacements, h, info.id, arr,
                 ctypes.byref(small)) == C.NVML_ERROR_INSUFFICIENT_SIZE
    api.sim.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(n))
    assert [(p.start, p.size) for p in arr] == [(0, 4), (4, 4)]


def test_error_codes(sim) -> None:
    _, api = sim
    h0 = api.nvmlDeviceGetHandleByIndex(0)   # MIG off
    h1 = api.nvmlDeviceGetHandleByIndex(1)
    assert _code(api, api.nvmlDeviceCreateGpuInstanceWithPlacement, h0, 9, _pl(api, 0, 4)) \
        == C.NVML_ERROR_NOT_SUPPORTED
    assert _code(api, api.nvmlDeviceCreateGpuInstanceWithPlacement, h1, 77, _pl(api, 0, 4)) \
        == C.NVML_ERROR_INVALID_ARGUMENT
    # 3g may start only at 0 or 4, and is 4 memory slices long
    assert _code(api, api.nvmlDeviceCreateGpuInstanceWithPlacement, h1, 9, _pl(api, 2, 4)) \
        == C.NVML_ERROR_INVALID_ARGUMENT
    assert _code(api, api.nvmlDeviceCreateGpuInstanceWithPlacement, h1, 9, _pl(api, 0, 3)) \
        == C.NVML_ERROR_INVALID_ARGUMENT
    gi = api.nvmlDeviceCreateGpuInstanceWithPlacement(h1, 9, _pl(api, 4, 4))
    # overlap -> INSUFFICIENT_RESOURCES
    assert _code(api, api.nvmlDeviceCreateGpuInstanceWithPlacement, h1, 14, _pl(api, 4, 2)) \
        == C.NVML_ERROR_INSUFFICIENT_RESOURCES
    # 4g (0:4) + 3g = 7 compute slices; a 1g more has no room
    api.nvmlDeviceCreateGpuInstanceWithPlacement(h1, 5, _pl(api, 0, 4))
    assert _code(api, api.sim.nvmlDeviceCreateGpuInstance, h1, 19) \
        == C.NVML_ERROR_INSUFFICIENT_RESOURCES
    # CI: a 4-slice CI does not exist in a 3g GI; a 3c fits once
    assert _code(api, api.sim.nvmlGpuInstanceCreateComputeInstance, gi, 3) == C.NVML_ERROR_NOT_SUPPORTED
    ci = api.sim.nvmlGpuInstanceCreateComputeInstance(gi, 2)
    assert _code(api, api.sim.nvmlGpuInstanceCreateComputeInstance, gi, 0) \
        == C.NVML_ERROR_INSUFFICIENT_RESOURCES
    # GI with a CI -> IN_USE; after the CI goes, the GI goes
    assert _code(api, api.nvmlGpuInstanceDestroy, gi) == C.NVML_ERROR_IN_USE
    gi_id = api.nvmlGpuInstanceGetInfo(gi).id
    assert api.nvmlDeviceGetGpuInstanceById(h1, gi_id) is not None
    api.nvmlComputeInstanceDestroy(ci)
    api.nvmlGpuInstanceDestroy(gi)
    assert _code(api, api.nvmlDeviceGetGpuInstanceById, h1, gi_id) == C.NVML_ERROR_NOT_FOUND
    # MIG mode change with instances present -> IN_USE
    assert _code(api, api.nvmlDeviceSetMigMode, h1, 0) == C.NVML_ERROR_IN_USE


def test_holder_blocks_with_in_use(sim) -> None:
    path, api = sim
    h1 = api.nvmlDeviceGetHandleByIndex(1)
    set_holder(path, "dcgm", gpus=[1])
    assert _code(api, api.nvmlDeviceCreateGpuInstanceWithPlacement, h1, 0, _pl(api, 0, 8)) \
        == C.NVML_ERROR_IN_USE
    clear_holder(path, "dcgm")
    api.nvmlDeviceCreateGpuInstanceWithPlacement(h1, 0, _pl(api, 0, 8))


def test_state_shared_between_processes(sim) -> None:
    path, api = sim
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import ctypes\n"
            "from slurm_gpu_devkit.sim.mig import open_mig_sim\n"
            "from slurm_gpu.hw.nvml_structs import c_nvmlGpuInstancePlacement_t\n"
            f"a = open_mig_sim({path!r}); h = a.nvmlDeviceGetHandleByIndex(1)\n"
            "p = c_nvmlGpuInstancePlacement_t(); p.start, p.size = 0, 2\n"
            "gi = a.nvmlDeviceCreateGpuInstanceWithPlacement(h, 14, ctypes.byref(p))\n"
            "a.sim.nvmlGpuInstanceCreateComputeInstance(gi, 1)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    h1 = api.nvmlDeviceGetHandleByIndex(1)
    devs = list(instances.mig_devices(NvmlGpus(api), 1))
    assert len(devs) == 1 and devs[0][2].startswith("MIG-")
    assert api.nvmlDeviceGetName(api.nvmlDeviceGetMigDeviceHandleByIndex(h1, 0)).endswith("2g.20gb")


def test_instances_module_creates_plan_and_reads_back(sim) -> None:
    _, api = sim
    gpus = NvmlGpus(api)
    for p in plan("3g.40gb,2g.20gb,1c.2g.20gb", find_model("h100-80gb"))[0]:
        instances.create_placement(gpus, 1, p, "GPU 1")
    got = sorted((e.profile_id, e.start, e.cis[0][1]) for e in instances.list_instances(gpus, 1))
    assert got == [(9, 4, 2), (14, 0, 1), (14, 2, 0)]
    assert len({u for _, _, u in instances.mig_devices(gpus, 1)}) == 3


def test_non_root_gets_no_permission(sim, monkeypatch) -> None:
    _, api = sim
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    h1 = api.nvmlDeviceGetHandleByIndex(1)
    assert _code(api, api.nvmlDeviceCreateGpuInstanceWithPlacement, h1, 0, _pl(api, 0, 8)) \
        == C.NVML_ERROR_NO_PERMISSION


def test_is_a_simnvml_layer() -> None:
    from slurm_gpu_devkit.sim.nvml import SimNvml
    assert issubclass(MigSimNvml, SimNvml)
