"""GPU-local CPU and memory binding of tasks: the planner's Python face.

The planner itself is C: ``spank/sg_bind.c`` (:func:`plan_task`), the one
implementation, which the plugin's outer half also calls for a plain
``prefer`` step without starting Python.  The Python path reaches it
through cffi: the plugin's inner half hands its ``ffi, lib`` to
:func:`use_planner` (``spank/dispatch.py``); code that plans outside
slurmstepd (the tests) builds it alone with ``spank/build_plugin.py``
(``build_planner``) and does the same.  Only slurmstepd binds tasks, and
the plugin is built on every node that runs it, so no Python planner is
kept for a node without a compiler: there the plugin is not built and no
step is bound at all.

Data in, data out: the GPUs' locality (derived once from the node model by
:func:`locality`), the task's environment and the CPUs the task may use go
in; a :class:`TaskBinding` (or a :class:`BindingError`) comes out.  The
SPANK plugin applies it with sched_setaffinity and set_mempolicy.  This
module is imported in every bound job step, so it imports nothing beyond
the project's errors.

Rules (sg_bind.c):

* A task's GPUs come from ``SLURM_STEP_GPUS`` (``SLURM_JOB_GPUS`` in a batch
  step: node-level GRES indices) narrowed by the task's own
  ``CUDA_VISIBLE_DEVICES`` (GPU indices, global or local to the step, or
  uuids; a uuid of a GPU outside the step counts as unknown, as a number
  outside it does).  When every task sees all of the step's GPUs, they are handed out
  like ``--gpu-bind=per_task:N``: task *i* gets the *N* GPUs starting at
  ``i*N`` (wrapping), with N from ``SLURM_GPUS_PER_TASK`` or else GPUs/tasks
  (at least 1).  List entries may carry white space around them (Unicode's,
  as Python's ``str.strip`` strips it); numbers are ASCII digits of any
  size; a list of more than 4096 entries (numbers or uuids) is not a GPU
  list.
* The CPU set is the GPUs' local CPUs intersected with the CPUs the task may
  use: Slurm's binding is only ever narrowed, never widened.
* The memory policy is MPOL_BIND (strict) or MPOL_PREFERRED (prefer) to the
  GPUs' NUMA node(s); an MPOL_BIND policy Slurm put in place (``--mem-bind``)
  is only narrowed.
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

    __slots__ = ("mode", "task", "gpus", "cpus", "mems", "warning", "env", "host_mems")

    def __init__(self, mode: str, task: int, gpus: tuple[int, ...], cpus: tuple[int, ...] = (),
                 mems: tuple[int, ...] = (), warning: str | None = None, *, env: str,
                 host_mems: tuple[int, ...] = ()) -> None:
        self.mode = mode
        self.task = task
        self.gpus = gpus              # model GPU indices
        self.cpus = cpus              # OS PU indices for sched_setaffinity
        self.mems = mems              # NUMA nodes of the model
        self.warning = warning        # prefer could not bind: why
        self.env = env                # SLURM_GPU_BINDING, as the planner writes it
        self.host_mems = host_mems    # mems through [spank] numa_node_map: for set_mempolicy

    @property
    def applied(self) -> bool:
        return bool(self.cpus)

    def env_value(self) -> str:
        """The ``SLURM_GPU_BINDING`` value, e.g. ``strict;gpus=0;cpus=0-3;mems=0``."""
        return self.env

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


# CPU and NUMA ids the planner takes (sg_bind.h SG_BIND_MAXID; Linux has at
# most 8192 CPUs)
MAX_ID = 65535
_MODES = {OFF: 0, PREFER: 1, STRICT: 2}        # sg_bind.h SG_MODE_*
_planner: Any = None


def use_planner(ffi: Any, lib: Any) -> None:
    """Plan with this compiled planner (the plugin's inner half, or build_planner's)."""
    global _planner
    _planner = (ffi, lib)


def _compiled() -> Any:
    if _planner is None:
        raise SlurmGpuError("the binding planner is not loaded: it is compiled into the SPANK "
                            "plugin (slurm-gpu spank build) and runs in slurmstepd")
    return _planner


def _plain(text: str) -> bool:
    return text not in ("", "-") and text.isascii() and text.isprintable() and " " not in text


def rows(loc: Sequence[dict[str, Any]], numa_map: Mapping[int, int]) -> list[str] | None:
    """The planner's table rows for *loc* (``spank/bindtable.py`` writes them too):
    ``map <model node> <host node>``, then per Slurm GPU index ``gpu <nvml index>
    <uuid or -> <cpus or -> <mems or ->`` or ``missing``.  None when an id is out
    of the planner's range.  A uuid it cannot carry (not printable ASCII, a
    blank inside; NVML's never are) is ``-``: no ``CUDA_VISIBLE_DEVICES`` names it."""
    out = []
    for m, h in sorted(numa_map.items()):
        if not (0 <= m <= MAX_ID and 0 <= h <= MAX_ID):
            return None
        out.append(f"map {m} {h}")
    for g in loc:
        if g.get("missing") is not None:
            out.append("missing")
            continue
        ids = (*g["cpus"], *g["mems"])
        if (not isinstance(g["index"], int) or g["index"] < 0
                or any(not isinstance(i, int) or not 0 <= i <= MAX_ID for i in ids)):
            return None
        uuid = g["uuid"] if _plain(g["uuid"] or "") else "-"
        out.append(f"gpu {g['index']} {uuid} {cpulist(g['cpus']) or '-'} "
                   f"{cpulist(g['mems']) or '-'}")
    return out


