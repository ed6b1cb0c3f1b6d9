"""Per-job GPU accounting: sampler cost, epilog summary step, job report (side by side).

    /opt/slurm-gpu/venv/bin/python bench/bench_acct.py [--ticks 60] [--runs 15]

1. the sampler (``slurm-gpu monitor``'s tick) on an 8-GPU node (h100-sxm-8x
   in the simulator, 8 jobs each holding a GPU with a process on it): CPU
   seconds per tick, as a share of one core at the default 10 s interval
   (goal <= 0.5 %), and the RSS of a process that ran the ticks, next to a
   bare interpreter's (goal <= 30 MB);
2. the epilog's summary step (aggregates of 8 devices -> summary -> pending
   record, records removed), in-process (goal <= 50 ms);
3. ``slurm-gpu job report ID --json``, a whole CLI run with ``sacct``
   answering from a recorded line (no slurmdbd here), next to a bare
   interpreter start and to the stub sacct alone (goal <= 300 ms).

The simulator is Python, so the sampler's NVML calls cost more here than the
driver's C calls on a real node: the figure is an upper bound.  Exit status
1 when a goal is missed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MACHINE = ROOT / "tests" / "data" / "machines" / "h100-sxm-8x"

SAMPLER_CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
base, ticks = sys.argv[2], int(sys.argv[3])
from slurm_gpu.acct.monitor import Monitor
from slurm_gpu.acct.settings import AcctSettings
from slurm_gpu.acct.store import Store
from slurm_gpu.hw import backend
s = AcctSettings(enabled=True, dir=base + "/acct", proc_root=base + "/proc", metrics_file=base + "/gpu.prom",
                 dcgm_mapping_dir=base + "/map")
gpus = backend.open_gpus(backend.GpuSource("sim", base + "/sim.json"))
store = Store(s.dir)
for j in range(8):
    store.write("jobs", str(100 + j), {"jobid": str(100 + j), "devices": [str(j)], "start": time.time()})
mon = Monitor(s, store, gpus.stats_reader(), "n1", lambda: {str(100 + j) for j in range(8)},
              log=lambda m: None)
mon.start()
mon.tick()                       # warm: imports, first reads
t = time.process_time()
for _ in range(ticks):
    mon.tick()
cpu = (time.process_time() - t) / ticks
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"cpu_per_tick": cpu, "maxrss_kb": hwm}))
"""


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def setup_node(base: Path) -> None:
    from slurm_gpu_devkit.sim.load import LOAD_SCHEMA, write_load
    from slurm_gpu_devkit.sim.state import init_state_for_machine
    init_state_for_machine(str(MACHINE), str(base / "sim.json"))
    st = json.loads((base / "sim.json").read_text())
    st["load_file"] = str(base / "load.json")
    (base / "sim.json").write_text(json.dumps(st))
    devices = {}
    for j in range(8):
        pid = 4000 + j
        (base / "proc" / str(pid)).mkdir(parents=True, exist_ok=True)
        (base / "proc" / str(pid) / "cgroup").write_text(f"0::/slurm/uid_1000/job_{100 + j}/step_0\n")
        devices[str(j)] = [{"t": 0, "sm": 10 * j, "mem_mib": 1000, "power_w": 300,
                            "pids": [{"pid": pid, "mem_mib": 1000}]}]
    write_load(str(base / "load.json"), {"schema": LOAD_SCHEMA, "t0": time.time() - 5, "devices": devices})


