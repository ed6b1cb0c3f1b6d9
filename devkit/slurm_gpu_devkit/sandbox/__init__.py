"""A real Slurm (Debian's slurmctld/slurmd/munge) on one host, with fake GPUs.

Integration tests, ``make demo`` and developers use it to run real jobs
against nodes modelled on recorded GPU servers.  See ``docs/sandbox.md``.
"""
from __future__ import annotations

from .core import Sandbox
from .options import SandboxOptions, require_root
from .layout import Layout

__all__ = ["Layout", "Sandbox", "SandboxOptions", "require_root"]
