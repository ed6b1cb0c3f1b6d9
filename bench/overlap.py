"""The GPU oversubscription counter of ``bench_oversub.py`` (issue 27 section 7), pure.

One sample of the node: which jobs' processes are on which GPU or MIG
instance (the accounting sampler's reading, :class:`~slurm_gpu.hw.gpustats.DeviceStats`,
each PID given to a job by its Slurm cgroup, :func:`slurm_gpu.acct.attribution.job_of_pid`),
which devices each job holds (the accounting prolog's registrations,
:func:`slurm_gpu.acct.attribution.holders`), and which jobs Slurm let share
a GPU (gres/shard, gres/mps).  A device used by two or more jobs at once is
an overlap unless every one of them is a sharing job holding that device.

A whole GPU and its MIG instances are one physical device: a process on the
GPU outside any instance (a job that took the whole GPU) overlaps every job
on one of its instances; two instances of one GPU are separate devices.
"""
from __future__ import annotations

import re
from typing import Callable, Collection, Iterable, Mapping

from slurm_gpu.hw.gpustats import DeviceStats


def device_users(stats: Iterable[DeviceStats], pid_job: Callable[[int], str | None]) -> dict[str, set[str]]:
    """device key (``"0"``, ``"2/gi7"``) -> the jobs whose processes use it now.

    A GPU's own entry lists every process on it, each with its MIG instance:
    only those in no instance use the whole GPU; the instance entries carry
    the others.  A PID in no job's cgroup (a daemon of root's) uses nothing
    a job could be blamed for.
    """
    out: dict[str, set[str]] = {}
    for s in stats:
        for p in s.procs:
            if s.gi is None and p.gi is not None:
                continue
            j = pid_job(p.pid)
            if j is not None:
                out.setdefault(s.key, set()).add(j)
    return out


def overlaps(users: Mapping[str, Collection[str]], held: Mapping[str, Collection[str]],
             sharing: Collection[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(device key, the jobs on it) for every device used by jobs Slurm did not let share it.

    *held*: device key -> the jobs holding it (registrations); *sharing*: the
    jobs whose allocation is a sharing gres (gres/shard, gres/mps).  Jobs may
    share a device only when each is a sharing job that holds it.
    """
    out = []
    for key in sorted(users):
        jobs = set(users[key])
        if "/gi" in key:
            jobs |= set(users.get(key.split("/gi")[0], ()))     # the whole GPU's users are on it too
        if len(jobs) < 2:
            continue
        holders = set(held.get(key, ()))
        if all(j in sharing and j in holders for j in jobs):
            continue
        out.append((key, tuple(sorted(jobs, key=lambda j: (len(j), j)))))
    return out


def slurm_indices(detail: str) -> set[int]:
    """Slurm's GPU indices in a job's ``scontrol -d show job`` ``GRES=`` field.

    ``gpu:<type>:1(IDX:4)`` and, on 22.05, ``shard:1(IDX:4)`` name them;
    from 23.11 a sharing gres lists each GPU's used/total share instead,
    ``shard:1(0/4,1/4)``, and the GPUs it uses are those with a share in use.
    """
    out: set[int] = set()
    field = next((w[len("GRES="):] for w in detail.split() if w.startswith("GRES=")), "")
    for inside in re.findall(r"\(([^)]*)\)", field):
        if inside.startswith("IDX:"):
            for part in filter(None, inside[len("IDX:"):].split(",")):
                lo, _, hi = part.partition("-")
                if lo.isdigit() and (hi or lo).isdigit():
                    out.update(range(int(lo), int(hi or lo) + 1))
        else:
            for i, share in enumerate(inside.split(",")):
                used, _, _ = share.partition("/")
                if used.isdigit() and int(used) > 0:
                    out.add(i)
    return out


def slurm_gave_all(key: str, jobs: Iterable[str], given: Mapping[str, Collection[int]],
                   gpu_of_index: Mapping[int, int]) -> bool:
    """Whether Slurm's own allocation gave the physical GPU under device *key* to every one of
    *jobs* (*given*: job -> :func:`slurm_indices`; *gpu_of_index*: Slurm's GPU index -> the GPU,
    a MIG slice's index -> the GPU it is on).  Then the overlap is Slurm's, not the product's."""
    gpu = int(key.split("/gi")[0])
    return all(gpu in {gpu_of_index.get(i) for i in given.get(j, ())} for j in jobs)
