"""The accounting step of the prolog and epilog (``python -m slurm_gpu.acct prolog|epilog``).

Neither ever fails the job or drains the node: any error is logged as one
line and the step exits 0.  Accounting is a record of what happened; it
must not change what happens.

* prolog: register the job's devices (``jobs/<id>.json``) and rewrite the
  dcgm-exporter mapping; a registration left by an earlier run of the same
  job (requeue after a failed epilog) is replaced.
* epilog: summarise the job's aggregates, mark the job ended, remove its
  registration, aggregates and mapping, then store the summary in slurmdbd;
  when slurmdbd does not confirm it, it is kept in ``pending/`` and retried
  by the sampler and by later epilogs.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Mapping

from ..jobs.state import check_jobid
from . import aggregate, dbd, metrics
from .attribution import SLUID, sluids_of
from .settings import AcctSettings
from .store import Store

MAX_RETRIES_PER_EPILOG = 3
MAX_SLUIDS = 16          # a job's last SLUIDs (one per requeue) kept for attribution
VERIFY_AFTER_S = 60.0


def _log(msg: str) -> None:
    print(msg, file=sys.stderr)


def _jobid(env: Mapping[str, str]) -> str:
    return check_jobid(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID", ""))


def _indices(env: Mapping[str, str]) -> list[int]:
    text = env.get("SLURM_JOB_GPUS", "").strip() or env.get("CUDA_VISIBLE_DEVICES", "").strip()
    return [int(p) for p in text.split(",") if p.strip().isdigit() and len(p.strip()) <= 4]


def _gres_conf(env: Mapping[str, str], node: str) -> Any:
    """The node's deployed gres.conf (what slurmd numbered), or None: then the
    records are rendered from the live model.  Only explicit GPU lines
    (AutoDetect off, what our generator writes): with AutoDetect slurmd adds
    and sorts what it detects."""
    from ..confgen.gresorder import read_conf
    from ..errors import SlurmGpuError
    from ..nodefacts import gres_conf_path
    try:
        conf = read_conf(gres_conf_path(env), node)
    except SlurmGpuError:
        return None
    if conf is None or (conf.autodetect or "off") != "off" or not any(n == "gpu" for n, _ in conf.devices):
        return None
    return conf


def register(s: AcctSettings, store: Store, env: Mapping[str, str], node: str,
             device_order: Callable[[], list[str]], mig_state: dict[str, Any] | None,
             now: float | None = None) -> dict[str, Any]:
    """Write the job's registration (and the mapping); returns it."""
    from .devices import job_device_keys
    jobid = _jobid(env)
    idx = _indices(env)
    keys = job_device_keys(idx, device_order() if idx and not (mig_state or {}).get("gpus") else [],
                           mig_state) if (idx or mig_state) else []
    reg = {"jobid": jobid, "node": node, "user": env.get("SLURM_JOB_USER", ""),
           "uid": env.get("SLURM_JOB_UID", ""), "account": env.get("SLURM_JOB_ACCOUNT", ""),
           "partition": env.get("SLURM_JOB_PARTITION", ""), "devices": keys,
           "start": round(time.time() if now is None else now, 3)}
    # gres/mps: Slurm gives the prolog the job's MPS thread percentage
    # (gres_mps.c, prep env); its GPU is shared with other jobs' MPS clients.
    if env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "").strip():
        reg["shared"] = True
    # 26.05: the job's cgroup v2 directory is named by it (attribution by process).
    # Each requeue gives the job a new SLUID (job_record_set_sluid() in Slurm's
    # src/common/job_record.c), so an earlier run's directory, and a process it
    # left there, keeps the SLUID that run had: the earlier SLUIDs are kept too.
    sluid = env.get("SLURM_JOB_SLUID", "")
    earlier = store.read("jobs", jobid)
    before = store.ended_sluids(jobid) + (sluids_of(earlier) if earlier is not None else [])
    if SLUID.fullmatch(sluid):
        reg["sluid"] = sluid
        before.append(sluid)
    if before:
        reg["sluids"] = list(dict.fromkeys(reversed(before)))[:MAX_SLUIDS][::-1]
    if earlier is not None:
        _log(f"slurm-gpu: acct prolog job {jobid}: replacing an earlier run's registration")
    store.remove("agg", jobid)
    store.remove("ended", jobid)
    store.write("jobs", jobid, reg)
    if s.dcgm_mapping_dir:
        metrics.sync_mapping(s.dcgm_mapping_dir, store.registrations())
    return reg


