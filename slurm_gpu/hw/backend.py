"""Which backend answers GPU calls: chosen here, and nowhere else.

A backend is a function ``open(path) -> (api, closer)`` giving an
implementation of the NVML contract (:class:`~slurm_gpu.hw.nvml_api.NvmlApi`);
:func:`open_gpus` wraps it in the one adapter
(:class:`~slurm_gpu.hw.gpus_nvml.NvmlGpus`).  The backends:

* ``live``: the driver through pynvml (:mod:`slurm_gpu.hw.nvml`);
* ``snapshot:<file>``: recorded answers replayed, optionally with a fault
  overlay (:mod:`slurm_gpu.hw.snapshot`);
* ``<scheme>:<path>``: a backend another distribution registers in the
  ``slurm_gpu.backends`` entry-point group (:data:`ENTRY_POINTS`), loaded only
  when a source names its scheme.  The devkit's simulator is one (``sim:<state
  file>``, ``slurm_gpu_devkit.sim``); the runtime never imports it nor knows its
  name.  Tests may :func:`register` an opener directly.

A registered backend's api may also answer two calls beyond NVML's, which
:func:`slurm_gpu.hw.live.this_node` uses when they are there: ``hwloc_xml()``
(the lstopo XML of the machine it models, or None: then this host's hwloc is
read) and ``mig_minors()`` (what ``/proc/driver/nvidia-caps/mig-minors`` holds on
that machine).

Recording (``snapshot record``) wraps whichever api is open; it is not a
source of its own.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Tuple

from ..errors import InputError
from .plain import Plain

if TYPE_CHECKING:
    from .gpus_nvml import NvmlGpus
    from .nvml_api import NvmlApi

Closer = Callable[["NvmlApi"], None]
Opener = Callable[[str], Tuple["NvmlApi", Optional[Closer]]]

_OPENERS: dict[str, Opener] = {}
# The entry-point group of backends that live in another distribution:
# name = scheme, value = "module:opener".
ENTRY_POINTS = "slurm_gpu.backends"


def register(scheme: str, opener: Opener) -> None:
    """Make *opener* answer sources of *scheme* (without an entry point: tests)."""
    _OPENERS[scheme] = opener


def _plugin(scheme: str) -> Opener | None:
    """The opener the installed distributions register for *scheme*, loaded now."""
    from .. import plugins
    ep = plugins.find(ENTRY_POINTS, scheme)
    if ep is None:
        return None
    opener: Opener = ep.load()
    _OPENERS[scheme] = opener
    return opener


class GpuSource(Plain):
    """Where GPU answers come from: ``scheme`` ``live``, ``snapshot`` or a registered
    one (``<scheme>:<path>``); ``path``; for a snapshot, ``overlay_path`` (a fault overlay file,
    read when opened) and ``data`` (the snapshot already parsed)."""

    __slots__ = ("scheme", "path", "overlay_path", "data")
    _defaults = {"scheme": "live", "path": "", "overlay_path": None, "data": None}
    scheme: str
    path: str
    overlay_path: str | None
    data: Mapping[str, Any] | None

    def _values(self) -> tuple[Any, ...]:
        return (self.scheme, self.path, self.overlay_path)     # the parsed data is a cache, not identity

    def replace(self, **changes: Any) -> "GpuSource":
        return GpuSource(**{**{k: getattr(self, k) for k in self.__slots__}, **changes})

    def __str__(self) -> str:
        return self.scheme if not self.path else f"{self.scheme}:{self.path}"


LIVE = GpuSource()


def source_for(settings: Any, *, snapshot: str | None = None, overlay_path: str | None = None,
               data: Mapping[str, Any] | None = None, writes: bool = False) -> GpuSource:
    """The source for this node's ``[node]`` *settings*.

    An explicit *snapshot* wins; then ``nvml = "<scheme>:<path>"``; then ``[node]
    snapshot``, unless the caller *writes* (MIG, compute mode): a recording
    cannot change a GPU, so writes go to the driver.  *overlay_path* (faults
    for a replay) and *data* (the snapshot, already parsed) only apply to a
    snapshot.
    """
    if snapshot:
        return GpuSource("snapshot", snapshot, overlay_path, data)
    assert settings is not None, "no snapshot given: the [node] settings choose"
    if settings.nvml_plugin:
        return GpuSource(*settings.nvml_plugin)
    if settings.snapshot and not writes:
        return GpuSource("snapshot", settings.snapshot, overlay_path, data)
    return LIVE


def _open_live(path: str) -> tuple[NvmlApi, Closer | None]:
    from . import nvml
    return nvml.open_api(), nvml.close_api


def _open_snapshot(source: GpuSource) -> NvmlApi:
    from . import snapshot as snap
    data = source.data if source.data is not None else snap.read_snapshot(source.path)
    ov = snap.load_overlay(source.overlay_path) if source.overlay_path else None
    return snap.replay_api(data, source.path, ov, source.overlay_path or "overlay")


def open_api(source: GpuSource = LIVE) -> tuple[NvmlApi, Closer | None]:
    """The NVML contract's implementation for *source* and how to close it; for hw/ only."""
    if source.scheme == "live":
        return _open_live(source.path)
    if source.scheme == "snapshot":
        return _open_snapshot(source), None
    opener = _OPENERS.get(source.scheme) or _plugin(source.scheme)
    if opener is None:
        raise InputError(f"unknown GPU backend {source.scheme!r}", str(source))
    return opener(source.path)


def open_gpus(source: GpuSource = LIVE) -> NvmlGpus:
    """The :class:`~slurm_gpu.hw.gpus.Gpus` of *source* (initialised; ``close()`` when done)."""
    from .gpus_nvml import NvmlGpus
    api, closer = open_api(source)
    return NvmlGpus(api, closer)


def opener(source: GpuSource) -> Callable[[], NvmlGpus]:
    """A function opening :func:`open_gpus` of *source* later (in a worker thread, lazily)."""
    return lambda: open_gpus(source)
