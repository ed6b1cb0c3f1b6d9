"""jobs/mpsdir.py, each behaviour asserted whole: the mutants mutmut made of it
survived test_jobs_mpsdir.py (docs/development.md, mutation testing).

A fixture ``/proc`` and mountinfo; the one real mount (tmpfs) needs root.
"""
from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from slurm_gpu.jobs import mpsdir


from test_jobs_mpsdir import _listen  # noqa: E402 - one listening socket, as the daemon makes


def test_the_daemons_sockets_are_read_from_well_formed_fd_links_only(tmp_path: Path) -> None:
    """A fixture ``/proc`` whose process 7 holds this process's two listening sockets
    (by inode) among links that only look like sockets; process 8 holds nothing."""
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    socks = [_listen(pipe / n) for n in mpsdir.SOCKETS]
    try:
        proc = tmp_path / "proc"
        fd = proc / "7" / "fd"
        fd.mkdir(parents=True)
        links = [f"socket:[{os.fstat(s.fileno()).st_ino}]" for s in socks]
        links += ["pipe:[556]", "socket:[x1]", "socket:[55x]", "socket:[557", "/dev/null", "anon_socket:[9]"]
        for n, target in enumerate(links):
            (fd / str(n)).symlink_to(target)
        (fd / "99").write_text("")                  # not a link: readlink fails, skipped
        (proc / "8" / "fd").mkdir(parents=True)
        (proc / "8" / "fd" / "3").symlink_to(links[0][:-1] + "7")     # no closing bracket
        assert mpsdir.sockets_tampered(str(pipe), [7], str(proc)) is None
        os.rename(pipe / "control", tmp_path / "elsewhere")
        assert mpsdir.sockets_tampered(str(pipe), [8, 9, 7], str(proc)) == "control moved away"
        assert mpsdir.sockets_tampered(str(pipe), [8, 9], str(proc)) is None   # no socket: no proof
    finally:
        for s in socks:
            s.close()


def test_planted_names_at_most_three_and_then_dots(tmp_path: Path) -> None:
    for n in ("a", "b", "c"):
        (tmp_path / n).write_text("")
    assert mpsdir.planted(str(tmp_path)) == "found 'a', 'b', 'c'"
    (tmp_path / "d").write_text("")
    assert mpsdir.planted(str(tmp_path)) == "found 'a', 'b', 'c' ..."
    assert mpsdir.planted(str(tmp_path / "gone")) is None


def test_planted_goes_on_past_an_entry_removed_meanwhile(tmp_path: Path, monkeypatch) -> None:
    """An entry that vanishes between the listing and its lstat is skipped, not the rest."""
    (tmp_path / "x").write_text("")
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: ["0gone", *real(p)])
    assert mpsdir.planted(str(tmp_path)) == "found 'x'"


def test_read_own_file_reads_at_most_its_limit(tmp_path: Path) -> None:
    f = tmp_path / "control.log"
    f.write_bytes(b"x" * 70000)
    assert mpsdir.read_own_file(str(f), os.getuid()) == b"x" * 65536
    assert mpsdir.read_own_file(str(f), os.getuid(), limit=3) == b"xxx"
    assert mpsdir.read_own_file(str(tmp_path / "missing"), os.getuid()) is None


@pytest.mark.parametrize("field,want", [
    ("/run/plain", "/run/plain"),
    (r"/run/sp\040", "/run/sp "),
    (r"/run/a\040b\011c\012d\134e", "/run/a b\tc\nd\\e"),
    ("/run/end\\", "/run/end\\"),                 # a backslash without three digits stays
    (r"/run/x\04", r"/run/x\04"),
    (r"/run/x\04y", r"/run/x\04y"),
    (r"/run/b\x12", r"/run/b\x12"),
])
def test_mountinfo_paths_are_unescaped(tmp_path: Path, field: str, want: str) -> None:
    mi = tmp_path / "mountinfo"
    mi.write_text(f"40 22 0:40 / {field}/m rw - tmpfs t rw\n")
    assert mpsdir.mounts_below(want, str(mi)) == [f"{want}/m"]
    mi.write_text(f"40 22 0:40 / /run/j/{field.rsplit('/', 1)[1]} rw - tmpfs t rw\n")   # at the end
    assert mpsdir.mounts_below("/run/j", str(mi)) == [f"/run/j/{want.rsplit('/', 1)[1]}"]


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


