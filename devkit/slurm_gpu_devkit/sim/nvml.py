"""A faithful fake NVML: the NVML contract (:class:`slurm_gpu.hw.nvml_api.NvmlApi`)
with pynvml's names, signatures, structures and error codes, answering from
a machine's facts (see :mod:`slurm_gpu_devkit.sim.state`).

The project's real adapter (:mod:`slurm_gpu.hw.nvml`) and health reads run
against it unchanged.  A call of the contract the simulator does not model
answers NOT_SUPPORTED, like a driver without the feature; a name outside the
contract (and the few MIG calls it models beyond it) does not exist.  Handles
are :class:`~slurm_gpu.hw.nvml_api.Handle` objects named like the recorder names them (``gpu0``, ``gpu0/mig1``,
``gpu0/gi2``, ``gpu0/gi2/ci0``), so recording the simulator gives the same
keys as recording a real machine.

The queries are grouped by area: MIG reads in :mod:`slurm_gpu_devkit.sim.migread`,
health counters in :mod:`slurm_gpu_devkit.sim.health`, events in
:mod:`slurm_gpu_devkit.sim.events`, usage in :mod:`slurm_gpu_devkit.sim.usage` (mixins of
:class:`SimNvml`); identity, NVLink and fabric stay here.

Hooks for other parts (documented in ``docs/snapshots.md``):

* MIG: GPU/compute instances live in the state at
  ``facts.gpus[i].mig.instances`` (see :func:`mig_instances`); the mps/mig
  area's ``devkit/slurm_gpu_devkit/sim/mig.py`` adds create/destroy by editing that list
  under :meth:`SimNvml.edit` and reuses :func:`gi_id_for_placement`,
  :func:`mig_uuid`.
* Faults: ``state["overlay"]`` holds a fault overlay in the snapshot format
  (lost GPU, any call's result or error, a hang of N seconds), applied by
  :class:`~slurm_gpu.hw.nvml_overlay.OverlayNvml`, which :func:`slurm_gpu_devkit.sim.open_sim`
  wraps around the simulator; ``state["events"]`` is a queue of pending
  events that ``nvmlEventSetWait`` hands out once, to whichever process
  waits first (:func:`inject_event`).
"""
from __future__ import annotations

import os
import uuid as uuidlib
from typing import Any, Iterator, Mapping

from slurm_gpu.hw import nvml_constants as C
from slurm_gpu.hw.busid import normalize_bus_id
from slurm_gpu.hw.nvml_api import Handle, NVMLError, NvmlForward, NvmlStruct
from slurm_gpu.hw.nvml_overlay import OverlayNvml
from slurm_gpu.hw.nvml_replay import fill_struct
from .arch import architecture
from .events import EventsMixin, inject_event
from .health import HealthMixin
from .migread import (MIG_MAX_GPUS, MIG_MINORS_PER_GPU, MigReadMixin, gi_id_for_placement, mig_instances,
                      mig_minors_text, mig_uuid)
from .state import MemoryState, StateFile, new_state
from .usage import UsageMixin

__all__ = ["FaultySim", "MIG_MAX_GPUS", "MIG_MINORS_PER_GPU", "SimNvml", "add_process", "gi_id_for_placement",
           "inject_event", "iter_gpu_facts", "mig_instances", "mig_minors_text", "mig_uuid", "set_overlay"]


def _bus_nvml(bus: str) -> str:
    """``0000:18:00.0`` -> NVML's ``00000000:18:00.0``."""
    b = normalize_bus_id(bus)
    dom, rest = b.split(":", 1)
    return f"{int(dom, 16):08X}:{rest.upper()}"


def _pci(bus: str, device_id: int, subsys: int) -> NvmlStruct:
    if not bus:  # a peer outside this node (multi-node NVSwitch): no PCI address
        return NvmlStruct({"busIdLegacy": "", "domain": 0, "bus": 0, "device": 0, "pciDeviceId": device_id,
                           "pciSubSystemId": subsys, "busId": ""})
    b = normalize_bus_id(bus)
    dom, busn, devfn = b.split(":")
    nv = _bus_nvml(b)
    return NvmlStruct({"busIdLegacy": f"{int(dom, 16):04X}:{busn.upper()}:{devfn.upper()}", "domain": int(dom, 16),
                       "bus": int(busn, 16), "device": int(devfn.split(".")[0], 16),
                       "pciDeviceId": device_id, "pciSubSystemId": subsys, "busId": nv})


def _int(v: Any) -> int:
    return int(v, 0) if isinstance(v, str) else int(v)


