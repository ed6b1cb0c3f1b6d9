"""Prolog and epilog: per-job MPS daemon and MIG layout, with the failure policy.

Failure policy (docs/mps-mig.md):

* a user's mistake (bad option value, impossible layout, MIG on a GPU the
  job does not hold whole or whose MIG mode is off) never drains the node:
  the prolog undoes what it did, records the one-line error in the job's
  state file and exits 0; the SPANK plugin then fails every task of the
  job with that line (``state.task_env`` raises), or with
  ``[jobs] user_error = "cancel"`` the prolog cancels the job;
* a node fault (NVML or the MPS daemon failing, a blocker holding the GPU,
  a bad config) also undoes what it did; ``[jobs] on_internal_error =
  "drain"`` exits 1, so Slurm drains the node and requeues the job;
  ``"pass"`` exits 0 and fails the job like a user error;
* the epilog is idempotent: it works from the state file (written before
  anything is created and after every step), from the deterministic MPS
  directory ``<base>/<jobid>`` and from the processes bound to it, so it
  cleans up after a prolog that failed half-way or was killed, after a
  slurmd restart, and when run twice.
"""
from __future__ import annotations

import os
TYPE_CHECKING = False

from ..errors import InputError, SlurmGpuError, UsageError
from . import state as jobstate
# The context and the job's user and GPUs (re-exported: lifecycle.Context and
# lifecycle.default_context are the entry points of __main__, commands and tests).
from .context import Context, _gpu_facts, _lazy_api, default_context, job_gpus, job_user  # noqa: F401 - default_context: the entry points import it from here
from .mps import JobUser
from .state import JobFailed

from .. import joboptions as _options  # the one declaration of the SPANK options

if TYPE_CHECKING:
    from typing import Any, Callable
    from ..hw.gpus import Gpus

ENV_MPS = _options.prolog_env(_options.ENV_NAMES[_options.MPS])
ENV_MIG = _options.prolog_env(_options.ENV_NAMES[_options.MIG])


# -- options --------------------------------------------------------------

def parse_mps(value: str) -> int | None:
    """``default`` -> None; ``1``..``100`` -> the percentage; else a usage error.

    The SPANK option's own parser decides (one parser for srun and prolog).
    """
    try:
        v = _options.parse_mps(value)
    except UsageError:
        raise UsageError(f"bad --gpu-mps value {value!r}: expected a percentage 1-100 or "
                         "'default'", "--gpu-mps") from None
    return None if v == _options.MPS_DEFAULT else int(v)


# -- prolog ---------------------------------------------------------------

def prolog(ctx: Context) -> int:
    """Set up what the job asked for; returns the prolog's exit status.

    Every way out honours ``on_internal_error``: whatever escapes the steps
    below (no job uid in the environment, an untrusted old record, a full
    disk under the state file, an undo that fails after a user error) is a
    node fault; under ``pass`` the job is failed instead (recorded for its
    tasks, or cancelled when even that cannot be written) and the exit is 0.
    """
    try:
        return _prolog(ctx)
    except Exception as e:  # noqa: BLE001 - the policy decides, never a traceback to slurmd
        line = e.line() if isinstance(e, SlurmGpuError) else \
            f"slurm-gpu: internal error: {type(e).__name__}: {e}"
        ctx.log(f"{line} [prolog: node fault, on_internal_error={ctx.jobs.on_internal_error}]")
        if ctx.jobs.on_internal_error == "drain":
            return 1
        _fail_job(ctx, line)
        return 0


def _fail_job(ctx: Context, line: str) -> None:
    """Under ``pass``: the job must not run without what it asked for."""
    jobid = ctx.env.get("SLURM_JOB_ID") or ctx.env.get("SLURM_JOBID", "")
    try:
        jobid = jobstate.check_jobid(jobid)
    except SlurmGpuError:
        return                          # no job to fail: nothing more we can do
    try:
        st = jobstate.load(ctx.state_dir, jobid)
        if st is None:
            user = job_user(ctx.env)
            if user is None:
                raise InputError("no job user to record the error for")
            st = jobstate.new(jobid, uid=user.uid, gid=user.gid, user=user.name)
        st["error"] = line
        st["phase"] = "failed"
        jobstate.save(ctx.state_dir, st)
    except Exception as e:  # noqa: BLE001 - unrecordable (full disk, bad state dir): cancel it
        ctx.log(f"slurm-gpu: cannot record the error for job {jobid} ({e}); cancelling it")
        _cancel(ctx, jobid)


