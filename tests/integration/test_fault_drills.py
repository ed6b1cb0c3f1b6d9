"""Every named fault drill on a real Slurm: `sandbox fault NODE NAME` drains the
node with the reason the drill documents (docs/health.md), a drill that must
not drain leaves it up, and `--clear` lets the health check resume it."""
from __future__ import annotations

import json
import re
import time

import pytest

from slurm_gpu_devkit.sim import drills

pytestmark = pytest.mark.integration

INTERVAL = 2
NODES = ("n1", "n2", "n3", "n4")


@pytest.fixture(scope="module")
def sb(make_sandbox):
    return make_sandbox(nodes=len(NODES), health=True, health_interval=INTERVAL, simulate=True,
                        extra_config={"health": {"clean_runs_to_resume": 2}})


def reason(cluster, node: str) -> str:
    res = cluster.run(["scontrol", "show", "node", "-o", node], timeout=10)
    m = re.search(r" Reason=(.*?)(?: \[[^\]]*@[^\]]*\])?\s*$", res.stdout)
    return m.group(1) if m else ""


def bus_of(cluster, node: str, gpu: int) -> str:
    facts = json.loads((cluster.dir / "var" / node / "sim.json").read_text())["facts"]
    return drills.gpu_bus(facts, gpu)


def test_every_drill_drains_with_its_documented_reason_and_resumes_when_cleared(sb, cli):
    facts = json.loads((sb.dir / "var" / "n1" / "sim.json").read_text())["facts"]
    names = [n for n, d in drills.DRILLS.items() if d.applies(facts, 1) is None]   # fabric-clique-lost: GB200 only
    assert {"nvlink-downtrained", "fabricmanager-down", "ib-port-down", "ib-errors-rising"} <= set(names)
    for start in range(0, len(names), len(NODES)):
        batch = list(zip(NODES, names[start:start + len(NODES)]))
        for node, name in batch:
            res = cli("sandbox", "fault", "--dir", str(sb.dir), node, name, "--gpu", "1")
            assert res.returncode == 0, res.stderr
            assert res.stderr.startswith(f"slurm-gpu: sandbox fault: {name} on {node} GPU 1 ("), res.stderr
        for node, name in batch:
            d = drills.DRILLS[name]
            if d.drains:
                # A debounced fault drains at its d.runs-th health check.
                sb.wait_node_state(node, re.compile(r"drain(ed|ing)"), timeout=(2 + d.runs) * INTERVAL + 6)
                got = reason(sb, node)
                assert d.matches(got, bus_of(sb, node, 1), 1), (name, got)
        time.sleep(2 * INTERVAL + 1)
        for node, name in batch:
            if not drills.DRILLS[name].drains:
                assert not sb.node_states()[node].startswith("drain"), (name, reason(sb, node))
        for node, _ in batch:
            res = cli("sandbox", "fault", "--dir", str(sb.dir), node, "--clear")
            assert res.returncode == 0, res.stderr
        for node, name in batch:
            sb.wait_node_state(node, "idle", timeout=6 * INTERVAL + 8)
            assert reason(sb, node) == "", name


@pytest.fixture(scope="module")
def slow(make_sandbox):
    """Slurm's own health check every 300 s, as sites run it: only xid-watch can drain in time."""
    return make_sandbox(nodes=2, health=True, health_interval=300, simulate=True)


def test_a_fault_drains_through_xid_watch_long_before_the_health_interval(slow, cli):
    names = {d["name"] for d in slow.sb.status()["daemons"] if d["alive"]}
    assert {"xid-watch:n1", "xid-watch:n2"} <= names          # the node services run beside slurmd
    res = cli("sandbox", "fault", "--dir", str(slow.dir), "n2", "xid-79")
    assert res.returncode == 0, res.stderr
    slow.wait_node_state("n2", re.compile(r"drain(ed|ing)"), timeout=30)   # HealthCheckInterval is 300 s
    got = reason(slow, "n2")
    assert drills.DRILLS["xid-79"].matches(got, bus_of(slow, "n2", 0), 0), got
    assert slow.node_states()["n1"] == "idle"
    log = (slow.dir / "log" / "xid-watch-n2.log").read_text()
    # Whichever half xid-watch heard first (the kernel line or NVML's event) ran the check.
    assert re.search(r"(NVML event|kernel log): gpu\.xid: Xid 79 on \S+: GPU has fallen off the bus: "
                     r"running the health check now", log), log
    # A contained Xid 94 runs nothing and drains nothing.
    res = cli("sandbox", "fault", "--dir", str(slow.dir), "n1", "xid-94")
    assert res.returncode == 0, res.stderr
    time.sleep(3)
    assert slow.node_states()["n1"] == "idle"
    assert "running the health check" not in (slow.dir / "log" / "xid-watch-n1.log").read_text()


