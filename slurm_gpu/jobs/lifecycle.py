"""Prolog and epilog: per-job MPS daemon and MIG layout, with the failure policy.

The prolog runs the job's steps (:mod:`slurm_gpu.jobs.steps`: MIG layout,
compute mode, MPS daemon, each recorded before it acts) through
:func:`slurm_gpu.jobs.steps.run`, the one place that decides what a failure
means (docs/mps-mig.md):

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
  anything is created and before every step acts), from the deterministic
  MPS directory ``<base>/<jobid>`` and from the processes bound to it, so it
  cleans up after a prolog that failed half-way or was killed, after a
  slurmd restart, and when run twice.
"""
from __future__ import annotations

import os

TYPE_CHECKING = False

from .. import joboptions as _options  # the one declaration of the SPANK options
from ..errors import Consequence, InputError, SlurmGpuError, message
from . import state as jobstate

# The context and the job's user and GPUs (re-exported: lifecycle.Context and
# lifecycle.default_context are the entry points of __main__, commands and tests).
from .context import Context, _lazy_api, default_context, job_gpu_facts, job_gpus, job_user  # noqa: F401 - default_context: the entry points import it from here
from .mps import JobUser
from .state import JobFailed, JobRecord, Phase, RecordFull
from .steps import Job, _failed, every_undo, parse_mps, policy_of, run, steps_for, undo
from .steps import cancel as _cancel

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["Context", "JobFailed", "JobUser", "default_context", "epilog", "job_gpus",
           "job_user", "mark_failed", "parse_mps", "prolog", "teardown"]

ENV_MPS = _options.prolog_env(_options.ENV_NAMES[_options.MPS])
ENV_MIG = _options.prolog_env(_options.ENV_NAMES[_options.MIG])


def _jobid(ctx: Context) -> str:
    return jobstate.check_jobid(ctx.env.get("SLURM_JOB_ID") or ctx.env.get("SLURM_JOBID", ""))


# -- prolog ---------------------------------------------------------------

def prolog(ctx: Context) -> int:
    """Set up what the job asked for; returns the prolog's exit status.

    Every way out honours ``on_internal_error``: whatever escapes the steps
    below (no job uid in the environment, an untrusted old record, a full
    disk under the state file that holds no MPS base_dir, an undo that fails
    after a user error) is a node fault; under ``pass`` the job is failed
    instead (recorded for its tasks, or cancelled when even that cannot be
    written) and the exit is 0.
    """
    policy = policy_of(ctx)
    try:
        return _prolog(ctx)
    except Exception as e:  # noqa: BLE001 - the policy decides, never a traceback to slurmd
        line = f"slurm-gpu: {message(e)}"
        ctx.log(f"{line} [prolog: node fault, on_internal_error={policy.on_internal_error}]")
        if policy.node_fault_exit():
            return 1
        _fail_job(ctx, message(e))
        return 0


def _fail_job(ctx: Context, text: str) -> None:
    """Under ``pass``: the job must not run without what it asked for."""
    try:
        jobid = _jobid(ctx)
    except SlurmGpuError:
        return                          # no job to fail: nothing more we can do
    try:
        st = jobstate.load(ctx.state_dir, jobid)
        if st is None:
            user = job_user(ctx.env)
            if user is None:
                raise InputError("no job user to record the error for")
            st = jobstate.new(jobid, uid=user.uid, gid=user.gid, user=user.name)
        st.fail(text, Consequence.NODE)
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
    jobid = _jobid(ctx)
    user = job_user(env)
    if user is None:
        raise InputError("prolog environment lacks SLURM_JOB_UID", f"job {jobid}")
    policy = policy_of(ctx)
    from .sweep import sweep
    for line in sweep(ctx, teardown, exclude=jobid):   # what failed epilogs of ended jobs left
        ctx.log(line)
    old = jobstate.load(ctx.state_dir, jobid)
    if old is not None:
        # An earlier run of this job here (requeued after a prolog whose undo
        # failed, or whose epilog never ran) left a record: finish its cleanup
        # first, or the new record would hide what it lists.
        ctx.log(f"slurm-gpu: prolog job {jobid}: cleaning up an earlier run's state first")
        earlier = Job(ctx, old, job_user(env, old), _lazy_api(ctx))
        try:
            for note in undo(earlier, every_undo()):
                ctx.log(f"slurm-gpu: prolog job {jobid}: {note}")
        except Exception as e:  # noqa: BLE001 - a node fault; the old record stays
            ctx.log(f"slurm-gpu: {message(e)} [job {jobid}: earlier run not cleaned up, "
                    f"on_internal_error={policy.on_internal_error}]")
            earlier.record.fail(message(e), Consequence.NODE)   # an undo that fails: the node's
            earlier.save()
            return policy.node_fault_exit()
    st = jobstate.new(jobid, uid=user.uid, gid=user.gid, user=user.name)
    st.options = {"mps": mps_opt or None, "mig": mig_opt or None}
    job = Job(ctx, st, user, _lazy_api(ctx))
    try:
        job.save()
    except RecordFull as e:         # a job user filled the filesystem: nothing done yet
        return _failed([], job, policy, e)
    return run(steps_for(mps_opt, mig_opt), job, policy)


