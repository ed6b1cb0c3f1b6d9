"""slurm-gpu's devkit: what develops and demonstrates slurm-gpu, never what a node runs.

* :mod:`slurm_gpu_devkit.sim`: the NVML simulator (the ``sim:<state file>``
  GPU backend);
* :mod:`slurm_gpu_devkit.sandbox`: a real Slurm on one host with fake GPUs
  (the ``slurm-gpu sandbox`` command group);
* ``machines/``: recorded real machines (hwloc XML and NVML snapshots).

It plugs into the runtime (:mod:`slurm_gpu`) through entry points only
(``slurm_gpu.backends``, ``slurm_gpu.commands``: :mod:`slurm_gpu.plugins`),
and is released with it: the same version.
"""
from pathlib import Path

__version__ = "0.1.0"

# Where slurm_gpu_devkit is importable from (site-packages, or a checkout's devkit/).
SOURCE_ROOT = Path(__file__).resolve().parent.parent
MACHINES_DIR = SOURCE_ROOT / "slurm_gpu_devkit" / "machines"
