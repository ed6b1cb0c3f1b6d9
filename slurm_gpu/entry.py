"""The ``slurm-gpu`` console script and ``python -m slurm_gpu``.

Answers ``slurm-gpu --version`` before click is imported (click alone costs
about as much as the interpreter's start: ``python -X importtime``); every
other command goes to the click front end in :mod:`slurm_gpu.cli`.
"""
from __future__ import annotations

import sys


def run() -> None:
    if sys.argv[1:] == ["--version"]:
        from . import __version__
        # click's version_option format, so scripts that parse it see no change
        sys.stdout.write(f"slurm-gpu, version {__version__}\n")
        sys.exit(0)
    from .cli import run as cli_run
    cli_run()
