"""The one place that runs external commands.

Everything (scontrol, nvidia-cuda-mps-control, ibnetdiscover, ...) goes through
:func:`run`: an argv list, never a shell, with a timeout that kills the whole
process group, so a hung child cannot hang a prolog or a health check.
Tests replace :data:`RUNNER` (or monkeypatch :func:`run`) to serve recorded
output.

The child is started by :mod:`subprocess` without ``preexec_fn``, so no
Python runs between ``fork`` and ``exec``: the health check runs commands
while a thread of its own may be hung inside libnvidia-ml, and a fork that
runs Python (or only ``os.fork``'s at-fork hooks and import lock) could wait
forever for a lock that thread holds.  What must happen before ``exec``
and subprocess cannot do (joining cgroups, pinning CPUs, then dropping the
identity, in that order) is done by a small C program, ``slurm-gpu-exec``
(``spank/sg_exec.c``, built on the node by :mod:`slurm_gpu.exechelper`).
"""
from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import subprocess
import sys
import time
from collections import namedtuple

from .errors import CommandError, Consequence

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Sequence

# Slurm runs prolog, epilog and HealthCheckProgram with no PATH at all.
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# The pre-exec helper (spank/sg_exec.c, built by slurm_gpu.exechelper).
HELPER_NAME = "slurm-gpu-exec"


def helper_path() -> str:
    """Where the helper is: this venv's ``lib/slurm-gpu/`` (built on the node, like the plugin)."""
    return os.path.join(sys.prefix, "lib", "slurm-gpu", HELPER_NAME)


class Completed(namedtuple("Completed", ["argv", "returncode", "stdout", "stderr"])):
    """A finished command: its argv (a tuple), exit status and output (str).

    Named tuples rather than dataclasses (so is RunAs): dataclasses imports
    inspect, ~5 ms of every --gpu-mps prolog and epilog (issue 25's bench
    row), and collections is loaded by subprocess already."""

    __slots__ = ()

    @property
    def ok(self) -> bool:
        return bool(self.returncode == 0)


class RunAs(namedtuple("RunAs", ["uid", "gid", "groups"], defaults=[()])):
    """Drop to this identity (uid, gid, supplementary groups) in the child
    before exec (never for root work)."""

    __slots__ = ()


# What the helper reports when it fails before exec: the stage, then errno.
_STAGES = {b"E": "exec", b"C": "cgroup", b"A": "affinity", b"U": "identity", b"S": "setup"}


class TimedOut(CommandError):
    """The command did not finish in time; *stopped*: it was stopped then
    (SIGSTOP or a ptrace stop: only root and its own user can do that);
    *stuck*: it did not end when killed, and was given up (:data:`KILL_WAIT`)."""

    def __init__(self, what: str, where: str | None = None, stopped: bool = False,
                 stuck: bool = False, blocked_in: str = "") -> None:
        super().__init__(what, where)
        self.stopped = stopped
        self.stuck = stuck
        self.blocked_in = blocked_in        # a stuck command's kernel wait (/proc/PID/wchan)


# How long a killed command may take to end before it is given up.  SIGKILL
# waits for a process in an uninterruptible sleep: one blocked in a FUSE
# request its server took never ends until the server answers (fs/fuse/dev.c,
# request_wait_answer), and a job's user can mount FUSE where a command run
# for their job looks.  The caller must not wait with it.
KILL_WAIT = 2.0
# How long a killed command that is still running (exiting, not blocked) is waited for.
EXIT_CAP = 10.0


class UserLimited(CommandError):
    """The command, run as a user (:class:`RunAs`), could not start because that
    user has as many processes as its ``RLIMIT_NPROC`` allows: their doing, so
    a job they own fails and the node stays up."""

    consequence = Consequence.USER


class _StartError(Exception):
    def __init__(self, stage: str, errno: int) -> None:
        super().__init__(stage, errno)
        self.stage = stage
        self.errno = errno


def _text(raw: bytes) -> str:
    # What subprocess's text mode gave: UTF-8 (Python's C/POSIX locale
    # coercion; slurmd runs us without LANG) with universal newlines; an
    # undecodable byte no longer raises.
    text = raw.decode("utf-8", "replace")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def first_line(res: Completed, cap: int = 200) -> str | None:
    """The first line a command printed (stderr first), as a message may quote it:
    at most *cap* characters (the rest is "…"), and ``repr()`` when it holds what
    is not printable (terminal escapes); None when it printed nothing.

    A command that runs as a job's user can be made to print anything (they
    can trace it): its words reach drain reasons, job records and logs."""
    lines = (res.stderr.strip() or res.stdout.strip()).splitlines()
    if not lines:
        return None
    line = lines[0] if len(lines[0]) <= cap else lines[0][:cap - 1] + "…"
    return line if line.isprintable() else repr(line)


