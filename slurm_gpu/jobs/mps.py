"""One MPS control daemon per job per node, run as the job user.

Start (prolog): per-job ``<base>/<jobid>/{pipe,log}`` owned by the user,
mode 0700, under a root-owned base; the daemon started through
``nvidia-cuda-mps-control -d`` as the user (``runner.run(run_as=...)``),
pinned to the GPUs' local CPUs (``runner.run(cpus=...)``), for the job's GPUs only
(``CUDA_VISIBLE_DEVICES``); then one client session, retried until the
daemon answers, sends ``get_server_list`` and the admin's defaults.

Stop (epilog): ``quit`` through the control pipe with a bounded wait, then
SIGKILL whatever is left among the processes bound to this job's pipe
directory (found through ``/proc/<pid>/environ``, so a lost state file or a
slurmd restart cannot hide a daemon), remove the directories, restore the
compute mode.

Everything talks to the daemon through the binary's client mode, exactly
as an admin would (``echo quit | nvidia-cuda-mps-control``), so the code runs
unchanged against the real binary (which the tests use without a GPU, see
:mod:`slurm_gpu_devkit.sim.mps_real`) or the stand-in (:mod:`slurm_gpu_devkit.sim.mps_control`).
"""
from __future__ import annotations

import os
import shutil
import stat
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, NoReturn

    from .state import MpsRecord

from .. import runner
from ..errors import CommandError, HardwareError
from ..hw.plain import Plain
from ..runner import RunAs
from .mpsprocs import (_alive, _ids, _kill, _same, children_of_ours,  # noqa: F401 - _alive: re-exported
                       daemon_pids, daemon_procs, daemon_tree, wait_gone)
from .settings import MpsSettings


class JobUser(Plain):
    __slots__ = ("uid", "gid", "name", "groups")
    _defaults = {"groups": ()}
    uid: int
    gid: int
    name: str
    groups: tuple[int, ...]

    def run_as(self) -> RunAs:
        return RunAs(self.uid, self.gid, self.groups)


# What NVIDIA's launcher (``-d``) prints, exiting 1, when it cannot use its
# pipe directory: seen with the real binary for a directory its owner made
# mode 000, one mounted over, and a filesystem out of inodes.
PIPE_INACCESSIBLE = "Cannot access CUDA_MPS_PIPE_DIRECTORY"


# Paths are strings here: pathlib (with urllib.parse and ipaddress) costs
# every prolog and epilog ~3 ms of imports.
def job_dir(base: str, jobid: str) -> str:
    return os.path.join(base, str(jobid))


def _root_dir(d: str) -> bool:
    """*d* is a real directory (not a symlink) owned by root and not writable by others."""
    try:
        st = os.lstat(d)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def _ensure_base(base: str) -> None:
    """The base must be a real directory owned by root and not writable by others,
    under directories only root can change (:mod:`slurm_gpu.jobs.trust`)."""
    from .trust import untrusted_ancestor
    bad = untrusted_ancestor(base)
    if bad:
        raise HardwareError("MPS base directory lies under a directory that users other "
                            f"than root can change ({bad})", str(base))
    _make_searchable(base)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise HardwareError("MPS base directory must be a root-owned directory not writable "
                            "by others", str(base))


def _make_searchable(base: str) -> None:
    """Make *base* and its missing parents 0755 whatever the umask (slurmd's may
    be 077, which would shut every job's user out of their pipe directory)."""
    missing = []
    d = os.path.abspath(base)
    while not os.path.lexists(d):
        missing.append(d)
        d = os.path.dirname(d)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o755)
        except FileExistsError:
            continue
        os.chmod(d, 0o755)


def _closed_to_others(base: str) -> str | None:
    """The first of *base* and its parents (as named, and with symlinks resolved)
    that others cannot search, or None."""
    for d in (os.path.abspath(base), os.path.realpath(base)):
        while True:
            try:
                if not os.stat(d).st_mode & stat.S_IXOTH:
                    return d
            except OSError:
                return d
            if d == "/":
                break
            d = os.path.dirname(d)
    return None


def make_dirs(settings: MpsSettings, jobid: str, user: JobUser) -> tuple[str, str]:
    """Create ``<base>/<jobid>/pipe`` and ``log`` for *user* (0700); root owns the job dir.

    A full filesystem (ENOSPC, EDQUOT) fails the job, never the node: any
    job's user can fill ``/run`` through their own pipe directory, and
    their epilog removes what they wrote with it.
    """
    try:
        return _make_dirs(settings, jobid, user)
    except OSError as e:
        from .state import FULL, JobFailed
        if e.errno not in FULL:
            raise
        from .mpsdir import mount_point
        raise JobFailed(f"--gpu-mps: the filesystem {mount_point(settings.base_dir)} is full "
                        f"({e.strerror}): the job's MPS directories cannot be made",
                        f"job {jobid}") from None


