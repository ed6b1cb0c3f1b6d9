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
    lines += ["# HELP slurm_gpu_health_last_run_seconds Unix time of the last run.",
              "# TYPE slurm_gpu_health_last_run_seconds gauge",
              f'slurm_gpu_health_last_run_seconds{{node="{node}"}} {time.time():.3f}',
              "# HELP slurm_gpu_health_duration_seconds Duration of the last run.",
              "# TYPE slurm_gpu_health_duration_seconds gauge",
              f'slurm_gpu_health_duration_seconds{{node="{node}"}} {rep.elapsed:.6f}']
    return "\n".join(lines) + "\n"


def write_prom(path: str, rep: Any) -> None:
    """Write the metrics atomically: the collector never reads half a file."""
    atomic_write(path, render(rep), mode=0o644)
