"""State a failed epilog left behind: found and cleaned up once its job is gone.

An epilog that could not finish (a GPU that refused to destroy a MIG
instance, a daemon stuck in the driver, a node rebooted mid-epilog) leaves
the job's state file, MPS directory, MIG instances or compute mode.  Left
alone, that would decide later jobs: a later ``--gpu-mig`` job would see the
GPU "also used by job N" and fail as if it were the user's mistake, or
take the leftover instances for the node's baseline.

So each prolog (and ``slurm-gpu job cleanup --stale``, which an admin or a
cron/health hook runs) looks at the other jobs with state on this node and,
for those Slurm no longer runs here, does what their epilog should have
done.  "No longer runs here" is asked of slurmctld once for all of them
(``squeue``); an unknown job id (purged after MinJobAge), a finished state
or a node list without this node count; ``COMPLETING`` does not (its
epilog may be running right now), and when squeue cannot answer nothing
is touched.
"""
from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable

from .. import runner, slurmclient
from ..errors import CommandError, SlurmGpuError
from . import state as jobstate

# Job states after which a job has nothing left on any node once its epilog ran.
FINISHED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"}


def candidates(ctx: Any, exclude: str | None = None) -> list[str]:
    """Jobs with a state file or an MPS directory on this node (but *exclude*)."""
    ids = set(jobstate.list_jobs(ctx.state_dir))
    try:
        ids |= {n for n in os.listdir(ctx.mps.base_dir) if n.isdigit()}
    except OSError:
        pass
    ids.discard(exclude or "")
    return sorted(ids, key=int)


def parse_squeue(text: str, node: str) -> dict[str, bool]:
    """``%A|%T|%N`` lines -> {jobid: still has this node}.

    ``%A``, not ``%i``: an array task's ``%i`` is ``<array job>_<task>``,
    never the job id its prolog keyed its state by (squeue(1)).
    """
    from ..confgen import hostlist
    out: dict[str, bool] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or not parts[0].split("_")[0].isdigit():
            continue
        jobid, state, nodes = parts[0], parts[1].split()[0] if parts[1] else "", parts[2]
        try:
            here = node in hostlist.expand(nodes) if nodes and nodes != "(null)" else True
        except SlurmGpuError:
            here = True                     # unreadable node list: assume it is still here
        out[jobid] = state not in FINISHED and here
    return out


def gone(jobids: Iterable[str], node: str, squeue: str,
         run: Callable[..., runner.Completed] = runner.run) -> set[str]:
    """The jobs of *jobids* that Slurm no longer runs on *node* (empty when unsure)."""
    ids = sorted(set(jobids), key=int)
    if not ids:
        return set()
    try:
        res = run([squeue, "-h", "-t", "all", "-j", ",".join(ids), "-o", "%A|%T|%N"], 10,
                  check=False)
    except CommandError:
        return set()
    if res.returncode != 0:
        # One unknown id among several is not an error for squeue; all unknown is.
        return set(ids) if "Invalid job id" in res.stderr and not res.stdout.strip() else set()
    alive = parse_squeue(res.stdout, node)
    return {j for j in ids if not alive.get(j, False)}


if TYPE_CHECKING:
    from .state import JobRecord
    Teardown = Callable[[Any, JobRecord], list[str]]


def clean(ctx: Any, jobid: str, teardown: Teardown) -> list[str]:
    """Do what job *jobid*'s epilog does (*teardown*: its undo); raises when something stays."""
    from . import mps
    st = jobstate.load(ctx.state_dir, jobid)
    if st is None:
        if not os.path.lexists(mps.job_dir(ctx.mps.base_dir, jobid)):
            return []
        st = jobstate.JobRecord.stand_in(jobid)
    notes = teardown(ctx, st)
    jobstate.remove(ctx.state_dir, jobid)
    return notes + ["cleaned up"]


def sweep(ctx: Any, teardown: Teardown, exclude: str | None = None) -> list[str]:
    """Clean up every job with state here that Slurm no longer runs here; returns log lines.

    Never raises: a job that cannot be cleaned keeps its state for the next
    try (and for ``slurm-gpu job cleanup``), and the caller's own job goes on.
    """
    ids = candidates(ctx, exclude)
    if not ids or not ctx.node_name:
        return []
    squeue = slurmclient.sibling(ctx.jobs.scancel, "squeue")
    lines = []
    for jobid in sorted(gone(ids, ctx.node_name, squeue), key=int):
        try:
            for note in clean(ctx, jobid, teardown):
                lines.append(f"slurm-gpu: stale job {jobid}: {note}")
        except Exception as e:  # noqa: BLE001 - the next sweep tries again
            what = str(e) if isinstance(e, SlurmGpuError) else f"{type(e).__name__}: {e}"
            lines.append(f"slurm-gpu: stale job {jobid}: cleanup incomplete: {what}")
    return lines