class SimNvml(MigReadMixin, HealthMixin, EventsMixin, UsageMixin, NvmlForward):
    """pynvml's surface over a simulated machine (see module docstring).

    Usage queries (utilisation, power, energy, processes, GPM, accounting)
    answer from the scripted load: :mod:`slurm_gpu_devkit.sim.usage`.
    """

    def __init__(self, store: StateFile | MemoryState) -> None:
        self._store = store
        self._initialised = 0

    @classmethod
    def from_facts(cls, facts: dict[str, Any], *, hwloc_xml: str | None = None) -> "SimNvml":
        """An in-memory simulator (no state file)."""
        return cls(MemoryState(new_state(facts, hwloc_xml=hwloc_xml)))

    @classmethod
    def from_state_file(cls, path: str) -> "SimNvml":
        return cls(StateFile(path))

    # -- state helpers ----------------------------------------------------

    @property
    def state(self) -> dict[str, Any]:
        return self._store.read()

    def hwloc_xml(self) -> str | None:
        """The modelled machine's lstopo XML (the backend contract of slurm_gpu.hw.backend)."""
        xml = self.state.get("hwloc_xml")
        return xml if isinstance(xml, str) and xml else None

    def edit(self) -> Any:
        """Context manager: the locked, writable state (for MIG and fault hooks)."""
        return self._store.edit()

    def _gpus(self) -> list[dict[str, Any]]:
        return self.state["facts"]["gpus"]

    def _gpu(self, h: Any) -> tuple[int, dict[str, Any]]:
        self._check_init()
        if not isinstance(h, Handle) or not h.key.startswith("gpu"):
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        idx = int(h.key.split("/")[0][3:])
        gpus = self._gpus()
        if idx >= len(gpus):
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        return idx, gpus[idx]

    def _check_init(self) -> None:
        if not self._initialised:
            raise NVMLError(C.NVML_ERROR_UNINITIALIZED)

    # -- library ----------------------------------------------------------

    def nvmlInit(self) -> None:
        self._initialised += 1

    def nvmlShutdown(self) -> None:
        self._check_init()
        self._initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.state["facts"].get("driver_version", "565.57.01")

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_init()
        return int(self.state["facts"].get("cuda_driver_version", 12070))

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check_init()
        return self.state["facts"].get("nvml_version", "12." + self.nvmlSystemGetDriverVersion())

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self._gpus())

    # -- handles ----------------------------------------------------------

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._check_init()
        if not 0 <= int(index) < len(self._gpus()):
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        return Handle(f"gpu{int(index)}")

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Handle:
        self._check_init()
        u = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, g in enumerate(self._gpus()):
            if g["uuid"] == u:
                return self.nvmlDeviceGetHandleByIndex(i)
            for gi in mig_instances(g):
                for ci in gi.get("cis", ()):
                    if ci.get("uuid") == u:
                        return Handle(f"gpu{i}/mig{self._mig_list(g).index((gi, ci))}")
        raise NVMLError(C.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str | bytes) -> Handle:
        self._check_init()
        b = normalize_bus_id(pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId)
        for i, g in enumerate(self._gpus()):
            if normalize_bus_id(g["bus_id"]) == b:
                return self.nvmlDeviceGetHandleByIndex(i)
        raise NVMLError(C.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        i, _ = self._gpu(handle)
        return i

    # -- identity ---------------------------------------------------------

    def _mig_of(self, h: Handle) -> tuple[dict[str, Any], dict[str, Any]] | None:
        parts = h.key.split("/")
        if len(parts) == 2 and parts[1].startswith("mig"):
            _, g = self._gpu(h)
            lst = self._mig_list(g)
            j = int(parts[1][3:])
            if j >= len(lst):
                raise NVMLError(C.NVML_ERROR_NOT_FOUND)
            return lst[j]
        return None

    def _simple(self, fn: str, h: Handle, args: tuple[Any, ...] = ()) -> tuple[int, dict[str, Any]]:
        # Faults are not applied here: OverlayNvml wraps the simulator (open_sim).
        return self._gpu(h)

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        i, g = self._simple("nvmlDeviceGetName", handle)
        mig = self._mig_of(handle)
        if mig:
            gi, ci = mig
            prefix = f"{ci['slices']}c." if ci["slices"] != gi["slices"] else ""
            return f"{g['name']} MIG {prefix}{gi['profile']}"
        return g["name"]

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        i, g = self._simple("nvmlDeviceGetUUID", handle)
        mig = self._mig_of(handle)
        if mig:
            gi, ci = mig
            return ci.get("uuid") or mig_uuid(g["uuid"], gi["gi_id"], ci["ci_id"])
        return g["uuid"]

    def nvmlDeviceGetSerial(self, handle: Handle) -> str:
        i, g = self._simple("nvmlDeviceGetSerial", handle)
        if "serial" not in g:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        return str(g["serial"])

    def nvmlDeviceGetMinorNumber(self, handle: Handle) -> int:
        i, g = self._simple("nvmlDeviceGetMinorNumber", handle)
        return int(g.get("minor", i))

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> NvmlStruct:
        i, g = self._simple("nvmlDeviceGetPciInfo", handle)
        return _pci(g["bus_id"], _int(g["pci_device_id"]), _int(g.get("pci_subsystem_id", 0)))

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> NvmlStruct:
        i, g = self._simple("nvmlDeviceGetMemoryInfo", handle)
        total = int(g["memory_mib"]) * 1024 * 1024
        reserved = int(g.get("memory_reserved_mib", 0)) * 1024 * 1024
        used = int(g.get("memory_used_mib", 0)) * 1024 * 1024
        used += sum(p.get("used_memory_mib", 0) for p in self._live_processes(i)) * 1024 * 1024
        scripted = self.scripted_memory_used(handle)
        if scripted is not None:
            used, total = used + scripted[0], scripted[1]
        d = {"total": total, "free": total - used - reserved, "used": used}
        if version:
            d = {"version": version, "total": total, "reserved": reserved, "free": total - used - reserved,
                 "used": used}
        return NvmlStruct(d)

    def _live_processes(self, index: int) -> list[dict[str, Any]]:
        """The state's ``processes`` on GPU *index* whose pid still runs: as with a
        real driver, a process that exited holds no context any more."""
        out = []
        for p in self.state.get("processes") or ():
            if p.get("gpu") != index:
                continue
            try:
                os.kill(int(p["pid"]), 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            out.append(p)
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[NvmlStruct]:
        i, g = self._simple("nvmlDeviceGetComputeRunningProcesses", handle)
        return [NvmlStruct({"pid": int(p["pid"]),
                            "usedGpuMemory": int(p.get("used_memory_mib", 0)) * 1024 * 1024,
                            "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF})
                for p in self._live_processes(i)] + self.scripted_processes(handle)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Handle) -> list[NvmlStruct]:
        self._simple("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return []

    def nvmlDeviceGetArchitecture(self, device: Handle) -> int:
        i, g = self._simple("nvmlDeviceGetArchitecture", device)
        return architecture(g)

    def nvmlDeviceGetPersistenceMode(self, handle: Handle) -> int:
        i, g = self._simple("nvmlDeviceGetPersistenceMode", handle)
        return int(g.get("health", {}).get("persistence_mode", 1))

    def nvmlDeviceGetComputeMode(self, handle: Handle) -> int:
        i, g = self._simple("nvmlDeviceGetComputeMode", handle)
        return int(self.state.get("compute_mode", {}).get(str(i), C.NVML_COMPUTEMODE_DEFAULT))

    def nvmlDeviceSetComputeMode(self, handle: Handle, mode: int) -> None:
        i, g = self._simple("nvmlDeviceSetComputeMode", handle, (mode,))
        if mode not in (C.NVML_COMPUTEMODE_DEFAULT, C.NVML_COMPUTEMODE_PROHIBITED,
                        C.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS):
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        with self.edit() as st:
            st.setdefault("compute_mode", {})[str(i)] = int(mode)

    # -- NVLink -----------------------------------------------------------

    def _link(self, handle: Handle, fn: str, link: int) -> dict[str, Any] | None:
        i, g = self._simple(fn, handle, (link,))
        nv = g.get("nvlink") or {}
        count = int(nv.get("count", 0))
        if count == 0:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= int(link) < count:
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        for peer in nv.get("peers", ()):
            if int(link) in peer["links"]:
                return peer
        return None

    def nvmlDeviceGetNvLinkState(self, device: Handle, link: int) -> int:
        peer = self._link(device, "nvmlDeviceGetNvLinkState", link)
        if peer is None:
            return C.NVML_FEATURE_DISABLED
        down = peer.get("down", ())
        return C.NVML_FEATURE_DISABLED if int(link) in down else C.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Handle, link: int) -> NvmlStruct:
        peer = self._link(device, "nvmlDeviceGetNvLinkRemotePciInfo", link)
        if peer is None:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        dev = {"gpu": 0x233010DE, "switch": 0x22A310DE, "npu": 0}.get(peer["type"], 0)
        return _pci(peer["bus_id"], _int(peer.get("pci_device_id", dev)), 0)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Handle, link: int) -> int:
        peer = self._link(handle, "nvmlDeviceGetNvLinkRemoteDeviceType", link)
        if peer is None:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        return {"gpu": C.NVML_NVLINK_DEVICE_TYPE_GPU, "switch": C.NVML_NVLINK_DEVICE_TYPE_SWITCH,
                "npu": C.NVML_NVLINK_DEVICE_TYPE_IBMNPU}.get(peer["type"], C.NVML_NVLINK_DEVICE_TYPE_UNKNOWN)

    def nvmlDeviceGetNvLinkVersion(self, device: Handle, link: int) -> int:
        self._link(device, "nvmlDeviceGetNvLinkVersion", link)   # raises for a link that is not there
        return int((self._gpu(device)[1].get("nvlink") or {}).get("version", 4))

    # -- fabric -----------------------------------------------------------

    def _fabric(self, device: Handle, fn: str, ref: Any, versioned: bool) -> int:
        i, g = self._simple(fn, device)
        fab = g.get("fabric")
        if fab is None:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        u = uuidlib.UUID(fab.get("cluster_uuid", "00000000-0000-0000-0000-000000000000"))
        states = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}
        st = fab.get("state", "completed")
        plain = {"clusterUuid": list(u.bytes), "status": int(fab.get("status", 0)),
                 "cliqueId": int(fab.get("clique_id", 0)), "state": states.get(st, st) if isinstance(st, str) else st}
        if versioned:
            plain["healthMask"] = int(fab.get("health_mask", 0))
            # v3's summary (0 when the machine's facts give none: "not supported");
            # a v2 caller's structure has no such field, and fill_struct skips it.
            plain["healthSummary"] = int(fab.get("health_summary", 0))
        fill_struct(ref, plain)
        return C.NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, device: Handle, gpuFabricInfo: Any) -> int:
        return self._fabric(device, "nvmlDeviceGetGpuFabricInfo", gpuFabricInfo, False)

    def nvmlDeviceGetGpuFabricInfoV(self, device: Handle, gpuFabricInfo: Any) -> int:
        return self._fabric(device, "nvmlDeviceGetGpuFabricInfoV", gpuFabricInfo, True)

    # -- the rest of the contract ----------------------------------------

    def _call(self, fn: str, args: tuple[Any, ...]) -> Any:
        # A real driver lacking a feature answers NOT_SUPPORTED; the
        # simulator does the same for the contract's calls it does not model.
        self._check_init()
        raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)


