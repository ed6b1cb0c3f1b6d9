"""slurmstepd (S_CTX_REMOTE): per-task binding, tuning and environment.

The C shim calls in here only for steps that need it (an option was given,
or NUMA binding is on and the step holds GPUs).  ``init_post_opt`` runs once
per step in the slurmstepd parent, as root and before slurmstepd switches its
effective uid to the job user for ``user_init``, and gets the node's facts
(settings, GPU locality) from :mod:`.nodecache`; the task children inherit
them through fork, so ``task_init`` (as the job user) only plans and applies.
``task_init_privileged`` (root) raises the hard memlock limit, which the
user cannot.

Errors found in ``init_post_opt`` are logged there (slurmd's log: the step's
output is not connected yet) and reported again by each task's ``task_init``: its stderr is the job's,
so the user sees the ``slurm-gpu:`` line and the task fails.  This module is imported in every
bound step: it imports only what that path needs.
"""
from __future__ import annotations

# posix, not os: importing os (its environ mapping) costs ~1 ms of every
# bound step; slurmstepd's own environment is read through hostctx.
import posix

from .. import binding
from ..errors import SlurmGpuError
from .. import joboptions as options
from ..joboptions import MIG, MPS, NUMA_BIND, PROFILE, NumaBind

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Job environment variables the planner reads besides the step's GPU list.
_TASK_ENV = ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_PER_TASK")
# SLURM_BATCH_SCRIPT, SLURM_INTERACTIVE_STEP: slurmstepd sets (or unsets)
# SLURM_JOB_GPUS in these steps and SLURM_STEP_GPUS in all others; the other
# variable is whatever the user exported and says nothing about the step's
# GPUs.  Keep in sync with spank/sg_remote.c (sg_gpu_var).
JOB_GPU_STEPS = (0xfffffffb, 0xfffffffa)


def gpu_var(spank: Any) -> str:
    """The job environment variable Slurm keeps for this step's GPUs."""
    return ("SLURM_JOB_GPUS" if spank.item_u32("S_JOB_STEPID") in JOB_GPU_STEPS
            else "SLURM_STEP_GPUS")


class Step:
    """What init_post_opt found, inherited by every task of the step."""

    def __init__(self, numa: NumaBind, profile: str | None = None, mps: str | None = None,
                 mig: str | None = None, facts: dict[str, Any] | None = None,
                 hostname: str = "?", error: SlurmGpuError | None = None) -> None:
        self.numa = numa
        self.profile = profile
        self.mps = mps
        self.mig = mig
        self.facts = facts or {}          # nodecache: settings, GPU locality, state_dir
        self.hostname = hostname
        self.error = error
        self.planner: binding.Planner | None = None   # over facts["gpus"], made once
        # Warnings of task_init_privileged, whose stderr is still slurmstepd's
        # (mgr.c connects the task's stdio after it): task_init writes them.
        # Each task is its own forked child: what one holds, no other sees.
        self.held: list[str] = []


_step: Step | None = None


def _load_step(spank: Any) -> Step:
    from .. import hostctx
    args = spank.plugstack_args()        # parsed once, by the C half
    # Tell the config reader and load_node() in-process: putenv() in
    # slurmstepd, whose message thread may read environ, is not safe.  Only
    # hostctx is imported here: config and hw cost ~25 ms each to import,
    # and a cached step needs neither.
    hostctx.config_file = args.config or None
    # slurmstepd's own environment has slurmd's node name; the job's
    # environment does not have it yet at init_post_opt, so a SLURMD_NODENAME
    # there came from the user and must not steer root's paths (%n)
    hostname = hostctx.environ_get("SLURMD_NODENAME") or posix.uname().nodename.split(".")[0]
    hostctx.node_name = hostname
    profile = spank.option_value(PROFILE)
    step = Step(
        numa=options.effective_numa_bind(spank.option_value(NUMA_BIND), args),
        profile=None if profile in (None, "none") else options.parse_profile(profile),
        mps=spank.option_value(MPS),
        mig=spank.option_value(MIG),
        hostname=hostname,
    )
    bind = step.numa.mode != binding.OFF and bool(spank.getenv(gpu_var(spank)))
    from . import nodecache
    step.facts = nodecache.get(args.config or None, hostname, with_gpus=bind)
    if not bind:
        step.facts = dict(step.facts, gpus=None)
    elif step.facts.get("gpus") is not None:
        step.planner = _planner(step)        # once, in the parent: every task inherits it
    return step


def init_post_opt(spank: Any) -> int:
    """Once per step, in slurmstepd as root: settings and GPU locality.

    Never fails the hook: a -1 here would fail a batch step's launch, which
    makes slurmctld drain the node.  Each task reports the error instead.
    """
    global _step
    try:
        _step = _load_step(spank)
        if _step.mps:
            _adopt_mps(spank, _step)
    except SlurmGpuError as e:
        _step = Step(NumaBind("off"), error=e)
        spank.error(e.line())
    except Exception as e:  # noqa: BLE001 - reported per task below
        err = SlurmGpuError(f"internal error in init_post_opt: {type(e).__name__}: {e}")
        _step = Step(NumaBind("off"), error=err)
        spank.error(err.line())
    return 0


def _adopt_mps(spank: Any, step: Step) -> None:
    """Move the job's MPS daemon into the job's cgroup (root, before any task starts).

    Slurm makes the job's cgroup only after the prolog that started the
    daemon (:mod:`slurm_gpu.jobs.jobcgroup`).  A failure here costs the
    daemon its containment, not the step: one line in slurmd's log.
    """
    from ..jobs import mps
    state_dir = step.facts.get("state_dir")
    if not state_dir:
        return
    try:
        mps.adopt(state_dir, str(spank.item_u32("S_JOB_ID")),
                        spank.getenv("SLURM_JOB_SLUID"))
    except (OSError, SlurmGpuError) as e:
        spank.error(f"slurm-gpu: MPS daemon left outside the job's cgroup: {e}")


