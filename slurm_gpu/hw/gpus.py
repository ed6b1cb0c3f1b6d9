"""The narrow GPU interface: one typed :class:`Gpus` protocol, plain data in and out.

Code outside ``slurm_gpu/hw/`` (and the simulator) never sees the vendor
library: it gets a :class:`Gpus` from :func:`slurm_gpu.hw.backend.open_gpus`
and speaks GPU indices, ints, strings and the small dataclasses below.
Errors are :class:`GpuError` carrying the driver's numeric code and the call
that failed.

Every backend (the live driver, a snapshot replay, the simulator, a recorder
around any of them) answers through the same adapter,
:class:`slurm_gpu.hw.gpus_nvml.NvmlGpus`, so a method added here is written
once, in that adapter (see docs/architecture.md, "Where to add...").
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

# The plain data and errors live in gpudata.py (cheap to import: the adapter
# needs them on every health check; typing.Protocol classes cost ~1 ms).
from .gpudata import (COMPUTE_MODE_DEFAULT, COMPUTE_MODE_EXCLUSIVE_PROCESS, GPU_IS_LOST, IN_USE,
                      INSTANCE_LOOKUP, GpuError, GpuEvent, GpuInstance, MigDevice)
from .views import NvmlView

__all__ = ["COMPUTE_MODE_DEFAULT", "COMPUTE_MODE_EXCLUSIVE_PROCESS", "GPU_IS_LOST", "IN_USE", "INSTANCE_LOOKUP",
           "EventListener", "GpuError", "GpuEvent", "GpuInstance", "Gpus", "MigDevice"]


class EventListener(Protocol):
    """Critical GPU events (XID, double-bit ECC, GPU unavailable, recovery action)."""

    def register(self, index: int) -> None:
        """Listen to GPU *index* (only the kinds it supports); GpuError when refused."""

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        """The next event, or None after *timeout_ms*; GpuError on any other failure."""

    def close(self) -> None:
        """Free the listener (errors ignored: we are done with it)."""


class Gpus(Protocol):
    """The GPUs of one node, as the rest of slurm-gpu needs them."""

    # -- reading -------------------------------------------------------------
    def count(self) -> int:
        """How many GPUs the driver shows."""

    def find(self, *, uuid: str | None = None, minor: int | None = None) -> int:
        """The index of the GPU with *uuid* (preferred) or device *minor*; with both,
        they must agree (HardwareError otherwise).  Indices are positions in
        this open session: records name GPUs by UUID and minor, never by index."""

    def name(self, index: int) -> str:
        """The product name (``NVIDIA H100 80GB HBM3``)."""

    def pci_device_id(self, index: int) -> int:
        """The combined PCI device/vendor id (``0x233010de``)."""

    def read_view(self, *, mig_minors: Mapping[str, int] | Callable[[], Mapping[str, int]] | None = None
                  ) -> NvmlView:
        """Every GPU's identity, NVLink peers, MIG instances and fabric (the node model's GPU half)."""

    # -- compute mode --------------------------------------------------------
    def compute_mode(self, index: int) -> int:
        """The compute mode (:data:`COMPUTE_MODE_DEFAULT`, ...)."""

    def set_compute_mode(self, index: int, mode: int) -> None:
        """Set the compute mode (root)."""

    # -- MIG -----------------------------------------------------------------
    def check(self, index: int) -> None:
        """GpuError unless GPU *index* can be opened."""

    def mig_mode(self, index: int) -> int | None:
        """The current MIG mode (0 off, 1 on), or None for a GPU without MIG."""

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """Turn MIG mode on or off (root; the GPU must be idle)."""

    def gpu_instance_profile_id(self, index: int, profile: int) -> int:
        """The driver's id of GPU instance profile *profile* (a ``GPU_INSTANCE_PROFILE_*`` number)."""

    def gpu_instances(self, index: int) -> list[GpuInstance]:
        """Every GPU instance on the GPU, with its compute instances."""

    def mig_devices(self, index: int) -> list[MigDevice]:
        """Every MIG device on the GPU."""

    def create_gpu_instance(self, index: int, profile_id: int, start: int, size: int) -> int:
        """Create a GPU instance at exactly this placement; returns its id."""

    def create_compute_instance(self, index: int, gi_id: int, ci_profile: int, start: int, size: int) -> int:
        """Create a compute instance in GI *gi_id* at this placement; returns its id."""

    def destroy_gpu_instance(self, index: int, gi_id: int) -> bool:
        """Destroy GI *gi_id* and its compute instances; False when it does not exist."""

    # -- events --------------------------------------------------------------
    def listen(self) -> EventListener:
        """A new listener for critical events (register GPUs on it, then wait)."""

    # -- usage (slurm-gpu monitor) -----------------------------------------
    def stats_reader(self) -> Any:
        """A :class:`~slurm_gpu.hw.gpustats.StatsReader`: utilisation, memory, power,
        energy and processes of every GPU and MIG instance, read again at each ``read()``."""

    # -- lifetime ------------------------------------------------------------
    def close(self) -> None:
        """Release the driver (errors ignored)."""
