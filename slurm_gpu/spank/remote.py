"""slurmstepd (S_CTX_REMOTE): per-task binding, tuning and environment.

The C shim calls in here only for steps that need it (an option was given,
or NUMA binding is on and the step holds GPUs).  ``user_init`` runs once per
step in the slurmstepd parent and loads everything (config, node model);
the task children inherit it through fork, so ``task_init`` (as the job
user) only plans and applies.  ``task_init_privileged`` (root) raises the
hard memlock limit, which the user cannot.

Errors found in ``user_init`` are logged there and reported again by each
task's ``task_init``: its stderr is the job's, so the user sees the
``slurm-gpu:`` line and the task fails.
"""
from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from typing import Any

from .. import binding
from ..errors import SlurmGpuError
from . import options
from .options import MIG, MPS, NUMA_BIND, PROFILE, NumaBind
from .settings import SpankSettings

# Job environment variables the planner reads.
_GPU_ENV = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "SLURM_GPUS_PER_TASK")


@dataclass
class Step:
    numa: NumaBind
    profile: str | None
    mps: str | None
    mig: str | None
    settings: SpankSettings | None = None
    node: Any = None               # slurm_gpu.hw.model.Node when binding
    hostname: str = "?"
    error: SlurmGpuError | None = None


_step: Step | None = None


def _load_step(spank: Any) -> Step:
    args = options.parse_plugstack_args(spank.args)
    if args.config:
        # load_node() and the config reader look here; this is slurmstepd's
        # own environment, never the task's.
        os.environ["SLURM_GPU_CONFIG"] = args.config
    hostname = spank.getenv("SLURMD_NODENAME") or os.uname().nodename
    os.environ.setdefault("SLURMD_NODENAME", hostname)
    profile = spank.option_value(PROFILE)
    step = Step(
        numa=options.effective_numa_bind(spank.option_value(NUMA_BIND), args),
        profile=None if profile in (None, "none") else options.parse_profile(profile),
        mps=spank.option_value(MPS),
        mig=spank.option_value(MIG),
        hostname=hostname,
    )
    from . import settings
    step.settings = settings.load()
    if step.numa.mode != binding.OFF and any(spank.getenv(v) for v in _GPU_ENV[:3]):
        from ..hw import load_node
        step.node = load_node()
    return step


def user_init(spank: Any) -> int:
    """Once per step, in slurmstepd: read config and the node model."""
    global _step
    try:
        _step = _load_step(spank)
    except SlurmGpuError as e:
        _step = Step(NumaBind("off"), None, None, None, error=e)
        spank.error(e.line())
    except Exception as e:  # noqa: BLE001 - reported per task below
        err = SlurmGpuError(f"internal error in user_init: {type(e).__name__}: {e}")
        _step = Step(NumaBind("off"), None, None, None, error=err)
        spank.error(err.line())
    return 0


def task_init_privileged(spank: Any) -> int:
    """In the task's child, still root: lift the hard memlock limit."""
    step = _step
    if step is None or step.error or not step.profile or step.settings is None:
        return 0
    limit = step.settings.memlock_bytes()
    if limit is not None:
        from . import effects
        warning = effects.raise_memlock(limit, hard=True)
        if warning:
            spank.info(f"slurm-gpu: {warning}")
    return 0


def task_init(spank: Any) -> int:
    """In the task's child, as the job user, just before exec."""
    step = _step
    if step is None:
        raise SlurmGpuError("plugin state missing in task_init (user_init did not run)")
    if step.error is not None:
        raise step.error
    task = spank.item_int("S_TASK_ID")
    ntasks = spank.item_u32("S_JOB_LOCAL_TASK_COUNT")
    env = {k: v for k in _GPU_ENV if (v := spank.getenv(k)) is not None}
    if step.node is not None:
        _bind(spank, step, env, task, ntasks)
    if step.profile:
        _profile(spank, step)
    if step.mps is not None or step.mig is not None:
        _job_state_env(spank, task, ntasks)
    return 0


def _bind(spank: Any, step: Step, env: dict[str, str], task: int, ntasks: int) -> None:
    from . import effects
    plan = binding.plan_task(step.node, env, mode=step.numa.mode, local_task=task,
                             ntasks=ntasks, allowed=effects.allowed_cpus())
    warning = plan.warning
    if plan.applied:
        assert step.settings is not None
        nmap = step.settings.numa_map()
        mems = tuple(sorted({nmap.get(m, m) for m in plan.mems}))
        effects.set_affinity(plan.cpus)
        mode = effects.MPOL_BIND if plan.mode == binding.STRICT else effects.MPOL_PREFERRED
        try:
            effects.set_mempolicy(mode, mems)
        except SlurmGpuError as e:
            if plan.mode == binding.STRICT:
                raise
            warning = f"gpu-numa-bind=prefer: memory policy not set: {e.what}"
    spank.setenv("SLURM_GPU_BINDING", plan.env_value())
    if warning:
        _stderr(f"slurm-gpu: warning: {warning} (task {task})")
    if step.numa.verbose:
        _stderr(binding.verbose_line(plan, hostname=step.hostname, pid=os.getpid()))


def _profile(spank: Any, step: Step) -> None:
    from . import effects
    assert step.settings is not None
    if step.profile == "inference":
        effects.disable_thp()
    limit = step.settings.memlock_bytes()
    if limit is not None:
        warning = effects.raise_memlock(limit, hard=False)
        if warning:
            _stderr(f"slurm-gpu: warning: --gpu-profile: {warning}")
        if spank.getenv("SLURM_RLIMIT_MEMLOCK") is not None:
            # Slurm applies the submit host's limit after task_init
            # (PropagateResourceLimits): hand it ours instead.
            spank.setenv("SLURM_RLIMIT_MEMLOCK",
                         str(resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]))
    lib = step.settings.allocator_preload
    if lib and os.path.isfile(lib):
        pre = spank.getenv("LD_PRELOAD")
        spank.setenv("LD_PRELOAD", f"{lib} {pre}" if pre else lib)
        for k, v in step.settings.allocator_env.items():
            spank.setenv(k, v)


def _state_dir() -> str:
    """``[node] state_dir`` (with ``%n``), as the prolog wrote the job state."""
    from .. import config
    node = config.load_raw().get("node", {})
    d = str(node.get("state_dir", "/run/slurm-gpu")) if isinstance(node, dict) else ""
    return d.replace("%n", os.environ.get("SLURMD_NODENAME", ""))


def _job_state_env(spank: Any, task: int, ntasks: int) -> None:
    try:
        from ..jobs import state as jobstate  # mps/mig area
    except ImportError:
        raise SlurmGpuError("--gpu-mps/--gpu-mig need slurm_gpu.jobs, which is not "
                            "installed on this node") from None
    jobid = spank.item_u32("S_JOB_ID")
    st = jobstate.load(_state_dir(), str(jobid))
    if st is None:
        raise SlurmGpuError(f"no GPU state for job {jobid} on this node: the slurm-gpu "
                            "prolog did not set up MPS/MIG")
    for k, v in jobstate.task_env(st, task, ntasks).items():
        spank.setenv(k, str(v))


def _stderr(line: str) -> None:
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass
