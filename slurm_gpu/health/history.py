"""A node's fault history, and the cluster's, from the health events (health/events.py).

Pure: event records in, episodes and summaries out.  An *episode* is one
fault: from its first signal (the first warn or drain finding after the
node was last resumed, or after the previous episode) to its drain; it
stays open until the node is resumed.  The jobs that ran on the node between
the first signal and the drain are the ones the fault may have hurt
(``report node`` asks slurmdbd for them).

Where the history lives: each node appends to its own event log
(``<[repair] state_dir>/health-events.<node>.jsonl``, durable across
reboots, bounded by size rotation); with ``[cluster] publish_dir`` every
line also goes to ``<publish_dir>/health-events/<node>.jsonl``, which is
what a login node reads.  slurmdbd is not used for it: it has no place for
per-GPU records, and a job's AdminComment (``on_fatal``) already carries
the fault to accounting.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

REPAIR_STEPS = ("reset", "reboot", "rma")
JOB_STEPS = ("requeue", "cancel", "release")


@dataclass
class Episode:
    """One fault on a node: first signal, drain, what was done, and when it ended."""

    first_signal: float
    drain: float | None = None
    resume: float | None = None
    reason: str | None = None
    gpus: list[str] = field(default_factory=list)
    xids: list[int] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)    # job and repair steps, in order
    holders: list[str] = field(default_factory=list)             # jobs holding a faulty GPU (events' "job")

    def to_json(self) -> dict[str, Any]:
        return {"first_signal": self.first_signal, "drain": self.drain, "resume": self.resume,
                "reason": self.reason, "gpus": self.gpus, "xids": self.xids, "checks": self.checks,
                "steps": self.steps, "holders": self.holders}


def _add(lst: list[Any], v: Any) -> None:
    if v is not None and v not in lst:
        lst.append(v)


def episodes(recs: Iterable[dict[str, Any]]) -> list[Episode]:
    """The node's fault episodes, oldest first (events of one node, in time order)."""
    out: list[Episode] = []
    cur: Episode | None = None
    for r in sorted(recs, key=lambda r: r.get("time", 0)):
        a, t = r.get("action"), float(r.get("time", 0))
        if a == "finding":
            if cur is None or cur.resume is not None:
                cur = Episode(first_signal=t)
                out.append(cur)
            _add(cur.gpus, r.get("gpu"))
            _add(cur.xids, r.get("xid"))
            _add(cur.checks, r.get("check"))
            _add(cur.holders, r.get("job"))
        elif a == "drain":
            if cur is None or cur.resume is not None:
                cur = Episode(first_signal=t)
                out.append(cur)
            if cur.drain is None:
                cur.drain, cur.reason = t, r.get("reason")
            _add(cur.gpus, r.get("gpu"))
            _add(cur.xids, r.get("xid"))
            _add(cur.checks, r.get("check"))
        elif a == "resume":
            if cur is not None and cur.resume is None:
                cur.resume = t
        elif a == "boot":
            if cur is not None and cur.resume is None:      # a reboot while the fault was open
                cur.steps.append({"time": t, "action": "boot", "gpu": None, "job": None})
        elif a in JOB_STEPS or a in REPAIR_STEPS:
            if cur is None:
                cur = Episode(first_signal=t)
                out.append(cur)
            step = {"time": t, "action": a, "gpu": r.get("gpu"), "job": r.get("job")}
            if r.get("result") is not None:
                step["result"] = r["result"]
            cur.steps.append(step)
            if a in JOB_STEPS and r.get("job") is not None and a != "release":
                _add(cur.holders, r.get("job"))
    # A finding that never led to a drain (a warning) is part of the history
    # but no episode of harm: keep episodes with a drain or a step.
    return [e for e in out if e.drain is not None or e.steps]


def since(recs: Iterable[dict[str, Any]], t0: float | None) -> list[dict[str, Any]]:
    return [r for r in recs if t0 is None or float(r.get("time", 0)) >= t0]


NODE_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"


def node_file(directory: str, node: str) -> str:
    """``<dir>/<node>.jsonl`` (a node name is a plain Slurm name: no path may come of it)."""
    if not re.fullmatch(NODE_NAME, node):
        from ..errors import UsageError
        raise UsageError(f"not a node name: {node!r}", "NODE")
    return os.path.join(directory, f"{node}.jsonl")


def nodes_in(directory: str) -> tuple[list[str], list[str]]:
    """(the nodes with a history file in *directory*, the ``.jsonl`` names skipped:
    not ``<node name>.jsonl``, which any writer of the directory could add)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return [], []
    files = sorted(n for n in names if n.endswith(".jsonl") and not n.startswith("."))
    good = [n[:-6] for n in files if re.fullmatch(NODE_NAME, n[:-6])]
    return good, [n for n in files if not re.fullmatch(NODE_NAME, n[:-6])]


def faults_summary(by_node: Mapping[str, Sequence[dict[str, Any]]]) -> dict[str, Any]:
    """The cluster's repeat offenders and fault classes (``report faults``)."""
    drains: Counter[str] = Counter()
    classes: Counter[str] = Counter()
    gpus: Counter[tuple[str, str]] = Counter()
    jobs_hit = 0
    for node, recs in by_node.items():
        for ep in episodes(recs):
            if ep.drain is None:
                continue
            drains[node] += 1
            classes[_class(ep)] += 1
            for g in ep.gpus:
                gpus[(node, g)] += 1
            jobs_hit += sum(1 for s in ep.steps if s["action"] in ("requeue", "cancel"))
    total = sum(drains.values())
    offenders: list[dict[str, Any]] = []
    acc = 0
    for node, n in sorted(drains.items(), key=lambda kv: (-kv[1], kv[0])):
        acc += n
        offenders.append({"node": node, "drains": n, "share": round(n / total, 3) if total else 0.0,
                          "cumulative_share": round(acc / total, 3) if total else 0.0})
    half = next((i + 1 for i, o in enumerate(offenders) if float(o["cumulative_share"]) > 0.5), 0)
    return {"nodes_with_history": len(by_node), "nodes_drained": len(drains), "drains": total,
            "nodes_causing_half": half, "offenders": offenders,
            "classes": [{"class": c, "drains": n} for c, n in sorted(classes.items(), key=lambda kv: (-kv[1], kv[0]))],
            "gpus": [{"node": n, "gpu": g, "drains": k} for (n, g), k in
                     sorted(gpus.items(), key=lambda kv: (-kv[1], kv[0])) if k > 1],
            "jobs_requeued_or_cancelled": jobs_hit}


def _class(ep: Episode) -> str:
    """A fault's class: ``Xid N`` when an Xid was seen, else the drain's check."""
    if ep.xids:
        return f"Xid {ep.xids[0]}"
    if ep.reason:
        m = re.match(r"slurm-gpu: ([a-z0-9_.]+):", ep.reason)
        if m:
            return m.group(1)
    return ep.checks[0] if ep.checks else "unknown"