def finish(s: AcctSettings, store: Store, jobid: str, node: str, *, store_dbd: bool = True,
           env: Mapping[str, str] | None = None, retries: int = MAX_RETRIES_PER_EPILOG,
           now: float | None = None) -> dbd.Outcome | None:
    """End the job on this node: summary, then every record of it removed.

    Idempotent: a second run finds nothing and does nothing.  Returns the
    slurmdbd outcome (None when there was nothing to store).
    """
    agg = store.read("agg", jobid)
    reg = store.read("jobs", jobid)
    store.mark_ended(jobid, sluids_of(reg) if reg is not None else ())
    part = None
    if agg is not None and agg.get("devices"):
        part = aggregate.summary(node, agg["devices"], s.interval, s.summary_max_bytes)
        if reg is not None:
            part["held"] = reg.get("devices", [])
    elif reg is not None and reg.get("devices"):
        part = {"v": aggregate.SUMMARY_VERSION, "iv": s.interval, "dev": {}, "held": reg["devices"],
                "nosamples": 1}
    if part is not None:
        # Kept before the records go: a crash from here on loses nothing.
        store.write("pending", jobid, {"jobid": jobid, "node": node, "part": part,
                                       "since": time.time() if now is None else now,
                                       "why": "not stored yet"})
    store.remove("jobs", jobid)
    store.remove("agg", jobid)
    if s.dcgm_mapping_dir:
        metrics.sync_mapping(s.dcgm_mapping_dir, store.registrations())
    out = None
    if part is not None and store_dbd:
        outs = retry_pending(s, store, only=[jobid], env=env, now=now)
        out = outs[0] if outs else None
        if out is not None and out.stored and retries:
            retry_pending(s, store, limit=retries, env=env, now=now)
    return out


def retry_pending(s: AcctSettings, store: Store, *, only: list[str] | None = None, limit: int | None = None,
                  env: Mapping[str, str] | None = None, now: float | None = None) -> list[dbd.Outcome]:
    """Try to store pending summaries; drop them once confirmed twice or too old.

    A stored summary is checked once more after :data:`VERIFY_AFTER_S`:
    slurmctld's own job record, arriving late with another tool's
    AdminComment, would replace ours; the second check puts it back.
    """
    now = time.time() if now is None else now
    ids = only if only is not None else store.ids("pending")
    outs = []
    for jobid in ids[:limit] if limit else ids:
        rec = store.read("pending", jobid)
        if rec is None:
            continue
        if rec.get("final") or now - float(rec.get("since", now)) > s.retry_hours * 3600:
            if now - float(rec.get("since", now)) > s.retry_hours * 3600:
                store.remove("pending", jobid)
            continue
        confirmed = rec.get("confirmed")
        if confirmed is not None and now - float(confirmed) < VERIFY_AFTER_S:
            continue
        out = dbd.store(s, jobid, rec["node"], rec["part"], env)
        outs.append(out)
        if out.stored and confirmed is not None:
            store.remove("pending", jobid)
        elif out.stored:
            rec.update(confirmed=now, why="stored; checked again later")
            store.write("pending", jobid, rec)
        else:
            rec.update(why=out.why, final=out.final, tries=int(rec.get("tries", 0)) + 1, confirmed=None)
            store.write("pending", jobid, rec)
            if not out.final:
                break        # slurmdbd unreachable: the others would wait as long
    return outs


def main(step: str, env: Mapping[str, str] | None = None) -> int:
    """Entry point of the prolog/epilog step; always 0."""
    env = os.environ if env is None else env
    try:
        from ..hw import live
        from . import settings as acct_settings
        s = acct_settings.load()
        if not s.enabled:
            return 0
        node_s = live.settings()
        store = Store(acct_settings.acct_dir(s, node_s.state_dir))
        node = live.node_name()
        jobid = _jobid(env)
        if step == "prolog":
            from ..jobs import state as jobstate
            from .devices import slurm_device_keys
            js = jobstate.load(node_s.state_dir, jobid)
            register(s, store, env, node, lambda: slurm_device_keys(live.this_node(node_s), _gres_conf(env, node)),
                     js.mig if js and js.mig and js.mig.get("ready") else None)
        else:
            out = finish(s, store, jobid, node)
            if out is not None and not out.stored:
                _log(f"slurm-gpu: acct epilog job {jobid}: summary kept on the node ({out.why}); "
                     "retried later")
        return 0
    except Exception as e:  # noqa: BLE001 - accounting never fails a job or drains a node
        from ..errors import message
        _log(f"slurm-gpu: {message(e)} [acct {step}]")
        return 0