def _make_dirs(settings: MpsSettings, jobid: str, user: JobUser) -> tuple[str, str]:
    _ensure_base(settings.base_dir)
    jd = job_dir(settings.base_dir, jobid)
    try:
        os.mkdir(jd, 0o755)
    except FileExistsError:
        st = os.lstat(jd)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
            raise HardwareError("unexpected MPS job directory", str(jd)) from None
        # An earlier run's (requeued; its epilog left it for a mount it could
        # not detach): root's first, its mounts detached, before the walk below.
        _disown(jd)
        from .mpsdir import detach_mounts
        _done, stuck = detach_mounts(jd)
        if stuck:
            from .state import JobFailed
            raise JobFailed(f"--gpu-mps: mounts the job's user made in {jd} cannot be "
                            f"detached ({'; '.join(stuck)})", f"job {jobid}")
    os.chmod(jd, 0o755)
    out = []
    for name in ("pipe", "log"):
        d = os.path.join(jd, name)
        if os.path.lexists(d):
            shutil.rmtree(d) if not os.path.islink(d) else os.unlink(d)
        os.mkdir(d, 0o700)
        os.chown(d, user.uid, user.gid)
        os.chmod(d, 0o700)
        out.append(d)
    return out[0], out[1]


def _env(pipe: str, log: str, devices: str | None) -> dict[str, str]:
    env = {"PATH": runner.SAFE_PATH, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
           "CUDA_MPS_LOG_DIRECTORY": str(log), "HOME": "/"}
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = devices
    return env


def control(settings: MpsSettings, user: JobUser, pipe: str, log: str, command: str,
            timeout: float = 5.0, check: bool = True) -> runner.Completed:
    """Send one command through the control pipe as the job user."""
    return runner.run([settings.control], timeout, input=command + "\n",
                      env=_env(pipe, log, None), run_as=user.run_as(), check=check)


def check_usable(settings: MpsSettings) -> None:
    """Raise JobFailed when this node cannot give a job its MPS daemon for a reason
    that is not a fault: MPS switched off, or NVIDIA's binary not installed here."""
    from .state import JobFailed
    if not settings.enabled:
        raise JobFailed("--gpu-mps is disabled on this cluster", "[mps] enabled")
    ctl = settings.control
    found = [ctl] if "/" in ctl else [os.path.join(d, ctl) for d in runner.SAFE_PATH.split(":")]
    if not any(os.path.isfile(p) and os.access(p, os.X_OK) for p in found):
        raise JobFailed("--gpu-mps: this node has no MPS control binary", ctl)


def _cpu_list(cpus: list[int]) -> str:
    return ",".join(str(c) for c in sorted(set(cpus)))


def start(settings: MpsSettings, jobid: str, user: JobUser, devices: str | None,
          cpus: list[int], percentage: int | None, record: Callable[[MpsRecord], None],
          sluid: str | None = None, gpu_minors: list[int] | None = None) -> MpsRecord:
    """Start the job's daemon; *record* is called with the state after each step.

    The daemon execs inside ``<job cgroup>/slurm_gpu_mps`` when the job's
    cgroup exists already (:mod:`.jobcgroup`); else inside a root-owned
    holding cgroup of the job's (:func:`.jobcgroup.hold_dirs`), from which
    the SPANK plugin moves all of it there from the job's first step.  On
    cgroup v2 the hold refuses every GPU device but the job's (*gpu_minors*,
    :mod:`.devprog`).
    """
    if user.uid == 0:
        from .state import JobFailed
        raise JobFailed("--gpu-mps is refused for root's jobs: the daemon never runs as root",
                        f"job {jobid}")
    pipe, log = make_dirs(settings, jobid, user)
    info: MpsRecord = {"pipe_dir": str(pipe), "log_dir": str(log),
                            "job_dir": str(job_dir(settings.base_dir, jobid)),
                            "control": settings.control, "devices": devices or "",
                            "cpus": _cpu_list(cpus), "pids": [], "ready": False,
                            "percentage": percentage, "sluid": sluid or None}
    from . import jobcgroup
    dirs = jobcgroup.job_dirs(jobid, user.uid, sluid, _node_name())
    cgroups = jobcgroup.make(dirs) if dirs else []
    hold = [] if cgroups else _make_hold(jobid)
    info["cgroup"] = cgroups or None
    info["hold"] = hold or None
    if hold:
        info["hold_devices"] = _limit_hold(hold, gpu_minors)
    record(info)
    online = os.sched_getaffinity(0)
    use = sorted({c for c in cpus if c in online}) if settings.bind_cpus else []
    # The daemon is known by the process we start, never by its environment
    # (any process of the user can name the pipe directory in its own):
    # ``-d`` forks, and the daemon it leaves behind is orphaned, so as a
    # subreaper we get it as our child; nothing else of the user's can
    # become one.  Without subreapers (Linux < 3.4), the environment scan.
    # The intermediate process -d leaves is our zombie until the prolog
    # exits (init reaps it then): reaping it would cost another /proc pass.
    from .libc import set_child_subreaper
    reaper = set_child_subreaper(True)
    try:
        return _start_daemon(settings, jobid, user, devices, percentage, record, info, pipe, log,
                             cgroups + hold, use, reaper)
    finally:
        if reaper:
            set_child_subreaper(False)


def _make_hold(jobid: str) -> list[str]:
    """The job's holding cgroup, made (empty: no cgroup filesystem here).

    Without it the daemon would wait for the job's first step in slurmd's
    cgroup, where any process it forks and orphans (the user can make it,
    through ptrace) is never moved into the job nor ended by the epilog.
    """
    from . import jobcgroup
    dirs = jobcgroup.hold_dirs(jobid, _node_name())
    for d in dirs:
        # One an earlier run of the job left (requeued here; its epilog could not
        # remove it) keeps that run's device limit: made afresh when empty (what
        # is still in it the epilog ends).
        try:
            os.rmdir(d)
        except OSError:
            pass
    try:
        return jobcgroup.make_hold(dirs)
    except OSError as e:
        raise HardwareError(f"cannot make the MPS daemon's holding cgroup: "
                            f"{e.strerror or e}", dirs[0] if dirs else None) from None


