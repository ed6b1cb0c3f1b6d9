"""srun (S_CTX_LOCAL): check option values before anything is submitted.

A bad value fails srun with one ``slurm-gpu:`` line naming the option, so a
user's mistake never reaches the prolog.  Valid values are handed to the
prolog/epilog with ``spank_job_control_setenv`` (they see ``SPANK_<NAME>``).
"""
from __future__ import annotations

from . import options

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def option(spank: Any, which: int) -> int:
    """Option callback: validate the value the C shim stored."""
    options.validate_option(which, spank.option_value(which))
    return 0


def init_post_opt(spank: Any) -> int:
    """Carry every given option to the prolog and epilog."""
    for which, env in options.ENV_NAMES.items():
        value = spank.option_value(which)
        if value is None:
            continue
        spank.job_control_setenv(env, options.validate_option(which, value))
    return 0
