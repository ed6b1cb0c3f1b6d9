"""NVIDIA's real ``nvidia-cuda-mps-control`` for machines without a GPU.

The control daemon runs without a GPU: it starts, answers every control
command and quits exactly as on a GPU node; only ``start_server`` fails
there (the server exits with status 1 at once, see docs/mps-mig.md).  So
the tests, the benchmarks and the sandbox run NVIDIA's own binary, fetched
by ``scripts/fetch-mps.sh`` (Debian non-free, package ``nvidia-cuda-mps``,
through a private sources list: the system's apt setup is never touched)
into a cache, and the Python stand-in (:mod:`.mps_control`) is left for what
needs a GPU: a live MPS server.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

DEFAULT_CACHE = "/var/cache/slurm-gpu/mps"
BINARY = "root/usr/bin/nvidia-cuda-mps-control"


def cached() -> Path | None:
    """The fetched binary, or None when ``scripts/fetch-mps.sh`` has not run."""
    p = Path(os.environ.get("SLURM_GPU_MPS_CACHE") or DEFAULT_CACHE) / BINARY
    return p if os.access(p, os.X_OK) and p.is_file() else None


def fetch(timeout: float = 180, script: str | os.PathLike[str] | None = None
          ) -> tuple[Path | None, str]:
    """The binary, fetching it first when it is not cached: (path, "") or (None, why).

    *script*: the ``fetch-mps.sh`` to run (default: the checkout's, else the
    installed copy under ``<venv>/share/slurm-gpu/scripts``).
    """
    from slurm_gpu import runner
    from slurm_gpu.errors import CommandError
    from slurm_gpu.paths import resource_dir
    have = cached()
    if have:
        return have, ""
    if script is None:
        try:
            script = resource_dir("scripts") / "fetch-mps.sh"
        except FileNotFoundError:
            return None, "no scripts/fetch-mps.sh here"
    script = Path(script)
    if not script.is_file():
        return None, f"no {script}"
    try:
        r = runner.run(["/bin/bash", str(script)], timeout, check=False,
                       env={"PATH": runner.SAFE_PATH, **{k: v for k, v in os.environ.items()
                                                         if k.startswith("SLURM_GPU_MPS_")}})
    except CommandError as e:
        return None, e.what
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["fetch-mps.sh failed"])[-1]
    return cached(), ""


def install(dest: str | os.PathLike[str]) -> Path | None:
    """Copy the cached real binary to *dest* (mode 0755); None when there is none."""
    src = cached()
    if src is None:
        return None
    d = Path(dest)
    tmp = d.with_name(d.name + ".tmp")
    shutil.copyfile(src, tmp)
    tmp.chmod(0o755)
    os.replace(tmp, d)
    return d
