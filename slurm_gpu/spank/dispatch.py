"""The one Python entry point of the plugin.

The C shim calls :func:`hook` (``sg_py_hook``) and :func:`option`
(``sg_py_option``) only when Python is needed; this module routes on the
SPANK context to one module per context and catches everything: an error
becomes one ``slurm_error("slurm-gpu: ...")`` line and the hook returns -1.
"""
from __future__ import annotations

from ..errors import SlurmGpuError
from .api import Spank

# Loaded into srun and slurmstepd: no typing/traceback at import time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

# Hook ids shared with spank/sg_plugin.h (SG_HOOK_*).
# (2 was user_init: the remote work moved to init_post_opt, which runs as root.)
HOOKS = {1: "init_post_opt", 3: "task_init_privileged", 4: "task_init"}


def _route(context: str) -> Any:
    if context == "local":
        from . import local
        return local
    if context == "allocator":
        from . import allocator
        return allocator
    if context == "remote":
        from . import remote
        return remote
    return None


def run_hook(spank: Any, name: str) -> int:
    """Run hook *name* of the module serving *spank*'s context; never raises."""
    return _guard(spank, name, lambda: _call(spank, name))


def run_hook_id(spank: Any, hook_id: int) -> int:
    """Run the hook the C shim numbered *hook_id*; an unknown id is an error.

    An unknown id means the plugin was built from another slurm-gpu version
    than the one installed in the venv: silently doing nothing would leave
    steps unbound (or fail later with a puzzling line).
    """
    name = HOOKS.get(hook_id)
    if name is None:
        spank.error(f"slurm-gpu: the SPANK plugin does not match the installed slurm-gpu "
                    f"(hook {hook_id}): rebuild it with slurm-gpu spank build")
        return -1
    return run_hook(spank, name)


def _call(spank: Any, name: str) -> int:
    mod = _route(spank.context)
    fn = getattr(mod, name, None) if mod else None
    if fn is None:
        return 0
    rc = fn(spank)
    return 0 if rc is None else int(rc)


def run_option(spank: Any, which: int) -> int:
    """Validate one option value in srun/sbatch/salloc; never raises."""
    def call() -> int:
        mod = _route(spank.context)
        return int(mod.option(spank, which) or 0) if mod and hasattr(mod, "option") else 0
    return _guard(spank, "option", call)


def _guard(spank: Any, where: str, fn: Callable[[], int]) -> int:
    try:
        return fn()
    except SlurmGpuError as e:
        spank.error(e.line())
    except Exception as e:  # noqa: BLE001 - a plugin must never take srun/slurmstepd down
        spank.error(f"slurm-gpu: internal error in {where}: {type(e).__name__}: {e}")
        # one line for the user; the traceback only at verbose level
        # (srun -v, or SlurmdDebug=verbose for slurmstepd's log)
        import traceback
        for line in traceback.format_exc().rstrip().splitlines():
            spank.verbose(f"slurm-gpu:   {line}")
    return -1


def attach(ffi: Any, lib: Any) -> None:
    """Bind the embedding API functions; called once by the plugin's init code."""
    from . import effects
    from .. import binding
    effects.use_plugin(ffi, lib)
    binding.use_planner(ffi, lib)           # sg_bind.c, compiled into this half

    def onerror(exc: Any, val: Any, tb: Any) -> None:
        # only reached if the guard itself failed: still one line, still -1
        lib.slurm_error(b"%s", ffi.new("char[]", f"slurm-gpu: {exc.__name__}: {val}".encode()))

    @ffi.def_extern(name="sg_py_hook", error=-1, onerror=onerror)
    def _hook(hook_id: int, sp: Any) -> int:
        return run_hook_id(Spank(ffi, lib, sp), hook_id)

    @ffi.def_extern(name="sg_py_option", error=-1, onerror=onerror)
    def _option(which: int, remote: int) -> int:
        return run_option(Spank(ffi, lib), which)
