"""The system calls Python's ``os`` lacks: ``prctl(PR_SET_CHILD_SUBREAPER)``, ``umount2``
and ``bpf``, called through the standard library's ``ctypes``."""
from __future__ import annotations

import ctypes
import os

PR_SET_CHILD_SUBREAPER = 36          # <linux/prctl.h>
MNT_DETACH = 2                       # <sys/mount.h>

# dlopen(NULL): the process itself, with the libc it is linked against.
_LIBC = ctypes.CDLL(None, use_errno=True)


# bpf(2)'s system call number (asm/unistd.h of each architecture): glibc has no wrapper.
_SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "ppc64": 361, "s390x": 351,
            "riscv64": 280}


def _call(name: str, *args: object) -> int:
    """Call libc's *name*; its result, or OSError with its errno when it returns -1."""
    fn = getattr(_LIBC, name)
    ctypes.set_errno(0)
    r = fn(*args)
    if r == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(r)


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


def bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    """``bpf(cmd, attr, sizeof attr)``: its result (a new descriptor for a load)."""
    nr = _SYS_BPF.get(os.uname().machine)
    if nr is None:
        raise OSError(38, f"bpf(2) is not known on {os.uname().machine}")   # ENOSYS
    _LIBC.syscall.restype = ctypes.c_long
    return _call("syscall", ctypes.c_long(nr), ctypes.c_long(cmd), attr, ctypes.c_ulong(len(attr)))
