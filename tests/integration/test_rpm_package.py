"""`make rpm` builds packaging/rpm/slurm-gpu.spec here with rpmbuild.

Only the build and the package's contents are checked: nothing of it runs on
EL in this project (docs/install.md, "What was not tested on EL").  Skipped
with the script's reason when rpmbuild is missing or the EL wheels cannot be
fetched (exit 77), unless SLURM_GPU_REQUIRE_INTEGRATION=1.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sandboxlib import CANNOT_RUN, REPO, make_package


@pytest.fixture(scope="module")
def rpm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    paths = make_package("rpm", tmp_path_factory.mktemp("dist"), timeout=600)
    return next(p for p in paths if p.name.endswith(".x86_64.rpm"))


def _q(rpm: Path, *args: str) -> str:
    return subprocess.run(["rpm", "-qp", *args, str(rpm)], capture_output=True, text=True,
                          check=True).stdout


def test_rpm_holds_every_wheel_for_python311_and_the_node_files(rpm: Path) -> None:
    files = set(_q(rpm, "-l").split())
    for want in ("/usr/lib/slurm-gpu/prolog.d/50-slurm-gpu-jobs", "/usr/lib/slurm-gpu/epilog.d/50-slurm-gpu-jobs",
                 "/usr/lib/slurm-gpu/healthcheck", "/usr/lib/slurm-gpu/venv-setup.sh", "/usr/bin/slurm-gpu",
                 "/usr/lib/slurm-gpu/setup-defaults",
                 "/usr/lib/systemd/system/slurm-gpu-xid-watch.service",
                 "/usr/lib/systemd/system/slurm-gpu-monitor.service"):
        assert want in files, want
    wheels = sorted(Path(f).name.split("-")[0].lower() for f in files if f.endswith(".whl"))
    assert wheels == ["cffi", "click", "clustershell", "jinja2", "markupsafe", "nvidia_ml_py",
                      "pycparser", "pyyaml", "slurm_gpu"]
    # The compiled ones are for CPython 3.11 on x86_64 with an EL8-compatible glibc.
    for f in files:
        if f.endswith(".whl") and "-cp" in f:
            assert "-cp311-" in f and "manylinux2014_x86_64" in f, f
    assert not [f for f in files if f.startswith("/opt/") or "__pycache__" in f]


def test_aarch64_rpm_holds_aarch64_wheels(rpm: Path) -> None:
    """GH200 and GB200 nodes are aarch64: the same package, with the wheels for that arch."""
    arm = rpm.with_name(rpm.name.replace(".x86_64.rpm", ".aarch64.rpm"))
    if not arm.exists():
        pytest.skip("no aarch64 RPM: build-rpm.sh said which wheels PyPI lacks")
    assert _q(arm, "--queryformat", "%{NAME} %{ARCH}") == "slurm-gpu aarch64"
    files = set(_q(arm, "-l").split())
    compiled = sorted(Path(f).name for f in files if f.endswith(".whl") and "-cp" in f)
    assert compiled and all("-cp311-" in f and "aarch64" in f and "x86_64" not in f for f in compiled), compiled
    noarch = {Path(f).name.split("-")[0].lower() for f in files if f.endswith(".whl")}
    assert noarch == {Path(f).name.split("-")[0].lower() for f in _q(rpm, "-l").split() if f.endswith(".whl")}


def test_rpm_metadata_and_scriptlets(rpm: Path) -> None:
    assert _q(rpm, "--queryformat", "%{NAME} %{ARCH}") == "slurm-gpu x86_64"
    requires = set(_q(rpm, "--requires").split("\n"))
    assert {"python3.11", "hwloc-libs"} <= requires
    assert {"gcc", "python3.11-devel", "slurm-devel"} <= set(_q(rpm, "--recommends").split("\n"))
    scripts = _q(rpm, "--scripts")
    assert "SLURM_GPU_PYTHON=/usr/bin/python3.11 SLURM_GPU_SYSTEM_SITE=0" in scripts
    assert "rm -rf /opt/slurm-gpu/venv" in scripts          # erase removes what %post made
    assert "slurm-gpu: package removed" in scripts          # ... and leaves harmless hooks


def test_rpm_post_and_erase_in_a_debian12_root(rpm: Path) -> None:
    """The closest to EL here: %post makes the venv from python3.11 (which Debian 12
    has too) with only the shipped wheels, and erasing leaves the root as it was."""
    res = subprocess.run(["bash", str(REPO / "scripts" / "test-deb.sh"), "--rpm", str(rpm)],
                         capture_output=True, text=True, timeout=1200)
    if res.returncode == CANNOT_RUN and os.environ.get("SLURM_GPU_REQUIRE_INTEGRATION") != "1":
        pytest.skip(res.stderr.strip().splitlines()[-1])
    assert res.returncode == 0, res.stderr[-4000:]
    last = res.stderr.strip().splitlines()[-1]
    assert "test-deb: bookworm (rpm): ok" in last and "on Python 3.11" in last, last
    assert "files as they were" in last, last


def test_rpm_ships_the_config_file_as_noreplace_config(rpm: Path) -> None:
    # %config(noreplace): an upgrade keeps the admin's edits (the new one lands as .rpmnew)
    assert _q(rpm, "--configfiles").split() == ["/etc/slurm-gpu/slurm-gpu.toml"]
    flags = _q(rpm, "--queryformat", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]")
    assert "/etc/slurm-gpu/slurm-gpu.toml cn" in flags.splitlines()
