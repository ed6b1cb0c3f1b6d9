"""``python -m slurm_gpu.jobs prolog|epilog``: what prolog.d/epilog.d exec.

Exit status is the contract with slurmd: non-zero drains the node (and
requeues the job, for the prolog), so it is returned only for node faults
under ``[jobs] on_internal_error = "drain"``.  Nothing here may raise.
"""
from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["prolog"], ["epilog"]):
        print("usage: python -m slurm_gpu.jobs prolog|epilog", file=sys.stderr)
        return 2
    # slurmd's umask reaches us: with 002 our own state and MPS directories
    # would come out group-writable (and then be refused as untrustworthy).
    os.umask(0o022)
    try:
        from . import lifecycle
        ctx = lifecycle.default_context()
        return lifecycle.prolog(ctx) if args[0] == "prolog" else lifecycle.epilog(ctx)
    except Exception as e:  # noqa: BLE001 - settings unreadable, bad job id...: a node fault
        from ..errors import SlurmGpuError
        line = e.line() if isinstance(e, SlurmGpuError) else \
            f"slurm-gpu: internal error: {type(e).__name__}: {e}"
        print(f"{line} [{args[0]}]", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
