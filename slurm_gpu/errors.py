"""The project's error types and the one-line form every user sees.

Every module raises these (or lets the hardware layer translate vendor errors
into them), so front ends map one exception type to one line and one exit code.
"""
from __future__ import annotations

EXIT_FAILURE = 1
EXIT_USAGE = 2


class SlurmGpuError(Exception):
    """A failure the user should see as ``slurm-gpu: <what> (<where>)``."""

    exit_code = EXIT_FAILURE

    def __init__(self, what: str, where: str | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.where = where

    def line(self) -> str:
        """The one line shown to the user (without trailing newline).

        Input text quoted in a message (a file's line, a node name) may hold
        line breaks: they are shown escaped, so the message stays one line.
        """
        text = f"slurm-gpu: {self.what} ({self.where})" if self.where else f"slurm-gpu: {self.what}"
        return text.replace("\r", "\\r").replace("\n", "\\n")

    def __str__(self) -> str:
        return self.line()


class UsageError(SlurmGpuError):
    """Bad arguments or bad input given by the user."""

    exit_code = EXIT_USAGE


class InputError(SlurmGpuError):
    """A file or value the user supplied cannot be read or parsed."""

    exit_code = EXIT_FAILURE


class HardwareError(SlurmGpuError):
    """The hardware (NVML, hwloc, /dev) answered with an error."""

    exit_code = EXIT_FAILURE


class CommandError(SlurmGpuError):
    """An external command failed or timed out (see slurm_gpu.runner)."""

    exit_code = EXIT_FAILURE
