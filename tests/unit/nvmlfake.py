"""A backend with some NVML calls answered otherwise, for tests.

Like every backend it implements the contract explicitly
(:class:`~slurm_gpu.hw.nvml_api.NvmlForward`): a call outside it is an
AttributeError, never a quiet answer.
"""
from __future__ import annotations

from typing import Any, Callable

from slurm_gpu.hw.nvml_api import NvmlApi, NvmlForward


class Patched(NvmlForward):
    """*base* with ``patch[name](real, *args)`` answering call *name* instead."""

    def __init__(self, base: NvmlApi, **patch: Callable[..., Any]) -> None:
        self._base = base
        self._patch = patch

    def new_gpm_metrics(self) -> Any:
        return self._base.new_gpm_metrics()

    def _call(self, fn: str, args: tuple[Any, ...]) -> Any:
        real = getattr(self._base, fn)
        return self._patch[fn](real, *args) if fn in self._patch else real(*args)