def _limit_hold(hold: list[str], gpu_minors: list[int] | None) -> str:
    """Give the hold the job's GPU limit where it is cgroup v2; what it got, in words.

    The daemon opens no GPU before a client's server starts, and clients come
    from the job's steps, which move it out first (where Slurm makes no job
    cgroup, proctrack/linuxproc, it serves them from here: the job's own GPUs
    stay open).  cgroup v2: a device program (:mod:`.devprog`); v1: the
    hold's devices-hierarchy directory's ``devices.deny``.  Without a limit
    (no v1 devices hierarchy, a kernel that refuses, minors unknown) the job
    runs as before, and this says so
    (``job show``): the daemon's GPU reach until the first step is then
    what Yama's ptrace_scope leaves a user (docs/mps-mig.md).
    """
    from . import jobcgroup
    v2 = [h for h in hold if jobcgroup.version(h) == 2]
    v1 = [h for h in hold if h not in v2 and os.path.exists(os.path.join(h, "devices.deny"))]
    if not v1 and not v2:
        return "not limited: no v1 devices hierarchy for the hold"
    if gpu_minors is None or not all(isinstance(m, int) for m in gpu_minors):
        return "not limited: the job's GPU minor numbers are unknown"
    from .devprog import limit_gpus, limit_gpus_v1
    try:
        for h in v2:
            limit_gpus(h, gpu_minors)
        for h in v1:
            limit_gpus_v1(h, gpu_minors)
    except OSError as e:
        return f"not limited: the kernel refused the device limit ({e.strerror or e})"
    return "the job's GPUs only (" + ",".join(f"/dev/nvidia{m}" for m in sorted(gpu_minors)) + ")"


def _start_daemon(settings: MpsSettings, jobid: str, user: JobUser, devices: str | None,
                  percentage: int | None, record: Callable[[MpsRecord], None],
                  info: MpsRecord, pipe: str, log: str, cgroups: list[str], use: list[int],
                  reaper: bool) -> MpsRecord:
    from . import jobcgroup

    def daemon() -> dict[int, tuple[int, int]]:
        return children_of_ours(user.uid) if reaper else daemon_procs(pipe, user.uid)

    t0 = time.monotonic()
    argv = [settings.control, "-d"]
    # Children we had before the launch are not of it (tests run many prologs in
    # one process; a prolog has none).
    from .mpsprocs import _my_children
    before = frozenset(_my_children()) if reaper else frozenset()
    try:
        res = runner.run(argv, settings.start_timeout, env=_env(pipe, log, devices),
                         run_as=user.run_as(), join_cgroups=jobcgroup.procs_files(cgroups),
                         cpus=use, check=False)
    except runner.TimedOut as e:
        _client_users_doing(jobid, "launcher", e, user.uid)
        _launcher_failed(settings, jobid, pipe, user.uid, before, f"timed out after {settings.start_timeout:g} s",
                         said=False)
    _client_killed(jobid, "launcher", res)
    if not res.ok:
        inaccessible = PIPE_INACCESSIBLE in res.stdout or PIPE_INACCESSIBLE in res.stderr
        if inaccessible:
            # A base that shuts job users out is the admin's to fix (it fails
            # every --gpu-mps job); it and its parents are root's, so what
            # they are now is what they were at the launch.
            closed = _closed_to_others(settings.base_dir)
            if closed:
                raise HardwareError(f"MPS base directory is not searchable by job users "
                                    f"({closed} lacks the x bit for others)", settings.base_dir)
        said = runner.first_line(res)
        _launcher_failed(settings, jobid, pipe, user.uid, before,
                         f"failed: {said or f'exit status {res.returncode}'}",
                         said=said is not None, inaccessible=inaccessible)
    # One client session both asks whether the daemon answers and applies
    # the admin's defaults: the client reads stdin line by line and sends
    # every command over one connection (NVIDIA's 535 binary: one "NEW UI"
    # in control.log, each "Cmd:" answered in order, exit 0).  It exits 1
    # with "Cannot find MPS control daemon process" before sending anything
    # while the daemon is not listening yet, so a retry never applies a
    # setting twice half-way; the settings are idempotent anyway.
    session = "\n".join(["get_server_list"] + _settings_commands(settings, devices, percentage))
    deadline = t0 + settings.start_timeout
    delay = 0.002
    # Looked for at once: -d returns after the fork, so the daemon is up now
    # unless someone already ended it.  Seen here, its vanishing later is the
    # job user's doing even when it was killed before it wrote its first log
    # line (the only other evidence that it started).
    procs = daemon()
    seen = bool(procs)
    while True:
        try:
            res = control(settings, user, pipe, log, session, check=False,
                          timeout=max(0.5, deadline - time.monotonic()))
        except runner.UserLimited:
            raise           # the user's processes fill their RLIMIT_NPROC: it says so
        except CommandError as e:
            # No answer in time.  The client runs as the job's user (as
            # root it would connect to whatever the user put in their pipe
            # directory), so any process of that user can stop it, or kill
            # it (below): their doing, never the node's.
            _client_users_doing(jobid, "client", e, user.uid)
            # A daemon that is stopped (SIGSTOP, or a
            # ptrace stop, from another process of its user: only they and
            # root can) never answers, nor do sockets of the user's own put
            # in place of the daemon's: the user's doing, which must never
            # drain the node.  Nor does one that runs: another process of
            # its user can hold its control socket with a silent connection
            # (connected as the socket appears), or ptrace it; and the
            # control daemon touches no GPU before a client's server starts,
            # so its silence proves no node fault.
            alive = daemon()
            _users_doing(jobid, pipe, alive)
            if not alive:
                raise
            from .state import JobFailed
            raise JobFailed(f"MPS control daemon runs but did not answer ({e.what}; a process of the "
                            "job's user may hold its socket)", f"job {jobid}") from None
        if res.ok:
            break
        _client_killed(jobid, "client", res)
        procs = daemon()
        if procs:
            seen = True
        elif seen or _log_says_started(log, user.uid):
            # It started and is gone before answering.  The control daemon
            # touches no GPU before a client connects, and only its own user
            # (or root) can signal it: a user's mistake, which must never
            # drain the node.
            from .state import JobFailed
            raise JobFailed("MPS control daemon exited before it answered "
                            "(stopped by a process of the job's user?)", f"job {jobid}")
        elif reaper:
            _ended_early(jobid, user.uid, before)
        if time.monotonic() > deadline:
            _users_doing(jobid, pipe, procs)
            if procs:
                # Ours, alive, and never reached: what stands between it and
                # its clients (its directories, their modes, its sockets) is
                # the job user's to change and put back, and the control
                # daemon touches no GPU before a client's server starts.
                from .state import JobFailed
                raise JobFailed(f"MPS control daemon runs but did not answer within "
                                f"{settings.start_timeout:g} s (its directories are the job's "
                                "user's)", f"job {jobid}")
            raise HardwareError(f"MPS control daemon did not answer within "
                                f"{settings.start_timeout:g} s", str(pipe))
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    info["start_s"] = round(time.monotonic() - t0, 4)
    # The control daemon, as last scanned: it starts nothing more until a
    # client connects (the server then), and the epilog finds what is bound
    # to the pipe by scanning again, and by this record (the daemon by PID
    # and start time, even if it scrubbed its environment).
    procs = procs or daemon()
    info["pids"] = sorted(procs) if procs else daemon_pids(pipe)
    info["daemon"] = [[p, procs[p][0]] for p in sorted(procs)] if reaper else []
    info["ready"] = True
    record(info)
    return info


