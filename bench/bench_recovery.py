#!/opt/slurm-gpu/venv/bin/python
"""Benchmark: fault to DRAIN, and fault to the job running on another node (issue 27, "recovery in seconds").

A 2-node sandbox on the default machine with the health check installed at
``HealthCheckInterval=300`` (as sites run it) and ``xid-watch`` beside each
slurmd.  Each run injects the ``xid-79`` fault drill on n1 (the kernel line
and NVML's event and lost GPU together) and times until ``scontrol show
node`` reports n1 draining; then the fault is cleared and an admin resume
puts n1 back.  The floor, measured in the same run, is one ``scontrol update
state=drain`` of n2 and its ``scontrol show node`` (the drain write itself).

Then, per run, a requeueable 1-GPU batch job runs on n1, the ``xid-79``
drill hits the GPU it holds, and the time is taken until the job runs on n2
(``[health] on_fatal = "requeue"``: the health check xid-watch starts
requeues it and releases it with ``StartTime=now``).  The floor is what
Slurm itself takes for the same job on a healthy node: ``scontrol requeue``,
waiting for the requeue to finish, ``StartTime=now``, until it runs again.

    /opt/slurm-gpu/venv/bin/python bench/bench_recovery.py [--runs 7] [--smoke] [--slurm 26.05]

Goals: the median fault-to-DRAIN <= 2 s, fault-to-running-elsewhere <= 30 s
(absolute goals of the issue; the floors say how much of it Slurm's own
round trips take).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from benchrow import row  # noqa: E402
import sbjobs  # noqa: E402

GOAL_S = 2.0
GOAL_JOB_S = 30.0
JOB_USER = "sgtest1"


def state(sb, node: str) -> str:
    out = subprocess.run(sb.client_argv(["scontrol", "show", "node", "-o", node])[0], capture_output=True,
                         text=True, env=sb.env, timeout=10).stdout
    for word in out.split():
        if word.startswith("State="):
            return word[6:]
    return ""


def until(probe, pred, timeout: float, what: str) -> float:
    """Seconds until pred(probe()) holds; exit with what was last seen after *timeout*."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if pred(probe()):
            return time.perf_counter() - t0
        time.sleep(0.02)
    raise SystemExit(f"bench_recovery: {what} not there after {timeout} s: {probe()}")


def wait(sb, node: str, pred, timeout: float) -> float:
    log = sb.layout.log / f"xid-watch-{node}.log"
    try:
        return until(lambda: state(sb, node), pred, timeout, f"node {node}")
    except SystemExit:
        print(log.read_text()[-1500:] if log.exists() else "", file=sys.stderr)
        raise


def scontrol(sb, *args: str) -> None:
    subprocess.run(sb.client_argv(["scontrol", *args])[0], check=True, env=sb.env, timeout=10,
                   stdout=subprocess.DEVNULL)


def client(sb, argv: list[str], user: str | None = None) -> str:
    """A Slurm client's stdout, as root or as the job user (:func:`sbjobs.client`, 30 s bound)."""
    return sbjobs.client(sb, argv, user, timeout=30)


def job(sb, jid: str) -> dict[str, str]:
    out = client(sb, ["scontrol", "-d", "show", "job", "-o", jid])
    d = dict(w.split("=", 1) for w in out.split() if "=" in w)
    m = __import__("re").search(r"GRES=gpu:\S*\(IDX:(\d+)", out)
    d["gpu"] = m.group(1) if m else ""
    return d


def wait_job(sb, jid: str, pred, timeout: float) -> float:
    return until(lambda: job(sb, jid), pred, timeout, f"job {jid}")


def running_on(node: str):
    return lambda j: j.get("JobState") == "RUNNING" and j.get("NodeList") == node


