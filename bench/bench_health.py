#!/opt/slurm-gpu/venv/bin/python
"""Benchmark ``slurm-gpu health`` (issue 5 goals), with baselines measured side by side.

1. Full check of an 8-GPU recorded machine (h100-sxm-8x snapshot: every gpu.*
   NVML check through the replay, gpu.xid over a kernel log, the os.* audit),
   wall time including interpreter start, and peak RSS.  Goal (issue 25):
   <= 10x ``python -I -c pass``, <= 20 MB; ``--old DIR`` (a checkout of the
   code before) measures its full check interleaved with this one's.
   Baselines: a bare interpreter, ``slurm-gpu --version`` and
   ``slurm-gpu inventory --snapshot`` on the same machine.
   The same check with ``[cluster] publish_dir`` set and the model unchanged
   since the last run (issue 16: no rewrite, one small read), same goal.
2. Scanning a 100 MB kernel log with ``--only gpu.xid``.  Goal (issue 15):
   <= 100 ms.  Baseline: ``grep -c NVRM`` over the same file.

Run:  /opt/slurm-gpu/venv/bin/python bench/bench_health.py [--runs N] [--log-mb MB] [--smoke]
Exits 1 when a goal is missed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from benchrow import goal_for, goal_text, python, row  # noqa: E402

PY = python()
FULL_MB, XID_MS = 20.0, 100.0
FULL_GOAL_X = 10.0      # issue 25: a full check <= 10x `python -I -c pass`
GREP_FLOOR_MS = 17.0   # the floor beside the XID goal in issue 15
SNAP = ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json"


def measure(argv: list[str], env: dict[str, str], runs: int, stdout: Any = subprocess.DEVNULL,
            cwd: Path = ROOT) -> tuple[float, float, int]:
    """(median wall ms, min wall ms, max peak RSS KiB) over *runs* runs of *argv* (in *cwd*: whose code)."""
    walls, rss = [], 0
    for _ in range(runs):
        t = time.perf_counter()
        p = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.DEVNULL, env=env, cwd=str(cwd))
        _, status, ru = os.wait4(p.pid, 0)
        walls.append((time.perf_counter() - t) * 1000)
        rss = max(rss, ru.ru_maxrss)
        p.returncode = os.waitstatus_to_exitcode(status)
    return statistics.median(walls), min(walls), rss


def make_log(path: Path, mb: int) -> None:
    lines = [
        b"[%d.%06d] usb 1-1: new high-speed USB device number 2 using xhci_hcd\n",
        b"[%d.%06d] EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.\n",
        b"[%d.%06d] audit: type=1400 audit(1732250000.000:2): apparmor=\"STATUS\" operation=\"profile_load\"\n",
        b"[%d.%06d] mlx5_core 0000:0c:00.0: mlx5_fw_tracer_handle_traces:742:(pid 0): FW tracer event\n",
    ]
    xid = (b"[%d.%06d] NVRM: Xid (PCI:0000:cb:00): 13, pid=1797828, name=pt_main_thread, "
           b"Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter\n")
    target = mb * 1024 * 1024
    with open(path, "wb") as f:
        n = size = 0
        while size < target:
            chunk = bytearray()
            for _ in range(4096):
                chunk += (xid if n % 20000 == 0 else lines[n % 4]) % (n // 1000, n % 1000000)
                n += 1
            f.write(chunk)
            size += len(chunk)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--log-mb", type=int, default=100)
    ap.add_argument("--smoke", action="store_true", help="1 run, 1 MB log, no goal judged")
    ap.add_argument("--old", type=Path, default=None,
                    help="a checkout of the code before: its full check measured interleaved with this one's")
    a = ap.parse_args()
    if a.smoke:
        a.runs, a.log_mb = 1, 1
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-health-") as td:
        tdp = Path(td)
        klog = tdp / "kern.log"
        klog.write_text("[  12.5] NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=a.out, Graphics SM Warp Exception\n")
        cfg = tdp / "slurm-gpu.toml"
        cfg.write_text(f'[node]\nstate_dir = "{tdp}/state"\n[health]\nkernel_log = "{klog}"\n')
        env = {"PATH": "/usr/bin:/bin", "SLURM_GPU_CONFIG": str(cfg), "SLURMD_NODENAME": "bench1"}
        cases = [
            ("python -I -c pass (interpreter start)", [PY, "-I", "-c", "pass"]),
            ("slurm-gpu --version", [PY, "-m", "slurm_gpu", "--version"]),
            ("slurm-gpu inventory --snapshot h100-sxm-8x --json", [PY, "-m", "slurm_gpu", "inventory", "--snapshot",
                                                               str(SNAP), "--json"]),
            ("slurm-gpu health --snapshot h100-sxm-8x (full, --no-drain)",
             [PY, "-m", "slurm_gpu", "health", "--snapshot", str(SNAP), "--no-drain"]),
            ("slurm-gpu health --snapshot h100-sxm-8x --json --prom-file",
             [PY, "-m", "slurm_gpu", "health", "--snapshot", str(SNAP), "--no-drain", "--json",
              "--prom-file", str(tdp / "h.prom")]),
        ]
        print(f"# full check of an 8-GPU recorded machine, {a.runs} runs each (median / min wall, peak RSS)")
        res, mem = {}, {}
        for name, argv in cases:
            med, mn, rss = measure(argv, env, a.runs)
            res[name], mem[name] = med, rss / 1024
            print(f"{name:62s} {med:7.1f} ms  (min {mn:6.1f})  {rss / 1024:5.1f} MB")
        # Publishing the model (issue 16): [cluster] publish_dir set, model unchanged since the last run.
        pub_cfg = tdp / "slurm-gpu-publish.toml"
        pub_cfg.write_text(cfg.read_text() + f'[cluster]\npublish_dir = "{tdp}/published"\n')
        (tdp / "published").mkdir()
        pub_env = dict(env, SLURM_GPU_CONFIG=str(pub_cfg))
        pub_argv = [PY, "-m", "slurm_gpu", "health", "--snapshot", str(SNAP), "--no-drain"]
        measure(pub_argv, pub_env, 1)   # the first run publishes; the measured ones find it unchanged
        pub_name = "slurm-gpu health ... with [cluster] publish_dir, unchanged"
        before = (tdp / "published" / "bench1.json").stat().st_mtime_ns
        pairs, pub_rss = [], 0
        for _ in range(a.runs):     # interleaved with the same check without publishing: a fair ratio
            off, _, _ = measure(pub_argv, env, 1)
            on, _, rss = measure(pub_argv, pub_env, 1)
            pairs.append((off, on))
            pub_rss = max(pub_rss, rss)
        res[pub_name], mem[pub_name] = statistics.median(on for _, on in pairs), pub_rss / 1024
        pub_off = statistics.median(off for off, _ in pairs)
        rewritten = (tdp / "published" / "bench1.json").stat().st_mtime_ns != before
        print(f"{pub_name:62s} {res[pub_name]:7.1f} ms  (without, interleaved: {pub_off:6.1f})  "
              f"{mem[pub_name]:5.1f} MB" + ("  REWRITTEN: bug" if rewritten else ""))
        base = res[cases[0][0]]
        full = res[cases[3][0]]
        print(f"ratio health/interpreter start: {full / base:.2f}x;  health/inventory: "
              f"{full / res[cases[2][0]]:.2f}x;  goal <= {FULL_GOAL_X:g}x and <= {FULL_MB:.0f} MB: "
              f"{'met' if full <= FULL_GOAL_X * base and mem[cases[3][0]] <= FULL_MB else 'NOT met'}")
        old_text = ""
        if a.old is not None:
            # this checkout and the old one, run by run, with the floor between
            pairs3 = []
            for _ in range(a.runs):
                fl, _, _ = measure(cases[0][1], env, 1)
                old, _, _ = measure(cases[3][1], env, 1, cwd=a.old)
                new, _, _ = measure(cases[3][1], env, 1)
                pairs3.append((fl, old, new))
            base = statistics.median(x[0] for x in pairs3)
            o_med = statistics.median(x[1] for x in pairs3)
            full = statistics.median(x[2] for x in pairs3)
            old_text = f"; old {o_med:.1f} ms ({o_med / base:.1f}x)"
            print(f"paired, {a.runs} rounds: floor {base:.1f} ms, old {o_med:.1f} ms, new {full:.1f} ms; "
                  f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        ok &= row("health, full check, 8-GPU snapshot",
                  f"{full:.1f} ms ({full / base:.1f}x){old_text}, {mem[cases[3][0]]:.1f} MB",
                  f"python -I -c pass {base:.1f} ms, {mem[cases[0][0]]:.1f} MB",
                  f"<= {FULL_GOAL_X:g}x, <= {FULL_MB:.0f} MB",
                  full <= FULL_GOAL_X * base and mem[cases[3][0]] <= FULL_MB, a.smoke)
        print(f"publishing on, model unchanged: {res[pub_name]:.1f} ms, {res[pub_name] - pub_off:+.1f} ms beside "
              f"the same check without; goal <= 150 ms and <= 40 MB: "
              f"{'met' if res[pub_name] <= 150 and mem[pub_name] <= 40 and not rewritten else 'NOT met'}")
        big = tdp / "big.log"
        make_log(big, a.log_mb)
        size = big.stat().st_size / (1024 * 1024)
        xruns = 1 if a.smoke else 5
        print(f"\n# scanning a {size:.0f} MB kernel log (page cache warm), {xruns} runs each")
        # Not to /dev/null: GNU grep then stops at the first match (as -q does).
        with open(tdp / "grep.out", "w") as out:
            g_med, _, _ = measure(["/usr/bin/grep", "-c", "NVRM", str(big)], env, xruns, stdout=out)
        h_med, h_min, h_rss = measure([PY, "-m", "slurm_gpu", "health", "--only", "gpu.xid", "--kernel-log", str(big),
                                       "--no-drain"], env, xruns)
        print(f"{'grep -c NVRM (baseline)':62s} {g_med:7.1f} ms")
        print(f"{'slurm-gpu health --only gpu.xid --kernel-log big.log':62s} {h_med:7.1f} ms  (min {h_min:6.1f})  "
              f"{h_rss / 1024:5.1f} MB")
        print(f"ratio health/grep: {h_med / g_med:.2f}x;  goal <= {XID_MS:.0f} ms: "
              f"{'met' if h_med <= XID_MS else 'NOT met'}")
        goal = goal_for(XID_MS, g_med, GREP_FLOOR_MS)
        ok &= row(f"health --only gpu.xid, {size:.0f} MB kernel log",
                  f"{h_med:.1f} ms ({h_med / g_med:.1f}x), {h_rss / 1024:.1f} MB",
                  f"grep -c {g_med:.1f} ms", goal_text(XID_MS, goal), h_med <= goal, a.smoke)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
