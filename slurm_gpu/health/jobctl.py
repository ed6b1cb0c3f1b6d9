"""The Slurm job calls of ``[health] on_fatal``: which jobs hold a GPU, requeue, cancel, release.

Small functions, one per call, each through :func:`slurm_gpu.runner.run`
with a timeout (``slurm_gpu.slurmclient`` may take them over; the command
paths already come from it).
Every argv is built from values Slurm gave us (job ids) and our own words;
nothing here passes through a shell.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .. import runner
from ..errors import CommandError


def slurm_bin(name: str) -> str:
    """A Slurm client by absolute path: Slurm runs the health check with no PATH."""
    from ..slurmclient import command
    return command(name)


@dataclass
class JobView:
    """What ``scontrol -d show job -o`` says about one job, as far as on_fatal needs it."""

    job_id: str
    state: str                          # JobState= (PENDING, RUNNING, COMPLETING, REQUEUED, ...)
    requeue: bool                       # Requeue=1
    batch: bool                         # BatchFlag=1: only batch jobs can be requeued
    admin_comment: bool                 # an AdminComment is already set (never overwritten)
    gpus: dict[str, tuple[int, ...]]    # node (hostlist as Slurm prints it) -> GPU indices (IDX)
    restarts: int = 0                   # Restarts=: how often Slurm has requeued it already
    # Why Slurm's own fields cannot be told from the job's free text (None: they can).
    # Such a job is read as holding nothing and is left alone.
    unreadable: str | None = None


# scontrol prints a job's fields unquoted, in a fixed order (job_info.c), with
# free text a job user chose in some of them: JobName second, and after
# MinCPUsNode= Comment, Command, WorkDir, StdErr/StdIn/StdOut and (26.05)
# SubmitLine, newlines and " Key=value" included (recorded on 22.05, 24.11
# and 26.05: tests/data/slurm/show-job-hostile-*.txt).  So no "first match"
# can be trusted.  The fields read here come from one run of Slurm's own
# printing, between JobName and MinCPUsNode=: each must occur exactly once in
# the whole record (Slurm always prints the real one, so a second one is
# someone's text), in Slurm's order; the per-node GPU detail is read only
# between the one JOB_GRES= and the one MinCPUsNode= (at most one of each, in
# that order after BatchFlag=; none at all: no GPU read).  Otherwise the job is
# ``unreadable``: a user who spells Slurm's fields fails only their own job's
# fail-fast requeue.  (``scontrol --json`` would be unambiguous, but needs
# the serializer/json plugin, which Slurm builds only with json-c.)
_ONCE = ("JobState", "Requeue", "Restarts", "BatchFlag")
# The GPU detail's bounds: printed for every job with -d that has run (JOB_GRES=(null)
# without GRES), possibly not for a pending one (a requeued job waiting to start).
_BOUNDS = ("JOB_GRES", "MinCPUsNode")
_FLAGS = re.compile(r"(?:^|\s)Requeue=(\d{1,9}) Restarts=(\d{1,9}) BatchFlag=(\d{1,9}) ")
# The per-node detail of -d: "Nodes=n1 CPU_IDs=0-3 Mem=0 GRES=gpu:h100:2(IDX:0-1)"
# (older Slurm: "GRES_IDX=gpu(IDX:0-1)"); one per group of nodes with the same layout.
_DETAIL = re.compile(r"(?:^|\s)Nodes=(\S+) CPU_IDs=\S* Mem=\S+ GRES(?:_IDX)?=(\S*)")
_GPU_IDX = re.compile(r"(?:^|,)gpu(?::[^(,]*)?\(IDX:([0-9,\-]+)\)")
_RECORD = re.compile(r"(?:^|\n)(?=JobId=\d+ )")


def _indices(spec: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()) and len(lo) < 6 and len(hi) < 6:
            out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def _unreadable(jid: str, why: str) -> JobView:
    return JobView(jid, "", False, False, True, {}, 0, why)


def parse_job(text: str, job_id: str | None = None) -> JobView | None:
    """Job *job_id* (default: the first) in ``scontrol -d show job -o`` output (None: not there).

    A newline in a job's name starts a new line: records are split only where
    a line starts ``JobId=<n> ``, and a record of the wanted id must be the
    only one (a second is someone's text).
    """
    records = [r for r in _RECORD.split(text) if r.strip()]
    ids = [re.match(r"JobId=(\d+) ", r) for r in records]
    if job_id is None:
        if not ids or ids[0] is None:
            return None
        job_id = ids[0].group(1)
    mine = [r for r, m in zip(records, ids) if m is not None and m.group(1) == job_id]
    if not mine:
        return None
    if len(mine) > 1:
        return _unreadable(job_id, "its name holds a line starting JobId=")
    rec = mine[0].rstrip("\n")
    at: dict[str, int] = {}
    for key in _ONCE + _BOUNDS:
        hits = [m.start() for m in re.finditer(r"(?:^|\s)" + key + "=", rec)]
        if len(hits) > 1:
            return _unreadable(job_id, f"a free-text field such as its name or comment spells {key}=")
        if hits:
            at[key] = hits[0]
        elif key in _ONCE:
            return _unreadable(job_id, f"no {key}= (a newline in its name?)")
    if sorted(at.values()) != [at[k] for k in _ONCE + _BOUNDS if k in at]:
        return _unreadable(job_id, "Slurm's fields are out of their order")
    flags = _FLAGS.match(rec, at["Requeue"])
    state = re.match(r"\s?JobState=(\S*)", rec[at["JobState"]:])
    if flags is None or state is None:
        return _unreadable(job_id, "Requeue=, Restarts= and BatchFlag= are not as Slurm prints them")
    gpus: dict[str, tuple[int, ...]] = {}
    detail = _DETAIL.finditer(rec, at["JOB_GRES"], at["MinCPUsNode"]) if len(at) == len(_ONCE + _BOUNDS) else ()
    for m in detail:
        idx: list[int] = []
        for g in _GPU_IDX.finditer(m.group(2)):
            idx.extend(_indices(g.group(1)))
        if idx:
            gpus[m.group(1)] = tuple(sorted(set(idx)))
    # An AdminComment spelt in the job's own text only stops us writing one.
    return JobView(job_id, state.group(1), flags.group(1) == "1", flags.group(3) == "1",
                   bool(re.search(r"(?:^|\s)AdminComment=\S", rec)), gpus, int(flags.group(2)))


def show_job(job_id: str, timeout: float) -> JobView | None:
    res = runner.run([slurm_bin("scontrol"), "-d", "show", "job", "-o", job_id], timeout, check=False)
    if res.returncode != 0:
        if "Invalid job id" in res.stderr:
            return None
        raise CommandError(f"scontrol show job {job_id} failed: {(res.stderr.strip() or 'exit %d' % res.returncode)}",
                           job_id)
    return parse_job(res.stdout, job_id)


def running_jobs(node: str, timeout: float) -> list[str]:
    """Ids of the jobs running (or suspended) on *node*, array elements each by its own id."""
    res = runner.run([slurm_bin("squeue"), "--noheader", "--nodelist", node, "--states", "RUNNING,SUSPENDED",
                      "--format", "%A"], timeout)
    return [w for w in res.stdout.split() if w.isdigit()]


def set_admin_comment(job_id: str, text: str, timeout: float) -> None:
    runner.run([slurm_bin("scontrol"), "update", f"JobId={job_id}", f"AdminComment={text}"], timeout)


def requeue(job_id: str, timeout: float) -> None:
    runner.run([slurm_bin("scontrol"), "requeue", job_id], timeout)


def cancel(job_id: str, timeout: float) -> None:
    runner.run([slurm_bin("scancel"), job_id], timeout)


def release(job_id: str, timeout: float) -> None:
    """Make a requeued job eligible now: its begin time was set to the requeue delay."""
    runner.run([slurm_bin("scontrol"), "update", f"JobId={job_id}", "StartTime=now"], timeout)
