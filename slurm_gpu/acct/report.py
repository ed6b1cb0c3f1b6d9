"""``job report`` and ``report usage``: figures from the stored summaries (pure
functions over sacct rows; the two ``fetch_*`` functions run sacct).

A device's *used* GPU-time is its mean SM utilisation × the time it was
held × its fraction of a GPU (a MIG instance counts by its compute slices:
a 1g on an H100 is 1/7).  Its *allocated* GPU-time is the time held × the
fraction.  So:

* job efficiency   = Σ used / Σ allocated  (how well jobs use what they hold);
* cluster use      = Σ used / Σ capacity   (capacity: the nodes' GPUs × the period);
* idle GPU-hours   = Σ idle fraction × held time × fraction.

A GPU several jobs share (gres/shard, gres/mps; ``sh`` in the summary) is
split by process: a job's SM % is its own processes' part of the whole GPU,
so its used GPU-time is that × the time held, and its fraction is its part
of the allocation (1 / the jobs holding the GPU, averaged over the samples).

Time held is the job's elapsed time inside the period.  A job without a
summary (accounting off, or not stored yet) counts its allocated GPUs from
``AllocTRES`` and no use.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping

from ..errors import SlurmGpuError
from ..runner import run
from . import dbd

FIELDS = ("JobIDRaw", "User", "Account", "Partition", "NodeList", "State", "Start", "End", "ElapsedRaw",
          "AllocTRES", "AdminComment")
_GPU_TRES = re.compile(r"(?:^|,)gres/gpu=([0-9]+)")
_MIG_TYPE = re.compile(r"_([1-7])g\.[0-9]+gb", re.I)

IDLE_VERDICT = 0.9       # idle fraction at or above which a device is "idle"
LOW_VERDICT = 30.0       # mean SM % below which utilisation is "low"
HEADROOM_VERDICT = 0.5   # max memory below this share of the device: "memory headroom"


@dataclass
class JobRow:
    jobid: str
    user: str = ""
    account: str = ""
    partition: str = ""
    nodes: str = ""
    state: str = ""
    start: float | None = None
    end: float | None = None
    elapsed: float = 0.0
    gpus: int = 0
    summary: dict[str, Any] | None = None          # node -> part
    other_comment: str = ""


def _time(text: str) -> float | None:
    if not text or text in ("Unknown", "None"):
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def parse_rows(text: str, delim: str = "|") -> list[JobRow]:
    """sacct ``-n -P [--delimiter DELIM] -o FIELDS`` output -> rows (the newest
    record of a requeued job wins).  Give the delimiter :func:`dbd.delimiter`
    made: with ``|`` a newline in an AdminComment could start a forged row."""
    rows: dict[str, JobRow] = {}
    for parts in dbd.records(text, delim, len(FIELDS)):
        d = dict(zip(FIELDS, parts))
        m = _GPU_TRES.search(d["AllocTRES"])
        other, ours = dbd.split(d["AdminComment"])
        rows[d["JobIDRaw"]] = JobRow(
            jobid=d["JobIDRaw"], user=d["User"], account=d["Account"], partition=d["Partition"],
            nodes=d["NodeList"], state=d["State"].split()[0] if d["State"] else "",
            start=_time(d["Start"]), end=_time(d["End"]),
            elapsed=float(d["ElapsedRaw"]) if d["ElapsedRaw"].isdigit() else 0.0,
            gpus=int(m.group(1)) if m else 0, summary=ours, other_comment=other)
    return list(rows.values())


def _sacct(argv: list[str], timeout: float, env: Mapping[str, str] | None) -> list[JobRow]:
    delim = dbd.delimiter()
    res = run([argv[0], "-n", "-P", "--delimiter", delim, *argv[1:], "-o", ",".join(FIELDS)], timeout,
              check=False, env=env)
    if res.returncode != 0:
        raise SlurmGpuError(f"sacct failed: {(res.stderr or res.stdout).strip()[:200]}", "sacct")
    return parse_rows(res.stdout, delim)


def fetch_job(sacct: str, jobid: str, timeout: float = 10.0, env: Mapping[str, str] | None = None) -> JobRow | None:
    rows = _sacct([sacct, "-X", "-j", jobid], timeout, env)
    return next((r for r in rows if r.jobid == jobid), None)


def fetch_period(sacct: str, since: str, until: str, timeout: float = 30.0,
                 env: Mapping[str, str] | None = None) -> list[JobRow]:
    return _sacct([sacct, "-X", "-a", "-S", since, "-E", until], timeout, env)


# -- one job -------------------------------------------------------------------

def devices(summary: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Flat per-device rows: node, device, figures."""
    out = []
    for node, part in sorted((summary or {}).items()):
        held = set(part.get("held", []))
        for key, d in part.get("dev", {}).items():
            out.append({"node": node, "device": key, "held": key in held or not d.get("leak"), **d})
        for key in sorted(held - set(part.get("dev", {}))):
            out.append({"node": node, "device": key, "held": True, "sm": None, "idle": None})
    return out


