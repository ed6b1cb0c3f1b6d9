"""The Python half of the GPU bundle's check (gpu-check.sh makes its venv).

Each step says one line; the last line is the summary.  Nothing on the GPUs
is changed: compute modes are read before and after (an MPS daemon is
started only where the mode allows it), no MIG layout is touched, and every
file goes to --out.  The whole run stays under :data:`DEADLINE_S`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from typing import Any, Callable

DEADLINE_S = 270.0          # gpu-check.sh's venv and pip take the rest of the 5 minutes
MPS_CONTROL = ("/usr/bin/nvidia-cuda-mps-control", "/usr/local/cuda/bin/nvidia-cuda-mps-control")
PROHIBITED = 2              # NVML_COMPUTEMODE_PROHIBITED: no CUDA context, so no MPS server


def say(msg: str) -> None:
    print(f"slurm-gpu: gpu-check: {msg}", flush=True)


class Check:
    def __init__(self, out: str, bundle: str) -> None:
        self.out, self.bundle = out, bundle
        self.t0 = time.monotonic()
        self.results: list[tuple[str, str, str]] = []

    def left(self, want: float) -> float:
        return max(1.0, min(want, DEADLINE_S - (time.monotonic() - self.t0)))

    def step(self, name: str, fn: Callable[[], tuple[str, str]]) -> None:
        t = time.monotonic()
        try:
            status, detail = fn()
        except Exception as e:  # noqa: BLE001 - one step's failure is a finding, the rest still run
            status, detail = "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        self.results.append((name, status, detail))
        say(f"{status} {name}: {detail} ({time.monotonic() - t:.1f} s)")


def nvml_or_exit() -> Any:
    from slurm_gpu.errors import SlurmGpuError
    from slurm_gpu.hw import nvml
    try:
        return nvml.open_api()
    except SlurmGpuError as e:
        say(f"{getattr(e, 'what', e)}: nothing to check on this machine (needs NVIDIA's driver)")
        sys.exit(77)


def run_tests(c: Check) -> tuple[str, str]:
    from slurm_gpu import runner
    res = runner.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                      "-c", os.path.join(c.bundle, "tests", "pytest.ini"), "--rootdir", os.path.join(c.bundle, "tests"),
                      os.path.join(c.bundle, "tests", "gpu")], c.left(150),
                     env={"PATH": runner.SAFE_PATH, "PYTHONDONTWRITEBYTECODE": "1", "HOME": c.out}, cwd=c.out,
                     check=False)
    with open(os.path.join(c.out, "tests-gpu.log"), "w") as f:
        f.write(res.stdout + res.stderr)
    last = (res.stdout.strip().splitlines() or ["no output"])[-1].strip("= ")
    return ("OK" if res.returncode == 0 else "FAIL"), f"{last} (tests-gpu.log)"


def snapshot(c: Check) -> tuple[str, str]:
    from slurm_gpu.hw import live, snapshot as snap
    node = live.this_node(live.NodeSettings())
    path = os.path.join(c.out, "snapshot.json")
    snap.write(path, snap.record())
    replayed = snap.node_from_file(path)
    same = (replayed.gpus == node.gpus, replayed.cores == node.cores, replayed.numa_nodes == node.numa_nodes)
    if all(same):
        return "OK", f"{len(node.gpus)} GPU(s), {len(node.numa_nodes)} NUMA node(s); replay equals live ({path})"
    diff = [n for n, ok in zip(("gpus", "cores", "numa_nodes"), same) if not ok]
    return "FAIL", f"replay differs from live in {', '.join(diff)} ({path})"


def sampler(c: Check, api: Any) -> tuple[str, str]:
    from slurm_gpu.hw.gpustats import StatsReader
    reader = StatsReader(api)
    rows: list[Any] = []
    for i in range(3):
        if i:
            time.sleep(1.0)
        rows = reader.read()
    with open(os.path.join(c.out, "sampler.json"), "w") as f:
        json.dump([dataclasses.asdict(s) if dataclasses.is_dataclass(s) else repr(s) for s in rows], f,
                  default=str, indent=1)
    if reader.errors:
        return "FAIL", f"{len(rows)} device(s) read, errors: {reader.errors[0]}"
    have = {k: sum(getattr(s, k, None) is not None for s in rows) for k in ("sm", "mem_used", "energy_mj")}
    return "OK", (f"3 reads of {len(rows)} device(s); with SM {have['sm']}, memory {have['mem_used']}, "
                  f"energy {have['energy_mj']} (sampler.json)")


def mps(c: Check, api: Any) -> tuple[str, str]:
    from slurm_gpu import runner
    control = next((p for p in MPS_CONTROL if os.access(p, os.X_OK)), shutil.which("nvidia-cuda-mps-control"))
    if not control:
        return "SKIP", "no nvidia-cuda-mps-control on this machine"
    n = int(api.nvmlDeviceGetCount())
    modes = [int(api.nvmlDeviceGetComputeMode(api.nvmlDeviceGetHandleByIndex(i))) for i in range(n)]
    usable = [str(i) for i, m in enumerate(modes) if m != PROHIBITED]
    if not usable:
        return "SKIP", f"every GPU's compute mode is PROHIBITED ({modes}): left as it is"
    pipe, log = os.path.join(c.out, "mps", "pipe"), os.path.join(c.out, "mps", "log")
    os.makedirs(pipe, mode=0o700)
    os.makedirs(log, mode=0o700)
    env = {"PATH": runner.SAFE_PATH, "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log,
           "CUDA_VISIBLE_DEVICES": ",".join(usable), "HOME": c.out}

    def ctl(cmd: str) -> str:
        return runner.run([control], c.left(15), input=cmd + "\n", env=env, check=False).stdout.strip()
    started = runner.run([control, "-d"], c.left(15), env=env, check=False)
    if started.returncode != 0:
        return "FAIL", f"{control} -d: exit {started.returncode}: {(started.stderr or started.stdout).strip()[:200]}"
    try:
        server = ctl(f"start_server -uid {os.getuid()}")
        servers = ctl("get_server_list")
    finally:
        ctl("quit")
    for _ in range(50):                        # the daemon removes its pipe when it has quit
        if not os.path.exists(os.path.join(pipe, "control")):
            break
        time.sleep(0.1)
    after = [int(api.nvmlDeviceGetComputeMode(api.nvmlDeviceGetHandleByIndex(i))) for i in range(n)]
    if after != modes:
        return "FAIL", f"compute modes changed: {modes} -> {after}"
    if os.path.exists(os.path.join(pipe, "control")):
        return "FAIL", "the control daemon did not quit (see mps/log)"
    ok = servers.strip() != ""
    return ("OK" if ok else "FAIL"), (f"control daemon started and quit; server {'started' if ok else 'not started'} "
                                      f"({server or servers or 'no answer'}); compute modes {modes} unchanged "
                                      "(mps/log)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    c = Check(a.out, a.bundle)
    try:
        import slurm_gpu  # noqa: F401 - a Python it does not run on says so in one line
    except Exception as e:  # noqa: BLE001
        say(f"slurm-gpu does not import on Python {sys.version.split()[0]}: {type(e).__name__}: {e}")
        return 3
    api = nvml_or_exit()
    say(f"driver {api.nvmlSystemGetDriverVersion()}, {api.nvmlDeviceGetCount()} GPU(s); Python "
        f"{sys.version.split()[0]}; results in {a.out}")
    c.step("tests/gpu", lambda: run_tests(c))
    c.step("snapshot", lambda: snapshot(c))
    c.step("sampler", lambda: sampler(c, api))
    c.step("mps", lambda: mps(c, api))
    failed = [n for n, s, _ in c.results if s == "FAIL"]
    summary = (f"{'FAILED' if failed else 'OK'}: " + ", ".join(f"{n} {s}" for n, s, _ in c.results)
               + f"; {time.monotonic() - c.t0:.0f} s; results in {a.out}")
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write("\n".join(f"{s} {n}: {d}" for n, s, d in c.results) + "\n" + summary + "\n")
    say(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
