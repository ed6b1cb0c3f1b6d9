"""Every health check, in report order: the one place a check registers.

An entry names the check, the gather it reads and the ``[health]`` switch
that enables it.  The engine gathers only what the selected checks read and
runs them from here; ``--only``, ``[health] skip``, the CLI (whether to open
the GPUs at all) and the check table in ``docs/health.md`` (a unit test) read
the same list.

Gathers:

* ``nvml``: one NVML read under a deadline (:class:`~.gpu_checks.GpuGather`);
  the ``gpu.*`` checks over it come from ``GPU_CHECKS`` (``gpu_checks.py``);
* ``kmsg``: the kernel log and the xid-watch events, each from its cursor
  (:class:`KmsgGather`); what these checks find is owed to a later run;
* ``os``: the OS settings under a root path (:class:`OsGather`); the ``os.*``
  checks and their switches come from ``OS_CHECK_TABLE`` (``os_checks.py``);
* ``own``: the check gathers for itself within the time left in the run
  (:class:`OwnGather`): IMEX, DCGM, InfiniBand ports (``ib.py``), the fabric's
  daemons (``services.py``).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from ..hw.plain import Plain
from .findings import WARN, Finding
from .gpu_checks import GPU_CHECKS
from .os_checks import OS_CHECK_TABLE
from .settings import HealthSettings

NVML = "nvml"
KMSG = "kmsg"
OS = "os"
OWN = "own"

# Acting needs time for two scontrol calls; with less left, act next run.
ACT_MIN_SECONDS = 1.5


# Plain values, not dataclasses: every health-check run imports this, and
# making a dataclass costs a few hundred microseconds (``hw/plain.py``).
class KmsgGather(Plain):
    """The kernel log's new lines, the XID events in them and in xid-watch's
    records, the NVLink5 verdicts of earlier runs of this boot, and the GPUs
    this run's NVML read proves dead (``onfatal.nvml_confirms``)."""

    __slots__ = ("lines", "events", "xid_memo", "confirmed")
    _defaults = {"xid_memo": None, "confirmed": None}
    lines: list[Any]
    events: list[Any]
    xid_memo: dict | None
    confirmed: dict | None


class OsGather(Plain):
    __slots__ = ("info", "settings", "gpus_expected")
    info: Any                              # osinfo.OsInfo
    settings: HealthSettings
    gpus_expected: bool


class OwnGather(Plain):
    """What a check that gathers for itself gets: the run's options, its
    deadline (monotonic) and the NVML gather, if one was made."""

    __slots__ = ("opts", "deadline", "health")
    _defaults = {"health": None}
    opts: Any                              # engine.Options
    deadline: float
    health: Any                            # hw.nvml_health.NvmlHealth | None


def _always(s: HealthSettings) -> bool:
    return True


class HealthCheck(Plain):
    __slots__ = ("name", "gather", "check", "enabled")
    _defaults = {"enabled": _always}
    name: str
    gather: str                            # NVML, KMSG, OS or OWN
    check: Callable[[Any], list[Finding]]  # a function of that gather
    enabled: Callable[[HealthSettings], bool]


def _xid(g: KmsgGather) -> list[Finding]:
    # Bytes of the kernel log the reader had to skip (a broken journal export):
    # a warning that names them, never a silent "ok".
    gaps = [Finding("gpu.xid", WARN, ln.doubt) for ln in g.lines if ln.doubt and not ln.text]
    if not g.events:
        return gaps          # a clean run: the XID module stays unloaded (~2 ms)
    from . import xid
    return xid.check_xid(g.events, g.xid_memo, g.confirmed) + gaps


def _sxid(g: KmsgGather) -> list[Finding]:
    if not g.lines:
        return []
    from . import sxid
    return sxid.check_sxid(sxid.parse_lines(g.lines))


def _imex(g: OwnGather) -> list[Finding]:
    from .imex import run_check
    return run_check(max(0.5, min(5.0, g.deadline - time.monotonic() - ACT_MIN_SECONDS - 1.0)),
                     root=g.opts.os_root)


def _ib(g: OwnGather) -> list[Finding]:
    # ib.port reads the ports for ib.errors too (one sysfs walk, one memory update).
    from .ib import CHECK, ERRORS, run_check
    want = {CHECK, ERRORS} & set(g.opts.only or enabled_checks(g.opts.settings))
    return run_check(g.opts, g.health, frozenset(want))


def _ib_read_by_port(g: OwnGather) -> list[Finding]:
    if "ib.port" in (g.opts.only or enabled_checks(g.opts.settings)):
        return []                      # ib.port's run gave these findings
    from .ib import ERRORS, run_check
    return run_check(g.opts, g.health, frozenset({ERRORS}))


def _svc(name: str) -> Callable[[OwnGather], list[Finding]]:
    def check(g: OwnGather) -> list[Finding]:
        from . import services
        return getattr(services, f"check_{name}")(g)
    return check


def _dcgm(g: OwnGather) -> list[Finding]:
    from .recovery import dcgm_findings
    return dcgm_findings(g.opts, max(1, g.opts.settings.dcgm_level), g.deadline, g.health)


def _os(name: str) -> Callable[[OsGather], list[Finding]]:
    check = OS_CHECK_TABLE[name][1]
    return lambda g: check(g.info, g.settings, g.gpus_expected)


REGISTRY: tuple[HealthCheck, ...] = (
    HealthCheck("gpu.xid", KMSG, _xid),
    HealthCheck("gpu.sxid", KMSG, _sxid),      # NVSwitch SXids: the same kernel-log read as gpu.xid
    *(HealthCheck(name, NVML, fn) for name, fn in GPU_CHECKS.items()),
    HealthCheck("gpu.imex", OWN, _imex),       # a no-op unless slurm.conf has SwitchType=switch/nvidia_imex
    *(HealthCheck(name, OS, _os(name), enabled) for name, (enabled, _) in OS_CHECK_TABLE.items()),
    HealthCheck("ib.port", OWN, _ib, lambda s: s.ib_ports),
    HealthCheck("ib.errors", OWN, _ib_read_by_port, lambda s: s.ib_ports),
    HealthCheck("svc.fabricmanager", OWN, _svc("fabricmanager"), lambda s: s.fabric_services),
    HealthCheck("svc.imex", OWN, _svc("imex"), lambda s: s.fabric_services),
    HealthCheck("svc.hostengine", OWN, _svc("hostengine"), lambda s: s.fabric_services),
    HealthCheck("gpu.dcgm", OWN, _dcgm, lambda s: s.dcgm_level > 0),   # opt-in, or --only gpu.dcgm
)
ALL_CHECKS: tuple[str, ...] = tuple(c.name for c in REGISTRY)


def enabled_checks(s: HealthSettings) -> list[str]:
    """Every check its switch enables, minus ``[health] skip``, in report order."""
    return [c.name for c in REGISTRY if c.name not in s.skip and c.enabled(s)]


def of_gather(selected: Iterable[str], gather: str) -> list[HealthCheck]:
    """The selected checks that read ``gather``, in report order."""
    want = set(selected)
    return [c for c in REGISTRY if c.gather == gather and c.name in want]


def needs(selected: Iterable[str], gather: str) -> bool:
    return bool(of_gather(selected, gather))
