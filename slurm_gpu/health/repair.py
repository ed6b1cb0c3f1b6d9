"""The repair ladder: what happens to a GPU fault after the drain.

Per fault the ladder follows NVIDIA's catalog (the XID's resolution bucket)
and, where the driver reports one, NVML's recovery action
(``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``):

1. **reset** the GPU (``nvidia-smi -r -i <bus id>``) once it is idle: no job
   runs on the node (Slurm), none holds the GPU (our job state), no process
   has a context on it (a fresh NVML read); a second fresh read decides
   whether it helped (the GPU is back, with the same UUID and no recovery
   action pending);
2. **reboot** through Slurm (``scontrol reboot ASAP nextstate=RESUME``) when
   a reset is impossible (off, not the fault's remedy) or did not help;
3. **RMA**: the Nth failure of the same GPU (by UUID, else bus id) within
   the window drains with ``slurm-gpu: rma: ...``, a reason the health check
   never resumes.  Failures while one job held the GPU (our job state) count
   once, however often that job repeats them; the reason names the job of
   the last failure.

Every step is optional (``[repair]``, all off by default) and acts only
while the node is drained by us: an admin's drain, another tool's reboot
or a node an admin resumed are left alone.  Failure counts, open repairs
and the step log live in ``[repair] state_dir`` (persistent: the counts
must outlive the reboots they cause), written atomically; a corrupt file
is dropped, never fatal.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import runner, slurmclient
from ..errors import CommandError
from .findings import DRAIN, Finding
from .repair_state import JOB_ID, RepairState, append_log, load, log_path, save, state_path  # noqa: F401 - the API
from .settings import RepairSettings

# NVML_GPU_RECOVERY_ACTION_*: what the driver says this GPU needs.
RESET_ACTIONS = {1, 4, 6}        # GPU_RESET, DRAIN_AND_RESET, BUS_RESET
REBOOT_ACTIONS = {2, 7}          # NODE_REBOOT, SYSTEM_REBOOT
NVIDIA_SMI = "nvidia-smi"


# ------------------------------------------------------------------ faults

@dataclass(frozen=True)
class Fault:
    """One GPU failure of this run (an XID or NVML event that drains)."""

    bus: str
    bucket: str               # catalog resolution bucket, or the check for non-XID events
    what: str                 # "Xid 79" / "gpu.recovery"
    message: str


def faults_from(findings: list[Finding]) -> list[Fault]:
    """One fault per GPU from this run's *event* findings (the cursors consume
    them, so a fault is counted once); the first, most severe, names it."""
    from .xid import entry
    out: dict[str, Fault] = {}
    for f in findings:
        if f.severity != DRAIN or not f.gpu or f.gpu in out:
            continue
        if f.xid is not None:
            e = entry(f.xid) or {}
            out[f.gpu] = Fault(f.gpu, str(e.get("immediate") or "UNKNOWN").split()[0], f"Xid {f.xid}", f.message)
        else:
            bucket = "XID_154" if f.check == "gpu.recovery" else f.check
            out[f.gpu] = Fault(f.gpu, bucket, f.check, f.message)
    return list(out.values())


def first_step(bucket: str, recovery: int | None, s: RepairSettings) -> str | None:
    """Where the ladder starts for a fault: "reset", "reboot" or None (drain only)."""
    if recovery in REBOOT_ACTIONS:
        return "reboot"
    if recovery in RESET_ACTIONS:
        return "reset"
    return "reset" if bucket in s.buckets else None


# ------------------------------------------------------------------- run

@dataclass
class Context:
    """What one run of the ladder sees and may do."""

    node: str
    settings: RepairSettings
    faults: list[Fault]
    gpus: list[Any]                       # this run's GpuHealth list (bus, uuid, recovery action)
    node_state: Any                       # nodestate.NodeState read this run (None: unknown)
    our_reason: str | None                # the drain reason of ours that stands after this run's action
    boot_id: str | None
    job_gpus: dict[str, str]              # GPU uuid or "index:N" -> job id (our job state)
    fresh_read: Callable[[], Any] | None  # a new NVML read (NvmlHealth) with processes
    scontrol: str
    time_left: Callable[[], float]
    now: float = field(default_factory=time.time)


@dataclass
class Outcome:
    notes: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    forget_drain: bool = False            # our drain reason was replaced by one never resumed (rma, reboot)
    new_reason: str | None = None         # the node's reason now, when we changed it


class Ladder:
    def __init__(self, ctx: Context, st: RepairState) -> None:
        self.c, self.st, self.out = ctx, st, Outcome()

    # -- helpers ----------------------------------------------------------
    def key(self, bus: str) -> str:
        uuid = self.st.gpus.get(bus, {}).get("uuid")
        return uuid or f"bus:{bus}"

    def step(self, key: str, step: str, result: str, detail: str) -> None:
        ep = self.st.episodes.get(key) or self.st.rma.get(key) or {}
        bus = ep.get("bus") or next((b for b, v in self.st.gpus.items() if v.get("uuid") == key),
                                    key.removeprefix("bus:"))
        rec = {"time": round(self.c.now, 3), "node": self.c.node, "gpu": bus,
               "uuid": None if key.startswith("bus:") else key, "step": step, "result": result,
               "detail": detail}
        self.out.steps.append(rec)
        self.out.notes.append(f"repair {step} {rec['gpu']}: {result}: {detail}")
        ck = f"{step}/{result}"
        self.st.counters[ck] = self.st.counters.get(ck, 0) + 1

    def scontrol(self, argv: list[str]) -> str | None:
        """Run scontrol; None on success, else the error's first line."""
        t = max(0.5, min(10.0, self.c.time_left() - 0.5))
        try:
            runner.run([self.c.scontrol, *argv], t)
        except CommandError as e:
            return e.what.splitlines()[0]
        return None

    # -- the run ----------------------------------------------------------
    def run(self) -> Outcome:
        for g in self.c.gpus:
            if getattr(g, "bus_id", None) and getattr(g, "uuid", None):
                self.st.gpus[g.bus_id] = {"uuid": g.uuid}
        self._advance_reboots()
        recovery = {g.bus_id: g.recovery_action for g in self.c.gpus if getattr(g, "bus_id", None)}
        for f in self.c.faults:
            self._new_fault(f, recovery.get(f.bus))
        for key in list(self.st.episodes):
            self._advance(key)
        return self.out

    def _advance_reboots(self) -> None:
        for key, ep in list(self.st.episodes.items()):
            if ep.get("step") != "rebooting":
                continue
            if self.c.boot_id and ep.get("boot_id") and ep["boot_id"] != self.c.boot_id:
                del self.st.episodes[key]
                self.step(key, "reboot", "done", f"node rebooted for {ep.get('what')}; a repeat counts again")
            elif self.c.node_state is not None and not self._reboot_pending():
                del self.st.episodes[key]
                self.step(key, "reboot", "cancelled", "reboot no longer pending and the node did not "
                          "reboot (cancelled by someone): left for an admin")
                self.out.forget_drain = True

    def _reboot_pending(self) -> bool:
        ns = self.c.node_state
        return ns is not None and bool(ns.flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"})

    def _job_of(self, bus: str) -> str:
        """The job our job state says holds the GPU at *bus* ("" when none, or unknown)."""
        uuid = self.st.gpus.get(bus, {}).get("uuid")
        job = self.c.job_gpus.get(uuid or "", "")
        return job if JOB_ID.fullmatch(job) else ""

    def _new_fault(self, f: Fault, recovery: int | None) -> None:
        s = self.c.settings
        key = self.key(f.bus)
        window = s.rma_window_hours * 3600.0
        job = self._job_of(f.bus)
        times = self.st.failures.get(key, [])
        jobs = self.st.failure_jobs.get(key, [])
        if len(jobs) != len(times):
            jobs = [""] * len(times)
        kept = [(t, j) for t, j in zip(times, jobs) if self.c.now - t <= window] + [(self.c.now, job)]
        self.st.failures[key] = [t for t, _ in kept]
        self.st.failure_jobs[key] = [j for _, j in kept]
        if key in self.st.rma:
            return                               # already sent back: nothing more to try
        # A job that keeps making its GPU fail (its own doing, or an attack) is
        # one failure however often it repeats: it must not send a healthy GPU
        # back.  Failures with no job on the GPU count one each.
        under_job = sum(1 for _, j in kept if j == job) if job else 0
        if under_job > 1:
            self.step(key, "rma", "same job", f"{f.what} under job {job} again: a job's repeated failures "
                      f"count once toward an RMA ({under_job} under that job)")
        counted = len({j for _, j in kept if j}) + sum(1 for _, j in kept if not j)
        if s.rma and counted >= s.rma_failures:
            self._rma(key, f, counted, job, sorted({j for _, j in kept if j}, key=int))
            return
        start = first_step(f.bucket, recovery, s)
        if start is None:
            self.step(key, "drain", "only", f"{f.what} ({f.bucket}): no automatic repair for this fault")
            return
        self.st.episodes[key] = {"bus": f.bus, "what": f.what, "bucket": f.bucket, "step": start,
                                 "since": round(self.c.now, 3), "failures": len(times),
                                 "recovery_action": recovery}

    def _rma(self, key: str, f: Fault, n: int, job: str = "", jobs: list[str] | None = None) -> None:
        s = self.c.settings
        self.st.episodes.pop(key, None)
        ident = "" if key.startswith("bus:") else f" ({key})"
        reason = (f"slurm-gpu: rma: GPU {f.bus}{ident} failed {n} times in {s.rma_window_hours:g} h, "
                  f"last {f.what}" + (f" under job {job}" if job else ""))
        self.st.rma[key] = {"bus": f.bus, "time": round(self.c.now, 3), "failures": n, "reason": reason,
                            "jobs": jobs or []}
        ns = self.c.node_state
        if ns is None or (ns.reason and not ns.ours) or (ns.drained and not self.c.our_reason):
            why = "node state unknown" if ns is None else f"node held by someone else ({ns.reason or 'no reason'})"
            self.step(key, "rma", "recorded", f"{why}: reason left alone")
            return
        err = self.scontrol(slurmclient.update_node_args(self.c.node, state="drain", reason=reason))
        if err:
            self.step(key, "rma", "failed", err)
            return
        self.out.forget_drain, self.out.new_reason = True, reason
        self.step(key, "rma", "drained", reason)

    def _advance(self, key: str) -> None:
        ep = self.st.episodes[key]
        if ep["step"] in ("rebooting", "admin"):
            return
        if self.c.our_reason is None or self.c.node_state is None:
            # Not drained by us: an admin resumed it, or drained it for their own reason.
            del self.st.episodes[key]
            self.step(key, ep["step"], "abandoned", "node not drained by slurm-gpu: left alone")
            return
        if ep["step"] == "reset":
            self._reset(key, ep)
        if ep.get("step") == "reboot":
            self._reboot(key, ep)

    def _busy(self, ep: dict[str, Any]) -> str | None:
        ns = self.c.node_state
        if ns is not None and ns.runs_jobs:
            uuid = self.st.gpus.get(ep["bus"], {}).get("uuid")
            job = self.c.job_gpus.get(uuid or "")
            return f"job {job} holds it" if job else f"jobs run on the node ({ns.base})"
        uuid = self.st.gpus.get(ep["bus"], {}).get("uuid")
        if uuid and uuid in self.c.job_gpus:
            return f"job {self.c.job_gpus[uuid]} holds it (job state)"
        unreadable = sorted(v for k, v in self.c.job_gpus.items() if k.startswith("job:"))
        if unreadable:
            return f"job {unreadable[0]}'s state cannot be read: every GPU counts as held"
        # Slurm and our job state say idle: only now the (slower) fresh NVML read.
        before = self.c.fresh_read() if self.c.fresh_read else None
        g = _gpu(before, ep["bus"])
        if g is not None and g.processes:
            return f"process(es) {', '.join(str(p) for p, _ in g.processes)} use it"
        return None

    def _skip(self, key: str, ep: dict[str, Any], step: str, then: str, why: str) -> None:
        """*step* passed over for *why*: the ladder goes on with *then*."""
        ep["step"] = then
        self.step(key, step, "skipped", why)

    def _reset(self, key: str, ep: dict[str, Any]) -> None:
        s = self.c.settings
        if not s.reset:
            self._skip(key, ep, "reset", "reboot", "[repair] reset is off")
            return
        why = self._busy(ep)
        if why:
            self.step(key, "reset", "refused", f"GPU busy: {why}; retried next run")
            return
        t = min(s.reset_timeout, self.c.time_left() - 2.0)
        if t < 1.0:
            self.step(key, "reset", "deferred", "too little time left in this run")
            return
        res = None
        try:
            res = runner.run([NVIDIA_SMI, "-r", "-i", ep["bus"]], t, check=False)
        except CommandError as e:
            detail = e.what.splitlines()[0]
        else:
            detail = (res.stdout.strip() or res.stderr.strip() or f"exit {res.returncode}").splitlines()[0]
        after = self.c.fresh_read() if self.c.fresh_read else None
        ok, why_not = _reset_helped(after, ep["bus"], self.st.gpus.get(ep["bus"], {}).get("uuid"))
        if res is not None and res.returncode == 0 and ok:
            del self.st.episodes[key]
            self.step(key, "reset", "ok", f"{ep['what']}: GPU back after reset; resumes after clean runs")
            return
        ep["step"] = "reboot"
        self.step(key, "reset", "failed", f"{detail}; {why_not}" if why_not else detail)

    def _reboot(self, key: str, ep: dict[str, Any]) -> None:
        s = self.c.settings
        if not s.reboot:
            self._skip(key, ep, "reboot", "admin", "[repair] reboot is off: left drained for an admin")
            return
        ns = self.c.node_state
        rma = (self.out.new_reason or self.c.our_reason or "").startswith("slurm-gpu: rma:")
        if rma:
            self._skip(key, ep, "reboot", "admin", "the node is drained for an RMA: left for an admin")
            return
        if self._reboot_pending():
            self._skip(key, ep, "reboot", "admin", "a reboot someone else asked for is pending: left alone")
            return
        reason = f"slurm-gpu: reboot: GPU {ep['bus']} {ep['what']}"
        err = self.scontrol(["reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", self.c.node])
        if err:
            self.step(key, "reboot", "failed", f"{err}; retried next run")
            return
        ep["step"], ep["boot_id"] = "rebooting", self.c.boot_id
        # Slurm resumes the node after the reboot (nextstate=RESUME); until then
        # the reason is the reboot's, not a drain of ours to resume.
        self.out.forget_drain, self.out.new_reason = True, reason
        self.step(key, "reboot", "requested", reason + (f" (node {ns.base})" if ns is not None else ""))


def _gpu(h: Any, bus: str) -> Any:
    if h is None or not getattr(h, "available", False):
        return None
    return next((g for g in h.gpus if g.bus_id == bus), None)


def _reset_helped(h: Any, bus: str, uuid: str | None) -> tuple[bool, str]:
    if h is None or not getattr(h, "available", False):
        return False, "NVML unavailable after the reset"
    g = _gpu(h, bus)
    if g is None or g.lost:
        return False, f"GPU {bus} still gone after the reset"
    if uuid and g.uuid and g.uuid != uuid:
        return False, f"another GPU ({g.uuid}) answers at {bus}"
    if g.recovery_action:
        return False, f"recovery action {g.recovery_action} still pending"
    return True, ""


# ------------------------------------------------------------ engine glue

def after_act(*, node: str, settings: RepairSettings, st: RepairState, path: str,
              event_findings: list[Finding], health: Any, node_state: Any, mem: Any,
              boot_id: str | None, job_gpus: Callable[[], dict[str, str]] | None, nvml_opener: Callable[[], Any] | None,
              scontrol: str, deadline: float) -> Outcome:
    """Run the ladder after the drain/resume action; updates *mem* and the state file."""
    faults = faults_from(event_findings)
    steps_on = settings.reset or settings.reboot or settings.rma
    if not (steps_on or faults or st.episodes):
        return Outcome()            # the ladder is off and nothing failed: write nothing
    before = json.dumps(st.to_json(), sort_keys=True)
    fresh = None
    if nvml_opener is not None:
        def fresh() -> Any:
            from ..hw.nvml_health import read_health_bounded
            left = max(1.0, deadline - time.monotonic() - 1.0)
            return read_health_bounded(nvml_opener, call_timeout=min(5.0, left), total_timeout=left,
                                       include_fabric=False, include_processes=True)
    busy_map = job_gpus() if job_gpus is not None and (faults or st.episodes) else {}
    ctx = Context(node=node, settings=settings, faults=faults,
                  gpus=list(health.gpus) if health is not None and health.available else [],
                  node_state=node_state, our_reason=mem.drained_reason, boot_id=boot_id,
                  job_gpus=busy_map, fresh_read=fresh, scontrol=scontrol,
                  time_left=lambda: deadline - time.monotonic())
    out = Ladder(ctx, st).run()
    if out.forget_drain:
        mem.drained_reason, mem.clean_runs = None, 0
    if json.dumps(st.to_json(), sort_keys=True) != before:
        save(path, st)
    append_log(log_path(settings, node), out.steps)
    return out