def verdicts(devs: Iterable[Mapping[str, Any]]) -> list[str]:
    """Plain-language findings for a job's devices."""
    out = []
    energy = 0
    for d in devs:
        name = f"GPU {d['device'].replace('/gi', ' MIG GI ')} on {d['node']}"
        if d.get("leak"):
            out.append(f"{name}: used by the job but not allocated to it")
            continue
        if d.get("sh"):
            out.append(f"{name}: shared with other jobs; SM, memory and energy are this job's share "
                       f"(by process)")
        if d.get("sm") is None:
            out.append(f"{name}: no utilisation measured")
        elif (d.get("idle") or 0) >= IDLE_VERDICT:
            out.append(f"{name}: idle ({d['idle'] * 100:.0f}% of samples)")
        elif d["sm"] < LOW_VERDICT:
            out.append(f"{name}: low utilisation (mean {d['sm']:.0f}%)")
        if d.get("mt") and not d.get("sh") and d.get("mem") is not None and d["mem"] < HEADROOM_VERDICT * d["mt"] \
                and (d.get("idle") or 0) < IDLE_VERDICT:
            out.append(f"{name}: memory headroom (max {d['mem']} of {d['mt']} MiB)")
        energy += int(d.get("j") or 0)
    if energy:
        out.append(f"energy: {energy / 3.6e6:.3f} kWh ({energy} J)")
    return out


def job_view(row: JobRow | None, jobid: str, live: Mapping[str, Any] | None,
             pending: Mapping[str, Any] | None) -> dict[str, Any]:
    """What ``job report`` shows: stored summary, overlaid with this node's live or unstored part."""
    summary = dict((row.summary if row else None) or {})
    notes = []
    for label, extra in (("unstored", pending), ("live", live)):
        if extra:
            summary.update({k.lower(): v for k, v in extra.items()})
            notes.append(f"{label} figures from this node: {', '.join(sorted(extra))}")
    devs = devices(summary)
    view = {"jobid": jobid, "devices": devs, "verdicts": verdicts(devs), "notes": notes}
    if row:
        view.update(user=row.user, account=row.account, partition=row.partition, nodes=row.nodes,
                    state=row.state, elapsed=row.elapsed, gpus=row.gpus)
        if not summary and row.gpus:
            notes.append("no GPU summary stored for this job")
    return view


def format_job(view: Mapping[str, Any]) -> str:
    lines = [f"job {view['jobid']}  user {view.get('user', '?')}  state {view.get('state', '?')}  "
             f"elapsed {int(view.get('elapsed') or 0)} s  nodes {view.get('nodes', '?')}"]
    lines.append(f"  {'node':<10} {'device':<8} {'SM mean':>8} {'SM max':>7} {'mem MiB':>8} "
                 f"{'idle':>6} {'energy J':>9}  xid")
    for d in view["devices"]:
        def f(v: Any, fmt: str) -> str:
            return format(v, fmt) if v is not None else "-"
        idle = f"{d['idle'] * 100:.0f}%" if d.get("idle") is not None else "-"
        lines.append(f"  {d['node']:<10} {d['device']:<8} {f(d.get('sm'), '.1f'):>8} "
                     f"{f(d.get('smx'), '.0f'):>7} {f(d.get('mem'), 'd'):>8} {idle:>6} "
                     f"{f(d.get('j'), 'd'):>9}  {','.join(map(str, d.get('xid', []))) or '-'}"
                     f"{'  (not allocated)' if d.get('leak') else ''}{'  (shared)' if d.get('sh') else ''}")
    for v in view["verdicts"]:
        lines.append(f"  - {v}")
    for n in view["notes"]:
        lines.append(f"  ({n})")
    return "\n".join(lines)


# -- usage over a period -------------------------------------------------------

@dataclass
class Usage:
    used: float = 0.0          # GPU-seconds × utilisation
    allocated: float = 0.0     # GPU-seconds
    idle: float = 0.0          # GPU-seconds held idle
    jobs: int = 0
    by: dict[str, dict[str, float]] = field(default_factory=dict)


def _overlap(row: JobRow, since: float, until: float) -> float:
    """The share of the job's elapsed time that falls inside [since, until]."""
    if not row.elapsed:
        return 0.0
    start = row.start if row.start is not None else since
    end = row.end if row.end is not None else min(until, start + row.elapsed)
    inside = max(0.0, min(end, until) - max(start, since))
    return min(inside / row.elapsed, 1.0)


