"""System calls the plugin makes on the task's own process.

Kept apart from the planner (pure) and the dispatcher (routing) so each is
small; nothing here touches files.  Inside the plugin, set_mempolicy,
get_mempolicy and prctl go through small C functions of the plugin itself
(:func:`use_plugin`), which spares every bound task the import of ctypes;
anywhere else (tests, tools) a ctypes fallback makes the same calls.
"""
from __future__ import annotations

# posix, not os: os (with its environ mapping) costs ~1 ms of every bound
# step, and these calls are all this module needs of it.
import posix

from ..errors import SlurmGpuError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND = 0, 1, 2
PR_SET_THP_DISABLE, PR_GET_THP_DISABLE = 41, 42
_MASK_BITS = 1024                      # nodes get_mempolicy can report

# set_mempolicy / get_mempolicy numbers for the ctypes fallback (glibc has no
# wrappers); the plugin's C side takes them from <sys/syscall.h>.
_SYSCALLS = {
    "x86_64": (238, 239),
    "aarch64": (237, 236),
    "ppc64le": (261, 260),
}


class _PluginCalls:
    """The plugin's own C functions (sg_set_mempolicy...), through cffi."""

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi, self.lib = ffi, lib

        self.bits = ffi.sizeof("unsigned long") * 8

    def set_mempolicy(self, mode: int, nodes: tuple[int, ...]) -> int:
        words, maxnode = nodemask(nodes, self.bits)
        return int(self.lib.sg_set_mempolicy(mode, self.ffi.new("unsigned long[]", words),
                                             maxnode))

    def get_mempolicy(self) -> tuple[int, int, tuple[int, ...]]:
        mode = self.ffi.new("int *")
        mask = self.ffi.new("unsigned long[]", _MASK_BITS // self.bits)
        err = int(self.lib.sg_get_mempolicy(mode, mask, _MASK_BITS + 1))
        return err, int(mode[0]), _nodes(list(mask), self.bits)

    def thp_disable(self) -> int:
        return int(self.lib.sg_thp_disable())


class _CtypesCalls:
    """The same calls through ctypes, outside the plugin."""

    def __init__(self) -> None:
        import ctypes
        self.ct = ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.bits = ctypes.sizeof(ctypes.c_ulong) * 8
        try:
            self.nums = _SYSCALLS[posix.uname().machine]
        except KeyError:
            raise SlurmGpuError(f"set_mempolicy: unsupported machine {posix.uname().machine}") \
                from None

    def _errno(self, rc: int) -> int:
        return self.ct.get_errno() if rc != 0 else 0

    def set_mempolicy(self, mode: int, nodes: tuple[int, ...]) -> int:
        words, maxnode = nodemask(nodes, self.bits)
        arr = (self.ct.c_ulong * len(words))(*words)
        return self._errno(self.libc.syscall(self.nums[0], mode, arr, self.ct.c_ulong(maxnode)))

    def get_mempolicy(self) -> tuple[int, int, tuple[int, ...]]:
        ct = self.ct
        mode = ct.c_int()
        arr = (ct.c_ulong * (_MASK_BITS // self.bits))()
        rc = self.libc.syscall(self.nums[1], ct.byref(mode), arr, ct.c_ulong(_MASK_BITS + 1),
                               ct.c_ulong(0), ct.c_ulong(0))
        return self._errno(rc), mode.value, _nodes(list(arr), self.bits)

    def thp_disable(self) -> int:
        return self._errno(self.libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0))


_calls: Any = None


def use_plugin(ffi: Any, lib: Any) -> None:
    """Make the calls through the plugin's C side (called by the dispatcher)."""
    global _calls
    _calls = _PluginCalls(ffi, lib)


def _c() -> Any:
    global _calls
    if _calls is None:
        _calls = _CtypesCalls()
    return _calls


def nodemask(nodes: tuple[int, ...], bits: int) -> tuple[list[int], int]:
    """Node ids -> (the *bits*-bit words of set_mempolicy(2)'s nodemask, its maxnode).

    What either backend passes to the kernel; the C half's plain prefer
    binding builds the same (spank/sg_bind.c), and tests hold the two to
    each other.
    """
    words = [0] * (max(nodes) // bits + 1)
    for n in nodes:
        words[n // bits] |= 1 << (n % bits)
    return words, len(words) * bits + 1


def _nodes(words: list[int], bits: int) -> tuple[int, ...]:
    return tuple(i for i in range(len(words) * bits) if words[i // bits] >> (i % bits) & 1)


def set_mempolicy(mode: int, nodes: tuple[int, ...]) -> None:
    """set_mempolicy(2) for the calling thread (inherited by exec'd tasks)."""
    if mode == MPOL_PREFERRED:
        nodes = nodes[:1]      # MPOL_PREFERRED honours a single node
    err = _c().set_mempolicy(mode, nodes)
    if err:
        raise SlurmGpuError(f"set_mempolicy to NUMA node(s) {','.join(map(str, nodes))} "
                            f"failed: {posix.strerror(err)}")


def get_mempolicy() -> tuple[int, tuple[int, ...]]:
    """The calling thread's policy mode and node list (used by tests)."""
    err, mode, nodes = _c().get_mempolicy()
    if err:
        raise OSError(err, "get_mempolicy")
    return mode, nodes


def set_affinity(cpus: tuple[int, ...]) -> None:
    try:
        posix.sched_setaffinity(0, cpus)
    except OSError as e:
        from ..binding import cpulist
        raise SlurmGpuError(f"sched_setaffinity to CPUs {cpulist(cpus)} failed: "
                            f"{e.strerror}") from None


def allowed_cpus() -> tuple[int, ...]:
    return tuple(sorted(posix.sched_getaffinity(0)))


def disable_thp() -> None:
    """prctl(PR_SET_THP_DISABLE): no transparent huge pages for this task."""
    err = _c().thp_disable()
    if err:
        raise SlurmGpuError(f"prctl(PR_SET_THP_DISABLE) failed: {posix.strerror(err)}")


def raise_memlock(limit: int, *, hard: bool) -> str | None:
    """Raise RLIMIT_MEMLOCK towards *limit*; never lowers it.

    With *hard* (root, task_init_privileged) the hard limit is raised too.
    Where the kernel refuses (no CAP_SYS_RESOURCE, e.g. in a container) the
    soft limit still goes as high as the hard limit allows and the return
    value says why the admin's maximum was not reached; a node setting must
    not fail the user's task.
    """
    import resource                    # --gpu-profile only: not every bound step
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
