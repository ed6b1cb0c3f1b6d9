"""What the prolog and epilog work with: the injectable context, the job's
user and GPUs as Slurm names them, and the GPUs' facts from the node model.

Split from ``lifecycle.py`` (which re-exports these names); nothing here acts
on the node.  :class:`Job` is what the steps (:mod:`.steps`) work on.
"""
from __future__ import annotations

import os
import pwd
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping

    from .settings import JobsSettings, MigSettings, MpsSettings
    from .state import GpuFact, JobRecord

from . import state as jobstate
from .mps import JobUser


class Context:
    """Everything the prolog/epilog needs, injectable for tests.

    A plain class, not a dataclass: the prolog imports no dataclasses
    (with inspect, ast and dis: ~5 ms)."""

    def __init__(self, env: Mapping[str, str], jobs: JobsSettings, mps: MpsSettings,
                 mig: MigSettings, state_dir: str, open_api: Callable[[], Any],
                 node: Callable[[], Any] | None = None,
                 log: Callable[[str], None] | None = None,
                 facts_dir: str = "", config_path: str | None = None,
                 gres_conf: str | None = None, node_name: str = "",
                 health_state_dir: str = "") -> None:
        self.env = env
        self.jobs = jobs
        self.mps = mps
        self.mig = mig
        self.state_dir = state_dir
        self.open_api = open_api                 # -> slurm_gpu.hw.gpus.Gpus
        self.node = node                         # -> slurm_gpu.hw.model.Node
        self.log: Callable[[str], None] = log or (lambda m: print(m, file=sys.stderr))
        # The node-fact cache (slurm_gpu.nodefacts): its directory ("" = <state_dir>/node-facts,
        # for tests) and the config file its entries are keyed on.
        self.facts_dir = facts_dir
        self.config_path = config_path
        self.gres_conf = gres_conf               # gres.conf: Slurm's GPU index -> device
        self.node_name = node_name
        # The health check's state directory: a user-problem drain leaves its marker
        # there ("" = no user-problem check).  See slurm_gpu/health/userproblem.py.
        self.health_state_dir = health_state_dir

    def __repr__(self) -> str:
        return f"Context({vars(self)!r})"


def default_context(env: Mapping[str, str] | None = None, *, health: bool = True) -> Context:
    """Settings from the config file (through the node-fact entry), NVML and
    the node model from ``[node]``.

    *health* False leaves ``health_state_dir`` empty: the prolog never looks
    for leftovers, and reading ``[health]``/``[repair]`` costs it ~1.4 ms of
    imports.
    """
    from .. import config, nodefacts
    from ..hw import live
    from .settings import JobsSettings, MigSettings, MpsSettings, cached
    env = os.environ if env is None else env
    config_path = config.config_file() or None
    name = live.node_name()
    gres_conf = nodefacts.gres_conf_path(env)
    sec = cached(config_path, name, gres_conf, health=health)
    node = live.NodeSettings(**sec["node"])

    def open_api() -> Any:
        from ..hw import backend
        return backend.open_gpus(backend.source_for(node, writes=True))

    def read_node() -> Any:
        from ..hw import ThisNode, load_node
        return load_node(ThisNode(node))

    return Context(env, JobsSettings(**sec["jobs"]), MpsSettings(**sec["mps"]),
                   MigSettings(**sec["mig"]), node.state_dir, open_api, read_node,
                   facts_dir=nodefacts.CACHE_DIR, config_path=config_path,
                   gres_conf=gres_conf, node_name=name,
                   health_state_dir=sec["health_state_dir"])


def _lazy_api(ctx: Context) -> Callable[[], Any]:
    """NVML opened on first use: a job that needs no NVML call never opens it."""
    box: list[Any] = []

    def api() -> Any:
        if not box:
            box.append(ctx.open_api())
        return box[0]

    return api


def job_user(env: Mapping[str, str], st: JobRecord | None = None) -> JobUser | None:
    """The job's user from slurmd's environment, else from the job's record."""
    uid = env.get("SLURM_JOB_UID") or (str(st.uid) if st and st.uid is not None else "")
    gid = env.get("SLURM_JOB_GID") or (str(st.gid) if st and st.gid is not None else "")
    if not uid.isdigit():
        return None
    name = env.get("SLURM_JOB_USER") or (st.user if st else "") or ""
    if not gid.isdigit():
        try:
            gid = str(pwd.getpwuid(int(uid)).pw_gid)
        except KeyError:
            return None
    groups: tuple[int, ...] = ()
    if name:
        try:
            groups = tuple(os.getgrouplist(name, int(gid)))
        except (KeyError, OSError):
            groups = ()
    return JobUser(int(uid), int(gid), name, groups)


