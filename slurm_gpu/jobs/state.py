"""The per-job record :class:`JobRecord` and its file ``<state_dir>/jobs/<jobid>.json``.

The prolog writes it *before* it creates anything, and each step
(:mod:`slurm_gpu.jobs.steps`) rewrites it (atomically) before it acts, so
whatever a killed prolog managed to create is on record for the epilog.
slurmstepd (through the SPANK plugin) reads it with :func:`load` and gives
each task :func:`task_env`.

The file is versioned: :data:`VERSION` is what this code writes, and every
version in :data:`READABLE` is read, because a prolog of the package version
before an upgrade may have written the record its epilog reads.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import sys

from ..errors import PREFIX, Consequence, InputError, SlurmGpuError
from ..fsutil import WriteError, atomic_write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Literal, TypedDict

    PhaseName = Literal["prolog", "ready", "failed"]

    class GpuFact(TypedDict, total=False):
        """One GPU of the job: Slurm's index, and the GPU by UUID and minor (never NVML's index)."""
        index: int
        uuid: str
        minor: int | None
        name: str
        cpus: list[int]

    class SavedMode(TypedDict):
        mode: int
        minor: int | None

    class MigInstance(TypedDict):
        """One instance the job creates: recorded ("pending", ids None) before it is created."""
        profile: str
        gi_profile_id: int | None
        start: int
        size: int
        gi_id: int | None
        ci_id: int | None
        uuid: str | None

    class MigGpu(TypedDict):
        index: int
        uuid: str
        minor: int | None
        model: str
        baseline: list[dict[str, Any]]     # mig.instances.Existing.to_dict()
        baseline_removed: bool
        instances: list[MigInstance]

    class MpsRecord(TypedDict, total=False):
        """What :func:`slurm_gpu.jobs.mps.start` records, step by step (``ready`` last)."""
        pipe_dir: str
        log_dir: str
        job_dir: str
        control: str                       # the control binary that started it
        devices: str                       # CUDA_VISIBLE_DEVICES for the daemon (UUIDs)
        cpus: str                          # the daemon's CPU list, or ""
        pids: list[int]
        daemon: list[list[int]]            # [[pid, start time]]: the daemon we started
        ready: bool
        percentage: int | None             # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
        sluid: str | None                  # slurmd's SLURM_JOB_SLUID (26.05 cgroup names)
        cgroup: list[str] | None           # the slurm_gpu_mps cgroup dirs it runs in
        hold: list[str] | None             # its holding cgroup until the first step (no RunInJob)
        hold_devices: str                  # the hold's GPU limit, in words (mps._limit_hold)
        start_s: float

    class MigRecord(TypedDict):
        layout: str
        ready: bool
        gpus: list[MigGpu]

# 1: the first; phase any text, error with the "slurm-gpu: " prefix.
# 2: phase one of PHASES, error without the prefix, its consequence beside it.
VERSION = 2
READABLE = (1, 2)


class Phase:
    """Where the job's prolog got to."""

    PROLOG: PhaseName = "prolog"      # written before the first step acts; the steps run
    READY: PhaseName = "ready"        # every step applied: the tasks get the environment
    FAILED: PhaseName = "failed"      # ``error`` says why; the tasks fail with it


PHASES = (Phase.PROLOG, Phase.READY, Phase.FAILED)


