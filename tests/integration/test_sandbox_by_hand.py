"""A sandbox started by hand models the whole machine.

An admin runs the installed ``slurm-gpu sandbox up --machine h100-mig`` from
any directory (here ``/``, no checkout in sight), with no config of their
own.  The recorded machine must come from the installed package, and each
node must get the NVML simulator and NVIDIA's MPS control daemon, so that
``--gpu-mps`` and ``--gpu-mig`` jobs run and the prolog, epilog and health
check (every second here) drain nothing.  Before this, the prolog failed
with "NVML unavailable" and drained the node, and outside a checkout the
machine name was "unknown".
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from sandboxlib import ensure_user
from slurm_gpu.runner import SAFE_PATH, Completed, RunAs, run
from slurm_gpu_devkit.sandbox.install import DEFAULT_VENV

CLI = DEFAULT_VENV / "bin" / "slurm-gpu"


def _cli(*args: str, timeout: float = 120) -> Completed:
    # Only what a root shell has: no PYTHONPATH, no checkout as cwd.
    return run([str(CLI), *args], timeout=timeout, check=False, cwd="/",
               env={"PATH": SAFE_PATH, "SLURM_GPU_VENV": str(DEFAULT_VENV)})


@pytest.fixture(scope="module")
def by_hand(sandbox_dir, job_users):
    if not CLI.exists():
        pytest.fail(f"slurm-gpu is not installed in {DEFAULT_VENV} (make install)")
    d = sandbox_dir("by-hand")
    # With accounting on, as docs/sandbox.md's demo: the node services then
    # include the sampler (every 0.5 s here).
    res = _cli("sandbox", "up", "--dir", str(d), "--nodes", "2", "--machine", "h100-mig",
               "--health-interval", "1", "--accounting", "--set", "acct.enabled=true",
               "--set", "acct.interval=0.5")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"export SLURM_CONF={d}/etc/slurm.conf"
    try:
        yield d
    finally:
        down = _cli("sandbox", "down", "--dir", str(d))
        assert down.returncode == 0, down.stderr


def _as_user(d: Path, argv: list[str], timeout: float = 60) -> Completed:
    pw = ensure_user("sgtest1")
    env = {"PATH": SAFE_PATH, "SLURM_CONF": f"{d}/etc/slurm.conf", "HOME": pw.pw_dir,
           "USER": "sgtest1"}
    return run(argv, timeout=timeout, check=False, env=env, cwd=pw.pw_dir,
               run_as=RunAs(pw.pw_uid, pw.pw_gid, (pw.pw_gid,)))


def _states(d: Path) -> dict[str, str]:
    res = run(["sinfo", "-h", "-N", "-o", "%N %T %E"], timeout=10, check=False,
              env={"PATH": SAFE_PATH, "SLURM_CONF": f"{d}/etc/slurm.conf"})
    out = {}
    for line in res.stdout.splitlines():
        name, state, *reason = line.split(maxsplit=2)
        out[name] = f"{state} {' '.join(reason)}".strip()
    return out


def test_machine_from_the_package_and_hardware_wired_in(by_hand: Path) -> None:
    conf = (by_hand / "etc" / "slurm-gpu.toml").read_text()
    assert f'nvml = "sim:{by_hand}/var/%n/sim.json"' in conf
    assert f'control = "{by_hand}/lib/nvidia-cuda-mps-control"' in conf
    assert "site-packages/slurm_gpu_devkit/machines/h100-mig/snapshot.json" in conf
    for node in ("n1", "n2"):
        st = json.loads((by_hand / "var" / node / "sim.json").read_text())
        modes = [(g["mig"]["mode"], len(g["mig"]["instances"])) for g in st["facts"]["gpus"]]
        # GPUs 0,1 recorded with MIG off: on for per-job MIG; 2,3 keep their recorded instances.
        assert modes == [(1, 0), (1, 0), (1, 4), (1, 4)]


def test_mps_job_runs_on_each_node_and_drains_nothing(by_hand: Path) -> None:
    ctl = by_hand / "lib" / "nvidia-cuda-mps-control"
    res = _as_user(by_hand, ["srun", "-N2", "--gres=gpu:nvidia_h100_80gb_hbm3:1", "--gpu-mps=50",
                             "bash", "-c", f'echo "$SLURMD_NODENAME $CUDA_MPS_PIPE_DIRECTORY"; '
                             f'echo get_default_active_thread_percentage | {ctl}'])
    assert res.returncode == 0, res.stderr
    lines = sorted(res.stdout.split("\n"))
    pipes = [ln.split() for ln in lines if " " in ln]
    # One daemon per node, each under that node's own directory, answering with the job's 50 %.
    assert [n for n, _ in pipes] == ["n1", "n2"]
    for node, pipe in pipes:
        assert pipe.startswith(f"{by_hand}/var/{node}/mps/")
    assert [ln for ln in lines if ln.startswith("50")] != [], res.stdout


def test_mig_job_gets_its_instances_and_drains_nothing(by_hand: Path) -> None:
    res = _as_user(by_hand, ["srun", "-N1", "--gres=gpu:nvidia_h100_80gb_hbm3:1",
                             "--gpu-mig=3g.40gb,2x1g.10gb",
                             "bash", "-c", 'echo "$CUDA_VISIBLE_DEVICES"; sleep 2'])
    assert res.returncode == 0, res.stderr
    uuids = res.stdout.strip().split(",")
    assert len(uuids) == 3 and all(u.startswith("MIG-") for u in uuids), res.stdout


def test_each_node_runs_the_node_services(by_hand: Path) -> None:
    st = json.loads(_cli("sandbox", "status", "--dir", str(by_hand), "--json").stdout)
    alive = sorted(d["name"] for d in st["daemons"] if d["alive"] and ":" in d["name"]
                   and not d["name"].startswith("slurmd"))
    assert alive == ["monitor:n1", "monitor:n2", "xid-watch:n1", "xid-watch:n2"], st["daemons"]


def test_job_report_shows_a_mig_jobs_utilisation(by_hand: Path) -> None:
    res = _as_user(by_hand, ["srun", "-N1", "-w", "n2", "--gres=gpu:nvidia_h100_80gb_hbm3:1",
                             "--gpu-mig=3g.40gb,2x1g.10gb", "bash", "-c", 'echo "$SLURM_JOB_ID"; sleep 3'])
    assert res.returncode == 0, res.stderr
    jobid = res.stdout.split()[0]
    env = {"PATH": SAFE_PATH, "SLURM_CONF": f"{by_hand}/etc/slurm.conf"}
    deadline = time.monotonic() + 30
    while True:          # the epilog stores the summary through slurmdbd
        rep = run([str(CLI), "job", "report", jobid, "--json"], timeout=60, check=False, env=env, cwd="/")
        view = json.loads(rep.stdout) if rep.returncode == 0 else {}
        if view.get("devices") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert rep.returncode == 0, rep.stderr
    devs = view["devices"]
    # The job's three MIG slices, each measured by n2's sampler.
    assert len(devs) == 3 and all("/gi" in d["device"] and d["node"] == "n2" for d in devs), devs
    assert all(d["sm"] is not None and d["n"] >= 1 for d in devs), devs
    assert not [v for v in view["verdicts"] if "no utilisation measured" in v], view["verdicts"]


def test_nothing_drained_after_health_checks(by_hand: Path) -> None:
    time.sleep(3)                      # HealthCheckInterval=1: several runs after the jobs
    states = _states(by_hand)
    assert states == {"n1": "idle none", "n2": "idle none"}, states
    for node in ("n1", "n2"):
        st = json.loads((by_hand / "var" / node / "sim.json").read_text())
        # The epilog put every GPU back: no per-job instance is left.
        assert [len(g["mig"]["instances"]) for g in st["facts"]["gpus"]] == [0, 0, 4, 4]
        assert os.listdir(by_hand / "var" / node / "mps") == []


def test_a_job_user_cannot_inject_or_clear_faults(by_hand: Path) -> None:
    state = by_hand / "var" / "n1" / "sim.json"
    before = state.read_bytes()
    res = _as_user(by_hand, [str(CLI), "sandbox", "fault", "--dir", str(by_hand), "--node", "n1", "--clear"])
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "slurm-gpu: sandbox needs root (it makes device files and namespaces and runs Slurm's "
        "daemons; run it as root)"]
    assert state.read_bytes() == before


def test_user_commands_on_a_node_see_its_gpus(by_hand: Path) -> None:
    # A user's own process on a node finds the node's config, as on a real
    # node where /etc/slurm-gpu/slurm-gpu.toml is there for everyone: before,
    # only the hooks were told of it and a user's inventory saw no GPU.
    res = _as_user(by_hand, ["srun", "-N2", "bash", "-c",
                             f'{CLI} inventory --json > "$HOME/inv-$SLURMD_NODENAME.json"'])
    assert res.returncode == 0, res.stderr
    home = Path(ensure_user("sgtest1").pw_dir)
    for node in ("n1", "n2"):
        inv = json.loads((home / f"inv-{node}.json").read_text())
        assert len(inv["gpus"]) == 4, inv


def test_cluster_collect_and_check_see_the_modelled_gpus(by_hand: Path, tmp_path: Path) -> None:
    # As the README's new user: only SLURM_CONF exported, as `sandbox up` printed.
    out = tmp_path / "models"
    env = {"PATH": SAFE_PATH, "SLURM_CONF": f"{by_hand}/etc/slurm.conf"}
    res = run([str(CLI), "cluster", "collect", "-o", str(out)], timeout=120, check=False,
              env=env, cwd="/")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 GPU(s)" not in res.stdout + res.stderr
    assert (res.stdout + res.stderr).count("4 GPU(s)") == 2, res.stdout + res.stderr
    res = run([str(CLI), "cluster", "check", "--from", str(out), "--dev-dir", f"{by_hand}/dev"],
              timeout=60, check=False, env=env, cwd="/")
    assert "NVML unavailable" not in res.stdout + res.stderr, res.stdout + res.stderr
