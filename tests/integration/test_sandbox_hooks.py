"""The sandbox wires the project's own prolog/epilog, health check and SPANK plugin."""
from __future__ import annotations

import os
import time

import pytest


@pytest.fixture(scope="module")
def cluster(make_sandbox, job_users):
    return make_sandbox(nodes=2, prolog=True, health=True, spank=True, health_interval=1)


def conf_value(cluster, key: str) -> str:
    res = cluster.run(["scontrol", "show", "config"])
    assert res.returncode == 0, res.stderr
    for line in res.stdout.splitlines():
        k, _, v = line.partition("=")
        # Slurm >= 24.11 lists Prolog/Epilog as Prolog[0], Prolog[1]...
        if k.strip() in (key, f"{key}[0]"):
            return v.strip()
    raise AssertionError(f"{key} not in scontrol show config")


def test_slurmctld_runs_with_our_hooks(cluster):
    etc = cluster.dir / "etc"
    assert conf_value(cluster, "Prolog") == f"{etc}/prolog.d/*"
    assert conf_value(cluster, "Epilog") == f"{etc}/epilog.d/*"
    assert conf_value(cluster, "PrologFlags") == "Alloc"
    assert conf_value(cluster, "HealthCheckProgram") == f"{etc}/healthcheck"
    assert conf_value(cluster, "HealthCheckInterval") == "1 sec"
    assert (etc / "plugstack.conf").read_text().splitlines()[-1] == (
        f"required {cluster.dir}/lib/slurm_gpu_spank.so config={etc}/slurm-gpu.toml")


def test_hook_wrappers_carry_the_sandbox_environment(cluster):
    from slurm_gpu_devkit.sandbox.install import scripts
    etc = cluster.dir / "etc"
    for kind in ("prolog.d", "epilog.d"):
        names = sorted(p.name for p in (etc / kind).iterdir())
        assert names == [p.name for p in scripts(kind)] and names
    for w in [*(etc / "prolog.d").iterdir(), etc / "healthcheck"]:
        text = w.read_text()
        assert os.access(w, os.X_OK)
        assert f"SLURM_CONF={etc}/slurm.conf" in text
        assert f"SLURM_GPU_CONFIG={etc}/slurm-gpu.toml" in text
        assert "PATH=/usr/sbin:/usr/bin:/sbin:/bin" in text


def test_health_check_runs_as_slurmd_runs_it(cluster):
    # slurmd gives HealthCheckProgram only SLURMD_NODENAME: the wrapper supplies the rest,
    # so the check finds the sandbox's config and writes its state under [node] state_dir.
    state = cluster.dir / "var" / "n2" / "health-state.n2.json"   # per node: docs/health.md
    deadline = time.monotonic() + 15
    while not state.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state.exists(), cluster.log("n2")[-2000:]
    res = cluster.run([str(cluster.dir / "etc" / "healthcheck")], env={"SLURMD_NODENAME": "n1"})
    assert res.returncode == 0, res.stderr
    assert cluster.node_states() == {"n1": "idle", "n2": "idle"}


def test_jobs_run_through_prolog_epilog_and_plugin(cluster):
    help_text = cluster.run(["srun", "--help"]).stdout
    assert "--gpu-numa-bind" in help_text
    res = cluster.srun("-N2", "--gres=gpu:2", "sh", "-c", "echo $(id -un) $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES",
                       user="sgtest1")
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["sgtest1 n1 0,1", "sgtest1 n2 0,1"]
    # A failing prolog would have drained the node ("Prolog error").
    for n in cluster.nodes:
        cluster.wait_node_state(n, "idle")