class JobRecord:
    """What the job asked for and what this node made for it, in the order made.

    ``mps`` belongs to :mod:`slurm_gpu.jobs.mps` (what ``mps.start`` records);
    ``mig`` and ``compute_mode_saved`` to their steps.  ``uid`` None: a
    stand-in for a job that left an MPS directory but no record (its undo
    finds the daemon by the directory); such a record is never saved.

    A class written out rather than a ``@dataclass`` (it compares and prints
    the same way): the prolog and the epilog of every ``--gpu-mps`` and
    ``--gpu-mig`` job build one, and ``dataclasses`` imports ``inspect``
    (with ``ast``, ``dis`` and ``tokenize``), about a fifth of each of those
    processes (docs/mps-mig.md, "Entry points and cost").
    """

    FIELDS = ("jobid", "uid", "gid", "user", "phase", "gpus", "whole_gpus", "options", "mps",
              "mig", "compute_mode_saved", "error", "consequence", "version")

    def __init__(self, jobid: str, uid: int | None, gid: int | None, user: str,
                 phase: PhaseName = Phase.PROLOG, gpus: list[GpuFact] | None = None,
                 whole_gpus: bool | None = None, options: dict[str, str | None] | None = None,
                 mps: MpsRecord | None = None, mig: MigRecord | None = None,
                 compute_mode_saved: dict[str, SavedMode] | None = None,
                 error: str | None = None, consequence: str | None = None,
                 version: int = VERSION) -> None:
        self.jobid = jobid
        self.uid = uid
        self.gid = gid
        self.user = user
        self.phase: PhaseName = phase
        self.gpus: list[GpuFact] = [] if gpus is None else gpus
        self.whole_gpus = whole_gpus
        self.options = options
        self.mps = mps
        self.mig = mig
        self.compute_mode_saved: dict[str, SavedMode] = ({} if compute_mode_saved is None
                                                         else compute_mode_saved)
        self.error = error                  # one line, without the "slurm-gpu: " prefix
        self.consequence = consequence      # errors.Consequence of error
        self.version = version

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, k) for k in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobRecord) or type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, as a dataclass with eq

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.FIELDS)})"

    def fail(self, message: str, consequence: str) -> None:
        """Record the job's failure: its tasks fail with *message*."""
        self.error = message.removeprefix(PREFIX)
        self.consequence = consequence
        self.phase = Phase.FAILED

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "jobid": self.jobid, "uid": self.uid, "gid": self.gid,
                "user": self.user, "phase": self.phase, "gpus": self.gpus,
                "whole_gpus": self.whole_gpus, "options": self.options, "mps": self.mps,
                "mig": self.mig, "compute_mode_saved": self.compute_mode_saved,
                "error": self.error, "consequence": self.consequence}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        """A record of any :data:`READABLE` version (check it with :func:`malformed` first)."""
        error = data.get("error")
        consequence = data.get("consequence")
        phase = data["phase"]
        if data["version"] == 1:
            # Version 1 kept the prefix in the error and had no consequence:
            # what it recorded as failed was a user error or a node fault
            # under "pass" (both fail the tasks alike).
            error = error.removeprefix(PREFIX) if error is not None else None
            consequence = None
            phase = phase if phase in PHASES else Phase.FAILED if error else Phase.PROLOG
        return cls(jobid=data["jobid"], uid=data["uid"], gid=data["gid"], user=data["user"],
                   phase=phase, gpus=list(data.get("gpus") or []),
                   whole_gpus=data.get("whole_gpus"), options=data.get("options"),
                   mps=data.get("mps"), mig=data.get("mig"),
                   compute_mode_saved=dict(data.get("compute_mode_saved") or {}),
                   error=error, consequence=consequence)

    @classmethod
    def stand_in(cls, jobid: str) -> JobRecord:
        """No record, but an MPS directory: undo what the directory shows."""
        return cls(jobid=check_jobid(jobid), uid=None, gid=None, user="")

    def mig_uuids(self) -> list[str]:
        """The job's MIG device UUIDs in GPU order, then placement order."""
        out: list[str] = []
        for g in self.mig["gpus"] if self.mig else ():
            out.extend(u for i in g.get("instances", []) if (u := i.get("uuid")))
        return out


def _is_jobid(text: str) -> bool:
    """1 to 12 ASCII digits, nothing else (not even a trailing newline)."""
    return 0 < len(text) <= 12 and text.isascii() and text.isdigit()


class JobFailed(SlurmGpuError):
    """The job's GPU request could not be honoured; its tasks must fail."""

    consequence = Consequence.USER


FULL = (errno.ENOSPC, errno.EDQUOT)


class StateFull(SlurmGpuError):
    """The job's record was not written: its filesystem has no block or inode left.

    A node fault as it stands; :meth:`slurm_gpu.jobs.context.Job.save` makes it
    a :class:`RecordFull` where a job user could have filled that filesystem.
    """

    def __init__(self, what: str, where: str, strerror: str) -> None:
        super().__init__(what, where)
        self.strerror = strerror


