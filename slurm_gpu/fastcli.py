"""``slurm-gpu health`` and ``slurm-gpu inventory`` without click, for plain argvs.

Slurm runs the health check on every node every HealthCheckInterval, and
importing click costs about as much as the interpreter's start (``python -X
importtime``).  :func:`try_run` takes an argv only when it is plain: the
command, then known options, each at most once, every value a separate word
that is neither empty nor starts with ``-``, no ``--debug`` (nor
``$SLURM_GPU_DEBUG``), stdout and stderr not ASCII streams (click re-wraps
those), no path option naming a directory or an unreadable file (click's
``Path`` check).  Anything else (``--help``, ``--opt=value``, a typo, a
repeated option) returns None and goes to the click front end, so every
message and exit code for an unusual argv stays click's.  The command bodies
are the same functions the click commands call; errors end as
:func:`slurm_gpu.cli.main` ends them.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

# command -> (flags: option -> parameter, value options: option -> (parameter, is a click.Path))
_HEALTH_FLAGS = {"--json": "as_json", "--slurm": "slurm_mode", "--no-drain": "no_drain",
                 "--isolate-bad-gpu": "isolate_bad_gpu"}
_HEALTH_VALUES = {"--only": ("only", False), "--kernel-log": ("kernel_log", True),
                  "--prom-file": ("prom_file", True), "--node": ("node", False),
                  "--snapshot": ("snapshot", True), "--overlay": ("overlay", True),
                  "--gres-conf": ("gres_conf", True)}
_INVENTORY_FLAGS = {"--json": "as_json"}
_INVENTORY_VALUES = {"--hwloc-xml": ("hwloc_xml", False), "--snapshot": ("snapshot", False),
                     "--overlay": ("overlay", False)}


def parse(argv: list[str], flags: dict[str, str],
          values: dict[str, tuple[str, bool]]) -> dict[str, Any] | None:
    """The keyword arguments for a plain *argv* (without the command), or None."""
    kw: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        opt = argv[i]
        if opt in flags:
            name = flags[opt]
            if name in kw:
                return None
            kw[name] = True
            i += 1
        elif opt in values and i + 1 < len(argv):
            name, is_path = values[opt]
            val = argv[i + 1]
            if name in kw or not val or val.startswith("-") or (is_path and not _plain_file(val)):
                return None
            kw[name] = val
            i += 2
        else:
            return None
    return kw


def _plain_file(path: str) -> bool:
    """What ``click.Path(dir_okay=False)`` lets through without a message."""
    import stat
    try:
        st = os.stat(path)
    except OSError:
        return True         # exists=False: click passes a missing path on unchanged
    return not stat.S_ISDIR(st.st_mode) and os.access(path, os.R_OK)


def _streams_ok() -> bool:
    import codecs
    for s in (sys.stdout, sys.stderr):
        enc = getattr(s, "encoding", None)
        if s is None or not enc or codecs.lookup(enc).name == "ascii":
            return False
    return True


def _health(kw: dict[str, Any]) -> int:
    from .commands.health_run import run_health
    if "isolate_bad_gpu" not in kw:
        kw["isolate_bad_gpu"] = None    # click's flag default: keep [health] isolate_bad_gpu
    return run_health(**kw)


def _inventory(kw: dict[str, Any]) -> int:
    from .commands.inventory_run import show
    show(**kw)
    return 0


_COMMANDS: dict[str, tuple[dict[str, str], dict[str, tuple[str, bool]], Callable[[dict[str, Any]], int]]] = {
    "health": (_HEALTH_FLAGS, _HEALTH_VALUES, _health),
    "inventory": (_INVENTORY_FLAGS, _INVENTORY_VALUES, _inventory),
}


def plain_args(argv: list[str]) -> dict[str, Any] | None:
    """The keyword arguments of *argv* (its command first) when it is plain
    enough to run here, or None: a command not served here, an option it does
    not know or gives twice, a missing value, or one click would judge."""
    if not argv or argv[0] not in _COMMANDS:
        return None
    flags, values, _ = _COMMANDS[argv[0]]
    return parse(argv[1:], flags, values)


def try_run(argv: list[str]) -> int | None:
    """Run *argv* without click and return its exit status, or None: not plain, use click."""
    if not argv or argv[0] not in _COMMANDS or "SLURM_GPU_DEBUG" in os.environ or not _streams_ok():
        return None
    kw = plain_args(argv)
    if kw is None:
        return None
    body = _COMMANDS[argv[0]][2]
    from .echo import echo
    from .errors import EXIT_FAILURE, SlurmGpuError
    try:
        return body(kw)
    except SlurmGpuError as e:
        echo(e.line(), err=True)
        return e.exit_code
    except KeyboardInterrupt:           # click: a blank line closes the ^C, then Abort
        echo("", err=True)
        echo("slurm-gpu: aborted", err=True)
        return EXIT_FAILURE
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_FAILURE
    except Exception as e:  # noqa: BLE001 - as cli.main: a bug becomes one line
        echo(f"slurm-gpu: internal error: {type(e).__name__}: {e} (run with --debug for a traceback)", err=True)
        return EXIT_FAILURE


def _quiet_stdout() -> None:
    """After EPIPE, the interpreter's final flush must not print a second error (click's PacifyFlushWrapper)."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