def _check_argv_env(argv: tuple[str, ...], env: dict[str, str]) -> None:
    """What exec would refuse, refused here with one line (subprocess raises ValueError)."""
    if any("\0" in a for a in argv):
        raise CommandError("argument contains a NUL byte", argv[0])
    for k, v in env.items():
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise CommandError(f"bad environment variable {k!r}", argv[0])


def _helper_argv(argv: tuple[str, ...], report_fd: int, procs_files: Sequence[str],
                 cpus: Sequence[int], run_as: RunAs | None) -> list[str]:
    """The helper's command line (spank/sg_exec.c): cgroups, CPUs, identity, then *argv*."""
    full = [helper_path(), "-r", str(report_fd)]
    for p in procs_files:
        full += ["-c", p]
    if cpus:
        full += ["-a", ",".join(str(int(c)) for c in cpus)]
    if run_as is not None:
        full += ["-u", str(int(run_as.uid)), "-g", str(int(run_as.gid)),
                 "-G", ",".join(str(int(g)) for g in run_as.groups) or "-"]
    return full + ["--", *argv]


def _helper_report(report_r: int, deadline: float) -> bytes | None:
    """What the helper wrote before exec (b"" once the command runs); None past *deadline*."""
    poller = select.poll()
    poller.register(report_r, select.POLLIN)
    report = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if poller.poll(max(1, int(left * 1000) + 1)):
            chunk = os.read(report_r, 64)
            if not chunk:           # EOF: exec happened (the fd is close-on-exec)
                return report
            report += chunk


def _start(argv: tuple[str, ...], env: dict[str, str], has_input: bool, cwd: str,
           procs_files: tuple[str, ...], run_as: RunAs | None, cpus: tuple[int, ...],
           deadline: float) -> subprocess.Popen[bytes] | None:
    """Start *argv* in its own session; None when the helper did not get to exec in time."""
    common = dict(stdin=subprocess.PIPE if has_input else subprocess.DEVNULL,
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                  close_fds=True, start_new_session=True)     # restore_signals: SIGPIPE, SIGXFSZ
    if not procs_files and not cpus:
        ident = {} if run_as is None else dict(user=run_as.uid, group=run_as.gid,
                                               extra_groups=list(run_as.groups))
        try:
            return subprocess.Popen(argv, **common, **ident)  # type: ignore[call-overload]
        except OSError as e:
            # subprocess names the file for exec and chdir failures only
            stage = "exec" if e.filename == argv[0] else "setup" if e.filename else \
                "identity" if run_as is not None else "setup"
            raise _StartError(stage, e.errno or 0) from None
    helper = helper_path()
    if not os.access(helper, os.X_OK):
        raise _StartError("helper", 0)
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    if report_w < 3:
        # a parent started with stdio closed: 0..2 become the child's
        # stdin/stdout/stderr, so the report pipe must sit above them
        lifted = fcntl.fcntl(report_w, fcntl.F_DUPFD_CLOEXEC, 3)
        os.close(report_w)
        report_w = lifted
    try:
        try:
            p = subprocess.Popen(_helper_argv(argv, report_w, procs_files, cpus, run_as),
                                 pass_fds=(report_w,), **common)  # type: ignore[call-overload]
        except OSError as e:
            raise _StartError("setup", e.errno or 0) from None
        os.close(report_w)
        report_w = -1
        report = _helper_report(report_r, deadline)
    finally:
        if report_w >= 0:
            os.close(report_w)
        os.close(report_r)
    if report is None:
        _kill_group(p.pid)
        _reap(p, KILL_WAIT)
        return None
    if report:
        _reap(p)
        tag, _, code = report.partition(b":")
        raise _StartError(_STAGES.get(tag, "setup"), int(code) if code.isdigit() else 0)
    return p


def _gone_after_kill(p: subprocess.Popen[bytes]) -> bool:
    """Reap *p*, killed: False when it is still there after :data:`KILL_WAIT` s, blocked
    in the kernel.  One still running then is on its way out (its address space
    torn down: a large one takes seconds on a loaded node) and is waited for, up
    to :data:`EXIT_CAP` s; still running then, it is left to end (and be reaped
    by ``subprocess`` later) and counts as ended, not stuck."""
    if _reap(p, KILL_WAIT):
        return True
    from . import procfs
    cap = time.monotonic() + EXIT_CAP
    while procfs.state(p.pid) == "R":
        if _reap(p, 0.05):
            return True
        if time.monotonic() > cap:
            # Running still, not blocked: slow (a user can keep what runs as
            # them starved), never proof of a kernel that cannot end it.
            return True
    return False


