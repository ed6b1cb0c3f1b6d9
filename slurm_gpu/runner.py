"""The one place that runs external commands.

Everything (scontrol, nvidia-cuda-mps-control, ibnetdiscover, ...) goes through
:func:`run`: an argv list, never a shell, with a timeout that kills the whole
process group, so a hung child cannot hang a prolog or a health check.
Tests replace :data:`RUNNER` (or monkeypatch :func:`run`) to serve recorded
output.

The child is started here with ``fork`` and ``exec`` rather than through
``subprocess``: importing subprocess (signal's enums, selectors, threading,
locale, contextlib) costs ~9 ms, more than the work of a whole MPS epilog,
and the prolog and epilog run on every such job.  What ``Popen`` did for us
is done here, in the same order: a new session, stdin/stdout/stderr on
pipes (stdin ``/dev/null`` without input), every other descriptor closed,
SIGPIPE and SIGXFSZ back to their defaults, ``cwd``, the cgroups joined as
root, then the identity dropped, then ``exec``.  A failure before ``exec``
comes back over a close-on-exec pipe, as subprocess reports it.
"""
from __future__ import annotations

import fcntl
import os

from . import sig
from .errors import CommandError
from .hw.plain import Plain

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Sequence

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


# What the child reports when it fails before exec: the stage, then errno.
_STAGES = {b"E": "exec", b"C": "cgroup", b"A": "affinity", b"U": "identity", b"S": "setup"}


def _child(argv: tuple[str, ...], env: dict[str, str], fds: tuple[int, int, int], err_w: int,
           cwd: str, procs_files: tuple[str, ...], run_as: RunAs | None,
           cpus: tuple[int, ...]) -> None:
    """In the forked child: set up, then exec *argv*; never returns.

    Only calls that take no lock another thread of the parent could hold
    (os.* system calls, no imports, no I/O buffers): the parent may have a
    watchdog thread.  Any failure goes to *err_w* as ``<stage>:<errno>``.
    """
    stage = b"S"
    try:
        os.setsid()
        # Lift every descriptor that sits on 0..2 first (a parent started
        # with stdio closed), so that no dup2 overwrites one still needed.
        if err_w < 3:
            err_w = fcntl.fcntl(err_w, fcntl.F_DUPFD_CLOEXEC, 3)
        src = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3) if fd < 3 else fd for fd in fds]
        for target, fd in enumerate(src):
            os.dup2(fd, target)             # inheritable: exec keeps 0, 1 and 2
        os.closerange(3, err_w)
        os.closerange(err_w + 1, _MAXFD)
        for signum in (sig.SIGPIPE, sig.SIGXFSZ):   # Python ignores these; the command must not
            sig.set_handler(signum, sig.SIG_DFL)
        os.chdir(cwd)
        stage = b"C"
        pid = str(os.getpid()).encode()
        for p in procs_files:
            fd = os.open(p, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        if cpus:
            stage = b"A"
            os.sched_setaffinity(0, cpus)
        if run_as is not None:
            stage = b"U"
            os.setgroups(list(run_as.groups))
            os.setregid(run_as.gid, run_as.gid)
            os.setreuid(run_as.uid, run_as.uid)
        stage = b"E"
        if "/" in argv[0]:
            os.execve(argv[0], argv, env)
        else:
            os.execvpe(argv[0], argv, env)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, whatever it was
        code = getattr(e, "errno", None) or 0
        try:
            os.write(err_w, stage + b":" + str(code).encode())
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(255)


_MAXFD = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1 << 16


def _start(argv: tuple[str, ...], env: dict[str, str], has_input: bool, cwd: str,
           procs_files: tuple[str, ...], run_as: RunAs | None,
           cpus: tuple[int, ...]) -> tuple[int, int | None, int, int]:
    """Fork and exec *argv*: (pid, stdin write end or None, stdout and stderr read ends)."""
    opened: list[int] = []
    try:
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        opened += [err_r, err_w]
        if has_input:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
            opened += [in_r, in_w]
        else:
            in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), None
            opened.append(in_r)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        e_r, e_w = os.pipe2(os.O_CLOEXEC)
        opened += [out_r, out_w, e_r, e_w]
        pid = os.fork()
        if pid == 0:
            _child(argv, env, (in_r, out_w, e_w), err_w, cwd, procs_files, run_as, cpus)
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    for fd in (in_r, out_w, e_w, err_w):
        os.close(fd)
    report = b""
    try:
        while True:                     # EOF: exec happened (err_w closed on exec)
            chunk = os.read(err_r, 64)
            if not chunk:
                break
            report += chunk
    finally:
        os.close(err_r)
    if report:
        os.waitpid(pid, 0)
        for fd in (in_w, out_r, e_r):
            if fd is not None:
                os.close(fd)
        stage, _, code = report.partition(b":")
        errno = int(code) if code.isdigit() else 0
        raise _StartError(_STAGES.get(stage, "setup"), errno)
    return pid, in_w, out_r, e_r


class _StartError(Exception):
    def __init__(self, stage: str, errno: int) -> None:
        super().__init__(stage, errno)
        self.stage = stage
        self.errno = errno


