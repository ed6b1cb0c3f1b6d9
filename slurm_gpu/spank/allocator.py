"""sbatch and salloc (S_CTX_ALLOCATOR): the same checks as srun.

Only options registered with ``spank_option_register`` exist here (Slurm
ignores a static option table in this context), and there is no
local_user_init; otherwise the work is srun's.
"""
from __future__ import annotations

from .local import init_post_opt, option

__all__ = ["option", "init_post_opt"]
