"""jobs/mpsdir.py, each behaviour asserted whole: the mutants mutmut made of it
survived test_jobs_mpsdir.py (docs/development.md, mutation testing).

A fixture ``/proc`` and mountinfo; the one real mount (tmpfs) needs root.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from slurm_gpu.jobs import mpsdir


def test_socket_inodes_reads_only_well_formed_socket_links(tmp_path: Path) -> None:
    fd = tmp_path / "7" / "fd"
    fd.mkdir(parents=True)
    for n, target in (("3", "socket:[555]"), ("4", "pipe:[556]"), ("5", "socket:[x1]"),
                      ("6", "socket:[557"), ("7", "/dev/null"), ("8", "anon_socket:[9]")):
        (fd / n).symlink_to(target)
    (fd / "9").write_text("")                       # not a link: readlink fails, skipped
    (tmp_path / "8" / "fd").mkdir(parents=True)
    (tmp_path / "8" / "fd" / "0").symlink_to("socket:[600]")
    assert mpsdir._socket_inodes([7, 8, 9], str(tmp_path)) == {555, 600}   # 9: no such process


def test_planted_names_at_most_three_and_then_dots(tmp_path: Path) -> None:
    for n in ("a", "b", "c"):
        (tmp_path / n).write_text("")
    assert mpsdir.planted(str(tmp_path)) == "found 'a', 'b', 'c'"
    (tmp_path / "d").write_text("")
    assert mpsdir.planted(str(tmp_path)) == "found 'a', 'b', 'c' ..."
    assert mpsdir.planted(str(tmp_path / "gone")) is None


def test_read_own_file_reads_at_most_its_limit(tmp_path: Path) -> None:
    f = tmp_path / "control.log"
    f.write_bytes(b"x" * 70000)
    assert mpsdir.read_own_file(str(f), os.getuid()) == b"x" * 65536
    assert mpsdir.read_own_file(str(f), os.getuid(), limit=3) == b"xxx"
    assert mpsdir.read_own_file(str(tmp_path / "missing"), os.getuid()) is None


@pytest.mark.parametrize("field,want", [
    ("/run/plain", "/run/plain"),
    (r"/run/a\040b\011c\012d\134e", "/run/a b\tc\nd\\e"),
    ("/run/end\\", "/run/end\\"),                   # a backslash without three digits stays
    (r"/run/x\04", r"/run/x\04"),
    (r"/run/x\04y", r"/run/x\04y"),
])
def test_unescape_mountinfo_paths(field: str, want: str) -> None:
    assert mpsdir._unescape(field) == want


def test_mounts_below_whole_lines_only_and_the_directory_itself_excluded(tmp_path: Path) -> None:
    mi = tmp_path / "mountinfo"
    mi.write_text("40 22 0:40 / /run/mps/7 rw - tmpfs t rw\n"        # the directory itself
                  "41 22 0:41 /\n"                                    # too few fields
                  "42 22 0:42 / /run/mps/7/a rw - tmpfs t rw\n"
                  "43 22 0:43 / /run/mps/7/ab rw - tmpfs t rw\n"      # a sibling, not inside /a
                  "44 22 0:44 / /run/mps/7/a rw - tmpfs t rw\n")      # stacked on /a
    assert mpsdir.mounts_below("/run/mps/7/", str(mi)) == ["/run/mps/7/a", "/run/mps/7/ab"]
    assert mpsdir.mounts_below("/run/mps/7", str(tmp_path / "none")) == []
    # an escaped path is found even though its text differs from the prefix
    mi.write_text("45 22 0:45 / /run/mps/7\\040x/a rw - tmpfs t rw\n")
    assert mpsdir.mounts_below("/run/mps/7 x", str(mi)) == ["/run/mps/7 x/a"]


def test_open_below_refuses_what_is_not_below(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    for bad in (str(tmp_path / "job"), str(tmp_path / "job") + "/", str(tmp_path / "job") + "//a",
                str(tmp_path / "job") + "/./a"):
        with pytest.raises(OSError) as e:
            mpsdir._open_below(str(tmp_path / "job"), bad)
        assert e.value.strerror == "not a path below the job directory"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_detach_mounts_detaches_and_names_what_it_cannot_reach(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "pipe" / "m").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "none", str(job / "pipe" / "m")], check=True)
    try:
        done, left = mpsdir.detach_mounts(str(job))
    finally:
        subprocess.run(["umount", "-l", str(job / "pipe" / "m")], capture_output=True)
    assert (done, left) == ([str(job / "pipe" / "m")], [])
    assert mpsdir.mounts_below(str(job)) == []
    assert mpsdir.detach_mounts(str(job)) == ([], [])
    # listed, but no longer there to open: named with the reason, three times over
    mi = tmp_path / "mountinfo"
    mi.write_text(f"40 22 0:40 / {job}/gone rw - tmpfs t rw\n")
    assert mpsdir.detach_mounts(str(job), str(mi)) == ([], [f"{job}/gone: No such file or directory"])
