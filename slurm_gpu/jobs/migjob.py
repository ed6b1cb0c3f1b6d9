"""The job's MIG layout: checks, plan, create (prolog) and destroy + restore (epilog).

Every step is written to the job's state file before and after it happens:
the baseline instances found on each GPU (so the epilog can put them back),
each instance as "pending" (profile + placement) before its creation and
with its ids and UUID after.  A placement identifies a GPU instance, so even
an instance whose creation was interrupted before its id was recorded is
found and destroyed, and nothing the job did not create is ever touched.
"""
from __future__ import annotations

import os

from typing import Any, Callable

from ..errors import HardwareError
from ..mig import blockers, instances
from ..mig.instances import MigError
from ..mig.planner import plan_gpu, parse_layout
from . import state as jobstate
from .state import JobFailed


def _in_use_hint(e: MigError, ctx: Any) -> MigError:
    """Name what holds the GPU when NVML says IN_USE."""
    if e.code != 19 or not ctx.mig.check_blockers:   # 19: NVML_ERROR_IN_USE
        return e
    found = blockers.find()
    return MigError(f"{e.what}; blockers: {blockers.explain(found)}", e.where, e.code)


def setup(ctx: Any, st: dict[str, Any], api: Callable[[], Any], layout: str, whole: bool) -> None:
    """Check, plan and create the job's MIG layout on its GPUs."""
    if not ctx.mig.enabled:
        raise JobFailed("--gpu-mig is disabled on this cluster", "[mig] enabled")
    requests = parse_layout(layout)            # syntax first: no NVML for a typo
    jobid = st["jobid"]
    if not whole:
        raise JobFailed("--gpu-mig needs whole GPUs held by the job (--gpus/--gres=gpu), "
                        "not shards or gres/mps", f"job {jobid}")
    others = _gpus_of_other_jobs(ctx, jobid)
    a = api()
    gpus = st["gpus"]
    if len(requests) not in (1, len(gpus)):
        raise JobFailed(f"MIG layout names {len(requests)} GPU layouts but the job has "
                        f"{len(gpus)} GPU(s) on this node", "--gpu-mig")
    plans = []
    for k, g in enumerate(gpus):
        idx = g["index"]
        if g["uuid"] in others:
            raise JobFailed(f"GPU {idx} is also used by job {others[g['uuid']]}; --gpu-mig needs "
                            "GPUs the job holds exclusively", f"job {jobid}")
        dev = _open(a, g)
        name, model = instances.identify(a, dev)
        mode = instances.mig_mode(a, dev)
        if mode is None:
            raise JobFailed(f"GPU {idx} ({name}) does not support MIG", f"job {jobid}")
        if model is None:
            raise JobFailed(f"GPU {idx} ({name}) is a GPU model slurm-gpu has no MIG table "
                            "for; tell the admin", f"job {jobid}")
        if mode != 1:
            raise JobFailed(f"GPU {idx} ({name}) does not have MIG mode enabled; the admin "
                            "enables it with slurm-gpu mig apply", f"job {jobid}")
        reqs = requests[0] if len(requests) == 1 else requests[k]
        plans.append((g, dev, model, plan_gpu(reqs, model)))
    # Planned for every GPU before anything is touched: a bad layout leaves nothing.
    st["mig"] = {"layout": layout, "ready": False, "gpus": []}
    for g, dev, model, placements in plans:
        idx = g["index"]
        rec = {"index": idx, "uuid": g["uuid"], "minor": g.get("minor"), "model": model.key,
               "baseline": [], "baseline_removed": False, "instances": []}
        st["mig"]["gpus"].append(rec)
        rec["baseline"] = [e.to_dict() for e in instances.list_instances(a, dev)]
        # Marked before the first destroy: a failure (or a kill) half-way
        # must still have the epilog recreate what is gone.
        rec["baseline_removed"] = bool(rec["baseline"])
        jobstate.save(ctx.state_dir, st)
        where = f"GPU {idx}"
        try:
            for e in rec["baseline"]:
                instances.destroy_gi(a, dev, int(e["gi_id"]), where)
            for p in placements:
                inst = {"profile": p.name, "gi_profile_id": p.gi_profile_id, "start": p.start,
                        "size": p.size, "gi_id": None, "ci_id": None, "uuid": None}
                rec["instances"].append(inst)
                jobstate.save(ctx.state_dir, st)
                gid, cid = instances.create_placement(a, dev, p, where)
                inst["gi_id"], inst["ci_id"] = gid, cid
                inst["uuid"] = next((u for g2, c2, u in instances.mig_devices(a, dev)
                                     if g2 == gid and c2 == cid), None)
                if not inst["uuid"]:
                    raise HardwareError("new MIG device has no UUID", where)
                jobstate.save(ctx.state_dir, st)
        except MigError as e:
            raise _in_use_hint(e, ctx) from None
    st["mig"]["ready"] = True
    jobstate.save(ctx.state_dir, st)


def _open(a: Any, g: dict[str, Any]) -> int:
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
        for g in (s or {}).get("gpus", []):
            if isinstance(g, dict) and g.get("uuid"):
                out[str(g["uuid"])] = other
    return out


def teardown(ctx: Any, st: dict[str, Any], a: Any) -> None:
    """Destroy exactly what the job created, then restore each GPU's baseline."""
    mig = st.get("mig") or {}
    for rec in mig.get("gpus", []):
        idx = rec["index"]
        where = f"GPU {idx}"
        dev = _open(a, rec)
        try:
            for inst in list(rec.get("instances", [])):
                gid = inst.get("gi_id")
                current = {e.gi_id: e for e in instances.list_instances(a, dev)}
                if gid is None or gid not in current or \
                        (current[gid].profile_id, current[gid].start) != \
                        (inst["gi_profile_id"], inst["start"]):
                    # Creation interrupted before its id was recorded: find it by placement.
                    gid = instances.find_gi(a, dev, int(inst["gi_profile_id"]), int(inst["start"]))
                if gid is not None:
                    instances.destroy_gi(a, dev, gid, where)
                rec["instances"].remove(inst)
                jobstate.save(ctx.state_dir, st) if _has_file(ctx, st) else None
            if rec.get("baseline_removed"):
                for e in rec.get("baseline", []):
                    instances.recreate(a, dev, e, where)
                rec["baseline_removed"] = False
                jobstate.save(ctx.state_dir, st) if _has_file(ctx, st) else None
        except MigError as e:
            raise _in_use_hint(e, ctx) from None
    st["mig"] = None


def _has_file(ctx: Any, st: dict[str, Any]) -> bool:
    return os.path.exists(jobstate.path(ctx.state_dir, st["jobid"]))
