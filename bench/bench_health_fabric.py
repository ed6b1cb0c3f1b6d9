#!/opt/slurm-gpu/venv/bin/python
"""Benchmark the fabric checks' cost (issue 28 §2 "Speed"): ``slurm-gpu health``
with every check of this tree against the same command of a base tree (by
default ``main``, or ``--base REV``), on the same 8-GPU snapshot (h100-sxm-8x),
paired: the two run alternately, and the ratio of their medians is the figure
(absolute times moved 2x from one day to the next on one machine).  Goal:
<= 1.10x.  The base tree is ``git archive REV slurm_gpu`` in a temporary
directory, run with the same interpreter and config.

Run:  /opt/slurm-gpu/venv/bin/python bench/bench_health_fabric.py [--runs N] [--base REV] [--smoke]
Exits 1 when the goal is missed.
"""
from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_health import SNAP, measure  # noqa: E402
from benchrow import python, row  # noqa: E402

PY = python()
GOAL = 1.10


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--base", default="main", help="the tree to compare with (a git revision)")
    ap.add_argument("--smoke", action="store_true", help="2 pairs, no goal judged")
    a = ap.parse_args()
    if a.smoke:
        a.runs = 2
    with tempfile.TemporaryDirectory(prefix="bench-fabric-") as td:
        tdp = Path(td)
        base = tdp / "base"
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", a.base, "slurm_gpu"], check=True,
                              capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
            tf.extractall(base, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        klog = tdp / "kern.log"
        klog.write_text("")
        cfg = tdp / "slurm-gpu.toml"
        cfg.write_text(f'[node]\nstate_dir = "{tdp}/state"\n[health]\nkernel_log = "{klog}"\n')
        env = {"PATH": "/usr/bin:/bin", "SLURM_GPU_CONFIG": str(cfg), "SLURMD_NODENAME": "bench1"}
        argv = [PY, "-m", "slurm_gpu", "health", "--snapshot", str(SNAP), "--no-drain"]
        import bench_health
        pairs = []
        for _ in range(a.runs):
            bench_health.ROOT = base            # measure() runs in ROOT: python -m finds that tree's slurm_gpu
            old, _, _ = measure(argv, env, 1)
            bench_health.ROOT = ROOT
            new, _, _ = measure(argv, env, 1)
            pairs.append((old, new))
        old_med = statistics.median(o for o, _ in pairs)
        new_med = statistics.median(n for _, n in pairs)
        ratio = statistics.median(n / o for o, n in pairs)
        print(f"# slurm-gpu health --snapshot h100-sxm-8x --no-drain, {a.runs} pairs, alternating")
        print(f"{'base tree (' + a.base + ')':40s} {old_med:7.1f} ms")
        print(f"{'this tree (every fabric check)':40s} {new_med:7.1f} ms")
        print(f"ratio (median of per-pair ratios): {ratio:.3f}x; goal <= {GOAL:.2f}x: "
              f"{'met' if ratio <= GOAL else 'NOT met'}")
        return 0 if row("health with the fabric checks, paired with " + a.base,
                        f"{new_med:.1f} ms ({ratio:.2f}x)", f"{a.base} {old_med:.1f} ms",
                        f"<= {GOAL:.2f}x", ratio <= GOAL, a.smoke) else 1


if __name__ == "__main__":
    sys.exit(main())
