"""The ``[jobs]``, ``[mps]`` and ``[mig]`` config sections (see docs/mps-mig.md)."""
from __future__ import annotations

from .. import config
from ..errors import InputError


class JobsSettings(config.Settings):
    """``[jobs]``: failure policy for the prolog and epilog."""

    on_internal_error: str = "drain"      # drain: exit non-zero (Slurm drains+requeues); pass
    user_error: str = "fail_tasks"        # fail_tasks: tasks fail via the SPANK plugin; cancel
    scancel: str = "/usr/bin/scancel"
    epilog_kill_wait: float = 2.0         # seconds to wait for SIGKILLed stragglers
    timeout: float = 120.0                # watchdog over one prolog/epilog run; 0 = none


class MpsSettings(config.Settings):
    """``[mps]``: per-job MPS control daemons."""

    enabled: bool = True                  # false: --gpu-mps jobs fail with one line
    control: str = "/usr/bin/nvidia-cuda-mps-control"
    base_dir: str = "/run/slurm-gpu/mps"  # root-owned; per-job <base>/<jobid>/{pipe,log}; %n: node
    start_timeout: float = 10.0
    quit_timeout: float = 5.0
    default_active_thread_percentage: int = 0   # 0: leave MPS's default (100)
    pinned_mem_limit: str = ""                  # e.g. "16G" for every device of the job
    exclusive_process: bool = False             # set EXCLUSIVE_PROCESS on exclusive GPUs
    bind_cpus: bool = True                      # pin the daemon to GPU-local CPUs
    taskset: str = "/usr/bin/taskset"          # unused since the prolog pins the daemon itself; still accepted


class MigSettings(config.Settings):
    """``[mig]``: per-job MIG layouts."""

    enabled: bool = True
    check_blockers: bool = True
    gres_conf: str = ""          # where ``mig apply`` regenerates gres.conf ("" = skip)
    dev_dir: str = "/dev"        # device directory for the regenerated gres.conf


def _choice(value: str, allowed: tuple[str, ...], key: str) -> None:
    if value not in allowed:
        raise InputError(f"config key {key} must be one of {', '.join(allowed)} (got {value!r})",
                         str(config.config_path() or "config"))


def load() -> tuple[JobsSettings, MpsSettings, MigSettings]:
    """All three sections, validated."""
    raw = config.load_raw()
    jobs = config.section(JobsSettings, "jobs", raw)
    mps = config.section(MpsSettings, "mps", raw)
    mig = config.section(MigSettings, "mig", raw)
    # Several slurmd on one host (the sandbox) keep their job directories apart.
    from ..hw.live import node_name
    mps.base_dir = mps.base_dir.replace("%n", node_name())
    _choice(jobs.on_internal_error, ("drain", "pass"), "jobs.on_internal_error")
    _choice(jobs.user_error, ("fail_tasks", "cancel"), "jobs.user_error")
    if not 0 <= mps.default_active_thread_percentage <= 100:
        raise InputError("config key mps.default_active_thread_percentage must be 0..100",
                         str(config.config_path() or "config"))
    return jobs, mps, mig


# This area's sections of the node-fact entry (slurm_gpu.nodefacts): the
# epilog's health part is its own section, read by the first epilog.
SECTION = "jobs"
HEALTH_SECTION = "jobs-health"


def _section() -> dict:
    """What the prolog and epilog read from the config, as plain data for the
    node-fact entry: the three sections and ``[node]``."""
    from ..hw import live
    jobs, mps, mig = load()
    node = live.settings()
    return {"jobs": vars(jobs), "mps": vars(mps), "mig": vars(mig),
            "node": {k: getattr(node, k) for k in node.__slots__}}


def _health_section() -> dict:
    """Where the health check keeps its state, if the user-problem check is on ("" when off)."""
    from ..health.settings import HealthSettings, RepairSettings
    from ..hw import live
    if not config.section(RepairSettings, "repair").user_problem:
        return {"state_dir": ""}
    hs = config.section(HealthSettings, "health")
    return {"state_dir": (hs.state_dir or live.settings().state_dir).replace("%n", live.node_name())}


def cached(config_path: str | None, node: str, gres_conf: str | None, *,
           health: bool) -> dict:
    """:func:`_section`, plus ``health_state_dir`` ("" without *health*), from
    the node's node-fact entry (read and stored on a miss).

    The entry holds while the config files (and the node's other inputs)
    keep their stamps, so every prolog and epilog after the first reads no
    TOML: tomllib with re, enum and datetime costs each run ~12 ms.
    """
    from .. import nodefacts
    sections = {SECTION: _section}
    if health:
        sections[HEALTH_SECTION] = _health_section
    data = nodefacts.get(config_path, node, gres_conf, with_gpus=False, sections=sections)
    got = data["sections"]
    return dict(got[SECTION], health_state_dir=got[HEALTH_SECTION]["state_dir"] if health else "")

