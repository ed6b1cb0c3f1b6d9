"""The ``os.*`` audit: GPU-node OS tuning.  Warnings only, each one switchable."""
from __future__ import annotations

from typing import Sequence

from .findings import WARN, Finding
from .osinfo import OsInfo
from .settings import HealthSettings

OS_CHECKS = ("os.thp", "os.swappiness", "os.governor", "os.memlock", "os.persistenced")


def enabled_os_checks(s: HealthSettings) -> list[str]:
    flags = {"os.thp": s.os_thp, "os.swappiness": s.os_swappiness, "os.governor": s.os_governor,
             "os.memlock": s.os_memlock, "os.persistenced": s.os_persistenced}
    return [c for c in OS_CHECKS if flags[c]]


def run_os_checks(info: OsInfo, s: HealthSettings, selected: Sequence[str], gpus_expected: bool) -> list[Finding]:
    """Warnings for OS settings that hurt GPU jobs (data in, findings out)."""
    out: list[Finding] = []
    if "os.thp" in selected and info.thp is not None and info.thp != s.os_thp_expected:
        out.append(Finding("os.thp", WARN, f"transparent huge pages '{info.thp}', expected "
                           f"'{s.os_thp_expected}'"))
    if "os.swappiness" in selected and info.swappiness is not None and info.swappiness > s.os_swappiness_max:
        out.append(Finding("os.swappiness", WARN, f"vm.swappiness is {info.swappiness}, expected at most "
                           f"{s.os_swappiness_max}"))
    if "os.governor" in selected and info.governors:
        other = {g: n for g, n in info.governors.items() if g != s.os_governor_expected}
        if other:
            desc = ", ".join(f"{n} CPUs '{g}'" for g, n in sorted(other.items()))
            out.append(Finding("os.governor", WARN, f"CPU frequency governor: {desc}, expected "
                               f"'{s.os_governor_expected}'"))
    if "os.memlock" in selected and info.memlock_soft is not None and info.memlock_soft != -1:
        out.append(Finding("os.memlock", WARN, f"memlock limit is {info.memlock_soft // 1024} KiB, not "
                           "unlimited (GPUDirect RDMA and NCCL pin memory)"))
    if "os.persistenced" in selected and gpus_expected and info.persistenced is False:
        out.append(Finding("os.persistenced", WARN, "nvidia-persistenced is not running"))
    return out
