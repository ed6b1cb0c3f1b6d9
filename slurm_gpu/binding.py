"""GPU-local CPU and memory binding of tasks: the pure planner.

Data in, data out: the GPUs' locality (derived once from the node model by
:func:`locality`), the task's environment and the CPUs the task may use go
in; a :class:`TaskBinding` (or an error) comes out.  The SPANK plugin applies
it with sched_setaffinity and set_mempolicy.  This module is imported in
every bound job step, so it imports nothing beyond the project's errors.

Rules:

* A task's GPUs come from ``SLURM_STEP_GPUS`` (``SLURM_JOB_GPUS`` in a batch
  step: node-level GRES indices) narrowed by the task's own
  ``CUDA_VISIBLE_DEVICES``.  When every task sees all of the step's GPUs,
  they are handed out like ``--gpu-bind=per_task:N``: task *i* gets the
  *N* GPUs starting at ``i*N`` (wrapping), with N from
  ``SLURM_GPUS_PER_TASK`` or else GPUs/tasks (at least 1).
* The CPU set is the GPUs' local CPUs intersected with the CPUs the task may
  use: Slurm's binding is only ever narrowed, never widened.
* The memory policy is MPOL_BIND (strict) or MPOL_PREFERRED (prefer) to the
  GPUs' NUMA node(s).
* When the GPUs' NUMA nodes have no CPU the task may use, ``prefer`` warns
  and changes nothing; ``strict`` fails the task.
* A GPU index that names a gres.conf device the node model does not have is
  refused the same way: no other GPU's locality stands in for it.
"""
from __future__ import annotations

from .errors import SlurmGpuError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping, Sequence

    from .hw.model import Node

STRICT, PREFER, OFF = "strict", "prefer", "off"


class BindingError(SlurmGpuError):
    """The requested strict binding is impossible for this task."""


class TaskBinding:
    """What to apply to one task.  Empty ``cpus`` means: leave affinity alone."""

    __slots__ = ("mode", "task", "gpus", "cpus", "mems", "warning")

    def __init__(self, mode: str, task: int, gpus: tuple[int, ...], cpus: tuple[int, ...] = (),
                 mems: tuple[int, ...] = (), warning: str | None = None) -> None:
        self.mode = mode
        self.task = task
        self.gpus = gpus              # model GPU indices
        self.cpus = cpus              # OS PU indices for sched_setaffinity
        self.mems = mems              # OS NUMA node indices (model) for set_mempolicy
        self.warning = warning        # prefer could not bind: why

    @property
    def applied(self) -> bool:
        return bool(self.cpus)

    def env_value(self) -> str:
        """The ``SLURM_GPU_BINDING`` value, e.g. ``strict;gpus=0;cpus=0-3;mems=0``."""
        if not self.applied:
            return f"{self.mode};gpus={_ints(self.gpus)};none"
        return (f"{self.mode};gpus={_ints(self.gpus)};cpus={cpulist(self.cpus)};"
                f"mems={cpulist(self.mems)}")

    def __repr__(self) -> str:
        return (f"TaskBinding({self.mode!r}, task={self.task}, gpus={self.gpus}, "
                f"cpus={self.cpus}, mems={self.mems}, warning={self.warning!r})")


def cpulist(ids: Iterable[int]) -> str:
    """``[0,1,2,5]`` -> ``0-2,5`` (the /proc and cpuset list format)."""
    s = sorted(set(ids))
    out: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(out)


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``0-2,5`` -> ``(0, 1, 2, 5)``."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(out))


def _ints(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in ids)


# More GPU indices than any node has: a longer list is not a GPU list (and a
# range like 0-99999999999 must not be expanded in the task's memory).
_MAX_GPU_IDS = 4096


def _digits(text: str) -> bool:
    """ASCII digits only (str.isdigit() also takes '²', which int() refuses)."""
    return text.isascii() and text.isdigit()


def _int_list(text: str | None) -> list[int] | None:
    """``0,1,3`` or ``0-2,5`` -> ints in the given order; None if not such a list."""
    if not text:
        return None
    out: list[int] = []
    for tok in (t.strip() for t in text.split(",")):
        lo, dash, hi = tok.partition("-")
        if not _digits(lo) or (dash and not _digits(hi)):
            return None
        first, last = int(lo), int(hi) if dash else int(lo)
        if last - first + len(out) >= _MAX_GPU_IDS:
            return None
        out.extend(range(first, last + 1))
    return out or None


def _per_task(text: str | None) -> int | None:
    """``SLURM_GPUS_PER_TASK``: ``2`` or ``h100:2`` (typed) -> 2."""
    if not text:
        return None
    last = text.split(",")[0].rsplit(":", 1)[-1].strip()
    return int(last) if _digits(last) and int(last) > 0 else None