def _launcher_failed(settings: MpsSettings, jobid: str, pipe: str, uid: int, before: frozenset[int],
                     what: str, *, said: bool, inaccessible: bool = False) -> NoReturn:
    """Raise JobFailed for a launcher (``-d``) that failed or timed out (*what*), most
    precise cause first; *said*: it printed something, *inaccessible*: that it cannot
    use its pipe directory (``PIPE_INACCESSIBLE``).

    Everything the launcher waits on is the job user's: their directories
    (a mount, chmod, a planted entry or a lock on ``control_lock``: "An
    instance of this daemon is already running"; a full filesystem, perhaps
    emptied again by now) and their daemon, which signals the launcher once
    it listens (killed, stopped or traced before then, the launcher exits 1
    without a word or waits until its time is up).  None of it touches a GPU
    (the control daemon does only for a client's server), so a failed launch
    is never a proven node fault; a binary that cannot run at all is
    (``runner.run`` raises that), and so is a base closed to job users.
    """
    _dirs_users_doing(jobid, pipe)
    _planted(jobid, pipe)
    from .state import JobFailed
    if inaccessible:
        raise JobFailed("MPS control daemon could not start: it cannot access its pipe "
                        "directory, which is the job's user's (changed by a process of "
                        "theirs?)", f"job {jobid}")
    if not said:
        # The launcher said nothing: its daemon ended before it signalled
        # (killed, or quit) says more, where it was collected.
        _ended_early(jobid, uid, before)
    raise JobFailed(f"MPS control daemon could not start: {os.path.basename(settings.control)} -d "
                    f"{what} (its directories and daemon are the job's user's)", f"job {jobid}")


def _planted(jobid: str, pipe: str) -> None:
    """Raise JobFailed when the pipe directory holds what the daemon did not make."""
    from .mpsdir import planted
    why = planted(pipe)
    if why:
        # The directory was empty a moment ago: another process of the
        # job's user filled it (a directory where a socket goes).
        from .state import JobFailed
        raise JobFailed(f"MPS control daemon could not start: its pipe directory was "
                        f"changed by a process of the job's user ({why})", f"job {jobid}")


