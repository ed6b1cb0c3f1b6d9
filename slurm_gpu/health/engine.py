"""Run the health check: gather once per source, run the checks, act.

Order of a run (``--slurm`` mode is HealthCheckProgram):

1. pick the checks (``--only``, minus ``[health] skip``);
2. gather only what they need: gres.conf, NVML (every call under a
   deadline, in a worker thread), the kernel log and the xid-watch event
   file (each from its cursor), the OS settings;
3. run the pure checks;
4. unless ``--no-drain``: drain/resume through scontrol (never on the first
   run of a slurmd, before it registers), then save cursors and state.

The whole run sits under a watchdog (``[health] watchdog_seconds``, 20 s by
default, well below Slurm's 60 s kill): when it fires the run reports
*unknown* (exit 3) and changes nothing, so a slow shared filesystem never
drains a rack of nodes.
"""
from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import InputError, SlurmGpuError
from ..procfs import parent_slurmd
from .expected import default_gres_conf, expected_gpus
from .events import finding_key
from .findings import DRAIN, INFO, WARN, Finding, drain_reason, sort_findings, worst
from .gpu_checks import run_gpu_checks
from .registry import (ACT_MIN_SECONDS, ALL_CHECKS, KMSG, NVML, OS, OWN, KmsgGather, OsGather, OwnGather,
                       enabled_checks, of_gather)
from .settings import HealthSettings
from .statefiles import _node_tag, lock_file, open_lock, state_file  # noqa: F401 - engine.state_file: old home

STATE_FILE = "health-state.json"          # before 0.x: one file per state_dir (read once, to migrate)
EVENTS_FILE = "xid-events.jsonl"


class WatchdogExpired(Exception):
    pass


@dataclass
class Options:
    """One health-check run's inputs: the node, its settings, what to read and whether to act."""

    node: str
    settings: HealthSettings
    state_dir: str
    only: list[str] | None = None
    kernel_log: str | None = None          # CLI --kernel-log: read whole file, no cursor
    no_drain: bool = False
    slurm_mode: bool = False
    nvml_opener: Callable[[], Any] | None = None   # -> slurm_gpu.hw.gpus.Gpus (hw.backend.opener)
    gres_conf: str | None = None
    os_root: str = "/"
    parent_slurmd: str | None = None       # identity of the slurmd that started us, if any
    expected_links: dict[str, int] | None = None  # bus id -> NVLinks the node model has
    repair: Any = None                     # settings.RepairSettings: the repair ladder ([repair])
    job_gpus: Callable[[], dict[str, str]] | None = None  # GPU uuid -> job id holding it (jobs.state.gpus_held)
    # SLURM_NODE_IS_HEALTHY ("yes"/"no"): slurmctld's verdict, which slurmd
    # passes from Slurm 26.05.2 with SlurmctldParameters=health_check_report
    # (by default from 26.11).  Unset at slurmd's start-up run, before it registers.
    slurm_healthy: str | None = None
    # path -> the first directory above it a non-root user could change, or
    # None (jobs.trust.untrusted_ancestor; the front end passes it in).
    untrusted_dir: Callable[[str], str | None] | None = None


@dataclass
class Report:
    """One run's result: findings, the node status they add up to, and what was done."""

    node: str
    findings: list[Finding]
    status: str
    notes: list[str] = field(default_factory=list)
    broken: str | None = None              # the check itself failed (exit 3 / --slurm non-zero)
    action: str = "none"
    elapsed: float = 0.0
    repair: Any = None                     # repair.RepairState after this run (metrics)
    jobs: list[dict[str, Any]] = field(default_factory=list)   # on_fatal's steps (requeue, cancel, release)
    events: list[dict[str, Any]] = field(default_factory=list)  # what went to [health] event_log
    event_command: dict[str, int] = field(default_factory=dict)  # its runs by result, since the state began

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "status": self.status, "findings": [f.to_json() for f in self.findings]}


def select_checks(only: list[str] | None, s: HealthSettings) -> list[str]:
    """The checks to run: ``--only`` (validated) or all enabled ones minus ``skip``."""
    if only:
        bad = [c for c in only if c not in ALL_CHECKS]
        if bad:
            from ..errors import UsageError
            raise UsageError(f"unknown check {bad[0]!r}; known: {', '.join(ALL_CHECKS)}", "--only")
        return list(dict.fromkeys(only))
    return enabled_checks(s)


def _expand(path: str, node: str) -> str:
    return path.replace("%n", node)


# --------------------------------------------------------------------- run

