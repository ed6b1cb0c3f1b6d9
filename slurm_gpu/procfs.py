"""Facts from /proc: the boot, and process identities.

The one reader of ``/proc/sys/kernel/random/boot_id`` and ``/proc/PID/stat``.
Every function takes the proc root (``/proc``), so tests point it at a
fixture tree.  Imported on hot paths (the SPANK step, the prolog): builtins
only.
"""
from __future__ import annotations

PROC = "/proc"


def boot_id(proc: str = PROC) -> str:
    """This boot's id ("" when unreadable): what changes at every reboot."""
    try:
        with open(f"{proc}/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def stat(pid: int | str, proc: str = PROC) -> tuple[str, list[str]] | None:
    """(command name, the fields after it) of ``/proc/PID/stat``, or None when *pid* is gone.

    The command name may hold spaces and ')', so the fields start after the
    last ')'.  In the returned list, [0] is the state, [1] the parent PID and
    [19] the start time (clock ticks after boot: a recycled PID has another).
    """
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    head, sep, rest = raw.rpartition(b")")
    if not sep:
        return None
    return head.partition(b"(")[2].decode(errors="replace"), rest.decode(errors="replace").split()


def _field(pid: int | str, i: int, proc: str) -> str | None:
    st = stat(pid, proc)
    if st is None or len(st[1]) <= i:
        return None
    return st[1][i]


def state(pid: int | str, proc: str = PROC) -> str | None:
    """The process state letter (``R``, ``S``, ``Z``...), None when gone."""
    return _field(pid, 0, proc)


def alive(pid: int | str, proc: str = PROC) -> bool:
    """*pid* has a thread that has not exited.

    Its own ``stat`` is its main thread's: ``Z`` once that one called
    pthread_exit, while another may run on (or hang in a driver), still
    holding what it opened and reachable by a signal to the PID; only once
    every thread has exited is the process gone.
    """
    s = state(pid, proc)
    if s is None:
        return False
    if s != "Z":
        return True
    import os
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return False
    return any(state(f"{pid}/task/{t}", proc) not in (None, "Z", "X") for t in tids if t != str(pid))


def parent(pid: int | str, proc: str = PROC) -> int | None:
    """The parent PID, None when gone."""
    v = _field(pid, 1, proc)
    return int(v) if v is not None and v.lstrip("-").isdigit() else None


def start_time(pid: int | str, proc: str = PROC) -> int | None:
    """The start time in clock ticks after boot, None when gone."""
    v = _field(pid, 19, proc)
    return int(v) if v is not None and v.isdigit() else None


def wchan(pid: int | str, proc: str = PROC) -> str:
    """Where in the kernel *pid* waits (``/proc/PID/wchan``: a function name); "" when
    it runs, is gone, or the kernel does not say."""
    try:
        with open(f"{proc}/{pid}/wchan", "rb") as f:
            name = f.read(128).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return name if name.isidentifier() else ""


def is_fuse_wait(name: str) -> bool:
    """Whether the kernel function *name* (a :func:`wchan`) is a FUSE wait
    (``request_wait_answer`` and ``fuse_*``, fs/fuse/).  Once a FUSE server has
    read a request, its sender waits uninterruptibly until it answers: SIGKILL
    stays pending."""
    return name == "request_wait_answer" or name.startswith("fuse_")


def in_fuse_request(pid: int | str, proc: str = PROC) -> str:
    """The FUSE wait (:func:`is_fuse_wait`) that holds a thread of *pid*, else "".

    Every thread is read: ``/proc/PID/wchan`` is the main thread's alone.  One
    thread in a FUSE wait is enough: the others may wait behind it in the VFS
    (``filename_create``, an inode lock it holds), where no wchan names FUSE.
    Whether FUSE was all that held the process shows once its user's
    connections are aborted: then it ends, or it does not.
    """
    import os
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return ""
    for tid in tids:
        st = stat(f"{pid}/task/{tid}", proc)
        if st is None or not st[1] or st[1][0] != "D":
            continue
        name = wchan(f"{pid}/task/{tid}", proc)
        if is_fuse_wait(name):
            return name
    return ""


def uids(pid: int | str, proc: str = PROC) -> tuple[int, ...] | None:
    """(real, effective, saved, fs uid) of *pid* from ``/proc/PID/status``, None when gone.

    ``status`` does not read the target's memory (no mmap lock): safe on any
    process, unlike ``cmdline`` and ``environ``.
    """
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            line = next((ln for ln in f if ln.startswith(b"Uid:")), b"")
        out = tuple(int(u) for u in line.split()[1:5])
    except (OSError, ValueError):
        return None
    return out if len(out) == 4 else None


SLOW_CAP = 10.0
# The most read of one file: execve(2) bounds argv plus environ to 3/4 of
# _STK_LIM (6 MiB, fs/exec.c), and a process that later points its
# environment at more (prctl PR_SET_MM_MAP: zeros, GiBs) gets no more read.
READ_CAP = 8 << 20


def read_each(paths: list[str], wait: float = 1.0, give_up: int = 4) -> list[bytes | None]:
    """The contents of each of *paths* (None: unreadable, or given up; at most
    :data:`READ_CAP` bytes), read without ever blocking the caller for long.

    For the files of another process that read its memory (``environ``,
    ``cmdline``): the kernel takes that process's mmap lock to read them
    (``access_remote_vm``), and the process's own threads decide how long
    that waits: one that holds the lock for reading while it waits on a FUSE
    server of its user's (a direct read into a FUSE-backed buffer), with
    another queued to write (``mmap``), holds every reader until that server
    answers.  (The pages themselves are read with ``FOLL_ANON`` since Linux
    4.17: a file mapped over them reads as nothing, never as a FUSE request;
    before, it was one.)  The reads run in a worker thread, in order; one
    that is still waiting in the kernel after *wait* seconds is given up (its
    thread is left blocked, in a killable wait that ends with this process,
    and reads nothing more) and a new worker goes on with the next path.
    After *give_up* such paths the rest count as unreadable.  A worker that
    is only slow (runnable, or waiting for the interpreter's lock: a loaded
    node) is waited for, up to :data:`SLOW_CAP` seconds a path: it is no
    user's doing, and a process it skipped would be missed (an MPS daemon
    taken for gone).
    """
    import queue
    import threading
    out: list[bytes | None] = [None] * len(paths)
    i = stuck = 0
    while i < len(paths) and stuck < give_up:
        results: queue.SimpleQueue[tuple[int, bytes | None]] = queue.SimpleQueue()
        tid: list[int] = []
        dropped = threading.Event()

        def work(first: int, results: queue.SimpleQueue[tuple[int, bytes | None]],
                 tid: list[int], dropped: threading.Event) -> None:
            tid.append(threading.get_native_id())
            for j in range(first, len(paths)):
                if dropped.is_set():
                    return              # given up: the next worker reads on
                try:
                    with open(paths[j], "rb") as f:
                        data: bytes | None = f.read(READ_CAP)
                except OSError:
                    data = None
                results.put((j, data))
        threading.Thread(target=work, args=(i, results, tid, dropped), daemon=True,
                         name="sg-proc-read").start()
        waited = 0.0
        while i < len(paths):
            try:
                j, data = results.get(timeout=wait)
            except queue.Empty:
                waited += wait
                if waited < SLOW_CAP and _only_slow(tid):
                    continue
                dropped.set()
                stuck += 1
                i += 1                  # this one does not answer: the next worker skips it
                break
            out[j] = data
            i = j + 1
            waited = 0.0
    return out


def _only_slow(tid: list[int]) -> bool:
    """The worker thread (*tid*: its native id, once it has run) is not blocked in a
    read: not started yet, runnable (``R``), or waiting for the interpreter's lock
    (a futex)."""
    if not tid:
        return True
    me = f"self/task/{tid[0]}"
    s = state(me)
    return s == "R" or (s == "S" and wchan(me).startswith("futex"))


def parent_slurmd(max_depth: int = 3, proc: str = PROC) -> str | None:
    """``pid:starttime`` of the slurmd that started us (HealthCheckProgram), else None.

    Looks a few generations up, so a wrapper script that runs us as a child
    instead of exec'ing still counts.
    """
    import os                           # not at import: the bound step reads boot_id only
    pid = os.getppid()
    for _ in range(max_depth):
        if pid <= 1:
            return None
        st = stat(pid, proc)
        if st is None or len(st[1]) < 20:
            return None
        comm, fields = st
        if comm == "slurmd":
            return f"{pid}:{fields[19]}"
        try:
            pid = int(fields[1])
        except ValueError:
            return None
    return None
