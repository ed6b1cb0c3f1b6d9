"""Create, list and destroy MIG instances through an NVML *api* object.

The api has pynvml's surface: the real ``pynvml`` module (from
:func:`slurm_gpu.hw.live.open_nvml`) or the simulator
(:class:`slurm_gpu.sim.mig.MigSimNvml`).  Only documented pynvml calls
are used, with pynvml's argument conventions (ctypes placement structs).
NVML errors become :class:`MigError` carrying the NVML code.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Iterator

from ..errors import HardwareError
from .planner import Placement

MAX_GI_ID = 15   # GI ids are partition numbers 0..14 on every MIG GPU so far


class MigError(HardwareError):
    """An NVML MIG call failed; ``code`` is the NVML return code."""

    def __init__(self, what: str, where: str | None = None, code: int | None = None) -> None:
        super().__init__(what, where)
        self.code = code


@dataclass(frozen=True)
class Existing:
    """A GPU instance found on a GPU, with its compute instances."""

    gi_id: int
    profile_id: int
    start: int
    size: int
    cis: tuple[tuple[int, int, int], ...]   # (ci_id, ci_profile_id, ci_start)

    def to_dict(self) -> dict[str, Any]:
        return {"gi_id": self.gi_id, "profile_id": self.profile_id, "start": self.start,
                "size": self.size, "cis": [list(c) for c in self.cis]}


def _err(api: Any, e: Exception, what: str, where: str) -> MigError:
    code = getattr(e, "value", None)
    return MigError(f"{what}: {e}", where, code)


def device(api: Any, index: int) -> Any:
    try:
        return api.nvmlDeviceGetHandleByIndex(index)
    except api.NVMLError as e:
        raise _err(api, e, "cannot open GPU", f"GPU {index}") from None


def mig_mode(api: Any, dev: Any) -> int | None:
    """Current MIG mode, or None for a GPU without MIG."""
    try:
        return int(api.nvmlDeviceGetMigMode(dev)[0])
    except api.NVMLError as e:
        if e.value == api.NVML_ERROR_NOT_SUPPORTED:
            return None
        raise _err(api, e, "cannot read MIG mode", "nvmlDeviceGetMigMode") from None


def identify(api: Any, dev: Any) -> tuple[str, Any]:
    """(NVML name, GpuModel or None): the model by PCI device id first, name second."""
    from .profiles import identify as by_ids
    name = api.nvmlDeviceGetName(dev)
    name = name.decode() if isinstance(name, bytes) else str(name)
    try:
        pci: int | None = int(api.nvmlDeviceGetPciInfo(dev).pciDeviceId)
    except api.NVMLError:
        pci = None
    return name, by_ids(pci, name)


def list_instances(api: Any, dev: Any) -> list[Existing]:
    """Every GPU instance on *dev* (probing ids: the simulator's handles are not ctypes)."""
    out = []
    for gid in range(MAX_GI_ID):
        try:
            gi = api.nvmlDeviceGetGpuInstanceById(dev, gid)
        except api.NVMLError as e:
            if e.value in (api.NVML_ERROR_NOT_FOUND, api.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise _err(api, e, "cannot list GPU instances", "nvmlDeviceGetGpuInstanceById") from None
        info = api.nvmlGpuInstanceGetInfo(gi)
        cis = []
        for cid in range(8):
            try:
                ci = api.nvmlGpuInstanceGetComputeInstanceById(gi, cid)
            except api.NVMLError:
                continue
            cinfo = api.nvmlComputeInstanceGetInfo(ci)
            cis.append((cid, int(cinfo.profileId), int(cinfo.placement.start)))
        out.append(Existing(gid, int(info.profileId), int(info.placement.start),
                            int(info.placement.size), tuple(cis)))
    return out


def mig_devices(api: Any, dev: Any) -> Iterator[tuple[int, int, str]]:
    """(gi_id, ci_id, MIG UUID) of every MIG device on *dev*."""
    try:
        n = api.nvmlDeviceGetMaxMigDeviceCount(dev)
    except api.NVMLError as e:
        raise _err(api, e, "cannot count MIG devices", "nvmlDeviceGetMaxMigDeviceCount") from None
    for j in range(n):
        try:
            m = api.nvmlDeviceGetMigDeviceHandleByIndex(dev, j)
        except api.NVMLError:
            continue
        u = api.nvmlDeviceGetUUID(m)
        yield (int(api.nvmlDeviceGetGpuInstanceId(m)), int(api.nvmlDeviceGetComputeInstanceId(m)),
               u.decode() if isinstance(u, bytes) else str(u))


def create_gi(api: Any, dev: Any, profile_id: int, start: int, size: int, where: str) -> int:
    """Create a GPU instance at exactly this placement; returns its id."""
    pl = api.c_nvmlGpuInstancePlacement_t()
    pl.start = start
    pl.size = size
    try:
        gi = api.nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile_id, ctypes.byref(pl))
        return int(api.nvmlGpuInstanceGetInfo(gi).id)
    except api.NVMLError as e:
        raise _err(api, e, f"cannot create GPU instance (profile {profile_id} at {start}:{size})",
                   where) from None


def create_ci(api: Any, dev: Any, gi_id: int, ci_profile: int, ci_start: int, ci_size: int,
              where: str) -> int:
    """Create a compute instance in GI *gi_id* at this placement; returns its id."""
    try:
        gi = api.nvmlDeviceGetGpuInstanceById(dev, gi_id)
        pl = api.c_nvmlComputeInstancePlacement_t()
        pl.start = ci_start
        pl.size = ci_size
        ci = api.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, ci_profile,
                                                                  ctypes.byref(pl))
        return int(api.nvmlComputeInstanceGetInfo(ci).id)
    except api.NVMLError as e:
        raise _err(api, e, f"cannot create compute instance in GPU instance {gi_id}",
                   where) from None


