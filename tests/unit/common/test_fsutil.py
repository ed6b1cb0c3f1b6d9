from __future__ import annotations

import os
import stat

import pytest

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.fsutil import atomic_write


def test_writes_content_and_mode(tmp_path) -> None:
    p = tmp_path / "gres.conf"
    atomic_write(p, "NodeName=a\n", mode=0o600)
    assert p.read_text() == "NodeName=a\n"
    assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_replaces_atomically_and_leaves_no_temp(tmp_path) -> None:
    p = tmp_path / "f"
    p.write_text("old")
    atomic_write(p, b"new")
    assert p.read_text() == "new"
    assert os.listdir(tmp_path) == ["f"]


def test_failure_keeps_old_file_and_no_temp(tmp_path, monkeypatch) -> None:
    p = tmp_path / "f"
    p.write_text("old")

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(SlurmGpuError, match="cannot write f: No space left on device"):
        atomic_write(p, "new")
    assert p.read_text() == "old"
    assert os.listdir(tmp_path) == ["f"]


def test_missing_directory_is_one_line(tmp_path) -> None:
    with pytest.raises(SlurmGpuError) as ei:
        atomic_write(tmp_path / "nope" / "f", "x")
    assert ei.value.line().startswith("slurm-gpu: cannot write f")
    assert str(tmp_path / "nope" / "f") in ei.value.line()


def _count_fsyncs(monkeypatch) -> list[str]:
    import stat as _stat
    calls: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append("dir" if _stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_durable_write_fsyncs_the_file_then_its_directory(tmp_path, monkeypatch) -> None:
    calls = _count_fsyncs(monkeypatch)
    atomic_write(tmp_path / "f", "x")
    assert calls == ["file", "dir"]          # the rename itself survives a crash


def test_non_durable_write_never_fsyncs(tmp_path, monkeypatch) -> None:
    """durable=False (the sampler's files, rewritten every few seconds) costs no disk flush."""
    calls = _count_fsyncs(monkeypatch)
    atomic_write(tmp_path / "f", "x", durable=False)
    assert (tmp_path / "f").read_text() == "x"
    assert calls == []
