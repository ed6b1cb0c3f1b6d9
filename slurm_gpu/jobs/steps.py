"""The prolog's steps, each with ``apply`` and ``undo``, and the one failure policy.

A step records what it is about to do in the job's :class:`~.state.JobRecord`
(saved to its file) *before* it acts, and its ``undo`` works from that record
alone.  So a prolog killed between the record and the act, or half-way
through the act, leaves the epilog able to undo it, and running ``undo``
twice, or for a step that never began, is harmless.

:func:`run` is the only place that decides what a failure means: it asks the
error for its consequence (:class:`slurm_gpu.errors.Consequence`), undoes
every step, records the error for the job's tasks and returns the prolog's
exit status under the admin's policy (docs/mps-mig.md):

* ``USER``/``INPUT`` (a bad option value, an impossible layout, the job's own
  processes interfering): the job fails, the node stays up (exit 0);
* ``NODE``: ``[jobs] on_internal_error = "drain"`` exits 1 (Slurm drains the
  node and requeues the job); ``"pass"`` exits 0 and fails the job;
* an undo that fails leaves something behind: a node fault, and the record
  stays for the epilog.
"""
from __future__ import annotations

from .. import joboptions as _options
from ..errors import Consequence, SlurmGpuError, UsageError, consequence, message
from . import state as jobstate
from .context import Job
from .state import JobFailed, Phase, RecordFull

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from .context import Context
    from .state import MpsRecord


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


class Step:
    """One change to the node for a job; ``undo`` is idempotent and reads only the record."""

    name = "step"

    def apply(self, job: Job) -> None:
        """Record what is about to change, save, then change it."""

    def undo(self, job: Job) -> list[str]:
        """Put back what the record says this step changed; returns log notes."""
        return []


class Request(Step):
    """What the job asked for, checked before anything changes; records its GPUs."""

    name = "request"

    def __init__(self, mps: str, mig: str) -> None:
        self.mps = mps
        self.mig = mig

    def apply(self, job: Job) -> None:
        from .context import job_gpu_facts, job_gpus
        job.percentage = parse_mps(self.mps) if self.mps else None
        if self.mps:
            from .mps import check_usable
            check_usable(job.ctx.mps)      # before any MIG work: the job cannot run here anyway
        indices, whole = job_gpus(job.ctx.env)
        if not indices:
            raise JobFailed("--gpu-mps/--gpu-mig need GPUs: ask for them with --gpus or --gres=gpu",
                            f"job {job.jobid}")
        job.record.gpus = job_gpu_facts(job.ctx, indices)
        job.record.whole_gpus = whole
        job.save()


class MigLayout(Step):
    """The job's MIG instances (:mod:`.migjob`); the baseline instances are put back on undo."""

    name = "mig"

    def __init__(self, layout: str | None) -> None:
        self.layout = layout

    def apply(self, job: Job) -> None:
        if self.layout:
            from . import migjob
            migjob.setup(job, self.layout)

    def undo(self, job: Job) -> list[str]:
        if job.record.mig:
            from . import migjob
            migjob.teardown(job)
        return []


class ComputeMode(Step):
    """``EXCLUSIVE_PROCESS`` on the job's whole GPUs under its MPS daemon (``[mps] exclusive_process``)."""

    name = "compute_mode"

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted

    def apply(self, job: Job) -> None:
        if not (self.wanted and job.ctx.mps.exclusive_process and job.record.whole_gpus):
            return
        from ..errors import HardwareError
        from ..hw.gpus import COMPUTE_MODE_EXCLUSIVE_PROCESS, GpuError
        gpus = job.api()
        saved = job.record.compute_mode_saved
        for g in job.record.gpus:
            index = gpus.find(uuid=g["uuid"], minor=g.get("minor"))
            try:
                saved[g["uuid"]] = {"mode": gpus.compute_mode(index), "minor": g.get("minor")}
                job.save()
                gpus.set_compute_mode(index, COMPUTE_MODE_EXCLUSIVE_PROCESS)
            except GpuError as e:
                raise HardwareError(f"cannot set EXCLUSIVE_PROCESS compute mode: {e}",
                                    g["uuid"]) from None

    def undo(self, job: Job) -> list[str]:
        saved = job.record.compute_mode_saved
        if not saved:
            return []
        from ..errors import HardwareError
        gpus = job.api()
        for uuid, rec in list(saved.items()):
            if not isinstance(rec, dict) or not str(uuid).startswith("GPU-"):
                # Written by a version that keyed GPUs by NVML index: which GPU
                # that was is not knowable, so nothing is touched.
                raise HardwareError(f"compute mode recorded for an unidentified GPU {uuid!r}; "
                                    "restore it by hand, then run slurm-gpu job cleanup", "state")
            gpus.set_compute_mode(gpus.find(uuid=uuid, minor=rec.get("minor")), int(rec["mode"]))
            del saved[uuid]
            job.save_if_on_file()
        return []


