"""Reading MIG state in the simulator: instances, MIG devices and the nvidia-caps minors.

Mixed into :class:`~slurm_gpu_devkit.sim.nvml.SimNvml` (it uses its handle and
state helpers); :mod:`slurm_gpu_devkit.sim.mig` adds create and destroy.  GPU and
compute instances live in the state at ``facts.gpus[i].mig.instances``.
"""
from __future__ import annotations

import uuid as uuidlib
from typing import Any, Mapping

from slurm_gpu.hw import nvml_constants as C
from slurm_gpu.hw.nvml import MIG_CAPS_PER_GI, MIG_GIS_PER_GPU, mig_cap_minor
from slurm_gpu.hw.nvml_api import Handle, NVMLError, NvmlStruct
from .base import SimBase

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


class MigReadMixin(SimBase):
    """The MIG queries of NVML, answered from the state."""

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
