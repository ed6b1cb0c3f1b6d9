"""The fake GPU hardware behind a sandbox's nodes: NVML simulator and MPS control.

On a real GPU node, the prolog, epilog, health check and SPANK plugin talk
to NVML and run ``nvidia-cuda-mps-control``.  A sandbox host has neither, so
``up`` gives every node what a GPU node has, unless the caller configured
``[node] nvml`` itself:

* its own simulator state, ``DIR/var/<node>/sim.json``, made from the
  machine's ``facts.json`` (``[node] nvml = "sim:DIR/var/%n/sim.json"``):
  MIG instances a job creates on n1 are n1's alone, as on separate hosts;
* NVIDIA's real ``nvidia-cuda-mps-control`` as ``[mps] control`` (it runs
  without a GPU; fetched into /var/cache/slurm-gpu/mps by
  ``scripts/fetch-mps.sh``, which ``scripts/install.sh`` runs), copied to
  ``DIR/lib``; when it was never fetched, the stand-in
  (``devkit/slurm_gpu_devkit/sim/mps_control.py``) run by the venv's installed package;
  per-node job directories ``DIR/var/<node>/mps``.

MIG mode (``mig``): ``"per-job"`` (the default) turns MIG mode on, with no
instances, on every MIG-capable GPU that has no recorded instances, as an
admin does for per-job MIG (``nvidia-smi -mig 1``): gres.conf still lists
those GPUs whole and ``--gpu-mig`` jobs carve them.  GPUs recorded with
instances keep them (static MIG, listed as MIG devices in gres.conf).
``"recorded"`` keeps every GPU exactly as recorded.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from slurm_gpu.errors import UsageError
from slurm_gpu.fsutil import atomic_write
from .layout import Layout

MIG_MODES = ("per-job", "recorded")
STATE_NAME = "sim.json"
# The node's simulated kernel ring buffer: what `sandbox fault NAME` writes the
# driver's lines into, as raw /dev/kmsg records (see ..sim.drills).
KERNEL_LOG_NAME = "kernel.log"
# The node's fabric root ([health] fabric_root): its simulated /proc, /sys and
# /etc for the fabric checks (NVSwitches, their daemons, an InfiniBand port).
FABRIC_NAME = "fabric"
CONTROL_NAME = "nvidia-cuda-mps-control"


def available(machine_dir: Path | None) -> bool:
    """True when the machine has NVML facts to simulate (hwloc-only machines do not)."""
    return machine_dir is not None and (machine_dir / "facts.json").is_file()


def caller_configured(extra: Mapping[str, Mapping[str, Any]]) -> bool:
    """True when the caller's slurm-gpu.toml sections already choose NVML."""
    return "nvml" in extra.get("node", {})


def per_job_mig(state: dict[str, Any]) -> int:
    """Turn MIG mode on for MIG-capable GPUs without instances; returns how many."""
    n = 0
    for g in state["facts"]["gpus"]:
        mig = g.get("mig")
        if mig is None or mig.get("instances"):
            continue
        mig["mode"] = mig["pending"] = 1
        n += 1
    return n


def site_packages(venv: Path) -> Path | None:
    """The venv's site-packages holding slurm_gpu (what Slurm's hooks run)."""
    for p in sorted(venv.glob("lib/python3*/site-packages")):
        if (p / "slurm_gpu").is_dir():
            return p
    return None


