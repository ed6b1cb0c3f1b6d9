"""Issue 24 §3 on a real Slurm: a --gpu-mig job's own instances never become the node's published model.

One node of ``mini-2numa`` (2 x H100 NVL), NVML the project's simulator with
MIG mode on and no instances (the admin's baseline), HealthCheckProgram
publishing to ``[cluster] publish_dir`` every second.  A job makes seven
``1g.12gb`` instances on its GPU; the health check runs while it does; the
published model, ``cluster render`` and ``cluster check`` must show the
baseline, not the job's layout.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from sandboxlib import REPO, Cluster
from slurm_gpu.cluster import store
from slurm_gpu_devkit.sandbox.layout import Layout

MACHINE = REPO / "tests" / "data" / "machines" / "mini-2numa"


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    from sandboxlib import mig_sim_state, new_sandbox_dir
    d = new_sandbox_dir("cluster-mig-publish")
    mig_sim_state(MACHINE, d / "sim.json")
    (d / "published").mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _instances(sim: Path) -> int:
    from slurm_gpu.hw import backend
    from slurm_gpu.mig import instances
    gpus = backend.open_gpus(backend.GpuSource("sim", str(sim)))
    return sum(len(instances.list_instances(gpus, i)) for i in (0, 1))


def _cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**cluster.env, "SLURM_GPU_CONFIG": str(Layout.of(cluster.dir).config_toml), "PYTHONPATH": str(REPO),
           "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    return subprocess.run([sys.executable, "-m", "slurm_gpu", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd="/")


def test_health_check_publishes_the_baseline_while_a_gpu_mig_job_runs(make_sandbox: Any, job_users: Any,
                                                                        shared: Path) -> None:
    pub, sim = shared / "published", shared / "sim.json"
    cluster = make_sandbox(machine=str(MACHINE), spank=True, prolog=True, health=True, health_interval=1,
                           extra_config={
                               "node": {"nvml": f"sim:{sim}"},
                               "health": {"kernel_log": "/dev/null",
                                          "skip": ["os.thp", "os.swappiness", "os.governor", "os.memlock",
                                                   "os.persistenced"]},
                               "cluster": {"publish_dir": str(pub)}})
    node = cluster.nodes[0]
    published = pub / f"{node}.json"
    health_state = cluster.dir / "var" / node / f"health-state.{node}.json"
    _wait(published.exists, 60, "the node's first publication")
    base = store.load_dir(str(pub)).nodes[node]
    assert [(g.mig_enabled, g.mig_instances) for g in base.gpus] == [(True, ())] * 2

    out = cluster.user_dir("sgtest1") / "mig.out"
    jobid = cluster.sbatch("--gres=gpu:1", "--gpu-mig=7x1g.12gb", "-o", str(out), "--wrap", "sleep 60",
                           user="sgtest1", cwd=str(out.parent))
    try:
        cluster.wait_job(jobid, states={"RUNNING"})
        _wait(lambda: _instances(sim) == 7, 30, "the job's seven MIG instances")
        made = time.time_ns()
        # Two health runs that started after the instances existed.
        _wait(lambda: health_state.stat().st_mtime_ns > made + 2_500_000_000, 60, "health runs during the job")
        assert _instances(sim) == 7, "the job ended before the health check ran"
        col = store.load_dir(str(pub))
        assert not col.bad
        assert [(g.mig_enabled, g.mig_instances) for g in col.nodes[node].gpus] == [(True, ())] * 2
        render = _cli(cluster, "cluster", "render", "--from", str(pub))
        assert render.returncode == 0, render.stderr
        assert "1g.12gb" not in render.stdout and f"NodeName={node} Name=gpu Type=nvidia_h100_nvl" in render.stdout
        check = _cli(cluster, "cluster", "check", "--from", str(pub), "--dev-dir", str(cluster.dir / "dev"))
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        cluster.run(["scancel", str(jobid)])
        cluster.wait_job(jobid)
    _wait(lambda: _instances(sim) == 0, 30, "the epilog to remove the job's instances")
