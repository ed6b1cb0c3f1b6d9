"""What a job step takes from the node-fact cache (:mod:`slurm_gpu.nodefacts`).

A bound step needs the ``[spank]`` settings, the state directory and each
GPU's locality.  They come from the node's one cache entry, which the prolog
shares: its own ``spank`` section holds the settings, and the GPUs are read
once for both.  A miss (first step after boot, a changed config, gres.conf,
snapshot or simulator file) reads them here, in slurmstepd, with a deadline
on the node model.  Imported in every bound step: builtins only at import.
"""
from __future__ import annotations

from .. import hostctx, nodefacts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NVML_DEADLINE = 10.0      # seconds a cache miss may spend reading NVML/hwloc in slurmstepd
SECTION = "spank"


def _settings() -> dict[str, Any]:
    from . import settings as spank_settings
    s = spank_settings.load()
    return {"memlock": s.memlock_bytes(), "allocator_preload": s.allocator_preload,
            "allocator_env": {str(k): str(v) for k, v in s.allocator_env.items()},
            "numa_map": s.numa_map()}


def _read_node() -> Any:
    from ..hw import load_node
    from ..hw.deadline import bounded
    # slurmstepd has no watchdog over us: a hung NVML read would hang the step.
    return bounded(load_node, NVML_DEADLINE, "reading the node model (NVML, hwloc)")


def _gres_conf() -> str | None:
    # slurmstepd's own environment (slurmd exports SLURM_CONF), never the job's
    conf = hostctx.environ_get("SLURM_CONF")
    return nodefacts.gres_conf_path({"SLURM_CONF": conf} if conf is not None else {})


def _view(data: dict[str, Any]) -> dict[str, Any]:
    gpus = data["gpus"]
    return dict(data["sections"][SECTION], state_dir=data["state_dir"],
                gpus=None if gpus is None else nodefacts.for_binding(gpus))


def get(config_path: str | None, node: str, *, with_gpus: bool,
        cache_dir: str | None = None) -> dict[str, Any]:
    """{"memlock", "allocator_preload", "allocator_env", "numa_map", "state_dir",
    "gpus": binding's locality table, or None without *with_gpus*}."""
    gres_conf = _gres_conf()
    data = nodefacts.get(config_path, node, gres_conf, with_gpus=with_gpus,
                         sections={SECTION: _settings}, read_node=_read_node,
                         cache_dir=cache_dir)
    if with_gpus:
        # the table the C half binds plain steps from (spank/sg_bind.c):
        # kept in step with the entry here, on the Python path
        from . import bindtable
        bindtable.keep(data, data["sections"][SECTION].get("numa_map"), config_path, node,
                       gres_conf, cache_dir)
    return _view(data)


def build(config_path: str | None, node: str, *, with_gpus: bool) -> dict[str, Any]:
    """The same, read now and not stored: the slow path."""
    return _view(nodefacts.build(config_path, node, _gres_conf(),
                                 with_gpus=with_gpus, sections={SECTION: _settings},
                                 read_node=_read_node))
