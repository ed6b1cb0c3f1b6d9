"""Create, list and destroy MIG instances on a node's GPUs.

The GPUs are a :class:`slurm_gpu.hw.gpus.Gpus` (the live driver or the
simulator, from :func:`slurm_gpu.hw.backend.open_gpus`); a GPU is named by
its index.  GPU errors become :class:`MigError` carrying the driver's code.
"""
from __future__ import annotations

from typing import Any

from ..errors import HardwareError
from ..hw.gpus import INSTANCE_LOOKUP, GpuError, GpuInstance, Gpus
from .planner import Placement

# A GPU instance found on a GPU, with its compute instances (plain data from hw).
Existing = GpuInstance


class MigError(HardwareError):
    """A MIG call failed; ``code`` is the driver's return code."""

    def __init__(self, what: str, where: str | None = None, code: int | None = None) -> None:
        super().__init__(what, where)
        self.code = code


def _err(e: GpuError, what: str, where: str) -> MigError:
    return MigError(f"{what}: {e}", where, e.code)


def device(gpus: Gpus, index: int) -> int:
    """GPU *index*, checked to open (MigError naming the GPU otherwise)."""
    try:
        gpus.check(index)
    except GpuError as e:
        raise _err(e, "cannot open GPU", f"GPU {index}") from None
    return index


def mig_mode(gpus: Gpus, dev: int) -> int | None:
    """Current MIG mode, or None for a GPU without MIG."""
    try:
        return gpus.mig_mode(dev)
    except GpuError as e:
        raise _err(e, "cannot read MIG mode", e.call) from None


def identify(gpus: Gpus, dev: int) -> tuple[str, Any]:
    """(device name, GpuModel or None): the model by PCI device id first, name second."""
    from .profiles import identify as by_ids
    name = gpus.name(dev)
    try:
        pci: int | None = gpus.pci_device_id(dev)
    except GpuError:
        pci = None
    return name, by_ids(pci, name)


def list_instances(gpus: Gpus, dev: int) -> list[Existing]:
    """Every GPU instance on *dev*."""
    try:
        return gpus.gpu_instances(dev)
    except GpuError as e:
        raise _err(e, "cannot list GPU instances", e.call) from None


def mig_devices(gpus: Gpus, dev: int) -> list[tuple[int, int, str]]:
    """(gi_id, ci_id, MIG UUID) of every MIG device on *dev*."""
    try:
        return [(m.gi_id, m.ci_id, m.uuid) for m in gpus.mig_devices(dev)]
    except GpuError as e:
        raise _err(e, "cannot count MIG devices", e.call) from None


def create_gi(gpus: Gpus, dev: int, profile_id: int, start: int, size: int, where: str) -> int:
    """Create a GPU instance at exactly this placement; returns its id."""
    try:
        return gpus.create_gpu_instance(dev, profile_id, start, size)
    except GpuError as e:
        raise _err(e, f"cannot create GPU instance (profile {profile_id} at {start}:{size})", where) from None


def create_ci(gpus: Gpus, dev: int, gi_id: int, ci_profile: int, ci_start: int, ci_size: int,
              where: str) -> int:
    """Create a compute instance in GI *gi_id* at this placement; returns its id."""
    try:
        return gpus.create_compute_instance(dev, gi_id, ci_profile, ci_start, ci_size)
    except GpuError as e:
        raise _err(e, f"cannot create compute instance in GPU instance {gi_id}", where) from None


def find_gi(gpus: Gpus, dev: int, profile_id: int, start: int) -> int | None:
    """The id of the GI with this profile at this placement, if one exists."""
    for e in list_instances(gpus, dev):
        if e.profile_id == profile_id and e.start == start:
            return e.gi_id
    return None


def destroy_gi(gpus: Gpus, dev: int, gi_id: int, where: str) -> bool:
    """Destroy GI *gi_id* and its compute instances; False when it does not exist."""
    try:
        return gpus.destroy_gpu_instance(dev, gi_id)
    except GpuError as e:
        what = f"cannot find GPU instance {gi_id}" if e.call == INSTANCE_LOOKUP \
            else f"cannot destroy GPU instance {gi_id}"
        raise _err(e, what, where) from None


def create_placement(gpus: Gpus, dev: int, p: Placement, where: str) -> tuple[int, int]:
    """Create one planned instance (GI then CI); returns (gi_id, ci_id)."""
    pid = p.gi_profile_id
    if pid is None:
        # NVIDIA publishes no -lgip id for this model's profile: the driver knows it.
        try:
            pid = gpus.gpu_instance_profile_id(dev, p.nvml_profile)
        except GpuError as e:
            raise _err(e, f"the driver has no {p.profile} profile", where) from None
    gid = create_gi(gpus, dev, pid, p.start, p.size, where)
    try:
        cid = create_ci(gpus, dev, gid, p.ci_profile, p.ci_start, p.ci_slices, where)
    except MigError:
        destroy_gi(gpus, dev, gid, where)
        raise
    return gid, cid


def recreate(gpus: Gpus, dev: int, e: dict[str, Any], where: str) -> None:
    """Recreate a recorded instance (:meth:`Existing.to_dict`) and whichever of its
    compute instances are missing (a destroy that failed half-way leaves the GI
    without some of them)."""
    from .profiles import CIP_BY_SLICES
    sizes = {v: k for k, v in CIP_BY_SLICES.items()}
    found = next((x for x in list_instances(gpus, dev)
                  if x.profile_id == int(e["profile_id"]) and x.start == int(e["start"])), None)
    if found is None:
        gid = create_gi(gpus, dev, int(e["profile_id"]), int(e["start"]), int(e["size"]), where)
        have: set[tuple[int, int]] = set()
    else:
        gid = found.gi_id
        have = {(prof, start) for _cid, prof, start in found.cis}
    for _cid, prof, start in e.get("cis", []):
        if (int(prof), int(start)) not in have:
            create_ci(gpus, dev, gid, int(prof), int(start), sizes[int(prof)], where)
