"""Named fault drills: what a real GPU fault shows a node, both halves at once.

A real fault reaches the health check two ways: the driver's kernel line
(``NVRM: Xid ...``) and NVML's view (an event, a counter, a lost handle).  A
drill writes both into a sandbox node: the kernel line into the node's
simulated kernel log (raw ``/dev/kmsg`` records of facility 0, the one form a
user cannot forge, see ``hw/kmsg.py``), and the NVML half as a fault overlay
on the node's simulator (``docs/snapshots.md``).  Clearing removes the NVML
half; the kernel line stays, as it does on a real node, and has been counted
once by then.

Each drill names the outcome the health check gives it, exactly as
docs/health.md shows it, so a test can hold the product to it.  Texts follow
the driver's own (cited per drill); ``{pci}`` is the driver's short bus id
(``0000:18:00``), ``{bus}`` the full one NVML gives (``0000:18:00.0``).

This module is one registry (``DRILLS``): a new drill (the fabric ones of the
GB200 work) is one entry here, with its test in
tests/unit/devkit/test_sandbox_drills.py.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from slurm_gpu.errors import UsageError

Overlay = Callable[[str], dict[str, Any]]

# nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) as nvml.h
# returns it: field 230, an unsigned int (valueType 1).
_RECOVERY_FIELD = 230


def _recovery(action: int) -> Overlay:
    def make(bus: str) -> dict[str, Any]:
        return {"calls": [{"fn": "nvmlDeviceGetFieldValues", "gpu": bus, "result": [
            {"fieldId": _RECOVERY_FIELD, "scopeId": 0, "timestamp": 0, "latencyUsec": 0, "valueType": 1,
             "nvmlReturn": 0, "value": {"uiVal": action, "ullVal": action}}]}]}
    return make


@dataclass(frozen=True)
class Drill:
    """One named fault: its kernel lines, its NVML overlay, and its documented outcome."""

    name: str
    what: str                               # one line for `sandbox fault --list`
    kernel: tuple[str, ...]                 # message templates ({pci}, {bus})
    overlay: Overlay                        # bus id -> fault overlay
    drains: bool                            # the documented outcome: drain, or not
    reason: str                             # the drain reason ({bus}, {index}: a lost GPU has no bus id),
                                            # less Slurm's " (+N more)"; "" if none
    source: str = ""                        # where the kernel text comes from
    events: tuple[tuple[str, int], ...] = field(default=())   # NVML events (type, data)
    # The fabric drills' other half: files of the node's fabric root
    # ([health] fabric_root: its /proc, /sys, /etc) to write (None: remove).
    files: Callable[[], dict[str, str | None]] = field(default=lambda: {})
    # Runs of the health check that see the fault before it drains (the
    # check's default debounce count); every run before that only warns.
    runs: int = 1
    fabric: bool = False                    # a fabric drill (issue 28): tests/unit/devkit/test_fabric_drills.py
    # What the node's machine must have for this fault to mean anything
    # (facts, GPU index -> why not, or None): see applies().
    needs: Callable[[Mapping[str, Any], int], str | None] = field(default=lambda facts, gpu: None)
    # The warnings a fault that must not drain gives instead, as docs/health.md
    # shows them ("<check>: <message>", {bus}); a test holds the check to them.
    warns: tuple[str, ...] = ()

    def overlay_for(self, bus: str) -> dict[str, Any]:
        out = dict(self.overlay(bus))
        if self.events:
            out["events"] = [{"gpu": bus, "type": t, "data": d} for t, d in self.events]
        out["comment"] = f"sandbox fault {self.name} on {bus}"
        return out

    def reason_for(self, bus: str, index: int) -> str:
        return self.reason.format(bus=bus, index=index)

    def warnings_for(self, bus: str) -> list[str]:
        return [w.format(bus=bus) for w in self.warns]

    def matches(self, reason: str | None, bus: str, index: int) -> bool:
        """True when *reason* (a node's drain reason, or None) is this drill's
        documented outcome.  The " (+N more)" count is left out: it depends
        on which of a fault's sources (its kernel line, NVML's event, a
        counter) a run had read by then."""
        if not self.drains:
            return not reason
        want = self.reason_for(bus, index)
        return reason is not None and (reason == want or (
            reason.startswith(want + " (+") and reason.endswith(" more)") and reason[len(want) + 3:-6].isdigit()))

    def applies(self, facts: Mapping[str, Any], gpu: int) -> str | None:
        """None when this fault fits the machine's GPU *gpu*; else why not (one phrase)."""
        return self.needs(facts, gpu)

    def kernel_lines(self, bus: str) -> list[str]:
        pci = bus.rsplit(".", 1)[0]
        return [k.format(pci=pci, bus=bus) for k in self.kernel]


