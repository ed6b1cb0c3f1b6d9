#!/opt/slurm-gpu/venv/bin/python
"""Measurement: does a topology file make Slurm place multi-node jobs better?

Two sandboxes of 16 nodes (default machine), one with ``topology/tree`` and a
topology.conf of four leaf switches of four nodes (``n[1-4]`` ... in name
order, as racks usually are), one with no topology plugin.  The same random
stream of multi-node batch jobs (2 to 6 nodes, 1 to 4 s, seeded) goes to
each; while they run, ``squeue`` is polled for every job's node list; at the
end ``slurm_gpu.cluster.placement`` (what ``report placement`` runs) scores
both against the same four leaves.

    /opt/slurm-gpu/venv/bin/python bench/bench_placement.py [--jobs 40] [--seed 1] [--smoke]

Prints both figures (share of jobs on the fewest leaves possible, mean
excess leaves a job) and a ROW line.  No goal: the issue asks for the
figures (docs/topology.md keeps them).
"""
from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from benchrow import row  # noqa: E402
from sbjobs import workdir  # noqa: E402

NODES = 16
TOPOLOGY = "".join(f"SwitchName=leaf{i} Nodes=n[{4 * i - 3}-{4 * i}]\n" for i in range(1, 5)) + \
    "SwitchName=spine Switches=leaf[1-4]\n"


def stream(n: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(2, 6), rng.randint(1, 4)) for _ in range(n)]


def run_stream(tree: bool, jobs: list[tuple[int, int]]) -> dict[str, list[str]]:
    from slurm_gpu.confgen import hostlist
    from slurm_gpu_devkit.sandbox import Sandbox, SandboxOptions
    d = workdir("placement")
    extra = {"slurm_conf": {"TopologyPlugin": "topology/tree"}, "etc_files": {"topology.conf": TOPOLOGY}} \
        if tree else {}
    sb = Sandbox(d, SandboxOptions(nodes=NODES, machine="mini-2numa", timeout=120.0, **extra))
    seen: dict[str, list[str]] = {}
    try:
        sb.up()
        env = sb.env
        ids = []
        for k, t in jobs:
            out = subprocess.run(sb.client_argv(["sbatch", "--parsable", "-N", str(k), "-o", "/dev/null",
                                                 "--wrap", f"sleep {t}"])[0],
                                 capture_output=True, text=True, env=env, check=True, timeout=30).stdout
            ids.append(out.strip().split(";")[0])
        deadline = time.monotonic() + 60 + 3 * sum(t for _, t in jobs)
        while time.monotonic() < deadline:
            out = subprocess.run(sb.client_argv(["squeue", "-h", "-o", "%i %T %N"])[0], capture_output=True,
                                 text=True, env=env, timeout=30).stdout
            lines = [line.split() for line in out.splitlines() if line.strip()]
            for w in lines:
                if len(w) == 3 and w[1] == "RUNNING" and w[0] not in seen:
                    seen[w[0]] = hostlist.expand(w[2])
            if not lines:
                break
            time.sleep(0.2)
        missing = [j for j in ids if j not in seen]
        if missing:
            print(f"bench_placement: {len(missing)} job(s) never seen running: {' '.join(missing[:5])}")
    finally:
        sb.down()
        shutil.rmtree(d, ignore_errors=True)
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    from slurm_gpu.cluster import placement
    from slurm_gpu.confgen import topocheck
    jobs = stream(6 if a.smoke else a.jobs, a.seed)
    kind, doms = placement.domains(topocheck.parse_conf(TOPOLOGY.splitlines(True), "topology.conf"))
    figures = {}
    for tree in (True, False):
        seen = run_stream(tree, jobs)
        s = placement.summarize(kind, doms, sorted(seen.items(), key=lambda kv: int(kv[0])))
        figures[tree] = s
        print(f"{'tree' if tree else 'none'}: {len(s.jobs)} jobs seen running of {len(jobs)}; "
              f"on the fewest leaves {100 * (s.at_minimum_share or 0):.1f}%, "
              f"mean excess {s.mean_excess or 0:.2f} leaves a job")
    t, n = figures[True], figures[False]
    row("placement, 16 nodes/4 leaves, same stream: at minimum (tree vs none)",
        f"{100 * (t.at_minimum_share or 0):.0f}% vs {100 * (n.at_minimum_share or 0):.0f}%",
        f"excess {t.mean_excess or 0:.2f} vs {n.mean_excess or 0:.2f}", "(figures only)", True, a.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
