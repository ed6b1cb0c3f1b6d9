"""Health events out: one JSON line per finding, drain, resume, job action and repair step.

Every acting health run (slurmd's, and the ones ``xid-watch`` starts) ends by
writing what it saw and did to ``[health] event_log`` (default
``<[repair] state_dir>/health-events.<node>.jsonl``, i.e. under
``/var/lib/slurm-gpu``: it must outlive reboots, it is the node's history, see
``slurm-gpu report node``)::

    {"time": 1795885496.634, "node": "gpu17", "action": "drain", "check": "gpu.xid",
     "gpu": "0000:18:00.0", "uuid": "GPU-...", "xid": 79, "job": null,
     "reason": "slurm-gpu: gpu.xid: Xid 79 on 0000:18:00.0: GPU has fallen off the bus"}

``action`` is ``finding`` (``severity`` beside it), ``drain``, ``resume``,
``requeue``, ``cancel``, ``release`` (a requeued job made eligible now),
``boot`` (the node rebooted since the last run) or a repair step (``reset``,
``reboot``, ``rma``, with its ``result``).  A finding
is written once, when it appears: an event (a kernel line, an xid-watch
record) every time, a condition (a pending remap, a lost GPU) when it was not
in the previous run's findings.

The file is append-only (``O_APPEND``, whole lines) and rotated by size:
past ``event_log_max_bytes`` it is renamed ``.1`` (``.1`` to ``.2``, ...,
``event_log_keep`` files kept), so a node's history is bounded.  Writers
hold the health check's lock.  With ``[cluster] publish_dir`` set, the same
lines also go to ``<publish_dir>/health-events/<node>.jsonl`` (same
rotation), where a login node reads them (``report node``, ``report
faults``).

``[health] event_command`` (an argv list, never a shell) runs once per run
that wrote events, with those lines on stdin, at most
``event_command_timeout`` seconds (its process group is killed then), after
the node's state is saved: it never delays or fails a drain.  Its runs,
failures and timeouts are counted in the state file and exported as
``slurm_gpu_health_event_command_total{result}``.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Iterable, Sequence

from .findings import INFO, Finding, drain_reason

FIELDS = ("time", "node", "action", "check", "gpu", "uuid", "xid", "job", "reason")
MAX_LINE = 4096          # one event; a longer one is cut (reasons are short, our words only)


def finding_key(f: Finding) -> str:
    return f"{f.check}|{f.gpu or ''}|{f.xid if f.xid is not None else ''}|{f.severity}"


def record(node: str, action: str, *, check: str | None = None, gpu: str | None = None,
           uuid: str | None = None, xid: int | None = None, job: str | None = None,
           reason: str | None = None, when: float | None = None, **extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"time": round(time.time() if when is None else when, 3), "node": node,
                           "action": action, "check": check, "gpu": gpu, "uuid": uuid, "xid": xid,
                           "job": job, "reason": reason}
    rec.update({k: v for k, v in extra.items() if v is not None})
    return rec


def from_run(node: str, findings: Sequence[Finding], event_findings: Sequence[Finding],
             seen_before: Iterable[str], *, action: str, reason: str | None, uuid_of: dict[str, str],
             holder_of: dict[str, str], job_steps: Sequence[dict[str, Any]] = (),
             repair_steps: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The events of one acting run, in order: findings, the drain or resume, job actions, repair steps.

    *seen_before*: :func:`finding_key` of the previous run's findings (a
    condition still there is not written again); *uuid_of*: bus id -> UUID;
    *holder_of*: bus id -> the job holding that GPU (our job state), if known.
    """
    now = time.time()
    out: list[dict[str, Any]] = []
    old = set(seen_before)
    events = {id(f) for f in event_findings}
    for f in findings:
        if f.severity == "info":
            continue
        if id(f) not in events and finding_key(f) in old:
            continue
        out.append(record(node, "finding", check=f.check, gpu=f.gpu, uuid=uuid_of.get(f.gpu or ""), xid=f.xid,
                          job=holder_of.get(f.gpu or ""), reason=f.message, when=now, severity=f.severity))
    if action in ("drain", "resume"):
        worst = next((f for f in findings if f.severity == "drain"), None) if action == "drain" else None
        gpu = worst.gpu if worst else None
        out.append(record(node, action, check=worst.check if worst else None, gpu=gpu,
                          uuid=uuid_of.get(gpu or ""), xid=worst.xid if worst else None,
                          job=holder_of.get(gpu or ""), reason=reason, when=now))
    for st in job_steps:
        gpu = st.get("gpu")
        out.append(record(node, st["action"], check=st.get("check"), gpu=gpu, uuid=uuid_of.get(gpu or ""),
                          xid=st.get("xid"), job=st.get("job"), reason=st.get("reason"), when=now))
    for st in repair_steps:
        gpu = st.get("gpu")
        out.append(record(node, str(st.get("step")), gpu=gpu, uuid=st.get("uuid") or uuid_of.get(gpu or ""),
                          job=holder_of.get(gpu or ""), reason=st.get("detail"), when=st.get("time", now),
                          result=st.get("result")))
    return out