def _reap(p: subprocess.Popen[bytes], wait: float | None = None) -> bool:
    """Wait for *p* (at most *wait* s) and close its pipes; False when it did not end
    (subprocess reaps it later, when it does: ``subprocess._cleanup``)."""
    try:
        p.wait(wait)
        ended = True
    except subprocess.TimeoutExpired:
        ended = False
    for f in (p.stdin, p.stdout, p.stderr):
        if f is not None:
            f.close()
    return ended


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
    exec fewer).  Both go through the helper (:func:`helper_path`).
    """
    argv = tuple(str(a) for a in argv)
    if not argv:
        raise CommandError("empty command")
    if env is None:
        env = {"PATH": SAFE_PATH}
        if "SLURM_CONF" in os.environ:
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    env = dict(env)
    _check_argv_env(argv, env)
    deadline = time.monotonic() + timeout
    what = f"{os.path.basename(argv[0])} timed out after {timeout:g} s"
    try:
        p = _start(argv, env, input is not None, cwd or "/", tuple(join_cgroups), run_as,
                   tuple(cpus), deadline)
    except _StartError as e:
        raise _start_error(argv[0], e, bool(join_cgroups), run_as) from None
    if p is None:
        raise TimedOut(what, " ".join(argv[:3]))
    try:
        out, err = p.communicate(None if input is None else input.encode(),
                                 timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        # Not communicate() again: something the command left (its own
        # session) may hold the pipes for its whole life.  Whether it was
        # stopped is read before the kill: a command run as a user can be
        # stopped by any process of that user, which is theirs to answer for.
        stopped = _stopped(p.pid)
        _kill_group(p.pid)
        stuck = not _gone_after_kill(p)
        from .procfs import wchan as _wchan
        wchan = _wchan(p.pid) if stuck else ""
        raise TimedOut(what + (" (it was stopped)" if stopped else "")
                       + (f" and could not be ended (blocked in the kernel{', in ' + wchan if wchan else ''})"
                          if stuck else ""),
                       " ".join(argv[:3]), stopped, stuck, wchan) from None
    res = Completed(argv, p.returncode, _text(out), _text(err))
    if check and res.returncode != 0:
        detail = first_line(res) or f"exit status {res.returncode}"
        raise CommandError(f"{os.path.basename(argv[0])} failed: {detail}", " ".join(argv[:3]))
    return res


def _start_error(prog: str, e: _StartError, in_cgroups: bool, run_as: RunAs | None) -> CommandError:
    why = os.strerror(e.errno) if e.errno else "unknown error"
    if run_as is not None and e.errno == errno.EAGAIN and e.stage in ("exec", "identity"):
        # RLIMIT_NPROC (slurmd's LimitNPROC, inherited): since Linux 3.1
        # setresuid succeeds over it and execve fails with EAGAIN (before,
        # setresuid did); the count is the user's processes, so any of theirs
        # can bring it about (kernel/sys.c flag_nproc_exceeded, fs/exec.c).
        return UserLimited(f"cannot run {prog} as uid {int(run_as.uid)}: that user has as many "
                           "processes as its limit allows (RLIMIT_NPROC)")
    if e.stage == "helper":
        return CommandError(f"cannot start {prog} {'in its cgroup' if in_cgroups else 'on its CPUs'}: "
                            f"{HELPER_NAME} is not built (slurm-gpu spank build)", helper_path())
    if e.stage == "exec" and e.errno in (2, 20):        # ENOENT, ENOTDIR
        return CommandError(f"command not found: {prog}")
    if e.stage == "exec":
        return CommandError(f"cannot run {prog}: {why}")
    if e.stage == "affinity":
        return CommandError(f"cannot start {prog} on its CPUs: {why}")
    if e.stage == "cgroup" or in_cgroups:
        return CommandError(f"cannot start {prog} in its cgroup: {why}")
    return CommandError(f"cannot start {prog} ({e.stage}): {why}")


def _stopped(pid: int) -> bool:
    """*pid* is stopped or traced (``T``/``t`` in ``/proc/PID/stat``)."""
    from .procfs import state
    return state(pid) in ("T", "t")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
