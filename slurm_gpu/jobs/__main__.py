"""``python -m slurm_gpu.jobs prolog|epilog``: what prolog.d/epilog.d run (they call :func:`main` with ``-c``).

Exit status is the contract with slurmd: non-zero drains the node (and
requeues the job, for the prolog), so it is returned only for node faults
under ``[jobs] on_internal_error = "drain"``.  Nothing here may raise.
"""
from __future__ import annotations

import os
import sys

from .. import hookentry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable


def _watchdog(seconds: float, what: str, rc: int, mark: Callable[[str], None]) -> None:
    """End this process after *seconds*, even while it is stuck inside NVML.

    Slurm waits for a prolog/epilog forever unless the admin set
    PrologEpilogTimeout, and an NVML call on a sick GPU (or a simulator lock
    someone holds) has no timeout of its own.  Ending half-way is safe: the
    state file records every step and the epilog cleans up after a killed
    prolog.  *mark* records the error for the job's tasks first when the
    exit status will not drain the node (``on_internal_error = "pass"``).
    """
    # _thread, not threading (functools, collections, ~1.5 ms of every run):
    # one sleeping thread, which never holds the process back from exiting.
    import _thread
    import time

    def fire() -> None:
        line = (f"slurm-gpu: {what} still running after {seconds:g} s, stopped by its "
                "watchdog ([jobs] timeout)")
        os.write(2, (line + "\n").encode())
        if rc == 0:
            try:
                mark(line)
            except Exception:  # noqa: BLE001 - exit regardless
                pass
        os._exit(rc)

    def wait_then_fire() -> None:
        started.release()
        time.sleep(seconds)
        fire()

    # Wait for the thread to run: one still waiting for a CPU when a step with
    # nothing to do ends would start in a torn-down interpreter and crash it
    # (SIGSEGV in _PyThreadState_SetCurrent on CPython 3.11, which slurmd
    # answers with a drain).  Once it sleeps, exiting is safe.
    started = _thread.allocate_lock()
    started.acquire()
    _thread.start_new_thread(wait_then_fire, ())
    started.acquire()


def main(argv: list[str] | None = None) -> int:
    return hookentry.run(argv, "slurm_gpu.jobs", _step)


def _step(step: str) -> int:
    try:
        from . import lifecycle
        ctx = lifecycle.default_context(health=step == "epilog")
        if ctx.jobs.timeout > 0:
            _watchdog(ctx.jobs.timeout, step, lifecycle.policy_of(ctx).node_fault_exit(),
                      lambda line: lifecycle.mark_failed(ctx, line))
        return lifecycle.prolog(ctx) if step == "prolog" else lifecycle.epilog(ctx)
    except Exception as e:  # noqa: BLE001 - settings unreadable, bad job id...: a node fault
        from ..errors import message
        print(f"slurm-gpu: {message(e)} [{step}]", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