def locality(node: Node, slurm_minors: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Each GPU's local CPUs and NUMA nodes, in Slurm's GRES index order.

    *slurm_minors* is that order as device minors (from gres.conf, see
    :mod:`slurm_gpu.confgen.gresorder`); without it, NVML's order, which is
    what Slurm uses with AutoDetect.  Local CPUs are the GPU's cores' PUs,
    else its NUMA nodes' PUs.  The same table a bound step reads from the
    node-fact cache (:mod:`slurm_gpu.nodefacts`, which computes it).
    """
    from . import nodefacts
    return nodefacts.for_binding(nodefacts.gpu_facts(node, slurm_minors))


def task_gpus(loc: Sequence[dict[str, Any]], env: Mapping[str, str], local_task: int,
              ntasks: int) -> list[dict[str, Any]]:
    """The GPUs (locality entries) this task uses; empty when the step has none.

    Only Slurm's own ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS`` say that the step
    holds GPUs: a ``CUDA_VISIBLE_DEVICES`` the user exported into a step
    without GPUs binds nothing.
    """
    step = _int_list(env.get("SLURM_STEP_GPUS")) or _int_list(env.get("SLURM_JOB_GPUS"))
    if not step:
        return []
    cvd_text = env.get("CUDA_VISIBLE_DEVICES", "")
    cvd = _int_list(cvd_text)
    if cvd is None and cvd_text and not cvd_text.startswith("MIG-"):
        by_uuid = {g["uuid"]: g for g in loc if g.get("uuid")}
        found = [by_uuid[t] for t in cvd_text.split(",") if t in by_uuid]
        if found:
            return found
        cvd = None
    if cvd is None:
        ids = step
    elif set(cvd) <= set(step):
        ids = cvd                               # global indices (no device cgroup)
    elif all(c < len(step) for c in cvd):
        ids = [step[c] for c in cvd]            # indices local to the step (ConstrainDevices)
    else:
        ids = [c for c in cvd if c in step]
    ids = [i for i in ids if 0 <= i < len(loc)]
    full = sorted(ids) == sorted(step)
    if full and ntasks > 1 and len(ids) > 1:
        n = _per_task(env.get("SLURM_GPUS_PER_TASK")) or max(1, len(ids) // ntasks)
        ids = [ids[(local_task * n + k) % len(ids)] for k in range(min(n, len(ids)))]
    return [loc[i] for i in ids]


def plan_task(loc: Sequence[dict[str, Any]], env: Mapping[str, str], *, mode: str,
              local_task: int, ntasks: int, allowed: Iterable[int],
              bound_mems: Iterable[int] | None = None) -> TaskBinding:
    """Plan the binding of one task.  Raises :class:`BindingError` (strict only).

    *bound_mems*: the NUMA nodes Slurm already bound the task's memory to
    (``--mem-bind``: an MPOL_BIND policy is in place), None when it did not.
    Like the CPUs, the memory nodes are only ever narrowed.
    """
    if mode not in (STRICT, PREFER, OFF):
        raise ValueError(f"bad binding mode {mode!r}")
    gpus = task_gpus(loc, env, local_task, ntasks)
    ids = tuple(g["index"] for g in gpus if g.get("missing") is None)
    if mode == OFF or not gpus:
        return TaskBinding(mode, local_task, ids)
    allowed_set = set(allowed)
    local = tuple(sorted({c for g in gpus for c in g["cpus"]}))
    mems = tuple(sorted({m for g in gpus for m in g["mems"]}))
    names = _ints(ids)
    missing = [g["missing"] for g in gpus if g.get("missing") is not None]
    problem = None
    cpus: tuple[int, ...] = ()
    if missing:
        # gres.conf names a device NVML does not have: its locality is unknown,
        # and borrowing a neighbour's would bind the task to another GPU
        problem = (f"Slurm GPU {_ints(missing)} is not a GPU of this node "
                   "(gres.conf and NVML disagree)")
    elif not local or not mems:
        problem = f"GPU {names} has no known NUMA node in the node model"
    else:
        cpus = tuple(c for c in local if c in allowed_set)
        if not cpus:
            problem = (f"GPU {names} is local to CPUs {cpulist(local)} (NUMA {cpulist(mems)}) "
                       f"but task {local_task} may only use CPUs {cpulist(allowed_set) or 'none'}")
        elif bound_mems is not None:
            bound = set(bound_mems)
            if not bound & set(mems):
                problem = (f"GPU {names} is local to NUMA {cpulist(mems)} but Slurm bound the "
                           f"memory of task {local_task} to NUMA {cpulist(bound) or 'none'}")
                cpus = ()
            else:
                mems = tuple(m for m in mems if m in bound)
    if problem is None:
        return TaskBinding(mode, local_task, ids, cpus, mems)
    if mode == STRICT:
        raise BindingError(f"gpu-numa-bind=strict impossible: {problem}",
                           f"task {local_task}")
    return TaskBinding(mode, local_task, ids,
                       warning=f"gpu-numa-bind=prefer not applied: {problem}")


def verbose_line(b: TaskBinding, *, hostname: str, pid: int) -> str:
    """One line per task, in the spirit of ``--cpu-bind=verbose``."""
    head = f"slurm-gpu: gpu-numa-bind={b.mode} - {hostname}, task {b.task:2d} [{pid}]:"
    if not b.applied:
        return f"{head} gpus {_ints(b.gpus) or 'none'}, not bound"
    policy = "MPOL_BIND" if b.mode == STRICT else "MPOL_PREFERRED"
    return (f"{head} gpus {_ints(b.gpus)} cpus {cpulist(b.cpus)} "
            f"mems {cpulist(b.mems)} ({policy})")
