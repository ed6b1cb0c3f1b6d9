"""Process-wide facts named by a host program, without touching environ.

The SPANK plugin runs inside slurmstepd, whose other threads may read the C
environment, so it must not putenv().  It records here which config file and
which Slurm node name this process works for; :mod:`slurm_gpu.config` and
:mod:`slurm_gpu.hw.live` consult these first.  The module imports nothing, so
setting them costs the plugin's per-step hot path nothing.  It also reads
the host process's own environment for the bound step (:func:`environ_get`)
through the built-in ``posix`` module: importing :mod:`os` for
``os.environ`` costs ~1 ms of every bound step.
"""
from __future__ import annotations

import posix
import sys

config_file: str | None = None   # wins over $SLURM_GPU_CONFIG and the lookup
node_name: str | None = None     # wins over $SLURMD_NODENAME and the host name


def environ_get(name: str) -> str | None:
    """``os.environ.get(name)`` of this process (slurmstepd's own environment,
    never the job's), decoded as :mod:`os` does, without importing it."""
    value = posix.environ.get(name.encode(sys.getfilesystemencoding(), "surrogateescape"))
    return None if value is None else value.decode(sys.getfilesystemencoding(), "surrogateescape")
