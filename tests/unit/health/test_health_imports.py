"""What one ``slurm-gpu health`` run loads (issue 15).

Slurm runs the health check on every node every HealthCheckInterval, and a
module the run does not use still costs its import every time: the node model
and the NVML views, click, the XID parser on a clean log, the GPU layer for
``--only gpu.xid``.  The standard library's json, dataclasses, pathlib,
functools and subprocess are allowed (issue 25).  Each run below prints the modules
it loaded; the findings are checked too, so a run that skipped its work
cannot pass.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

SNAP = str(ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json")
XID = "[  12.5] NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=a.out, GPU has fallen off the bus.\n"
_ENTRY = ("import sys; from slurm_gpu.entry import run\n"
          "try:\n    run()\nfinally:\n    print('LOADED', *sorted(sys.modules), file=sys.stderr)")
NEVER = {"click", "slurm_gpu.hw.model", "slurm_gpu.hw.views", "slurm_gpu.cli"}


def _run(tmp_path: Path, log: str, *argv: str) -> tuple[str, set[str]]:
    klog = tmp_path / "kern.log"
    klog.write_text(log)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\n[health]\nkernel_log = "{klog}"\n')
    env = {k: v for k, v in os.environ.items() if k != "SLURM_GPU_DEBUG"}
    env.update(SLURM_GPU_CONFIG=str(cfg), SLURMD_NODENAME="imp1", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", _ENTRY, "health", *argv], capture_output=True, text=True,
                       cwd=str(ROOT), env=env, timeout=120)
    loaded = p.stderr.rsplit("LOADED", 1)[1].split()
    return p.stdout, set(loaded)


def test_a_full_check_over_a_clean_log_loads_no_model_no_click_no_xid_parser(tmp_path: Path) -> None:
    out, loaded = _run(tmp_path, "[  1.0] usb 1-1: new high-speed USB device\n", "--snapshot", SNAP, "--no-drain")
    assert out.startswith("slurm-gpu: health imp1: ") and "gpu.xid" not in out   # os.* depend on this host
    assert "slurm_gpu.hw.nvml_health" in loaded and "slurm_gpu.hw.kmsg" in loaded   # it read NVML and the log
    assert not loaded & (NEVER | {"slurm_gpu.health.xid", "slurm_gpu.health.sxid"})


def test_an_xid_line_loads_the_parser_and_is_found(tmp_path: Path) -> None:
    out, loaded = _run(tmp_path, XID, "--snapshot", SNAP, "--no-drain")
    assert "gpu.xid" in out and "Xid 79 on 0000:18:00.0" in out
    assert "slurm_gpu.health.xid" in loaded
    assert not loaded & NEVER


@pytest.mark.parametrize("log", ["", XID])
def test_only_gpu_xid_loads_no_gpu_layer(tmp_path: Path, log: str) -> None:
    out, loaded = _run(tmp_path, log, "--only", "gpu.xid", "--kernel-log", str(tmp_path / "kern.log"), "--no-drain")
    assert ("Xid 79" in out) == bool(log)
    assert not loaded & (NEVER | {"slurm_gpu.hw.nvml_health", "slurm_gpu.hw.gpus_nvml", "slurm_gpu.hw.nvml_replay"})
