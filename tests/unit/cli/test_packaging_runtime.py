"""What the packages hold: the runtime (the wheel in the .deb and .rpm) has no
simulator, sandbox or recorded machine; the devkit has them.

The build is setuptools' own ``build_py`` over a copy of the files
``scripts/build-wheel.sh`` copies (git's tracked and new files), which is what
``bdist_wheel`` puts in the wheel's package part; ``data_files`` are read from
setup.cfg.  About two seconds, no network, no ``wheel`` package needed.
"""
from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

DEVKIT_NAMES = ("slurm_gpu_devkit", "/sim/", "/sandbox/", "machines", "snapshot.json", "facts.json")


def _tree_copy(dest: Path) -> Path:
    """The files build-wheel.sh builds from, copied to *dest*."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         check=True, capture_output=True).stdout
    for rel in out.decode().split("\0"):
        src = ROOT / rel
        if rel and (src.is_file() or src.is_symlink()) and src.exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    return dest


def _build_py(project: Path, tmp: Path) -> list[str]:
    """The package files a wheel of *project* holds (paths inside the wheel)."""
    lib, eggs = tmp / "lib", tmp / "egg"
    eggs.mkdir()
    subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "-q",
                    "egg_info", "--egg-base", str(eggs), "build_py", "--build-lib", str(lib)],
                   cwd=project, check=True, capture_output=True)
    return sorted(str(p.relative_to(lib)) for p in lib.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tree_copy(tmp_path_factory.mktemp("tree"))


def test_the_runtime_wheel_holds_no_simulator_sandbox_or_machine(tree: Path, tmp_path: Path) -> None:
    files = _build_py(tree, tmp_path)
    assert "slurm_gpu/hw/backend.py" in files and "slurm_gpu/data/xid_catalog.json" in files
    assert [f for f in files if not f.startswith("slurm_gpu/")] == []
    assert [f for f in files if any(n in f for n in DEVKIT_NAMES)] == []


def test_the_runtime_data_files_hold_no_devkit() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    data = cfg["options.data_files"]
    assert [f"{k} = {v}" for k, v in data.items() if any(n in k + v for n in DEVKIT_NAMES)] == []


def test_the_devkit_wheel_holds_simulator_sandbox_and_machines(tree: Path, tmp_path: Path) -> None:
    files = _build_py(tree / "devkit", tmp_path)
    assert [f for f in files if not f.startswith("slurm_gpu_devkit/")] == []
    for want in ("slurm_gpu_devkit/sim/nvml.py", "slurm_gpu_devkit/sandbox/core.py",
                 "slurm_gpu_devkit/commands/sandbox.py", "slurm_gpu_devkit/machines/dgx2/PROVENANCE.md"):
        assert want in files
