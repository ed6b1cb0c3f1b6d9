"""The ``os.*`` audit: GPU-node OS tuning.  Warnings only, each one switchable."""
from __future__ import annotations

from typing import Callable, Sequence

from .findings import WARN, Finding
from .osinfo import OsInfo
from .settings import HealthSettings


def _thp(info: OsInfo, s: HealthSettings, gpus_expected: bool) -> list[Finding]:
    if info.thp is not None and info.thp != s.os_thp_expected:
        return [Finding("os.thp", WARN, f"transparent huge pages '{info.thp}', expected '{s.os_thp_expected}'")]
    return []


def _swappiness(info: OsInfo, s: HealthSettings, gpus_expected: bool) -> list[Finding]:
    if info.swappiness is not None and info.swappiness > s.os_swappiness_max:
        return [Finding("os.swappiness", WARN, f"vm.swappiness is {info.swappiness}, expected at most "
                        f"{s.os_swappiness_max}")]
    return []


def _governor(info: OsInfo, s: HealthSettings, gpus_expected: bool) -> list[Finding]:
    other = {g: n for g, n in (info.governors or {}).items() if g != s.os_governor_expected}
    if not other:
        return []
    desc = ", ".join(f"{n} CPUs '{g}'" for g, n in sorted(other.items()))
    return [Finding("os.governor", WARN, f"CPU frequency governor: {desc}, expected '{s.os_governor_expected}'")]


def _memlock(info: OsInfo, s: HealthSettings, gpus_expected: bool) -> list[Finding]:
    if info.memlock_soft is not None and info.memlock_soft != -1:
        return [Finding("os.memlock", WARN, f"memlock limit is {info.memlock_soft // 1024} KiB, not "
                        "unlimited (GPUDirect RDMA and NCCL pin memory)")]
    return []


def _persistenced(info: OsInfo, s: HealthSettings, gpus_expected: bool) -> list[Finding]:
    if gpus_expected and info.persistenced is False:
        return [Finding("os.persistenced", WARN, "nvidia-persistenced is not running")]
    return []


# The os.* checks, in report order: the one place an OS check registers, with
# the [health] switch that enables it (OS_CHECKS, --only and the engine read it).
OS_CHECK_TABLE: dict[str, tuple[Callable[[HealthSettings], bool],
                                Callable[[OsInfo, HealthSettings, bool], list[Finding]]]] = {
    "os.thp": (lambda s: s.os_thp, _thp),
    "os.swappiness": (lambda s: s.os_swappiness, _swappiness),
    "os.governor": (lambda s: s.os_governor, _governor),
    "os.memlock": (lambda s: s.os_memlock, _memlock),
    "os.persistenced": (lambda s: s.os_persistenced, _persistenced),
}
OS_CHECKS = tuple(OS_CHECK_TABLE)


def enabled_os_checks(s: HealthSettings) -> list[str]:
    return [c for c, (enabled, _) in OS_CHECK_TABLE.items() if enabled(s)]


def run_os_checks(info: OsInfo, s: HealthSettings, selected: Sequence[str], gpus_expected: bool) -> list[Finding]:
    """Warnings for OS settings that hurt GPU jobs (data in, findings out)."""
    out: list[Finding] = []
    for name, (_, check) in OS_CHECK_TABLE.items():
        if name in selected:
            out.extend(check(info, s, gpus_expected))
    return out
