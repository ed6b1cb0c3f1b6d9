"""The slurm-gpu config a test runs the CLI, the health check or a hook with, in-process."""
from __future__ import annotations

from pathlib import Path

import pytest


def use_config(monkeypatch: pytest.MonkeyPatch, path: Path, text: str) -> Path:
    """*text*, written to *path*, as the config in effect (``SLURM_GPU_CONFIG``), and no
    ``SLURM_CONF``: nothing of the host's Slurm or slurm-gpu setup reaches the test."""
    from slurm_gpu import config
    path.write_text(text)
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(path))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    config.clear_cache()
    return path