def usage(rows: Iterable[JobRow], since: float, until: float, by: str) -> Usage:
    u = Usage()
    for row in rows:
        share = _overlap(row, since, until)
        if share <= 0:
            continue
        held_s = row.elapsed * share
        used = alloc = idle = 0.0
        if row.summary:
            for d in devices(row.summary):
                if d.get("leak"):
                    continue
                fr = float(d.get("fr", 1.0))
                alloc += fr * held_s
                if d.get("sm") is not None:
                    # A MIG instance's SM % is of the instance; a share's (gres/shard,
                    # gres/mps) is its processes' part of the whole GPU.
                    used += (1.0 if d.get("sh") else fr) * held_s * float(d["sm"]) / 100.0
                if d.get("idle") is not None:
                    idle += fr * held_s * float(d["idle"])
        else:
            alloc = row.gpus * held_s
        if not alloc:
            continue
        u.jobs += 1
        u.used += used
        u.allocated += alloc
        u.idle += idle
        key = {"user": row.user, "account": row.account, "partition": row.partition,
               "node": row.nodes}[by] or "?"
        b = u.by.setdefault(key, {"used": 0.0, "allocated": 0.0, "idle": 0.0, "jobs": 0})
        b["used"] += used
        b["allocated"] += alloc
        b["idle"] += idle
        b["jobs"] += 1
    return u


def capacity_gpus(sinfo_gres: str) -> float:
    """Whole GPUs the nodes offer, from ``sinfo -h -N -o "%N %G"`` (a MIG gres counts by its slices)."""
    total = 0.0
    seen = set()
    for line in sinfo_gres.splitlines():
        parts = line.split(None, 1)
        if len(parts) != 2 or parts[0] in seen:
            continue
        seen.add(parts[0])
        for item in re.split(r",(?![^()]*\))", parts[1]):
            item = re.sub(r"\(.*?\)", "", item)
            fields = item.split(":")
            if fields[0] != "gpu" or not fields[-1].isdigit():
                continue
            m = _MIG_TYPE.search(item)
            total += int(fields[-1]) * (int(m.group(1)) / 7 if m else 1.0)
    return total


def usage_view(u: Usage, since: float, until: float, capacity: float, by: str, top: int = 5) -> dict[str, Any]:
    span = max(until - since, 0.0)
    cap_s = capacity * span
    groups = [{by: k, "jobs": int(v["jobs"]), "allocated_gpu_hours": round(v["allocated"] / 3600, 6),
               "used_gpu_hours": round(v["used"] / 3600, 6), "idle_gpu_hours": round(v["idle"] / 3600, 6),
               "efficiency": round(v["used"] / v["allocated"], 4) if v["allocated"] else None}
              for k, v in sorted(u.by.items())]
    idle_top = sorted((g for g in groups if g["idle_gpu_hours"] > 0), key=lambda g: -g["idle_gpu_hours"])[:top]
    return {"since": since, "until": until, "by": by, "jobs": u.jobs, "capacity_gpus": round(capacity, 4),
            "allocated_gpu_hours": round(u.allocated / 3600, 6), "used_gpu_hours": round(u.used / 3600, 6),
            "idle_gpu_hours": round(u.idle / 3600, 6),
            "job_efficiency": round(u.used / u.allocated, 4) if u.allocated else None,
            "cluster_utilisation": round(u.used / cap_s, 4) if cap_s else None,
            "groups": groups, "top_idle": idle_top}


def format_usage(v: Mapping[str, Any]) -> str:
    def pct(x: Any) -> str:
        return f"{x * 100:.1f}%" if x is not None else "-"
    lines = [f"GPU usage {datetime.fromtimestamp(v['since']):%Y-%m-%dT%H:%M:%S} .. "
             f"{datetime.fromtimestamp(v['until']):%Y-%m-%dT%H:%M:%S}  ({v['jobs']} jobs, "
             f"{v['capacity_gpus']:g} GPUs)",
             f"  job efficiency       {pct(v['job_efficiency'])}  (used / allocated GPU-hours)",
             f"  cluster utilisation  {pct(v['cluster_utilisation'])}  (used / offered GPU-hours)",
             f"  allocated {v['allocated_gpu_hours']:.2f} GPU-h, used {v['used_gpu_hours']:.2f} GPU-h, "
             f"held idle {v['idle_gpu_hours']:.2f} GPU-h",
             f"  {v['by']:<16} {'jobs':>5} {'alloc GPU-h':>12} {'used GPU-h':>11} {'idle GPU-h':>11} {'eff':>7}"]
    for g in v["groups"]:
        lines.append(f"  {g[v['by']]:<16} {g['jobs']:>5} {g['allocated_gpu_hours']:>12.2f} "
                     f"{g['used_gpu_hours']:>11.2f} {g['idle_gpu_hours']:>11.2f} {pct(g['efficiency']):>7}")
    if v["top_idle"]:
        lines.append("  top idle holders: " + ", ".join(f"{g[v['by']]} ({g['idle_gpu_hours']:.2f} GPU-h)"
                                                        for g in v["top_idle"]))
    return "\n".join(lines)