def job_runs(sb, layout, runs: int) -> tuple[list[float], list[float]]:
    """(fault to the job running on n2, Slurm's own requeue + release on a healthy node), per run."""
    from slurm_gpu.health.watch import _Gap
    from slurm_gpu_devkit.sandbox import nodesim
    fault, floor = [], []
    for _ in range(runs):
        scontrol(sb, "update", "nodename=n2", "state=drain", "reason=bench: n1 first")
        jid = client(sb, ["sbatch", "--parsable", "--requeue", "--gres=gpu:1", "--wrap", "sleep 600"],
                     JOB_USER).strip().split(";")[0]
        wait_job(sb, jid, running_on("n1"), 60)
        # Floor: Slurm's own requeue and release of the same job (n2 is still drained: back on n1).
        t0 = time.perf_counter()
        scontrol(sb, "requeue", jid)
        wait_job(sb, jid, lambda j: j.get("JobState") == "PENDING", 60)
        scontrol(sb, "update", f"JobId={jid}", "StartTime=now")
        wait_job(sb, jid, running_on("n1"), 60)
        floor.append(time.perf_counter() - t0)
        scontrol(sb, "update", "nodename=n2", "state=resume")
        wait(sb, "n2", lambda s: s == "IDLE", 60)
        gpu = int(job(sb, jid)["gpu"])
        t0 = time.perf_counter()
        nodesim.drill(layout, "n1", "xid-79", gpu=gpu)
        wait_job(sb, jid, running_on("n2"), 60)
        fault.append(time.perf_counter() - t0)
        print(f"  run {len(fault)}: fault to the job running on n2 {fault[-1]:.2f} s, floor {floor[-1]:.2f} s",
              file=sys.stderr)
        client(sb, ["scancel", jid])
        # xid-watch coalesces the fault's second half (its kernel line or NVML event,
        # whichever came later) into one more run at the end of its 5 s gap: let it
        # happen before the node is cleared and resumed, or it drains n1 again.
        time.sleep(_Gap.MIN_GAP + 1.0)
        nodesim.set_fault(layout, "n1", {})
        wait(sb, "n1", lambda s: "DRAIN" in s and "ALLOC" not in s and "MIX" not in s, 60)
        scontrol(sb, "update", "nodename=n1", "state=resume")
        wait(sb, "n1", lambda s: s == "IDLE", 60)
    return fault, floor


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    sbjobs.sandbox_options(ap)
    a = ap.parse_args()
    runs = 1 if a.smoke else a.runs
    from slurm_gpu_devkit.sandbox import Sandbox, SandboxOptions, nodesim
    from slurm_gpu_devkit.sandbox.layout import Layout
    d = sbjobs.workdir("recovery")
    sb = Sandbox(d, SandboxOptions(nodes=2, health=True, health_interval=300, simulate=True, slurm=a.slurm,
                                   extra_config={"health": {"clean_runs_to_resume": 1}}))
    fault, floor = [], []
    jfault: list[float] = []
    jfloor: list[float] = []
    try:
        sb.up()
        layout = Layout.of(d)
        drained = lambda s: "DRAIN" in s  # noqa: E731
        from slurm_gpu.health.watch import _Gap
        last = -_Gap.MIN_GAP
        for _ in range(runs):
            # One fault per node at a time: xid-watch starts at most one triggered
            # run per MIN_GAP, and a fault a few seconds after the last is not the
            # case measured here.
            time.sleep(max(0.0, last + _Gap.MIN_GAP + 0.5 - time.perf_counter()))
            t0 = last = time.perf_counter()
            nodesim.drill(layout, "n1", "xid-79")
            wait(sb, "n1", drained, 30)
            fault.append(time.perf_counter() - t0)
            nodesim.set_fault(layout, "n1", {})
            scontrol(sb, "update", "nodename=n1", "state=resume")
            # Back in full service first: right after a resume slurmctld shows the
            # node NOT_RESPONDING until its next ping, and the check then owes the
            # drain (xid-watch asks again 2 s later): that is Slurm's, not the fault's.
            wait(sb, "n1", lambda s: s == "IDLE", 60)
            t0 = time.perf_counter()
            scontrol(sb, "update", "nodename=n2", "state=drain", "reason=bench floor")
            wait(sb, "n2", drained, 30)
            floor.append(time.perf_counter() - t0)
            scontrol(sb, "update", "nodename=n2", "state=resume")
            wait(sb, "n2", lambda s: s == "IDLE", 60)
        time.sleep(_Gap.MIN_GAP + 0.5)
        jfault, jfloor = job_runs(sb, layout, runs)
    finally:
        sb.down()
        shutil.rmtree(d, ignore_errors=True)
    med, fl = statistics.median(fault), statistics.median(floor)
    print(f"fault to DRAIN: median {med:.2f} s of {runs} (min {min(fault):.2f}, max {max(fault):.2f}); "
          f"floor (scontrol drain + show): {fl * 1000:.0f} ms")
    ok = row("fault (xid-79 drill) to DRAIN, HealthCheckInterval=300", f"{med:.2f} s",
             f"scontrol drain {fl * 1000:.0f} ms", f"<= {GOAL_S:g} s", med <= GOAL_S, a.smoke)
    jm, jf = statistics.median(jfault), statistics.median(jfloor)
    print(f"fault to the job running on another node: median {jm:.2f} s of {runs} (min {min(jfault):.2f}, "
          f"max {max(jfault):.2f}); floor (scontrol requeue, StartTime=now, running again): {jf:.2f} s; "
          f"Slurm {sb.slurm_version}")
    ok2 = row("fault (xid-79 drill) to the requeued job running on another node, HealthCheckInterval=300",
              f"{jm:.2f} s", f"requeue + release {jf:.2f} s", f"<= {GOAL_JOB_S:g} s", jm <= GOAL_JOB_S, a.smoke)
    return 0 if ok and ok2 else 1


if __name__ == "__main__":
    sys.exit(main())
