"""The one way a GPU's MIG layout changes: inspect, plan, apply.

Both the node's baseline (:mod:`.baseline`, ``slurm-gpu mig apply``) and a
job's layout (:mod:`slurm_gpu.jobs.migjob`, ``--gpu-mig``) go through here:
:func:`inspect` reads what a GPU is, :func:`plan_change` checks that the
wanted instances fit before anything is touched, and :func:`apply` destroys,
switches the mode and creates, in that order.  A job journals each instance
before and after its creation through :func:`apply`'s callbacks, so its
epilog can undo a change that was interrupted half-way.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..hw.gpus import GpuError, Gpus
from . import blockers, instances
from .instances import Existing, MigError
from .planner import Placement, Request, plan_gpu

IN_USE = 19          # NVML_ERROR_IN_USE: something holds the GPU


@dataclass(frozen=True)
class GpuFacts:
    """What a GPU is, as far as MIG goes."""

    dev: int
    name: str
    model: Any                 # profiles.GpuModel, or None: no MIG table for it
    mode: int | None           # None: no MIG on this GPU


@dataclass
class Change:
    """What one GPU goes through: destroy these, set the mode, create these (in order)."""

    dev: int
    where: str
    destroy: list[int] = field(default_factory=list)         # GPU instance ids
    mig_mode: bool | None = None                             # None: leave it
    create: list[Placement] = field(default_factory=list)


def inspect(gpus: Gpus, dev: int) -> GpuFacts:
    """Name, MIG model and MIG mode of *dev*."""
    name, model = instances.identify(gpus, dev)
    return GpuFacts(dev, name, model, instances.mig_mode(gpus, dev))


def requests(names: Sequence[str]) -> list[Request]:
    """Planner requests from profile names as the baseline config and ``GpuDiff`` write them."""
    return [Request(x.split("c.", 1)[1], int(x.split("c.", 1)[0])) if "c." in x else Request(x)
            for x in names]


def plan_change(gpus: Gpus, facts: GpuFacts, wanted: list[Request], *, where: str,
                replace: list[Existing] | None = None, mig_mode: bool | None = None) -> Change:
    """Plan *wanted* on the GPU (``UsageError`` when it does not fit), replacing *replace*
    (default: every instance on it now)."""
    placements = plan_gpu(wanted, facts.model, where=where) if wanted else []
    if replace is None:
        replace = instances.list_instances(gpus, facts.dev) if facts.mode == 1 else []
    return Change(facts.dev, where, [e.gi_id for e in replace], mig_mode, placements)


def apply(gpus: Gpus, change: Change, *, explain_in_use: bool = True,
          before: Callable[[Placement], None] | None = None,
          created: Callable[[Placement, int, int], None] | None = None) -> None:
    """Make *change*: *before* runs before each creation, *created* after it (gi, ci ids)."""
    d, where = change.dev, change.where
    try:
        for gid in change.destroy:
            instances.destroy_gi(gpus, d, gid, where)
        if change.mig_mode is not None:
            try:
                gpus.set_mig_mode(d, change.mig_mode)
            except GpuError as e:
                raise MigError(f"cannot set MIG mode: {e}", where, e.code) from None
        for p in change.create:
            if before:
                before(p)
            gid, cid = instances.create_placement(gpus, d, p, where)
            if created:
                created(p, gid, cid)
    except MigError as e:
        raise explained(e, explain_in_use) from None


def explained(e: MigError, explain_in_use: bool = True) -> MigError:
    """*e*, naming what holds the GPU when NVML says IN_USE."""
    if e.code != IN_USE or not explain_in_use:
        return e
    return MigError(f"{e.what}; blockers: {blockers.explain(blockers.find())}", e.where, e.code)
