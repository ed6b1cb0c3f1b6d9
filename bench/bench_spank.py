"""What the SPANK plugin costs a job step, measured side by side on one sandbox.

    /opt/slurm-gpu/venv/bin/python bench/bench_spank.py [--runs 30] [--machine mini-2numa]
                                                        [--slurm 22.05|24.11|26.05]

One sandbox (the plugin built and installed) runs, interleaved round by
round so drift hits every variant alike:

* ``srun -N1 true`` with an empty plugstack.conf (no plugin),
* ``srun -N1 true`` with the plugin and no option (goal <= 1.05x),
* ``srun -N1 --gpus=1 --gpu-numa-bind=prefer true`` (goal, issue 25: <= 1.1x
  the first, a plain step),

``--slurm`` runs it on that Slurm (a Debian root's, as ``sandbox up
--slurm``); every variant then pays the same entry into the root.
srun and slurmstepd read plugstack.conf at every step, so switching the file
between runs switches the plugin.  slurmd's RSS is compared between this
sandbox and a second one started without the plugin, after the same jobs.
Prints medians and ratios; exits 1 when a goal is missed (``--smoke``: one
round, no goal judged, for the test suite).
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from benchrow import row  # noqa: E402

GOALS = {"plugin, no option": 1.05, "plugin, 1 GPU --gpu-numa-bind=prefer": 1.1}


def _sandbox(base: Path, tag: str, machine: str, spank: bool, slurm: str | None):  # -> Sandbox
    from slurm_gpu_devkit.sandbox import Sandbox, SandboxOptions
    d = Path(tempfile.mkdtemp(prefix=f"bench-spank-{tag}-", dir=base))
    os.chmod(d, 0o755)
    opts = SandboxOptions(machine=machine, spank=spank, slurm=slurm,
                          extra_config={"spank": {"numa_node_map": {"1": 0}}} if spank else {})
    sb = Sandbox(d, opts)
    sb.up()
    return sb


def _time(sb, argv: list[str], env: dict[str, str], user: str | None = None) -> float:  # type: ignore[no-untyped-def]
    from slurm_gpu.runner import SAFE_PATH, RunAs
    kw: dict = {}
    run_as = None
    if user:
        import pwd
        pw = pwd.getpwnam(user)
        run_as = RunAs(pw.pw_uid, pw.pw_gid, ())
    wrapped, run_as = sb.client_argv(argv, run_as)
    if wrapped != argv:
        env = dict(env, PATH=SAFE_PATH)
    argv = wrapped
    if run_as is not None:
        kw = dict(user=run_as.uid, group=run_as.gid, extra_groups=[])
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, cwd="/", capture_output=True, text=True, **kw)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"slurm-gpu: bench step failed: {' '.join(argv)}: {res.stderr.strip()}")
    return dt


def _slurmd_rss_kib(sb) -> int:  # type: ignore[no-untyped-def]
    total = 0
    for d in sb.status()["daemons"]:
        if d["name"].startswith("slurmd") and d["alive"]:
            for line in Path(f"/proc/{d['pid']}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--machine", default="mini-2numa")
    ap.add_argument("--slurm", default=None, metavar="VERSION",
                    help="Slurm to run: 22.05 (host), 24.11, 26.05 [the host's]")
    ap.add_argument("--user", default="sgtest1",
                    help="job user the steps run as (not root: slurmstepd runs a root job's "
                         "hooks with root's rights, a user's with the user's) [sgtest1]")
    ap.add_argument("--smoke", action="store_true", help="one round, no goal judged")
    a = ap.parse_args()
    if a.smoke:
        a.runs = 1
    if os.geteuid() != 0:
        print("slurm-gpu: bench_spank needs root (it starts Slurm)", file=sys.stderr)
        return 2
    import pwd
    try:
        pwd.getpwnam(a.user)
    except KeyError:
        print(f"slurm-gpu: no user {a.user} (create it, or pass --user)", file=sys.stderr)
        return 2
    base = Path("/tmp/slurm-gpu-bench")
    base.mkdir(exist_ok=True)
    os.chmod(base, 0o755)
    with_plugin = _sandbox(base, "on", a.machine, spank=True, slurm=a.slurm)
    without = None
    try:
        env = dict(with_plugin.env)
        plugstack = with_plugin.layout.plugstack_conf
        line = plugstack.read_text()
        variants = [
            ("no plugin", "", ["srun", "-N1", "true"]),
            ("plugin, no option", line, ["srun", "-N1", "true"]),
            ("no plugin, 1 GPU (reference)", "", ["srun", "-N1", "--gpus=1", "true"]),
            ("plugin, 1 GPU --gpu-numa-bind=prefer", line,
             ["srun", "-N1", "--gpus=1", "--gpu-numa-bind=prefer", "true"]),
            # the same binding with verbose, from the value srun's C half
            # passes on, and from one it leaves to Python (to normalise):
            # the difference is what an interpreter in srun costs
            ("plugin, prefer,verbose (C in srun)", line,
             ["srun", "-N1", "--gpus=1", "--gpu-numa-bind=prefer,verbose", "true"]),
            ("plugin, verbose,prefer (Python in srun)", line,
             ["srun", "-N1", "--gpus=1", "--gpu-numa-bind=verbose,prefer", "true"]),
        ]
        times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        for name, conf, argv in variants:           # warm-up: page cache, first-step costs
            plugstack.write_text(conf)
            _time(with_plugin, argv, env, a.user)
        for _ in range(a.runs):
            for name, conf, argv in variants:
                plugstack.write_text(conf)
                times[name].append(_time(with_plugin, argv, env, a.user))
        plugstack.write_text(line)
        rss_on = _slurmd_rss_kib(with_plugin)
        without = _sandbox(base, "off", a.machine, spank=False, slurm=a.slurm)
        wenv = dict(without.env)
        for _ in range(len(variants) * (a.runs + 1)):
            _time(without, ["srun", "-N1", "true"], wenv, a.user)
        rss_off = _slurmd_rss_kib(without)
    finally:
        for sb in (with_plugin, without):
            if sb is not None:
                sb.down()
                shutil.rmtree(sb.dir, ignore_errors=True)

    base_ms = statistics.median(times["no plugin"]) * 1000
    failed = False
    print(f"bench_spank: Slurm {with_plugin.slurm_version}, medians of {a.runs} runs, machine "
          f"{a.machine}, as {a.user}, interleaved")
    for name, _, argv in variants:
        med = statistics.median(times[name]) * 1000
        ratio = med / base_ms
        goal = GOALS.get(name)
        verdict = "" if goal is None else (f"  goal <= {goal:.2f}x " +
                                           ("ok" if ratio <= goal else "MISSED"))
        failed |= goal is not None and ratio > goal and not a.smoke
        print(f"  {name:40s} {med:7.1f} ms  {ratio:5.2f}x{verdict}")
        if goal is not None:
            row(f"srun {' '.join(argv[2:])} ({name})", f"{med:.1f} ms ({ratio:.2f}x)",
                f"plain step {base_ms:.1f} ms", f"<= {goal:.2f}x", ratio <= goal, a.smoke)
    print(f"  slurmd RSS: {rss_off / 1024:.1f} MiB without the plugin, "
          f"{rss_on / 1024:.1f} MiB with it ({(rss_on - rss_off) / 1024:+.1f} MiB)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
