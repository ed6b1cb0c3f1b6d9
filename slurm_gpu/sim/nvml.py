"""A faithful fake NVML: pynvml's function names, signatures, structures and
error codes, answering from a machine's facts (see :mod:`slurm_gpu.sim.state`).

The project's real adapter (:mod:`slurm_gpu.hw.nvml`) and health reads run
against it unchanged.  Handles are :class:`~slurm_gpu.hw.nvml_replay.Handle`
objects named like the recorder names them (``gpu0``, ``gpu0/mig1``,
``gpu0/gi2``, ``gpu0/gi2/ci0``), so recording the simulator gives the same
keys as recording a real machine.

Hooks for other parts (documented in ``docs/snapshots.md``):

* MIG: GPU/compute instances live in the state at
  ``facts.gpus[i].mig.instances`` (see :func:`mig_instances`); the mps/mig
  area's ``slurm_gpu/sim/mig.py`` adds create/destroy by editing that list
  under :meth:`SimNvml.edit` and reuses :func:`gi_id_for_placement`,
  :func:`mig_uuid`.
* Faults: ``state["overlay"]`` holds a fault overlay in the snapshot format
  (lost GPU, any call's result or error, a hang of N seconds), applied by
  :class:`~slurm_gpu.hw.nvml_overlay.OverlayNvml`, which :func:`slurm_gpu.sim.open_sim`
  wraps around the simulator; ``state["events"]`` is a queue of pending
  events that ``nvmlEventSetWait`` hands out once, to whichever process
  waits first (:func:`inject_event`).
"""
from __future__ import annotations

import os
import time
import uuid as uuidlib
from typing import Any, Iterator, Mapping

from ..hw import nvml_constants as C
from ..hw.model import normalize_bus_id
from ..hw.nvml import MIG_CAPS_PER_GI, MIG_GIS_PER_GPU, mig_cap_minor
from ..hw.nvml_replay import Handle, NVMLError, NvmlStruct, NvmlSurface, fill_struct
from .arch import architecture
from .state import MemoryState, StateFile, new_state
from .usage import UsageMixin

MIG_MINORS_PER_GPU = MIG_GIS_PER_GPU * MIG_CAPS_PER_GI   # 135: 15 GIs x (1 GI + 8 CI access entries)
MIG_MAX_GPUS = 32


def gi_id_for_placement(start: int, size: int, slices: int = 8) -> int:
    """The GPU instance id the simulator gives a new instance at *start*:*size*.

    Ids number the partition tree of a GPU with *slices* memory slices: 0 is
    the whole GPU, then the halves, quarters and eighths, left to right
    (8 slices: 1-2, 3-6, 7-14; A30's 4 slices: 1-2, 3-6).  This is what the
    real ``nvidia-smi mig -lgi`` listings in tests/data/mig show for
    instances created on an empty GPU (A100: 1g at 0:1..6:1 are GIs 7..13,
    2g at 2:2 is GI 4, 3g at 4:4 is GI 2; A30: 1g at 0:1..3:1 are GIs 3..6).
    Real drivers also reuse ids by creation history (another A100 listing
    has a 3g at 4:4 as GI 1), so recorded machines keep their recorded ids
    and nothing in the project finds an instance by id alone.
    """
    if size >= slices:
        return 0
    return slices // size - 1 + start // size


def mig_uuid(gpu_uuid: str, gi_id: int, ci_id: int) -> str:
    """A stable MIG device UUID for a GI/CI on a GPU."""
    u = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"{gpu_uuid}/{gi_id}/{ci_id}")
    return f"MIG-{u}"


# The /dev/nvidia-caps minor for ``gpuN/giG[/ciC]/access`` (driver's numbering).
mig_minor = mig_cap_minor


def mig_minors_text(gpu_count: int = MIG_MAX_GPUS) -> str:
    """The content of ``/proc/driver/nvidia-caps/mig-minors`` (config, monitor, then per GPU)."""
    lines = ["config 1", "monitor 2"]
    for g in range(gpu_count):
        for gi in range(15):
            lines.append(f"gpu{g}/gi{gi}/access {mig_minor(g, gi)}")
            for ci in range(8):
                lines.append(f"gpu{g}/gi{gi}/ci{ci}/access {mig_minor(g, gi, ci)}")
    return "\n".join(lines) + "\n"