class FaultySim(OverlayNvml):
    """The simulator with its state's fault overlay applied (read again on every call).

    Beyond the contract it offers what the simulator's own users need:
    its ``state`` and ``edit()``, and the backend's two optional calls
    (:mod:`slurm_gpu.hw.backend`): ``mig_minors()`` and ``hwloc_xml()``.
    """

    def __init__(self, sim: SimNvml) -> None:
        super().__init__(sim, lambda: sim.state.get("overlay") or {})
        self.sim = sim

    @property
    def state(self) -> dict[str, Any]:
        return self.sim.state

    def edit(self) -> Any:
        return self.sim.edit()

    def mig_minors(self) -> dict[str, int]:
        return self.sim.mig_minors()

    def hwloc_xml(self) -> str | None:
        return self.sim.hwloc_xml()


def add_process(sim: Any, gpu: int, pid: int, used_memory_mib: int = 0) -> None:
    """Give process *pid* a context on GPU *gpu* (what a CUDA program's cuInit does);
    NVML lists it while the pid runs."""
    with sim.edit() as st:
        st.setdefault("processes", []).append({"gpu": int(gpu), "pid": int(pid),
                                               "used_memory_mib": int(used_memory_mib)})


def set_overlay(sim: Any, overlay: Mapping[str, Any]) -> None:
    """Replace the injected faults (snapshot overlay format; {} clears them).

    A malformed overlay, or one naming a GPU the machine lacks, raises
    InputError and changes nothing.
    """
    from slurm_gpu.errors import InputError
    from slurm_gpu.hw.nvml_overlay import OverlayNvml
    try:
        OverlayNvml(sim, dict(overlay))
    except ValueError as e:
        raise InputError(f"bad overlay: {e}", "simulator") from None
    with sim.edit() as st:
        st["overlay"] = dict(overlay)


def iter_gpu_facts(sim: SimNvml) -> Iterator[dict[str, Any]]:
    """The simulated GPUs' facts, in NVML index order (read-only use: edit under ``sim.edit()``)."""
    yield from sim.state["facts"]["gpus"]
