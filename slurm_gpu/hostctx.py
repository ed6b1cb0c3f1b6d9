"""Process-wide facts named by a host program, without touching environ.

The SPANK plugin runs inside slurmstepd, whose other threads may read the C
environment, so it must not putenv().  It records here which config file and
which Slurm node name this process works for; :mod:`slurm_gpu.config` and
:mod:`slurm_gpu.hw.live` consult these first.  The module imports nothing, so
setting them costs the plugin's per-step hot path nothing.
"""
from __future__ import annotations

config_file: str | None = None   # wins over $SLURM_GPU_CONFIG and the lookup
node_name: str | None = None     # wins over $SLURMD_NODENAME and the host name
