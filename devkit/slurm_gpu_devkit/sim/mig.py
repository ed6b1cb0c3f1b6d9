"""MIG create/destroy for the NVML simulator: pynvml's names, signatures and error codes.

:class:`MigSimNvml` extends the nvml+snapshot area's :class:`~slurm_gpu_devkit.sim.nvml.SimNvml`
(which already answers MIG *reads* from ``facts.gpus[i].mig.instances``)
with the calls that change MIG state.  Changes are made under the state
file's lock (:meth:`SimNvml.edit`), so the prolog, the epilog and the health
check (separate processes) all see them.  ``[node] nvml = "sim:<file>"``
selects it (:func:`open_mig_sim`).

Placement rules are the real ones (:mod:`slurm_gpu.mig.profiles`: placements
in memory slices, per-profile instance limits, the compute-slice budget, one
media-extension instance), and so are NVML's documented return codes:

* ``NOT_SUPPORTED``: not a MIG-capable model, MIG mode off (create), a
  profile this model lacks, a CI size the GI cannot hold;
* ``INVALID_ARGUMENT``: unknown profile id, a placement the profile does not
  allow, a handle of the wrong kind, a bad mode;
* ``INSUFFICIENT_RESOURCES``: overlapping placement, instance limit or
  compute slices exhausted;
* ``IN_USE``: destroying a GI that still has CIs, an instance with running
  processes (``busy``), any change while a simulated client holds the GPU
  (``state["mig_holders"]``, e.g. DCGM), MIG mode change with instances;
* ``NOT_FOUND``: no instance with that id; ``INSUFFICIENT_SIZE``: a
  placements array too small; ``NO_PERMISSION``: not root (the driver
  requires CAP_SYS_ADMIN for MIG changes).
"""
from __future__ import annotations

import os
from typing import Any

from slurm_gpu.hw import nvml_constants as C
from slurm_gpu.hw.nvml_api import Handle, NVMLError, NvmlStruct
from slurm_gpu.mig.profiles import CI_PLACEMENTS, CIP_BY_SLICES, GpuModel, identify
from .nvml import FaultySim, SimNvml, gi_id_for_placement, mig_instances, mig_uuid

_CI_SLICES = {v: k for k, v in CIP_BY_SLICES.items()}


def _ci_fit(gi: dict[str, Any], profile: int) -> tuple[int, int, tuple[int, ...]]:
    """(compute slices of CI *profile*, slices of GPU instance *gi*, the CI starts
    that fit in it): unknown profile INVALID_ARGUMENT, one the GI cannot hold NOT_SUPPORTED."""
    if int(profile) not in _CI_SLICES:
        raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
    slices = _CI_SLICES[int(profile)]
    gs = int(gi["slices"])
    starts = CI_PLACEMENTS.get(gs, {}).get(slices)
    if not starts:
        raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
    return slices, gs, tuple(starts)


def gi_id_for(model: GpuModel, start: int, size: int) -> int:
    """The GI id the simulator gives a new placement on this GPU model."""
    return gi_id_for_placement(start, size, model.memory_slices)


