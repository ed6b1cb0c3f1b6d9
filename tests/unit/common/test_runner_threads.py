"""The health check drains while another thread is stuck in a C call (issue 25 §3).

The health check leaves a thread hung inside libnvidia-ml by design (its
watchdog gives up on it), then calls ``scontrol`` through the runner.  A
runner that runs Python between ``fork`` and ``exec`` (``os.fork`` takes the
import lock and runs every at-fork hook first) waits forever for a lock the
stuck thread holds; ``subprocess`` without ``preexec_fn`` takes none.  Each
case runs in its own interpreter so that a hang is a failed test, not a
hung suite.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

IDLE = ROOT / "tests" / "data" / "xid" / "scontrol" / "idle.txt"

# The stuck thread: a ctypes call (as pynvml's are) that never returns,
# entered while holding the lock named by sys.argv[1].
_CODE = r"""
import ctypes, os, sys, threading
sys.path.insert(0, sys.argv[3])
import logging
from slurm_gpu import slurmclient
from slurm_gpu.health import actions
from slurm_gpu.health.nodestate import Memory
slurmclient.SEARCH_DIRS = (sys.argv[2],)
r, w = os.pipe()
held = threading.Event()
def stuck():
    if sys.argv[1] == "import":
        import _imp
        _imp.acquire_lock()
    else:
        logging._lock.acquire()
    held.set()
    buf = ctypes.create_string_buffer(1)
    ctypes.CDLL(None).read(r, buf, 1)      # like nvmlInit hung in the driver
threading.Thread(target=stuck, daemon=True).start()
held.wait()
out = actions.act("n1", "slurm-gpu: gpu.xid: Xid 79", Memory(), clean_runs_to_resume=3, timeout=20)
print("ACTION", out.plan.action, out.error)
sys.stdout.flush()
os._exit(0)     # the stuck thread never ends
"""


@pytest.mark.parametrize("lock", ["import", "logging"])
def test_drain_while_a_thread_is_stuck_in_a_c_call_holding_a_lock(tmp_path: Path, lock: str) -> None:
    log = tmp_path / "updates"
    fake = tmp_path / "scontrol"
    # scontrol stand-in: `show node` answers a recorded idle node, `update` is logged
    fake.write_text(f'#!/bin/sh\nif [ "$1" = show ]; then cat {IDLE}; else echo "$@" >> {log}; fi\n')
    fake.chmod(0o755)
    try:
        p = subprocess.run([sys.executable, "-c", _CODE, lock, str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the drain hung behind the {lock} lock held by a stuck thread")
    assert p.returncode == 0, p.stderr
    assert "ACTION drain None" in p.stdout, p.stdout + p.stderr
    assert log.read_text() == "update nodename=n1 state=drain reason=slurm-gpu: gpu.xid: Xid 79\n"


def test_no_python_between_fork_and_exec_in_the_runtime() -> None:
    """Every command goes through the runner (subprocess, no preexec_fn); the
    development kit (devkit/: simulator, sandbox) is not the runtime."""
    found = []
    for path in (ROOT / "slurm_gpu").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if "os.fork(" in code or "preexec_fn=" in code or "os.forkpty(" in code:
                found.append(f"{path.relative_to(ROOT)}:{n}")
    assert found == []
