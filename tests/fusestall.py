"""A FUSE filesystem that takes every request and never answers it: what a job's
user gets from ``fusermount3`` and a server of their own that stalls.

A process that touches anything below the mount waits in the kernel for the
answer.  Once the server has read the request (FR_SENT), that wait is
uninterruptible: SIGKILL stays pending (``fs/fuse/dev.c``,
``request_wait_answer``: "Either request is already in userspace, or it was
forced. Wait it out.").  Only an answer, or the connection's abort (the
server's ``/dev/fuse`` descriptor closed, or ``/sys/fs/fuse/connections/N/abort``)
ends it.

The protocol is the kernel's (``include/uapi/linux/fuse.h``): the INIT request
is answered (until then requests wait killably), nothing after it.  Mounted as
root the way fusermount3 mounts for a user (``fd=``, ``rootmode=``,
``user_id=``, ``group_id=``); with ``allow_other`` (the default) root's tests
reach it; without it, as fusermount3 mounts for a user where /etc/fuse.conf
lacks ``user_allow_other``, every other user, root included, gets EACCES
(fs/fuse/dir.c, fuse_allow_current_process).
"""
from __future__ import annotations

import os
import struct
import subprocess
import threading

FUSE_INIT = 26
IN_HEADER = struct.Struct("<IIQQIIIHH")        # len, opcode, unique, nodeid, uid, gid, pid, extlen, pad
OUT_HEADER = struct.Struct("<IiQ")              # len, error, unique
INIT_IN = struct.Struct("<IIII")                # major, minor, max_readahead, flags
# fuse_init_out: major, minor, max_readahead, flags, max_background, congestion_threshold,
# max_write, time_gran, max_pages, map_alignment, flags2, max_stack_depth, unused[6]
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")


def available() -> bool:
    """Whether this machine lets root mount a FUSE filesystem (/dev/fuse, the fuse type)."""
    try:
        with open("/proc/filesystems") as f:
            if not any(line.split()[-1:] == ["fuse"] for line in f):
                return False
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError:
        return False
    return os.geteuid() == 0


class StallingFuse:
    """Mount at *mountpoint* for *uid*; every request after INIT is read and never answered.

    ``requests`` counts what was taken.  :meth:`close` aborts the connection
    (whatever waits on it gets an error) and detaches the mount.
    """

    def __init__(self, mountpoint: str, uid: int = 0, gid: int = 0, allow_other: bool = True,
                 dev: str = "/dev/fuse") -> None:
        self.mountpoint = mountpoint
        self.requests = 0
        self.taken = threading.Event()
        self.fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
        subprocess.run(["mount", "-t", "fuse", "-o",
                        f"fd={self.fd},rootmode=40000,user_id={uid},group_id={gid}"
                        + (",allow_other" if allow_other else ""),
                        "sg-stall", mountpoint], check=True, pass_fds=(self.fd,))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import select
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            try:
                raw = os.read(self.fd, 1 << 20)
            except OSError:
                return                  # ENODEV: aborted or unmounted
            _len, opcode, unique, *_ = IN_HEADER.unpack_from(raw)
            if opcode == FUSE_INIT:
                major, minor, readahead, _flags = INIT_IN.unpack_from(raw, IN_HEADER.size)
                body = INIT_OUT.pack(7, min(minor, 31), readahead, 0, 0, 0, 4096, 1, 0, 0, 0, 0)
                os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size + len(body), 0, unique) + body)
                continue
            self.requests += 1
            self.taken.set()

    def close(self) -> None:
        # The server's read must end first: a read in progress holds the
        # descriptor's file, and only its release aborts the connection.
        self._stop.set()
        self._thread.join()
        os.close(self.fd)               # the last /dev/fuse descriptor: the connection aborts
        subprocess.run(["umount", "-l", self.mountpoint], capture_output=True)