def run(opts: Options) -> Report:
    """One health-check run under the watchdog."""
    t0 = time.monotonic()
    s = opts.settings
    use_alarm = s.watchdog_seconds > 0 and hasattr(signal, "SIGALRM")
    old = None
    if use_alarm:
        def _expired(signum: int, frame: Any) -> None:
            raise WatchdogExpired()
        old = signal.signal(signal.SIGALRM, _expired)
        signal.setitimer(signal.ITIMER_REAL, s.watchdog_seconds)
    deadline = t0 + (s.watchdog_seconds if s.watchdog_seconds > 0 else 3600.0)

    def disarm() -> None:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        rep = _run(opts, deadline, disarm)
    except WatchdogExpired:
        rep = Report(opts.node, [Finding("health.watchdog", WARN, f"health check did not finish in "
                                         f"{s.watchdog_seconds:g} s: nothing changed")], "warn",
                     broken="watchdog expired")
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    rep.elapsed = time.monotonic() - t0
    return rep


def _run(opts: Options, deadline: float, disarm: Callable[[], None]) -> Report:
    if opts.no_drain or not opts.state_dir:
        return _run_locked(opts, deadline, disarm)
    # One acting run at a time per node (slurmd's and an admin's): the state
    # file and the cursors are read-modify-write.
    import fcntl
    os.makedirs(opts.state_dir, mode=0o755, exist_ok=True)
    fd = open_lock(lock_file(opts.state_dir, opts.node))
    try:
        t_end = time.monotonic() + 2.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > t_end:
                    return Report(opts.node, [], "ok", ["another health check holds the lock"],
                                  broken="another health check is running on this node")
                time.sleep(0.05)
        return _run_locked(opts, deadline, disarm)
    finally:
        os.close(fd)


def _xid_memo(state: dict) -> dict:
    """NVLink5 verdicts decoded in earlier runs of this boot (for "caused by previous Xid N")."""
    from ..hw.kmsg import boot_id
    doc = state.get("xid_memo")
    if not isinstance(doc, dict) or doc.get("boot_id") != (boot_id() or None):
        return {}
    memo = doc.get("nvlink5")
    if not isinstance(memo, dict):
        return {}
    return {k: v for k, v in memo.items() if isinstance(k, str) and re.fullmatch(r"1(4[4-9]|50)\|[0-9a-f:.]*", k)
            and isinstance(v, dict) and v.get("action") in (INFO, WARN, DRAIN)}


