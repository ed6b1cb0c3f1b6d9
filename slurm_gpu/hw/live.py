""""This node": the ``[node]`` config section and the live hardware read.

``[node]`` keys (all optional; ``%n`` in a path is the Slurm node name from
``$SLURMD_NODENAME``, or the short host name outside Slurm):

* ``snapshot = ""``: when set, "live" hardware is replayed from this
  snapshot file (the sandbox models a real server this way);
* ``nvml = "live"``: where NVML answers come from: ``"live"`` (pynvml and the
  driver) or ``"<scheme>:<path>"``, a backend an installed distribution
  registers (:mod:`slurm_gpu.hw.backend`; the devkit's simulator is
  ``"sim:<state file>"``, whose MIG and fault state persist in that file);
* ``state_dir = "/run/slurm-gpu"``: per-node runtime state (job state files
  under ``<state_dir>/jobs/<jobid>.json``).

With ``nvml = "<scheme>:<path>"`` the CPU side comes from the backend's
``hwloc_xml()`` when it answers one, else from ``snapshot``'s XML, else from
live hwloc.
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
    def nvml_plugin(self) -> tuple[str, str] | None:
        """(scheme, path) when ``nvml = "<scheme>:<path>"`` names a registered backend."""
        scheme, sep, path = self.nvml.partition(":")
        return (scheme, path) if sep and scheme not in ("live", "snapshot") else None


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
    plugin = s.nvml_plugin
    if s.nvml != "live" and not (plugin and plugin[0].strip() and plugin[1].strip()):
        raise InputError(f"node.nvml must be \"live\" or \"<backend>:<path>\", not {s.nvml!r}",
                         f"[node] in {config.config_path() or 'config'}")
    return s


def this_node(s: NodeSettings | None = None) -> Node:
    """This node's model, as every component should see it
    (use :func:`slurm_gpu.hw.load_node`, whose default source this is)."""
    from . import backend, hwloc
    from .merge import build_node, derive_node
    s = s or settings()
    plugin = s.nvml_plugin
    if s.snapshot and not plugin:
        from . import snapshot
        return snapshot.node_from_file(s.snapshot)
    if plugin:
        api, close = backend.open_api(backend.GpuSource(*plugin))
        # The two optional calls of a registered backend (hw/backend.py).
        xml_of = getattr(api, "hwloc_xml", None)
        xml = xml_of() if xml_of is not None else None
        if xml:
            cpu = hwloc.read_cpu_view(xml_text=xml, source=f"{plugin[1]}: hwloc_xml")
        elif s.snapshot:
            from .snapshot import read_snapshot
            snap = read_snapshot(s.snapshot)
            cpu = hwloc.read_cpu_view(xml_text=snap["hwloc_xml"], hostname=snap["hostname"],
                                      source=f"{s.snapshot}: hwloc_xml",
                                      phys_memory_bytes=snap.get("phys_memory_bytes"))
        else:
            cpu = hwloc.read_cpu_view()
        try:
            return derive_node(cpu, api, mig_minors=getattr(api, "mig_minors", None), sources=("hwloc", s.nvml))
        finally:
            if close is not None:
                close(api)
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
