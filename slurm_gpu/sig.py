"""Signal numbers and calls for the prolog, epilog and runner, from ``_signal``.

``signal`` is ``_signal`` (CPython's C module, present in every build) with
each number wrapped in an ``enum``: importing it costs every prolog and
epilog ~3 ms, for constants and two functions.  Code that needs handlers by
name (the sandbox, the health watch) keeps importing ``signal``.
"""
from __future__ import annotations

from _signal import SIG_DFL, SIGKILL, SIGPIPE, SIGXFSZ, pidfd_send_signal
from _signal import signal as set_handler

__all__ = ["SIG_DFL", "SIGKILL", "SIGPIPE", "SIGXFSZ", "pidfd_send_signal", "set_handler"]