def prepare(layout: Layout, machine_dir: Path, nodes: Sequence[str], venv: Path,
            mig: str = "per-job") -> dict[str, dict[str, Any]]:
    """Write each node's simulator state and the MPS stand-in; returns the
    ``[node]`` and ``[mps]`` keys for slurm-gpu.toml."""
    from slurm_gpu_devkit import SOURCE_ROOT
    from ..sim import mps_real
    from ..sim.mps_control import write_wrapper
    from ..sim.state import init_state_for_machine

    if mig not in MIG_MODES:
        raise UsageError(f"MIG mode must be one of {', '.join(MIG_MODES)}, not {mig!r}",
                         "--mig-mode")
    for i, name in enumerate(nodes):
        node_dir = layout.var / name
        node_dir.mkdir(mode=0o755, exist_ok=True)
        (node_dir / "mps").mkdir(mode=0o755, exist_ok=True)
        # root's, 0600, as /dev/kmsg is readable by root only here
        klog = node_dir / KERNEL_LOG_NAME
        if not klog.exists():
            atomic_write(klog, "", mode=0o600)
        path = node_dir / STATE_NAME
        if i == 0:
            init_state_for_machine(str(machine_dir), str(path))
            state = json.loads(path.read_text())
            if mig == "per-job":
                per_job_mig(state)
            text = json.dumps(state, indent=1) + "\n"
        # Read by job users' processes (the SPANK plugin in slurmstepd).
        atomic_write(path, text, mode=0o644)
        seed_fabric(node_dir, json.loads(text)["facts"])
    python = venv / "bin" / "python"
    root = site_packages(venv) or SOURCE_ROOT
    # NVIDIA's real control daemon when scripts/fetch-mps.sh has fetched it
    # (scripts/install.sh does): it runs without a GPU.  Else the stand-in.
    if mps_real.install(layout.lib / CONTROL_NAME) is None:
        write_wrapper(layout.lib / CONTROL_NAME, python=str(python), source_root=str(root))
    # A simulated GPU has no driver writing to the host's /dev/kmsg: the
    # health check reads the node's own simulated kernel log (a caller's
    # [health] kernel_log still wins).
    return {"node": {"nvml": f"sim:{layout.var}/%n/{STATE_NAME}"},
            "mps": {"control": str(layout.lib / CONTROL_NAME),
                    "base_dir": f"{layout.var}/%n/mps"},
            "health": {"kernel_log": f"{layout.var}/%n/{KERNEL_LOG_NAME}",
                       "fabric_root": f"{layout.var}/%n/{FABRIC_NAME}",
                       **({"baseline": str(machine_dir / "baseline.json")}
                          if (machine_dir / "baseline.json").is_file() else {})}}


def seed_fabric(node_dir: Path, facts: Mapping[str, Any]) -> None:
    """(Re)write the node's healthy fabric root: what a drill changes, clearing restores."""
    import shutil
    from ..sim.drills import fabric_root_files, write_files
    root = node_dir / FABRIC_NAME
    shutil.rmtree(root, ignore_errors=True)
    write_files(str(root), fabric_root_files(facts))


def _state_path(layout: Layout, node: str) -> Path:
    from slurm_gpu.errors import SlurmGpuError
    if not node or "/" in node or node.startswith("."):
        raise UsageError(f"bad node name {node!r}", "--node")
    path = layout.var / node / STATE_NAME
    if not path.is_file():
        raise SlurmGpuError(f"node {node} has no NVML simulator (a sandbox started with --sim?)",
                            str(path))
    return path


def set_fault(layout: Layout, node: str, overlay: Mapping[str, Any]) -> None:
    """Put a fault overlay ({} clears, the fabric root too) into *node*'s simulator state."""
    from ..sim import open_sim, set_overlay
    path = _state_path(layout, node)
    set_overlay(open_sim(str(path)), overlay)
    if not overlay:
        seed_fabric(layout.var / node, json.loads(path.read_text())["facts"])


def drill(layout: Layout, node: str, name: str, gpu: int = 0) -> tuple[str, str]:
    """Inject the named fault drill on *node*'s GPU *gpu*: the NVML overlay
    into its simulator, the kernel lines into its simulated kernel log.
    Returns (the GPU's bus id, the drain reason the drill documents)."""
    from ..sim import drills
    d = drills.get(name)
    path = _state_path(layout, node)
    facts = json.loads(path.read_text())["facts"]
    bus = drills.gpu_bus(facts, gpu)
    why = d.applies(facts, gpu)
    if why:
        raise UsageError(f"fault {name} does not apply to {node} GPU {gpu}: it {why}", "sandbox fault")
    set_fault(layout, node, d.overlay_for(bus))
    drills.write_files(str(layout.var / node / FABRIC_NAME), d.files())
    drills.append_kernel(str(layout.var / node / KERNEL_LOG_NAME), d.kernel_lines(bus))
    return bus, d.reason_for(bus, gpu)
