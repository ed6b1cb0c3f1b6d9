"""``python -m slurm_gpu.acct prolog|epilog``: what prolog.d/epilog.d run (they call :func:`main` with ``-c``)."""
from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["prolog"], ["epilog"]):
        print("usage: python -m slurm_gpu.acct prolog|epilog", file=sys.stderr)
        return 2
    os.umask(0o022)
    from .hooks import main as run
    return run(args[0])


if __name__ == "__main__":
    sys.exit(main())
