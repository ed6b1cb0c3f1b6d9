"""Every row of issue 15's table and issue 27's outcome table, each measured beside its floor in one run.

    /opt/slurm-gpu/venv/bin/python bench/run_all.py [--smoke] [--skip spank,confgen] [--old DIR]

Runs each benchmark (as root: the prolog and SPANK ones start daemons and
Slurm), collects the ``ROW`` lines they print (bench/benchrow.py) and prints
them as one table: path, measured, floor, goal, verdict.  Exits 1 when a
goal is missed or a benchmark fails.  ``--smoke`` runs them small and judges
no timing (the test suite's check that every path works).  ``--old DIR`` (a
checkout of the code before) is handed to the benchmarks that pair it with
this one in the same run (prolog, health).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

BENCHES = {
    "spank": ["bench_spank.py", "--runs", "15"],
    "health": ["bench_health.py", "--runs", "15"],
    "health-fabric": ["bench_health_fabric.py", "--runs", "21"],
    "inventory": ["bench_inventory.py", "-n", "25"],
    "prolog": ["bench_prolog.py", "--runs", "20"],
    "confgen": ["bench_confgen.py", "--nodes", "10000,100000", "--sample", "0"],
    "recovery": ["bench_recovery.py", "--runs", "7"],
    # Issue 27's outcome rows (recovery above is two of them).
    "discovery": ["bench_discovery.py", "--runs", "7"],
    "oversub": ["bench_oversub.py", "--jobs", "40"],
    "util": ["bench_util.py", "--jobs", "14"],
}
# The benchmarks that take --old (issue 25: each row paired old against new).
PAIRED = {"health", "prolog"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--skip", default="", help="comma list of benchmarks to leave out")
    ap.add_argument("--old", default=None, help="a checkout of the code before, measured beside this one")
    a = ap.parse_args()
    skip = {x for x in a.skip.split(",") if x}
    rows, failed = [], []
    sys.path.insert(0, str(HERE.parent))
    from slurm_gpu_devkit.sandbox.hostrun import left_as_found
    # The prolog and SPANK benchmarks run the product's hooks, which keep
    # node-fact entries under /run: the machine keeps none of ours.
    with left_as_found():
        for name, argv in BENCHES.items():
            if name in skip:
                continue
            cmd = [sys.executable, str(HERE / argv[0])] + (["--smoke"] if a.smoke else argv[1:])
            if a.old and name in PAIRED:
                cmd += ["--old", a.old]
            r = subprocess.run(cmd, capture_output=True, text=True)
            sys.stderr.write(r.stdout + r.stderr)
            got = [line.split("\t")[1:] for line in r.stdout.splitlines() if line.startswith("ROW\t")]
            rows += got
            if r.returncode != 0 or not got:
                failed.append(f"{name} (exit {r.returncode})")
    widths = [max(len(x[i]) for x in rows + [["path", "measured", "floor", "goal", ""]])
              for i in range(5)] if rows else []
    print("\t".join(h.ljust(w) for h, w in zip(["path", "measured", "floor", "goal", ""], widths)))
    for x in rows:
        print("\t".join(c.ljust(w) for c, w in zip(x, widths)))
    if failed:
        print("run_all: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