def _lost(bus: str) -> dict[str, Any]:
    return {"gpus": {bus: {"lost": True}}}


def _none(bus: str) -> dict[str, Any]:
    return {}


def _ecc(count: int, remap: tuple[int, int, int, int] | None = None) -> Overlay:
    def make(bus: str) -> dict[str, Any]:
        calls: list[dict[str, Any]] = [
            # nvmlDeviceGetTotalEccErrors(UNCORRECTED=1, VOLATILE=0)
            {"fn": "nvmlDeviceGetTotalEccErrors", "gpu": bus, "args": [1, 0], "result": count}]
        if remap is not None:
            calls.append({"fn": "nvmlDeviceGetRemappedRows", "gpu": bus, "result": list(remap)})
        return {"calls": calls}
    return make


def _remap(rows: tuple[int, int, int, int]) -> Overlay:
    def make(bus: str) -> dict[str, Any]:
        return {"calls": [{"fn": "nvmlDeviceGetRemappedRows", "gpu": bus, "result": list(rows)}]}
    return make


def _nvlink_down(link: int) -> Overlay:
    def make(bus: str) -> dict[str, Any]:
        return {"calls": [{"fn": "nvmlDeviceGetNvLinkState", "gpu": bus, "args": [link], "result": 0}]}
    return make


# NVML_FI_DEV_NVLINK_GET_SPEED (164) per link, as slurm_gpu.hw.nvml_health
# asks for it: one query of (field, link) pairs.  H100's NVLink4 link runs at
# 26.562 GB/s (`nvidia-smi nvlink -s`); a link trained on half its lanes, at half.
_NVLINK_SPEED = 164
_H100_LINK_MBPS = 26562


