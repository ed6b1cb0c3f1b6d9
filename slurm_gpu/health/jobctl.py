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


_KEY = re.compile(r"(?:^|\s)([A-Za-z_]+)=")
# The per-node detail of -d: "Nodes=n1 CPU_IDs=0-3 Mem=0 GRES=gpu:h100:2(IDX:0-1)"
# (older Slurm: "GRES_IDX=gpu(IDX:0-1)"); one per group of nodes with the same layout.
_DETAIL = re.compile(r"(?:^|\s)Nodes=(\S+) CPU_IDs=\S* Mem=\S+ GRES(?:_IDX)?=(\S*)")
_GPU_IDX = re.compile(r"(?:^|,)gpu(?::[^(,]*)?\(IDX:([0-9,\-]+)\)")


def _indices(spec: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def parse_job(line: str) -> JobView | None:
    """One ``scontrol -d show job -o`` line (None when it is not a job)."""
    def word(key: str) -> str:
        m = re.search(r"(?:^|\s)" + key + r"=(\S*)", line)
        return m.group(1) if m else ""
    jid = word("JobId")
    if not jid.isdigit():
        return None
    gpus: dict[str, tuple[int, ...]] = {}
    for m in _DETAIL.finditer(line):
        idx: list[int] = []
        for g in _GPU_IDX.finditer(m.group(2)):
            idx.extend(_indices(g.group(1)))
        if idx:
            gpus[m.group(1)] = tuple(sorted(set(idx)))
    return JobView(jid, word("JobState"), word("Requeue") == "1", word("BatchFlag") == "1",
                   bool(re.search(r"(?:^|\s)AdminComment=\S", line)), gpus,
                   int(word("Restarts")) if word("Restarts").isdigit() else 0)


def show_job(job_id: str, timeout: float) -> JobView | None:
    res = runner.run([slurm_bin("scontrol"), "-d", "show", "job", "-o", job_id], timeout, check=False)
    if res.returncode != 0:
        if "Invalid job id" in res.stderr:
            return None
        raise CommandError(f"scontrol show job {job_id} failed: {(res.stderr.strip() or 'exit %d' % res.returncode)}",
                           job_id)
    return parse_job(res.stdout.strip().splitlines()[0] if res.stdout.strip() else "")


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
