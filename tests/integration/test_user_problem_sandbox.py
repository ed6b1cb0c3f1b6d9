"""A job's leftovers on a real Slurm 22.05 sandbox: drained apart from node faults, resumed once clean.

One node modelled on ``mini-2numa``; NVML is the project's simulator, whose
process list is what NVML would list: a live pid given a context on a GPU
(here by the test, as the job's cuInit would on a real GPU).  The job starts
a process that escapes its process tracking (``setsid``) and leaves it
behind; the epilog finds it on the job's GPU and drains the node with a
``slurm-gpu: user-problem:`` reason; the HealthCheckProgram resumes the node
on its first run after the process is gone.
"""
from __future__ import annotations

import os
import re
import signal
import time

import pytest

from sandboxlib import REPO, Cluster

MACHINE = REPO / "tests" / "data" / "machines" / "mini-2numa"
INTERVAL = 2


@pytest.fixture(scope="module")
def cluster(make_sandbox, job_users, node_files) -> Cluster:
    log = node_files["dir"] / "kern.log"
    log.write_text("[    1.000000] Linux version 6.1.0 (debian-kernel@lists.debian.org)\n")
    return make_sandbox(machine=str(MACHINE), prolog=True, health=True, health_interval=INTERVAL,
                        extra_config={"node": {"nvml": f"sim:{node_files['sim']}"},
                                      "mps": {"control": str(node_files["ctl"]),
                                              "base_dir": str(node_files["mps"])},
                                      "health": {"kernel_log": str(log), "clean_runs_to_resume": 3},
                                      "repair": {"user_problem": True}})


def _reason(cluster: Cluster) -> str:
    res = cluster.run(["scontrol", "show", "node", "-o", "n1"], timeout=10)
    m = re.search(r" Reason=(.*?)(?: \[[^\]]*@[^\]]*\])?\s*$", res.stdout)
    return m.group(1) if m else ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_job_leaving_a_process_on_its_gpu_drains_as_user_problem_and_resumes(cluster: Cluster,
                                                                               node_files) -> None:
    from slurm_gpu_devkit.sim import open_sim
    from slurm_gpu_devkit.sim.nvml import add_process
    out = cluster.user_dir("sgtest1") / "left.out"
    script = cluster.user_dir("sgtest1") / "left.sh"
    script.write_text("#!/bin/sh\n"
                      "setsid sleep 300 </dev/null >/dev/null 2>&1 &\n"
                      "echo PID=$! GPUS=$CUDA_VISIBLE_DEVICES JOBGPUS=$SLURM_JOB_GPUS\n"
                      "sleep 4\n")
    script.chmod(0o755)
    jobid = cluster.sbatch("--gres=gpu:1", "-o", str(out), str(script), user="sgtest1",
                           cwd=str(out.parent))
    deadline = time.monotonic() + 20
    while "PID=" not in (out.read_text() if out.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.1)
    m = re.search(r"PID=(\d+) GPUS=\S* JOBGPUS=(\d+)", out.read_text())
    assert m, out.read_text()
    pid, index = int(m.group(1)), int(m.group(2))
    try:
        # What cuInit does on a real GPU: the process now has a context on the job's GPU.
        add_process(open_sim(str(node_files["sim"])), index, pid, 300)
        cluster.wait_job(jobid, timeout=30)
        assert _alive(pid), "the left-behind process was killed by the job's end"
        cluster.wait_node_state("n1", re.compile(r"drain(ed|ing)?"), timeout=15)
        r = _reason(cluster)
        assert r.startswith(f"slurm-gpu: user-problem: job {jobid} left process {pid} on GPU"), r
        # While the process lives, the health check keeps the node drained.
        time.sleep(3 * INTERVAL + 1)
        assert "drain" in cluster.node_states()["n1"] and _reason(cluster) == r
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Gone: the first clean health run resumes the node (not the three a node fault needs).
    cluster.wait_node_state("n1", "idle", timeout=3 * INTERVAL + 6)
    assert _reason(cluster) == ""
