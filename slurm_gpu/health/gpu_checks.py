"""The NVML-based ``gpu.*`` checks: pure functions from gathered data to findings.

Each check takes the :class:`~slurm_gpu.hw.nvml_health.NvmlHealth` gather
(and, for ``gpu.count``, what gres.conf promises) and returns findings.  No
I/O here, so every check runs in unit tests over recorded machines.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from ..hw.plain import Plain
from .findings import DRAIN, INFO, WARN, Finding

if TYPE_CHECKING:   # annotations only: a run without NVML checks (--only gpu.xid) never loads the GPU layer
    from ..hw.nvml_health import GpuHealth, NvmlHealth

# NVML_GPU_RECOVERY_ACTION_* (the driver's recovery action numbers)
RECOVERY_NAMES = {0: "no action", 1: "a GPU reset", 2: "a node reboot", 3: "a P2P drain",
                  4: "a drain and reset", 5: "IMEX domain recovery", 6: "a bus reset", 7: "a system reboot"}

# The driver's clocks-event reason bits (NVML ClocksEventReason*)
REASON_SW_THERMAL = 0x20
REASON_HW_SLOWDOWN = 0x8
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
_REASON_NAMES = ((REASON_HW_SLOWDOWN, "HW slowdown"), (REASON_HW_THERMAL, "HW thermal slowdown"),
                 (REASON_HW_POWER_BRAKE, "HW power brake"), (REASON_SW_THERMAL, "SW thermal slowdown"))


class ExpectedGpus(Plain):     # Plain, not a dataclass: cheap to define on every run (hw/plain.py)
    """What gres.conf promises this node: GPU count and device minors (File=/dev/nvidiaN)."""

    __slots__ = ("count", "minors", "types", "source")
    _defaults = {"minors": (), "types": (), "source": "gres.conf"}
    count: int
    minors: tuple[int, ...]
    types: tuple[str, ...]
    source: str


def _gpus(h: NvmlHealth) -> list[GpuHealth]:
    return [g for g in h.gpus if g.lost is None]


def check_nvml(h: NvmlHealth | None, expected: ExpectedGpus | None) -> list[Finding]:
    """``gpu.nvml``: NVML must answer, promptly, where GPUs are promised."""
    if h is None:
        return []
    if h.hung and h.slow:
        # Slow overall is not a fault we can name (NHC's batch-drain bug): the
        # run is "unknown" and neither drains nor counts as clean.
        return [Finding("gpu.nvml", WARN, f"NVML too slow, GPU checks incomplete: {h.hung}", h.hung_gpu)]
    if h.hung:
        return [Finding("gpu.nvml", DRAIN, f"NVML hung: {h.hung}", h.hung_gpu)]
    if not h.available:
        if expected is not None and expected.count > 0:
            return [Finding("gpu.nvml", DRAIN, f"NVML unavailable ({h.error}) but {expected.source} "
                            f"promises {expected.count} GPUs")]
        return [Finding("gpu.nvml", INFO, f"NVML unavailable ({h.error}); no GPUs promised")]
    return []


def check_count(h: NvmlHealth | None, expected: ExpectedGpus | None) -> list[Finding]:
    """``gpu.count``: GPUs and their identity (device minors) match gres.conf; none lost."""
    if h is None or not h.available or h.hung:
        return []
    out: list[Finding] = []
    for g in h.gpus:
        if g.lost is not None:
            out.append(Finding("gpu.count", DRAIN, f"GPU {g.bus_id or g.index} lost ({g.lost})", g.bus_id))
    if expected is None:
        return out
    seen = _gpus(h)
    lost = len(h.gpus) - len(seen)
    if lost:
        return out  # a lost GPU explains the count and the missing minor: one finding is enough
    if len(seen) < expected.count:
        out.append(Finding("gpu.count", DRAIN, f"{len(seen)} of {expected.count} GPUs in {expected.source} "
                           "answer NVML (missing or fallen off the bus)"))
    elif len(seen) > expected.count:
        out.append(Finding("gpu.count", WARN, f"NVML sees {len(seen)} GPUs, {expected.source} "
                           f"configures {expected.count}"))
    if expected.minors:
        have = {g.minor for g in seen if g.minor is not None}
        missing = sorted(set(expected.minors) - have)
        if missing and len(have) >= 1:
            out.append(Finding("gpu.count", DRAIN, f"/dev/nvidia{','.join(map(str, missing))} in "
                               f"{expected.source} has no GPU behind it (NVML minors: "
                               f"{','.join(map(str, sorted(have))) or 'none'})"))
    return out


def check_remap(h: NvmlHealth | None) -> list[Finding]:
    """``gpu.remap``: row remapping pending (reset needed) or failed (RMA)."""
    out: list[Finding] = []
    for g in _gpus(h) if h else []:
        if g.remapped_rows is None:
            continue
        corr, unc, pending, failure = g.remapped_rows
        if failure:
            out.append(Finding("gpu.remap", DRAIN, f"row remapping failed on {g.bus_id} ({unc} uncorrectable, "
                               f"{corr} correctable rows remapped): replace the GPU", g.bus_id))
        elif pending:
            out.append(Finding("gpu.remap", DRAIN, f"row remapping pending on {g.bus_id}: reset the GPU",
                               g.bus_id))
        elif unc:
            out.append(Finding("gpu.remap", INFO, f"{unc} rows remapped for uncorrectable errors on {g.bus_id}",
                               g.bus_id))
    return out


def check_retired_pages(h: NvmlHealth | None, max_pages: int = 60) -> list[Finding]:
    """``gpu.retired_pages`` (before Ampere): retirement pending, or too many pages retired."""
    out: list[Finding] = []
    for g in _gpus(h) if h else []:
        if g.retired_pages is None:
            continue
        sbe, dbe = g.retired_pages
        if g.retired_pending:
            out.append(Finding("gpu.retired_pages", DRAIN, f"page retirement pending on {g.bus_id}: "
                               "reset the GPU", g.bus_id))
        elif sbe + dbe >= max_pages:
            out.append(Finding("gpu.retired_pages", DRAIN, f"{sbe + dbe} pages retired on {g.bus_id} "
                               f"(limit {max_pages}): replace the GPU", g.bus_id))
        elif sbe + dbe:
            out.append(Finding("gpu.retired_pages", INFO, f"{sbe + dbe} pages retired on {g.bus_id}", g.bus_id))
    return out


def check_ecc(h: NvmlHealth | None) -> list[Finding]:
    """``gpu.ecc``: volatile (since driver load) uncorrectable ECC errors."""
    out: list[Finding] = []
    for g in _gpus(h) if h else []:
        if g.ecc_volatile_uncorrected:
            out.append(Finding("gpu.ecc", DRAIN, f"{g.ecc_volatile_uncorrected} uncorrectable ECC errors on "
                               f"{g.bus_id} since the driver loaded", g.bus_id))
    return out


def check_recovery(h: NvmlHealth | None) -> list[Finding]:
    """``gpu.recovery``: the driver's GPU recovery-action field asks for a reset/reboot/drain."""
    out: list[Finding] = []
    for g in _gpus(h) if h else []:
        if g.recovery_action:
            name = RECOVERY_NAMES.get(g.recovery_action, f"recovery action {g.recovery_action}")
            out.append(Finding("gpu.recovery", DRAIN, f"driver says {g.bus_id} needs {name}", g.bus_id))
    return out


