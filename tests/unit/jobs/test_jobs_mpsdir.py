"""jobs/mpsdir.py: what a job user can do to their MPS directories, told apart from a node fault."""
from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

from slurm_gpu.jobs import mpsdir


def _listen(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(str(path))
    s.listen(1)
    return s


def test_sockets_moved_or_replaced_are_named(tmp_path: Path) -> None:
    """The kernel's record of the daemon's listening sockets (here: this process's)
    against the files at their paths."""
    socks = [_listen(tmp_path / n) for n in mpsdir.SOCKETS]
    try:
        me = [os.getpid()]
        assert mpsdir.sockets_tampered(str(tmp_path), me) is None          # its own, in place
        os.rename(tmp_path / "control", tmp_path / "elsewhere")
        assert mpsdir.sockets_tampered(str(tmp_path), me) == "control moved away"
        os.rename(tmp_path / "elsewhere", tmp_path / "control")
        os.rename(tmp_path / "control_privileged", tmp_path / "old")
        (tmp_path / "control_privileged").write_text("")                  # a file in its place
        assert mpsdir.sockets_tampered(str(tmp_path), me) == "control_privileged replaced"
        os.unlink(tmp_path / "control_privileged")
        # a socket of another process's at the path: a socket, but not the daemon's
        other = subprocess.Popen(
            [sys.executable, "-I", "-c", "import socket, sys, time\n"
             "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
             "s.bind(sys.argv[1])\ns.listen(1)\nprint('ready', flush=True)\ntime.sleep(60)\n",
             str(tmp_path / "control_privileged")], stdout=subprocess.PIPE, text=True)
        try:
            assert other.stdout.readline().strip() == "ready"
            assert mpsdir.sockets_tampered(str(tmp_path), me) == "control_privileged replaced"
            assert mpsdir.sockets_tampered(str(tmp_path), [other.pid]) is None   # its own: in place
        finally:
            other.kill()
            other.wait()
        # a process that holds no socket proves nothing: a silent daemon stays the node's fault
        assert mpsdir.sockets_tampered(str(tmp_path), [1 << 22]) is None
    finally:
        for s in socks:
            s.close()


def test_planted_names_what_the_daemon_never_makes(tmp_path: Path) -> None:
    assert mpsdir.planted(str(tmp_path)) is None
    (tmp_path / "control_lock").write_text("")
    os.mkfifo(tmp_path / "log")
    s = _listen(tmp_path / "control")
    try:
        assert mpsdir.planted(str(tmp_path)) is None                     # what NVIDIA's 535 makes
        (tmp_path / "control_privileged").mkdir()
        (tmp_path / "x").symlink_to("/etc")
        assert mpsdir.planted(str(tmp_path)) == "found 'control_privileged', 'x'"
    finally:
        s.close()


def test_read_own_file_refuses_fifos_symlinks_and_other_owners(tmp_path: Path) -> None:
    uid = os.getuid()
    f = tmp_path / "control.log"
    f.write_bytes(b"Starting control daemon")
    assert mpsdir.read_own_file(str(f), uid) == b"Starting control daemon"
    assert mpsdir.read_own_file(str(f), uid + 1) is None                  # not the user's
    (tmp_path / "link").symlink_to(f)
    assert mpsdir.read_own_file(str(tmp_path / "link"), uid) is None      # never followed
    os.mkfifo(tmp_path / "fifo")
    assert mpsdir.read_own_file(str(tmp_path / "fifo"), uid) is None      # returns at once


def test_mounts_below_reads_escaped_paths_and_keeps_the_outermost(tmp_path: Path) -> None:
    mi = tmp_path / "mountinfo"
    mi.write_text(
        "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
        "40 22 0:40 / /run/mps/7/pipe/a\\040b rw - fuse.x x rw\n"
        "41 40 0:41 / /run/mps/7/pipe/a\\040b/inner rw - tmpfs t rw\n"
        "42 22 0:42 / /run/mps/7/log rw - tmpfs t rw\n"
        "43 22 0:43 / /run/mps/77/log rw - tmpfs t rw\n"
        "44 22 0:44 / /run/mps/7 rw - tmpfs t rw\n")
    assert mpsdir.mounts_below("/run/mps/7", str(mi)) == ["/run/mps/7/log", "/run/mps/7/pipe/a b"]
    assert mpsdir.mounts_below("/run/mps/8", str(mi)) == []


def test_a_symlinked_component_never_leads_the_detach_elsewhere(tmp_path: Path) -> None:
    """The user swaps a component of their mount's path for a symlink: the
    detach reaches nothing outside the job's directory (as root, a real mount
    there stays), and a mount really below it is detached."""
    job, pipe, elsewhere = tmp_path / "job", tmp_path / "job" / "pipe", tmp_path / "elsewhere"
    pipe.mkdir(parents=True)
    (elsewhere / "m").mkdir(parents=True)
    (pipe / "sub").symlink_to(elsewhere)
    root = os.geteuid() == 0
    mounted = []

    def detach(path: str, *, mount: str | None = None) -> tuple[list[str], list[str]]:
        if root and mount:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "sg-test", mount], check=True)
            mounted.append(mount)
        if root and mount == path:      # the kernel's own table: the detach must empty it
            return mpsdir.detach_mounts(str(job))
        mi = tmp_path / "mountinfo"
        mi.write_text(f"22 1 0:21 / / rw - ext4 /dev/sda1 rw\n40 22 0:40 / {path} rw - tmpfs t rw\n")
        return mpsdir.detach_mounts(str(job), str(mi))
    try:
        swapped = str(pipe / "sub" / "m")
        assert detach(swapped, mount=str(elsewhere / "m")) == ([], [f"{swapped}: {os.strerror(errno.ENOTDIR)}"])
        assert os.path.ismount(elsewhere / "m") == root
        up = str(pipe / ".." / "x")
        assert detach(up) == ([], [f"{up}: not a path below the job directory"])
        got = detach(str(pipe), mount=str(pipe))
        assert got == (([str(pipe)], []) if root else ([], [f"{pipe}: {os.strerror(errno.EPERM)}"]))
        assert not os.path.ismount(pipe)
    finally:
        for m in mounted:
            subprocess.run(["umount", "-l", m], capture_output=True)


