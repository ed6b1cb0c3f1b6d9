"""Two builds of the SPANK plugin side by side in ONE sandbox: a bound step's cost, paired.

    /opt/slurm-gpu/venv/bin/python bench/bench_spank_pair.py OLD_PLUGIN_SO [--runs 40]

OLD_PLUGIN_SO is another build's outer half (its inner half beside it), e.g.
main's: ``<main's venv>/bin/slurm-gpu spank build -o /tmp/old/slurm_gpu_spank.so``.
One sandbox (this tree's plugin built and installed, mini-2numa) runs, round
by round in a shuffled order, ``srun -N1 true`` and ``srun -N1 --gpus=1 true``
without a plugin and ``srun -N1 --gpus=1 --gpu-numa-bind=prefer true`` with
either plugin: plugstack.conf is switched before each step (srun and
slurmstepd read it at every step), so drift on a shared machine hits every
variant alike.  Prints medians, ratios and in how many rounds this tree's
plugin was the faster one.  Not timed in the test suite.
"""
from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import bench_spank as b  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old_so", help="the other build's slurm_gpu_spank.so")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--user", default="sgtest1")
    a = ap.parse_args()
    base = Path("/tmp/slurm-gpu-bench")
    base.mkdir(exist_ok=True)
    sb = b._sandbox(base, "cmp", "mini-2numa", spank=True, slurm=None)
    try:
        env = dict(sb.env)
        plugstack = sb.layout.plugstack_conf
        new_line = plugstack.read_text()
        new_so = next(t for t in new_line.split() if t.endswith(".so"))
        old_line = new_line.replace(new_so, a.old_so)
        assert old_line != new_line
        prefer = ["srun", "-N1", "--gpus=1", "--gpu-numa-bind=prefer", "true"]
        variants = [
            ("no plugin", "", ["srun", "-N1", "true"]),
            ("no plugin, --gpus=1", "", ["srun", "-N1", "--gpus=1", "true"]),
            ("old plugin, prefer", old_line, prefer),
            ("new plugin, prefer", new_line, prefer),
        ]
        times: dict[str, list[float]] = {n: [] for n, _, _ in variants}
        for n, conf, argv in variants + variants:       # warm-up (the new one writes its table)
            plugstack.write_text(conf)
            b._time(sb, argv, env, a.user)
        pairs = []
        for _ in range(a.runs):
            order = variants[:]
            random.shuffle(order)
            got: dict[str, float] = {}
            for n, conf, argv in order:
                plugstack.write_text(conf)
                got[n] = b._time(sb, argv, env, a.user)
                times[n].append(got[n])
            pairs.append(got["old plugin, prefer"] - got["new plugin, prefer"])
        plugstack.write_text(new_line)
    finally:
        sb.down()
        shutil.rmtree(sb.dir, ignore_errors=True)
    base_ms = statistics.median(times["no plugin"]) * 1000
    gpu_ms = statistics.median(times["no plugin, --gpus=1"]) * 1000
    print(f"medians of {a.runs} shuffled rounds, one sandbox, Slurm {sb.slurm_version}, as {a.user}")
    for n, _, _ in variants:
        med = statistics.median(times[n]) * 1000
        print(f"  {n:24s} {med:7.1f} ms (min {min(times[n]) * 1000:6.1f})  "
              f"{med / base_ms:5.3f}x plain  {med / gpu_ms:5.3f}x plain --gpus=1")
    faster = sum(1 for d in pairs if d > 0)
    print(f"  new faster than old in {faster} of {len(pairs)} rounds; "
          f"median paired difference {statistics.median(pairs) * 1000:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
