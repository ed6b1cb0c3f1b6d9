"""The repair ladder's memory: failure counts, open repairs, RMAs, step log.

``<[repair] state_dir>/repair-state.<node>.json`` (atomic, 0600) and
``repair-log.<node>.jsonl`` (one JSON line per step).  The directory must
survive reboots: the counts outlive the reboots they cause.  A malformed
file, or part of one, is dropped, never fatal: losing it forgets failures
and open repairs, never acts on a guess.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..fsutil import atomic_write
from .settings import RepairSettings

SCHEMA = 1
JOB_ID = re.compile(r"[0-9]{1,20}")


def _tag(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", node) or "_"


def state_path(s: RepairSettings, node: str) -> str:
    return os.path.join(s.state_dir.replace("%n", node), f"repair-state.{_tag(node)}.json")


def log_path(s: RepairSettings, node: str) -> str:
    return os.path.join(s.state_dir.replace("%n", node), f"repair-log.{_tag(node)}.jsonl")


@dataclass
class RepairState:
    gpus: dict[str, dict[str, str]] = field(default_factory=dict)     # bus -> {"uuid", "serial"}
    failures: dict[str, list[float]] = field(default_factory=dict)    # GPU key -> failure times
    # GPU key -> the job that held the GPU at each failure ("" none), aligned with failures
    failure_jobs: dict[str, list[str]] = field(default_factory=dict)
    episodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # GPU key -> open repair
    rma: dict[str, dict[str, Any]] = field(default_factory=dict)      # GPU key -> RMA record
    counters: dict[str, int] = field(default_factory=dict)           # "step/result" -> total

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "gpus": self.gpus, "failures": self.failures, "failure_jobs": self.failure_jobs,
                "episodes": self.episodes, "rma": self.rma, "counters": self.counters}

    @property
    def holding(self) -> bool:
        """An open repair needs the node kept drained (no resume by clean runs)."""
        return any(e.get("step") in ("reset", "reboot", "rebooting") for e in self.episodes.values())


def _str_map(d: Any) -> bool:
    return isinstance(d, dict) and all(isinstance(k, str) for k in d)


def load(path: str) -> RepairState:
    """The state, or an empty one when missing or malformed (dropped part by part)."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return RepairState()
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        return RepairState()
    st = RepairState()
    if _str_map(d.get("gpus")):
        st.gpus = {k: {a: b for a, b in v.items() if isinstance(b, str)} for k, v in d["gpus"].items()
                   if _str_map(v)}
    if _str_map(d.get("failures")):
        st.failures = {k: [float(t) for t in v if isinstance(t, (int, float)) and not isinstance(t, bool)]
                       for k, v in d["failures"].items() if isinstance(v, list)}
    if _str_map(d.get("failure_jobs")):
        # Only where it still lines up with the failure times; a job id is digits.
        for k, v in d["failure_jobs"].items():
            if isinstance(v, list) and k in st.failures and len(v) == len(st.failures[k]):
                st.failure_jobs[k] = [j if isinstance(j, str) and JOB_ID.fullmatch(j) else "" for j in v]
    for name in ("episodes", "rma"):
        v = d.get(name)
        if _str_map(v):
            setattr(st, name, {k: e for k, e in v.items() if _str_map(e) and isinstance(e.get("bus"), str)})
    if _str_map(d.get("counters")):
        st.counters = {k: v for k, v in d["counters"].items() if isinstance(v, int) and not isinstance(v, bool)}
    return st


def save(path: str, st: RepairState) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    atomic_write(path, json.dumps(st.to_json(), indent=1, sort_keys=True) + "\n", mode=0o600)



def append_log(path: str, steps: list[dict[str, Any]]) -> None:
    """One JSON line per step (O_APPEND: whole lines, never interleaved)."""
    if not steps:
        return
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    data = "".join(json.dumps(s, sort_keys=True) + "\n" for s in steps).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
