"""Open a GPU by what identifies it: UUID or device minor, never by NVML index.

NVML's index is an enumeration position with "no guarantees of consistency
between reboots" (NVML docs), and it is neither Slurm's GPU index nor the
``N`` of ``/dev/nvidiaN``.  Code that acts on one job's GPU (compute mode,
MIG instances) must name it by UUID (what the prolog recorded) or by minor
(the device file Slurm gave the job), or it can act on another job's GPU.
"""
from __future__ import annotations

from typing import Any

from ..errors import HardwareError
from .nvml_api import NVMLError, NvmlApi, NvmlHandle, Reader


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def handle_by_minor(api: NvmlApi, minor: int) -> NvmlHandle:
    """The NVML handle of ``/dev/nvidia<minor>`` (scans the GPUs' minor numbers)."""
    try:
        count = int(api.nvmlDeviceGetCount())
        for i in range(count):
            h = api.nvmlDeviceGetHandleByIndex(i)
            if int(api.nvmlDeviceGetMinorNumber(h)) == int(minor):
                return h
    except NVMLError as e:
        raise HardwareError(f"cannot find GPU by minor number: {e}", f"/dev/nvidia{minor}") from None
    raise HardwareError("no GPU has this minor number", f"/dev/nvidia{minor}")


def open_gpu(api: NvmlApi, *, uuid: str | None = None, minor: int | None = None) -> NvmlHandle:
    """The handle of the GPU with *uuid* (preferred) or *minor*.

    With both, the UUID's GPU must have that minor: a mismatch means the
    record and the machine disagree (a GPU swapped under a running job), and
    acting on either would be a guess.
    """
    if uuid:
        try:
            h = api.nvmlDeviceGetHandleByUUID(uuid)
        except NVMLError as e:
            raise HardwareError(f"cannot open GPU by UUID: {e}", uuid) from None
        if minor is not None:
            try:
                # absent (some VMs) or denied: the UUID alone decides
                have = Reader(api).maybe(api.nvmlDeviceGetMinorNumber, h)
            except NVMLError as e:
                raise HardwareError(f"cannot read the GPU's minor number: {e}", uuid) from None
            if have is not None and have != int(minor):
                raise HardwareError(f"GPU {uuid} is /dev/nvidia{have}, not /dev/nvidia{minor} "
                                    "as recorded", uuid)
        return h
    if minor is not None:
        return handle_by_minor(api, int(minor))
    raise HardwareError("GPU has neither UUID nor minor number recorded")


def uuid_of(api: NvmlApi, handle: NvmlHandle) -> str:
    return _s(api.nvmlDeviceGetUUID(handle))


def nvml_index(api: NvmlApi, *, uuid: str | None = None, minor: int | None = None) -> int:
    """NVML's index of the GPU with *uuid* or *minor* (for code that works by index)."""
    h = open_gpu(api, uuid=uuid, minor=minor)
    try:
        return int(api.nvmlDeviceGetIndex(h))
    except NVMLError as e:
        raise HardwareError(f"cannot read the GPU's NVML index: {e}", uuid or f"/dev/nvidia{minor}") from None