def test_a_listed_mount_not_plainly_below_is_never_opened(tmp_path: Path) -> None:
    """The walk from the job directory takes no empty, ``.`` or ``..`` component."""
    job = tmp_path / "job"
    (job / "a").mkdir(parents=True)
    mi = tmp_path / "mountinfo"
    bad = [f"{job}//a", f"{job}/./a", f"{job}/../job/a"]
    mi.write_text("".join(f"{40 + k} 22 0:{40 + k} / {p} rw - tmpfs t rw\n" for k, p in enumerate(bad)))
    assert mpsdir.detach_mounts(str(job), str(mi)) == (
        [], [f"{p}: not a path below the job directory" for p in sorted(bad)])


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_detach_mounts_detaches_and_names_what_it_cannot_reach(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "pipe" / "m").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "none", str(job / "pipe" / "m")], check=True)
    try:
        assert mpsdir.mounts_below(str(job)) == [str(job / "pipe" / "m")]   # this process's mountinfo
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
    mi.write_text(f"40 22 0:40 / {job}/pipe rw - tmpfs t rw\n")          # there, but no mount
    assert mpsdir.detach_mounts(str(job), str(mi)) == ([], [f"{job}/pipe: Invalid argument"])
    (job / "pipe" / "link").symlink_to(job / "pipe" / "m")                # never followed
    mi.write_text(f"40 22 0:40 / {job}/pipe/link rw - tmpfs t rw\n")
    assert mpsdir.detach_mounts(str(job), str(mi)) == ([], [f"{job}/pipe/link: Not a directory"])


def test_mounts_below_takes_the_kernels_bytes_and_names_as_they_are(tmp_path: Path) -> None:
    """Only space, tab, newline and backslash are escaped in mountinfo: any other byte
    of a name the user chose (not UTF-8, a form feed, a trailing X or space) is there as it is."""
    mi = tmp_path / "mountinfo"
    mi.write_bytes(b"40 22 0:40 / /run/j/\xff rw - fuse f rw\n"
                   b"41 22 0:41 / /run/j/a\x0cb rw - fuse f rw\n"
                   b"42 22 0:42 / /run/j/cX rw - fuse f rw\n"
                   b"43 42 0:43 / /run/j/cX/in rw - fuse f rw\n"
                   b"44 22 0:44 / /run/j/d\\040 rw - fuse f rw\n"
                   b"45 44 0:45 / /run/j/d\\040/in rw - fuse f rw\n")
    assert mpsdir.mounts_below("/run/j", str(mi)) == ["/run/j/a\x0cb", "/run/j/cX", "/run/j/d ",
                                                      "/run/j/\udcff"]


def test_every_socket_taken_is_named_in_order(tmp_path: Path) -> None:
    """Each of the two sockets is looked at, whichever the daemon bound; an abstract
    socket it also listens on (no file: no VFS record) proves nothing either way."""
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    abstract.bind(f"\0sgt-mpsdir-{os.getpid()}")
    abstract.listen(1)
    me = [os.getpid()]
    try:
        priv = _listen(tmp_path / "control_privileged")           # "control" never bound
        try:
            assert mpsdir.sockets_tampered(str(tmp_path), me) is None
            os.rename(tmp_path / "control_privileged", tmp_path / "away")
            assert mpsdir.sockets_tampered(str(tmp_path), me) == "control_privileged moved away"
        finally:
            priv.close()
        d = tmp_path / "both"
        d.mkdir()
        socks = [_listen(d / n) for n in mpsdir.SOCKETS]
        try:
            os.rename(d / "control", d / "away")
            os.rename(d / "control_privileged", d / "old")
            (d / "control_privileged").write_text("")
            assert mpsdir.sockets_tampered(str(d), me) == "control moved away, control_privileged replaced"
        finally:
            for s in socks:
                s.close()
    finally:
        abstract.close()
