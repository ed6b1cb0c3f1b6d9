"""What the simulator's mixins (MIG reads, health, events, usage) use of :class:`~slurm_gpu_devkit.sim.nvml.SimNvml`.

Declared once here so each mixin is checked against it; SimNvml defines them.
"""
from __future__ import annotations

from typing import Any

from slurm_gpu.hw.nvml_api import Handle


class SimBase:
    """The simulator's state and GPU lookups (implemented by SimNvml)."""

    @property
    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    def edit(self) -> Any:
        raise NotImplementedError

    def _check_init(self) -> None:
        raise NotImplementedError

    def _gpus(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _gpu(self, h: Any) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError

    def _simple(self, fn: str, h: Handle, args: tuple[Any, ...] = ()) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError

    def _mig_of(self, h: Handle) -> tuple[dict[str, Any], dict[str, Any]] | None:
        raise NotImplementedError
