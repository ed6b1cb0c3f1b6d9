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

import os
import re
from dataclasses import dataclass
from typing import Callable, Collection, Iterable, Iterator, Mapping, Sequence

from ..hw.gpustats import DeviceStats

# Slurm 26.05 names a job's cgroup v2 directory by its SLUID ("s" and 13
# Crockford base32 digits, e.g. sEKNKTV3WPV500) unless CgroupJobIdPaths=yes.
# A SLUID does not encode the job id: the prolog records it with the job.
SLUID = re.compile(r"s[0-9A-HJKMNP-TV-Z]{13}")
# Slurm's job directories, anchored where only root can make directories
# (src/plugins/cgroup/v1/xcgroup.c, v2/cgroup_v2.c; 22.05, 24.11, 26.05):
# v1 "/slurm[_<node>]/uid_<uid>/job_<id>" in a controller's hierarchy;
# v2 "<base>/<slice>/[<node>_]slurmstepd.scope/<job_<id> | SLUID>", the slice
# system.slice unless 26.05's CgroupSlice says otherwise.  A user's delegated
# subtree (systemd's user@<uid>.service, or below a job's own task cgroup)
# can hold a directory of any name, so a "job_N" anywhere else proves nothing,
# and one below a job's directory is still that job's process.
_V1_JOB = re.compile(r"/slurm(?:_[^/]+)?/uid_[0-9]+/job_([1-9][0-9]{0,11})(?:/|$)")
_V2_JOB = re.compile(r"/[^/]+\.slice/(?:[^/]+_)?slurmstepd\.scope/"
                     r"(?:job_([1-9][0-9]{0,11})|(s[0-9A-HJKMNP-TV-Z]{13}))(?:/|$)")


def v2_bases(proc_root: str) -> tuple[str, ...]:
    """Where Slurm's cgroup v2 tree may start: the root (22.05), and from 24.11
    the parent of PID 1's cgroup (``_get_init_cg_path``: PID 1's own cgroup
    when that is the root)."""
    try:
        with open(f"{proc_root}/1/cgroup", "rb") as f:
            text = f.read(4096).decode(errors="replace")
    except OSError:
        return ("",)
    for line in text.splitlines():
        if line.startswith("0::/"):
            path = line[3:].rstrip("/")
            base = os.path.dirname(path).rstrip("/") if path else ""
            return ("", base) if base else ("",)
    return ("",)


def _job_dirs(text: str, bases: tuple[str, ...]) -> Iterator[tuple[str | None, str | None]]:
    """(job id, SLUID) of each Slurm job directory a ``/proc/<pid>/cgroup`` text
    names under Slurm's own hierarchy, one of the two set, in line order."""
    for line in text.splitlines():
        hier, _, path = line.partition(":")
        ctrl, _, path = path.partition(":")
        if hier == "0" and not ctrl:
            for base in bases:
                if base and not path.startswith(base + "/"):
                    continue
                m = _V2_JOB.match(path, len(base))
                if m:
                    yield m.group(1), m.group(2)
        elif hier != "0":
            m = _V1_JOB.match(path)
            if m:
                yield m.group(1), None


def job_in_cgroup(text: str, sluids: Mapping[str, str] | None = None,
                  bases: tuple[str, ...] = ("",)) -> str | None:
    """The job id that a ``/proc/<pid>/cgroup`` text names under Slurm's own hierarchy, or None."""
    for jobid, sluid in _job_dirs(text, bases):
        if jobid:
            return jobid
        if sluid and sluids and sluid in sluids:
            return sluids[sluid]
    return None


def job_dir_in_cgroup(text: str, bases: tuple[str, ...] = ("",)) -> str | None:
    """The name of the Slurm job directory a ``/proc/<pid>/cgroup`` text lies
    in: ``job_<id>``, or a SLUID (26.05); None when in no job's."""
    for jobid, sluid in _job_dirs(text, bases):
        return f"job_{jobid}" if jobid else sluid
    return None


def _cgroup_text(proc_root: str, pid: int) -> str | None:
    try:
        with open(f"{proc_root}/{int(pid)}/cgroup", "rb") as f:
            return f.read(65536).decode(errors="replace")
    except OSError:
        return None


def job_of_pid(proc_root: str, pid: int, sluids: Mapping[str, str] | None = None,
               bases: tuple[str, ...] | None = None) -> str | None:
    """The Slurm job id of *pid*'s cgroup, or None (not a job's process, or gone).

    *sluids*: SLUID -> job id of the jobs registered on this node, for
    26.05's SLUID-named directories.  *bases*: :func:`v2_bases` (read when None).
    """
    text = _cgroup_text(proc_root, pid)
    if text is None:
        return None
    return job_in_cgroup(text, sluids, v2_bases(proc_root) if bases is None else bases)


def job_dir_of_pid(proc_root: str, pid: int) -> str | None:
    """:func:`job_dir_in_cgroup` of *pid* (None also when it is gone)."""
    text = _cgroup_text(proc_root, pid)
    return None if text is None else job_dir_in_cgroup(text, v2_bases(proc_root))


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