def _run_locked(opts: Options, deadline: float, disarm: Callable[[], None]) -> Report:
    s = opts.settings
    checks = select_checks(opts.only, s)
    state_path = state_file(opts.state_dir, opts.node)
    acting = not opts.no_drain
    from . import actions
    state: dict = {}
    notes: list[str] = []
    if opts.state_dir:
        legacy = os.path.join(opts.state_dir, STATE_FILE)
        # Migrate the old shared name once (it held this node's state on a
        # one-slurmd host); losing it would reread kmsg from boot and redrain.
        state = actions.load_state(state_path if os.path.exists(state_path) or not os.path.exists(legacy)
                                   else legacy, notes)
    findings: list[Finding] = []
    incomplete: str | None = None          # a gather fell short: this run is no clean run
    event_findings: list[Finding] = []     # from XIDs/xid-watch records: consumed by the cursors, so owed
    if opts.state_dir and opts.untrusted_dir is not None:
        # Whoever may change state_dir may swap the state file (our drains,
        # the cursors) or the locks under the check.
        bad = opts.untrusted_dir(os.path.join(opts.state_dir, "_"))
        if bad:     # the run goes on: refusing would leave a faulty node in service
            findings.append(Finding("health.state_dir", WARN, f"state_dir {opts.state_dir} is not root-trusted: "
                                    f"another user may change {bad} (and so this check's state and locks)"))

    # gres.conf: only when a check compares against it.
    expected = None
    if {"gpu.count", "gpu.nvml"} & set(checks):
        expected = expected_gpus(opts.gres_conf if opts.gres_conf is not None else default_gres_conf(s), opts.node)

    # NVML, every call under a deadline.
    nvml_names = {c.name for c in of_gather(checks, NVML)}
    nvml_checks = [c for c in checks if c in nvml_names]
    health = None
    if nvml_checks and opts.nvml_opener is not None:
        from ..hw.nvml_health import read_health_bounded
        budget = max(1.0, min(s.watchdog_seconds * 0.6, s.watchdog_seconds - 3.0)) if s.watchdog_seconds else 60.0
        health = read_health_bounded(opts.nvml_opener, call_timeout=min(s.nvml_call_timeout, budget),
                                     total_timeout=budget,
                                     include_fabric=bool({"gpu.fabric", "gpu.fabric_registration"} & set(checks)),
                                     include_nvlink_speed="gpu.nvlink_speed" in checks)
        baseline = None
        if {"gpu.nvlink", "gpu.nvlink_speed", "gpu.pcie", "gpu.fabric_registration"} & set(nvml_checks):
            from .baseline import load_for_check
            baseline, why = load_for_check(s.baseline)
            if why:         # never stops the run, never drains: the checks fall back
                findings.append(Finding("health.baseline", WARN, why))
        findings += run_gpu_checks(health, expected, nvml_checks, s.retired_pages_max, opts.expected_links,
                                   baseline)
        if health.slow:
            incomplete = f"NVML too slow: {health.hung}"

    # Kernel log + xid-watch events, each from its cursor.
    cursor = dict(state.get("cursor") or {})
    new_cursor = cursor
    xid_memo: dict | None = None
    kmsg_checks = of_gather(checks, KMSG)
    if kmsg_checks:
        from ..hw import kmsg
        if opts.kernel_log:
            lines, _ = kmsg.read_source(opts.kernel_log, {})   # a file named on the command line: bad input
        else:
            # The configured source failing must not blind the NVML checks: the
            # run goes on, is "unknown", and is no clean run (the cursor stays).
            try:
                lines, new_cursor = kmsg.read_source(_expand(s.kernel_log, opts.node), cursor)
            except InputError as e:
                lines = []
                incomplete = "; ".join(filter(None, [incomplete, e.message()]))
        # Most runs find no driver line and no record: the XID parser (its
        # regexes) is then never loaded, here or in the checks (registry.py).
        events: list = []
        if lines:
            from . import xid
            events = xid.parse_lines(lines)
        ev_path = _expand(s.events_file, opts.node) if s.events_file else os.path.join(opts.state_dir, EVENTS_FILE)
        if not opts.kernel_log and opts.state_dir:
            try:
                records, new_cursor = kmsg.read_events(ev_path, new_cursor)
            except InputError as e:
                records = []
                incomplete = "; ".join(filter(None, [incomplete, e.message()]))
            if records:
                from . import xid
                more, direct = xid.events_from_nvml(records)
                events += more
                event_findings += direct
        xid_memo = _xid_memo(state)
        confirmed = None
        if events and health is not None:
            from .onfatal import nvml_confirms
            confirmed = nvml_confirms(health, state.get("gpu_index"), expected.count if expected else None)
        gathered = KmsgGather(lines, events, xid_memo, confirmed)
        for c in kmsg_checks:
            event_findings += c.check(gathered)
        findings += event_findings

    # OS audit.
    os_checks = of_gather(checks, OS)
    if os_checks:
        from .osinfo import read_os
        info = read_os(opts.os_root, want={c.name for c in os_checks})
        gpus_expected = bool(expected and expected.count) or bool(health and health.gpus)
        os_gathered = OsGather(info, s, gpus_expected)
        for c in os_checks:
            findings += c.check(os_gathered)

    # Checks that gather for themselves (IMEX, DCGM), within the time left.
    own = OwnGather(opts, deadline, health)
    for c in of_gather(checks, OWN):
        findings += c.check(own)
    # Debounce and boot grace (docs/health.md): a drain some runs in a row
    # must confirm, or that waits out link training after boot.
    from .fabric_state import settle
    findings = settle(findings, opts)

    from .nodestate import Memory
    from ..hw.kmsg import boot_id
    mem = Memory.from_json(state.get("memory") or {})
    boot = boot_id() or None
    if mem.pending_reason and mem.boot_id and boot and mem.boot_id != boot:
        # A drain owed from before a reboot (found while the node was booting,
        # powering down or in maintenance): the reboot is the repair for most
        # of them, and what persists the NVML checks find again.
        notes.append(f"dropped a drain owed from the previous boot: {mem.pending_reason}")
        mem.pending_reason = None
    mem.boot_id = boot
    if mem.isolated:
        from .isolate import soften
        findings = soften(findings, set(mem.isolated))
    findings = sort_findings(findings)
    rep = Report(opts.node, findings, worst(findings), notes, broken=incomplete)
    if not acting:
        return rep

    # Act on Slurm.  From here on the watchdog's alarm is off: an alarm inside
    # scontrol would orphan the child and lose the state of a drain just made
    # (which we then could never resume).  Every call below has a timeout
    # taken from the same deadline instead.
    # Slurm passes SLURM_NODE_IS_HEALTHY only once slurmd has registered: with
    # it, a run is never the start-up one (older Slurm: our record of slurmd).
    first_run = bool(opts.slurm_mode and opts.parent_slurmd and mem.slurmd != opts.parent_slurmd
                     and opts.slurm_healthy is None)
    if opts.slurm_healthy is not None and opts.parent_slurmd:
        mem.slurmd = opts.parent_slurmd
    from . import onfatal
    gpu_index = onfatal.gpu_index_for(opts, health, state.get("gpu_index"), first_run)
    owed = onfatal.load_owed(state.get("on_fatal_owed"))
    if not first_run and deadline - time.monotonic() < ACT_MIN_SECONDS:
        rep.broken = "watchdog: too little time left to call scontrol: nothing changed"
        return rep
    disarm()
    if s.isolate_bad_gpu and health is not None and not first_run:
        findings = _try_isolate(opts, findings, health, mem, deadline, notes)
        rep.findings, rep.status = findings, worst(findings)
    want = drain_reason(findings)
    # Only what the events found is owed to a later run; conditions are simply seen again.
    if mem.isolated:
        from .isolate import soften
        event_findings = soften(event_findings, set(mem.isolated))
    owe = drain_reason(event_findings)
    if incomplete and want is None and not first_run:
        # Nothing to drain, but the checks did not all run: counting this as a
        # clean run could resume a node; change nothing, read events again next run.
        # (A first run still records its slurmd, or every run would count as first.)
        return rep
    rec = None
    if first_run:
        # First run of this slurmd: it runs us before registering, and scontrol
        # can hang then.  Remember what we found; the next run applies it.
        mem.slurmd = opts.parent_slurmd
        if owe:
            mem.pending_reason = owe
        notes.append("first run of this slurmd (before registration): scontrol not called")
        rep.action = "deferred" if want else "none"
    else:
        # scontrol must finish before the watchdog: a child is never left behind.
        timeout = max(0.5, min(s.scontrol_timeout, (deadline - time.monotonic() - 0.5) / 2))
        if opts.repair is not None and not opts.kernel_log:
            from .recovery import Recovery
            rec = Recovery(opts, deadline, health, notes)
            rec.prepare(want, mem, s.clean_runs_to_resume)
        out = actions.act(opts.node, want, mem,
                          clean_runs_to_resume=rec.clean_runs_to_resume(s.clean_runs_to_resume) if rec
                          else max(1, s.clean_runs_to_resume),
                          timeout=timeout, owe=owe, hold=bool(rec and rec.hold),
                          adopt=rec.adopt if rec else None, slurm_healthy=opts.slurm_healthy)
        mem = out.plan.memory
        notes.append(out.plan.note)
        rep.action = out.plan.action
        if out.error:
            rep.broken = out.error if not incomplete else f"{incomplete}; {out.error}"
            notes.append(out.error)
        elif rec is not None:
            rep.repair = rec.finish(out, mem, event_findings, boot)
        if not out.error and not opts.kernel_log:
            owed = onfatal.after_act(opts, out, event_findings, gpu_index, owed, deadline, rep)
    if not opts.kernel_log:
        old_boot = (state.get("memory") or {}).get("boot_id")
        from .events import after_run as events_out
        events_out(opts, rep, event_findings, state, health, rec, deadline,
                   rebooted=bool(old_boot and boot and old_boot != boot))
    if opts.state_dir:
        doc_memo = ({"boot_id": mem.boot_id, "nvlink5": xid_memo} if xid_memo is not None and not opts.kernel_log
                    else state.get("xid_memo"))
        doc = {"memory": mem.to_json(), "cursor": new_cursor, "xid_memo": doc_memo,
               "last_run": time.time(), "last_status": rep.status}
        if gpu_index:
            doc["gpu_index"] = gpu_index
        if owed:
            doc["on_fatal_owed"] = owed
        if acting and not opts.kernel_log:
            doc["findings_seen"] = sorted({finding_key(f) for f in rep.findings if f.severity != INFO})
            doc["event_command"] = rep.event_command
        actions.save_state(state_path, doc)
    return rep


