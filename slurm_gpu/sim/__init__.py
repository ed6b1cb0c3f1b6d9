"""The NVML simulator: a faithful fake of pynvml for machines without GPUs.

``open_sim("<state file>")`` gives an object with pynvml's surface (see
:mod:`slurm_gpu.sim.nvml`); ``slurm_gpu.sim.state.init_state`` creates the
state file from a machine's ``facts.json``.  ``[node] nvml = "sim:<file>"``
makes every component of the project use it as "this node's NVML".
"""
from __future__ import annotations

from .nvml import SimNvml, inject_event, set_overlay
from .state import init_state, init_state_for_machine, load_facts

__all__ = ["SimNvml", "init_state", "init_state_for_machine", "inject_event", "load_facts", "open_sim", "set_overlay"]


def open_sim(state_path: str) -> SimNvml:
    """The simulator over *state_path*, initialised like ``pynvml.nvmlInit()`` leaves it."""
    sim = SimNvml.from_state_file(state_path)
    sim.state  # noqa: B018 - fail now, with the file named, if the state is unreadable
    sim.nvmlInit()
    return sim
