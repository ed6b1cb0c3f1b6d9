"""The NVML contract: closed (no backend answers outside it) and one error policy for every reader."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from nvmlfake import Patched

from slurm_gpu.hw import nvml, nvml_constants as C
from slurm_gpu.hw.gpudata import GpuError
from slurm_gpu.hw.gpus_nvml import NvmlGpus
from slurm_gpu.hw.gpustats import StatsReader
from slurm_gpu.hw.nvml_api import (ABSENT, CALLS, DENIED, FAULT, NVMLError, NvmlApi, NvmlForward, classify)
from slurm_gpu.hw.nvml_health import WatchedNvml, read_health
from slurm_gpu.hw.nvml_overlay import OverlayNvml
from slurm_gpu.hw.nvml_record import RecordingNvml
from slurm_gpu.hw.nvml_replay import ReplayNvml
from slurm_gpu_devkit.sim import SimNvml
from slurm_gpu_devkit.sim.mig import MigSimNvml
from slurm_gpu_devkit.sim.nvml import FaultySim
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"
HW = Path(nvml.__file__).resolve().parent

# What the simulator models beyond the contract (its own MIG tests call these).
SIM_EXTRAS = {"nvmlDeviceGetTemperature", "nvmlDeviceGetEccMode", "nvmlDeviceGetSerial", "nvmlDeviceGetNvLinkVersion",
              "nvmlDeviceGetHandleByPciBusId", "nvmlDeviceIsMigDeviceHandle",
              "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceGetGpuMaxPcieLinkGeneration",
              "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlGpmSampleGet",
              "nvmlDeviceGetGpuInstancePossiblePlacements", "nvmlDeviceGetGpuInstanceRemainingCapacity",
              "nvmlDeviceCreateGpuInstance", "nvmlDeviceGetGpuInstances",
              "nvmlGpuInstanceGetComputeInstanceProfileInfo", "nvmlGpuInstanceCreateComputeInstance"}


def _facts(name: str) -> dict:
    return json.loads((MACHINES / name / "facts.json").read_text())


def _sim(name: str = "h100-sxm-8x", cls: type[SimNvml] = SimNvml) -> SimNvml:
    sim = cls.from_facts(_facts(name))
    sim.nvmlInit()
    return sim


def _backends() -> dict[str, NvmlApi]:
    import types
    sim = _sim()
    fake_pynvml = types.SimpleNamespace(NVMLError=NVMLError)
    return {"pynvml": nvml.PynvmlApi(fake_pynvml), "replay": ReplayNvml([]), "record": RecordingNvml(sim),
            "overlay": OverlayNvml(sim, {}), "sim": sim, "mig sim": _sim(cls=MigSimNvml),
            "faulty sim": FaultySim(sim), "health watchdog": WatchedNvml(sim, {"call": None, "calls": 0}),
            "test fake": Patched(sim)}


@pytest.mark.parametrize("name", list(_backends()))
def test_no_backend_answers_a_call_outside_the_contract(name: str) -> None:
    b = _backends()[name]
    assert not any("__getattr__" in vars(k) for k in type(b).__mro__ if k is not object)
    with pytest.raises(AttributeError):
        b.nvmlDeviceGetFanSpeed     # type: ignore[attr-defined]  # a real NVML call, never made here
    assert isinstance(b, NvmlForward)
    for call in CALLS:              # and each implements every call of it
        assert callable(getattr(b, call)), call
    extras = {n for n in dir(b) if n.startswith("nvml")} - CALLS
    assert extras <= (SIM_EXTRAS if "sim" in name else set())


def test_the_contract_is_the_calls_the_code_makes() -> None:
    """Every call of the contract is made somewhere in slurm_gpu/ outside the backends."""
    backends = {"nvml_api.py", "nvml_replay.py", "nvml_record.py", "nvml_overlay.py"}
    code = "\n".join(p.read_text() for p in (HW.parent).rglob("*.py")
                     if p.name not in backends and "sim" not in p.parts)
    assert sorted(c for c in CALLS if f".{c}" not in code) == []


def test_error_policy_table() -> None:
    for code in (C.NVML_ERROR_NOT_SUPPORTED, C.NVML_ERROR_FUNCTION_NOT_FOUND, C.NVML_ERROR_INVALID_ARGUMENT,
                 C.NVML_ERROR_NOT_FOUND, C.NVML_ERROR_NO_DATA):
        assert classify(code) == ABSENT
    assert classify(C.NVML_ERROR_NO_PERMISSION) == DENIED
    for code in (C.NVML_ERROR_GPU_IS_LOST, C.NVML_ERROR_UNKNOWN, C.NVML_ERROR_TIMEOUT, 12345):
        assert classify(code) == FAULT


def test_readers_have_no_error_rules_of_their_own() -> None:
    """One policy (nvml_api.classify): no reader in hw/ keeps its own list of 'optional' codes."""
    own = {"nvml_api.py", "nvml_constants.py"}
    for p in sorted(HW.glob("*.py")):
        if p.name in own:
            continue
        text = p.read_text()
        assert "_OPTIONAL" not in text and "NVML_ERROR_NO_PERMISSION" not in text, p.name


def _refusing(code: int, *calls: str) -> Patched:
    def refuse(real, *args):
        if getattr(args[0], "key", "") == "gpu0":
            raise NVMLError(code)
        return real(*args)
    return Patched(_sim(), **{c: refuse for c in calls})


@pytest.mark.parametrize("code", [C.NVML_ERROR_NO_PERMISSION, C.NVML_ERROR_NOT_SUPPORTED])
def test_an_optional_query_refused_leaves_the_gpu_and_the_value_unknown_everywhere(code: int) -> None:
    """Memory and processes refused on GPU 0: the node model, usage and health all keep the GPU,
    without the value; only a denied answer is named (health), so 'unknown' is never 'none'."""
    calls = ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetComputeRunningProcesses",
             "nvmlDeviceGetGraphicsRunningProcesses")
    view = nvml.read_view(_refusing(code, *calls), mig_minors={})
    assert len(view.gpus) == 8 and view.gpus[0].memory_bytes is None and view.notes == ()
    assert view.gpus[1].memory_bytes is not None
    reader = StatsReader(_refusing(code, *calls))
    stats = reader.read()
    assert reader.errors == [] and [s.index for s in stats] == list(range(8))
    assert (stats[0].mem_used, stats[0].procs) == (None, ())
    g0 = read_health(_refusing(code, *calls), [0, 1], include_fabric=False, include_processes=True).gpus[0]
    assert (g0.lost, g0.memory_used) == (None, None)
    if code == C.NVML_ERROR_NO_PERMISSION:
        assert g0.processes is None        # unknown: the epilog's leftover check must not see "none"
        assert g0.errors == {"memory": "NVML_ERROR_NO_PERMISSION", "processes": "NVML_ERROR_NO_PERMISSION"}
    else:
        assert g0.processes == () and g0.errors == {}


@pytest.mark.parametrize("code,listed", [(C.NVML_ERROR_NOT_FOUND, True), (C.NVML_ERROR_NO_PERMISSION, False),
                                         (C.NVML_ERROR_UNKNOWN, False)])
def test_gpu_instances_never_take_an_unreadable_compute_instance_for_none(code: int, listed: bool) -> None:
    """A compute instance that is not there is skipped; one that cannot be read is an error, not 'no CI'
    (before, any error skipped it, and a GI with unreadable CIs looked empty)."""
    sim = _sim("h100-mig", MigSimNvml)
    gpu = next(i for i, g in enumerate(_facts("h100-mig")["gpus"]) if g["mig"]["instances"])

    def ci(real, gi, cid):
        raise NVMLError(code)
    gpus = NvmlGpus(Patched(sim, nvmlGpuInstanceGetComputeInstanceById=ci))
    if listed:
        assert all(g.cis == () for g in gpus.gpu_instances(gpu)) and gpus.gpu_instances(gpu)
    else:
        with pytest.raises(GpuError) as ei:
            gpus.gpu_instances(gpu)
        assert ei.value.code == code and ei.value.call == "nvmlGpuInstanceGetComputeInstanceById"


def test_every_call_of_the_contract_is_pynvmls_with_the_same_arguments() -> None:
    """What the pynvml adapter will call on a GPU node exists there and takes these arguments."""
    import inspect
    pynvml = pytest.importorskip("pynvml")
    for call in sorted(CALLS):
        fn = getattr(pynvml, call, None)
        assert callable(fn), call
        ours = [p for p in inspect.signature(getattr(NvmlApi, call)).parameters if p != "self"]
        theirs = inspect.signature(fn).parameters
        required = [p for p, v in theirs.items() if v.default is inspect.Parameter.empty]
        assert len(required) <= len(ours) <= len(theirs), (call, ours, list(theirs))
