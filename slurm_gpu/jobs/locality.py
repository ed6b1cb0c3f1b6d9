"""What the prolog takes from the node-fact cache (:mod:`slurm_gpu.nodefacts`).

Reading the node model (hwloc topology + NVML) costs ~100 ms, more than a
whole MPS prolog should.  The node's one cache entry, shared with the SPANK
step, holds each GPU's identity and locality from one model read; the first
caller after boot (or after a config, gres.conf, snapshot or simulator file
changed) reads the model, later prologs read the small file.

The table is keyed by Slurm's GPU index (what ``SLURM_JOB_GPUS`` holds, see
:mod:`slurm_gpu.confgen.gresorder`), and each entry names its GPU by UUID
and device minor: never by NVML index, which is neither.
"""
from __future__ import annotations


TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

from .. import nodefacts


def gpu_table(cache_dir: str | None, config_path: str | None, read_node: Callable[[], Any],
              gres_conf: str | None = None, node_name: str = "") -> dict[int, dict[str, Any]]:
    """{Slurm GPU index: {"minor", "uuid", "name", "cpus"}} from the cache or *read_node*.

    ``cpus``: the GPU's local cores' PUs, what the MPS daemon is pinned to
    (:func:`slurm_gpu.nodefacts.for_prolog`).  *cache_dir* None: the node's
    cache (:data:`slurm_gpu.nodefacts.CACHE_DIR`).
    """
    data = nodefacts.get(config_path, node_name, gres_conf, with_gpus=True, read_node=read_node,
                         cache_dir=cache_dir)
    return nodefacts.for_prolog(data["gpus"])
