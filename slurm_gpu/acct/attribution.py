"""Which job each sample belongs to (pure, but for reading a PID's cgroup).

First by the devices each job holds (the prolog's registration): a GPU, or
a MIG GPU instance, or the MIG instances on a GPU the job holds whole.
Then by process: every PID NVML lists on a device is looked up in its
cgroup, which the kernel keeps and no user can forge, *under Slurm's own
job hierarchy only* (:func:`job_in_cgroup`).  A job whose process runs on a
device it does not hold gets that device as a *leak*: its own processes'
memory, the device's utilisation, no energy.  A device several jobs hold
(gres/shard, gres/mps) is shared out by process (:func:`attribute`).  Job
environment variables are never read: a user can set them to anything.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Iterable, Mapping, Sequence

from ..hw.gpustats import DeviceStats

# Which job a process's cgroup names: slurm_gpu.slurmcgroup (also read by the
# epilog's leftover check, which must not import the accounting package).
from ..slurmcgroup import (SLUID, job_dir_in_cgroup, job_dir_of_pid, job_in_cgroup,  # noqa: F401
                           job_of_pid, v2_bases)


def sluids_of(registration: Mapping[str, object]) -> list[str]:
    """Every SLUID a registration recorded, oldest first: one per run of the
    job on this node (a requeue gives a new one), the current one last."""
    seen = registration.get("sluids")
    out = [x for x in seen if isinstance(x, str) and SLUID.fullmatch(x)] if isinstance(seen, list) else []
    cur = registration.get("sluid")
    if isinstance(cur, str) and SLUID.fullmatch(cur) and cur not in out:
        out.append(cur)
    return out


def sluid_map(registrations: Mapping[str, Mapping[str, object]]) -> dict[str, str]:
    """SLUID -> job id, from the registrations that recorded one (26.05+), every
    run's SLUID of a requeued job included."""
    return {x: j for j, r in registrations.items() for x in sluids_of(r)}


@dataclass(frozen=True)
class Share:
    """What one job gets of one device's sample."""

    jobid: str
    key: str
    held: bool
    sm: float | None
    mem: int | None
    energy_mj: int | None    # the device's counter (whole GPUs); the job's part is *weight* of its increase
    busy: bool               # its processes are on the device
    mem_total: int | None = None
    fraction: float = 1.0    # of a whole GPU (MIG instance)
    weight: float = 1.0      # its share of the device's energy this sample
    share: float | None = None   # a shared device (gres/shard, gres/mps): its part of the allocation


def holders(registrations: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """device key -> the ids of the jobs that hold it (several on a shared GPU), oldest first."""
    out: dict[str, list[str]] = {}
    for jobid in sorted(registrations, key=lambda j: (len(j), j)):
        for k in registrations[jobid]:
            if jobid not in out.setdefault(k, []):
                out[k].append(jobid)
    return out


def attribute(stats: Iterable[DeviceStats], held_by: Mapping[str, Sequence[str]],
              pid_job: Callable[[int], str | None], shared: Collection[str] = ()) -> list[Share]:
    """Every (job, device) share of this sample.

    A device held by one job is that job's whole.  A device held by several
    (gres/shard, gres/mps), or whose holder registered it as shared
    (*shared*: device keys), is split by process: each holder gets its own
    processes' SM % (NVML's per-process utilisation) and memory, and the
    device's energy in proportion to its SM (evenly while none computes);
    a holder with no process on it is idle.
    """
    stats = list(stats)
    mig_gpus = {s.index for s in stats if s.gi is not None}
    out: list[Share] = []
    for s in stats:
        if s.gi is None and s.index in mig_gpus:
            continue            # a MIG-enabled GPU is accounted per instance (below)
        hold = list(held_by.get(s.key) or ())
        if not hold and s.gi is not None:
            hold = list(held_by.get(str(s.index)) or ())    # the job holds the whole GPU (--gpu-mig)
        mem_of: dict[str, int] = {}
        procs_of: dict[str, list[float | None]] = {}
        for p in s.procs:
            j = pid_job(p.pid)
            if j is not None:
                mem_of[j] = mem_of.get(j, 0) + int(p.mem_bytes or 0)
                procs_of.setdefault(j, []).append(p.sm)
        if len(hold) > 1 or (hold and s.key in shared):
            out += _split(s, hold, mem_of, procs_of)
            continue
        holder = hold[0] if hold else None
        if holder is not None:
            out.append(Share(holder, s.key, True, s.sm, s.mem_used, s.energy_mj, holder in mem_of,
                             s.mem_total, s.fraction))
        for j, mem in sorted(mem_of.items()):
            if j != holder:
                out.append(Share(j, s.key, False, s.sm, mem, None, True, s.mem_total, s.fraction))
    return out


def _split(s: DeviceStats, hold: list[str], mem_of: Mapping[str, int],
           procs_of: Mapping[str, list[float | None]]) -> list[Share]:
    known = all(sm is not None for p in procs_of.values() for sm in p)

    def sm_of(j: str) -> float | None:
        if j not in procs_of:
            return 0.0                     # no context on the GPU: not computing
        return min(sum(x or 0.0 for x in procs_of[j]), 100.0) if known else None

    sms = {j: sm_of(j) for j in hold}
    total = sum(v or 0.0 for v in sms.values())
    busy = [j for j in hold if j in procs_of]
    if known and total > 0:
        weight = {j: (sms[j] or 0.0) / total for j in hold}
    else:
        base = busy or hold
        weight = {j: (1.0 / len(base) if j in base else 0.0) for j in hold}
    out = [Share(j, s.key, True, sms[j], mem_of.get(j, 0), s.energy_mj, j in procs_of, s.mem_total,
                 s.fraction, weight[j], round(1.0 / len(hold), 4)) for j in hold]
    for j in sorted(set(procs_of) - set(hold)):
        out.append(Share(j, s.key, False, sm_of(j), mem_of[j], None, True, s.mem_total, s.fraction))
    return out
