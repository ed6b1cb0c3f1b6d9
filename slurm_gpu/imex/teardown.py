"""The epilog's half of per-job IMEX, kept light: it imports no json, re or
socket (the epilog pays every import on every job of a per-job IMEX node).

The prolog leaves ``<base_dir>/<jobid>/daemon``: one line ``<pid> <start
time> <channel device or ->``, root's, rewritten after every step.  The
epilog trusts it only as root's regular file, and signals the PID only while
its start time (``/proc/<pid>/stat``) is the recorded one, so a reused PID is
never hit.
"""
from __future__ import annotations

import os
import signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Mapping

from .. import procfs
from ..ownedfile import read_owned

RECORD = "daemon"
EVENTS = "events.log"
EVENTS_MAX = 1 << 20        # then the file starts over (the previous one kept as .1)


def event_logger(base: str) -> Callable[[str], None]:
    """Log to stderr and to ``<base_dir>/events.log``: slurmd keeps no prolog output
    unless the prolog fails, and a job this prolog cancels ended with exit 0."""
    def log(line: str) -> None:
        os.write(2, (line + "\n").encode(errors="replace"))
        path = os.path.join(base, EVENTS)
        try:
            try:
                if os.lstat(path).st_size > EVENTS_MAX:
                    os.replace(path, path + ".1")
            except FileNotFoundError:
                pass
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, (time.strftime("%Y-%m-%dT%H:%M:%S ") + line + "\n").encode(errors="replace"))
            finally:
                os.close(fd)
        except OSError:
            pass                        # stderr has it
    return log


def write_record(job_dir: str, pid: int | None, start: int | None, channel: str | None) -> None:
    from ..fsutil import atomic_write
    atomic_write(os.path.join(job_dir, RECORD), f"{pid or 0} {start or 0} {channel or '-'}\n",
                 mode=0o600, durable=False)


def read_record(job_dir: str) -> tuple[int, int, str | None] | None:
    """(pid, start time, channel) from the record, or None; a foreign file is an error."""
    path = os.path.join(job_dir, RECORD)
    try:
        words = read_owned(path, 4096, (os.geteuid(),)).decode(errors="replace").split()
    except FileNotFoundError:
        return None
    if len(words) != 3 or not words[0].isdigit() or not words[1].isdigit():
        raise OSError(f"{path} is not a daemon record")
    return int(words[0]), int(words[1]), None if words[2] == "-" else words[2]


def reap(pid: int) -> int | None:
    """The exit status of our child *pid* when it has exited (None: still running, or not ours)."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if got == pid else None


def alive(pid: int, start: int | None) -> bool:
    if pid <= 0:
        return False
    return procfs.alive(pid) and procfs.start_time(pid) == start


def stop(pid: int, start: int | None, wait: float) -> str | None:
    """SIGTERM the daemon (IMEX then tells its peers), SIGKILL after *wait* s; a note, or None."""
    if not alive(pid, start):
        return None
    os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + wait
    while time.monotonic() < end:
        reap(pid)
        if not alive(pid, start):
            return f"nvidia-imex {pid} stopped"
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    reap(pid)
    if alive(pid, start):
        raise OSError(f"nvidia-imex {pid} survived SIGKILL")
    return f"nvidia-imex {pid} killed after {wait:g} s"


def remove_channel(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def epilog(env: Mapping[str, str], base: str, stop_timeout: float, log: Callable[[str], None],
           on_internal_error: str) -> int:
    """Stop the job's daemon, remove its channel and its directory; idempotent."""
    jobid = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID", "")
    if not jobid.isdigit() or len(jobid) > 20:
        log(f"slurm-gpu: imex: bad job id {jobid[:40]!r} (SLURM_JOB_ID)")
        return 1 if on_internal_error == "drain" else 0
    path = os.path.join(base, jobid)
    if not os.path.lexists(path):
        return 0
    try:
        rec = read_record(path)
        if rec is not None:
            note = stop(rec[0], rec[1], stop_timeout)
            if note:
                log(f"slurm-gpu: imex: epilog job {jobid}: {note}")
            remove_channel(rec[2])
        import shutil
        shutil.rmtree(path)
        return 0
    except Exception as e:  # noqa: BLE001
        log(f"slurm-gpu: imex: {type(e).__name__}: {e} [epilog job {jobid}: cleanup incomplete, "
            f"on_internal_error={on_internal_error}]")
        return 1 if on_internal_error == "drain" else 0
