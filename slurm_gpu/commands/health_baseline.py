"""``slurm-gpu health baseline record``: write this node's fabric values as its model's baseline."""
from __future__ import annotations

import json

from ..echo import echo
from ..errors import SlurmGpuError, UsageError


def record(out: str | None, snapshot: str | None, overlay: str | None) -> int:
    """Read this (known-good) node once and merge its models' entries into the baseline file."""
    from ..fsutil import atomic_write
    from ..health import baseline
    from ..hw.ib import read_ports
    from ..hw.nvml_health import read_health_bounded
    from .health_run import _node, _opener, _settings
    s = _settings()
    path = out or s.baseline
    if not path:
        raise UsageError("no baseline file: give --out or set [health] baseline", "health baseline record")
    h = read_health_bounded(_opener(snapshot, overlay, s), call_timeout=s.nvml_call_timeout,
                            total_timeout=max(10.0, s.watchdog_seconds), include_nvlink_speed=True)
    if not h.available or h.hung:
        raise SlurmGpuError(f"cannot read the GPUs: {h.error or h.hung}", "health baseline record")
    new = baseline.entry_for(h, read_ports(s.fabric_root.replace("%n", _node())))
    if not new:
        raise SlurmGpuError("no GPU answered: nothing to record", "health baseline record")
    doc = baseline.merged(baseline.load(path), new)
    atomic_write(path, json.dumps(doc, indent=1, sort_keys=True) + "\n", mode=0o644)
    echo(f"slurm-gpu: baseline of {', '.join(sorted(new))} written to {path}")
    return 0
