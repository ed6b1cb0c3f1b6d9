"""The ``slurm-gpu`` console script and ``python -m slurm_gpu``.

Answers ``slurm-gpu --version`` before click is imported (click alone costs
about as much as the interpreter's start: ``python -X importtime``), and runs
plain ``health`` and ``inventory`` argvs without it (:mod:`slurm_gpu.fastcli`:
Slurm's HealthCheckProgram path); every other command goes to the click front
end in :mod:`slurm_gpu.cli`.
"""
from __future__ import annotations

import sys


def run() -> None:
    argv = sys.argv[1:]
    if argv == ["--version"]:
        from . import __version__
        # click's version_option format, so scripts that parse it see no change
        sys.stdout.write(f"slurm-gpu, version {__version__}\n")
        sys.exit(0)
    if argv and argv[0] in ("health", "inventory"):
        from .fastcli import try_run
        rc = try_run(argv)
        if rc is not None:
            sys.exit(rc)
    from .cli import run as cli_run
    cli_run()
