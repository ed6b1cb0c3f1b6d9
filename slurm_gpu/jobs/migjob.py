"""The job's MIG layout: checks, plan, create (prolog) and destroy + restore (epilog).

Planned and made through :mod:`slurm_gpu.mig.layout`, the core the node's
baseline (``slurm-gpu mig apply``) uses.  Every change is written to the
job's record before and after it happens: the baseline instances found on
each GPU (so the epilog can put them back), each instance as "pending"
(profile + placement) before its creation and with its ids and UUID after.
A placement identifies a GPU instance, so even an instance whose creation
was interrupted before its id was recorded is found and destroyed, and
nothing the job did not create is ever touched.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import HardwareError
from ..mig import instances, layout
from ..mig.instances import MigError
from ..mig.planner import parse_layout, plan_gpu
from . import state as jobstate
from .state import JobFailed

if TYPE_CHECKING:
    from ..mig.instances import Existing
    from ..mig.planner import Placement
    from .state import MigGpu, MigInstance
    from .context import Job


def setup(job: Job, wanted: str) -> None:
    """Check, plan and create the job's MIG layout *wanted* on its GPUs."""
    ctx, st = job.ctx, job.record
    if not ctx.mig.enabled:
        raise JobFailed("--gpu-mig is disabled on this cluster", "[mig] enabled")
    requests = parse_layout(wanted)            # syntax first: no NVML for a typo
    jobid = st.jobid
    if not st.whole_gpus:
        raise JobFailed("--gpu-mig needs whole GPUs held by the job (--gpus/--gres=gpu), "
                        "not shards or gres/mps", f"job {jobid}")
    others = _gpus_of_other_jobs(ctx, jobid)
    a = job.api()
    gpus = st.gpus
    if len(requests) not in (1, len(gpus)):
        raise JobFailed(f"MIG layout names {len(requests)} GPU layouts but the job has "
                        f"{len(gpus)} GPU(s) on this node", "--gpu-mig")
    plans = []
    for k, g in enumerate(gpus):
        idx = g["index"]
        if g["uuid"] in others:
            raise JobFailed(f"GPU {idx} is also used by job {others[g['uuid']]}; --gpu-mig needs "
                            "GPUs the job holds exclusively", f"job {jobid}")
        facts = layout.inspect(a, _open(a, g))
        name = facts.name
        if facts.mode is None:
            raise JobFailed(f"GPU {idx} ({name}) does not support MIG", f"job {jobid}")
        if facts.model is None:
            raise JobFailed(f"GPU {idx} ({name}) is a GPU model slurm-gpu has no MIG table "
                            "for; tell the admin", f"job {jobid}")
        if facts.mode != 1:
            raise JobFailed(f"GPU {idx} ({name}) does not have MIG mode enabled; the admin "
                            "enables it with slurm-gpu mig apply", f"job {jobid}")
        reqs = requests[0] if len(requests) == 1 else requests[k]
        plans.append((g, facts, plan_gpu(reqs, facts.model)))
    # Planned for every GPU before anything is touched: a bad layout leaves nothing.
    st.mig = {"layout": wanted, "ready": False, "gpus": []}
    for g, facts, placements in plans:
        idx = g["index"]
        rec: MigGpu = {"index": idx, "uuid": g["uuid"], "minor": g.get("minor"),
                       "model": facts.model.key, "baseline": [], "baseline_removed": False,
                       "instances": []}
        st.mig["gpus"].append(rec)
        baseline = instances.list_instances(a, facts.dev)
        rec["baseline"] = [e.to_dict() for e in baseline]
        # Marked before the first destroy: a failure (or a kill) half-way
        # must still have the epilog recreate what is gone.
        rec["baseline_removed"] = bool(rec["baseline"])
        job.save()
        where = f"GPU {idx}"
        change = layout.Change(facts.dev, where, [e.gi_id for e in baseline], None, placements)

        def pending(p: Placement, rec: MigGpu = rec) -> None:
            rec["instances"].append({"profile": p.name, "gi_profile_id": p.gi_profile_id,
                                     "start": p.start, "size": p.size, "gi_id": None,
                                     "ci_id": None, "uuid": None})
            job.save()

        def made(p: Placement, gid: int, cid: int, rec: MigGpu = rec, where: str = where,
                 dev: int = facts.dev) -> None:
            inst = rec["instances"][-1]
            inst["gi_id"], inst["ci_id"] = gid, cid
            if inst["gi_profile_id"] is None:
                # A profile whose id NVIDIA does not publish: the driver chose it.
                inst["gi_profile_id"] = next((e.profile_id for e in instances.list_instances(a, dev)
                                              if e.gi_id == gid), None)
            inst["uuid"] = next((u for g2, c2, u in instances.mig_devices(a, dev)
                                 if g2 == gid and c2 == cid), None)
            if not inst["uuid"]:
                raise HardwareError("new MIG device has no UUID", where)
            job.save()

        layout.apply(a, change, explain_in_use=ctx.mig.check_blockers, before=pending, created=made)
    st.mig["ready"] = True
    job.save()


