"""NVIDIA's real nvidia-cuda-mps-control for the tests (scripts/fetch-mps.sh).

Every MPS control path in the tests runs the real binary.  When it cannot be
fetched (no mirror), a test that needs it fails with one line under
``SLURM_GPU_REQUIRE_INTEGRATION=1`` and is skipped otherwise.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import pytest
from paths import ROOT


@lru_cache(maxsize=1)
def _fetch() -> tuple[Path | None, str]:
    from slurm_gpu_devkit.sim import mps_real
    if os.geteuid() != 0 and mps_real.cached() is None:
        return None, "fetching it needs root (scripts/fetch-mps.sh)"
    # this checkout's script, whichever slurm_gpu (checkout or venv) is imported
    return mps_real.fetch(script=ROOT / "scripts" / "fetch-mps.sh")


def real_mps_control() -> Path:
    """The cached real binary; fails or skips the calling test without it."""
    path, why = _fetch()
    if path is None:
        msg = f"NVIDIA's nvidia-cuda-mps-control is not available: {why}"
        if os.environ.get("SLURM_GPU_REQUIRE_INTEGRATION") == "1":
            pytest.fail(f"SLURM_GPU_REQUIRE_INTEGRATION=1 but {msg}", pytrace=False)
        pytest.skip(msg)
    return path


def install_real_mps_control(dest: Path) -> Path:
    """Copy the real binary to *dest* (a test's own directory, readable by job users)."""
    from slurm_gpu_devkit.sim import mps_real
    real_mps_control()
    out = mps_real.install(dest)
    assert out is not None
    return out


def mps_control_for_jobs(dest: Path) -> Path:
    """The real binary at *dest* for the job lifecycle tests; without it the
    stand-in (checked to answer as the real one by test_mps_control.py), so
    those tests still run where nothing can be fetched, except under
    ``SLURM_GPU_REQUIRE_INTEGRATION=1``, where its absence fails."""
    from slurm_gpu_devkit.sim import mps_real
    from slurm_gpu_devkit.sim.mps_control import write_wrapper
    path, why = _fetch()
    if path is None:
        if os.environ.get("SLURM_GPU_REQUIRE_INTEGRATION") == "1":
            pytest.fail("SLURM_GPU_REQUIRE_INTEGRATION=1 but NVIDIA's nvidia-cuda-mps-control "
                        f"is not available: {why}", pytrace=False)
        return write_wrapper(dest)
    out = mps_real.install(dest)
    assert out is not None
    return out
