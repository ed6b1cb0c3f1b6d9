"""`make gpu-check-bundle` (scripts/gpu-check-bundle.sh), narrowed to this
host's CPython and machine: the directory builds under its size limit, and
its one script makes a venv from the bundle's wheels alone (pip's index
switched off) and runs up to the missing NVML, where it says so in one line
and exits 77, leaving the bundle as it was and nothing in its temp dir.
The full bundle (CPython 3.10-3.13, x86_64 and aarch64) measured 14 MiB."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxlib import REPO


def tree_state(d: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(d)), p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*"))


def test_bundle_builds_and_its_script_stops_at_the_missing_nvml(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check"
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    res = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check-bundle.sh"), str(out)],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "GPU_CHECK_PYTHONS": py, "GPU_CHECK_ARCHES": os.uname().machine})
    if res.returncode != 0 and "cannot fetch" in res.stderr:
        pytest.skip(res.stderr.strip().splitlines()[-1])
    assert res.returncode == 0, res.stderr
    assert "MiB" in res.stdout
    names = sorted(os.listdir(out))
    assert names == ["MANIFEST", "gpu-check.sh", "gpu_check.py", "tests", "wheels"], names
    wheels = os.listdir(out / "wheels")
    for want in ("slurm_gpu-", "nvidia_ml_py-", "pytest-", "pip-", f"cffi-2.1.1-cp{py.replace('.', '')}"):
        assert any(w.startswith(want) for w in wheels), (want, wheels)
    assert (out / "tests" / "gpu" / "test_live_nvml.py").is_file()
    os.chmod(out, 0o555)                       # read-only: the check writes nothing into it
    before = tree_state(out)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    try:
        run = subprocess.run(["sh", str(out / "gpu-check.sh")], capture_output=True, text=True, timeout=300,
                             env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp), "GPU_CHECK_PYTHON": sys.executable
                                  if sys.executable.startswith("/usr/bin/") else "/usr/bin/python3",
                                  "PIP_INDEX_URL": "http://127.0.0.1:9/none"})
    finally:
        os.chmod(out, 0o755)
    lines = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode == 77, run.stdout + run.stderr
    assert len(lines) == 1 and lines[0].startswith("slurm-gpu: gpu-check: NVML unavailable"), lines
    assert tree_state(out) == before
    assert os.listdir(tmp) == []               # venv and results removed: nothing was checked
