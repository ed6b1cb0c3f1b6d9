#!/opt/slurm-gpu/venv/bin/python
"""Benchmark: the VM's boot to an idle Slurm node, against the bare kernel's boot (issue 26).

Two cases, interleaved so machine load hits both alike, on the same cached
image (built first, not timed):

* **floor**: QEMU with the same kernel, initramfs, disk and accelerator,
  booted with ``init=/usr/bin/true``: from QEMU's start until the kernel
  has mounted the root and run init (init exits, the kernel panics, QEMU
  exits: ``panic=-1 -no-reboot``);
* **VM**: ``Sandbox.up()`` with ``--vm`` (1 node, the default machine, the
  project's hooks), from QEMU's start (after the config disk is written)
  until sinfo shows the node plainly ``idle``: the ``idle_seconds`` it
  records.

Goal: <= 60 s under TCG here.  Medians of N runs each.

Then the VM's memory: QEMU's peak RSS (VmHWM: the guest's RAM it touched,
TCG's code buffer, QEMU itself) after each VM case has also run a 1-GPU
job and ``slurm-gpu doctor`` in the guest.  Goal: <= 2 GiB.

    /opt/slurm-gpu/venv/bin/python bench/bench_vm.py [-n 3] [--slurm 22.05] [--smoke]
"""
from __future__ import annotations

import argparse
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
GOAL_S = 60.0


def floor_case(img, accel: str) -> float:
    from slurm_gpu_devkit.sandbox import vm
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "cfg.img"
        (Path(tmp) / "cfg").mkdir()
        vm.make_config_disk(Path(tmp) / "cfg", cfg)
        argv = vm.qemu_argv(img, cfg, Path(tmp) / "console.log", 1, accel, 2, [[0, 1]])
        i = argv.index("-append")
        argv[i + 1] = "root=/dev/vda ro console=ttyS0 loglevel=1 panic=-1 init=/usr/bin/true"
        j = argv.index("-netdev")
        del argv[j:j + 4]           # -netdev user,... -device virtio-net-pci,...
        t0 = time.perf_counter()
        p = subprocess.run(argv, check=False, timeout=300, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        took = time.perf_counter() - t0
        console = (Path(tmp) / "console.log").read_text(errors="replace")
        # init=/usr/bin/true exits at once: the kernel panics on it, after
        # mounting the root and running init; anything else is no floor.
        if "Attempted to kill init" not in console:
            raise SystemExit(f"bench_vm: the floor boot did not reach init (rc {p.returncode}: "
                             f"{p.stderr.strip()[-200:]} | {console.strip()[-200:]})")
        return took


MEM_GOAL_MIB = 2048


def _peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def vm_case(slurm: str) -> tuple[float, float, str, float]:
    from slurm_gpu_devkit.sandbox import Sandbox, SandboxOptions
    d = Path(tempfile.mkdtemp(prefix="bench-vm."))
    try:
        sb = Sandbox(d, SandboxOptions(vm=True, slurm=slurm, prolog=None, health=True,
                                       spank=None, simulate=None)).up()
        try:
            st = sb.state
            sb.run_client(["sh", "-c", "srun --gres=gpu:1 true; slurm-gpu doctor >/dev/null"], None, 300)
            qemu = next(d["pid"] for d in st["daemons"] if d["name"] == "qemu")
            return (float(st["idle_seconds"]), float(st["vm"]["boot_seconds"]), st["vm"]["accel"],
                    _peak_rss_mib(int(qemu)))
        finally:
            sb.down()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    from benchrow import row
    from slurm_gpu_devkit.sandbox import vm
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--slurm", default="22.05")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    n = 1 if a.smoke else a.n
    img = vm.Image(vm.build([a.slurm])[0])
    floors, idles, boots, mems, accel = [], [], [], [], "tcg"
    for _ in range(n):
        idle, boot, accel, mem = vm_case(a.slurm)
        mems.append(mem)
        idles.append(idle)
        boots.append(boot)
        floors.append(floor_case(img, accel))
    f, v, b = statistics.median(floors), statistics.median(idles), statistics.median(boots)
    print(f"VM boot to an idle Slurm {a.slurm} node ({accel}, median of {n}): {v:.1f} s "
          f"(guest agent answering at {b:.1f} s); bare kernel boot to init: {f:.1f} s; "
          f"ratio {v / f:.2f}")
    ok = row(f"VM boot to idle Slurm node ({a.slurm}, {accel})", f"{v:.1f} s ({v / f:.1f}x)",
             f"{f:.1f} s (kernel to init)", f"<= {GOAL_S:g} s", v <= GOAL_S, a.smoke)
    m = max(mems)
    print(f"VM memory ({accel}, the most of {n}): QEMU's peak RSS {m:.0f} MiB "
          f"(guest RAM {vm.MEMORY_MIB} MiB, TCG code buffer {vm.TCG_TB_MIB} MiB)")
    ok_mem = row(f"VM memory, QEMU peak RSS ({a.slurm}, {accel})", f"{m:.0f} MiB",
                 f"{vm.MEMORY_MIB} MiB (guest RAM)", f"<= {MEM_GOAL_MIB} MiB", m <= MEM_GOAL_MIB, a.smoke)
    return 0 if ok and ok_mem else 1


if __name__ == "__main__":
    sys.exit(main())
