"""`make deb` builds a package that goes through an admin's lifecycle in fresh
Debian 12 and Debian 13 roots with docs/install.md's own lines
(``scripts/test-deb.sh``: a debootstrap minbase root per release, cached
under /var/cache/slurm-gpu/<suite>-pkgroot, a throw-away overlay per run;
install, configure, doctor, two upgrades, a failed plugin build, remove,
purge, and the root's file list compared before the install and after the
purge).

The package is built as the guide says (``make deb``), with no development
venv: SLURM_GPU_VENV and VENV name a directory that does not exist.

Skipped, with the script's reason, when there is no debootstrap or no
Debian mirror (exit 77), unless SLURM_GPU_REQUIRE_INTEGRATION=1.
"""
from __future__ import annotations

import io
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from sandboxlib import CANNOT_RUN, REPO, make_package


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = make_package("deb", tmp_path_factory.mktemp("dist"), timeout=300)[-1]
    assert path.name.endswith("_all.deb")
    return path


def test_deb_contents(deb: Path) -> None:
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                             check=True).stdout
    paths = {line.split()[5] for line in listing.splitlines()}
    for want in ("./usr/lib/slurm-gpu/prolog.d/50-slurm-gpu-jobs", "./usr/lib/slurm-gpu/epilog.d/50-slurm-gpu-jobs",
                 "./usr/lib/slurm-gpu/healthcheck", "./usr/lib/systemd/system/slurm-gpu-xid-watch.service",
                 "./usr/lib/systemd/system/slurm-gpu-monitor.service",
                 "./usr/share/doc/slurm-gpu/copyright", "./usr/share/doc/slurm-gpu/install.md"):
        assert want in paths, want
    # slurm-gpu on PATH, through the venv link (it follows upgrades)
    assert "./usr/bin/slurm-gpu -> /opt/slurm-gpu/venv/bin/slurm-gpu" in listing
    wheels = sorted(p for p in paths if p.startswith("./usr/share/slurm-gpu/wheels/"))
    assert [Path(w).name.split("-")[0] for w in wheels if w.endswith(".whl")] == ["nvidia_ml_py", "slurm_gpu"]
    # Nothing but the package's own tree: no venv, no byte code, no build leftovers.
    assert not [p for p in paths if "__pycache__" in p or p.startswith("./opt/")]
    wheel = next(w for w in wheels if "slurm_gpu" in w)
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        member = tf.extractfile(wheel)
        assert member is not None
        inside = zipfile.ZipFile(io.BytesIO(member.read())).namelist()
    # The runtime only: no simulator, sandbox or recorded machine (the devkit's).
    assert "slurm_gpu/hw/backend.py" in inside and "slurm_gpu/data/xid_catalog.json" in inside
    assert not [n for n in inside if n.startswith(("slurm_gpu_devkit", "slurm_gpu/sim/", "slurm_gpu/sandbox/"))
                or "/machines/" in n or "build_machines" in n or "__pycache__" in n]


@pytest.mark.parametrize("suite", ["bookworm", "trixie"])
def test_install_run_purge_leaves_nothing(deb: Path, suite: str) -> None:
    res = subprocess.run(["bash", str(REPO / "scripts" / "test-deb.sh"), "--deb", str(deb), suite],
                         capture_output=True, text=True, timeout=1200)
    if res.returncode == CANNOT_RUN and os.environ.get("SLURM_GPU_REQUIRE_INTEGRATION") != "1":
        pytest.skip(res.stderr.strip().splitlines()[-1])
    assert res.returncode == 0, res.stderr[-4000:]
    last = res.stderr.strip().splitlines()[-1]
    assert f"test-deb: {suite}: ok" in last and "files as they were" in last, last
    assert "hooks the guide names exit 0" in last and "purged" in last, last
    if suite != "bookworm":
        assert "a failed plugin build kept the live plugin and doctor said so" in last, last
        assert "a plugin of another Slurm major was rebuilt by the dpkg trigger" in last, last


def test_deb_ships_the_config_file_as_a_conffile(deb: Path) -> None:
    # install.md's plugstack line names /etc/slurm-gpu/slurm-gpu.toml: the
    # package holds it, commented, and dpkg keeps an admin's edits on upgrade
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    assert "./etc/slurm-gpu/slurm-gpu.toml" in {line.split()[-1] for line in listing.splitlines()}
    conffiles = subprocess.run(["dpkg-deb", "-I", str(deb), "conffiles"], capture_output=True, text=True,
                               check=True).stdout
    assert conffiles.split() == ["/etc/slurm-gpu/slurm-gpu.toml"]
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        member = tf.extractfile("./etc/slurm-gpu/slurm-gpu.toml")
        assert member is not None
        assert member.read() == (REPO / "packaging" / "common" / "slurm-gpu.toml").read_bytes()
