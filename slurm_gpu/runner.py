"""The one place that runs external commands.

Everything (scontrol, nvidia-cuda-mps-control, ibnetdiscover, ...) goes through
:func:`run`: an argv list, never a shell, with a timeout that kills the whole
process group, so a hung child cannot hang a prolog or a health check.
Tests replace :data:`RUNNER` (or monkeypatch :func:`run`) to serve recorded
output.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping, Sequence

from .errors import CommandError
from .hw.plain import Plain

if TYPE_CHECKING:
    import subprocess

# subprocess (and signal) are imported by the functions that run something: a
# health check that runs no command (--no-drain, or Slurm >= 26.05 telling us
# the node's state) does not pay ~1.7 ms for them on every run.

# Slurm runs prolog, epilog and HealthCheckProgram with no PATH at all.
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class Completed(Plain):
    """A finished command: its argv, exit status and output.

    Plain values, not dataclasses (so is RunAs): the prolog imports no
    dataclasses (with inspect, ast and dis: ~5 ms)."""

    __slots__ = ("argv", "returncode", "stdout", "stderr")
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class RunAs(Plain):
    """Drop to this identity in the child before exec (never for root work)."""

    __slots__ = ("uid", "gid", "groups")
    _defaults = {"groups": ()}
    uid: int
    gid: int
    groups: tuple[int, ...]


def _kill_group(proc: subprocess.Popen[str]) -> None:
    import signal
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(proc: subprocess.Popen[str]) -> None:
    """Collect a killed child without trusting its pipes to close.

    A grandchild that left the process group (a daemon that called setsid)
    survives killpg and may still hold our stdout: waiting for EOF would then
    block forever, so the wait for output is bounded and the pipes are closed.
    """
    import subprocess
    try:
        proc.communicate(timeout=2)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()


def _join_then_drop(procs_files: tuple[str, ...], run_as: RunAs | None):
    """preexec_fn: write our pid into each ``cgroup.procs``, then become *run_as*.

    Only async-signal-safe-ish calls (os.open/os.write/set*id): it runs in
    the forked child of a process that may have other threads.
    """
    def child() -> None:
        pid = str(os.getpid()).encode()
        for p in procs_files:
            fd = os.open(p, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        if run_as is not None:
            os.setgroups(list(run_as.groups))
            os.setregid(run_as.gid, run_as.gid)
            os.setreuid(run_as.uid, run_as.uid)
    return child


def run(
    argv: Sequence[str],
    timeout: float,
    *,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    run_as: RunAs | None = None,
    cwd: str | None = None,
    join_cgroups: Sequence[str] = (),
) -> Completed:
    """Run *argv* (no shell) and return its output.

    The child gets its own session so that on timeout the whole process group
    is killed.  With ``check`` a non-zero exit raises :class:`CommandError`
    carrying the command's first stderr line.  ``env`` replaces the
    environment; when omitted the child gets ``PATH`` only plus ``SLURM_CONF``
    if set, because user-controlled variables must not leak into root tools.
    """
    import subprocess
    argv = tuple(str(a) for a in argv)
    if not argv:
        raise CommandError("empty command")
    if env is None:
        env = {"PATH": SAFE_PATH}
        if "SLURM_CONF" in os.environ:
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    kwargs: dict = {}
    if join_cgroups:
        # Join first, as root, then drop privileges, then exec: the child
        # never runs the command outside those cgroups, and once it is the
        # user it could not move itself.  subprocess applies user=/group=
        # before preexec_fn, so the drop happens here instead.
        kwargs["preexec_fn"] = _join_then_drop(tuple(join_cgroups), run_as)
    elif run_as is not None:
        kwargs.update(user=run_as.uid, group=run_as.gid, extra_groups=list(run_as.groups))
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env),
            cwd=cwd or "/",
            start_new_session=True,
            close_fds=True,
            **kwargs,
        )
    except FileNotFoundError:
        raise CommandError(f"command not found: {argv[0]}") from None
    except PermissionError as e:
        raise CommandError(f"cannot run {argv[0]}: {e.strerror}") from None
    except subprocess.SubprocessError as e:     # join_cgroups or the drop failed in the child
        raise CommandError(f"cannot start {argv[0]} in its cgroup: {e}") from None
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        _reap(proc)
        raise CommandError(f"{os.path.basename(argv[0])} timed out after {timeout:g} s",
                           " ".join(argv[:3])) from None
    res = Completed(argv, proc.returncode, out, err)
    if check and proc.returncode != 0:
        first = (err.strip() or out.strip()).splitlines()
        detail = first[0] if first else f"exit status {proc.returncode}"
        raise CommandError(f"{os.path.basename(argv[0])} failed: {detail}", " ".join(argv[:3]))
    return res