def mig_instances(gpu: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The GPU instances of a GPU's facts: each has gi_id, gi_profile_id,
    profile, start, size, slices, memory_mb, sm_count and a ``cis`` list of
    {ci_id, ci_profile_id, start, slices, sm_count, uuid}."""
    mig = gpu.get("mig") or {}
    return list(mig.get("instances") or [])


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


class SimNvml(UsageMixin, NvmlSurface):
    """pynvml's surface over a simulated machine (see module docstring).

    Usage queries (utilisation, power, energy, processes, GPM, accounting)
    answer from the scripted load: :mod:`slurm_gpu.sim.usage`.
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
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
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

    nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion

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

    nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

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

    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses

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

    nvmlDeviceGetNvLinkRemotePciInfo_v2 = nvmlDeviceGetNvLinkRemotePciInfo

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Handle, link: int) -> int:
        peer = self._link(handle, "nvmlDeviceGetNvLinkRemoteDeviceType", link)
        if peer is None:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        return {"gpu": C.NVML_NVLINK_DEVICE_TYPE_GPU, "switch": C.NVML_NVLINK_DEVICE_TYPE_SWITCH,
                "npu": C.NVML_NVLINK_DEVICE_TYPE_IBMNPU}.get(peer["type"], C.NVML_NVLINK_DEVICE_TYPE_UNKNOWN)

    def nvmlDeviceGetNvLinkVersion(self, device: Handle, link: int) -> int:
        self._link(device, "nvmlDeviceGetNvLinkVersion", link)   # raises for a link that is not there
        return int((self._gpu(device)[1].get("nvlink") or {}).get("version", 4))

    # -- MIG --------------------------------------------------------------

    def _mig_list(self, g: Mapping[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        out = []
        for gi in sorted(mig_instances(g), key=lambda x: x["gi_id"]):
            for ci in sorted(gi.get("cis", ()), key=lambda x: x["ci_id"]):
                out.append((gi, ci))
        return out

    def _mig_capable(self, g: Mapping[str, Any]) -> dict[str, Any]:
        mig = g.get("mig")
        if not mig:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        return mig

    def nvmlDeviceGetMigMode(self, device: Handle) -> list[int]:
        i, g = self._simple("nvmlDeviceGetMigMode", device)
        mig = self._mig_capable(g)
        cur = int(mig.get("mode", 0))
        return [cur, int(mig.get("pending", cur))]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Handle) -> int:
        i, g = self._simple("nvmlDeviceGetMaxMigDeviceCount", device)
        mig = self._mig_capable(g)
        return int(mig.get("max_devices", 7)) if int(mig.get("mode", 0)) else 0

    def _need_mig_on(self, g: Mapping[str, Any]) -> dict[str, Any]:
        mig = self._mig_capable(g)
        if not int(mig.get("mode", 0)):
            raise NVMLError(C.NVML_ERROR_INVALID_STATE)
        return mig

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Handle, index: int) -> Handle:
        i, g = self._simple("nvmlDeviceGetMigDeviceHandleByIndex", device, (index,))
        self._need_mig_on(g)
        if not 0 <= int(index) < int(g["mig"].get("max_devices", 7)):
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        if int(index) >= len(self._mig_list(g)):
            raise NVMLError(C.NVML_ERROR_NOT_FOUND)
        return Handle(f"gpu{i}/mig{int(index)}")

    def nvmlDeviceIsMigDeviceHandle(self, device: Handle) -> int:
        self._gpu(device)
        return 1 if "/mig" in device.key else 0

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Handle) -> Handle:
        if self._mig_of(migDevice) is None:
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        return Handle(migDevice.key.split("/")[0])

    def _mig_required(self, h: Handle) -> tuple[dict[str, Any], dict[str, Any]]:
        m = self._mig_of(h)
        if m is None:
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        return m

    def nvmlDeviceGetGpuInstanceId(self, device: Handle) -> int:
        return int(self._mig_required(device)[0]["gi_id"])

    def nvmlDeviceGetComputeInstanceId(self, device: Handle) -> int:
        return int(self._mig_required(device)[1]["ci_id"])

    def nvmlDeviceGetAttributes(self, device: Handle) -> NvmlStruct:
        i, g = self._simple("nvmlDeviceGetAttributes", device)
        m = self._mig_of(device)
        if m is None:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        gi, ci = m
        return NvmlStruct({"multiprocessorCount": int(ci["sm_count"]), "sharedCopyEngineCount": int(gi["slices"]),
                           "sharedDecoderCount": int(gi.get("decoders", 1)), "sharedEncoderCount": 0,
                           "sharedJpegCount": 0, "sharedOfaCount": 0,
                           "gpuInstanceSliceCount": int(gi["slices"]), "computeInstanceSliceCount": int(ci["slices"]),
                           "memorySizeMB": int(gi["memory_mb"])})

    nvmlDeviceGetAttributes_v2 = nvmlDeviceGetAttributes

    def _gi(self, h: Handle) -> tuple[int, dict[str, Any], dict[str, Any]]:
        parts = h.key.split("/")
        if len(parts) < 2 or not parts[1].startswith("gi"):
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        i, g = self._gpu(h)
        gid = int(parts[1][2:])
        for gi in mig_instances(g):
            if int(gi["gi_id"]) == gid:
                return i, g, gi
        raise NVMLError(C.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetGpuInstanceById(self, device: Handle, gpuInstanceId: int) -> Handle:
        i, g = self._simple("nvmlDeviceGetGpuInstanceById", device, (gpuInstanceId,))
        self._need_mig_on(g)
        h = Handle(f"gpu{i}/gi{int(gpuInstanceId)}")
        self._gi(h)
        return h

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Handle) -> NvmlStruct:
        i, g, gi = self._gi(gpuInstance)
        return NvmlStruct({"device": Handle(f"gpu{i}"), "id": int(gi["gi_id"]), "profileId": int(gi["gi_profile_id"]),
                           "placement": NvmlStruct({"start": int(gi["start"]), "size": int(gi["size"])})})

    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance: Handle, computeInstanceId: int) -> Handle:
        i, g, gi = self._gi(gpuInstance)
        for ci in gi.get("cis", ()):
            if int(ci["ci_id"]) == int(computeInstanceId):
                return Handle(f"{gpuInstance.key}/ci{int(computeInstanceId)}")
        raise NVMLError(C.NVML_ERROR_NOT_FOUND)

    def _ci(self, h: Handle) -> tuple[int, dict[str, Any], dict[str, Any], str, int]:
        """A compute-instance handle ``gpuN/giM/ciK`` -> (gpu index, gpu, GI, GI key, CI id)."""
        if "/ci" not in h.key:
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        gi_key, ci_part = h.key.rsplit("/", 1)
        i, g, gi = self._gi(Handle(gi_key))
        return i, g, gi, gi_key, int(ci_part[2:])

    def nvmlComputeInstanceGetInfo(self, computeInstance: Handle) -> NvmlStruct:
        i, g, gi, gi_key, cid = self._ci(computeInstance)
        for ci in gi.get("cis", ()):
            if int(ci["ci_id"]) == cid:
                return NvmlStruct({"device": Handle(f"gpu{i}"), "gpuInstance": Handle(gi_key), "id": int(ci["ci_id"]),
                                   "profileId": int(ci["ci_profile_id"]),
                                   "placement": NvmlStruct({"start": int(ci.get("start", 0)),
                                                            "size": int(ci["slices"])})})
        raise NVMLError(C.NVML_ERROR_NOT_FOUND)

    nvmlComputeInstanceGetInfo_v2 = nvmlComputeInstanceGetInfo

    def mig_minors(self) -> dict[str, int]:
        """What ``/proc/driver/nvidia-caps/mig-minors`` holds on this machine."""
        out: dict[str, int] = {}
        for i, g in enumerate(self._gpus()):
            m = int(g.get("minor", i))
            for gi in range(15):
                out[f"gpu{m}/gi{gi}/access"] = mig_minor(m, gi)
                for ci in range(8):
                    out[f"gpu{m}/gi{gi}/ci{ci}/access"] = mig_minor(m, gi, ci)
        return out

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
        fill_struct(ref, plain)
        return C.NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, device: Handle, gpuFabricInfo: Any) -> int:
        return self._fabric(device, "nvmlDeviceGetGpuFabricInfo", gpuFabricInfo, False)

    def nvmlDeviceGetGpuFabricInfoV(self, device: Handle, gpuFabricInfo: Any) -> int:
        return self._fabric(device, "nvmlDeviceGetGpuFabricInfoV", gpuFabricInfo, True)

    # -- health -----------------------------------------------------------

    def _health(self, fn: str, handle: Handle, args: tuple[Any, ...] = ()) -> dict[str, Any]:
        i, g = self._simple(fn, handle, args)
        return g.get("health") or {}

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, errorType: int, counterType: int) -> int:
        h = self._health("nvmlDeviceGetTotalEccErrors", handle, (errorType, counterType))
        if h.get("ecc") is False:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        kind = "uncorrected" if errorType == C.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"
        counter = "volatile" if counterType == C.NVML_VOLATILE_ECC else "aggregate"
        return int(h.get(f"ecc_{counter}_{kind}", 0))

    def nvmlDeviceGetEccMode(self, handle: Handle) -> list[int]:
        h = self._health("nvmlDeviceGetEccMode", handle)
        if h.get("ecc") is False:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        return [1, 1]

    def nvmlDeviceGetRemappedRows(self, device: Handle) -> tuple[int, int, int, int]:
        h = self._health("nvmlDeviceGetRemappedRows", device)
        rr = h.get("remapped_rows")
        if rr is None:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        return (int(rr.get("correctable", 0)), int(rr.get("uncorrectable", 0)), int(rr.get("pending", 0)),
                int(rr.get("failed", 0)))

    def nvmlDeviceGetRetiredPages(self, device: Handle, sourceFilter: int) -> list[int]:
        h = self._health("nvmlDeviceGetRetiredPages", device, (sourceFilter,))
        rp = h.get("retired_pages")
        if rp is None:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        key = "double_bit" if sourceFilter == C.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR else "single_bit"
        return list(rp.get(key, []))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Handle) -> int:
        h = self._health("nvmlDeviceGetRetiredPagesPendingStatus", device)
        rp = h.get("retired_pages")
        if rp is None:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        return int(rp.get("pending", 0))

    def _pcie(self, fn: str, handle: Handle, key: str, default: int) -> int:
        h = self._health(fn, handle)
        return int((h.get("pcie") or {}).get(key, default))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Handle) -> int:
        return self._pcie("nvmlDeviceGetCurrPcieLinkGeneration", handle, "gen", 5)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Handle) -> int:
        return self._pcie("nvmlDeviceGetMaxPcieLinkGeneration", handle, "max_gen", 5)

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: Handle) -> int:
        return self._pcie("nvmlDeviceGetGpuMaxPcieLinkGeneration", handle, "max_gen", 5)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Handle) -> int:
        return self._pcie("nvmlDeviceGetCurrPcieLinkWidth", handle, "width", 16)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Handle) -> int:
        return self._pcie("nvmlDeviceGetMaxPcieLinkWidth", handle, "max_width", 16)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        h = self._health("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return int(h.get("clocks_event_reasons", C.nvmlClocksEventReasonGpuIdle))

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        h = self._health("nvmlDeviceGetTemperature", handle, (sensor,))
        return int(h.get("temperature", 34))

    def nvmlDeviceGetFieldValues(self, handle: Handle, fieldIds: list[Any]) -> list[NvmlStruct]:
        h = self._health("nvmlDeviceGetFieldValues", handle, (list(fieldIds),))
        fields = {str(k): v for k, v in (h.get("fields") or {}).items()}
        out = []
        for fid in fieldIds:
            fid, scope = (fid if isinstance(fid, (tuple, list)) else (fid, 0))
            v = fields.get(str(fid))
            ret = C.NVML_SUCCESS if v is not None else C.NVML_ERROR_NOT_SUPPORTED
            val = int(v or 0)
            out.append(NvmlStruct({"fieldId": fid, "scopeId": scope, "timestamp": 0, "latencyUsec": 0,
                                   "valueType": C.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "nvmlReturn": ret,
                                   "value": NvmlStruct({"dVal": float(val), "uiVal": val & 0xFFFFFFFF,
                                                        "ulVal": val, "ullVal": val, "sllVal": val,
                                                        "siVal": val, "usVal": val & 0xFFFF})}))
        return out

    # -- events -----------------------------------------------------------

    def nvmlEventSetCreate(self) -> Handle:
        self._check_init()
        return Handle("eventset")

    def nvmlDeviceRegisterEvents(self, handle: Handle, eventTypes: int, eventSet: Handle) -> None:
        self._simple("nvmlDeviceRegisterEvents", handle, (eventTypes,))

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        self._gpu(handle)
        return (C.nvmlEventTypeXidCriticalError | C.nvmlEventTypeDoubleBitEccError
                | C.nvmlEventTypeSingleBitEccError)

    def nvmlEventSetWait_v2(self, eventSet: Handle, timeoutms: int) -> NvmlStruct:
        """Hand out the oldest pending event from the state, once."""
        self._check_init()
        deadline = time.monotonic() + timeoutms / 1000.0
        while True:
            if self.state.get("events"):
                with self.edit() as st:
                    ev = st["events"].pop(0) if st.get("events") else None
                if ev is not None:
                    return _event_struct(ev, self._gpus())
            if time.monotonic() >= deadline:
                raise NVMLError(C.NVML_ERROR_TIMEOUT)
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    nvmlEventSetWait = nvmlEventSetWait_v2

    def nvmlEventSetFree(self, eventSet: Handle) -> None:
        return None

    # -- what else pynvml has ---------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml") and name[4:5].isupper() and not hasattr(C, name):
            # A real driver lacking a feature answers NOT_SUPPORTED; the
            # simulator does the same for the parts of NVML it does not model.
            def unsupported(*args: Any, _name: str = name) -> Any:
                self._check_init()
                raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)

            unsupported.__name__ = name
            return unsupported
        return super().__getattr__(name)