def _prolog(ctx: Context) -> int:
    env = ctx.env
    mps_opt = env.get(ENV_MPS, "").strip()
    mig_opt = env.get(ENV_MIG, "").strip()
    if not mps_opt and not mig_opt:
        return 0
    jobid = jobstate.check_jobid(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID", ""))
    user = job_user(env)
    if user is None:
        raise InputError("prolog environment lacks SLURM_JOB_UID", f"job {jobid}")
    from .sweep import sweep
    for line in sweep(ctx, teardown, exclude=jobid):   # what failed epilogs of ended jobs left
        ctx.log(line)
    old = jobstate.load(ctx.state_dir, jobid)
    if old is not None:
        # An earlier run of this job here (requeued after a prolog whose undo
        # failed, or whose epilog never ran) left a record: finish its cleanup
        # first, or the new record would hide what it lists.
        ctx.log(f"slurm-gpu: prolog job {jobid}: cleaning up an earlier run's state first")
        try:
            for note in _undo(ctx, old, job_user(env, old), _lazy_api(ctx)):
                ctx.log(f"slurm-gpu: prolog job {jobid}: {note}")
        except Exception as e:  # noqa: BLE001 - a node fault; the old record stays
            line = e.line() if isinstance(e, SlurmGpuError) else \
                f"slurm-gpu: internal error: {type(e).__name__}: {e}"
            ctx.log(f"{line} [job {jobid}: earlier run not cleaned up, "
                    f"on_internal_error={ctx.jobs.on_internal_error}]")
            old["error"] = line
            old["phase"] = "failed"
            jobstate.save(ctx.state_dir, old)
            return 1 if ctx.jobs.on_internal_error == "drain" else 0
    st = jobstate.new(jobid, uid=user.uid, gid=user.gid, user=user.name)
    st["options"] = {"mps": mps_opt or None, "mig": mig_opt or None}
    jobstate.save(ctx.state_dir, st)
    api = _lazy_api(ctx)

    try:
        percentage = parse_mps(mps_opt) if mps_opt else None
        if mps_opt:
            from .mps import check_usable
            check_usable(ctx.mps)      # before any MIG work: the job cannot run here anyway
        indices, whole = job_gpus(env)
        if not indices:
            raise JobFailed("--gpu-mps/--gpu-mig need GPUs: ask for them with --gpus or --gres=gpu",
                            f"job {jobid}")
        st["gpus"] = _gpu_facts(ctx, indices)
        st["whole_gpus"] = whole
        jobstate.save(ctx.state_dir, st)
        if mig_opt:
            from . import migjob
            migjob.setup(ctx, st, api, mig_opt, whole)
        if mps_opt:
            _setup_mps(ctx, st, user, percentage, whole, api)
        st["phase"] = "ready"
        jobstate.save(ctx.state_dir, st)
        return 0
    except (UsageError, JobFailed) as e:
        line = e.line()
        ctx.log(f"{line} [job {jobid}: user error, job fails, node stays up]")
        try:
            _undo(ctx, st, user, api)
        except Exception as e2:  # noqa: BLE001 - the undo failing is the node's fault
            ctx.log(f"slurm-gpu: prolog cleanup incomplete, the epilog retries: {e2} "
                    f"[job {jobid}: on_internal_error={ctx.jobs.on_internal_error}]")
            st["error"] = line
            st["phase"] = "failed"
            jobstate.save(ctx.state_dir, st)
            return 1 if ctx.jobs.on_internal_error == "drain" else 0
        st["error"] = line
        st["phase"] = "failed"
        jobstate.save(ctx.state_dir, st)
        if ctx.jobs.user_error == "cancel":
            _cancel(ctx, jobid)
        return 0
    except Exception as e:  # noqa: BLE001 - node fault: clean up, then apply the policy
        line = e.line() if isinstance(e, SlurmGpuError) else \
            f"slurm-gpu: internal error: {type(e).__name__}: {e}"
        ctx.log(f"{line} [job {jobid}: node fault, on_internal_error={ctx.jobs.on_internal_error}]")
        try:
            _undo(ctx, st, user, api)
        except Exception as e2:  # noqa: BLE001
            # Something is left behind: keep the record so the epilog finishes the job.
            ctx.log(f"slurm-gpu: prolog cleanup incomplete, the epilog retries: {e2}")
            st["error"] = line
            st["phase"] = "failed"
            jobstate.save(ctx.state_dir, st)
            return 1 if ctx.jobs.on_internal_error == "drain" else 0
        if ctx.jobs.on_internal_error == "drain":
            jobstate.remove(ctx.state_dir, jobid)   # requeued elsewhere; nothing left here
            return 1
        st["error"] = line
        st["phase"] = "failed"
        jobstate.save(ctx.state_dir, st)
        return 0


def mark_failed(ctx: Context, line: str) -> None:
    """Record *line* as the job's error, so its tasks fail with it (prolog watchdog)."""
    jobid = jobstate.check_jobid(ctx.env.get("SLURM_JOB_ID") or ctx.env.get("SLURM_JOBID", ""))
    st = jobstate.load(ctx.state_dir, jobid)
    if st is not None and st.get("phase") != "ready":
        st["error"] = line
        st["phase"] = "failed"
        jobstate.save(ctx.state_dir, st)


def _cancel(ctx: Context, jobid: str) -> None:
    from .. import runner
    try:
        runner.run([ctx.jobs.scancel, jobid], 10, check=False)
    except SlurmGpuError as e:
        ctx.log(f"slurm-gpu: could not cancel job {jobid}: {e.what}")


def _setup_mps(ctx: Context, st: dict[str, Any], user: JobUser, percentage: int | None,
               whole: bool, api: Callable[[], Any]) -> None:
    from . import mps
    gpus = st["gpus"]
    if ctx.mps.exclusive_process and whole:
        _set_compute_modes(ctx, st, api())
    devices = ",".join(g["uuid"] for g in gpus)
    if jobstate.mig_uuids(st):
        devices = ",".join(jobstate.mig_uuids(st))   # MPS on MIG: one server per MIG device
    cpus = sorted({c for g in gpus for c in g["cpus"]})

    def record(info: dict[str, Any]) -> None:
        st["mps"] = dict(info)
        jobstate.save(ctx.state_dir, st)

    mps.start(ctx.mps, st["jobid"], user, devices, cpus, percentage, record,
              sluid=ctx.env.get("SLURM_JOB_SLUID"))


def _set_compute_modes(ctx: Context, st: dict[str, Any], gpus: Gpus) -> None:
    from ..hw.gpus import COMPUTE_MODE_EXCLUSIVE_PROCESS, GpuError
    saved = st.setdefault("compute_mode_saved", {})
    for g in st["gpus"]:
        index = gpus.find(uuid=g["uuid"], minor=g.get("minor"))
        try:
            old = gpus.compute_mode(index)
            saved[g["uuid"]] = {"mode": old, "minor": g.get("minor")}
            jobstate.save(ctx.state_dir, st)
            gpus.set_compute_mode(index, COMPUTE_MODE_EXCLUSIVE_PROCESS)
        except GpuError as e:
            from ..errors import HardwareError
            raise HardwareError(f"cannot set EXCLUSIVE_PROCESS compute mode: {e}",
                                g["uuid"]) from None


def _restore_compute_modes(ctx: Context, st: dict[str, Any], gpus: Gpus) -> None:
    from ..errors import HardwareError
    saved = st.get("compute_mode_saved") or {}
    for uuid, rec in list(saved.items()):
        if not isinstance(rec, dict) or not str(uuid).startswith("GPU-"):
            # Written by a version that keyed GPUs by NVML index: which GPU
            # that was is not knowable, so nothing is touched.
            raise HardwareError(f"compute mode recorded for an unidentified GPU {uuid!r}; "
                                "restore it by hand, then run slurm-gpu job cleanup", "state")
        gpus.set_compute_mode(gpus.find(uuid=uuid, minor=rec.get("minor")), int(rec["mode"]))
        del saved[uuid]
        jobstate.save(ctx.state_dir, st)


def _undo(ctx: Context, st: dict[str, Any], user: JobUser | None,
          api: Callable[[], Any]) -> list[str]:
    """Remove everything *st* records; raises on a failure that leaves something behind."""
    from . import mps
    notes = mps.stop(ctx.mps, st.get("mps"), st["jobid"], user, ctx.jobs.epilog_kill_wait)
    st["mps"] = None
    if st.get("compute_mode_saved"):
        _restore_compute_modes(ctx, st, api())
    if st.get("mig"):
        from . import migjob
        migjob.teardown(ctx, st, api())
    jobstate.save(ctx.state_dir, st) if os.path.exists(jobstate.path(ctx.state_dir, st["jobid"])) \
        else None
    return notes


def teardown(ctx: Context, st: dict[str, Any]) -> list[str]:
    """The epilog's undo of a recorded job, without the job's environment (sweep, cleanup)."""
    return _undo(ctx, st, job_user({}, st) if "uid" in st else None, _lazy_api(ctx))


# -- epilog ---------------------------------------------------------------

def epilog(ctx: Context) -> int:
    """Tear down whatever the job has on this node; idempotent."""
    from . import mps
    env = ctx.env
    jobid = jobstate.check_jobid(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID", ""))
    try:
        st = jobstate.load(ctx.state_dir, jobid)
    except InputError as e:
        return _epilog_untrusted_state(ctx, jobid, e)
    has_dir = os.path.lexists(mps.job_dir(ctx.mps.base_dir, jobid))
    if st is None and not has_dir:
        # A job without --gpu-mps/--gpu-mig: nothing of ours to undo, but
        # what it left on its GPUs (Slurm names them) is still looked at.
        _leftovers_of_plain_job(ctx, jobid)
        return 0
    user = job_user(env, st)
    if st is None:
        st = {"jobid": jobid, "mps": None, "mig": None}
    api = _lazy_api(ctx)

    try:
        for note in _undo(ctx, st, user, api):
            ctx.log(f"slurm-gpu: epilog job {jobid}: {note}")
    except Exception as e:  # noqa: BLE001
        line = e.line() if isinstance(e, SlurmGpuError) else \
            f"slurm-gpu: internal error: {type(e).__name__}: {e}"
        ctx.log(f"{line} [epilog job {jobid}: cleanup incomplete, "
                f"on_internal_error={ctx.jobs.on_internal_error}]")
        return 1 if ctx.jobs.on_internal_error == "drain" else 0
    _leftovers(ctx, st, user, api)
    jobstate.remove(ctx.state_dir, jobid)
    return 0


def _leftovers_of_plain_job(ctx: Context, jobid: str) -> None:
    if not ctx.health_state_dir:
        return
    indices, whole = job_gpus(ctx.env)
    if not indices or not whole:
        return                          # a shared GPU: see _leftovers
    try:
        facts = _gpu_facts(ctx, indices)
    except Exception as e:  # noqa: BLE001 - not knowing the GPUs is no reason to drain
        ctx.log(f"slurm-gpu: epilog job {jobid}: leftovers not checked: {e}")
        return
    _leftovers(ctx, {"jobid": jobid, "gpus": facts}, job_user(ctx.env), _lazy_api(ctx))


def _leftovers(ctx: Context, st: dict[str, Any], user: JobUser | None, api: Callable[[], Any]) -> None:
    """user-problem: what the job left on its GPUs drains the node with a reason
    the health check resumes by itself once the GPUs are clean."""
    gpus = [g for g in st.get("gpus") or () if isinstance(g, dict) and isinstance(g.get("index"), int)]
    if not ctx.health_state_dir or not gpus or st.get("whole_gpus") is False:
        # A shard (gres/shard, gres/mps) shares its GPU with other jobs, the
        # user's own among them: their processes are no leftover of this one.
        return
    from ..health import userproblem as up
    jobid = st["jobid"]
    from .migjob import _gpus_of_other_jobs
    shared = _gpus_of_other_jobs(ctx, jobid)
    mine = [g for g in gpus if g.get("uuid") not in shared]
    if not mine:
        return
    from ..hw.nvml_health import read_processes
    try:
        # g["index"] is Slurm's; NVML's index of the same GPU comes from its UUID and minor.
        a = api()
        h = read_processes(a, [a.find(uuid=g.get("uuid"), minor=g.get("minor")) for g in mine])
    except Exception as e:  # noqa: BLE001 - not knowing is no reason to drain
        ctx.log(f"slurm-gpu: epilog job {jobid}: leftovers not checked: {e}")
        return
    found = up.leftovers(h.gpus, user.uid if user else None)
    if not found:
        return
    reason = up.reason_for(jobid, found)
    path = up.marker_path(ctx.health_state_dir, ctx.node_name)
    lock = up.health_lock(ctx.health_state_dir, ctx.node_name)
    if lock is None:
        ctx.log(f"{reason} [not drained: the health check holds its lock for longer than "
                f"{up.LOCK_WAIT:g} s]")
        return
    try:
        if up.load_marker(path) is not None:
            ctx.log(f"{reason} [not drained: an earlier user-problem drain is still open]")
            return
        # The marker first: a drain we make must always be one the health check can lift.
        up.save_marker(path, up.Marker(reason, jobid, user.uid if user else None,
                                       tuple(g.bus_id for g in h.gpus if g.bus_id)))
        note = up.drain(ctx.node_name, reason, timeout=10.0)
        if note != "drained":
            up.drop_marker(path)
        ctx.log(f"{reason} [{note}]")
    finally:
        os.close(lock)


def _epilog_untrusted_state(ctx: Context, jobid: str, e: InputError) -> int:
    """A state file that is corrupt or not root's: act on nothing it says.

    Only the MPS daemon is found without it (the deterministic pipe
    directory and the job user from slurmd's environment); MIG instances and
    the file itself are left for the admin, so this is a node fault.
    """
    from . import mps
    ctx.log(f"{e.line()} [epilog job {jobid}: state file ignored, "
            f"on_internal_error={ctx.jobs.on_internal_error}]")
    try:
        for note in mps.stop(ctx.mps, None, jobid, job_user(ctx.env), ctx.jobs.epilog_kill_wait):
            ctx.log(f"slurm-gpu: epilog job {jobid}: {note}")
    except Exception as e2:  # noqa: BLE001
        ctx.log(f"slurm-gpu: epilog job {jobid}: MPS cleanup incomplete: {e2}")
    return 1 if ctx.jobs.on_internal_error == "drain" else 0
