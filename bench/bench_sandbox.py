#!/opt/slurm-gpu/venv/bin/python
"""Benchmark: how fast a sandbox comes up and goes down.

Goal (issue 2): a 2-node sandbox is up (every node idle) in about 2 s on this
2-core machine.  Cases are interleaved, so machine load hits all alike:

* ``slurm-gpu sandbox up`` through the CLI (interpreter start included), 1 and
  2 nodes, no hooks, default machine (h100-sxm-8x);
* the Python API, 2 and 3 nodes, and 2 nodes with ``--netns``;
* the CLI with the SPANK plugin and health check (built/installed per sandbox);
* ``sandbox down`` after each.

Medians of N runs each; ratios are against the 1-node CLI start.

    /opt/slurm-gpu/venv/bin/python bench/bench_sandbox.py [-n 7]
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
PY = "/opt/slurm-gpu/venv/bin/python"
GOAL_S = 2.0


def cli_case(nodes: int, *extra: str):
    def run(d: Path) -> tuple[float, float]:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(ROOT)}
        t0 = time.perf_counter()
        subprocess.run([PY, "-m", "slurm_gpu", "sandbox", "up", "--dir", str(d), "--nodes", str(nodes),
                        "--no-prolog", *extra], check=True, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        up = time.perf_counter() - t0
        t0 = time.perf_counter()
        subprocess.run([PY, "-m", "slurm_gpu", "sandbox", "down", "--dir", str(d)], check=True, env=env,
                       stderr=subprocess.DEVNULL)
        return up, time.perf_counter() - t0
    return run


def api_case(nodes: int, **kw):
    def run(d: Path) -> tuple[float, float]:
        from slurm_gpu_devkit.sandbox import Sandbox, SandboxOptions
        t0 = time.perf_counter()
        sb = Sandbox(d, SandboxOptions(nodes=nodes, **kw)).up()
        up = time.perf_counter() - t0
        t0 = time.perf_counter()
        sb.down()
        return up, time.perf_counter() - t0
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=7, help="runs per case (default 7)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench: needs root (starts Slurm's daemons)")
    cases = {
        "CLI up, 1 node, no hooks": cli_case(1, "--no-health", "--no-spank"),
        "CLI up, 2 nodes, no hooks": cli_case(2, "--no-health", "--no-spank"),
        "API up, 2 nodes, no hooks": api_case(2),
        "API up, 3 nodes, no hooks": api_case(3),
        "API up, 2 nodes, --netns": api_case(2, netns=True),
        "CLI up, 2 nodes, spank+health": cli_case(2, "--health", "--spank"),
    }
    base = Path(tempfile.mkdtemp(prefix="bench-sandbox-", dir="/tmp"))
    os.chmod(base, 0o755)
    ups: dict[str, list[float]] = {k: [] for k in cases}
    downs: dict[str, list[float]] = {k: [] for k in cases}
    try:
        for i in range(args.n):
            for name, fn in cases.items():
                d = base / f"{len(ups[name])}-{abs(hash(name)) % 10000}"
                up, down = fn(d)
                ups[name].append(up)
                downs[name].append(down)
                shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    ref = statistics.median(ups["CLI up, 1 node, no hooks"])
    print(f"sandbox start/stop, median of {args.n} runs each (wall, until every node is idle)")
    print(f"{'case':<32} {'up s':>7} {'min':>6} {'max':>6} {'x 1-node':>9} {'down s':>7}")
    for name in cases:
        u = statistics.median(ups[name])
        print(f"{name:<32} {u:7.2f} {min(ups[name]):6.2f} {max(ups[name]):6.2f} {u / ref:9.2f} "
              f"{statistics.median(downs[name]):7.2f}")
    two = statistics.median(ups["CLI up, 2 nodes, no hooks"])
    print(f"goal: 2-node sandbox up in about {GOAL_S:.0f} s: {two:.2f} s "
          f"({'met' if two <= GOAL_S else 'MISSED'})")


if __name__ == "__main__":
    main()