def _ended_early(jobid: str, uid: int, before: frozenset[int]) -> None:
    """Raise JobFailed when a process that -d left (ours, as subreaper) ended badly.

    Gone before it was ever scanned, with its control.log removed (the log
    directory is the user's), the daemon leaves one trace the user cannot
    remove: its exit status, which only its parent, the prolog, collects.
    -d's intermediate process ends with 0; a daemon killed or failing before it
    answered never touched a GPU (the control daemon does so only for a
    client's server), so it is no node fault.
    """
    from .mpsprocs import reap_ended_children
    # A signal first: it names the cause (another of -d's processes may exit 1
    # then); the daemon (its own session's leader: it calls setsid, -d's
    # intermediate process does not) counts whatever its status: told to quit
    # by its user, it exits 0.
    ended = sorted(reap_ended_children(uid, before), key=lambda e: (not os.WIFSIGNALED(e[0]), not e[1]))
    for status, leader in ended:
        if os.WIFSIGNALED(status):
            how = f"killed by signal {os.WTERMSIG(status)}"
        elif os.WIFEXITED(status) and (os.WEXITSTATUS(status) or leader):
            how = f"exit status {os.WEXITSTATUS(status)}"
        else:
            continue
        from .state import JobFailed
        raise JobFailed(f"MPS control daemon exited before it answered ({how}; by a process "
                        "of the job's user?)", f"job {jobid}")


def _client_users_doing(jobid: str, which: str, e: CommandError, uid: int) -> None:
    """Raise JobFailed when *e* is the time out of a launcher or client that was stopped,
    or that was given up in a FUSE wait while the job's user has a FUSE mount; raise
    HardwareError when it was given up stuck anywhere else in the kernel.

    Both run as the job's user: only that user's processes (or root) can
    stop them.  Their real uid cannot be kept root to prevent it: execve
    copies the effective uid into the saved one, which kill(2) compares.
    """
    if getattr(e, "stopped", False):
        from .state import JobFailed
        raise JobFailed(f"MPS control {which} was stopped before the daemon answered "
                        "(by a process of the job's user?)", f"job {jobid}") from None
    if not getattr(e, "stuck", False):
        return
    # Killed at its time out and still there.  In a FUSE wait while the job's
    # user has a FUSE mount: theirs holds it (what runs as them reaches only
    # their directories, where they can mount one).  A site's FUSE (root's:
    # CVMFS, a virtiofs root), a driver or a disk: the node's.
    from ..procfs import is_fuse_wait
    from .mpsdir import user_fuse_mounts
    blocked = getattr(e, "blocked_in", "")
    if is_fuse_wait(blocked) and user_fuse_mounts(uid):
        from .state import JobFailed
        raise JobFailed(f"MPS control {which} could not be ended after its time out: it is blocked "
                        f"in a FUSE request ({blocked}) (by a process of the job's user?)",
                        f"job {jobid}") from None
    raise HardwareError(f"MPS control {which} could not be ended after its time out (blocked in "
                        f"the kernel{', in ' + blocked if blocked else ''})", f"job {jobid}") from None


def _client_killed(jobid: str, which: str, res: runner.Completed) -> None:
    """Raise JobFailed when the launcher or a client (*res*) was ended by a signal.

    NVIDIA's binary ignores SIGPIPE and the runner kills nothing but on its
    time out (raised, not returned): a signal came from root or from a
    process of the job's user, who can signal what runs as them.
    """
    if res.returncode < 0:
        from .state import JobFailed
        raise JobFailed(f"MPS control {which} was killed by signal {-res.returncode} before "
                        "the daemon answered (by a process of the job's user?)", f"job {jobid}")


def _users_doing(jobid: str, pipe: str, procs: dict[int, Any]) -> None:
    """Raise JobFailed when the daemon (*procs*, ours) is silent through its user's doing."""
    from .state import JobFailed
    if _stopped(procs):
        raise JobFailed("MPS control daemon was stopped before it answered "
                        "(by a process of the job's user?)", f"job {jobid}") from None
    # The most precise cause first: a mount over the directories hides their
    # sockets, and a mode refuses them.
    _dirs_users_doing(jobid, pipe)
    # make_dirs made both 0700; only their owner (the job's user) or root
    # changes a mode, and a client refused a directory finds no daemon.
    for name, d in (("pipe", pipe), ("log", os.path.join(os.path.dirname(pipe), "log"))):
        try:
            mode = stat.S_IMODE(os.lstat(d).st_mode)
        except OSError:
            continue
        if mode != 0o700:
            raise JobFailed(f"MPS control daemon cannot be reached: its {name} directory was made "
                            f"mode {mode:03o} by a process of the job's user", f"job {jobid}") from None
    from .mpsdir import sockets_tampered
    why = sockets_tampered(pipe, sorted(procs)) if procs else None
    if why:
        raise JobFailed(f"MPS control daemon runs but its sockets are gone ({why}; by a "
                        "process of the job's user?)", f"job {jobid}") from None


def _dirs_users_doing(jobid: str, pipe: str) -> None:
    """Raise JobFailed when the daemon's directories keep it from starting through a user's
    doing: a mount over them (only the job's user mounts there: FUSE), or their
    filesystem filled (through a pipe directory, any job user's own)."""
    from .mpsdir import full_filesystem, mounted_over
    from .state import JobFailed
    jd = os.path.dirname(pipe)
    what = mounted_over(jd)
    if what:
        raise JobFailed(f"MPS control daemon could not start: {what} was mounted over by a "
                        "process of the job's user", f"job {jobid}") from None
    full = full_filesystem(jd)
    if full:
        raise JobFailed(f"MPS control daemon could not start: the filesystem {full} of its "
                        "directories is full", f"job {jobid}") from None


