"""Reading slurm.conf's top-level settings (what doctor and the health check need).

Not a full parser: ``Key=Value`` settings with ``Include``, node and
partition lines skipped.  Keys are lower-case; the last setting wins, as in
Slurm.
"""
from __future__ import annotations

import os
from pathlib import Path

SKIP = ("nodename", "partitionname", "nodeset", "frontendname", "downnodes")


def default_path() -> str:
    from .nodefacts import slurm_conf_path
    return slurm_conf_path(os.environ)


def parse(text: str, base: Path, depth: int = 0) -> dict[str, str]:
    """Top-level settings of slurm.conf text (*base*: its directory, for Include)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.lower().startswith("include ") and depth < 5:
            pattern = line.split(None, 1)[1].strip()
            root = Path("/") if pattern.startswith("/") else base
            for inc in sorted(root.glob(pattern.lstrip("/"))):
                try:
                    out.update(parse(inc.read_text(), inc.parent, depth + 1))
                except OSError:
                    pass
            continue
        key, eq, value = line.partition("=")
        key = key.strip()
        if not eq or not key or " " in key or key.lower() in SKIP:
            continue
        out[key.lower()] = value.strip().split()[0] if value.strip() else ""
    return out


def read(path: str | None = None) -> dict[str, str] | None:
    """Settings of slurm.conf at *path* (default ``$SLURM_CONF``); None when unreadable."""
    p = Path(path or default_path())
    try:
        return parse(p.read_text(), p.parent)
    except OSError:
        return None


def health_check_timeout(conf: dict[str, str] | None) -> float | None:
    """``HealthCheckTimeout`` in seconds (Slurm >= 26.05; before it, slurmd kills at 60 s)."""
    v = (conf or {}).get("healthchecktimeout", "")
    try:
        t = float(v)
    except ValueError:
        return None
    return t if t > 0 else None