class RecordFull(JobFailed):
    """The job's record was not written: its filesystem, which also holds the MPS
    directories a job user writes to, is full.  The job fails, the node stays up."""


def check_jobid(jobid: str) -> str:
    """A Slurm job id, refusing anything that could escape the state directory."""
    jobid = str(jobid)
    if not _is_jobid(jobid):
        raise InputError(f"bad job id {jobid!r}", "SLURM_JOB_ID")
    return jobid


# Paths are strings here: pathlib (with urllib.parse and ipaddress) costs
# every prolog and epilog ~3 ms of imports.
def jobs_dir(state_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(state_dir), "jobs")


def path(state_dir: str | os.PathLike[str], jobid: str) -> str:
    return os.path.join(jobs_dir(state_dir), f"{check_jobid(jobid)}.json")


def new(jobid: str, *, uid: int, gid: int, user: str) -> JobRecord:
    """A fresh record (phase ``prolog``)."""
    return JobRecord(jobid=check_jobid(jobid), uid=uid, gid=gid, user=user)


def _trusted(st: os.stat_result) -> bool:
    """Written only by root (or by us, when not root): the epilog acts on what it says."""
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def _check_dir(d: str) -> None:
    from .trust import untrusted_ancestor
    bad = untrusted_ancestor(d)
    if bad:
        raise InputError("job state directory lies under a directory that users other than "
                         f"root can change ({bad})", str(d))
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode) or not _trusted(st):
        raise InputError("job state directory must be a directory owned by root and "
                         "not writable by others", str(d))


def save(state_dir: str | os.PathLike[str], record: JobRecord) -> None:
    """Write *record* atomically (0644: tasks read it as the job user through SPANK)."""
    if record.uid is None:
        raise InputError("a stand-in job record is never saved", f"job {record.jobid}")
    d = jobs_dir(state_dir)
    text = json.dumps(record.to_dict(), indent=1, sort_keys=True)
    jobid = check_jobid(record.jobid)
    try:
        os.makedirs(d, mode=0o755, exist_ok=True)
        _check_dir(d)
        # The copy first: whichever file a crash or a bad sector leaves broken,
        # the other holds this or the previous record (see load()).
        atomic_write(os.path.join(d, f"{jobid}.json{COPY}"), text, mode=0o644)
        atomic_write(os.path.join(d, f"{jobid}.json"), text, mode=0o644)
    except (OSError, WriteError) as e:
        if e.errno not in FULL:
            raise
        why = e.strerror if isinstance(e, OSError) else os.strerror(e.errno or 0)
        raise StateFull(f"cannot write the state of job {jobid}: {why}", d, str(why)) from None


def exists(state_dir: str | os.PathLike[str], jobid: str) -> bool:
    """The job has a record file here (its undo keeps it up to date only then)."""
    return os.path.exists(path(state_dir, jobid))


COPY = ".copy"


def load(state_dir: str | os.PathLike[str], jobid: str,
         warn: Callable[[str], None] | None = None) -> JobRecord | None:
    """The job's state, or None when this node has none for it (or only a corrupt one).

    The epilog, running as root, destroys MIG instances and removes
    directories that the file names, so a file (or directory) anyone but
    root could have written, or a symlink, is refused, never followed.
    """
    p = path(state_dir, jobid)
    _check_dir(os.path.dirname(p))
    data, why = _read(p, str(jobid))
    if data is not None or why is None and not os.path.lexists(_copy(p)):
        return JobRecord.from_dict(data) if data is not None else None
    # The record is missing or broken: its copy, written just before it,
    # still says what the job made (MIG instances, the daemon), so nothing
    # it lists is orphaned.
    copy, why_copy = _read(_copy(p), str(jobid))
    if why:
        _set_aside(p, why, warn)
    if copy is not None:
        if why:
            (warn or (lambda m: print(m, file=sys.stderr)))(
                f"slurm-gpu: warning: job {jobid}: using the copy of its state file ({_copy(p)})")
        return JobRecord.from_dict(copy)
    if why_copy:
        _set_aside(_copy(p), why_copy, warn)
    return None


def _copy(p: str) -> str:
    return p + COPY


