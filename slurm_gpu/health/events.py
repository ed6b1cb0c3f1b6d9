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
import os
import time
from typing import Any, Iterable, Sequence

from .findings import Finding

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


def read(path: str, keep: int = 9) -> list[dict[str, Any]]:
    """Every event in *path* and its rotated files, oldest first (malformed lines skipped)."""
    out: list[dict[str, Any]] = []
    for p in [f"{path}.{i}" for i in range(keep, 0, -1)] + [path]:
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError:
            continue
        for line in data.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("time"), (int, float)) and isinstance(rec.get("action"), str):
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
