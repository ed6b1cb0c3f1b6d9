"""Hooking the project's own Slurm entry points into a sandbox.

Prolog/epilog scripts, the health check and the SPANK plugin are what Slurm
runs on a real GPU node; the sandbox runs the same ones, through small
wrappers under ``DIR/etc`` that supply what slurmd does not (PATH,
SLURM_CONF, SLURM_GPU_CONFIG) and the venv's absolute interpreter.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.fsutil import atomic_write
from .conf import wrapper_script
from .layout import Layout

DEFAULT_VENV = Path(os.environ.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv"))


def scripts(kind: str, directory: Path | None = None) -> list[Path]:
    """The project's ``prolog.d``/``epilog.d`` scripts, in name order.

    *directory*: look there instead of this installation's (a Debian root's venv).
    """
    from slurm_gpu.paths import resource_dir
    try:
        d = directory if directory is not None else resource_dir(kind)
    except FileNotFoundError:
        return []
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")
                  and not p.name.endswith((".md", ".txt", "~")))


def _is_python(script: Path) -> bool:
    if script.suffix == ".py":
        return True
    try:
        with open(script, "rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def install_hook_dir(layout: Layout, kind: str, venv: Path, root: Path | None = None) -> list[Path]:
    """Wrap every script of the project's *kind* (``prolog.d``) into ``DIR/etc/<kind>``.

    With *root* (a Debian root the hooks run chrooted in), the scripts are
    those of the root's venv at *venv*, named by their path inside the root.
    """
    src = scripts(kind, None if root is None else
                  root / str(venv).lstrip("/") / "share" / "slurm-gpu" / kind)
    dst = layout.etc / kind
    dst.mkdir(parents=True, exist_ok=True)
    made = []
    for s in src:
        inside = s if root is None else Path("/") / s.relative_to(root)
        argv: list[str] = [str(venv / "bin" / "python"), str(inside)] if _is_python(s) else [str(inside)]
        out = dst / s.name
        atomic_write(out, wrapper_script(layout, argv, f"{kind}/{s.name}",
                                         python=str(venv / "bin" / "python")), mode=0o755)
        made.append(out)
    return made


def health_available(venv: Path) -> bool:
    """True when the venv's slurm-gpu has the ``health`` command."""
    if not (venv / "bin" / "slurm-gpu").exists():
        return False
    return any(venv.glob("lib/python3*/site-packages/slurm_gpu/commands/health.py"))


def install_health(layout: Layout, venv: Path, args: Sequence[str] = ()) -> Path:
    exe = venv / "bin" / "slurm-gpu"
    if not exe.exists():
        raise SlurmGpuError("cannot install the health check: slurm-gpu is not installed in the venv",
                            str(exe))
    out = layout.etc / "healthcheck"
    atomic_write(out, wrapper_script(layout, [str(exe), "health", "--slurm", *args],
                                     "HealthCheckProgram", python=str(venv / "bin" / "python")),
                 mode=0o755)
    return out


def install_node_service(layout: Layout, venv: Path, command: str) -> Path:
    """``DIR/etc/<command>``: a node service (``xid-watch``) as the package's
    systemd unit runs it, with the sandbox's config; ``--node N`` follows."""
    exe = venv / "bin" / "slurm-gpu"
    out = layout.etc / command
    atomic_write(out, wrapper_script(layout, [str(exe), command], f"node service {command}",
                                     python=str(venv / "bin" / "python")), mode=0o755)
    return out


def spank_available(venv: Path) -> bool:
    return any(venv.glob("lib/python3*/site-packages/slurm_gpu/commands/spank.py"))


def build_spank(layout: Layout, venv: Path, prefix: Sequence[str] = ()) -> Path:
    """Build the SPANK plugin for this node's Slurm with the venv's slurm-gpu.

    *prefix* runs the build elsewhere (``nsenter ...``: inside a Debian root,
    against that Slurm's spank.h and with that root's python).
    """
    from slurm_gpu.runner import run
    out = layout.lib / "slurm_gpu_spank.so"
    exe = venv / "bin" / "slurm-gpu"
    run([*prefix, str(exe), "spank", "build", "-o", str(out)], timeout=300,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"})
    if not out.is_file():
        raise SlurmGpuError("slurm-gpu spank build produced no plugin", str(out))
    return out


def spank_line(so: Path, layout: Layout, args: Mapping[str, str]) -> str:
    parts = ["required", str(so), f"config={layout.config_toml}"]
    parts += [f"{k}={v}" for k, v in args.items()]
    return " ".join(parts)