def _fuse_line(i: int, uid: int) -> str:
    return (f"{100 + i} 25 0:{300 + i} / /u/m{i} rw,nosuid - fuse sg-stall "
            f"rw,user_id={uid},group_id={uid}\n")


def test_user_fuse_mounts_reads_each_namespace_once_and_past_the_cap_names_none(
        tmp_path, monkeypatch) -> None:
    """Processes (and threads) sharing a mount namespace have it read once (the second
    one's table, here another text, is never read); a table of the user's own
    namespace that runs past MOUNTINFO_CAP (a user can make hundreds of MiB of it) is
    not read on, and counts as holding something of theirs that no connection names
    (-1: noted, never aborted, never a drain) (review round 5, R6)."""
    from slurm_gpu.jobs import mpsdir
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text("")
    ns = tmp_path / "ns-mnt"
    ns.write_text("")
    pad = "".join(f"{i} 25 8:1 / /pad{'x' * 200}{i} rw - ext4 /dev/sda1 rw\n" for i in range(50))
    tables = {10: _fuse_line(1, 0) + pad + _fuse_line(2, 0), 11: _fuse_line(3, 0)}
    for pid, table in tables.items():
        for t in (f"{pid}", f"{pid}/task/{pid}"):
            (proc / t / "ns").mkdir(parents=True)
            os.link(ns, proc / t / "ns" / "mnt")       # one namespace: one inode
            (proc / t / "mountinfo").write_text(table)
    monkeypatch.setattr(mpsdir, "userns_owner", lambda view, proc: 1001)   # theirs
    monkeypatch.setattr(mpsdir, "MOUNTINFO_CAP", 4096)
    got = mpsdir.user_fuse_mounts(1001, [10, 11], str(proc))
    assert sorted(got) == [(f"{proc}/10/mountinfo (over 4096 bytes, not read whole)", -1),
                           ("/u/m1", 301)]
    assert mpsdir.abort_fuse([-1], fusectl=str(tmp_path)) == []