def find_gi(api: Any, dev: Any, profile_id: int, start: int) -> int | None:
    """The id of the GI with this profile at this placement, if one exists."""
    for e in list_instances(api, dev):
        if e.profile_id == profile_id and e.start == start:
            return e.gi_id
    return None


def destroy_gi(api: Any, dev: Any, gi_id: int, where: str) -> bool:
    """Destroy GI *gi_id* and its compute instances; False when it does not exist."""
    try:
        gi = api.nvmlDeviceGetGpuInstanceById(dev, gi_id)
    except api.NVMLError as e:
        if e.value in (api.NVML_ERROR_NOT_FOUND, api.NVML_ERROR_INVALID_ARGUMENT):
            return False
        raise _err(api, e, f"cannot find GPU instance {gi_id}", where) from None
    try:
        for cid in range(8):
            try:
                ci = api.nvmlGpuInstanceGetComputeInstanceById(gi, cid)
            except api.NVMLError as e:
                if e.value in (api.NVML_ERROR_NOT_FOUND, api.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise
            api.nvmlComputeInstanceDestroy(ci)
        api.nvmlGpuInstanceDestroy(gi)
    except api.NVMLError as e:
        raise _err(api, e, f"cannot destroy GPU instance {gi_id}", where) from None
    return True


def create_placement(api: Any, dev: Any, p: Placement, where: str) -> tuple[int, int]:
    """Create one planned instance (GI then CI); returns (gi_id, ci_id)."""
    pid = p.gi_profile_id
    if pid is None:
        # NVIDIA publishes no -lgip id for this model's profile: the driver knows it.
        try:
            pid = int(api.nvmlDeviceGetGpuInstanceProfileInfo(dev, p.nvml_profile).id)
        except api.NVMLError as e:
            raise _err(api, e, f"the driver has no {p.profile} profile", where) from None
    gid = create_gi(api, dev, pid, p.start, p.size, where)
    try:
        cid = create_ci(api, dev, gid, p.ci_profile, p.ci_start, p.ci_slices, where)
    except MigError:
        destroy_gi(api, dev, gid, where)
        raise
    return gid, cid


def recreate(api: Any, dev: Any, e: dict[str, Any], where: str) -> None:
    """Recreate a recorded instance (:meth:`Existing.to_dict`) and whichever of its
    compute instances are missing (a destroy that failed half-way leaves the GI
    without some of them)."""
    from .profiles import CIP_BY_SLICES
    sizes = {v: k for k, v in CIP_BY_SLICES.items()}
    found = next((x for x in list_instances(api, dev)
                  if x.profile_id == int(e["profile_id"]) and x.start == int(e["start"])), None)
    if found is None:
        gid = create_gi(api, dev, int(e["profile_id"]), int(e["start"]), int(e["size"]), where)
        have: set[tuple[int, int]] = set()
    else:
        gid = found.gi_id
        have = {(prof, start) for _cid, prof, start in found.cis}
    for _cid, prof, start in e.get("cis", []):
        if (int(prof), int(start)) not in have:
            create_ci(api, dev, gid, int(prof), int(start), sizes[int(prof)], where)
