"""Issue 24 §1 and issue 23 #5 end to end: a job user cannot drain a node through --gpu-mps.

A real Slurm sandbox (one node modelled on ``mini-2numa``, the NVML simulator)
with NVIDIA's real ``nvidia-cuda-mps-control``.  The hostile user is
``sgtest1`` with a process of its own on the node, outside any job (as one
from an earlier job, or an ssh session, would be): it moves the daemon's
sockets away as they appear.  A mount in the job's MPS directory (FUSE in
real life; tmpfs, made as root, here), a missing binary and ``[mps] enabled
= false`` follow.  In every case the job fails or runs, and the node is
never drained and keeps nothing of the job.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from sandboxlib import REPO, Cluster

MACHINE = REPO / "tests" / "data" / "machines" / "mini-2numa"
UP = re.compile("idle|mixed|allocated|completing")

# Moves every control/control_privileged under <base>/*/pipe away the moment it
# appears (what reproduced the drain 5 times out of 5 on the old code).
RENAMER = r"""
import os, sys
base = sys.argv[1]
print("ready", flush=True)
while True:
    try:
        jobs = os.listdir(base)
    except OSError:
        continue
    for j in jobs:
        for n in ("control", "control_privileged"):
            p = os.path.join(base, j, "pipe", n)
            try:
                os.rename(p, p + ".moved")
            except OSError:
                pass
"""


@pytest.fixture(scope="module")
def cluster(make_sandbox, job_users, node_files) -> Cluster:
    return make_sandbox(machine=str(MACHINE), spank=True, prolog=True, extra_config={
        "node": {"nvml": f"sim:{node_files['sim']}"},
        "mps": {"control": str(node_files["ctl"]), "base_dir": str(node_files["mps"]),
                "start_timeout": 3.0, "quit_timeout": 2.0},
        "jobs": {"epilog_kill_wait": 1.0},
        "spank": {"numa_node_map": {"1": 0}}})


def _leftovers(node_files) -> list[str]:
    from slurm_gpu.jobs.mps import daemon_pids
    out = [f"mps dir {p.name}" for p in node_files["mps"].iterdir()]
    for p in node_files["mps"].glob("*/pipe"):
        out += [f"daemon {pid}" for pid in daemon_pids(p)]
    with open("/proc/self/mountinfo") as f:
        out += [f"mount {ln.split()[4]}" for ln in f if str(node_files["mps"]) in ln.split()[4]]
    return out


def _settle(cluster: Cluster, node_files) -> None:
    """The node goes back to work with nothing of the job left: never drained."""
    node = cluster.nodes[0]
    cluster.wait_node_state(node, re.compile("idle|mixed"), timeout=30)
    deadline = time.monotonic() + 20
    while _leftovers(node_files) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers(node_files) == []
    assert "drain" not in cluster.node_states()[node], cluster.node(node).get("Reason")


def test_renamed_sockets_never_drain_the_node(cluster: Cluster, node_files) -> None:
    renamer = subprocess.Popen([sys.executable, "-I", "-c", RENAMER, str(node_files["mps"])],
                               user="sgtest1", stdout=subprocess.PIPE, text=True, env={})
    outcomes: list[str] = []
    try:
        assert renamer.stdout.readline().strip() == "ready"
        for _ in range(3):
            res = cluster.srun("--gres=gpu:1", "-w", cluster.nodes[0], "--gpu-mps=default", "true",
                               user="sgtest1")
            if res.returncode == 0:
                outcomes.append("ran")          # the client won the race: the job ran
            else:
                lines = [ln for ln in res.stderr.splitlines() if "slurm-gpu:" in ln]
                assert lines and "its sockets are gone" in lines[0], res.stderr
                outcomes.append("failed")
            _settle(cluster, node_files)
    finally:
        renamer.kill()
        renamer.wait()
    print(f"\nrenamed sockets: {outcomes}")
    assert "failed" in outcomes              # the attack did happen


def test_mount_in_the_pipe_directory_never_drains_the_node(cluster: Cluster, node_files) -> None:
    d = cluster.user_dir("sgtest1")
    script = d / "wait.sh"
    script.write_text("#!/bin/sh\nsleep 120\n")
    script.chmod(0o755)
    jid = cluster.sbatch("--gres=gpu:1", "--gpu-mps=default", "-o", "/dev/null", str(script),
                         user="sgtest1", cwd=str(d))
    cluster.wait_job(jid, states={"RUNNING"}, timeout=60)
    pipe = node_files["mps"] / str(jid) / "pipe"
    deadline = time.monotonic() + 20
    while not (pipe / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    mnt = pipe / "mnt"
    subprocess.run(["/bin/mkdir", str(mnt)], user="sgtest1", check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "sg-user-mount", str(mnt)], check=True)
    try:
        cluster.run(["scancel", str(jid)])
        cluster.wait_job(jid, timeout=60)
        _settle(cluster, node_files)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("change,line", [
    ({"control": "/nonexistent/nvidia-cuda-mps-control"},
     "slurm-gpu: --gpu-mps: this node has no MPS control binary (/nonexistent/nvidia-cuda-mps-control)"),
    ({"enabled": "false"}, "slurm-gpu: --gpu-mps is disabled on this cluster ([mps] enabled)"),
])
def test_no_mps_here_fails_the_job_with_one_line(cluster: Cluster, node_files, change, line) -> None:
    conf = cluster.dir / "etc" / "slurm-gpu.toml"
    before = conf.read_text()
    text = before
    for k, v in change.items():
        value = v if v == "false" else f'"{v}"'
        text = re.sub(rf"(?m)^{k} = .*$", f"{k} = {value}", text) if re.search(rf"(?m)^{k} = ", text) \
            else text.replace("[mps]\n", f"[mps]\n{k} = {value}\n", 1)
    conf.write_text(text)
    try:
        res = cluster.srun("--gres=gpu:1", "-w", cluster.nodes[0], "--gpu-mps=50", "true",
                           user="sgtest1")
        assert res.returncode != 0
        lines = [ln for ln in res.stderr.splitlines() if "slurm-gpu:" in ln]
        assert lines and lines[0].endswith(line.removeprefix("slurm-gpu: ")), res.stderr
        _settle(cluster, node_files)
    finally:
        conf.write_text(before)