def _stopped(procs: dict[int, Any]) -> bool:
    """Some of *procs* is stopped or traced (``T``/``t`` in ``/proc/PID/stat``)."""
    from ..procfs import state
    return any(state(pid) in ("T", "t") for pid in procs)


def _settings_commands(settings: MpsSettings, devices: str | None,
                       percentage: int | None) -> list[str]:
    """The control commands that apply the job's percentage and the admin's defaults."""
    out = []
    pct = percentage or settings.default_active_thread_percentage or None
    if pct:
        out.append(f"set_default_active_thread_percentage {pct}")
    if settings.pinned_mem_limit:
        ndev = len(devices.split(",")) if devices else 1
        out += [f"set_default_device_pinned_mem_limit {d} {settings.pinned_mem_limit}"
                for d in range(ndev)]
    return out


def _log_says_started(log: str, uid: int) -> bool:
    """The daemon's control.log records its start (real binary and stand-in:
    "Starting control daemon using socket <pipe>/control").

    The log directory is the user's: only a regular file of theirs is read,
    never through a symlink, never blocking on a FIFO planted there.
    """
    from .mpsdir import read_own_file
    head = read_own_file(os.path.join(log, "control.log"), uid)
    return head is not None and b"Starting control daemon" in head


def stop(settings: MpsSettings, info: MpsRecord | None, jobid: str, user: JobUser | None,
         kill_wait: float = 2.0) -> list[str]:
    """Stop the job's daemon and remove its directories; idempotent.  Returns notes."""
    notes: list[str] = []
    jd = job_dir(settings.base_dir, jobid)
    recorded = str(info["job_dir"]) if info and info.get("job_dir") else jd
    if recorded != jd:
        from pathlib import Path    # rare: the one place that compares paths by their parts
        rp = Path(recorded)
        if rp == Path(jd):
            pass
        elif rp.name == str(jobid) and rp.is_absolute() and _root_dir(str(rp.parent)):
            # Made under an earlier base_dir: removed as root only when it still
            # has the shape make_dirs gives it (<root-owned base>/<jobid>).
            jd = str(rp)
        else:
            notes.append(f"MPS: ignored recorded directory {recorded!r}")
    pipe = os.path.join(jd, "pipe")
    log = os.path.join(jd, "log")
    # A mount the user made inside (FUSE) would hang or block the walks
    # below: detached first, whatever it is.
    from .mpsdir import detach_mounts
    detached, _stuck = detach_mounts(jd)      # tried again below, once the directory is root's
    if detached:
        notes.append(f"MPS: detached mounts the job's user made in {jd}: {', '.join(detached)}")
    # Whose processes may be signalled: the job user's (the pipe directory's
    # owner when the environment and the state file lost it), never root's.
    uid = user.uid if user is not None else None
    if uid is None:
        try:
            uid = os.lstat(pipe).st_uid
        except OSError:
            uid = None
    # Found by scan: the state's recorded PIDs may since have been recycled.
    # The scan finds what still has the pipe directory in its environment;
    # the process tree below it adds children that dropped it.
    procs = daemon_tree(pipe, uid) if uid != 0 and os.path.exists(jd) else {}
    elsewhere = _other_job(info, jobid)
    if procs:
        # A process in another job's cgroup is that job's, whatever its
        # environment names: its user can put this pipe directory there.
        procs = {p: i for p, i in procs.items() if not elsewhere(p)}
    # The daemon the prolog started, by PID and start time: found even when
    # its environment no longer names the pipe directory.
    for pid, ident in recorded_daemon(info, uid).items():
        procs.setdefault(pid, ident)
    if procs and user is not None and os.path.isdir(pipe):
        try:
            control(settings, user, pipe, log, "quit", timeout=settings.quit_timeout,
                    check=False)
        except CommandError as e:
            notes.append(f"MPS quit: {e.what}")
        wait_gone(procs, settings.quit_timeout)
    left = {p: i for p, i in procs.items() if _same(p, *i)}
    if left:
        notes.append(f"MPS: killed stragglers {','.join(map(str, sorted(left)))}")
        for p, i in left.items():
            _kill(p, *i)
        wait_gone(left, kill_wait)
        alive = sorted(p for p, i in left.items() if _same(p, *i))
        notes += _in_users_fuse(alive, uid, kill_wait, elsewhere)
        if alive:
            # Stuck in the kernel (a hung driver call): a node fault.  The
            # directory and the state stay, so the next epilog tries again.
            raise HardwareError(f"MPS processes {','.join(map(str, alive))} survive SIGKILL "
                                f"for {kill_wait:g} s", str(pipe))
    notes += _end_cgroups(info, jobid, uid, kill_wait)
    # Root's from here, mode 0700 all the way down: the user can make no
    # new entry there, nor reach it to mount on (fusermount3 resolves and
    # checks the mount point as the user).  What they mounted since the
    # detach above (while the daemon quit) is detached now, before the
    # removal walks the tree: never into a mount of theirs.
    _disown(jd)
    late, stuck = detach_mounts(jd)
    if late:
        notes.append(f"MPS: detached mounts the job's user made in {jd}: {', '.join(late)}")
    if stuck or not _remove_job_dir(jd):
        # Not the node's fault, and nothing of the job runs any more: the
        # directory stays, root's, and the next prolog's sweep (or
        # `slurm-gpu job cleanup`) finds it by its name and tries again.
        why = "; ".join(stuck) or "a mount is left below it"
        notes.append(f"MPS: mounts in {jd} could not be detached ({why}): the directory is left")
    return notes


