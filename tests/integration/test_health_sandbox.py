"""The health check as Slurm's HealthCheckProgram on a real Slurm 22.05 sandbox.

Three nodes modelled on the recorded 8-GPU machine, HealthCheckInterval=2:

* n1: an XID 79 appended to its kernel log drains it with our reason within
  one interval; a new job avoids it; it resumes after two clean runs;
* n2: an admin's drain stays (reason untouched) through many of our runs;
* n3: a fault overlay makes one NVML call hang: the per-call deadline cuts
  it off well inside slurmd's 60 s kill and the node drains as gpu.nvml.
"""
from __future__ import annotations

import json
import re
import shutil
import time

import pytest

INTERVAL = 2
XID79 = "[74889.644138] NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n"
XID13 = "[74889.644138] NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=a.out, Graphics SM Warp Exception\n"


@pytest.fixture(scope="module")
def hc(make_sandbox, sandbox_dir):
    side = sandbox_dir("health-side")
    for n in ("n1", "n2", "n3"):
        (side / f"{n}.log").write_text("[    1.000000] Linux version 6.1.0 (debian-kernel@lists.debian.org)\n")
        (side / f"{n}.overlay.json").write_text("{}\n")
    cluster = make_sandbox(
        nodes=3, health=True, health_interval=INTERVAL,
        extra_config={"health": {"kernel_log": f"{side}/%n.log", "nvml_overlay": f"{side}/%n.overlay.json",
                                 "clean_runs_to_resume": 2, "nvml_call_timeout": 1.0,
                                 "watchdog_seconds": 15.0}})
    cluster.side = side
    yield cluster
    shutil.rmtree(side, ignore_errors=True)


def reason(cluster, node: str) -> str:
    res = cluster.run(["scontrol", "show", "node", "-o", node], timeout=10)
    m = re.search(r" Reason=(.*?)(?: \[[^\]]*@[^\]]*\])?\s*$", res.stdout)
    return m.group(1) if m else ""


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"not {what} after {timeout} s")


# A 79 by every route a job user has into a kernel log (issue 10): none is the kernel's own line.
FORGED = (
    "Aug 30 11:43:09 n1 alice: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n"     # logger
    "14,1188,812401212,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n"           # /dev/kmsg write
    "[74889.7] NVRM: API mismatch: the client has the version NVRM: Xid (PCI:0000:18:00): 79, x, but\n"
    "[74889.8] NVRM: API mismatch: the client has the version 1\n"
    "              NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus., but\n"        # echoed newline
    "[74889.9] a.out[7]: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n"
)


def test_xid79_drains_with_our_reason_jobs_avoid_it_and_it_resumes(hc):
    # Healthy first: application XIDs and forged 79s on the log never drain.
    with open(hc.side / "n1.log", "a") as f:
        f.write(XID13 * 5 + FORGED)
    time.sleep(2 * INTERVAL + 1)
    assert hc.node_states()["n1"] in ("idle", "mixed", "allocated")
    with open(hc.side / "n1.log", "a") as f:
        f.write(XID79)
    t = time.monotonic()
    hc.wait_node_state("n1", re.compile(r"drain(ed|ing)"), timeout=INTERVAL + 3)
    took = time.monotonic() - t
    r = reason(hc, "n1")
    assert r.startswith("slurm-gpu: gpu.xid: Xid 79 on 0000:18:00.0"), r
    assert took <= INTERVAL + 3
    # New jobs avoid the drained node.
    jobs = [hc.sbatch("-N1", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 0.2") for _ in range(3)]
    for j in jobs:
        info = hc.wait_job(j, timeout=30)
        assert info["JobState"] == "COMPLETED" and info["NodeList"] != "n1", info
    # The event counted once: clean runs follow and the node comes back.
    hc.wait_node_state("n1", "idle", timeout=4 * INTERVAL + 6)
    assert reason(hc, "n1") == ""
    state = json.loads((hc.dir / "var" / "n1" / "health-state.n1.json").read_text())
    assert state["memory"]["drained_reason"] is None


def test_admin_drain_stays_drained(hc):
    hc.run(["scontrol", "update", "nodename=n2", "state=drain", "reason=admin: swapping a fan"], timeout=10)
    with open(hc.side / "n2.log", "a") as f:
        f.write(XID79)                       # even our own fault must not touch their reason
    time.sleep(4 * INTERVAL + 1)
    assert hc.node_states()["n2"].startswith("drain")
    assert reason(hc, "n2") == "admin: swapping a fan"
    hc.run(["scontrol", "update", "nodename=n2", "state=resume"], timeout=10)
    # The 79 the events found while someone else held the node stays owed: a
    # resume proves nothing was fixed, and a user can provoke Slurm's own
    # drains ("Kill task failed") to make a real fault go unseen.  Once their
    # drain is lifted ours is made, and clean runs bring the node back.
    hc.wait_node_state("n2", re.compile(r"drain(ed|ing)"), timeout=3 * INTERVAL + 4)
    r = reason(hc, "n2")
    assert r.startswith("slurm-gpu: gpu.xid: Xid 79 on 0000:18:00.0"), r
    hc.wait_node_state("n2", "idle", timeout=4 * INTERVAL + 6)
    assert reason(hc, "n2") == ""


def test_hung_nvml_call_is_cut_off_and_drains(hc):
    (hc.side / "n3.overlay.json").write_text(json.dumps(
        {"calls": [{"fn": "nvmlDeviceGetTotalEccErrors", "gpu": 2, "hang": 120}]}))
    hc.wait_node_state("n3", re.compile(r"drain(ed|ing)"), timeout=3 * INTERVAL + 4)
    r = reason(hc, "n3")
    assert r.startswith("slurm-gpu: gpu.nvml: NVML hung: nvmlDeviceGetTotalEccErrors gave no answer in 1 s"), r
    # slurmd never had to kill the check: no "killed by signal" in its log
    assert "health_check killed" not in hc.log("n3")
    (hc.side / "n3.overlay.json").write_text("{}\n")
    hc.wait_node_state("n3", "idle", timeout=4 * INTERVAL + 6)
