"""Fabric degradation checks over the NVML gather (issue 28 §2): pure functions.

* ``gpu.fabric_registration``: the node is in an NVLink domain where its
  model has one (a non-zero cluster UUID, one clique for all its GPUs), and a
  registration stuck on "insufficient resources" drains instead of passing;
* ``gpu.nvlink_speed``: every active NVLink runs at the speed the model's
  baseline (else the best link of the same model on this node) runs at;
* ``gpu.pcie``: a link trained narrower than expected, or slower while busy.

Expected values come from the baseline (:mod:`.baseline`) when the node's
model has one, so a node whose every GPU degraded alike is still seen.  What
does not apply to this node is one "not applicable" info finding, which never
drains.  Debounce and boot grace are :mod:`.debounce`'s, applied after all
checks ran.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from .findings import DRAIN, INFO, WARN, Finding, not_applicable

if TYPE_CHECKING:
    from ..hw.nvml_health import GpuHealth, NvmlHealth

REASON_GPU_IDLE = 0x1                      # the driver's "GPU idle" clocks-event reason bit
NVML_ERROR_INSUFFICIENT_RESOURCES = 23     # the fabric info's status field: an NVML return code
# The fabric info's health summary (nvml.h, version 3 of the structure):
# 0 not supported, 1 healthy, 2 unhealthy, 3 limited capacity.
_SUMMARY = {2: "unhealthy", 3: "at limited capacity"}
_ZERO_UUID = "00000000-0000-0000-0000-000000000000"
# NVML names of the products whose NVLink domain spans nodes (GB200/GB300
# NVL): their fabric must carry a cluster UUID.  An HGX board's NVSwitch
# fabric registers with a zero UUID, and that is no fault there.
_MULTI_NODE_NAMES = ("GB200", "GB300")


def _gpus(h: NvmlHealth | None) -> list[GpuHealth]:
    return [g for g in (h.gpus if h else []) if g.lost is None]


def _model(baseline: Mapping[str, Any] | None, name: str | None) -> Mapping[str, Any]:
    models = (baseline or {}).get("models") or {}
    m = models.get(name or "")
    return m if isinstance(m, dict) else {}


def _mask(m: int, shift: int) -> int:
    return (m >> shift) & 0x3


def check_fabric_registration(h: NvmlHealth | None, baseline: Mapping[str, Any] | None = None) -> list[Finding]:
    """``gpu.fabric_registration``: in an NVLink domain where the model has one."""
    name = "gpu.fabric_registration"
    gpus = [g for g in _gpus(h) if g.fabric_state not in (None, "not_supported")]
    if not gpus:
        return [not_applicable(name, "no GPU here takes part in an NVLink fabric")] if h and h.available else []
    out: list[Finding] = []
    domains: dict[tuple[str, int], list[str]] = {}
    for g in gpus:
        bus = g.bus_id or str(g.index)
        if g.fabric_status == NVML_ERROR_INSUFFICIENT_RESOURCES and g.fabric_state != "completed":
            # The field's "Insufficient Resources" nodes: stuck before
            # completion, which gpu.fabric only warns about ("in progress").
            out.append(Finding(name, DRAIN, f"NVLink fabric registration of {bus} stuck: insufficient "
                               f"resources (NVML status {NVML_ERROR_INSUFFICIENT_RESOURCES})", g.bus_id))
            continue
        if g.fabric_state != "completed" or g.fabric_status:
            continue                                   # gpu.fabric's finding
        want = _model(baseline, g.name).get("fabric")
        multi = bool(want) if want is not None else any(n in (g.name or "") for n in _MULTI_NODE_NAMES)
        uuid = g.fabric_cluster_uuid or _ZERO_UUID
        if multi and uuid == _ZERO_UUID:
            out.append(Finding(name, DRAIN, f"{bus} is in no NVLink domain: cluster UUID is zero, "
                               "expected non-zero", g.bus_id))
            continue
        if uuid != _ZERO_UUID:
            domains.setdefault((uuid, g.fabric_clique_id or 0), []).append(bus)
        m = g.fabric_health_mask or 0
        if _mask(m, 2) == 1:
            out.append(Finding(name, WARN, f"NVLink fabric route recovery in progress on {bus}", g.bus_id))
        if _mask(m, 6) == 1:
            out.append(Finding(name, WARN, f"NVLink fabric access-timeout recovery on {bus}", g.bus_id))
        summary = _SUMMARY.get(g.fabric_health_summary or 0)
        if summary:
            # Degradation, reported: the summary names no fault. The mask
            # fields that do (route unhealthy, incorrect configuration) drain
            # in gpu.fabric; 214 of 288 GB200 nodes raised false NVLink
            # alarms in the field, so a summary alone never drains.
            out.append(Finding(name, WARN, f"NVLink fabric of {bus} {summary} (NVML fabric health summary)",
                               g.bus_id))
    if len(domains) > 1:
        # The GPUs of one node share one NVLink domain and clique; a GPU in
        # another one has been moved out of the partition (clique lost).
        (main_key, _), *rest = sorted(domains.items(), key=lambda kv: -len(kv[1]))
        for (uuid, clique), buses in rest:
            for bus in buses:
                out.append(Finding(name, DRAIN, f"{bus} is in NVLink clique {clique} of {uuid}, expected clique "
                                   f"{main_key[1]} of {main_key[0]} (as the node's other GPUs)", bus))
    return out


def check_nvlink_speed(h: NvmlHealth | None, baseline: Mapping[str, Any] | None = None) -> list[Finding]:
    """``gpu.nvlink_speed``: each active link at the model's speed, not only up."""
    name = "gpu.nvlink_speed"
    gpus = [g for g in _gpus(h) if g.nvlink_speeds and any(g.nvlink_states or ())]
    if not gpus:
        return [not_applicable(name, "no active NVLink reports its speed")] if h and h.available else []
    best: dict[str | None, int] = {}
    for g in gpus:
        up = [s for s, st in zip(g.nvlink_speeds or (), g.nvlink_states or ()) if st and s]
        best[g.name] = max([best.get(g.name, 0), *(u for u in up if u is not None)])
    out: list[Finding] = []
    for g in gpus:
        want_links = _model(baseline, g.name).get("nvlink_speeds_mbps")
        slow = []
        for i, (speed, link_up) in enumerate(zip(g.nvlink_speeds or (), g.nvlink_states or ())):
            if not link_up or speed is None:
                continue
            want = best.get(g.name, 0)
            if isinstance(want_links, list) and i < len(want_links) and isinstance(want_links[i], int):
                want = want_links[i]
            if speed < want:
                slow.append(f"link {i} at {speed} MB/s, expected {want} MB/s")
        if slow:
            out.append(Finding(name, DRAIN, f"NVLink downtrained on {g.bus_id}: {'; '.join(slow)}", g.bus_id))
    return out


