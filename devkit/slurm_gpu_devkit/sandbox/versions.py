"""Which Slurm a sandbox runs: the host's own, or one from a Debian root.

Debian 12 ships Slurm 22.05 (the host's).  Newer releases come from a
minbase Debian root built once by ``scripts/debian-root.sh SUITE`` and run
chrooted (:mod:`slurm_gpu_devkit.sandbox.chroot`): trixie gives 24.11, sid 26.05.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from slurm_gpu.errors import SlurmGpuError, UsageError

# major.minor -> Debian suite holding it (None: the host's own packages).
SUITES: dict[str, str | None] = {"22.05": None, "24.11": "trixie", "26.05": "sid"}
HOST_SLURMCTLD = "/usr/sbin/slurmctld"


@dataclass(frozen=True)
class SlurmRelease:
    """The Slurm a sandbox runs."""

    version: str               # major.minor, e.g. "24.11"
    suite: str | None          # Debian suite of its root; None for the host's Slurm
    root: Path | None = None   # the Debian root (chrooted releases only)
    full: str = ""             # e.g. "24.11.5", from `slurmctld -V`

    @property
    def chrooted(self) -> bool:
        return self.suite is not None


def parse_version(text: str) -> str | None:
    """``"slurm-wlm 24.11.5"`` (``slurmctld -V``) -> ``"24.11.5"``."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return m.group(0) if m else None


def major_minor(version: str) -> str:
    """``"24.11.5"`` -> ``"24.11"``."""
    parts = version.split(".")
    return ".".join(parts[:2])


@lru_cache(maxsize=None)
def host_version() -> str | None:
    """The host's Slurm as ``22.05.8`` (None when slurmctld is not installed)."""
    from slurm_gpu.runner import run
    if not os.access(HOST_SLURMCTLD, os.X_OK):
        return None
    res = run([HOST_SLURMCTLD, "-V"], timeout=10, check=False)
    return parse_version(res.stdout)


def supported() -> str:
    """The versions a sandbox can run, for messages: ``22.05 (host), 24.11, 26.05``."""
    host = host_version()
    hv = major_minor(host) if host else None
    names = [v + (" (host)" if v == hv else "") for v in SUITES]
    return ", ".join(names)


def resolve(version: str | None) -> SlurmRelease:
    """The release for ``--slurm VERSION`` (None: the host's); UsageError if unsupported.

    Accepts ``24.11`` or ``24.11.5`` (the patch level is whatever the suite has).
    """
    host = host_version()
    if version is None or version in ("", "host"):
        if host is None:
            raise SlurmGpuError("Slurm or munge is not installed (apt-get install slurmctld slurmd "
                                "slurm-client munge)", HOST_SLURMCTLD)
        return SlurmRelease(major_minor(host), None, None, host)
    mm = major_minor(version) if re.fullmatch(r"\d+\.\d+(\.\d+)?", version) else version
    if mm not in SUITES:
        raise UsageError(f"cannot run Slurm {version}: this sandbox runs {supported()}", "--slurm")
    if host is not None and major_minor(host) == mm:
        return SlurmRelease(mm, None, None, host)
    suite = SUITES[mm]
    if suite is None:   # 22.05 asked for on a host that is not Debian 12
        raise UsageError(f"cannot run Slurm {version} here: it comes from the host's packages "
                         f"and this host has {host or 'no Slurm'}", "--slurm")
    return SlurmRelease(mm, suite)


def debian_root_script() -> Path:
    """``scripts/debian-root.sh`` (checkout) or its installed copy."""
    from slurm_gpu.paths import resource_dir
    return resource_dir("scripts") / "debian-root.sh"


def ensure_root(release: SlurmRelease, timeout: float = 1200) -> SlurmRelease:
    """*release* with its Debian root built (first time: minutes) and its version read.

    The root must hold the major.minor asked for: a suite that moved on to a
    newer Slurm is an error naming both, not a silent upgrade.
    """
    from slurm_gpu.runner import run
    if not release.chrooted:
        return release
    try:
        script = debian_root_script()
    except FileNotFoundError:
        raise SlurmGpuError(f"cannot build the Slurm {release.version} root: this slurm-gpu has no "
                            "scripts/debian-root.sh (reinstall it)") from None
    res = run(["/bin/bash", str(script), str(release.suite)], timeout=timeout, check=False)
    if res.returncode != 0:
        lines = (res.stderr.strip() or res.stdout.strip()).splitlines()
        why = lines[-1].removeprefix("slurm-gpu: ") if lines else f"exit status {res.returncode}"
        raise SlurmGpuError(f"no Slurm {release.version} root: {why}", str(script))
    root = Path(res.stdout.strip().splitlines()[-1])
    try:
        full = parse_version((root / ".slurm-version").read_text()) or ""
    except OSError:
        full = ""
    if major_minor(full) != release.version:
        raise SlurmGpuError(f"the {release.suite} root holds Slurm {full or '?'}, not {release.version}; "
                            f"rebuild it (debian-root.sh {release.suite} --rebuild) or update "
                            f"slurm_gpu_devkit.sandbox.versions.SUITES", str(root))
    return SlurmRelease(release.version, release.suite, root, full)
