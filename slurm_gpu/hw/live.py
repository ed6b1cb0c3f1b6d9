""""This node": the ``[node]`` config section and the live hardware read.

``[node]`` keys (all optional; ``%n`` in a path is the Slurm node name from
``$SLURMD_NODENAME``, or the short host name outside Slurm):

* ``snapshot = ""``: when set, "live" hardware is replayed from this
  snapshot file (the sandbox models a real server this way);
* ``nvml = "live"``: where NVML answers come from: ``"live"`` (pynvml and the
  driver) or ``"sim:<state file>"`` (the simulator, whose MIG and fault
  state persist in that file);
* ``state_dir = "/run/slurm-gpu"``: per-node runtime state (job state files
  under ``<state_dir>/jobs/<jobid>.json``).

With ``nvml = "sim:..."`` the CPU side comes from the state file's hwloc XML
when it has one, else from ``snapshot``'s XML, else from live hwloc.
"""
from __future__ import annotations

import os
TYPE_CHECKING = False

from .. import hostctx
from ..errors import InputError
from .plain import Plain

if TYPE_CHECKING:
    from typing import Any
    from .model import Node

SIM_PREFIX = "sim:"


class NodeSettings(Plain):
    """The ``[node]`` section of the config file.

    A Plain value, not a dataclass: the prolog imports no dataclasses
    (with inspect, ast and dis: ~5 ms)."""

    __slots__ = ("snapshot", "nvml", "state_dir")
    _defaults = {"snapshot": "", "nvml": "live", "state_dir": "/run/slurm-gpu"}
    snapshot: str
    nvml: str
    state_dir: str

    def expanded(self) -> "NodeSettings":
        """The same settings with ``%n`` replaced by the node name."""
        name = node_name()
        return NodeSettings(snapshot=self.snapshot.replace("%n", name), nvml=self.nvml.replace("%n", name),
                            state_dir=self.state_dir.replace("%n", name))

    @property
    def sim_state(self) -> str | None:
        """The simulator state file, when ``nvml = "sim:<file>"``."""
        return self.nvml[len(SIM_PREFIX):] if self.nvml.startswith(SIM_PREFIX) else None


def use_node_name(name: str | None) -> None:
    """Make *name* this process's Slurm node name (None: back to the lookup).

    See :mod:`slurm_gpu.hostctx` for why this is not an environment variable.
    """
    hostctx.node_name = name


def node_name() -> str:
    """Slurm's name for this node: as set by :func:`use_node_name`, else
    ``SLURMD_NODENAME``, else the short host name."""
    # os.uname() is what gethostname(2) answers on Linux, without importing socket (~1.5 ms a run)
    return hostctx.node_name or os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def settings(raw: dict[str, Any] | None = None) -> NodeSettings:
    """The ``[node]`` settings in effect, with ``%n`` expanded and ``nvml`` checked."""
    from .. import config
    s = config.section(NodeSettings, "node", raw).expanded()
    if s.nvml != "live" and not (s.sim_state and s.sim_state.strip()):
        raise InputError(f"node.nvml must be \"live\" or \"sim:<state file>\", not {s.nvml!r}",
                         f"[node] in {config.config_path() or 'config'}")
    return s


def this_node(s: NodeSettings | None = None) -> Node:
    """This node's model, as every component should see it
    (use :func:`slurm_gpu.hw.load_node`, whose default source this is)."""
    from . import backend, hwloc
    from .merge import build_node, derive_node
    s = s or settings()
    if s.snapshot and not s.sim_state:
        from . import snapshot
        return snapshot.node_from_file(s.snapshot)
    if s.sim_state:
        opened, _ = backend.open_api(backend.GpuSource("sim", s.sim_state))
        sim: Any = opened   # beyond the contract: the simulator's hwloc XML and cap minors
        xml = sim.state.get("hwloc_xml")
        if xml:
            cpu = hwloc.read_cpu_view(xml_text=xml, source=f"{s.sim_state}: hwloc_xml")
        elif s.snapshot:
            from .snapshot import read_snapshot
            snap = read_snapshot(s.snapshot)
            cpu = hwloc.read_cpu_view(xml_text=snap["hwloc_xml"], hostname=snap["hostname"],
                                      source=f"{s.snapshot}: hwloc_xml")
        else:
            cpu = hwloc.read_cpu_view()
        return derive_node(cpu, sim, mig_minors=sim.mig_minors, sources=("hwloc", s.nvml))
    cpu = hwloc.read_cpu_view()
    from .nvml import NvmlUnavailable
    try:
        api, close = backend.open_api(backend.LIVE)
    except NvmlUnavailable as e:
        from .views import NvmlView
        return build_node(cpu, NvmlView(None, ()), sources=("hwloc:live",), notes=(e.what,))
    try:
        return derive_node(cpu, api, mig_minors=None, sources=("hwloc:live", "nvml:live"))
    finally:
        if close is not None:
            close(api)