def _open(a: Any, g: Any) -> int:
    """The GPU a job record names, by UUID and minor (never by an index)."""
    try:
        return int(a.find(uuid=g.get("uuid"), minor=g.get("minor")))
    except HardwareError as e:
        raise MigError(e.what, f"GPU {g.get('index')}") from None


def _gpus_of_other_jobs(ctx: Any, jobid: str) -> dict[str, str]:
    """{GPU UUID: job id} of the GPUs other jobs on this node recorded."""
    out: dict[str, str] = {}
    for other in jobstate.list_jobs(ctx.state_dir):
        if other == jobid:
            continue
        try:
            s = jobstate.load(ctx.state_dir, other)
        except Exception:  # noqa: BLE001 - a broken file of another job must not stop this one
            continue
        for g in s.gpus if s else ():
            if isinstance(g, dict) and g.get("uuid"):
                out[str(g["uuid"])] = other
    return out


def teardown(job: Job) -> None:
    """Destroy exactly what the job created, then restore each GPU's baseline."""
    ctx, st = job.ctx, job.record
    a = job.api()
    for rec in st.mig["gpus"] if st.mig else []:
        idx = rec["index"]
        where = f"GPU {idx}"
        dev = _open(a, rec)
        try:
            for inst in list(rec.get("instances", [])):
                _destroy(a, dev, inst, where)
                rec["instances"].remove(inst)
                job.save_if_on_file()
            if rec.get("baseline_removed"):
                for e in rec.get("baseline", []):
                    instances.recreate(a, dev, e, where)
                rec["baseline_removed"] = False
                job.save_if_on_file()
        except MigError as e:
            raise layout.explained(e, ctx.mig.check_blockers) from None
    st.mig = None


def _destroy(a: Any, dev: int, inst: MigInstance, where: str) -> None:
    """Destroy the recorded instance *inst*, by its id or, if creation was interrupted, its placement.

    A placement names one GPU instance: the job's instances do not overlap,
    and the baseline's come back only after the last of them is gone.  The
    profile id is compared when the record has one (None: a profile whose id
    is not published, and whose creation was interrupted before the driver
    told it).
    """
    pid = inst.get("gi_profile_id")

    def placed(e: Existing) -> bool:
        if pid is None:
            return (e.start, e.size) == (int(inst["start"]), int(inst["size"]))
        return (e.profile_id, e.start) == (int(pid), int(inst["start"]))

    current = {e.gi_id: e for e in instances.list_instances(a, dev)}
    gid = inst.get("gi_id")
    if gid is None or gid not in current or not placed(current[gid]):
        # Creation interrupted before its id was recorded: find it by placement.
        gid = next((e.gi_id for e in current.values() if placed(e)), None)
    if gid is not None:
        instances.destroy_gi(a, dev, gid, where)
