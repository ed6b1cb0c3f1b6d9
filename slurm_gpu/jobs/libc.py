"""Two system calls Python's ``os`` lacks: ``prctl(PR_SET_CHILD_SUBREAPER)`` and ``umount2``,
called through the standard library's ``ctypes``."""
from __future__ import annotations

import ctypes
import os

PR_SET_CHILD_SUBREAPER = 36          # <linux/prctl.h>
MNT_DETACH = 2                       # <sys/mount.h>

# dlopen(NULL): the process itself, with the libc it is linked against.
_LIBC = ctypes.CDLL(None, use_errno=True)


def _call(name: str, *args: int | bytes) -> None:
    """Call libc's *name*; raise OSError with its errno when it returns -1."""
    fn = getattr(_LIBC, name)
    ctypes.set_errno(0)
    if fn(*args) == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def set_child_subreaper(on: bool) -> bool:
    """Orphaned descendants become this process's children (Linux >= 3.4); False when refused."""
    try:
        _call("prctl", PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0)
    except (OSError, AttributeError):
        return False
    return True


def detach_mount(path: str) -> None:
    """``umount2(path, MNT_DETACH)``: the mount leaves the tree now, even while busy."""
    _call("umount2", os.fsencode(path), MNT_DETACH)