def _read(p: str, jobid: str) -> tuple[dict[str, Any] | None, str | None]:
    """(record, None), (None, why it is corrupt), or (None, None) when there is no file."""
    try:
        # O_NONBLOCK: a planted FIFO must not hang the epilog; fstat refuses it below.
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        raise InputError(f"cannot read job state: {e.strerror}", str(p)) from None
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or not _trusted(st):
                raise InputError("job state file must be a regular file owned by root and "
                                 "not writable by others", str(p))
            raw = f.read(MAX_STATE_BYTES + 1)
    except OSError as e:
        raise InputError(f"cannot read job state: {e.strerror or e}", str(p)) from None
    try:
        data = json.loads(raw) if len(raw) <= MAX_STATE_BYTES else None
    except (ValueError, RecursionError):
        data = None
    why = "not JSON or too big" if data is None else malformed(data, jobid)
    if why:
        # A torn or hand-broken record must not fail this job's epilog (a node
        # drain) or every later prolog: it is set aside, with one warning, and
        # the job counts as having no state (what it listed is cleaned up as
        # an orphan) unless its copy is sound.
        return None, why
    return data, None


MAX_STATE_BYTES = 1 << 20


def malformed(data: Any, jobid: str) -> str | None:
    """Why *data* is not a job state record this code wrote (None when it is)."""
    if not isinstance(data, dict):
        return "not an object"
    if data.get("version") not in READABLE or isinstance(data.get("version"), bool):
        return "unknown format"
    if data.get("jobid") != jobid:
        return "names another job"
    for k in ("uid", "gid"):
        v = data.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 32:
            return f"{k} is not an id"
    if not isinstance(data.get("user"), str) or not isinstance(data.get("phase"), str):
        return "user or phase of the wrong type"
    if not isinstance(data.get("error"), (str, type(None))):
        return "error is not text"
    if data["version"] >= 2:
        if data.get("phase") not in PHASES:
            return "unknown phase"
        if data.get("consequence") not in (None, Consequence.USER, Consequence.INPUT,
                                           Consequence.NODE):
            return "unknown consequence"
        if not isinstance(data.get("whole_gpus"), (bool, type(None))):
            return "whole_gpus is not a boolean"
    gpus = data.get("gpus")
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        return "gpus is not a list of records"
    for k in ("mps", "mig", "options", "compute_mode_saved"):
        if not isinstance(data.get(k), (dict, type(None))):
            return f"{k} is not a record"
    mig = data.get("mig") or {}
    mgpus = mig.get("gpus", [])
    if not isinstance(mgpus, list) or not all(isinstance(g, dict) and isinstance(g.get("instances", []), list)
                                              and all(isinstance(i, dict) for i in g.get("instances", []))
                                              for g in mgpus):
        return "mig.gpus is not a list of records"
    return None


def _set_aside(p: str, why: str, warn: Callable[[str], None] | None) -> None:
    aside = p + ".corrupt"
    try:
        os.replace(p, aside)
        where = f"moved to {os.path.basename(aside)}"
    except OSError as e:
        where = f"left in place: {e.strerror}"
    line = f"slurm-gpu: warning: dropped a corrupt job state file ({why}; {where}) ({p})"
    (warn or (lambda m: print(m, file=sys.stderr)))(line)


def _temp_names(names: list[str]) -> list[tuple[str, str]]:
    """(job id, name) of the temporary files a killed :func:`save` left
    (``atomic_write``'s ``.<jobid>.json[.copy].<random>.tmp``): a SIGKILL
    between mkstemp and the rename runs no clean-up."""
    out = []
    for n in names:
        if n.startswith(".") and n.endswith(".tmp") and ".json." in n:
            jobid = n[1:n.index(".json.")]
            if _is_jobid(jobid):
                out.append((jobid, n))
    return out


def remove(state_dir: str | os.PathLike[str], jobid: str) -> None:
    p = path(state_dir, jobid)
    for f in (_copy(p), p):       # the copy first: a crash between leaves the record
        try:
            os.unlink(f)
        except FileNotFoundError:
            pass
    d = os.path.dirname(p)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return
    for j, n in _temp_names(names):
        if j == jobid:
            try:
                os.unlink(os.path.join(d, n))
            except FileNotFoundError:
                pass