def task_init_privileged(spank: Any) -> int:
    """In the task's child, still root: lift the hard memlock limit."""
    step = _step
    if step is None or step.error or not step.profile:
        return 0
    limit = step.facts.get("memlock")
    if limit is not None:
        from . import effects
        warning = effects.raise_memlock(limit, hard=True)
        if warning:
            spank.info(f"slurm-gpu: {warning}")           # the node's log too
            step.held.append(f"--gpu-profile: {warning}")
    return 0


def task_init(spank: Any) -> int:
    """In the task's child, as the job user, just before exec."""
    step = _step
    if step is None:
        raise SlurmGpuError("plugin state missing in task_init (init_post_opt did not run: "
                            "is the plugin older than slurm-gpu? rebuild it with "
                            "slurm-gpu spank build)")
    if step.error is not None:
        raise step.error
    task = spank.item_int("S_TASK_ID")
    ntasks = spank.item_u32("S_JOB_LOCAL_TASK_COUNT")
    while step.held:
        _stderr(f"slurm-gpu: warning: {step.held.pop(0)} (task {task})")
    if step.facts.get("gpus") is not None:
        env = {k: v for k in (gpu_var(spank), *_TASK_ENV) if (v := spank.getenv(k)) is not None}
        bind_task(spank, step, env, task, ntasks)
    if step.profile:
        _profile(spank, step, task)
    if step.mps is not None or step.mig is not None:
        _job_state_env(spank, step, task, ntasks)
    return 0


def _planner(step: Step) -> binding.Planner:
    if step.planner is None:
        step.planner = binding.Planner(step.facts["gpus"], step.facts.get("numa_map") or {})
    return step.planner


def bind_task(spank: Any, step: Step, env: dict[str, str], task: int, ntasks: int) -> None:
    """Bind the calling task (*task* of *ntasks* on this node) by *env*, its GPU variables.

    The Python path's binding, as ``task_init`` does it: plan with the
    step's planner, set affinity and memory policy, set SLURM_GPU_BINDING,
    write warnings (and the verbose line) to the task's stderr; strict's
    impossibility raises.  The outer C half does the same for a plain
    prefer step (spank/sg_cbind.c): tests hold the two to each other.
    """
    from . import effects
    plan = _planner(step).plan(env, mode=step.numa.mode, local_task=task, ntasks=ntasks,
                               allowed=effects.allowed_cpus(), bound_nodes=_slurm_bound_nodes())
    warning = plan.warning
    if plan.applied:
        effects.set_affinity(plan.cpus)
        mode = effects.MPOL_BIND if plan.mode == binding.STRICT else effects.MPOL_PREFERRED
        try:
            effects.set_mempolicy(mode, plan.host_mems)
        except SlurmGpuError as e:
            if plan.mode == binding.STRICT:
                raise
            warning = f"gpu-numa-bind=prefer: memory policy not set: {e.what}"
    spank.setenv("SLURM_GPU_BINDING", plan.env_value())
    if warning:
        _stderr(f"slurm-gpu: warning: {warning} (task {task})")
    if step.numa.verbose:
        _stderr(binding.verbose_line(plan, hostname=step.hostname, pid=posix.getpid()))


def _slurm_bound_nodes() -> tuple[int, ...] | None:
    """The host NUMA nodes of an MPOL_BIND policy already in place, else None.

    task/affinity applies ``--mem-bind`` before task_init: the planner
    narrows it, never replaces it with other nodes.
    """
    from . import effects
    try:
        mode, host_nodes = effects.get_mempolicy()
    except OSError:
        return None
    if mode & 0xff != effects.MPOL_BIND:        # high bits: MPOL_F_* mode flags
        return None
    return host_nodes


def _profile(spank: Any, step: Step, task: int) -> None:
    from . import effects
    if step.profile == "inference":
        effects.disable_thp()
    limit = step.facts.get("memlock")
    if limit is not None:
        import resource
        warning = effects.raise_memlock(limit, hard=False)
        if warning:
            _stderr(f"slurm-gpu: warning: --gpu-profile: {warning} (task {task})")
        if spank.getenv("SLURM_RLIMIT_MEMLOCK") is not None:
            # Slurm applies the submit host's limit after task_init
            # (PropagateResourceLimits): hand it ours instead.
            spank.setenv("SLURM_RLIMIT_MEMLOCK",
                         str(resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]))
    lib = step.facts.get("allocator_preload")
    import os                                   # --gpu-profile steps only
    if lib and os.path.isfile(lib):
        pre = spank.getenv("LD_PRELOAD")
        spank.setenv("LD_PRELOAD", f"{lib} {pre}" if pre else lib)
        for k, v in (step.facts.get("allocator_env") or {}).items():
            spank.setenv(k, v)


def _job_state_env(spank: Any, step: Step, task: int, ntasks: int) -> None:
    try:
        from ..jobs import state as jobstate  # mps/mig area
    except ImportError:
        raise SlurmGpuError("--gpu-mps/--gpu-mig need slurm_gpu.jobs, which is not "
                            "installed on this node") from None
    jobid = spank.item_u32("S_JOB_ID")
    st = jobstate.load(step.facts["state_dir"], str(jobid))
    if st is None:
        raise SlurmGpuError(f"no GPU state for job {jobid} on this node: the slurm-gpu "
                            "prolog did not set up MPS/MIG")
    for k, v in jobstate.task_env(st, task, ntasks).items():
        spank.setenv(k, str(v))


def _stderr(line: str) -> None:
    try:
        posix.write(2, (line + "\n").encode())
    except OSError:
        pass
