#!/opt/slurm-gpu/venv/bin/python
"""Benchmark: discovery, a node's model from live NVML and hwloc (issue 27 section 7).

``slurm-gpu inventory --json`` with ``[node] nvml = "sim:<state>"``: the
whole read a node makes of itself (``hw.live.this_node``), as a fresh
process, through the same adapter code a real node runs (the NVML contract
over the simulator, the real libhwloc through our cffi bindings).  Each
recorded machine of the devkit with NVML facts is one case: its GPUs from
the simulator, its CPU side from its recorded hwloc XML, which libhwloc
loads.  One more case is this host itself: libhwloc discovers this
machine's topology live (sysfs), beside the simulated GPUs of h100-sxm-8x
(whose bus ids this host lacks: the model notes it and goes on).

Every case's output is checked (as many GPUs as the facts, and on a recorded
machine every GPU placed in the topology), then timed: median of N runs,
interleaved with the floors (``hwloc-ls`` over the same XML, ``hwloc-ls`` of
this host, ``python -I -c pass``), so load hits all alike.

    /opt/slurm-gpu/venv/bin/python bench/bench_discovery.py [--runs 7] [--smoke]

Goal (issue 27): < 1 s for every machine (absolute).  Exits 1 when missed.
"""
from __future__ import annotations

import argparse
import json
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
from benchrow import python, row  # noqa: E402

GOAL_S = 1.0
MACHINES = ROOT / "devkit" / "slurm_gpu_devkit" / "machines"
LIVE = "this host (live hwloc) + h100-sxm-8x GPUs"
HWLOC_LS = shutil.which("hwloc-ls") or "/usr/bin/hwloc-ls"


def measure(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one run of *argv* (output discarded, exec'd directly, no shell)."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.execve(argv[0], argv, env)
    _, status = os.waitpid(pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench_discovery: {' '.join(argv)} failed")
    return wall


def cases(tmp: Path) -> dict[str, tuple[list[str], dict[str, str], int, bool]]:
    """name -> (argv, env, GPUs expected, whether every GPU must be in the topology)."""
    from slurm_gpu_devkit.sim.state import init_state_for_machine
    out = {}
    base = dict(os.environ, PYTHONPATH=str(ROOT))    # measure this checkout, not the installed copy
    base.pop("SLURM_GPU_CONFIG", None)
    argv = [python(), "-m", "slurm_gpu", "inventory", "--json"]
    for m in sorted(MACHINES.iterdir()):
        if not (m / "facts.json").exists():
            continue
        state = tmp / f"{m.name}.json"
        init_state_for_machine(str(m), str(state))
        gpus = len(json.loads((m / "facts.json").read_text())["gpus"])
        out[m.name] = (argv, config(tmp, m.name, state, base), gpus, True)
    live = tmp / "live.json"
    st = json.loads((tmp / "h100-sxm-8x.json").read_text())
    st["hwloc_xml"] = None          # no recorded XML: libhwloc discovers this host
    live.write_text(json.dumps(st))
    out[LIVE] = (argv, config(tmp, "live", live, base), len(st["facts"]["gpus"]), False)
    return out


def config(tmp: Path, name: str, state: Path, base: dict[str, str]) -> dict[str, str]:
    toml = tmp / f"{name}.toml"
    toml.write_text(f'[node]\nnvml = "sim:{state}"\n')
    return dict(base, SLURM_GPU_CONFIG=str(toml))


def check(name: str, argv: list[str], env: dict[str, str], gpus: int, placed: bool) -> None:
    """The model is whole: every GPU of the facts, each in the topology on a recorded machine."""
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise SystemExit(f"bench_discovery: {name}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    inv = json.loads(r.stdout)
    if len(inv["gpus"]) != gpus:
        raise SystemExit(f"bench_discovery: {name}: {len(inv['gpus'])} GPUs in the model, {gpus} in the facts")
    lost = [n for n in inv["notes"] if "not found in hwloc" in n]
    if placed and lost:
        raise SystemExit(f"bench_discovery: {name}: {lost[0]}")
    if not any(s.startswith("sim:") for s in inv["sources"]):
        raise SystemExit(f"bench_discovery: {name}: NVML did not come from the simulator: {inv['sources']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    runs = 1 if a.smoke else a.runs
    tmp = Path(tempfile.mkdtemp(prefix="bench-discovery."))
    try:
        todo = cases(tmp)
        env0 = dict(os.environ)
        floors = {"python -I -c pass": [python(), "-I", "-c", "pass"], "hwloc-ls (this host)": [HWLOC_LS]}
        for m in todo:
            if m != LIVE:
                floors[f"hwloc-ls --input {m}"] = [HWLOC_LS, "--input", str(MACHINES / m / "hwloc.xml")]
        for name, (argv, env, gpus, placed) in todo.items():
            check(name, argv, env, gpus, placed)          # also warms the page cache and .pyc files
        times: dict[str, list[float]] = {k: [] for k in [*todo, *floors]}
        for _ in range(runs):
            for name, (argv, env, _, _) in todo.items():
                times[name].append(measure(argv, env))
            for name, argv in floors.items():
                times[name].append(measure(argv, env0))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"bench_discovery: `slurm-gpu inventory --json`, [node] nvml = sim:<state>; median of {runs}")
    for name, (_, _, gpus, _) in todo.items():
        fl = med.get(f"hwloc-ls --input {name}", med["hwloc-ls (this host)"])
        print(f"  {name:44s} {gpus:2d} GPUs  {med[name] * 1000:6.0f} ms   (hwloc-ls alone {fl * 1000:.0f} ms)")
    print(f"  python -I -c pass {med['python -I -c pass'] * 1000:.1f} ms; "
          f"hwloc-ls of this host {med['hwloc-ls (this host)'] * 1000:.1f} ms")
    worst = max(todo, key=lambda k: med[k])
    hw = max(v for k, v in med.items() if k.startswith("hwloc-ls"))
    ok = row(f"discovery: node model from NVML (simulated) + hwloc, {len(todo)} machines",
             f"max {med[worst]:.2f} s ({worst}), min {min(med[k] for k in todo):.2f} s",
             f"hwloc-ls alone <= {hw * 1000:.0f} ms, python -I {med['python -I -c pass'] * 1000:.0f} ms",
             f"<= {GOAL_S:g} s", med[worst] < GOAL_S, a.smoke)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