class MigSimNvml(SimNvml):
    """SimNvml plus MIG mode, GPU/compute instance create and destroy."""

    # -- helpers ----------------------------------------------------------
    def _model(self, g: dict[str, Any]) -> GpuModel:
        self._mig_capable(g)
        m = identify(g.get("pci_device_id"), str(g.get("name", "")))
        # A model whose driver figures NVIDIA does not publish cannot be simulated faithfully.
        if m is None or not m.complete:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        return m

    @staticmethod
    def _root() -> None:
        if os.geteuid() != 0:
            raise NVMLError(C.NVML_ERROR_NO_PERMISSION)

    @staticmethod
    def _held(st: dict[str, Any], index: int, op: str) -> bool:
        for h in st.get("mig_holders", []):
            if op in h.get("blocks", ("create", "destroy", "mig_mode")) and \
                    index in h.get("gpus", [index]):
                return True
        return False

    @staticmethod
    def _gpu_of(st: dict[str, Any], i: int) -> dict[str, Any]:
        return st["facts"]["gpus"][i]

    def _profile(self, m: GpuModel, profile_id: int):  # type: ignore[no-untyped-def]
        p = m.profile_by_id(int(profile_id))
        if p is None:
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        return p

    # -- MIG mode ---------------------------------------------------------
    def nvmlDeviceSetMigMode(self, device: Handle, mode: int) -> int:
        i, g = self._gpu(device)
        self._model(g)
        self._root()
        if int(mode) not in (C.NVML_DEVICE_MIG_DISABLE, C.NVML_DEVICE_MIG_ENABLE):
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        with self.edit() as st:
            mig = self._gpu_of(st, i)["mig"]
            if mig.get("instances") or self._held(st, i, "mig_mode"):
                raise NVMLError(C.NVML_ERROR_IN_USE)
            mig["mode"] = mig["pending"] = int(mode)
        return C.NVML_SUCCESS

    # -- GPU instance profiles and placements -----------------------------
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Handle, profile: int,
                                            version: int = 2) -> NvmlStruct:
        i, g = self._gpu(device)
        m = self._model(g)
        for p in m.profiles:
            if p.nvml_profile == int(profile):
                me = int(p.name.endswith("+me"))
                return NvmlStruct({"id": p.id, "isP2pSupported": 0, "sliceCount": p.slices,
                                   "instanceCount": p.instances,
                                   "multiprocessorCount": p.sm_count,
                                   "copyEngineCount": p.slices, "decoderCount": p.slices,
                                   "encoderCount": 0, "jpegCount": me, "ofaCount": me,
                                   "memorySizeMB": p.memory_mb,
                                   "name": f"MIG {p.name}"})
        if 0 <= int(profile) < C.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)


    def nvmlDeviceGetGpuInstancePossiblePlacements(self, device: Handle, profileId: int,
                                                   placementsRef: Any, countRef: Any) -> int:
        """Like the ``_v2`` C call: NULL placements asks for the count."""
        i, g = self._gpu(device)
        p = self._profile(self._model(g), profileId)
        count = getattr(countRef, "_obj", countRef)
        n = len(p.starts)
        if placementsRef is None:
            count.value = n
            return C.NVML_SUCCESS
        if int(count.value) < n:
            count.value = n
            raise NVMLError(C.NVML_ERROR_INSUFFICIENT_SIZE)
        for k, s in enumerate(p.starts):
            placementsRef[k].start = s
            placementsRef[k].size = p.size
        count.value = n
        return C.NVML_SUCCESS


    @staticmethod
    def _fit_error(m: GpuModel, mig: dict[str, Any], p: Any, start: int) -> int | None:
        insts = mig.get("instances") or []
        if sum(1 for gi in insts if int(gi["gi_profile_id"]) == p.id) >= p.instances:
            return C.NVML_ERROR_INSUFFICIENT_RESOURCES
        used = 0
        for gi in insts:
            q = m.profile_by_id(int(gi["gi_profile_id"]))
            used += q.slices if q else int(gi.get("slices", 0))
            if int(gi["start"]) < start + p.size and start < int(gi["start"]) + int(gi["size"]):
                return C.NVML_ERROR_INSUFFICIENT_RESOURCES
            if p.name.endswith("+me") and q is not None and q.name.endswith("+me"):
                return C.NVML_ERROR_INSUFFICIENT_RESOURCES
        if used + p.slices > m.compute_slices:
            return C.NVML_ERROR_INSUFFICIENT_RESOURCES
        return None

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Handle, profileId: int) -> int:
        i, g = self._gpu(device)
        m = self._model(g)
        p = self._profile(m, profileId)
        if not int(g["mig"].get("mode", 0)):
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        # How many more could be created one after another (greedy, like the driver).
        mig = {"instances": list(mig_instances(g))}
        n = 0
        while True:
            s = next((s for s in p.starts if self._fit_error(m, mig, p, s) is None), None)
            if s is None:
                return n
            mig["instances"].append({"gi_profile_id": p.id, "start": s, "size": p.size})
            n += 1

    def _create_gi(self, device: Handle, profileId: int, placement: Any) -> Handle:
        i, g = self._gpu(device)
        m = self._model(g)
        p = self._profile(m, profileId)
        self._root()
        with self.edit() as st:
            mig = self._gpu_of(st, i)["mig"]
            if not int(mig.get("mode", 0)):
                raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
            if self._held(st, i, "create"):
                raise NVMLError(C.NVML_ERROR_IN_USE)
            if placement is None:
                start = next((s for s in p.starts if self._fit_error(m, mig, p, s) is None), None)
                if start is None:
                    raise NVMLError(C.NVML_ERROR_INSUFFICIENT_RESOURCES)
            else:
                placement = getattr(placement, "_obj", placement)
                start, size = int(placement.start), int(placement.size)
                if start not in p.starts or size != p.size:
                    raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
                err = self._fit_error(m, mig, p, start)
                if err is not None:
                    raise NVMLError(err)
            gid = gi_id_for(m, start, p.size)
            mig.setdefault("instances", []).append({
                "gi_id": gid, "gi_profile_id": p.id, "profile": p.name, "start": start,
                "size": p.size, "slices": p.slices, "memory_mb": p.memory_mb,
                "sm_count": p.sm_count, "cis": []})
        return Handle(f"gpu{i}/gi{gid}")

    def nvmlDeviceCreateGpuInstance(self, device: Handle, profileId: int) -> Handle:
        return self._create_gi(device, profileId, None)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: Handle, profileId: int,
                                                 placement: Any) -> Handle:
        return self._create_gi(device, profileId, placement)

    def nvmlDeviceGetGpuInstances(self, device: Handle, profileId: int,
                                  gpuInstancesRef: Any, countRef: Any) -> int:
        """Fills a Python list: the simulator's handles are not ctypes pointers."""
        i, g = self._gpu(device)
        self._profile(self._model(g), profileId)
        found = [Handle(f"gpu{i}/gi{int(gi['gi_id'])}") for gi in mig_instances(g)
                 if int(gi["gi_profile_id"]) == int(profileId)]
        count = getattr(countRef, "_obj", countRef)
        if gpuInstancesRef is not None:
            gpuInstancesRef[:len(found)] = found
        count.value = len(found)
        return C.NVML_SUCCESS

    def nvmlGpuInstanceDestroy(self, gpuInstance: Handle) -> int:
        i, g, gi = self._gi(gpuInstance)
        self._root()
        with self.edit() as st:
            insts = self._gpu_of(st, i)["mig"]["instances"]
            rec = next((x for x in insts if int(x["gi_id"]) == int(gi["gi_id"])), None)
            if rec is None:
                raise NVMLError(C.NVML_ERROR_NOT_FOUND)
            if rec.get("cis") or rec.get("busy") or self._held(st, i, "destroy"):
                raise NVMLError(C.NVML_ERROR_IN_USE)
            insts.remove(rec)
        return C.NVML_SUCCESS

    # -- compute instances ------------------------------------------------
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gpuInstance: Handle, profile: int,
                                                     engProfile: int = 0,
                                                     version: int = 2) -> NvmlStruct:
        i, g, gi = self._gi(gpuInstance)
        slices, gs, starts = _ci_fit(gi, profile)
        name = gi["profile"] if slices == gs else f"{slices}c.{gi['profile']}"
        return NvmlStruct({"id": int(profile), "sliceCount": slices, "instanceCount": len(starts),
                           "multiprocessorCount": int(gi["sm_count"]) * slices // gs,
                           "sharedCopyEngineCount": gs, "sharedDecoderCount": gs,
                           "sharedEncoderCount": 0, "sharedJpegCount": 0, "sharedOfaCount": 0,
                           "name": f"MIG {name}"})


    def _create_ci(self, gpuInstance: Handle, profileId: int, placement: Any) -> Handle:
        i, g, gi = self._gi(gpuInstance)
        self._root()
        size, gs, starts = _ci_fit(gi, profileId)
        with self.edit() as st:
            if self._held(st, i, "create"):
                raise NVMLError(C.NVML_ERROR_IN_USE)
            g2 = self._gpu_of(st, i)
            rec = next(x for x in g2["mig"]["instances"] if int(x["gi_id"]) == int(gi["gi_id"]))
            cis = rec.setdefault("cis", [])

            def free(s: int) -> bool:
                return all(not (int(c["start"]) < s + size and s < int(c["start"]) + int(c["slices"]))
                           for c in cis)
            if placement is None:
                start = next((s for s in starts if free(s)), None)
                if start is None:
                    raise NVMLError(C.NVML_ERROR_INSUFFICIENT_RESOURCES)
            else:
                placement = getattr(placement, "_obj", placement)
                start = int(placement.start)
                if start not in starts or int(placement.size) != size:
                    raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
            if not free(start) or sum(int(c["slices"]) for c in cis) + size > gs:
                raise NVMLError(C.NVML_ERROR_INSUFFICIENT_RESOURCES)
            ids = {int(c["ci_id"]) for c in cis}
            cid = 0
            while cid in ids:
                cid += 1
            cis.append({"ci_id": cid, "ci_profile_id": int(profileId), "start": start,
                        "slices": size, "sm_count": int(rec["sm_count"]) * size // gs,
                        "uuid": mig_uuid(g2["uuid"], int(rec["gi_id"]), cid)})
        return Handle(f"{gpuInstance.key}/ci{cid}")

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Handle, profileId: int) -> Handle:
        return self._create_ci(gpuInstance, profileId, None)

    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(self, gpuInstance: Handle,
                                                          profileId: int, placement: Any) -> Handle:
        return self._create_ci(gpuInstance, profileId, placement)

    def nvmlComputeInstanceDestroy(self, computeInstance: Handle) -> int:
        i, g, gi, _, cid = self._ci(computeInstance)
        self._root()
        with self.edit() as st:
            rec = next(x for x in self._gpu_of(st, i)["mig"]["instances"]
                       if int(x["gi_id"]) == int(gi["gi_id"]))
            ci = next((c for c in rec.get("cis", []) if int(c["ci_id"]) == cid), None)
            if ci is None:
                raise NVMLError(C.NVML_ERROR_NOT_FOUND)
            if ci.get("busy") or self._held(st, i, "destroy"):
                raise NVMLError(C.NVML_ERROR_IN_USE)
            rec["cis"].remove(ci)
        return C.NVML_SUCCESS


def open_mig_sim(state_path: str) -> FaultySim:
    """The MIG-capable simulator over *state_path*, initialised, fault overlay applied."""
    sim = MigSimNvml.from_state_file(state_path)
    sim.state  # noqa: B018 - fail now, naming the file, if the state is unreadable
    sim.nvmlInit()
    return FaultySim(sim)


def set_holder(state_path: str, name: str, *, gpus: list[int] | None = None,
               blocks: tuple[str, ...] = ("create", "destroy", "mig_mode")) -> None:
    """Simulate a client (DCGM, persistenced...) holding GPUs so MIG changes get IN_USE."""
    sim = MigSimNvml.from_state_file(state_path)
    with sim.edit() as st:
        holders = [h for h in st.get("mig_holders", []) if h.get("name") != name]
        h: dict[str, Any] = {"name": name, "blocks": list(blocks)}
        if gpus is not None:
            h["gpus"] = list(gpus)
        st["mig_holders"] = holders + [h]


def clear_holder(state_path: str, name: str) -> None:
    sim = MigSimNvml.from_state_file(state_path)
    with sim.edit() as st:
        st["mig_holders"] = [h for h in st.get("mig_holders", []) if h.get("name") != name]