def bench_sampler(base: Path, python: str, ticks: int) -> dict:
    out = subprocess.run([python, "-I", "-c", SAMPLER_CHILD, str(ROOT), str(base), str(ticks)],
                         capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec (the parent's would show).
    bare = subprocess.run([python, "-I", "-c", "print(next(int(l.split()[1]) for l in open('/proc/self/status') "
                           "if l.startswith('VmHWM:')))"], capture_output=True, text=True, check=True)
    res["bare_rss_kb"] = int(bare.stdout)
    return res


def bench_cli_rss(base: Path, python: str) -> int:
    """VmHWM (kB) of the real ``slurm-gpu monitor`` CLI (click, config, node model) after a few ticks."""
    conf = base / "monitor.toml"
    conf.write_text(f'[node]\nstate_dir = "{base}/var"\nnvml = "sim:{base}/sim.json"\n'
                    f'[acct]\nenabled = true\nproc_root = "{base}/proc"\n')
    env = {"PATH": "/usr/bin:/bin", "SLURM_GPU_CONFIG": str(conf), "SLURMD_NODENAME": "n1",
           "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([python, "-m", "slurm_gpu", "monitor", "--interval", "0.1", "--ticks", "40"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    hwm = 0
    while p.poll() is None:
        try:
            hwm = next(int(l.split()[1]) for l in open(f"/proc/{p.pid}/status") if l.startswith("VmHWM:"))
        except (OSError, StopIteration):
            pass
        time.sleep(0.1)
    return hwm


def bench_summary(base: Path, runs: int) -> list[float]:
    from slurm_gpu.acct import aggregate, hooks
    from slurm_gpu.acct.settings import AcctSettings
    from slurm_gpu.acct.store import Store
    s = AcctSettings(enabled=True, dir=str(base / "acct-summary"))
    store = Store(s.dir)
    times = []
    for r in range(runs):
        jobid = str(5000 + r)
        devs = {}
        for g in range(8):
            d = aggregate.new_device(True)
            for t in range(360):
                aggregate.add_sample(d, float(t * 10), sm=float(t % 100), mem=1 << 30, energy_mj=t * 1000,
                                     idle_threshold=1.0)
            devs[str(g)] = d
        store.write("jobs", jobid, {"jobid": jobid, "devices": [str(g) for g in range(8)]})
        store.write("agg", jobid, {"jobid": jobid, "devices": devs})
        t0 = time.perf_counter()
        hooks.finish(s, store, jobid, "n1", store_dbd=False)
        times.append(time.perf_counter() - t0)
        store.remove("pending", jobid)
    return times


def bench_report(base: Path, python: str, runs: int) -> dict:
    from slurm_gpu.acct import dbd
    part = {"v": 1, "iv": 10.0, "held": [str(g) for g in range(8)],
            "dev": {str(g): {"sm": 50.0, "smx": 99.0, "mem": 1024, "mt": 81559, "idle": 0.1, "j": 3600000,
                             "n": 360, "s": 3600} for g in range(8)}}
    # sacct prints the fields joined by --delimiter (the report asks for a random one).
    line = "@@D@@".join(["77", "sgtest1", "acct", "debug", "n1", "COMPLETED", "2026-01-01T00:00:00",
                     "2026-01-01T01:00:00", "3600", "billing=8,cpu=8,gres/gpu=8,node=1",
                     dbd.merged("", "n1", part) or ""])
    (base / "sacct.out").write_text(line + "\n")
    sacct = base / "sacct"
    sacct.write_text("#!/bin/sh\nd='|'\nwhile [ $# -gt 0 ]; do [ \"$1\" = --delimiter ] && d=$2; shift; done\n"
                     f"exec sed \"s/@@D@@/$d/g\" {base / 'sacct.out'}\n")
    sacct.chmod(0o755)
    conf = base / "report.toml"
    conf.write_text(f'[node]\nstate_dir = "{base}/var"\n[acct]\nsacct = "{sacct}"\n')
    env = {"PATH": "/usr/bin:/bin", "SLURM_GPU_CONFIG": str(conf), "PYTHONPATH": str(ROOT)}
    cases = {"report": [python, "-m", "slurm_gpu", "job", "report", "77", "--json"],
             "python": [python, "-c", "pass"], "sacct stub": [str(sacct)]}
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(runs):
        for name, argv in cases.items():      # interleaved: noise hits every case alike
            t = time.perf_counter()
            r = subprocess.run(argv, env=env, capture_output=True, text=True)
            times[name].append(time.perf_counter() - t)
            if r.returncode != 0:
                raise SystemExit(f"bench_acct: {name} failed: {r.stderr[-300:]}")
    return {k: med(v) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ticks", type=int, default=60)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="sg-bench-acct-"))
    ok = True
    try:
        setup_node(base)
        smp = bench_sampler(base, a.python, a.ticks)
        share = smp["cpu_per_tick"] / 10.0 * 100
        rss = smp["maxrss_kb"] / 1024
        bare = smp["bare_rss_kb"] / 1024
        print(f"sampler, 8 GPUs, 8 jobs: {smp['cpu_per_tick'] * 1000:.1f} ms CPU per tick = {share:.3f} % "
              f"of one core at 10 s (goal <= 0.5 %)")
        print(f"sampler RSS {rss:.1f} MB (bare interpreter {bare:.1f} MB, ratio {rss / bare:.1f}x; "
              f"goal <= 30 MB)")
        cli = bench_cli_rss(base, a.python) / 1024
        print(f"slurm-gpu monitor CLI process (click, config, node model): RSS {cli:.1f} MB (goal <= 30 MB)")
        ok &= share <= 0.5 and rss <= 30 and cli <= 30
        summ = bench_summary(base, a.runs)
        print(f"epilog summary step, 8 devices: median {med(summ) * 1000:.2f} ms, max "
              f"{max(summ) * 1000:.2f} ms (goal <= 50 ms)")
        ok &= med(summ) <= 0.050
        rep = bench_report(base, a.python, a.runs)
        print(f"job report --json: {rep['report'] * 1000:.0f} ms; bare python {rep['python'] * 1000:.0f} ms "
              f"(ratio {rep['report'] / rep['python']:.1f}x), sacct stub {rep['sacct stub'] * 1000:.0f} ms "
              f"(goal <= 300 ms)")
        ok &= rep["report"] <= 0.300
    finally:
        import shutil
        shutil.rmtree(base, ignore_errors=True)
    print("bench_acct: " + ("all goals met" if ok else "GOAL MISSED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
