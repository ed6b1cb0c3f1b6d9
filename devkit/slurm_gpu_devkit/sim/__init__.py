"""The NVML simulator: a faithful fake of pynvml for machines without GPUs.

``open_sim("<state file>")`` gives the NVML contract over a simulated machine (see
:mod:`slurm_gpu_devkit.sim.nvml`); ``slurm_gpu_devkit.sim.state.init_state`` creates the
state file from a machine's ``facts.json``.  ``[node] nvml = "sim:<file>"``
makes every component of the project use it as "this node's NVML" (the
``sim`` entry point of ``slurm_gpu.backends``: :func:`open_backend`).
"""
from __future__ import annotations

from typing import Any

from .nvml import FaultySim, SimNvml, inject_event, set_overlay
from .state import init_state, init_state_for_machine, load_facts

__all__ = ["SimNvml", "init_state", "init_state_for_machine", "inject_event", "load_facts", "open_sim", "set_overlay"]


def open_sim(state_path: str) -> FaultySim:
    """The simulator over *state_path*, initialised like ``pynvml.nvmlInit()`` leaves it.

    It is wrapped in :class:`~slurm_gpu_devkit.sim.nvml.FaultySim`, which applies
    the state's ``overlay`` on every call, so faults injected by another
    process (:func:`set_overlay`) take effect at once.
    """
    sim = SimNvml.from_state_file(state_path)
    sim.state  # noqa: B018 - fail now, with the file named, if the state is unreadable
    sim.nvmlInit()
    return FaultySim(sim)


def open_backend(state_path: str) -> tuple[Any, None]:
    """The ``sim:<state file>`` GPU backend: the MIG-capable simulator, faults applied.

    Registered in the ``slurm_gpu.backends`` entry-point group (devkit/pyproject.toml):
    the runtime loads it by that name and never imports this package."""
    from .mig import open_mig_sim
    return open_mig_sim(state_path), None
