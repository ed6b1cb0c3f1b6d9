"""packaging/common/venv-setup.sh (the packages' postinst/%post) on this host,
in a directory of its own (SLURM_GPU_BASE), with the RPM's mode (every
dependency from the wheel directory): a SPANK plugin build that fails while
the live tree has a working plugin keeps the live tree and fails loudly
(issue 23 #3); the next good run goes live and clears the record.

The deb tier (scripts/test-deb.sh) runs the same through dpkg in a Debian
root; this one needs no mirror, only gcc, libslurm-dev and the package index
that `make install` used.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxlib import REPO
from slurm_gpu import doctor

SETUP = REPO / "packaging" / "common" / "venv-setup.sh"

pytestmark = pytest.mark.skipif(
    not Path("/usr/include/slurm/spank.h").exists() or not shutil.which("gcc")
    or not Path("/usr/bin/python3").exists(), reason="needs gcc, libslurm-dev and /usr/bin/python3")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    res = subprocess.run(["bash", str(REPO / "scripts" / "build-wheel.sh"), str(out)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    pins = [l for l in (REPO / "packaging" / "wheels.txt").read_text().splitlines() if "==" in l]
    res = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                          "-d", str(out), *pins], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        pytest.skip(f"cannot fetch the pinned wheels: {res.stderr.strip().splitlines()[-1:]}")
    return out


def setup(base: Path, wheels: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(SETUP), str(wheels)], capture_output=True, text=True, timeout=900,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_GPU_BASE": str(base),
                               "SLURM_GPU_PYTHON": "/usr/bin/python3", "SLURM_GPU_SYSTEM_SITE": "0", **env})


def test_failed_plugin_build_keeps_the_live_tree(wheels, tmp_path):
    base = tmp_path / "opt-slurm-gpu"
    first = setup(base, wheels)
    assert first.returncode == 0, first.stderr
    assert "slurm-gpu: SPANK plugin built" in first.stdout, first.stdout
    live = os.readlink(base / "venv")
    plugin = base / "venv" / "lib" / "slurm-gpu" / "slurm_gpu_spank.so"
    assert plugin.is_file()
    # the Slurm major it was built for, and how doctor (and the triggers) rebuild it: as the package ran it
    assert "; installed: 22.05 (/usr/lib/x86_64-linux-gnu/libslurm.so.38)" in first.stdout, first.stdout
    rerun = f"SLURM_GPU_PYTHON=/usr/bin/python3 SLURM_GPU_SYSTEM_SITE=0 {SETUP} {wheels}"
    assert (base / "setup-command").read_text() == rerun + "\n"
    assert doctor.rebuild_command(str(base / live / "lib" / "slurm-gpu" / "slurm_gpu_spank.so"),
                                  str(base / live)) == rerun

    # a compiler that fails (cffi's build honours CC): the build fails after the new tree is made
    failed = setup(base, wheels, CC="/bin/false", SLURM_GPU_RETRY="dpkg --configure -a")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert os.readlink(base / "venv") == live                       # the live tree stays
    assert plugin.is_file() and (plugin.parent / "slurm_gpu_spank_py.so").is_file()
    assert sorted(p.name for p in base.glob("venv-*")) == [live]     # the new tree is gone
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm-gpu: SPANK plugin not built (plugin build failed: "), lines
    assert f"): the new venv was NOT put live, {base}/venv ({live}) and its plugin stay; needs gcc" in lines[0]
    assert lines[0].endswith("then run: dpkg --configure -a")
    assert (base / "setup-failed").read_text().strip() == lines[0]
    assert doctor.setup_failed(str(base / live)) == lines[0]

    again = setup(base, wheels)
    assert again.returncode == 0, again.stderr
    assert os.readlink(base / "venv") != live
    assert not (base / "setup-failed").exists()
    assert doctor.setup_failed(str(base / os.readlink(base / "venv"))) is None


def test_first_install_without_tools_goes_live_without_a_plugin(wheels, tmp_path):
    base = tmp_path / "opt-slurm-gpu"
    empty = tmp_path / "no-slurm-headers"
    empty.mkdir()
    res = setup(base, wheels, SLURM_GPU_SLURM_INCLUDE=str(empty))
    assert res.returncode == 0, res.stderr
    assert (base / "venv" / "bin" / "slurm-gpu").exists()
    assert not (base / "venv" / "lib" / "slurm-gpu" / "slurm_gpu_spank.so").exists()
    said = [l for l in res.stdout.splitlines() if "SPANK plugin not built" in l]
    assert len(said) == 1 and said[0].endswith(
        f"then run: {base}/venv/bin/slurm-gpu spank build --include-dir {empty}"), res.stdout
    assert not (base / "setup-failed").exists()