def check_pcie_link(h: NvmlHealth | None, baseline: Mapping[str, Any] | None = None) -> list[Finding]:
    """``gpu.pcie``: a link narrower than expected drains (after its debounce);
    a slower generation drains only while the GPU is busy (idle: info)."""
    out: list[Finding] = []
    for g in _gpus(h):
        base = _model(baseline, g.name)
        if g.pcie_width:
            bw = base.get("pcie_width")
            want = bw if isinstance(bw, int) else g.pcie_width[1]
            if g.pcie_width[0] < want:
                out.append(Finding("gpu.pcie", DRAIN, f"PCIe link of {g.bus_id} is x{g.pcie_width[0]}, "
                                   f"expected x{want}", g.bus_id))
        if g.pcie_gen:
            bg = base.get("pcie_gen")
            want = bg if isinstance(bg, int) else g.pcie_gen[1]
            if g.pcie_gen[0] < want:
                idle = g.clock_reasons is not None and bool(g.clock_reasons & REASON_GPU_IDLE)
                # An idle GPU lowers its link speed to save power: only a busy one is downtrained.
                out.append(Finding("gpu.pcie", INFO if idle else DRAIN, f"PCIe link of {g.bus_id} runs at gen "
                                   f"{g.pcie_gen[0]}, expected gen {want}" + (" (idle)" if idle else " (busy)"),
                                   g.bus_id))
    return out


def baseline_links(h: NvmlHealth | None, baseline: Mapping[str, Any] | None) -> dict[str, int] | None:
    """bus id -> NVLinks the baseline expects up (for ``gpu.nvlink``), or None without one."""
    out: dict[str, int] = {}
    for g in _gpus(h):
        n = _model(baseline, g.name).get("nvlink_up")
        if isinstance(n, int) and g.bus_id:
            out[g.bus_id] = n
    return out or None