def _nvlink_slow(link: int, links: int = 18) -> Overlay:
    def make(bus: str) -> dict[str, Any]:
        result = [{"fieldId": _NVLINK_SPEED, "scopeId": i, "timestamp": 0, "latencyUsec": 0, "valueType": 1,
                   "nvmlReturn": 0, "value": {"uiVal": v, "ullVal": v}}
                  for i in range(links) for v in [_H100_LINK_MBPS // 2 if i == link else _H100_LINK_MBPS]]
        return {"calls": [{"fn": "nvmlDeviceGetFieldValues", "gpu": bus,
                           "args": [[[_NVLINK_SPEED, i] for i in range(links)]], "result": result}]}
    return make


def _clique_lost(bus: str) -> dict[str, Any]:
    # The GPU's fabric info after it left the NVLink partition: registered,
    # but in no cluster (a zero UUID) and clique 0.
    return {"calls": [{"fn": "nvmlDeviceGetGpuFabricInfoV", "gpu": bus,
                       "out": {"clusterUuid": [0] * 16, "cliqueId": 0}}]}


# nvml.h's fabric health mask: 2-bit fields of NOT_SUPPORTED 0 / TRUE 1 /
# FALSE 2 for degraded bandwidth (shift 0), route recovery (2), route
# unhealthy (4) and access-timeout recovery (6), then the 4-bit incorrect
# configuration (shift 8; NONE 1).  A fabric whose bandwidth alone is
# degraded: 0x1a9 (healthy: 0x1aa), and the version-3 summary says LIMITED_CAPACITY (3).
# That pair is what nvidia-smi -q shows as "Bandwidth : Degraded" with
# "Summary : Limited Capacity" (NVIDIA/k8s-test-infra's NVML mock,
# docs/nvml-mock-ctl.md "fabric-health", built against a real GB300 tray's
# nvidia-smi -q, driver 580.173.02, issue 677).
_FABRIC_DEGRADED_BW_MASK = 0x1A9
_FABRIC_SUMMARY_LIMITED_CAPACITY = 3


def _fabric_degraded(bus: str) -> dict[str, Any]:
    return {"calls": [{"fn": "nvmlDeviceGetGpuFabricInfoV", "gpu": bus,
                       "out": {"healthMask": _FABRIC_DEGRADED_BW_MASK,
                               "healthSummary": _FABRIC_SUMMARY_LIMITED_CAPACITY}}]}


def _pcie_width(width: int) -> Overlay:
    def make(bus: str) -> dict[str, Any]:
        return {"calls": [{"fn": "nvmlDeviceGetCurrPcieLinkWidth", "gpu": bus, "result": width}]}
    return make


# The processes and sysfs entries a healthy sandbox node's fabric root holds
# (fabric_root_files); the drills take them away or change them.
FM_PID, IMEX_PID = 4201, 4202
IB_PORT = "sys/class/infiniband/mlx5_0/ports/1"


def _gpu(facts: Mapping[str, Any], gpu: int) -> Mapping[str, Any]:
    return next((g for g in facts.get("gpus") or [] if g.get("index") == gpu), {})


def _links(n: int) -> Callable[[Mapping[str, Any], int], str | None]:
    def need(facts: Mapping[str, Any], gpu: int) -> str | None:
        have = int((_gpu(facts, gpu).get("nvlink") or {}).get("count") or 0)
        return None if have == n else f"needs a GPU with {n} NVLinks (this one has {have})"
    return need


def _multi_node_fabric(facts: Mapping[str, Any], gpu: int) -> str | None:
    uuid = str((_gpu(facts, gpu).get("fabric") or {}).get("cluster_uuid") or "")
    return None if uuid.strip("0-") else "needs a GPU in a multi-node NVLink domain (GB200/GB300)"


def _local_switches(facts: Mapping[str, Any], gpu: int) -> str | None:
    return None if any(p.get("type") == "switch" and p.get("bus_id") for g in facts.get("gpus") or []
                       for p in (g.get("nvlink") or {}).get("peers", [])) else "needs NVSwitches on the node"


def _files(changes: dict[str, str | None]) -> Callable[[], dict[str, str | None]]:
    return lambda: dict(changes)


def fabric_root_files(facts: Mapping[str, Any], node_wide_imex: bool = False) -> dict[str, str]:
    """A healthy node's fabric root for *facts*: up a day, its NVSwitches'
    PCI functions (those with a local bus id) and Fabric Manager, node-wide
    IMEX where asked, and one NDR InfiniBand port, in the kernel's formats
    (its state, phys_state, rate and link_layer lines are a real ConnectX-7
    port's: tests/data/ib/gpud-h100, mlx5_0/1)."""
    # /proc/PID/status's Uid line: real, effective, saved, filesystem (proc(5))
    root_status = "Name:\t{}\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n"
    out = {"proc/uptime": "86400.00 1382400.00\n", "proc/1/comm": "systemd\n",
           "proc/1/status": root_status.format("systemd")}
    switches = sorted({p["bus_id"] for g in facts.get("gpus") or [] for p in (g.get("nvlink") or {}).get("peers", [])
                       if p.get("type") == "switch" and p.get("bus_id")})
    for b in switches:
        out[f"sys/bus/pci/devices/{b}/vendor"] = "0x10de\n"
        out[f"sys/bus/pci/devices/{b}/class"] = "0x068000\n"
    if switches:
        out[f"proc/{FM_PID}/comm"] = "nv-fabricmanager\n"
        out[f"proc/{FM_PID}/status"] = root_status.format("nv-fabricmanager")
    if node_wide_imex:
        out["etc/nvidia-imex/nodes_config.cfg"] = "10.0.0.1\n10.0.0.2\n"
        out[f"proc/{IMEX_PID}/comm"] = "nvidia-imex\n"
        out[f"proc/{IMEX_PID}/status"] = root_status.format("nvidia-imex")
    out.update({f"{IB_PORT}/state": "4: ACTIVE\n", f"{IB_PORT}/phys_state": "5: LinkUp\n",
                f"{IB_PORT}/rate": "400 Gb/sec (4X NDR)\n", f"{IB_PORT}/link_layer": "InfiniBand\n",
                f"{IB_PORT}/counters/link_downed": "0\n", f"{IB_PORT}/counters/symbol_error": "0\n",
                f"{IB_PORT}/counters/port_rcv_errors": "0\n"})
    return out


def write_files(root: str, files: Mapping[str, str | None]) -> None:
    """Write (None: remove) the files under *root*; a path never leaves it."""
    for rel, text in files.items():
        if rel.startswith("/") or ".." in rel.split("/"):
            raise UsageError(f"bad fabric file {rel!r}", "sandbox fault")
        path = os.path.join(root, rel)
        if text is None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


_FABRIC_DOC = "docs/health.md, \"Fabric degradation\"; NVML's nvml.h for the fields"
_XID_DOC = "NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors), tests/data/xid"

DRILLS: dict[str, Drill] = {d.name: d for d in (
    Drill("xid-79", "the GPU falls off the bus: Xid 79, NVML loses the GPU",
          ("NVRM: Xid (PCI:{pci}): 79, pid=4242, name=python3, GPU has fallen off the bus.",),
          _lost, True, "slurm-gpu: gpu.count: GPU {index} lost (NVML_ERROR_GPU_IS_LOST)",
          "shared/realdata/xid A (NVIDIA/open-gpu-kernel-modules issue, dmesg of a real Xid 79)",
          (("xid", 79),)),
    Drill("xid-48", "an uncorrectable double-bit ECC error in the framebuffer: Xid 48, NVML's volatile count",
          ("NVRM: Xid (PCI:{pci}): 48, pid=4242, name=python3, An uncorrectable double bit error (DBE) has "
           "been detected on GPU in the framebuffer at partition 0, subpartition 0.",),
          _ecc(1), True, "slurm-gpu: gpu.ecc: 1 uncorrectable ECC errors on {bus} since the driver loaded",
          _XID_DOC, (("double_bit_ecc", 0), ("xid", 48))),
    Drill("xid-94", "a contained ECC error: Xid 94 kills the faulting process only; the node stays up",
          ("NVRM: Xid (PCI:{pci}): 94, pid=4242, name=python3, Contained: SM (0x1). RST: No, D-RST: No",),
          _none, False, "", _XID_DOC, (("xid", 94),)),
    Drill("ecc-dbe", "uncorrectable ECC errors counted by NVML, with a row remap pending (no kernel line)",
          (), _ecc(2, (0, 1, 1, 0)), True,
          "slurm-gpu: gpu.ecc: 2 uncorrectable ECC errors on {bus} since the driver loaded",
          "", (("double_bit_ecc", 0),)),
    Drill("gpu-lost", "NVML loses the GPU with no Xid line (the driver's multi-line 'fallen off the bus' notice)",
          ("NVRM: The NVIDIA GPU {bus}\n"
           "NVRM: (PCI ID: 10de:2330) installed in this system has\n"
           "NVRM: fallen off the bus and is not responding to commands.",),
          _lost, True, "slurm-gpu: gpu.count: GPU {index} lost (NVML_ERROR_GPU_IS_LOST)",
          "shared/realdata/xid B (NVIDIA/NVSentinel issue 155, driver 570.158.01)"),
    Drill("row-remap-failure", "row remapping failed: the GPU needs replacing (NVML's remapped rows)",
          (), _remap((3, 5, 0, 1)), True,
          "slurm-gpu: gpu.remap: row remapping failed on {bus} (5 uncorrectable, 3 correctable rows remapped): "
          "replace the GPU",
          ""),
    Drill("recovery-reset", "the driver asks for a GPU reset: Xid 154, NVML's recovery action 1",
          ("NVRM: Xid (PCI:{pci}): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",),
          _recovery(1), True, "slurm-gpu: gpu.recovery: driver says {bus} needs a GPU reset",
          _XID_DOC, (("xid", 154),)),
    # The fabric drills (issue 28): NVML overlays and fabric-root files, no kernel line.
    Drill("nvlink-down", "NVLink 3 of an 18-link GPU goes down (NVML's link state)", (), _nvlink_down(3), True,
          "slurm-gpu: gpu.nvlink: NVLink down on {bus}: 17/18 links up (inactive: 3)", _FABRIC_DOC, fabric=True,
          needs=_links(18)),
    Drill("nvlink-downtrained", "NVLink 3 of an H100 trains at half speed: up, but slow (NVML's link speed field)",
          (), _nvlink_slow(3), True, "slurm-gpu: gpu.nvlink_speed: NVLink downtrained on {bus}: link 3 at "
          f"{_H100_LINK_MBPS // 2} MB/s, expected {_H100_LINK_MBPS} MB/s", _FABRIC_DOC, runs=3, fabric=True,
          needs=_links(18)),
    Drill("fabric-clique-lost", "a GB200 GPU leaves its NVLink domain: registered, cluster UUID zero",
          (), _clique_lost, True, "slurm-gpu: gpu.fabric_registration: {bus} is in no NVLink domain: "
          "cluster UUID is zero, expected non-zero", _FABRIC_DOC, fabric=True, needs=_multi_node_fabric),
    Drill("fabric-degraded", "a GB200 GPU's NVLink fabric runs on degraded bandwidth: NVML's health mask and "
          "v3 summary (limited capacity)", (), _fabric_degraded, False, "", _FABRIC_DOC, fabric=True,
          needs=_multi_node_fabric,
          warns=("gpu.fabric: NVLink fabric bandwidth degraded on {bus}",
                 "gpu.fabric_registration: NVLink fabric of {bus} at limited capacity (NVML fabric health summary)")),
    Drill("pcie-downtrained", "the GPU's PCIe link trains at x8 of x16", (), _pcie_width(8), True,
          "slurm-gpu: gpu.pcie: PCIe link of {bus} is x8, expected x16", _FABRIC_DOC, runs=3, fabric=True),
    Drill("fabricmanager-down", "nv-fabricmanager exits on a node with local NVSwitches", (), _none, True,
          "slurm-gpu: svc.fabricmanager: nvidia-fabricmanager is not running on a node with NVSwitches",
          _FABRIC_DOC, files=_files({f"proc/{FM_PID}/comm": None}), fabric=True, needs=_local_switches),
    Drill("imex-down", "nvidia-imex exits on a node of a node-wide IMEX domain", (), _none, True,
          "slurm-gpu: svc.imex: nvidia-imex is not running (node-wide IMEX domain in "
          "/etc/nvidia-imex/nodes_config.cfg)", _FABRIC_DOC,
          files=_files({"etc/nvidia-imex/nodes_config.cfg": "10.0.0.1\n10.0.0.2\n",
                        f"proc/{IMEX_PID}/comm": None}),
          fabric=True),
    Drill("ib-port-down", "InfiniBand port mlx5_0/1 goes DOWN, polling for a peer", (), _none, True,
          "slurm-gpu: ib.port: InfiniBand port mlx5_0/1 is DOWN (Polling), expected ACTIVE", _FABRIC_DOC,
          files=_files({f"{IB_PORT}/state": "1: DOWN\n", f"{IB_PORT}/phys_state": "2: Polling\n"}),
          runs=2, fabric=True),
    Drill("ib-errors-rising", "InfiniBand port mlx5_0/1 counts 500 symbol and 20 receive errors", (), _none, True,
          "slurm-gpu: ib.errors: InfiniBand port mlx5_0/1 errors rising: symbol_error +500, port_rcv_errors +20 "
          "since the last run", _FABRIC_DOC,
          files=_files({f"{IB_PORT}/counters/symbol_error": "500\n",
                        f"{IB_PORT}/counters/port_rcv_errors": "20\n"}), fabric=True),
)}


def get(name: str) -> Drill:
    """The drill called *name*; an unknown name is one line with the list."""
    try:
        return DRILLS[name]
    except KeyError:
        raise UsageError(f"unknown fault {name!r}; known: {', '.join(DRILLS)}", "sandbox fault") from None


def listing() -> str:
    """`sandbox fault --list`: one line a drill, with what it does and what the health check does."""
    width = max(map(len, DRILLS))
    out = []
    for d in DRILLS.values():
        then = "drains" if d.drains else "does not drain"
        out.append(f"{d.name:<{width}}  {d.what}; {then}")
    return "\n".join(out) + "\n"


def kmsg_records(lines: list[str], first_seq: int, usec: int | None = None) -> str:
    """The lines as the kernel's own /dev/kmsg records: facility 0 (kern), level 3 (err).

    A message of several lines is one record whose later lines the kernel
    escapes as ``\\x0a`` (Documentation/ABI/testing/dev-kmsg).
    """
    usec = int(time.monotonic() * 1e6) if usec is None else usec
    return "".join(f"3,{first_seq + i},{usec},-;{m.replace(chr(10), chr(92) + 'x0a')}\n"
                   for i, m in enumerate(lines))


def append_kernel(path: str, lines: list[str]) -> None:
    """Append records to the node's simulated kernel log (root's file, as the ring buffer is)."""
    if not lines:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        seq = os.fstat(fd).st_size  # grows with every record: unique and increasing, as the kernel's
        os.write(fd, kmsg_records(lines, seq).encode())
    finally:
        os.close(fd)


def gpu_bus(facts: Mapping[str, Any], index: int) -> str:
    """The PCI bus id of the node's GPU of NVML index *index* (what nvidia-smi
    numbers; not always Slurm's order, which follows device minors)."""
    from slurm_gpu.hw.busid import normalize_bus_id
    gpus = facts.get("gpus") or []
    for g in gpus:
        if g.get("index") == index:
            return normalize_bus_id(str(g["bus_id"]))   # NVML's 00000000:18:00.0 -> 0000:18:00.0
    raise UsageError(f"--gpu {index}: the node has {len(gpus)} GPU(s)", "sandbox fault")