def _try_isolate(opts: Options, findings: list[Finding], health: Any, mem: Any, deadline: float,
                 notes: list[str]) -> list[Finding]:
    """--isolate-bad-gpu: take per-GPU faults out of gres.conf; on any doubt, drain as usual."""
    from . import actions
    from .isolate import bad_gpus, isolate, soften
    bad = bad_gpus(findings, [g.bus_id for g in health.gpus if g.bus_id])
    if not bad:
        return findings
    gres = opts.gres_conf if opts.gres_conf is not None else default_gres_conf(opts.settings)
    timeout = max(0.5, min(opts.settings.scontrol_timeout, (deadline - time.monotonic()) / 3))
    try:
        if not gres or not os.path.exists(gres):
            raise SlurmGpuError("no gres.conf to rewrite")
        notes.append(isolate(opts.node, bad, gres, actions.scontrol_path(), timeout))
    except (SlurmGpuError, OSError) as e:
        notes.append(f"not isolating {', '.join(sorted(bad))}: {e}; draining instead")
        return findings
    mem.isolated = sorted(set(mem.isolated) | bad)
    return sort_findings(soften(findings, bad))


__all__ = ["ACT_MIN_SECONDS", "ALL_CHECKS", "Options", "Report", "run", "select_checks", "expected_gpus",
           "parent_slurmd",
           "DRAIN", "INFO", "WARN", "SlurmGpuError"]