def _other_job(info: MpsRecord | None, jobid: str) -> Callable[[int], str | None]:
    """The Slurm job directory of a pid's cgroup when it is another job's than *jobid*'s,
    else None (this job's, none, or gone)."""
    from ..slurmcgroup import SLUID, job_dir_of_pid
    sluid = (info or {}).get("sluid")
    sluid = sluid if isinstance(sluid, str) else None

    def elsewhere(pid: int) -> str | None:
        d = job_dir_of_pid("/proc", pid)
        if d is None or d == f"job_{jobid}" or d == sluid:
            return None
        # A SLUID-named directory (26.05) counts as another job's only
        # when this job's own SLUID is known (no record: it may be ours).
        return d if sluid is not None or not SLUID.fullmatch(d) else None
    return elsewhere


def _users_other_jobs(uid: int, elsewhere: Callable[[int], str | None]) -> list[str]:
    """The other jobs' directories (:func:`_other_job`) where processes of *uid* run.

    Run: alive and not themselves held in FUSE.  A leftover an earlier epilog
    noted (held there, past its kill) is no job at work, and would otherwise
    keep the abort off for every later job of the user's on the node.
    """
    from ..procfs import alive, in_fuse_request
    from .mpsprocs import _table
    found = set()
    for pid, (ids, _ppid) in _table().items():
        if ids[0] == uid and (d := elsewhere(pid)) and alive(pid) and not in_fuse_request(pid):
            found.add(d)
    return sorted(found)


def recorded_daemon(info: MpsRecord | None, uid: int | None) -> dict[int, tuple[int, int]]:
    """The daemon the prolog recorded (PID, start time), while that process still runs as *uid*."""
    out: dict[int, tuple[int, int]] = {}
    if uid is None or uid == 0:
        return out
    for rec in (info or {}).get("daemon") or ():
        if isinstance(rec, list) and len(rec) == 2 and all(type(x) is int for x in rec) \
                and _same(rec[0], rec[1], uid):
            out[rec[0]] = (rec[1], uid)
    return out


def _node_name() -> str:
    """Slurm's name for this node (slurmd's environment, or SPANK's hostctx)."""
    from ..hw.live import node_name
    return node_name()


def _in_users_fuse(alive: list[int], uid: int | None, wait: float,
                   elsewhere: Callable[[int], str | None]) -> list[str]:
    """Take out of *alive* (survivors of SIGKILL) those a FUSE server of the job's user
    holds; notes.

    A process blocked in a FUSE request its server took ignores SIGKILL until
    the server answers.  When the job's user has FUSE mounts, those with
    requests waiting are aborted (fusectl), which ends such a wait, and the
    survivors are looked at again after *wait* s; one still held in FUSE is
    left, with a note (their server, or fusectl not mounted).  Anything else
    stays in *alive*: stuck in a driver, or in a site's FUSE (root's), is the
    node's.  Nothing is aborted while another job of the user's runs here
    (*elsewhere* names its directory): fusectl does not say which job a
    connection serves, and that job's filesystem would fail under it.
    """
    from ..procfs import in_fuse_request
    from .mpsdir import abort_fuse, user_fuse_mounts
    held = [p for p in alive if in_fuse_request(p)]
    mounts = user_fuse_mounts(uid, held) if held and uid else []
    if not mounts or not uid:
        return []
    notes = []
    busy = _users_other_jobs(uid, elsewhere)
    aborted = abort_fuse([c for _m, c in mounts]) if not busy else []
    if aborted:
        notes.append("MPS: aborted FUSE connections of the job's user that held processes past "
                     f"SIGKILL: {', '.join(m for m, c in mounts if c in aborted)}")
        import time
        deadline = time.monotonic() + wait
        while any(_alive(p) for p in held) and time.monotonic() < deadline:
            time.sleep(0.01)
    still = {p: w for p in held if _alive(p) and (w := in_fuse_request(p))}
    alive[:] = [p for p in alive if _alive(p) and p not in still]
    if still:
        notes.append(f"MPS: processes {','.join(map(str, sorted(still)))} survive SIGKILL, blocked "
                     f"in a FUSE request ({', '.join(sorted(set(still.values())))}) while the job's "
                     "user has FUSE mounts: left to end when their server answers"
                     + (f" (not aborted: the job's user has processes in {', '.join(busy)} here)"
                        if busy else ""))
    return notes


