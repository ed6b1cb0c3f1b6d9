"""The project's error types and the one-line form every user sees.

Every module raises these (or lets the hardware layer translate vendor errors
into them), so front ends map one exception type to one line and one exit code.

An error carries its consequence as data (:class:`Consequence`): whose doing
it is decides whether a job fails or the node drains, never the order of
``except`` clauses.  Its text (``str(e)``) has no prefix: ``slurm-gpu:`` is
added once, at the edge that prints the line (:meth:`SlurmGpuError.line`,
:func:`line`), so a message that quotes another error never says it twice.
"""
from __future__ import annotations

EXIT_FAILURE = 1
EXIT_USAGE = 2
PREFIX = "slurm-gpu: "


class Consequence:
    """Whose doing a failure is (plain strings: they go into job records as they are).

    * ``USER``: the job's user asked for something this node cannot give, or
      their processes interfered: their job fails, the node stays up;
    * ``INPUT``: a bad value given to us (a command-line argument, a job
      option): the caller's mistake, exit status 2 on a command line, and
      for a job the same as ``USER``;
    * ``NODE``: the node, its hardware or its configuration: under ``[jobs]
      on_internal_error = "drain"`` the node drains.
    """

    USER = "user"
    INPUT = "input"
    NODE = "node"


class SlurmGpuError(Exception):
    """A failure the user should see as ``slurm-gpu: <what> (<where>)``."""

    exit_code = EXIT_FAILURE
    consequence = Consequence.NODE

    def __init__(self, what: str, where: str | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.where = where

    def message(self) -> str:
        """``<what> (<where>)`` on one line, without the program prefix.

        Input text quoted in a message (a file's line, a node name) may hold
        line breaks: they are shown escaped, so the message stays one line.
        """
        text = f"{self.what} ({self.where})" if self.where else self.what
        return text.replace("\r", "\\r").replace("\n", "\\n")

    def line(self) -> str:
        """The one line shown to the user (without trailing newline)."""
        return PREFIX + self.message()

    def __str__(self) -> str:
        return self.message()


class UsageError(SlurmGpuError):
    """Bad arguments or bad input given by the user."""

    exit_code = EXIT_USAGE
    consequence = Consequence.INPUT


class InputError(SlurmGpuError):
    """A file or value the user supplied cannot be read or parsed."""

    exit_code = EXIT_FAILURE


class HardwareError(SlurmGpuError):
    """The hardware (NVML, hwloc, /dev) answered with an error."""

    exit_code = EXIT_FAILURE


class CommandError(SlurmGpuError):
    """An external command failed or timed out (see slurm_gpu.runner)."""

    exit_code = EXIT_FAILURE


def message(e: BaseException) -> str:
    """*e* as one line without the prefix: ours as they are, anything else as a bug."""
    if isinstance(e, SlurmGpuError):
        return e.message()
    return f"internal error: {type(e).__name__}: {e}"


def consequence(e: BaseException) -> str:
    """Whose doing *e* is: ours say so; anything else is a bug, so the node's."""
    return e.consequence if isinstance(e, SlurmGpuError) else Consequence.NODE


def line(text: str) -> str:
    """*text* with the program prefix, added once (text that has it already is kept)."""
    return text if text.startswith(PREFIX) else PREFIX + text


def unreadable(e: OSError, what: str, path: str, verb: str = "read") -> InputError:
    """*e*, met opening *what* at *path*, as the one line a user sees: missing,
    a directory, or why it cannot be read (or listed: *verb*)."""
    if isinstance(e, FileNotFoundError):
        return InputError(f"{what} not found", path)
    if isinstance(e, IsADirectoryError):
        return InputError(f"{what} is a directory", path)
    return InputError(f"cannot {verb} {what}: {e.strerror}", path)