def list_jobs(state_dir: str | os.PathLike[str]) -> list[str]:
    """Job ids with a state file on this node."""
    try:
        names = os.listdir(jobs_dir(state_dir))
    except FileNotFoundError:
        return []
    # A job whose save was killed half-way may have only a temporary file left:
    # listed too, so that the sweep tears it down (and remove() takes the file).
    ids = {n[:-5] for n in names if n.endswith(".json") and _is_jobid(n[:-5])}
    ids |= {j for j, _ in _temp_names(names)}
    return sorted(ids, key=int)


def task_share(n_devices: int, local_task_id: int, ntasks: int) -> list[int]:
    """Indices of the devices task *local_task_id* of *ntasks* gets.

    More devices than tasks: contiguous blocks (like ``--gpu-bind=per_task``);
    fewer: round robin, so every task still gets one.
    """
    if n_devices <= 0 or ntasks <= 0:
        return []
    if not 0 <= local_task_id < ntasks:
        raise InputError(f"task id {local_task_id} out of range 0..{ntasks - 1}")
    if n_devices >= ntasks:
        lo = local_task_id * n_devices // ntasks
        hi = (local_task_id + 1) * n_devices // ntasks
        return list(range(lo, hi))
    return [local_task_id % n_devices]


def task_env(state: JobRecord | None, local_task_id: int, ntasks: int) -> dict[str, str]:
    """Environment for one task of the job, from the prolog's work.

    Raises :class:`JobFailed` when the prolog recorded an error, or when it
    never got the record to phase ``ready`` (killed by slurmd's
    ``PrologEpilogTimeout`` or the OOM killer after its first save), so the
    SPANK plugin fails the task with one line instead of running it without
    the MPS daemon or MIG instances the job asked for.  Never overrides what
    Slurm's own gres/mps set (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``): that
    variable is per client and MPS honours it over the daemon default.
    """
    if not state:
        return {}
    if state.error:
        raise JobFailed(state.error)
    if state.phase != Phase.READY:
        # slurmd starts no step while the job's prolog on this node runs
        # (slurmd/req.c, 22.05 to 26.05: a launch waits for it; RunInJob runs
        # it in the extern step, which runs no task_init), so a record short
        # of ready is a prolog that died half-way, never one still working.
        # A launch that waited on a prolog that failed can still start its
        # step (without PrologFlags=Alloc only _rpc_prolog revokes the
        # credential): that step fails here too.
        raise JobFailed(f"the prolog of job {state.jobid} did not finish setting up MPS/MIG "
                        "on this node", f"phase {state.phase}")
    env: dict[str, str] = {}
    mps = state.mps
    if mps and mps.get("ready"):
        env["CUDA_MPS_PIPE_DIRECTORY"] = mps["pipe_dir"]
        env["CUDA_MPS_LOG_DIRECTORY"] = mps["log_dir"]
    uuids = state.mig_uuids()
    if uuids and state.mig and state.mig.get("ready"):
        mine = [uuids[i] for i in task_share(len(uuids), local_task_id, ntasks)]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
        env["SLURM_GPU_MIG_DEVICES"] = ",".join(mine)
    return env


def gpus_held(job_state_dir: str | None) -> dict[str, str]:
    """GPU uuid (and "index:N") -> job id, from our per-job state files; an
    unreadable file shows as "job:<id>" (the repair ladder then counts every GPU as held)."""
    if not job_state_dir:
        return {}
    out: dict[str, str] = {}
    try:
        jobs = list_jobs(job_state_dir)
    except OSError:
        return {}
    for jobid in jobs:
        try:
            st = load(job_state_dir, jobid)
        except Exception:  # noqa: BLE001 - an unreadable job file: the GPU counts as held
            out[f"job:{jobid}"] = jobid
            continue
        for g in st.gpus if st else ():
            if isinstance(g, dict):
                if isinstance(g.get("uuid"), str):
                    out[g["uuid"]] = jobid
                if isinstance(g.get("index"), int):
                    out[f"index:{g['index']}"] = jobid
    return out