def _lines(recs: Sequence[dict[str, Any]]) -> bytes:
    out = []
    for r in recs:
        line = json.dumps(r, sort_keys=True)
        if len(line) > MAX_LINE:
            r = dict(r, reason=str(r.get("reason"))[:MAX_LINE // 2] + "...")
            line = json.dumps(r, sort_keys=True)
        out.append(line + "\n")
    return "".join(out).encode()


def append(path: str, recs: Sequence[dict[str, Any]], max_bytes: int, keep: int) -> None:
    """Append whole lines; first rotate when the file has reached *max_bytes*."""
    if not recs:
        return
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    try:
        st = os.stat(path)
        if st.st_size >= max_bytes:
            rotate(path, keep)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, _lines(recs))
    finally:
        os.close(fd)


def rotate(path: str, keep: int) -> None:
    """``path`` -> ``path.1`` -> ... -> ``path.<keep>`` (the oldest is dropped)."""
    if keep <= 0:
        os.unlink(path)
        return
    for i in range(keep - 1, 0, -1):
        src = f"{path}.{i}"
        if os.path.exists(src):
            os.replace(src, f"{path}.{i + 1}")
    os.replace(path, f"{path}.1")


READ_LIMIT = 256 << 20     # bytes read of one file: far above any rotation size


def _record(rec: Any) -> bool:
    """A record as :func:`record` writes it: the fields a report reads have their types."""
    if not (isinstance(rec, dict) and type(rec.get("time")) in (int, float)
            and math.isfinite(rec["time"]) and isinstance(rec.get("action"), str)):
        return False
    for k in ("node", "check", "gpu", "uuid", "reason", "result"):
        if rec.get(k) is not None and not isinstance(rec[k], str):
            return False
    if rec.get("xid") is not None and type(rec["xid"]) is not int:
        return False
    return rec.get("job") is None or type(rec["job"]) in (str, int)


def read(path: str, keep: int = 9) -> list[dict[str, Any]]:
    """Every event in *path* and its rotated files, oldest first.

    The files may be another node's (the publish directory): a file is read
    only when it is a regular file root (or we) own that nobody else may
    write (no symlink, never blocking on a FIFO), and a line that is not a
    record of the right types is skipped."""
    from ..fsutil import read_trusted
    out: list[dict[str, Any]] = []
    for p in [f"{path}.{i}" for i in range(keep, 0, -1)] + [path]:
        data = read_trusted(p, READ_LIMIT)
        if data is None:
            continue
        for line in data.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if _record(rec):
                out.append(rec)
    return out


def run_command(argv: Sequence[str], recs: Sequence[dict[str, Any]], timeout: float) -> str:
    """Run the admin's command with *recs* on stdin: ``ok``, ``failed`` or ``timeout``."""
    from .. import runner
    from ..errors import CommandError
    try:
        res = runner.run(list(argv), timeout, check=False, input=_lines(recs).decode(),
                         env={"PATH": runner.SAFE_PATH})
    except CommandError as e:
        return "timeout" if "timed out" in e.what else "failed"
    except OSError:
        return "failed"
    return "ok" if res.returncode == 0 else "failed"


# ------------------------------------------------------------ the health run's end

def _expand_node(path: str, node: str) -> str:
    return path.replace("%n", node)


def log_path(opts: Any) -> str | None:
    """Where this node's health events go ([health] event_log), or None when off."""
    p = opts.settings.event_log
    if p == "off":
        return None
    if not p:
        base = opts.repair.state_dir if opts.repair is not None else opts.state_dir
        if not base:
            return None
        from .statefiles import _node_tag
        return os.path.join(_expand_node(base, opts.node), f"health-events.{_node_tag(opts.node)}.jsonl")
    return _expand_node(p, opts.node)


def after_run(opts: Any, rep: Any, event_findings: list[Finding], state: dict, health: Any,
              rec: Any, deadline: float, rebooted: bool = False) -> None:
    """[health] event_log and event_command at the end of an acting run: never a reason for it to fail."""
    s = opts.settings
    counts = state.get("event_command")
    rep.event_command = ({k: v for k, v in counts.items() if isinstance(k, str) and isinstance(v, int)}
                         if isinstance(counts, dict) else {})
    seen = state.get("findings_seen")
    seen = [k for k in seen if isinstance(k, str)] if isinstance(seen, list) else []
    uuid_of = {g.bus_id: g.uuid for g in (getattr(health, "gpus", None) or []) if g.bus_id and g.uuid}
    repair_steps = getattr(rec, "steps", None) or []
    holder: dict[str, str] = {}
    want_events = rebooted or rep.action in ("drain", "resume") or rep.jobs or repair_steps or any(
        f.severity != INFO and finding_key(f) not in set(seen) for f in rep.findings) or any(
        f.severity != INFO for f in event_findings)
    if not want_events:
        return
    if opts.job_gpus is not None:
        try:
            held = opts.job_gpus()
        except Exception:  # noqa: BLE001 - who held the GPU is a nicety of the record
            held = {}
        holder = {bus: held[u] for bus, u in uuid_of.items() if u in held}
    reason = drain_reason(rep.findings) if rep.action == "drain" else None
    recs = from_run(opts.node, rep.findings, event_findings, seen, action=rep.action, reason=reason,
                           uuid_of=uuid_of, holder_of=holder, job_steps=rep.jobs, repair_steps=repair_steps)
    if rebooted:
        # The node booted since the last run: the history shows it before what this run found.
        recs.insert(0, record(opts.node, "boot", reason="the node rebooted since the last health run",
                                     when=recs[0]["time"] if recs else None))
    if not recs:
        return
    rep.events = recs
    path = log_path(opts)
    if path:
        try:
            append(path, recs, s.event_log_max_bytes, s.event_log_keep)
        except OSError as e:
            rep.notes.append(f"health events not written to {path}: {e.strerror or e}")
    note = _publish_events(opts.node, recs, s.event_log_max_bytes, s.event_log_keep)
    if note:
        rep.notes.append(note)
    if s.event_command:
        left = deadline - time.monotonic() - 0.5
        result = ("skipped" if left < 0.5 else
                  run_command(s.event_command, recs, min(s.event_command_timeout, left)))
        rep.event_command[result] = rep.event_command.get(result, 0) + 1
        if result != "ok":
            rep.notes.append(f"event_command {result}: {s.event_command[0]}")


PUBLISH_EVENTS_SECONDS = 2.0


def _publish_events(node: str, recs: list[dict[str, Any]], max_bytes: int, keep: int) -> str | None:
    """The same lines to ``<[cluster] publish_dir>/health-events/<node>.jsonl``, where login nodes read them.

    A shared file system that does not answer within PUBLISH_EVENTS_SECONDS
    is left behind (a daemon thread, as the model's publication does): a
    note, never a failed or slow health check.
    """
    from .. import config
    pub = (config.load_raw().get("cluster") or {}).get("publish_dir")
    if not pub or not isinstance(pub, str):
        return None
    import threading
    target = os.path.join(_expand_node(pub, node), "health-events", f"{node}.jsonl")
    done: list[str] = []

    def write() -> None:
        try:
            append(target, recs, max_bytes, keep)
            done.append("")
        except OSError as e:
            done.append(f"health events not published to {target}: {e.strerror or e}")
    t = threading.Thread(target=write, name="slurm-gpu-events", daemon=True)
    t.start()
    t.join(PUBLISH_EVENTS_SECONDS)
    if not done:
        return f"health events not published: {target} did not answer in {PUBLISH_EVENTS_SECONDS:g} s"
    return done[0] or None