def _end_cgroups(info: MpsRecord | None, jobid: str, uid: int | None, wait: float) -> list[str]:
    """End every process in the daemon's cgroups, then remove them; notes.

    The recorded ones, any ``slurm_gpu_mps`` under the job's cgroup and the
    job's holding cgroup (a lost state file, a prolog killed before it
    recorded them).  Whatever is in there is the daemon's tree, whoever it
    runs as now, wherever it went in the process tree.  One held by its
    user's FUSE server (:func:`_in_users_fuse`) keeps its cgroup: nothing
    removes that directory later (empty once the process ends).
    """
    from . import jobcgroup
    found = jobcgroup.mounts()
    points = tuple(p.rstrip("/") + "/" for p, _v, _c in found)
    recorded = [str(c) for c in ((info or {}).get("cgroup") or [])
                if os.path.basename(str(c)) == jobcgroup.NAME and str(c).startswith(points)]
    recorded += [str(c) for c in ((info or {}).get("hold") or [])
                 if jobcgroup.is_hold(str(c), jobid, (p for p, _v, _c in found))]
    node = _node_name()
    dirs = sorted({c for c in recorded if os.path.isdir(c)}
                  | set(jobcgroup.ours(jobid, uid, node=node))
                  | {c for c in jobcgroup.hold_dirs(jobid, node) if os.path.isdir(c)})
    if not dirs:
        return []
    alive = sorted(jobcgroup.kill_all(dirs, wait))
    notes = _in_users_fuse(alive, uid, wait, _other_job(info, jobid)) if alive else []
    if alive:
        raise HardwareError(f"processes {','.join(map(str, alive))} in the MPS cgroup "
                            f"survive SIGKILL for {wait:g} s", dirs[0])
    if not jobcgroup.members(dirs):         # one held in its user's FUSE keeps its cgroup
        jobcgroup.remove(dirs)
    return notes


def _disown(jd: str) -> None:
    """Make every directory under *jd* root's, mode 0700, without following symlinks.

    The user owns pipe/ and log/ and may have made directories below them;
    a process of theirs that is not bound to the pipe (another job's) could
    keep creating entries there, through a directory fd or its cwd, so that
    removing the tree never finishes.  A directory root owns with mode 0700
    takes no new entries from the user, whatever fds they hold.
    """
    try:
        dev = os.lstat(jd).st_dev
    except OSError:
        return
    try:
        for _top, dirs, _files, fd in os.fwalk(jd, follow_symlinks=False):
            try:
                if os.fstat(fd).st_dev != dev:
                    dirs.clear()            # a mount of the user's: detached, never walked
                    continue
                os.fchown(fd, 0, 0)
                os.fchmod(fd, 0o700)
            except OSError:
                pass
    except OSError:
        pass


def _remove_job_dir(jd: str) -> bool:
    """Remove the job's MPS directory (made root's by :func:`_disown`); the user cannot
    keep it alive.  False when a mount below it keeps it (never the node's fault)."""
    for i in range(3):
        if not os.path.lexists(jd):
            return True
        if i:
            _disown(jd)
        shutil.rmtree(jd, ignore_errors=True)    # fd-relative, never follows a symlink
    if not os.path.lexists(jd):
        return True
    from .mpsdir import mounts_below
    if mounts_below(jd):
        return False
    raise HardwareError("cannot remove MPS job directory", str(jd))


def adopt(state_dir: str, jobid: str, sluid: str | None = None) -> list[str]:
    """Move the job's MPS daemon, and everything in its holding cgroup, into
    ``<job cgroup>/slurm_gpu_mps`` (SPANK, as root).

    Called from each step of a ``--gpu-mps`` job in slurmstepd; the first one
    that finds the job's cgroup does the work and records it, the others see
    the record.  Returns the cgroups the daemon is in (empty: none).

    The SLUID (26.05's cgroup name) is the one the prolog recorded from
    slurmd's environment.  *sluid*, the step's ``SLURM_JOB_SLUID``, is not
    used: the step's environment is the user's, and another job's SLUID
    named there would move the daemon into that job's cgroup, whose
    ``slurm_gpu_mps`` this job's epilog then ends.
    """
    from . import jobcgroup
    from . import state as jobstate
    st = jobstate.load(state_dir, jobid)
    info: MpsRecord = (st.mps if st else None) or {}
    if st is None or not info.get("pipe_dir") or info.get("cgroup") or st.uid is None:
        return list(info.get("cgroup") or [])
    uid = st.uid
    recorded = info.get("sluid")
    node = _node_name()
    dirs = jobcgroup.job_dirs(jobid, uid, recorded if isinstance(recorded, str) else None, node)
    if not dirs:
        return []
    cg = jobcgroup.make(dirs)
    # The daemon started in its holding cgroup: everything in there is its
    # own (what it forked, even what left its process tree), and only that.
    # The prolog recorded it; the path is the one it would make (a state
    # file from before holds: its process tree, as then).
    hold = [h for h in jobcgroup.hold_dirs(jobid, node) if h in (info.get("hold") or ())
            and os.path.isdir(h)]
    moved: set[int] = set()
    for _ in range(8 if hold else 3):   # again for anything forked while we moved its parent
        if hold:
            todo = jobcgroup.members(hold) - moved
        else:
            bound = set(daemon_procs(info["pipe_dir"], uid)) | set(recorded_daemon(info, uid))
            todo = jobcgroup.descendants(bound) - moved
        if not todo:
            break
        for pid in sorted(todo):
            try:
                jobcgroup.join(pid, cg)
            except ProcessLookupError:
                pass
            except OSError as e:
                if e.errno != 3:    # ESRCH: it exited meanwhile
                    raise
        moved |= todo
    else:
        if hold:
            # Still forking after every pass: nothing MPS does before its
            # first client; what is new is ended, never left outside the job.
            for pid in jobcgroup.members(hold) - moved:
                jobcgroup.kill_pid(pid)
    for h in hold:
        try:
            os.rmdir(h)
            jobcgroup.remove_hold_parents(h)
        except OSError:
            pass                    # a member is left (a hierarchy without a job dir): the epilog's
    info["cgroup"] = cg
    jobstate.save(state_dir, st)
    return cg