class MpsDaemon(Step):
    """The job's MPS control daemon (:mod:`.mps`: it records each step of its start)."""

    name = "mps"

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted

    def apply(self, job: Job) -> None:
        if not self.wanted:
            return
        from . import mps
        assert job.user is not None
        rec = job.record
        devices = ",".join(g["uuid"] for g in rec.gpus)
        if rec.mig_uuids():
            devices = ",".join(rec.mig_uuids())   # MPS on MIG: one server per MIG device
        cpus = sorted({c for g in rec.gpus for c in g["cpus"]})

        def record(info: MpsRecord) -> None:
            rec.mps = info.copy()
            job.save()

        minors = [m for m in (g.get("minor") for g in rec.gpus) if type(m) is int]
        mps.start(job.ctx.mps, rec.jobid, job.user, devices, cpus, job.percentage, record,
                  sluid=job.ctx.env.get("SLURM_JOB_SLUID"),
                  gpu_minors=minors if len(minors) == len(rec.gpus) else None)

    def undo(self, job: Job) -> list[str]:
        # Always: the daemon is found by its deterministic directory and the
        # processes bound to it even when the record never said it started.
        from . import mps
        notes = mps.stop(job.ctx.mps, job.record.mps, job.jobid, job.user,
                         job.ctx.jobs.epilog_kill_wait)
        job.record.mps = None
        return notes


def steps_for(mps: str, mig: str) -> list[Step]:
    """The prolog's steps for the job's options, in the order they apply (undo: reversed)."""
    return [Request(mps, mig), MigLayout(mig or None), ComputeMode(bool(mps)), MpsDaemon(bool(mps))]


def every_undo() -> list[Step]:
    """Every step, for an undo that knows only the record (epilog, sweep, cleanup)."""
    return steps_for("", "")


def undo(job: Job, steps: list[Step]) -> list[str]:
    """Undo *steps* in reverse order; raises on a failure that leaves something behind."""
    notes: list[str] = []
    for step in reversed(steps):
        notes += step.undo(job)
    job.save_if_on_file()
    return notes


class Policy:
    """What a failure does to the job and the node: ``[jobs]`` on_internal_error and user_error."""

    def __init__(self, on_internal_error: str, user_error: str,
                 cancel: Callable[[str], None]) -> None:
        self.on_internal_error = on_internal_error
        self.user_error = user_error
        self.cancel = cancel

    def node_fault_exit(self) -> int:
        """The exit status of a node fault: non-zero drains the node (and requeues the job)."""
        return 1 if self.on_internal_error == "drain" else 0

    @staticmethod
    def users_doing(consequence: str) -> bool:
        return consequence in (Consequence.USER, Consequence.INPUT)


def policy_of(ctx: Context) -> Policy:
    return Policy(ctx.jobs.on_internal_error, ctx.jobs.user_error, lambda jobid: cancel(ctx, jobid))


def cancel(ctx: Context, jobid: str) -> None:
    from .. import runner
    try:
        runner.run([ctx.jobs.scancel, jobid], 10, check=False)
    except SlurmGpuError as e:
        ctx.log(f"slurm-gpu: could not cancel job {jobid}: {e.what}")


def fail(job: Job, error: BaseException | str, kind: str) -> None:
    """Record the job's failure (its tasks fail with the line) and save it."""
    job.record.fail(error if isinstance(error, str) else message(error), kind)
    job.save()


def run(steps: list[Step], job: Job, policy: Policy) -> int:
    """Apply *steps*; on a failure classify it, undo, record and return the exit status."""
    try:
        for step in steps:
            step.apply(job)
        job.record.phase = Phase.READY
        job.save()
        return 0
    except Exception as e:  # noqa: BLE001 - the policy decides, never a traceback to slurmd
        return _failed(steps, job, policy, e)


def _failed(steps: list[Step], job: Job, policy: Policy, e: Exception) -> int:
    kind = consequence(e)
    line = f"slurm-gpu: {message(e)}"
    users = policy.users_doing(kind)
    job.ctx.log(f"{line} [job {job.jobid}: user error, job fails, node stays up]" if users else
                f"{line} [job {job.jobid}: node fault, on_internal_error={policy.on_internal_error}]")
    try:
        undo(job, steps)
    except Exception as e2:  # noqa: BLE001 - the undo failing is the node's fault
        # Something is left behind: the record stays, so the epilog finishes the job.
        job.ctx.log(f"slurm-gpu: prolog cleanup incomplete, the epilog retries: {e2}"
                    + (f" [job {job.jobid}: on_internal_error={policy.on_internal_error}]"
                       if users else ""))
        if not _recorded(job, e, kind, "its record stays for the epilog") \
                and not policy.node_fault_exit():
            # The record lists what is left but cannot say the job failed:
            # its tasks would run without what it asked for.
            policy.cancel(job.jobid)
        return policy.node_fault_exit()
    if users:
        _recorded(job, e, kind)
        if policy.user_error == "cancel":
            policy.cancel(job.jobid)
        return 0
    if policy.node_fault_exit():
        jobstate.remove(job.ctx.state_dir, job.jobid)   # requeued elsewhere; nothing left here
        return 1
    _recorded(job, e, kind)
    return 0


def _recorded(job: Job, e: Exception, kind: str, left: str = "") -> bool:
    """Record the job's failure; False when its filesystem is full (:class:`RecordFull`).

    Unless something is *left* for the epilog, the record is then removed
    (unlinking needs no space): a job without one fails each of its steps in
    the SPANK plugin ("no GPU state for job N"); one that stays, in phase
    ``prolog`` without its error, fails them too (``state.task_env``: "the
    prolog of job N did not finish setting up MPS/MIG").
    """
    try:
        fail(job, e, kind)
        return True
    except RecordFull as full:
        if not left:
            jobstate.remove(job.ctx.state_dir, job.jobid)
        job.ctx.log(f"{full.line()} [job {job.jobid}: its failure is not recorded; "
                    + (left or "its record is removed, so its steps fail without one") + "]")
        return False
