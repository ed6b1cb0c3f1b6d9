"""A small Python face on the SPANK handle (cffi ``lib`` + ``spank_t``).

The context modules talk to this class only, so unit tests hand them a fake
with the same methods instead of a running Slurm.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..joboptions import PluginArgs

CONTEXTS = ("error", "local", "remote", "allocator", "slurmd", "job_script")


class Spank:
    """One callback's SPANK handle."""

    def __init__(self, ffi: Any, lib: Any, sp: Any = None) -> None:
        self._ffi, self._lib, self._sp = ffi, lib, sp

    def _c(self, s: str) -> Any:
        return self._ffi.new("char[]", s.encode())

    @property
    def context(self) -> str:
        ctx = int(self._lib.spank_context())
        return CONTEXTS[ctx] if 0 <= ctx < len(CONTEXTS) else "error"

    def option_value(self, which: int) -> str | None:
        """The value the C option callback stored (None: option not given).

        Bytes that are not UTF-8 become U+FFFD, which no option accepts: the
        user gets the option's own "bad value" line, not a traceback.
        """
        p = self._lib.sg_option_value(which)
        return None if p == self._ffi.NULL else self._ffi.string(p).decode(errors="replace")

    def plugstack_args(self) -> PluginArgs:
        """The plugstack.conf arguments, as the C half parsed them once at init.

        spank/sg_args.c is the only parser in the plugin (issue 25 §5): it
        refused a bad line before any hook could reach Python, and hands
        over its struct (spank/sg_api.h), not the argv.
        """
        from ..joboptions import NumaBind, PluginArgs
        a = self._lib.sg_plugstack_args()
        # a path: keep any byte as the OS would
        config = (None if a.config == self._ffi.NULL
                  else self._ffi.string(a.config).decode(errors="surrogateescape"))
        return PluginArgs(config, NumaBind(self._ffi.string(a.numa_mode).decode(),
                                           bool(a.numa_verbose)))

    def getenv(self, name: str) -> str | None:
        """A variable of the job's environment (None when unset)."""
        size = 4096
        while True:
            buf = self._ffi.new("char[]", size)
            rc = self._lib.spank_getenv(self._sp, name.encode(), buf, size)
            if rc == self._lib.ESPANK_SUCCESS:
                return self._ffi.string(buf).decode(errors="replace")
            if rc == self._lib.ESPANK_NOSPACE and size < 1 << 20:
                size *= 4
                continue
            return None

    def setenv(self, name: str, value: str) -> None:
        """Set a variable in the job's (task's) environment."""
        rc = self._lib.spank_setenv(self._sp, name.encode(), value.encode(), 1)
        self._check(rc, f"spank_setenv {name}")

    def unsetenv(self, name: str) -> None:
        self._lib.spank_unsetenv(self._sp, name.encode())

    def job_control_setenv(self, name: str, value: str) -> None:
        """Pass NAME=value to prolog/epilog (they see SPANK_NAME)."""
        rc = self._lib.spank_job_control_setenv(self._sp, name.encode(), value.encode(), 1)
        self._check(rc, f"spank_job_control_setenv {name}")

    def item_u32(self, item: str) -> int:
        p = self._ffi.new("uint32_t *")
        rc = self._lib.spank_get_item(self._sp, getattr(self._lib, item), p)
        self._check(rc, f"spank_get_item {item}")
        return int(p[0])

    def item_int(self, item: str) -> int:
        p = self._ffi.new("int *")
        rc = self._lib.spank_get_item(self._sp, getattr(self._lib, item), p)
        self._check(rc, f"spank_get_item {item}")
        return int(p[0])

    def error(self, line: str) -> None:
        # always through "%s": a user-controlled value is never a format string
        self._lib.slurm_error(b"%s", self._c(line))

    def info(self, line: str) -> None:
        self._lib.slurm_info(b"%s", self._c(line))

    def verbose(self, line: str) -> None:
        """A line shown only at verbose level (``srun -v``, SlurmdDebug=verbose)."""
        self._lib.slurm_verbose(b"%s", self._c(line))

    def _check(self, rc: int, what: str) -> None:
        if rc != self._lib.ESPANK_SUCCESS:
            from ..errors import SlurmGpuError
            raise SlurmGpuError(f"{what} failed: "
                                f"{self._ffi.string(self._lib.spank_strerror(rc)).decode()}")
