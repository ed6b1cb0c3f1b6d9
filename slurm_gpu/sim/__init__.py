"""The NVML simulator: a faithful fake of pynvml for machines without GPUs.

``open_sim("<state file>")`` gives the NVML contract over a simulated machine (see
:mod:`slurm_gpu.sim.nvml`); ``slurm_gpu.sim.state.init_state`` creates the
state file from a machine's ``facts.json``.  ``[node] nvml = "sim:<file>"``
makes every component of the project use it as "this node's NVML".
"""
from __future__ import annotations

from typing import Any

from ..hw import backend as _backend
from .nvml import FaultySim, SimNvml, inject_event, set_overlay
from .state import init_state, init_state_for_machine, load_facts

__all__ = ["SimNvml", "init_state", "init_state_for_machine", "inject_event", "load_facts", "open_sim", "set_overlay"]


def open_sim(state_path: str) -> FaultySim:
    """The simulator over *state_path*, initialised like ``pynvml.nvmlInit()`` leaves it.

    It is wrapped in :class:`~slurm_gpu.sim.nvml.FaultySim`, which applies
    the state's ``overlay`` on every call, so faults injected by another
    process (:func:`set_overlay`) take effect at once.
    """
    sim = SimNvml.from_state_file(state_path)
    sim.state  # noqa: B018 - fail now, with the file named, if the state is unreadable
    sim.nvmlInit()
    return FaultySim(sim)


def _open_backend(state_path: str) -> tuple[Any, None]:
    """The ``sim:<state file>`` GPU backend: the MIG-capable simulator, faults applied."""
    from .mig import open_mig_sim
    return open_mig_sim(state_path), None


# The hardware layer names this package for "sim:" sources and never imports
# it; importing it makes the simulator a backend.
_backend.register("sim", _open_backend)