def _mask_field(mask: int, shift: int, width: int) -> int:
    return (mask >> shift) & width


def check_fabric(h: NvmlHealth | None) -> list[Finding]:
    """``gpu.fabric``: NVLink fabric registration done and healthy (NVSwitch / NVL systems)."""
    out: list[Finding] = []
    for g in _gpus(h) if h else []:
        st = g.fabric_state
        if st is None or st == "not_supported":
            continue
        if st in ("not_started", "in_progress"):
            out.append(Finding("gpu.fabric", WARN if st == "in_progress" else DRAIN,
                               f"NVLink fabric registration {st.replace('_', ' ')} on {g.bus_id}", g.bus_id))
            continue
        if g.fabric_status:
            out.append(Finding("gpu.fabric", DRAIN, f"NVLink fabric registration failed on {g.bus_id} "
                               f"(NVML status {g.fabric_status})", g.bus_id))
            continue
        m = g.fabric_health_mask or 0
        if _mask_field(m, 4, 0x3) == 1:
            out.append(Finding("gpu.fabric", DRAIN, f"NVLink fabric route unhealthy on {g.bus_id}", g.bus_id))
        cfg = _mask_field(m, 8, 0xF)
        if cfg > 1:
            out.append(Finding("gpu.fabric", DRAIN, f"NVLink fabric incorrect configuration (code {cfg}) on "
                               f"{g.bus_id}", g.bus_id))
        if _mask_field(m, 0, 0x3) == 1:
            out.append(Finding("gpu.fabric", WARN, f"NVLink fabric bandwidth degraded on {g.bus_id}", g.bus_id))
        # nvml.h: bits 12-13 "partition assigned" (2: FALSE); nothing is defined above them.
        if _mask_field(m, 12, 0x3) == 2:
            out.append(Finding("gpu.fabric", WARN, f"NVLink fabric partition not assigned to {g.bus_id}", g.bus_id))
    return out


