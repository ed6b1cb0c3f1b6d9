"""The GPU bundle's check (packaging/gpu-check/gpu_check.py) on a machine
without NVIDIA's driver, such as this one: one line saying so, exit 77, no
traceback, nothing written.  Its run on a real GPU: docs/development.md."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from paths import ROOT

REPO = ROOT
CHECK = REPO / "packaging" / "gpu-check" / "gpu_check.py"


def test_without_nvml_it_says_so_in_one_line(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "LD_LIBRARY_PATH": str(tmp_path)}
    res = subprocess.run([sys.executable, str(CHECK), "--bundle", str(REPO), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, env=env)
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode == 77, res.stdout + res.stderr
    assert len(lines) == 1 and lines[0].startswith("slurm-gpu: gpu-check: NVML unavailable"), lines
    assert lines[0].endswith("nothing to check on this machine (needs NVIDIA's driver)")
    assert os.listdir(tmp_path) == []
