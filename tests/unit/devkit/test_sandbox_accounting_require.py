"""`sandbox up --accounting` on a Debian root's Slurm needs that root's slurmdbd
and clients (slurmdbd must be at least slurmctld's release and serves
clients only a few releases back), and only the host's MariaDB."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu_devkit.sandbox import accounting
from slurm_gpu_devkit.sandbox.chroot import CLIENTS


def _root(tmp_path: Path, binaries: tuple[str, ...]) -> Path:
    root = tmp_path / "trixie-root"
    for b in binaries:
        p = root / b.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
    return root


@pytest.mark.skipif(any(not os.access(b, os.X_OK) for b in accounting.DB_BINARIES),
                    reason="mariadb-server not installed")
def test_a_root_without_slurmdbd_names_it_and_the_script(tmp_path: Path) -> None:
    root = _root(tmp_path, ("/usr/bin/sacctmgr", "/usr/bin/sacct"))
    with pytest.raises(SlurmGpuError) as e:
        accounting.require(root, "trixie")
    assert e.value.what == ("the trixie root has no slurmdbd: complete it with "
                            "scripts/debian-root.sh trixie")


@pytest.mark.skipif(any(not os.access(b, os.X_OK) for b in accounting.DB_BINARIES),
                    reason="mariadb-server not installed")
def test_a_complete_root_is_enough_whatever_the_host_has(tmp_path: Path) -> None:
    accounting.require(_root(tmp_path, accounting.SLURM_BINARIES), "trixie")


def test_the_roots_sacctmgr_has_a_wrapper() -> None:
    """The cluster is registered with the root's sacctmgr, through DIR/bin."""
    assert "sacctmgr" in CLIENTS and "sacct" in CLIENTS
