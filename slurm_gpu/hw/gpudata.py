"""The plain data and the error of the GPU interface (:mod:`slurm_gpu.hw.gpus`)."""
from __future__ import annotations

from typing import Any

from .plain import Plain

# Error codes the callers act on (the driver's numbers: the same for every backend).
IN_USE = 19
GPU_IS_LOST = 15

# The call that looks a GPU instance up by id: its failure means "cannot find",
# any later one "cannot destroy".
INSTANCE_LOOKUP = "nvmlDeviceGetGpuInstanceById"

# Compute modes (the driver's numbers).
COMPUTE_MODE_DEFAULT = 0
COMPUTE_MODE_EXCLUSIVE_PROCESS = 3


class GpuError(Exception):
    """A GPU call failed.  ``str()`` is the driver's own message; ``code`` its
    number, ``name`` its symbolic name and ``call`` the query that failed."""

    def __init__(self, message: str, code: int | None, name: str, call: str) -> None:
        super().__init__(message)
        self.code = code
        self.name = name
        self.call = call

    @property
    def lost(self) -> bool:
        """The GPU fell off the bus (or its driver gave up on it)."""
        return self.code == GPU_IS_LOST


class GpuInstance(Plain):
    """A MIG GPU instance found on a GPU, with its compute instances:
    ``gi_id``, ``profile_id``, ``start``, ``size`` and ``cis``, a tuple of
    (ci_id, ci_profile_id, ci_start)."""

    __slots__ = ("gi_id", "profile_id", "start", "size", "cis")
    gi_id: int
    profile_id: int
    start: int
    size: int
    cis: tuple[tuple[int, int, int], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"gi_id": self.gi_id, "profile_id": self.profile_id, "start": self.start,
                "size": self.size, "cis": [list(c) for c in self.cis]}


class MigDevice(Plain):
    """One MIG device (a compute instance as CUDA sees it)."""

    __slots__ = ("gi_id", "ci_id", "uuid")
    gi_id: int
    ci_id: int
    uuid: str


class GpuEvent(Plain):
    """One event from an :class:`EventListener`.

    ``kind`` is ``xid``, ``dbe``, ``gpu_unavailable``, ``recovery_action`` or
    ``other``; ``gpu`` the PCI bus id when known; ``data`` the event's data
    (the XID number for ``xid``); ``type`` the driver's raw event type bits.
    """

    __slots__ = ("kind", "gpu", "data", "type")
    kind: str
    gpu: str | None
    data: int
    type: int
