"""``[health] on_fatal``: the jobs on a GPU that a fatal fault hit are requeued (or cancelled) at once.

A job on a GPU that fell off the bus, took an uncontained memory error or
needs a reset is dead or hung anyway; NCCL jobs often hang until a watchdog
fires minutes later.  So the acting run that drains the node for such a fault
(a finding marked ``fatal``: the XID catalog's ``job`` column, a lost GPU, a
double-bit ECC event, a recovery action that needs a reset) also:

1. finds the jobs holding that GPU: ``squeue`` for the jobs running on this
   node, ``scontrol -d show job`` for the GPU indices (``IDX``) each holds
   here; the GPU's Slurm index comes from its bus id through gres.conf's
   order (``gresorder``), remembered from earlier runs because a GPU off the
   bus no longer tells its minor;
2. names the fault in the job's ``AdminComment`` (only when none is set:
   a site's comment is never overwritten), then requeues it when it can be
   (``Requeue=1``, a batch job), else cancels it (``on_fatal = "cancel"``
   cancels always).  Other jobs on the node are left alone;
3. once Slurm has finished the requeue (the job is ``PENDING``, not
   ``COMPLETING``), makes it eligible now: ``scontrol update JobId=J
   StartTime=now``.  Slurm otherwise holds a requeued job back for
   ``requeue_delay`` (25.11+) or ``cred_expire`` (120 s) plus 1 s
   (``batch_requeue_fini``).  A job that takes longer than this run to end
   is released by a later run (``owed``, in the state file).

Nothing happens unless the node stands drained (by us or anyone): a requeued
job must not land on the broken node again.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from ..errors import CommandError
from . import jobctl
from .findings import Finding

MODES = ("requeue", "cancel", "none")
# Requeues a job may have had (Restarts=) and still be requeued on a fatal fault.
MAX_REQUEUES = 2
RELEASE_WITHIN_S = 600.0    # an owed release older than this is dropped (Slurm's own delay is long past)
_POLL_S = 0.1


@dataclass
class FatalOutcome:
    """What on_fatal did in one run: one step per job, the releases still owed, and errors."""

    steps: list[dict[str, Any]] = field(default_factory=list)   # {"job", "action", "gpu", "xid", "reason"}
    owed: dict[str, float] = field(default_factory=dict)        # job id -> time of its requeue
    errors: list[str] = field(default_factory=list)


def fatal_gpus(findings: Iterable[Finding]) -> dict[str, Finding]:
    """Bus id -> the first fatal finding on that GPU (findings without a bus id name no GPU)."""
    out: dict[str, Finding] = {}
    for f in findings:
        if f.fatal and f.gpu and f.gpu not in out:
            out[f.gpu] = f
    return out


def index_map(health: Any, gres_conf: str | None, node: str, old: Mapping[str, Any] | None) -> dict[str, int]:
    """Bus id -> Slurm's GPU index on this node, from this run's NVML read over *old*.

    A lost GPU answers no minor: its entry from an earlier run stays.
    """
    out = {k: v for k, v in (old or {}).items()
           if isinstance(k, str) and len(k) <= 16 and isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 4096}
    gpus = [g for g in (getattr(health, "gpus", None) or []) if g.bus_id and isinstance(g.minor, int)]
    if not gpus:
        return out
    from ..confgen.gresorder import read_conf, slurm_minors
    try:
        conf = read_conf(gres_conf, node) if gres_conf else None
    except Exception:  # noqa: BLE001 - an unreadable gres.conf: keep what we knew (gpu.count reports it)
        return out
    order = slurm_minors(conf, [g.minor for g in sorted(gpus, key=lambda g: g.index)])
    for g in gpus:
        if g.minor in order:
            out[g.bus_id] = order.index(g.minor)
    return out


def nvml_confirms(health: Any, known: Mapping[str, Any] | None, expected_count: int | None = None) -> dict[str, str]:
    """Bus id -> what this run's NVML read says, for each GPU it proves dead.

    What no job user can fake and what leaves no job on that GPU alive: the
    GPU lost (NVML answers GPU_IS_LOST, or a GPU an earlier run knew, *known*
    from the state file's ``gpu_index``, no longer answers while NVML sees a
    GPU short), or its recovery action asking for a reset or reboot.  A kernel
    log line whose sender is not proven (a syslog file) acts only for such a
    GPU (``xid.check_xid``).  A lost GPU tells no bus id, hence *known*; a
    remembered bus whose Slurm index a live GPU now has (hardware changed) is
    no proof of anything.
    """
    out: dict[str, str] = {}
    if health is None or not getattr(health, "available", False) or getattr(health, "hung", None):
        return out
    from .gpu_checks import RECOVERY_NAMES
    from .xid import FATAL_RECOVERY
    gpus = list(getattr(health, "gpus", None) or [])
    alive = [g for g in gpus if g.lost is None and g.bus_id]
    for g in gpus:
        if g.lost is not None and g.bus_id:
            out[g.bus_id] = f"GPU lost ({g.lost})"
        elif g.lost is None and g.bus_id and g.recovery_action in FATAL_RECOVERY:
            out[g.bus_id] = f"needs {RECOVERY_NAMES[g.recovery_action]}"
    short = any(g.lost is not None for g in gpus) or (expected_count is not None and len(alive) < expected_count)
    old = index_map(None, None, "", known if isinstance(known, Mapping) else None)
    if short and old:
        live_idx = {old[g.bus_id] for g in alive if g.bus_id in old}
        live = {g.bus_id for g in alive}
        for bus, idx in old.items():
            if bus not in live and idx not in live_idx:
                out.setdefault(bus, "GPU no longer answers NVML")
    return out


def fault_words(f: Finding, node: str) -> str:
    """Our words for the fault, for the job's AdminComment: never log text."""
    what = f"Xid {f.xid}" if f.xid is not None else f.check
    return f"slurm-gpu: {what} on GPU {f.gpu} of {node}"


