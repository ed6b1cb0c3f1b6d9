#!/opt/slurm-gpu/venv/bin/python
"""Benchmark: ``slurm-gpu inventory --snapshot <8-GPU machine> --json``.

Goals (issue 15): <= 40 ms wall including interpreter start (issue 2: <= 60 MB peak RSS).
Measured side by side, interleaved, in one run with two baselines
(``python -c pass`` and ``python -c 'import click'``), so machine load hits
all three alike.  Wall time: median of N runs; peak RSS: ru_maxrss of each
child (wait4), median.

    /opt/slurm-gpu/venv/bin/python bench/bench_inventory.py [-n 25] [--smoke]

Exits 1 when a goal is missed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from benchrow import goal_for, goal_text, python, row  # noqa: E402

PY = python()
SNAPSHOT = ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json"
GOAL_MS, GOAL_MB = 40.0, 60.0
ISSUE_FLOOR_MS = 11.7       # python start beside the goal in issue 15


def measure(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one run of *argv*, output discarded."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child: exec directly, no shell
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.execve(argv[0], argv, env)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench: {' '.join(argv)} failed")
    return wall, usage.ru_maxrss / 1024.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=25, help="runs per command (default 25)")
    ap.add_argument("--smoke", action="store_true", help="one run, no goal judged (test suite)")
    args = ap.parse_args()
    if args.smoke:
        args.n = 1
    env = dict(os.environ, PYTHONPATH=str(ROOT))   # measure this checkout, not the installed copy
    cases = {
        "python -c pass": [PY, "-c", "pass"],
        "python -c 'import click'": [PY, "-c", "import click"],
        "inventory --snapshot --json": [PY, "-m", "slurm_gpu", "inventory", "--snapshot", str(SNAPSHOT), "--json"],
    }
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for argv in cases.values():  # warm the page cache and .pyc files
        measure(argv, env)
    for _ in range(args.n):
        for name, argv in cases.items():
            results[name].append(measure(argv, env))
    print(f"bench_inventory: {args.n} runs each, median wall (ms) and peak RSS (MB); snapshot {SNAPSHOT.name} "
          f"of h100-sxm-8x")
    base = statistics.median(w for w, _ in results["python -c pass"]) * 1000
    for name, runs in results.items():
        wall = statistics.median(w for w, _ in runs) * 1000
        rss = statistics.median(r for _, r in runs)
        print(f"  {name:30s} {wall:7.1f} ms  {rss:6.1f} MB   x{wall / base:4.1f} of python startup")
    inv = results["inventory --snapshot --json"]
    wall = statistics.median(w for w, _ in inv) * 1000
    rss = statistics.median(r for _, r in inv)
    goal = goal_for(GOAL_MS, base, ISSUE_FLOOR_MS)
    ok = row("inventory --snapshot --json", f"{wall:.1f} ms, {rss:.1f} MB ({wall / base:.1f}x)",
             f"python start {base:.1f} ms", goal_text(GOAL_MS, goal), wall <= goal and rss <= GOAL_MB,
             args.smoke)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
