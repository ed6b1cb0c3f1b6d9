"""The ``[acct]`` config section (docs/accounting.md)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from .. import config
from ..errors import InputError


@dataclass
class AcctSettings:
    """``[acct]``: per-job GPU accounting on this node."""

    enabled: bool = False            # the prolog/epilog step and the sampler do nothing when off
    interval: float = 10.0           # seconds between samples
    dir: str = ""                    # node records; "" = <[node] state_dir>/acct
    idle_threshold: float = 1.0      # SM % at or below which a sample counts as idle
    summary_max_bytes: int = 3000    # the AdminComment part, at most
    max_jobs: int = 1024             # aggregates kept at most (oldest finished dropped first)
    retry_hours: float = 24.0        # how long an unstored summary is retried
    proc_root: str = "/proc"         # where PIDs' cgroups are read (tests point it elsewhere)
    sacct: str = "/usr/bin/sacct"
    sacctmgr: str = "/usr/bin/sacctmgr"
    scontrol: str = "/usr/bin/scontrol"
    scancel: str = "/usr/bin/scancel"
    dbd_timeout: float = 10.0        # per sacct/sacctmgr call
    metrics_file: str = ""           # Prometheus textfile ("" = none)
    job_labels: bool = False         # per-job labels in metrics (opt-in: cardinality)
    dcgm_mapping_dir: str = ""       # dcgm-exporter --hpc-job-mapping-dir ("" = none)
    idle_minutes: float = 0.0        # idle-GPU policy: 0 = off
    idle_action: str = "log"         # log (and metric), or cancel


def load(raw: dict | None = None) -> AcctSettings:
    s = config.section(AcctSettings, "acct", raw)
    where = f"[acct] in {config.config_path() or 'config'}"
    if s.idle_action not in ("log", "cancel"):
        raise InputError(f"config key acct.idle_action must be log or cancel (got {s.idle_action!r})", where)
    if s.interval <= 0 or s.summary_max_bytes < 200 or s.max_jobs < 1:
        raise InputError("config keys acct.interval, summary_max_bytes (>= 200) and max_jobs must be positive",
                         where)
    return s


def acct_dir(s: AcctSettings, state_dir: str) -> str:
    """The node's accounting directory (``%n`` already expanded in *state_dir*)."""
    from ..hw.live import node_name
    return s.dir.replace("%n", node_name()) if s.dir else os.path.join(state_dir, "acct")
