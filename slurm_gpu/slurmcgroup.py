"""Slurm's job cgroup directories: which job a process's ``/proc/<pid>/cgroup`` names.

Shared by accounting (attribution by process) and the epilog's leftover
check (a process in another job's cgroup is that job's), so it sits below
both packages.  Pure apart from reading ``/proc``.
"""
from __future__ import annotations

import os
import re
TYPE_CHECKING = False
if TYPE_CHECKING:       # typing costs the epilog ~2 ms of imports (it checks other jobs' processes)
    from typing import Iterator, Mapping

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
