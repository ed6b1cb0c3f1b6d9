"""ownedfile.read_owned: the one reader of files others could have planted, and the
three policies over it (fsutil.read_trusted, jobs.mpsdir.read_own_file,
imex.teardown.read_record)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_gpu.fsutil import read_trusted
from slurm_gpu.imex.teardown import read_record
from slurm_gpu.jobs.mpsdir import read_own_file
from slurm_gpu.ownedfile import read_owned

ME = os.geteuid()


@pytest.fixture()
def planted(tmp_path: Path) -> dict[str, Path]:
    """A regular file of ours, a symlink to it, a FIFO and a missing name."""
    f = tmp_path / "daemon"
    f.write_bytes(b"12 34 -\n")
    os.chmod(f, 0o644)
    (tmp_path / "link").symlink_to(f)
    os.mkfifo(tmp_path / "fifo")
    return {"file": f, "link": tmp_path / "link", "fifo": tmp_path / "fifo", "missing": tmp_path / "nope"}


def test_only_a_regular_file_of_an_expected_owner_is_read(planted: dict[str, Path]) -> None:
    assert read_owned(planted["file"], 5, (ME,)) == b"12 34"
    with pytest.raises(OSError, match="is not our regular file"):
        read_owned(planted["file"], 5, (ME + 1,))
    with pytest.raises(OSError):
        read_owned(planted["link"], 5, (ME,))            # never followed
    with pytest.raises(OSError, match="is not our regular file"):
        read_owned(planted["fifo"], 5, (ME,))            # returns at once
    with pytest.raises(FileNotFoundError):
        read_owned(planted["missing"], 5, (ME,))
    os.chmod(planted["file"], 0o664)
    assert read_owned(planted["file"], 5, (ME,)) == b"12 34"
    with pytest.raises(OSError, match="is not our regular file"):
        read_owned(planted["file"], 5, (ME,), others_may_write=False)


def test_the_policies_over_it(planted: dict[str, Path]) -> None:
    # the accounting store and the IMEX prolog's model: anything else is "none"
    assert read_trusted(planted["file"], 64) == b"12 34 -\n"
    for name in ("link", "fifo", "missing"):
        assert read_trusted(planted[name], 64) is None and read_own_file(str(planted[name]), ME) is None
    # the job user's MPS log: only the user's
    assert read_own_file(str(planted["file"]), ME) == b"12 34 -\n"
    assert read_own_file(str(planted["file"]), ME + 1) is None
    # the IMEX record: none when missing; anything else there is an error
    d = planted["file"].parent
    assert read_record(str(d)) == (12, 34, None)
    planted["file"].unlink()
    assert read_record(str(d)) is None
    os.mkfifo(planted["file"])
    with pytest.raises(OSError, match="is not our regular file"):
        read_record(str(d))