def job_gpus(env: Mapping[str, str]) -> tuple[list[int], bool]:
    """The job's Slurm GPU indices on this node and whether it holds them whole.

    Slurm's indices: positions in slurmd's gres/gpu list, neither minors nor
    NVML indices (:mod:`slurm_gpu.confgen.gresorder`); :func:`job_gpu_facts`
    turns them into GPUs named by UUID and minor.

    ``SLURM_JOB_GPUS`` lists whole GPUs (gres/gpu); with only
    ``CUDA_VISIBLE_DEVICES`` the job shares them (gres/shard, gres/mps).
    """
    whole = env.get("SLURM_JOB_GPUS", "").strip()
    text = whole or env.get("CUDA_VISIBLE_DEVICES", "").strip()
    out = []
    for part in text.split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out, bool(whole)


def job_gpu_facts(ctx: Context, indices: list[int]) -> list[GpuFact]:
    """Minor, UUID, name and local CPUs of each job GPU (node model, cached).

    Everything after this names the job's GPUs by UUID and minor: guessing
    (an NVML index equal to Slurm's) would set up another job's GPU, so a
    GPU that cannot be identified is a node fault.
    """
    from ..errors import HardwareError
    from .locality import gpu_table
    if ctx.node is None:
        raise HardwareError("no node model to tell which GPUs the job holds")
    table = gpu_table(ctx.facts_dir or os.path.join(ctx.state_dir, "node-facts"), ctx.config_path,
                      ctx.node, ctx.gres_conf, ctx.node_name)
    facts: list[Any] = []
    for i in indices:
        if i not in table or not table[i].get("uuid"):
            if _mig_slice(ctx, i, table):
                from .state import JobFailed
                raise JobFailed(f"Slurm GPU index {i} is a MIG slice: --gpu-mps, --gpu-mig and "
                                "--gpu-profile need whole GPUs (--gres=gpu:<whole GPU type>)",
                                ctx.gres_conf or "gres.conf")
            raise HardwareError(f"Slurm GPU index {i} names no GPU of this node "
                                "(gres.conf and NVML disagree)", ctx.gres_conf or "gres.conf")
        facts.append({"index": i, **table[i]})
    return facts


def _mig_slice(ctx: Context, index: int, table: dict[int, dict[str, Any]]) -> bool:
    """Whether Slurm's GPU *index* is a MIG slice's gres.conf line (the job
    asked for a whole-GPU option on a slice Slurm gave it: the job's doing),
    not a device NVML lacks (the node's).  Read only on this error path."""
    from ..confgen.gresorder import read_conf, slurm_minors
    try:
        conf = read_conf(ctx.gres_conf, ctx.node_name)
    except Exception:  # noqa: BLE001 - unreadable: not proven the job's
        return False
    order = slurm_minors(conf, sorted(int(g["minor"]) for g in table.values()))
    return conf is not None and 0 <= index < len(order) and order[index] is None


class Job:
    """One job on this node: the context, its record, its user and NVML (opened on first use)."""

    def __init__(self, ctx: Context, record: JobRecord, user: JobUser | None,
                 api: Callable[[], Any]) -> None:
        self.ctx = ctx
        self.record = record
        self.user = user
        self.api = api
        self.percentage: int | None = None      # --gpu-mps, parsed by Request

    @property
    def jobid(self) -> str:
        return self.record.jobid

    def save(self) -> None:
        """Write the record; a full filesystem that a job user can fill fails the job.

        Raises :class:`~.state.RecordFull` when that filesystem also holds the
        MPS base directory (``/run`` by default for both): any ``--gpu-mps``
        job's user can fill it through their pipe directory, so it is no
        node fault.  A full state filesystem of its own stays one.
        """
        try:
            jobstate.save(self.ctx.state_dir, self.record)
        except jobstate.StateFull as e:
            from .mpsdir import mount_point, same_filesystem
            if not same_filesystem(e.where or self.ctx.state_dir, self.ctx.mps.base_dir):
                raise
            raise jobstate.RecordFull(
                f"the filesystem {mount_point(self.ctx.state_dir)} of the job state and the "
                f"MPS directories is full ({e.strerror}): the job's record cannot be written",
                f"job {self.jobid}") from None

    def save_if_on_file(self) -> None:
        """Keep an existing file up to date (an undo of a job without one writes none).

        Only undos call it: what they undid stays undone when the record cannot
        say so (every undo is idempotent), so a full filesystem of the job
        user's doing is logged, not raised, and the undo goes on.
        """
        if self.record.uid is not None and jobstate.exists(self.ctx.state_dir, self.jobid):
            try:
                self.save()
            except jobstate.RecordFull as e:
                self.ctx.log(f"{e.line()} [undo goes on; the record on file is not updated]")
