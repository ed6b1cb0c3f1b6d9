"""System calls the plugin makes on the task's own process.

Kept apart from the planner (pure) and the dispatcher (routing) so each is
small; nothing here touches files.
"""
from __future__ import annotations

import ctypes
import os
import resource

from ..errors import SlurmGpuError

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND = 0, 1, 2
PR_SET_THP_DISABLE, PR_GET_THP_DISABLE = 41, 42

# set_mempolicy / get_mempolicy syscall numbers (not wrapped by glibc).
_SYSCALLS = {
    "x86_64": (238, 239),
    "aarch64": (237, 236),
    "ppc64le": (261, 260),
}

_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _nums() -> tuple[int, int]:
    try:
        return _SYSCALLS[os.uname().machine]
    except KeyError:
        raise SlurmGpuError(f"set_mempolicy: unsupported machine {os.uname().machine}") from None


def _mask(nodes: tuple[int, ...]) -> tuple[ctypes.Array[ctypes.c_ulong], int]:
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    words = max(nodes) // bits + 1
    arr = (ctypes.c_ulong * words)()
    for n in nodes:
        arr[n // bits] |= 1 << (n % bits)
    return arr, words * bits + 1


def set_mempolicy(mode: int, nodes: tuple[int, ...]) -> None:
    """set_mempolicy(2) for the calling thread (inherited by exec'd tasks)."""
    if mode == MPOL_PREFERRED:
        nodes = nodes[:1]      # MPOL_PREFERRED honours a single node
    mask, maxnode = _mask(nodes)
    rc = _c().syscall(_nums()[0], mode, mask, ctypes.c_ulong(maxnode))
    if rc != 0:
        err = ctypes.get_errno()
        raise SlurmGpuError(f"set_mempolicy to NUMA node(s) {','.join(map(str, nodes))} "
                            f"failed: {os.strerror(err)}")


def get_mempolicy() -> tuple[int, tuple[int, ...]]:
    """The calling thread's policy mode and node list (used by tests)."""
    mode = ctypes.c_int()
    mask, maxnode = _mask((1023,))
    rc = _c().syscall(_nums()[1], ctypes.byref(mode), mask, ctypes.c_ulong(maxnode),
                      ctypes.c_ulong(0), ctypes.c_ulong(0))
    if rc != 0:
        raise OSError(ctypes.get_errno(), "get_mempolicy")
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    nodes = tuple(i for i in range(len(mask) * bits) if mask[i // bits] >> (i % bits) & 1)
    return mode.value, nodes


def set_affinity(cpus: tuple[int, ...]) -> None:
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        raise SlurmGpuError(f"sched_setaffinity to CPUs {cpus} failed: {e.strerror}") from None


def allowed_cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def disable_thp() -> None:
    """prctl(PR_SET_THP_DISABLE): no transparent huge pages for this task."""
    if _c().prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise SlurmGpuError(f"prctl(PR_SET_THP_DISABLE) failed: {os.strerror(err)}")


def raise_memlock(limit: int, *, hard: bool) -> str | None:
    """Raise RLIMIT_MEMLOCK towards *limit*; never lowers it.

    With *hard* (root, task_init_privileged) the hard limit is raised too.
    Where the kernel refuses (no CAP_SYS_RESOURCE, e.g. in a container) the
    soft limit still goes as high as the hard limit allows and the return
    value says why the admin's maximum was not reached; a node setting must
    not fail the user's task.
    """
    inf = resource.RLIM_INFINITY

    def bigger(a: int, b: int) -> int:
        return inf if inf in (a, b) else max(a, b)

    def smaller(a: int, b: int) -> int:
        if a == inf:
            return b
        return a if b == inf else min(a, b)

    soft, cur_hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    warning = None
    if hard and bigger(cur_hard, limit) != cur_hard:
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, bigger(cur_hard, limit)))
            cur_hard = bigger(cur_hard, limit)
        except (OSError, ValueError) as e:
            warning = f"cannot raise the hard RLIMIT_MEMLOCK above {cur_hard}: {e}"
    new_soft = smaller(bigger(soft, limit), cur_hard)
    if new_soft != soft:
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (new_soft, cur_hard))
        except (OSError, ValueError) as e:
            warning = f"cannot raise RLIMIT_MEMLOCK to {new_soft}: {e}"
    return warning
