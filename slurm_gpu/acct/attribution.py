"""Which job each sample belongs to (pure, but for reading a PID's cgroup).

First by the devices each job holds (the prolog's registration): a GPU, or
a MIG GPU instance, or the MIG instances on a GPU the job holds whole.
Then by process: every PID NVML lists on a device is looked up in its
cgroup, which the kernel keeps and no user can forge (Slurm puts each job's
processes in ``.../job_<id>/...``).  A job whose process runs on a device
it does not hold gets that device as a *leak*: its own processes' memory,
the device's utilisation, no energy.  Job environment variables are never
read: a user can set them to anything.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from ..hw.gpustats import DeviceStats

_JOB_CGROUP = re.compile(r"/job_([0-9]{1,12})(?:/|$)")
# Slurm 26.05 names a job's cgroup v2 directory by its SLUID ("s" and 13
# Crockford base32 digits, e.g. sEKNKTV3WPV500) unless CgroupJobIdPaths=yes.
# A SLUID does not encode the job id: the prolog records it with the job.
SLUID = re.compile(r"s[0-9A-HJKMNP-TV-Z]{13}")
_SLUID_CGROUP = re.compile(r"/(s[0-9A-HJKMNP-TV-Z]{13})(?:/|$)")


def job_of_pid(proc_root: str, pid: int, sluids: Mapping[str, str] | None = None) -> str | None:
    """The Slurm job id in *pid*'s cgroup path, or None (not a job's process, or gone).

    *sluids*: SLUID -> job id of the jobs registered on this node, for
    26.05's SLUID-named directories.
    """
    try:
        with open(f"{proc_root}/{int(pid)}/cgroup", "rb") as f:
            text = f.read(65536).decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _JOB_CGROUP.search(path)
        if m:
            return m.group(1)
        m = _SLUID_CGROUP.search(path) if sluids else None
        if m and m.group(1) in sluids:     # type: ignore[operator]
            return sluids[m.group(1)]      # type: ignore[index]
    return None


def sluid_map(registrations: Mapping[str, Mapping[str, object]]) -> dict[str, str]:
    """SLUID -> job id, from the registrations that recorded one (26.05+)."""
    return {str(r["sluid"]): j for j, r in registrations.items()
            if isinstance(r.get("sluid"), str) and SLUID.fullmatch(str(r["sluid"]))}


@dataclass(frozen=True)
class Share:
    """What one job gets of one device's sample."""

    jobid: str
    key: str
    held: bool
    sm: float | None
    mem: int | None
    energy_mj: int | None
    busy: bool               # its processes are on the device
    mem_total: int | None = None
    fraction: float = 1.0    # of a whole GPU


def holders(registrations: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """device key -> job id, from each job's registered device keys."""
    out: dict[str, str] = {}
    for jobid, keys in registrations.items():
        for k in keys:
            out[k] = jobid
    return out


def attribute(stats: Iterable[DeviceStats], held_by: Mapping[str, str],
              pid_job: Callable[[int], str | None]) -> list[Share]:
    """Every (job, device) share of this sample."""
    stats = list(stats)
    mig_gpus = {s.index for s in stats if s.gi is not None}
    out: list[Share] = []
    for s in stats:
        if s.gi is None and s.index in mig_gpus:
            continue            # a MIG-enabled GPU is accounted per instance (below)
        holder = held_by.get(s.key)
        if holder is None and s.gi is not None:
            holder = held_by.get(str(s.index))     # the job holds the whole GPU (--gpu-mig)
        by_job: dict[str, int] = {}
        for p in s.procs:
            j = pid_job(p.pid)
            if j is not None:
                by_job[j] = by_job.get(j, 0) + int(p.mem_bytes or 0)
        if holder is not None:
            out.append(Share(holder, s.key, True, s.sm, s.mem_used, s.energy_mj, holder in by_job,
                             s.mem_total, s.fraction))
        for j, mem in sorted(by_job.items()):
            if j != holder:
                out.append(Share(j, s.key, False, s.sm, mem, None, True, s.mem_total, s.fraction))
    return out