_EVENT_TYPES = {"xid": C.nvmlEventTypeXidCriticalError, "double_bit_ecc": C.nvmlEventTypeDoubleBitEccError,
                "single_bit_ecc": C.nvmlEventTypeSingleBitEccError}


def _event_struct(ev: Mapping[str, Any], gpus: list[dict[str, Any]]) -> NvmlStruct:
    gpu = ev.get("gpu", 0)
    if isinstance(gpu, str) and not gpu.startswith("gpu"):
        b = normalize_bus_id(gpu)
        gpu = next((i for i, g in enumerate(gpus) if normalize_bus_id(g["bus_id"]) == b), 0)
    key = gpu if isinstance(gpu, str) else f"gpu{int(gpu)}"
    et = ev.get("type", "xid")
    return NvmlStruct({"device": Handle(key), "eventType": _EVENT_TYPES.get(et, et) if isinstance(et, str) else et,
                       "eventData": int(ev.get("data", 0)), "gpuInstanceId": int(ev.get("gpu_instance", 0xFFFFFFFF)),
                       "computeInstanceId": int(ev.get("compute_instance", 0xFFFFFFFF))})


def inject_event(sim: Any, gpu: int | str, data: int, type: str = "xid") -> None:
    """Queue an NVML event (e.g. XID 79 on a bus id) for the next nvmlEventSetWait."""
    with sim.edit() as st:
        st.setdefault("events", []).append({"gpu": gpu, "type": type, "data": int(data)})


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
    from ..errors import InputError
    from ..hw.nvml_overlay import OverlayNvml
    try:
        OverlayNvml(sim, dict(overlay))
    except ValueError as e:
        raise InputError(f"bad overlay: {e}", "simulator") from None
    with sim.edit() as st:
        st["overlay"] = dict(overlay)


def iter_gpu_facts(sim: SimNvml) -> Iterator[dict[str, Any]]:
    """The simulated GPUs' facts, in NVML index order (read-only use: edit under ``sim.edit()``)."""
    yield from sim.state["facts"]["gpus"]
