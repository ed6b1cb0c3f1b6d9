#!/opt/slurm-gpu/venv/bin/python
"""Benchmark: gres.conf and topology.conf for 10,000 and 100,000 nodes, side by side.

Goals (issue 15): render gres.conf, tree and block topology.conf for 10,000
nodes (snapshots of 8-GPU nodes; a fabric of as many nodes) in <= 1.5 s
wall and <= 300 MB peak RSS; for 100,000 nodes in <= 15 s and <= 2 GB.
Floor, in the same process: reading every snapshot file whole (what any
reader of N JSON files pays), with the page cache as warm as for the run.

Setup (not timed): 10,000 snapshot files made from the recorded
``h100-sxm-8x`` snapshot (raw NVML answers + hwloc XML + derived model,
~200 KB each), every node with its own hostname and GPU UUIDs and an
NVLink clique of 18 nodes (NVL72-style); and an ``ibnetdiscover`` dump of a
rail-optimised fabric: 8 HCAs per node, scalable units of 32 nodes with one
leaf per rail, 16 spines per rail.

Timed, in one process, the way ``slurm-gpu gres render --snapshot DIR`` and
``slurm-gpu topology render`` work: load every snapshot (fast path: head +
tail of the file), gres.conf, tree topology.conf from the dump, block
topology.conf from the snapshots.  Side by side, the raw path (full JSON
parse of each snapshot) on a sample, to show what the fast path saves.

    /opt/slurm-gpu/venv/bin/python bench/bench_confgen.py [--nodes 10000,100000] [--keep DIR] [--smoke]

Each size's inputs are built by one process (then synced to disk) and
rendered by another (its own peak RSS); exits 1 when a goal is missed.
100,000 snapshots take about 16 GB of disk while it runs.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from benchrow import python, row  # noqa: E402
from slurm_gpu_devkit.fabricgen import write_rail_fabric  # noqa: E402

SNAPSHOT = ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json"
# nodes -> (seconds, MB): issue 15
GOALS = {10_000: (1.5, 300.0), 100_000: (15.0, 2000.0)}


def goal(n: int) -> tuple[float, float]:
    """The goal for *n* nodes: the issue's, or linear in n from the 10k one."""
    if n in GOALS:
        return GOALS[n]
    s10, mb10 = GOALS[10_000]
    return s10 * n / 10_000, max(100.0, mb10 * n / 10_000)


def make_snapshots(d: Path, n: int) -> list[str]:
    base = json.loads(SNAPSHOT.read_text())
    head = {k: v for k, v in base.items() if k != "node"}
    raw = json.dumps(head)[:-1]  # everything but the closing brace; "node" goes last, as recorded
    node = base["node"]
    names = []
    fabric_uuid = str(uuid.UUID(int=0xC1A5))
    for i in range(1, n + 1):
        name = f"gpu{i:05d}"
        nd = dict(node, hostname=name)
        nd["gpus"] = [dict(g, uuid=f"GPU-{uuid.UUID(int=i * 16 + k)}",
                           fabric={"cluster_uuid": fabric_uuid, "clique_id": (i - 1) // 18,
                                   "state": "completed", "status": 0, "health_mask": 0})
                      for k, g in enumerate(node["gpus"])]
        (d / f"{name}.json").write_text(raw.replace(f'"hostname": "{base["hostname"]}"', f'"hostname": "{name}"', 1)
                                        + ', "node": ' + json.dumps(nd) + "}")
        names.append(name)
    return names


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def read_floor(snaps: Path) -> float:
    """Seconds to open and read every snapshot file whole (the floor)."""
    t0 = time.perf_counter()
    for p in snaps.iterdir():
        with open(p, "rb") as f:
            f.read()
    return time.perf_counter() - t0