def act(node: str, findings: Iterable[Finding], gpu_index: Mapping[str, int], mode: str, deadline: float,
        *, timeout: float, clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep) -> FatalOutcome:
    """Requeue (or cancel) the jobs holding a GPU a fatal fault hit; release the requeued ones."""
    out = FatalOutcome()
    hit = fatal_gpus(findings)
    if mode == "none" or not hit:
        return out
    idx_hit: dict[int, Finding] = {}
    for bus, f in hit.items():
        if bus in gpu_index:
            idx_hit[gpu_index[bus]] = f
        else:
            out.errors.append(f"on_fatal: cannot tell which job holds GPU {bus} (its Slurm index is unknown): "
                              "no job requeued for it")
    if not idx_hit:
        return out
    try:
        jobs = jobctl.running_jobs(node, timeout)
    except CommandError as e:
        out.errors.append(f"on_fatal: {e.what}")
        return out
    from ..confgen.hostlist import expand
    for jid in jobs:
        try:
            view = jobctl.show_job(jid, timeout)
        except CommandError as e:
            out.errors.append(f"on_fatal: {e.what}")
            continue
        if view is not None and view.unreadable:
            out.errors.append(f"on_fatal: job {jid} left alone: its scontrol text is ambiguous ({view.unreadable})")
            continue
        if view is None or view.state not in ("RUNNING", "SUSPENDED"):
            continue
        mine = next((idx for nodes, idx in view.gpus.items() if node in _expand(expand, nodes)), ())
        hit_f = next((idx_hit[i] for i in mine if i in idx_hit), None)
        if hit_f is None:
            continue                   # this job does not hold a GPU the fault hit: left alone
        f = hit_f
        words = fault_words(f, node)
        # A job already requeued MAX_REQUEUES times that meets another fatal
        # fault may be what breaks the GPUs: requeued at once again, it would
        # drain node after node.  It is cancelled instead.
        can_requeue = mode == "requeue" and view.requeue and view.batch and view.restarts < MAX_REQUEUES
        action = "requeue" if can_requeue else "cancel"
        try:
            if not view.admin_comment:
                jobctl.set_admin_comment(jid, f"{words}: {'requeued' if can_requeue else 'cancelled'}", timeout)
            if can_requeue:
                jobctl.requeue(jid, timeout)
                out.owed[jid] = time.time()
            else:
                jobctl.cancel(jid, timeout)
        except CommandError as e:
            out.errors.append(f"on_fatal: {action} of job {jid} failed: {e.what}")
            continue
        out.steps.append({"job": jid, "action": action, "gpu": f.gpu, "xid": f.xid, "check": f.check,
                          "reason": words})
    if out.owed:
        release(out, deadline, timeout=timeout, clock=clock, sleep=sleep)
    return out


