"""Every section of the config file, its settings class and how it is read.

One list for what reads the whole file at once: ``doctor`` (does the file
that Slurm's hooks will read load, with every section's own checks?) and the
test that keeps the shipped ``packaging/common/slurm-gpu.toml`` equal to the
code's defaults.  The runtime never imports this module: each area reads its
own section.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from . import config

# section -> (settings class, the area's loader: None = config.section() alone)
SECTIONS: dict[str, tuple[str, str | None]] = {
    "node": ("slurm_gpu.hw.live:NodeSettings", "slurm_gpu.hw.live:settings"),
    "jobs": ("slurm_gpu.jobs.settings:JobsSettings", "slurm_gpu.jobs.settings:load"),
    "mps": ("slurm_gpu.jobs.settings:MpsSettings", "slurm_gpu.jobs.settings:load"),
    "mig": ("slurm_gpu.jobs.settings:MigSettings", "slurm_gpu.jobs.settings:load"),
    "health": ("slurm_gpu.health.settings:HealthSettings", None),
    "repair": ("slurm_gpu.health.settings:RepairSettings", None),
    "acct": ("slurm_gpu.acct.settings:AcctSettings", "slurm_gpu.acct.settings:load"),
    "spank": ("slurm_gpu.spank.settings:SpankSettings", "slurm_gpu.spank.settings:load"),
    "cluster": ("slurm_gpu.cluster.modelfile:ClusterSettings", "slurm_gpu.cluster.modelfile:settings"),
    "imex": ("slurm_gpu.imex.settings:ImexSettings", "slurm_gpu.imex.settings:load"),
}


def _attr(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def defaults() -> dict[str, dict[str, Any]]:
    """Every section's keys with their default values, as TOML would hold them."""
    out: dict[str, dict[str, Any]] = {}
    for name, (cls_ref, _) in SECTIONS.items():
        cls = _attr(cls_ref)
        value = cls()
        out[name] = {k: getattr(value, k) for k in config.field_names(cls)}
    return out


def validate(path: str) -> list[str]:
    """Load *path* as the hooks would, through every section's own loader.

    Returns the sections the file has that no code reads (a misspelt
    ``[mps]`` is silently ignored at run time).  Raises the loader's error
    (:class:`~slurm_gpu.errors.SlurmGpuError`, or ``ValueError``/``TypeError``
    from a settings class's own check) for the first section that is wrong.
    """
    previous = config.hostctx.config_file
    config.use_config(path)
    config.clear_cache()
    try:
        raw = config.load_raw()
        for name, (cls_ref, loader_ref) in SECTIONS.items():
            load: Callable[[], Any] = (_attr(loader_ref) if loader_ref
                                       else (lambda c=_attr(cls_ref), n=name: config.section(c, n)))
            load()
        return sorted(set(raw) - set(SECTIONS))
    finally:
        config.use_config(previous)
        config.clear_cache()
