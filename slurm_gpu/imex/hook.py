"""``prolog.d/30-slurm-gpu-imex`` and ``epilog.d/55-slurm-gpu-imex`` call :func:`main`.

Exit status is the contract with slurmd: non-zero drains the node (and
requeues the job, for the prolog), returned only for this node's own faults
under ``[jobs] on_internal_error = "drain"`` (see :mod:`.job`).  Nothing
here may raise.
"""
from __future__ import annotations

import os
import sys

from .. import hookentry


def _settings(env: dict[str, str]) -> tuple[dict, str, dict]:
    """([imex], [cluster] publish_dir, [jobs]) from the node-fact entry."""
    from .. import config, nodefacts
    from ..hw import live
    from ..jobs.settings import cached as jobs_cached
    from .settings import cached
    config_path = config.config_file() or None
    name = live.node_name()
    gres_conf = nodefacts.gres_conf_path(env)
    sec = cached(config_path, name, gres_conf)
    return sec["imex"], sec["publish_dir"], jobs_cached(config_path, name, gres_conf, health=False)["jobs"]


def context(env: dict[str, str] | None = None,
            settings: tuple[dict, str, dict] | None = None) -> "object":
    """The prolog's :class:`.job.Ctx`; *settings*: :func:`_settings`' answer, when the caller has it."""
    from ..hw import live
    from .job import Ctx
    from .teardown import event_logger
    env = dict(os.environ) if env is None else env
    imex, publish_dir, jobs = settings or _settings(env)

    def own_gpus() -> list:
        # The node-fact entry's GPUs (read from NVML once, then cached while
        # the node's inputs keep their stamps), as the jobs prolog reads them.
        from .. import config, nodefacts
        name = live.node_name()
        return nodefacts.get(config.config_file() or None, name, nodefacts.gres_conf_path(env),
                             with_gpus=True)["gpus"]

    return Ctx(env, imex, publish_dir, live.node_name(),
               on_internal_error=jobs["on_internal_error"], scancel=jobs["scancel"],
               log=event_logger(imex["base_dir"]), own_gpus=own_gpus)


def main(argv: list[str] | None = None) -> int:
    return hookentry.run(argv, "slurm_gpu.imex.hook", _step)


def _step(step: str) -> int:
    try:
        env = dict(os.environ)
        settings = _settings(env)
        s, _, jobs = settings
        # The readiness wait plus a stop on each side, and room to spare: the
        # watchdog only catches a hang.
        limit = float(s["timeout"]) + 2 * float(s["stop_timeout"]) + 30.0
        from ..jobs.__main__ import _watchdog
        _watchdog(limit, f"imex {step}", 1 if jobs["on_internal_error"] == "drain" else 0, lambda line: None)
        if step == "epilog":         # the light path: no json, re or socket (see .teardown)
            from . import teardown
            return teardown.epilog(env, s["base_dir"], float(s["stop_timeout"]),
                                   teardown.event_logger(s["base_dir"]), jobs["on_internal_error"])
        from . import job
        ctx = context(env, settings)       # the settings read above: once per prolog
        assert isinstance(ctx, job.Ctx)
        return job.prolog(ctx)
    except Exception as e:  # noqa: BLE001 - settings unreadable, bad job id...: a node fault
        from ..errors import SlurmGpuError
        line = e.line() if isinstance(e, SlurmGpuError) else \
            f"slurm-gpu: imex: internal error: {type(e).__name__}: {e}"
        print(f"{line} [imex {step}]", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
