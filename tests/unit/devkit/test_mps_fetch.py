"""scripts/fetch-mps.sh without a mirror, and what the tests then do.

No network is used: the mirror is a closed local port.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the fetch runs as root")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_GPU_MPS_",
                                                                    "SLURM_GPU_REQUIRE"))}
    env.update(SLURM_GPU_MPS_CACHE=str(tmp_path / "cache"),
               SLURM_GPU_MPS_MIRROR="http://127.0.0.1:9/debian", **extra)
    return env


def _apt_state() -> list[tuple[str, int]]:
    out = []
    for d in ("/etc/apt/sources.list.d", "/var/lib/apt/lists"):
        for p in sorted(Path(d).glob("*")) if Path(d).is_dir() else []:
            out.append((str(p), p.stat().st_mtime_ns))
    src = Path("/etc/apt/sources.list")
    if src.exists():
        out.append((str(src), src.stat().st_mtime_ns))
    return out


def test_no_mirror_is_one_line_and_leaves_apt_alone(tmp_path: Path) -> None:
    before = _apt_state()
    r = subprocess.run(["bash", str(ROOT / "scripts" / "fetch-mps.sh")], env=_env(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm-gpu: cannot fetch nvidia-cuda-mps ("), r.stderr
    assert "127.0.0.1:9" in lines[0]
    assert _apt_state() == before
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".lock"]   # no half-made cache


@pytest.mark.parametrize("require", ["1", ""])
def test_a_test_that_needs_it_fails_or_skips(tmp_path: Path, require: str) -> None:
    t = tmp_path / "test_needs_mps.py"
    t.write_text("from mpsbinary import real_mps_control\n\n"
                 "def test_it():\n    real_mps_control()\n")
    env = _env(tmp_path, SLURM_GPU_REQUIRE_INTEGRATION=require,
               PYTHONPATH=f"{ROOT / 'tests'}:{ROOT}")   # this checkout
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                        str(t)], env=env, capture_output=True, text=True, timeout=300,
                       cwd=str(tmp_path))
    if require:
        assert r.returncode == 1, r.stdout
        assert ("SLURM_GPU_REQUIRE_INTEGRATION=1 but NVIDIA's nvidia-cuda-mps-control is not "
                "available: slurm-gpu: cannot fetch nvidia-cuda-mps") in r.stdout
        assert "Traceback" not in r.stdout
    else:
        assert r.returncode == 0 and "1 skipped" in r.stdout, r.stdout