def _exchange(pid: int, in_w: int | None, data: bytes, out_r: int, e_r: int,
              deadline: float) -> tuple[bytes, bytes, int | None, bool]:
    """Feed *data*, collect stdout and stderr and the exit status until *deadline*.

    Returns (stdout, stderr, wait status or None while not collected, whether
    the deadline came first).  The command may have exited and been
    collected while something it left still holds its pipes: that is a
    timeout too, as it was for ``Popen.communicate``.
    The end of the child is watched through a pidfd where the kernel has
    them (Linux 5.3), else polled.
    """
    import select
    import time
    poller = select.poll()
    out: dict[int, list[bytes]] = {out_r: [], e_r: []}
    for fd in out:
        poller.register(fd, select.POLLIN)
    view, sent = memoryview(data), 0
    if in_w is not None:
        if data:
            os.set_blocking(in_w, False)
            poller.register(in_w, select.POLLOUT)
        else:
            os.close(in_w)
            in_w = None
    try:
        pidfd: int | None = os.pidfd_open(pid)
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):
        pidfd = None
    status = None
    open_fds = set(out) | ({in_w} if in_w is not None else set())
    try:
        while open_fds or status is None:
            if status is None and pidfd is None and not open_fds:
                _pid, st = os.waitpid(pid, os.WNOHANG)
                if _pid:
                    status = st
                    break
            left = deadline - time.monotonic()
            if left <= 0:
                return b"".join(out[out_r]), b"".join(out[e_r]), status, True
            wait_ms = left * 1000 if pidfd is not None or open_fds else min(left * 1000, 5)
            for fd, _ev in poller.poll(max(1, int(wait_ms) + 1)):
                if fd == pidfd:
                    poller.unregister(fd)
                    _pid, status = os.waitpid(pid, 0)
                elif fd == in_w:
                    try:
                        sent += os.write(in_w, view[sent:sent + 65536])
                    except BlockingIOError:
                        pass                    # full after all: poll again
                    except BrokenPipeError:
                        sent = len(view)        # it stopped reading: the rest is not wanted
                    if sent >= len(view):
                        poller.unregister(in_w)
                        os.close(in_w)
                        open_fds.discard(in_w)
                        in_w = None
                else:
                    chunk = os.read(fd, 65536)
                    if chunk:
                        out[fd].append(chunk)
                    else:
                        poller.unregister(fd)
                        open_fds.discard(fd)
        return b"".join(out[out_r]), b"".join(out[e_r]), status, False
    finally:
        if pidfd is not None:
            os.close(pidfd)
        if in_w is not None:
            os.close(in_w)
        for fd in (out_r, e_r):
            os.close(fd)


def _text(raw: bytes) -> str:
    # What subprocess's text mode gave: UTF-8 (Python's C/POSIX locale
    # coercion; slurmd runs us without LANG) with universal newlines; an
    # undecodable byte no longer raises.
    text = raw.decode("utf-8", "replace")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _check_argv_env(argv: tuple[str, ...], env: dict[str, str]) -> None:
    """What exec would refuse, refused here with one line (subprocess raised ValueError)."""
    if any("\0" in a for a in argv):
        raise CommandError("argument contains a NUL byte", argv[0])
    for k, v in env.items():
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise CommandError(f"bad environment variable {k!r}", argv[0])


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
    cpus: Sequence[int] = (),
) -> Completed:
    """Run *argv* (no shell) and return its output.

    The child gets its own session so that on timeout the whole process group
    is killed.  With ``check`` a non-zero exit raises :class:`CommandError`
    carrying the command's first stderr line.  ``env`` replaces the
    environment; when omitted the child gets ``PATH`` only plus ``SLURM_CONF``
    if set, because user-controlled variables must not leak into root tools.
    With *join_cgroups* the child writes itself into each ``cgroup.procs``
    as root, then drops to *run_as*, then execs: the command never runs
    outside those cgroups, and once it is the user it could not move itself.
    With *cpus* it runs on those CPUs only (what ``taskset -c`` did, one
    exec fewer).
    """
    import time
    argv = tuple(str(a) for a in argv)
    if not argv:
        raise CommandError("empty command")
    if env is None:
        env = {"PATH": SAFE_PATH}
        if "SLURM_CONF" in os.environ:
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    env = dict(env)
    _check_argv_env(argv, env)
    t0 = time.monotonic()
    try:
        pid, in_w, out_r, e_r = _start(argv, env, input is not None, cwd or "/",
                                       tuple(join_cgroups), run_as, tuple(cpus))
    except _StartError as e:
        raise _start_error(argv[0], e, bool(join_cgroups)) from None
    out, err, status, late = _exchange(pid, in_w, (input or "").encode(), out_r, e_r,
                                       t0 + timeout)
    if late:
        _kill_group(pid)
        if status is None:
            os.waitpid(pid, 0)
        raise CommandError(f"{os.path.basename(argv[0])} timed out after {timeout:g} s",
                           " ".join(argv[:3]))
    res = Completed(argv, os.waitstatus_to_exitcode(status), _text(out), _text(err))
    if check and res.returncode != 0:
        first = (res.stderr.strip() or res.stdout.strip()).splitlines()
        detail = first[0] if first else f"exit status {res.returncode}"
        raise CommandError(f"{os.path.basename(argv[0])} failed: {detail}", " ".join(argv[:3]))
    return res


def _start_error(prog: str, e: _StartError, in_cgroups: bool) -> CommandError:
    why = os.strerror(e.errno) if e.errno else "unknown error"
    if e.stage == "exec" and e.errno in (2, 20):        # ENOENT, ENOTDIR
        return CommandError(f"command not found: {prog}")
    if e.stage == "exec":
        return CommandError(f"cannot run {prog}: {why}")
    if e.stage == "affinity":
        return CommandError(f"cannot start {prog} on its CPUs: {why}")
    if e.stage == "cgroup" or in_cgroups:
        return CommandError(f"cannot start {prog} in its cgroup: {why}")
    return CommandError(f"cannot start {prog} ({e.stage}): {why}")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, sig.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
