"""The entry of every slurm-gpu part that slurmd runs as a prolog or epilog.

``prolog.d/`` and ``epilog.d/`` scripts start ``python -I -c 'from
slurm_gpu.<part> import main; ...' prolog|epilog``; each part's ``main``
hands its argv to :func:`run`, which checks it and sets the umask the same
way for all.  Imported by every such start: builtins only.

Such a process lives for one job's prolog or epilog and exits: what it
allocates is, overwhelmingly, the modules it imports, which stay alive until
the end.  The cyclic garbage collector's passes over them free nothing, yet
at exit the interpreter walks them all once more.  So the step runs with
cyclic collection off (refcounting still frees everything acyclic at once)
and what is alive at its end is frozen (``gc.freeze``), out of that last
walk: the same reasoning as :mod:`slurm_gpu.gcpause`, measured on a
``--gpu-mps`` job's prolog and epilog in docs/mps-mig.md.
"""
from __future__ import annotations

import gc
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable


def run(argv: list[str] | None, prog: str, step: Callable[[str], int]) -> int:
    """``step("prolog")`` or ``step("epilog")`` as *argv* (``sys.argv[1:]`` when None)
    says; anything else is a usage line naming ``python -m`` *prog*, exit 2."""
    args = sys.argv[1:] if argv is None else argv
    if args not in (["prolog"], ["epilog"]):
        print(f"usage: python -m {prog} prolog|epilog", file=sys.stderr)
        return 2
    # slurmd's umask reaches us: with 002 our own state and per-job directories
    # would come out group-writable (and then be refused as untrustworthy).
    os.umask(0o022)
    was = gc.isenabled()
    gc.disable()
    try:
        return step(args[0])
    finally:
        gc.freeze()
        if was:
            gc.enable()
