"""Prometheus textfile metrics for the node-exporter textfile collector."""
from __future__ import annotations

import time
from collections import Counter
from typing import Any

from ..fsutil import atomic_write

_STATUS = {"ok": 0, "warn": 1, "drain": 2}


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(rep: Any) -> str:
    """The metrics text for one run (``rep``: a health engine Report)."""
    node = _esc(rep.node)
    status = 3 if rep.broken else _STATUS.get(rep.status, 3)
    lines = [
        "# HELP slurm_gpu_health_status Node health: 0 ok, 1 warn, 2 drain, 3 unknown.",
        "# TYPE slurm_gpu_health_status gauge",
        f'slurm_gpu_health_status{{node="{node}"}} {status}',
        "# HELP slurm_gpu_health_findings Findings of the last run by check and severity.",
        "# TYPE slurm_gpu_health_findings gauge",
    ]
    counts = Counter((f.check, f.severity) for f in rep.findings)
    for (check, sev), n in sorted(counts.items()):
        lines.append(f'slurm_gpu_health_findings{{node="{node}",check="{_esc(check)}",severity="{sev}"}} {n}')
    xids = Counter((f.gpu or "", f.xid, f.severity) for f in rep.findings if f.xid is not None)
    lines += ["# HELP slurm_gpu_health_xid XID codes reported since the previous run, by GPU.",
              "# TYPE slurm_gpu_health_xid gauge"]
    for (gpu, code, sev), n in sorted(xids.items()):
        lines.append(f'slurm_gpu_health_xid{{node="{node}",gpu="{_esc(gpu)}",xid="{code}",severity="{sev}"}} {n}')
    if getattr(rep, "repair", None) is not None:
        lines += _repair_lines(node, rep.repair)
    if getattr(rep, "event_command", None):
        lines += ["# HELP slurm_gpu_health_event_command_total Runs of [health] event_command by result "
                  "(ok, failed, timeout: killed at its bound, skipped: no time left in the run).",
                  "# TYPE slurm_gpu_health_event_command_total counter"]
        for result, n in sorted(rep.event_command.items()):
            lines.append(f'slurm_gpu_health_event_command_total{{node="{node}",result="{_esc(result)}"}} {n}')
    lines += ["# HELP slurm_gpu_health_last_run_seconds Unix time of the last run.",
              "# TYPE slurm_gpu_health_last_run_seconds gauge",
              f'slurm_gpu_health_last_run_seconds{{node="{node}"}} {time.time():.3f}',
              "# HELP slurm_gpu_health_duration_seconds Duration of the last run.",
              "# TYPE slurm_gpu_health_duration_seconds gauge",
              f'slurm_gpu_health_duration_seconds{{node="{node}"}} {rep.elapsed:.6f}']
    return "\n".join(lines) + "\n"


def _repair_lines(node: str, st: Any) -> list[str]:
    """The repair ladder's counters and per-GPU state (health/repair.py)."""
    lines = ["# HELP slurm_gpu_repair_steps_total Repair ladder steps taken, by step and result.",
             "# TYPE slurm_gpu_repair_steps_total counter"]
    for key, n in sorted(st.counters.items()):
        step, _, result = key.partition("/")
        lines.append(f'slurm_gpu_repair_steps_total{{node="{node}",step="{_esc(step)}",result="{_esc(result)}"}} {n}')
    bus_of = {v.get("uuid"): b for b, v in st.gpus.items()}
    lines += ["# HELP slurm_gpu_repair_gpu_failures GPU failures remembered for the RMA count.",
              "# TYPE slurm_gpu_repair_gpu_failures gauge"]
    for key, times in sorted(st.failures.items()):
        gpu = key[4:] if key.startswith("bus:") else bus_of.get(key, "")
        labels = f'node="{node}",gpu="{_esc(gpu)}",uuid="{_esc(key)}"'
        lines.append(f'slurm_gpu_repair_gpu_failures{{{labels}}} {len(times)}')
    lines += ["# HELP slurm_gpu_repair_open Open repairs by GPU and next step.",
              "# TYPE slurm_gpu_repair_open gauge"]
    for key, ep in sorted(st.episodes.items()):
        lines.append(f'slurm_gpu_repair_open{{node="{node}",gpu="{_esc(str(ep.get("bus")))}",'
                     f'step="{_esc(str(ep.get("step")))}"}} 1')
    lines += ["# HELP slurm_gpu_repair_rma GPUs drained for RMA (never resumed automatically).",
              "# TYPE slurm_gpu_repair_rma gauge"]
    for key, r in sorted(st.rma.items()):
        lines.append(f'slurm_gpu_repair_rma{{node="{node}",gpu="{_esc(str(r.get("bus")))}",uuid="{_esc(key)}"}} 1')
    return lines


def write_prom(path: str, rep: Any) -> None:
    """Write the metrics atomically: the collector never reads half a file."""
    atomic_write(path, render(rep), mode=0o644)