def test_a_requeueable_job_on_the_faulty_gpu_runs_again_on_a_healthy_node(slow, cli, job_users):
    """[health] on_fatal = "requeue" (the default): the job holding the GPU that fell off the bus is
    requeued and released at once (not after Slurm's 121 s requeue delay); the job on another GPU of
    the same node is left alone."""
    from slurm_gpu.health.watch import _Gap
    for node in ("n1", "n2"):
        assert cli("sandbox", "fault", "--dir", str(slow.dir), node, "--clear").returncode == 0
    # A fault just before (the test above) may still owe xid-watch's coalesced run at
    # the end of its 5 s gap (the fault's other half): it would drain the node again.
    time.sleep(_Gap.MIN_GAP + 1)
    for node in ("n1", "n2"):
        slow.run(["scontrol", "update", f"nodename={node}", "state=resume"])
    for node in ("n1", "n2"):
        slow.wait_node_state(node, "idle", timeout=30)
    slow.run(["scontrol", "update", "nodename=n2", "state=drain", "reason=test: n1 first"])
    hit = slow.sbatch("--requeue", "--gres=gpu:1", "--wrap", "sleep 600", user="sgtest1", cwd="/tmp")
    other = slow.sbatch("--requeue", "--gres=gpu:1", "--wrap", "sleep 600", user="sgtest1", cwd="/tmp")
    # A job on another GPU whose name and output path spell Slurm's own fields (every GPU of n1,
    # Restarts=0): scontrol prints them unquoted, and read as Slurm's they made on_fatal requeue it.
    spelt = slow.sbatch("--requeue", "--gres=gpu:1", "-J", "x Restarts=0 JobState=RUNNING",
                        "-o", "/tmp/o Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu(IDX:0-7) MinCPUsNode=1.out",
                        "--wrap", "sleep 600", user="sgtest1", cwd="/tmp")
    try:
        for j in (hit, other, spelt):
            assert slow.wait_job(j, states={"RUNNING"}, timeout=30)["NodeList"] == "n1"
        slow.run(["scontrol", "update", "nodename=n2", "state=resume"])
        slow.wait_node_state("n2", "idle", timeout=30)
        detail = slow.run(["scontrol", "-d", "show", "job", "-o", str(hit)]).stdout
        gpu = int(re.search(r"GRES=gpu:\S*\(IDX:(\d+)\)", detail).group(1))
        res = cli("sandbox", "fault", "--dir", str(slow.dir), "n1", "xid-79", "--gpu", str(gpu))
        assert res.returncode == 0, res.stderr
        deadline = time.monotonic() + 30                     # the goal; HealthCheckInterval is 300 s
        while not (slow.job(hit).get("JobState") == "RUNNING" and slow.job(hit).get("NodeList") == "n2"):
            if time.monotonic() > deadline:
                j = slow.job(hit)
                log = (slow.dir / "log" / "xid-watch-n1.log").read_text().splitlines()
                pytest.fail(f"job {hit}: {j.get('JobState')} {j.get('Reason')} on {j.get('NodeList')!r}, "
                            f"restarts {j.get('Restarts')}; xid-watch n1: {[ln for ln in log if 'health' in ln][-8:]}")
            time.sleep(0.1)
        info = slow.job(hit)
        assert info["Restarts"] == "1"
        assert re.search(r"AdminComment=slurm-gpu: Xid 79 on GPU \S+ of n1: requeued", slow.run(
            ["scontrol", "show", "job", "-o", str(hit)]).stdout)
        for j in (other, spelt):
            info = slow.job(j)
            assert (info["JobState"], info["NodeList"], info["Restarts"]) == ("RUNNING", "n1", "0"), (
                j, "spelt" if j == spelt else "other", slow.run(["scontrol", "-d", "show", "job", "-o", str(j)]).stdout,
                (slow.dir / "log" / "xid-watch-n1.log").read_text()[-3000:])
    finally:
        slow.run(["scancel", str(hit), str(other), str(spelt)])
