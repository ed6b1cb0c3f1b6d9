#!/opt/slurm-gpu/venv/bin/python
"""Benchmark: fault to DRAIN (issue 27, "recovery in seconds").

A 2-node sandbox on the default machine with the health check installed at
``HealthCheckInterval=300`` (as sites run it) and ``xid-watch`` beside each
slurmd.  Each run injects the ``xid-79`` fault drill on n1 (the kernel line
and NVML's event and lost GPU together) and times until ``scontrol show
node`` reports n1 draining; then the fault is cleared and an admin resume
puts n1 back.  The floor, measured in the same run, is one ``scontrol update
state=drain`` of n2 and its ``scontrol show node`` (the drain write itself).

    /opt/slurm-gpu/venv/bin/python bench/bench_recovery.py [--runs 7] [--smoke]

Goal: the median fault-to-DRAIN <= 2 s (an absolute goal of the issue; the
floor says how much of it Slurm's own round trips take).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from benchrow import row  # noqa: E402

GOAL_S = 2.0


def state(sb, node: str) -> str:
    out = subprocess.run(sb.client_argv(["scontrol", "show", "node", "-o", node])[0], capture_output=True,
                         text=True, env=sb.env, timeout=10).stdout
    for word in out.split():
        if word.startswith("State="):
            return word[6:]
    return ""


def wait(sb, node: str, pred, timeout: float) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if pred(state(sb, node)):
            return time.perf_counter() - t0
        time.sleep(0.02)
    log = sb.layout.log / f"xid-watch-{node}.log"
    tail = log.read_text()[-1500:] if log.exists() else ""
    raise SystemExit(f"bench_recovery: {node} not there after {timeout} s (state {state(sb, node)})\n{tail}")


def scontrol(sb, *args: str) -> None:
    subprocess.run(sb.client_argv(["scontrol", *args])[0], check=True, env=sb.env, timeout=10,
                   stdout=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    runs = 1 if a.smoke else a.runs
    from slurm_gpu_devkit.sandbox import Sandbox, SandboxOptions, nodesim
    from slurm_gpu_devkit.sandbox.layout import Layout
    d = Path(tempfile.mkdtemp(prefix="bench-recovery."))
    os.chmod(d, 0o755)
    sb = Sandbox(d, SandboxOptions(nodes=2, health=True, health_interval=300, simulate=True,
                                   extra_config={"health": {"clean_runs_to_resume": 1}}))
    fault, floor = [], []
    try:
        sb.up()
        layout = Layout.of(d)
        drained = lambda s: "DRAIN" in s  # noqa: E731
        from slurm_gpu.health.watch import _Gap
        last = -_Gap.MIN_GAP
        for _ in range(runs):
            # One fault per node at a time: xid-watch starts at most one triggered
            # run per MIN_GAP, and a fault a few seconds after the last is not the
            # case measured here.
            time.sleep(max(0.0, last + _Gap.MIN_GAP + 0.5 - time.perf_counter()))
            t0 = last = time.perf_counter()
            nodesim.drill(layout, "n1", "xid-79")
            wait(sb, "n1", drained, 30)
            fault.append(time.perf_counter() - t0)
            nodesim.set_fault(layout, "n1", {})
            scontrol(sb, "update", "nodename=n1", "state=resume")
            # Back in full service first: right after a resume slurmctld shows the
            # node NOT_RESPONDING until its next ping, and the check then owes the
            # drain (xid-watch asks again 2 s later): that is Slurm's, not the fault's.
            wait(sb, "n1", lambda s: s == "IDLE", 60)
            t0 = time.perf_counter()
            scontrol(sb, "update", "nodename=n2", "state=drain", "reason=bench floor")
            wait(sb, "n2", drained, 30)
            floor.append(time.perf_counter() - t0)
            scontrol(sb, "update", "nodename=n2", "state=resume")
            wait(sb, "n2", lambda s: s == "IDLE", 60)
    finally:
        sb.down()
        shutil.rmtree(d, ignore_errors=True)
    med, fl = statistics.median(fault), statistics.median(floor)
    print(f"fault to DRAIN: median {med:.2f} s of {runs} (min {min(fault):.2f}, max {max(fault):.2f}); "
          f"floor (scontrol drain + show): {fl * 1000:.0f} ms")
    ok = row("fault (xid-79 drill) to DRAIN, HealthCheckInterval=300", f"{med:.2f} s",
             f"scontrol drain {fl * 1000:.0f} ms", f"<= {GOAL_S:g} s", med <= GOAL_S, a.smoke)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