class Planner:
    """The compiled planner over one locality table (one step's, inherited by its tasks)."""

    def __init__(self, loc: Sequence[dict[str, Any]], numa_map: Mapping[int, int] | None = None) -> None:
        self._ffi, self._lib = _compiled()
        self.loc = loc
        lines = rows(loc, numa_map or {})
        if lines is None:
            raise SlurmGpuError(f"the node model has a CPU or NUMA id above {MAX_ID}, "
                                "which the binding planner does not take")
        self._table = self._ffi.new("struct sg_table *")
        if self._lib.sg_table_rows(self._table, "".join(f"{r}\n" for r in (*lines, "end"))
                                   .encode()) != 0:
            self._table = None
            raise SlurmGpuError("the binding planner refused the node's locality table")

    def __del__(self) -> None:
        if getattr(self, "_table", None) is not None:
            self._lib.sg_table_free(self._table)

    def _plan(self, env: Mapping[str, str], mode: str, task: int, ntasks: int,
              allowed: Iterable[int], bound_nodes: Iterable[int] | None) -> dict[str, Any]:
        ffi, lib = self._ffi, self._lib
        if mode not in _MODES:
            raise ValueError(f"bad binding mode {mode!r}")
        keep = []

        def text(name: str) -> Any:
            value = env.get(name)
            if value is None:
                return ffi.NULL
            keep.append(ffi.new("char[]", value.encode("utf-8", "replace")))
            return keep[-1]

        def bits(ids: Iterable[int], nbits: int) -> Any:
            out = bytearray(lib.SG_BIND_NBYTES)
            for i in ids:
                if 0 <= i < nbits:
                    out[i >> 3] |= 1 << (i & 7)
            keep.append(ffi.new("unsigned char[]", bytes(out)))
            return keep[-1]

        inp = ffi.new("struct sg_task_in *")
        inp.step_gpus = text("SLURM_STEP_GPUS" if "SLURM_STEP_GPUS" in env else "SLURM_JOB_GPUS")
        inp.cvd = text("CUDA_VISIBLE_DEVICES")
        inp.per_task = text("SLURM_GPUS_PER_TASK")
        inp.mode = _MODES[mode]
        inp.task = task
        inp.ntasks = ntasks
        inp.allowed = bits(allowed, MAX_ID + 1)
        inp.bound_host = ffi.NULL if bound_nodes is None else bits(bound_nodes, lib.SG_BIND_HOSTBITS)
        plan = ffi.new("struct sg_plan *")
        if lib.sg_plan(self._table, inp, plan) != 0:
            raise SlurmGpuError("the binding planner ran out of memory")

        def string(s: Any) -> str:
            return "" if s.buf == ffi.NULL else ffi.string(s.buf).decode()
        try:
            return {"applied": bool(plan.applied), "failed": bool(plan.failed),
                    "message": string(plan.message), "env": string(plan.env),
                    "slots": [int(i) for i in string(plan.slots).split(",") if i],
                    "cpus": parse_cpulist(string(plan.cpus_text)),
                    "mems": parse_cpulist(string(plan.mems_text)),
                    "host": parse_cpulist(string(plan.host_text))}
        finally:
            lib.sg_plan_free(plan)

    def plan(self, env: Mapping[str, str], *, mode: str, local_task: int, ntasks: int,
             allowed: Iterable[int], bound_nodes: Iterable[int] | None = None) -> TaskBinding:
        """Plan the binding of one task.  Raises :class:`BindingError` (strict only).

        *env*: the step's GPUs in ``SLURM_STEP_GPUS``, or ``SLURM_JOB_GPUS``
        when that is absent (:mod:`slurm_gpu.spank.remote` passes only the one
        slurmstepd keeps for the step), and the task's ``CUDA_VISIBLE_DEVICES``
        and ``SLURM_GPUS_PER_TASK``.  *bound_nodes*: the host NUMA nodes of an
        MPOL_BIND policy already in place (Slurm's ``--mem-bind``), None when
        there is none.
        """
        p = self._plan(env, mode, local_task, ntasks, allowed, bound_nodes)
        if p["failed"]:
            raise BindingError(p["message"], f"task {local_task}")
        ids = tuple(self.loc[i]["index"] for i in p["slots"] if self.loc[i].get("missing") is None)
        return TaskBinding(mode, local_task, ids, p["cpus"], p["mems"], p["message"] or None,
                           env=p["env"], host_mems=p["host"])

    def task_gpus(self, env: Mapping[str, str], local_task: int, ntasks: int) -> list[dict[str, Any]]:
        """The locality entries of the task's GPUs, in order; empty when the step has none."""
        return [self.loc[i] for i in self._plan(env, OFF, local_task, ntasks, (), None)["slots"]]