def check_nvlink(h: NvmlHealth | None, expected_links: dict[str, int] | None = None) -> list[Finding]:
    """``gpu.nvlink``: as many NVLinks up as the model says (else as its same-model peers have).

    NVML reports a slot for every possible link, and an inactive slot is
    normal where no bridge or switch port is wired (an H100 NVL pair uses
    12 of 18), so "down" means fewer up than the machine's model (a recorded
    snapshot's derived model) or, live, than the best GPU of the same name.
    """
    out: list[Finding] = []
    gpus = [g for g in (_gpus(h) if h else []) if g.nvlink_states]
    best: dict[str | None, int] = {}
    for g in gpus:
        best[g.name] = max(best.get(g.name, 0), sum(1 for s in g.nvlink_states or () if s))
    for g in gpus:
        states = g.nvlink_states or ()
        up = sum(1 for s in states if s)
        want = (expected_links or {}).get(g.bus_id or "", best.get(g.name, 0))
        if up < want:
            down = [str(i) for i, s in enumerate(states) if not s]
            out.append(Finding("gpu.nvlink", DRAIN, f"NVLink down on {g.bus_id}: {up}/{want} links up"
                               + (f" (inactive: {','.join(down)})" if down else ""), g.bus_id))
    return out


def check_thermal(h: NvmlHealth | None) -> list[Finding]:
    """``gpu.thermal``: clocks held down by thermal or hardware slowdown."""
    out: list[Finding] = []
    for g in _gpus(h) if h else []:
        r = g.clock_reasons or 0
        names = [n for bit, n in _REASON_NAMES if r & bit]
        if names:
            out.append(Finding("gpu.thermal", WARN, f"{g.bus_id} clocks reduced: {', '.join(names)}", g.bus_id))
    return out


def check_persistence(h: NvmlHealth | None) -> list[Finding]:
    """``gpu.persistence``: persistence mode off (slow job start, lost state between jobs)."""
    return [Finding("gpu.persistence", WARN, f"persistence mode off on {g.bus_id}", g.bus_id)
            for g in (_gpus(h) if h else []) if g.persistence_mode == 0]


class GpuGather(Plain):
    """What the ``gpu.*`` checks read: one NVML gather and what the node should have."""

    __slots__ = ("health", "expected", "retired_pages_max", "expected_links", "baseline")
    _defaults = {"retired_pages_max": 60, "expected_links": None, "baseline": None}
    health: NvmlHealth | None
    expected: ExpectedGpus | None
    retired_pages_max: int
    expected_links: dict[str, int] | None
    baseline: dict | None                  # health/baseline.py: the model's expected values


def _fabric(fn: str) -> Callable[[GpuGather], list[Finding]]:
    def check(g: GpuGather) -> list[Finding]:
        from . import fabric       # loaded only when a fabric check runs
        return getattr(fabric, fn)(g.health, g.baseline)
    return check


def _nvlink(g: GpuGather) -> list[Finding]:
    links = g.expected_links
    if links is None and g.baseline:
        from .fabric import baseline_links
        links = baseline_links(g.health, g.baseline)
    return check_nvlink(g.health, links)


# The gpu.* checks, in report order: the one place a check over the NVML
# gather registers (NVML_CHECKS, --only, [health] skip and the engine read it).
GPU_CHECKS: dict[str, Callable[[GpuGather], list[Finding]]] = {
    "gpu.nvml": lambda g: check_nvml(g.health, g.expected),
    "gpu.count": lambda g: check_count(g.health, g.expected),
    "gpu.remap": lambda g: check_remap(g.health),
    "gpu.retired_pages": lambda g: check_retired_pages(g.health, g.retired_pages_max),
    "gpu.ecc": lambda g: check_ecc(g.health),
    "gpu.recovery": lambda g: check_recovery(g.health),
    "gpu.fabric": lambda g: check_fabric(g.health),
    "gpu.fabric_registration": _fabric("check_fabric_registration"),
    "gpu.nvlink": _nvlink,
    "gpu.nvlink_speed": _fabric("check_nvlink_speed"),
    "gpu.pcie": _fabric("check_pcie_link"),
    "gpu.thermal": lambda g: check_thermal(g.health),
    "gpu.persistence": lambda g: check_persistence(g.health),
}
NVML_CHECKS = tuple(GPU_CHECKS)


def run_gpu_checks(h: NvmlHealth | None, expected: ExpectedGpus | None, selected: Sequence[str],
                   retired_pages_max: int = 60, expected_links: dict[str, int] | None = None,
                   baseline: dict | None = None) -> list[Finding]:
    """Run the selected ``gpu.*`` NVML checks over one gather."""
    gather = GpuGather(h, expected, retired_pages_max, expected_links, baseline)
    out: list[Finding] = []
    for name in selected:
        fn = GPU_CHECKS.get(name)
        if fn is not None:
            out.extend(fn(gather))
    return out