def one(args: argparse.Namespace, n: int) -> int:
    """Build the inputs for *n* nodes, time the run beside its floor, print one ROW."""
    work = Path(args.keep) / str(n) if args.keep else Path(tempfile.mkdtemp(prefix="bench-confgen-"))
    work.mkdir(parents=True, exist_ok=True)
    snaps = work / "snapshots"
    try:
        setup(work, n)      # nothing to do when main() built them (or --keep holds them)
        nlines = sum(1 for _ in open(work / "fabric.out"))
        size_mb = sum(p.stat().st_size for p in snaps.iterdir()) / 1e6
        print(f"[{n} nodes] inputs: {n} snapshots ({size_mb:.0f} MB), fabric dump {nlines} lines "
              f"({(work / 'fabric.out').stat().st_size / 1e6:.0f} MB)")
        floor = read_floor(snaps)   # also leaves the page cache as warm as it can be for the run
        rss0 = rss_mb()

        from slurm_gpu.commands.confgen_io import load_nodes
        from slurm_gpu.confgen import block, ibnet, render_gres_conf, topology, tree

        t = {}
        t0 = time.perf_counter()
        nodes, where = load_nodes([str(snaps)], [], None)
        t[f"load {n} snapshots (derived model)"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        gres = render_gres_conf(nodes, inputs=[str(snaps)])
        t["render gres.conf"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        fab = ibnet.parse_file(str(work / "fabric.out"))
        tr = tree.build_tree([fab])
        topo_tree = topology.render_topology(tr, None, inputs=["fabric.out"])
        del fab
        t["topology.conf tree (parse dump + build + render)"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        topo_block = topology.render_topology(None, block.build_blocks(nodes, [18, 36, 72], drop_small=True),
                                              inputs=[str(snaps)])
        t["topology.conf block (from the loaded snapshots)"] = time.perf_counter() - t0
        total = sum(t.values())
        peak = rss_mb()
        for k, v in t.items():
            print(f"  {k:52s} {v:6.3f} s")
        goal_s, goal_mb = goal(n)
        print(f"  total wall {total:.3f} s (goal {goal_s} s); peak RSS {peak:.0f} MB (goal {goal_mb:.0f} MB; "
              f"{rss0:.0f} MB before loading); floor: reading the {n} files {floor:.3f} s "
              f"= {total / floor:.1f}x the floor")
        blocks = sum(1 for x in topo_block.splitlines() if x.startswith("BlockName"))
        leaves = sum(1 for s in tr.switches if s.level == 0)
        print(f"  outputs: gres.conf {len(gres.splitlines())} lines, tree {len(topo_tree.splitlines())} lines "
              f"({leaves} leaves), block {blocks} blocks")
        # Correctness, also in the smoke run: every node is in the outputs.
        if len(nodes) != n or leaves != -(-n // 32) or blocks != n // 18:   # one leaf level per SU
            print(f"bench_confgen: wrong output for {n} nodes: {len(nodes)} nodes, {leaves} leaves, "
                  f"{blocks} blocks")
            return 2
        ok = row(f"gres + tree + block, {n:,} nodes", f"{total:.2f} s, {peak:.0f} MB",
                 f"reading {n:,} files {floor:.2f} s ({total / floor:.1f}x)",
                 f"<= {goal_s:g} s, <= {goal_mb:.0f} MB", total <= goal_s and peak <= goal_mb, args.smoke)

        if args.sample:
            # Side by side: the raw path (full JSON parse, as a generic reader would) vs the fast path.
            from slurm_gpu.hw.snapshot import node_from_file
            from slurm_gpu.hw.snapshot_bulk import SnapshotLoader
            sample = sorted(snaps.iterdir())[:args.sample]
            t0 = time.perf_counter()
            for p in sample:
                node_from_file(str(p))
            full = (time.perf_counter() - t0) / len(sample)
            loader = SnapshotLoader()
            t0 = time.perf_counter()
            for p in sample:
                loader.fast_node(str(p))
            fast = (time.perf_counter() - t0) / len(sample)
            print(f"  per snapshot: full JSON parse {full * 1e3:.2f} ms, head+tail derived model "
                  f"{fast * 1e3:.3f} ms (ratio {full / fast:.1f}x; {n} nodes the full way: {full * n:.1f} s)")
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="10000,100000", help="comma list of cluster sizes")
    ap.add_argument("--sample", type=int, default=300, help="snapshots parsed the raw way, for the ratio")
    ap.add_argument("--keep", metavar="DIR", help="build the inputs here and keep them")
    ap.add_argument("--smoke", action="store_true", help="36 and 360 nodes, no goal judged")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)   # one size, in this process
    ap.add_argument("--setup", type=int, help=argparse.SUPPRESS)  # only build one size's inputs
    args = ap.parse_args()
    if args.setup:
        return setup(Path(args.keep) / str(args.setup), args.setup)
    if args.one:
        return one(args, args.one)
    sizes = [36, 360] if args.smoke else [int(x) for x in args.nodes.split(",")]
    rc = 0
    for n in sizes:
        # The inputs are built by one process and rendered by another, as on
        # a cluster: a render that follows the making of 100,000 snapshots in
        # the same process (its heap grown to ~400 MB and fragmented) is ~1 s
        # slower at 100k than one in a fresh process.  Each size also gets its
        # own peak RSS.
        keep = args.keep or tempfile.mkdtemp(prefix="bench-confgen-")
        try:
            r = subprocess.run([python(), __file__, "--setup", str(n), "--keep", keep])
            if r.returncode == 0:
                argv = [python(), __file__, "--one", str(n), "--keep", keep,
                        "--sample", str(0 if args.smoke else args.sample)]
                r = subprocess.run(argv + (["--smoke"] if args.smoke else []))
            rc = max(rc, r.returncode)
        finally:
            if not args.keep:
                shutil.rmtree(keep, ignore_errors=True)
    return rc


def setup(work: Path, n: int) -> int:
    """Build *n* nodes' snapshots and fabric dump under *work* (unless there), on disk."""
    work.mkdir(parents=True, exist_ok=True)
    snaps = work / "snapshots"
    if not (snaps / f"gpu{n:05d}.json").exists():
        t0 = time.perf_counter()
        snaps.mkdir(exist_ok=True)
        names = make_snapshots(snaps, n)
        nlines = write_rail_fabric(work / "fabric.out", names, generator="bench_confgen.py")
        # on disk before anything is timed: a cluster's snapshots were written
        # long before a render, and GBs of dirty pages flushed during the run
        # would time this VM's writeback instead of our code
        os.sync()
        print(f"[{n} nodes] setup: {n} snapshots, fabric dump {nlines} lines, "
              f"{time.perf_counter() - t0:.1f} s (not timed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