def mark_failed(ctx: Context, line: str) -> None:
    """Record *line* as the job's error, so its tasks fail with it (prolog watchdog)."""
    jobid = _jobid(ctx)
    st = jobstate.load(ctx.state_dir, jobid)
    if st is not None and st.phase != Phase.READY:
        st.fail(line, Consequence.NODE)
        jobstate.save(ctx.state_dir, st)


def teardown(ctx: Context, st: JobRecord) -> list[str]:
    """The epilog's undo of a recorded job, without the job's environment (sweep, cleanup)."""
    user = job_user({}, st) if st.uid is not None else None
    return undo(Job(ctx, st, user, _lazy_api(ctx)), every_undo())


# -- epilog ---------------------------------------------------------------

def epilog(ctx: Context) -> int:
    """Tear down whatever the job has on this node; idempotent."""
    from . import mps
    env = ctx.env
    jobid = _jobid(ctx)
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
        st = JobRecord.stand_in(jobid)
    api = _lazy_api(ctx)
    policy = policy_of(ctx)

    try:
        for note in undo(Job(ctx, st, user, api), every_undo()):
            ctx.log(f"slurm-gpu: epilog job {jobid}: {note}")
    except Exception as e:  # noqa: BLE001
        ctx.log(f"slurm-gpu: {message(e)} [epilog job {jobid}: cleanup incomplete, "
                f"on_internal_error={policy.on_internal_error}]")
        return policy.node_fault_exit()
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
        facts = job_gpu_facts(ctx, indices)
    except Exception as e:  # noqa: BLE001 - not knowing the GPUs is no reason to drain
        ctx.log(f"slurm-gpu: epilog job {jobid}: leftovers not checked: {e}")
        return
    st = JobRecord.stand_in(jobid)
    st.gpus = facts
    _leftovers(ctx, st, job_user(ctx.env), _lazy_api(ctx))


def _leftovers(ctx: Context, st: JobRecord, user: JobUser | None, api: Callable[[], Any]) -> None:
    """user-problem: what the job left on its GPUs drains the node with a reason
    the health check resumes by itself once the GPUs are clean."""
    gpus = [g for g in st.gpus if isinstance(g, dict) and isinstance(g.get("index"), int)]
    if not ctx.health_state_dir or not gpus or st.whole_gpus is False:
        # A shard (gres/shard, gres/mps) shares its GPU with other jobs, the
        # user's own among them: their processes are no leftover of this one.
        return
    from ..health import userproblem as up
    jobid = st.jobid
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
    # A process in another job's cgroup is that job's, even the same user's
    # (a job that leaked onto this GPU where devices are not constrained).
    found = up.leftovers(h.gpus, user.uid if user else None,
                         elsewhere=up.in_other_job(jobid, ctx.env.get("SLURM_JOB_SLUID")))
    if not found:
        return
    reason = up.reason_for(jobid, found)
    path = up.marker_path(ctx.health_state_dir, ctx.node_name)
    try:
        lock = up.health_lock(ctx.health_state_dir, ctx.node_name)
    except (OSError, SlurmGpuError) as e:      # a planted or unopenable lock file: the job's note, no drain
        ctx.log(f"{reason} [not drained: {e}]")
        return
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
    policy = policy_of(ctx)
    ctx.log(f"{e.line()} [epilog job {jobid}: state file ignored, "
            f"on_internal_error={policy.on_internal_error}]")
    try:
        for note in mps.stop(ctx.mps, None, jobid, job_user(ctx.env), ctx.jobs.epilog_kill_wait):
            ctx.log(f"slurm-gpu: epilog job {jobid}: {note}")
    except Exception as e2:  # noqa: BLE001
        ctx.log(f"slurm-gpu: epilog job {jobid}: MPS cleanup incomplete: {e2}")
    return policy.node_fault_exit()