def task_gpus(loc: Sequence[dict[str, Any]], env: Mapping[str, str], local_task: int,
              ntasks: int) -> list[dict[str, Any]]:
    """The GPUs (locality entries) this task uses; empty when the step has none.

    Only Slurm's own ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS`` say that the step
    holds GPUs: a ``CUDA_VISIBLE_DEVICES`` the user exported into a step
    without GPUs binds nothing.
    """
    return Planner(loc).task_gpus(env, local_task, ntasks)


def plan_task(loc: Sequence[dict[str, Any]], env: Mapping[str, str], *, mode: str,
              local_task: int, ntasks: int, allowed: Iterable[int],
              bound_nodes: Iterable[int] | None = None,
              numa_map: Mapping[int, int] | None = None) -> TaskBinding:
    """Plan the binding of one task over *loc* (:meth:`Planner.plan`)."""
    return Planner(loc, numa_map).plan(env, mode=mode, local_task=local_task, ntasks=ntasks,
                                       allowed=allowed, bound_nodes=bound_nodes)


def verbose_line(b: TaskBinding, *, hostname: str, pid: int) -> str:
    """One line per task, in the spirit of ``--cpu-bind=verbose``."""
    head = f"slurm-gpu: gpu-numa-bind={b.mode} - {hostname}, task {b.task:2d} [{pid}]:"
    if not b.applied:
        return f"{head} gpus {_ints(b.gpus) or 'none'}, not bound"
    policy = "MPOL_BIND" if b.mode == STRICT else "MPOL_PREFERRED"
    return (f"{head} gpus {_ints(b.gpus)} cpus {cpulist(b.cpus)} "
            f"mems {cpulist(b.mems)} ({policy})")
