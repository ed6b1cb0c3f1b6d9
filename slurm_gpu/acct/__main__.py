"""``python -m slurm_gpu.acct prolog|epilog``: what prolog.d/epilog.d run (they call :func:`main` with ``-c``)."""
from __future__ import annotations

import sys

from .. import hookentry


def main(argv: list[str] | None = None) -> int:
    return hookentry.run(argv, "slurm_gpu.acct", _step)


def _step(step: str) -> int:
    from .hooks import main as run
    return run(step)


if __name__ == "__main__":
    sys.exit(main())