def _expand(expand: Callable[[str], list[str]], nodes: str) -> list[str]:
    try:
        return expand(nodes)
    except Exception:  # noqa: BLE001 - a hostlist we cannot read names no node of ours
        return []


def release(out: FatalOutcome, deadline: float, *, timeout: float, clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep) -> None:
    """``StartTime=now`` for each job in ``out.owed`` whose requeue Slurm has finished, until *deadline*.

    Before Slurm finishes the requeue (``COMPLETING``: the job's processes and
    epilog on the node) a new start time would be overwritten by the requeue
    delay, so this waits for ``PENDING``.  A job found in any other state (it
    was cancelled, or already runs) is dropped: nothing is owed for it.
    """
    now = time.time()
    for jid, t in list(out.owed.items()):
        if now - t > RELEASE_WITHIN_S:
            del out.owed[jid]
    while out.owed and clock() < deadline:
        for jid in list(out.owed):
            try:
                view = jobctl.show_job(jid, max(0.5, min(timeout, deadline - clock())))
            except CommandError as e:
                out.errors.append(f"on_fatal: {e.what}")
                return
            if view is None or view.unreadable:
                del out.owed[jid]          # (requeued already: only the early release is lost)
            elif view.state == "PENDING":
                try:
                    jobctl.release(jid, max(0.5, min(timeout, deadline - clock())))
                except CommandError as e:
                    out.errors.append(f"on_fatal: release of job {jid} failed: {e.what}")
                    return
                del out.owed[jid]
                out.steps.append({"job": jid, "action": "release", "reason": "StartTime=now after the requeue"})
            elif view.state not in ("COMPLETING", "REQUEUED"):
                del out.owed[jid]
        if out.owed:
            sleep(_POLL_S)


def load_owed(doc: object) -> dict[str, float]:
    """The owed releases from the state file (anything malformed is dropped)."""
    if not isinstance(doc, dict):
        return {}
    return {k: float(v) for k, v in doc.items()
            if isinstance(k, str) and k.isdigit() and len(k) < 20 and isinstance(v, (int, float))
            and not isinstance(v, bool) and v == v}


# ------------------------------------------------------------ in the health run

def gpu_index_for(opts: Any, health: Any, old: Any, fresh: bool) -> dict[str, int]:
    """Bus id -> Slurm GPU index, kept in the state file for on_fatal (a GPU off the bus tells no minor).

    Read again from gres.conf only when this run's NVML read shows a GPU the
    map lacks, or on slurmd's first run (gres.conf changes need a slurmd restart).
    """
    from .expected import default_gres_conf
    known = index_map(None, None, opts.node, old if isinstance(old, dict) else None)
    gpus = getattr(health, "gpus", None) or []
    if not fresh and all(g.bus_id in known for g in gpus if g.bus_id and isinstance(g.minor, int)):
        return known
    gres = opts.gres_conf if opts.gres_conf is not None else default_gres_conf(opts.settings)
    return index_map(health, gres, opts.node, known)


def after_act(opts: Any, out: Any, event_findings: list[Finding], gpu_index: dict[str, int],
              owed: dict[str, float], deadline: float, rep: Any) -> dict[str, float]:
    """[health] on_fatal after the drain: requeue or cancel the jobs on a GPU a fatal fault hit."""
    mode = opts.settings.on_fatal
    drained = out.plan.action == "drain" or (out.node is not None and out.node.drained)
    timeout = max(0.5, min(opts.settings.scontrol_timeout, (deadline - time.monotonic()) / 3))
    res = FatalOutcome(owed=dict(owed))
    if mode != "none" and drained and fatal_gpus(event_findings):
        res = act(opts.node, event_findings, gpu_index, mode, deadline - 0.5, timeout=timeout)
        res.owed = {**owed, **res.owed}
        if res.owed:
            release(res, deadline - 0.5, timeout=timeout)
    elif owed:
        release(res, deadline - 0.5, timeout=timeout)
    elif mode != "none" and fatal_gpus(event_findings):
        rep.notes.append("on_fatal: the node is not drained: no job requeued")
    for st in res.steps:
        rep.notes.append(f"on_fatal: {st['action']} job {st['job']}: {st['reason']}")
    rep.jobs = res.steps
    rep.notes.extend(res.errors)
    return res.owed
