"""What the health check does around its drain/resume action, beyond draining.

One object per acting run, used by the engine in two steps:

* :meth:`Recovery.prepare`, before ``actions.act``: load the repair ladder's
  state (an open repair keeps the node drained), look at a user-problem
  marker's GPUs (health/userproblem.py), and run the DCGM resume gate when
  this run would resume a node drained for a fault;
* :meth:`Recovery.finish`, after it: drop a user-problem marker whose drain
  is done, and walk the repair ladder (health/repair.py).

Nothing here runs on a clean node beyond two ``open()`` calls that fail
(the repair state and the marker are absent).
"""
from __future__ import annotations

import time
from typing import Any

from .findings import INFO, WARN, Finding

# Acting needs time for two scontrol calls (registry.ACT_MIN_SECONDS).
_ACT_SECONDS = 1.5


# dcgmi diag -r 2 and -r 3 stress every GPU (memory, SM, PCIe, power) for
# minutes: on a node with a job they slow or break it.  Level 1 is a quick
# software check that runs beside jobs.
INTRUSIVE_LEVEL = 2


def diag_busy(opts: Any, deadline: float) -> str | None:
    """Why an intrusive diagnostic must wait, or None when the node is idle.

    Busy when a job holds a GPU in our job state, or Slurm says jobs run on
    the node (ALLOCATED, MIXED, COMPLETING; a drained node still running
    jobs is DRAINING with one of those).  A state that cannot be read counts
    as busy: the diagnostic waits for the next run, never the other way.
    """
    from ..errors import CommandError
    from .actions import show_node
    if opts.job_gpus is not None:
        held = opts.job_gpus()
        if held:
            return f"job {sorted(set(held.values()))[0]} holds a GPU"
    t = deadline - time.monotonic() - _ACT_SECONDS - 1.0
    try:
        ns = show_node(opts.node, max(1.0, min(5.0, t)))
    except CommandError as e:
        return f"node state unknown ({e.what.splitlines()[0][:80]})"
    if ns is None:
        return "node state unknown (scontrol does not know this node)"
    if ns.runs_jobs:
        return f"jobs run on the node ({ns.base})"
    return None


def dcgm_findings(opts: Any, level: int, deadline: float, health: Any) -> list[Finding]:
    """gpu.dcgm: dcgmi diag within what is left of this run (levels 2 and 3 only on an idle node)."""
    from . import dcgm
    why = diag_busy(opts, deadline) if level >= INTRUSIVE_LEVEL else None
    if why is not None:
        return [Finding(dcgm.CHECK, INFO, f"dcgmi diag -r {level} deferred to an idle run: {why}")]
    return _diag(opts, level, deadline, health)


def _diag(opts: Any, level: int, deadline: float, health: Any) -> list[Finding]:
    from . import dcgm
    left = deadline - time.monotonic() - _ACT_SECONDS - 1.0
    if left < 2.0:
        return [Finding(dcgm.CHECK, WARN, "too little time left in this run for dcgmi diag")]
    r = dcgm.run(level, min(opts.settings.dcgm_timeout, left))
    bus_of = {g.index: g.bus_id for g in health.gpus if g.bus_id} if health is not None else {}
    return dcgm.findings(r, bus_of)


class Recovery:
    def __init__(self, opts: Any, deadline: float, health: Any, notes: list[str]) -> None:
        from . import repair
        self.opts, self.deadline, self.health, self.notes = opts, deadline, health, notes
        self.steps: list = []                # the repair steps of this run (health events)
        self.settings = opts.repair
        self.rpath = repair.state_path(self.settings, opts.node)
        self.rstate = repair.load(self.rpath)
        self.marker: Any = None
        self.mpath = ""
        self.dirty = False           # something keeps the node drained (leftovers, a failed gate)

    # -- before the action ------------------------------------------------
    def prepare(self, want: str | None, mem: Any, clean_runs_to_resume: int) -> None:
        if self.settings.user_problem and self.opts.state_dir:
            from . import userproblem
            self.mpath = userproblem.marker_path(self.opts.state_dir, self.opts.node)
            self.marker = userproblem.load_marker(self.mpath)
            if self.marker is not None:
                self.dirty = self._still_left()
        if (self.settings.dcgm_gate and want is None and self.marker is None and mem.drained_reason
                and mem.clean_runs + 1 >= max(1, clean_runs_to_resume)):
            # This run would resume a node drained for a fault: DCGM must agree first.
            level = self.settings.dcgm_gate
            why = diag_busy(self.opts, self.deadline) if level >= INTRUSIVE_LEVEL else None
            if why is not None:
                # Not run is not passed: drained until an idle run's diagnostic passes.
                self.notes.append(f"resume gate: dcgmi diag -r {level} waits for an idle node: {why}")
                self.dirty = True
                return
            gate = _diag(self.opts, level, self.deadline, self.health)
            self.notes += [f"resume gate: {f.message}" for f in gate]
            self.dirty = self.dirty or any(f.severity != INFO for f in gate)

    @property
    def hold(self) -> bool:
        return self.rstate.holding or self.dirty

    @property
    def adopt(self) -> str | None:
        return self.marker.reason if self.marker is not None else None

    def clean_runs_to_resume(self, configured: int) -> int:
        # A user problem is resumed by its first clean check; a node problem by the configured number.
        return 1 if self.marker is not None and not self.dirty else max(1, configured)

    def _still_left(self) -> bool:
        from ..hw.nvml_health import read_health_bounded
        from .userproblem import leftovers
        if self.opts.nvml_opener is None:
            return True
        left = max(1.0, self.deadline - time.monotonic() - _ACT_SECONDS - 1.0)
        h = read_health_bounded(self.opts.nvml_opener, call_timeout=min(self.opts.settings.nvml_call_timeout, left),
                                total_timeout=left, include_fabric=False, include_processes=True)
        if not h.available or h.hung:
            self.notes.append(f"user-problem: GPUs not read ({h.error or h.hung}): stays drained")
            return True
        found = leftovers([g for g in h.gpus if g.bus_id in self.marker.gpus], self.marker.uid)
        self.notes.append(f"user-problem: {'; '.join(found)}: stays drained" if found
                          else f"user-problem: job {self.marker.jobid}'s GPUs are clean")
        return bool(found)

    # -- after the action -------------------------------------------------
    def finish(self, out: Any, mem: Any, event_findings: list[Finding], boot: str | None) -> Any:
        """Drop a finished marker, walk the ladder; returns the ladder state (metrics)."""
        from . import repair
        from .actions import scontrol_path
        m = self.marker
        if m is not None and (out.plan.action != "none" or out.node is None or not out.node.drained
                              or out.node.reason != m.reason):
            # Resumed, replaced by a node fault, or no longer ours: the marker is done.
            from .userproblem import drop_marker
            drop_marker(self.mpath)
        r = repair.after_act(node=self.opts.node, settings=self.settings, st=self.rstate, path=self.rpath,
                             event_findings=event_findings, health=self.health, node_state=out.node,
                             mem=mem, boot_id=boot, job_gpus=self.opts.job_gpus,
                             nvml_opener=self.opts.nvml_opener, scontrol=scontrol_path(),
                             deadline=self.deadline)
        self.notes += r.notes
        self.steps = r.steps
        return self.rstate
