"""srun (S_CTX_LOCAL): check option values before anything is submitted.

A bad value fails srun with one ``slurm-gpu:`` line naming the option, so a
user's mistake never reaches the prolog.  Valid values are handed to the
prolog/epilog with ``spank_job_control_setenv`` (they see ``SPANK_<NAME>``).
"""
from __future__ import annotations

from .. import joboptions as options

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def option(spank: Any, which: int) -> int:
    """Option callback: validate the value the C shim stored."""
    options.validate_option(which, spank.option_value(which))
    return 0


def init_post_opt(spank: Any) -> int:
    """Carry every given option to the prolog and epilog, and open the prolog's gate
    when one of them gives the prolog work (see ``options.OPTIONS``)."""
    gate = False
    for opt in options.OPTIONS:
        value = spank.option_value(opt.id)
        if value is None:
            continue
        spank.job_control_setenv(opt.env, options.validate_option(opt.id, value))
        gate = gate or opt.prolog
    if gate:
        spank.job_control_setenv(options.PROLOG_GATE, "1")
    return 0
