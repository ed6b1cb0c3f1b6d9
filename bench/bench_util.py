#!/opt/slurm-gpu/venv/bin/python
"""Benchmark: `report usage`'s utilisation against a synthetic load (issue 27 section 7).

A 1-node sandbox on h100-sxm-8x with slurmdbd, the project's prolog/epilog
and its accounting sampler (``slurm-gpu monitor``, every 0.3 s) over the
NVML simulator.  The simulator's scripted load keeps each GPU at a known
SM utilisation over time (two GPUs idle throughout, the others between 10
and 100 %, three of them changing while jobs run on them), so a job is busy
or idle by where Slurm puts it.  A random
stream of 1- to 3-GPU batch jobs of 3 to 8 s, from two users, runs through
it; each job's GPUs are read from Slurm (``scontrol -d show job``'s
``IDX``, turned into a GPU through gres.conf's device files and the
machine's minors, not through the product's mapping), its elapsed time from
sacct.

The load's figure: Σ(the load's utilisation of each GPU a job held,
integrated over the job's Start..End in slurmdbd) / Σ(GPUs × elapsed time),
and the same numerator over 8 GPUs × the period.  Measured: ``slurm-gpu report usage --json``'s
``job_efficiency`` and ``cluster_utilisation`` for the same period, from
the summaries the epilog stored in slurmdbd.

    /opt/slurm-gpu/venv/bin/python bench/bench_util.py [--jobs 14] [--smoke] [--slurm 26.05]

Goal: both figures within 2 points of the load's.  Exits 1 when missed.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from benchrow import row  # noqa: E402
from sbjobs import (JOB_USERS, client, indices, job, sandbox_options, sbatch, slurm_gpu_minors, until,  # noqa: E402
                    use_load_file, workdir)

GOAL_PTS = 2.0
MACHINE = "h100-sxm-8x"
# SM % per NVML index: (seconds after the load starts, SM %) steps.  Idle GPUs
# (0) make idle jobs; three GPUs change their load while jobs run on them.
LOAD = [[(0, 0.0)], [(0, 95.0), (12, 30.0)], [(0, 80.0)], [(0, 60.0), (8, 10.0), (16, 70.0)],
        [(0, 0.0)], [(0, 40.0), (12, 90.0)], [(0, 20.0)], [(0, 100.0)]]
INTERVAL = 0.3


def script_load(path: Path, t0: float) -> None:
    from slurm_gpu_devkit.sim.load import LOAD_SCHEMA, write_load
    write_load(str(path), {"schema": LOAD_SCHEMA, "t0": t0,
                           "devices": {str(i): [{"t": t, "sm": sm, "mem_mib": 1000 if sm else 0} for t, sm in steps]
                                       for i, steps in enumerate(LOAD)}})


def busy_seconds(gpu: int, t0: float, start: float, end: float) -> float:
    """∫ SM/100 dt of the load over [start, end] on *gpu* (the load starts at *t0*)."""
    steps = [(t0 + t, sm) for t, sm in LOAD[gpu]] + [(float("inf"), 0.0)]
    total = 0.0
    for (a, sm), (b, _) in zip(steps, steps[1:]):
        lo, hi = max(a, start), min(b, end)
        if hi > lo:
            total += (hi - lo) * sm / 100
    return total


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()     # sacct's local time, as the host's


def stream(sb, n: int, rng: random.Random, out: Path) -> dict[str, list[int]]:
    """Submit *n* random jobs and follow them until each ran; job id -> NVML indices it held."""
    gres = sb.layout.gres_conf.read_text()
    minors = slurm_gpu_minors(gres, "n1")
    facts = json.loads((sb.layout.var / "n1" / "sim.json").read_text())["facts"]
    nvml_of_minor = {int(g.get("minor", i)): i for i, g in enumerate(facts["gpus"])}
    ids = []
    for i in range(n):
        ids.append(sbatch(sb, [f"--gres=gpu:{rng.choice((1, 1, 2, 3))}", "-o", "/dev/null",
                               "--wrap", f"sleep {rng.uniform(3, 8):.1f}"], JOB_USERS[i % 2], cwd=str(out)))
    held: dict[str, list[int]] = {}
    deadline = time.monotonic() + 60 + 10 * n
    while len(held) < len(ids):
        for j in ids:
            if j in held:
                continue
            rec = job(sb, j)
            if rec.get("JobState") == "RUNNING" and rec["IDX"]:
                held[j] = [nvml_of_minor[minors[x]] for x in indices(rec["IDX"])]
            elif rec.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING"):
                raise SystemExit(f"bench_util: job {j} {rec.get('JobState')} before it was seen running")
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_util: jobs did not all run: {sorted(set(ids) - set(held))}")
        time.sleep(0.2)
    return held


def accounted(sb, ids: list[str]) -> dict[str, tuple[str, str, int]]:
    """job id -> (Start, End, ElapsedRaw) once every job's summary is in slurmdbd."""
    from slurm_gpu.acct import dbd

    def done() -> dict[str, tuple[str, str, int]] | None:
        out = client(sb, ["sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o",
                          "JobIDRaw,State,Start,End,ElapsedRaw,AdminComment"], check=False)
        rows = {}
        for line in out.splitlines():
            f = line.split("|", 5)
            if len(f) == 6 and f[1] == "COMPLETED" and dbd.KEY in f[5]:
                rows[f[0]] = (f[2], f[3], int(f[4]))
        return rows if set(rows) == set(ids) else None
    return until(done, 120, "every job's summary in sacct", step=0.5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--seed", type=int, default=27)
    sandbox_options(ap)
    a = ap.parse_args()
    n = 3 if a.smoke else a.jobs
    from slurm_gpu_devkit.sandbox import Sandbox, SandboxOptions
    d = workdir("util")
    out = d / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    sb = Sandbox(d, SandboxOptions(
        nodes=1, machine=MACHINE, prolog=True, simulate=True, sim_mig="recorded", accounting=True,
        slurm=a.slurm, extra_config={"acct": {"enabled": True, "interval": INTERVAL},
                                     # The load keeps memory in use after a job: not a leftover here.
                                     "repair": {"user_problem": False}}))
    t_start = time.perf_counter()
    try:
        sb.up()
        load = d / "load.json"
        t0 = time.time()
        script_load(load, t0)
        load.chmod(0o644)
        use_load_file(sb, "n1", load)
        held = stream(sb, n, random.Random(a.seed), out)
        times = accounted(sb, list(held))
        since = min(t[0] for t in times.values())
        until_ = max(t[1] for t in times.values())
        argv = [str(sb.options.venv / "bin" / "slurm-gpu"), "report", "usage", "--since", since,
                "--until", until_, "--json"]
        env = {**sb.env, "SLURM_GPU_CONFIG": str(sb.layout.config_toml)}
        wrapped, _ = sb.client_argv(argv)
        if wrapped != argv:
            env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
        r = subprocess.run(wrapped, capture_output=True, text=True, env=env, timeout=60)
        if r.returncode != 0:
            raise SystemExit(f"bench_util: report usage: {r.stderr.strip()}")
        rep = json.loads(r.stdout)
    finally:
        sb.down()
        shutil.rmtree(d, ignore_errors=True)
    span = (datetime.fromisoformat(until_) - datetime.fromisoformat(since)).total_seconds()
    # The load's own figure over each job's run as slurmdbd recorded it (Start, End).
    used = sum(busy_seconds(g, t0, epoch(times[j][0]), epoch(times[j][1])) for j, gpus in held.items() for g in gpus)
    alloc = sum(len(gpus) * times[j][2] for j, gpus in held.items())
    want_eff, want_cl = 100 * used / alloc, 100 * used / (len(LOAD) * span)
    got_eff, got_cl = 100 * rep["job_efficiency"], 100 * rep["cluster_utilisation"]
    busy = sum(1 for gpus in held.values() if any(sm for g in gpus for _, sm in LOAD[g]))
    print(f"bench_util: {len(held)} jobs ({busy} busy, {len(held) - busy} idle), {alloc / 3600:.3f} GPU-h "
          f"over {span:.0f} s, Slurm {sb.slurm_version}, {time.perf_counter() - t_start:.0f} s in all")
    print(f"  job efficiency      report {got_eff:6.2f} %   load {want_eff:6.2f} %   ({got_eff - want_eff:+.2f} pts)")
    print(f"  cluster utilisation report {got_cl:6.2f} %   load {want_cl:6.2f} %   ({got_cl - want_cl:+.2f} pts)")
    err = max(abs(got_eff - want_eff), abs(got_cl - want_cl))
    ok = row(f"utilisation: report usage, {len(held)} busy/idle jobs on a scripted load",
             f"efficiency {got_eff:.1f} %, cluster {got_cl:.1f} % (max {err:.2f} pts off)",
             f"load {want_eff:.1f} %, {want_cl:.1f} %", f"<= {GOAL_PTS:g} pts", err <= GOAL_PTS, a.smoke)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
