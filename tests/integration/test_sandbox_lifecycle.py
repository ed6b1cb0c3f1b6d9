"""Starting and stopping sandboxes: nothing left behind, clear errors, namespaces."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu_devkit.sandbox import Sandbox, SandboxOptions
from slurm_gpu_devkit.sandbox import procs, registry



def pids_mentioning(path: Path) -> list[int]:
    """What ``pgrep -f PATH`` finds, minus this process."""
    import subprocess
    res = subprocess.run(["pgrep", "-f", str(path)], capture_output=True, text=True)
    return [int(p) for p in res.stdout.split() if int(p) != os.getpid()]


def recorded(sb: Sandbox) -> list[procs.Proc]:
    return [procs.Proc.from_dict(d) for d in sb.state["daemons"]]


def test_down_leaves_no_process_even_with_running_jobs(make_sandbox):
    c = make_sandbox(nodes=2)
    daemons = recorded(c.sb)
    assert {d.name for d in daemons} == {"munged", "slurmctld", "slurmd:n1", "slurmd:n2"}
    ports = c.sb.state["reservations"]["ports"]
    # A batch job and a step that would outlive their slurmd if nobody cleaned up.
    jobid = c.sbatch("-N2", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "srun sleep 300")
    c.wait_job(jobid, states={"RUNNING"})
    deadline = time.monotonic() + 10
    while not procs.touching(c.dir) - {d.pid for d in daemons} and time.monotonic() < deadline:
        time.sleep(0.1)
    stepds = procs.touching(c.dir) - {d.pid for d in daemons}
    assert stepds, "no slurmstepd found for the running job"

    c.sb.down()

    assert not [d for d in daemons if procs.alive(d)]
    assert not [p for p in stepds if os.path.exists(f"/proc/{p}")
                and open(f"/proc/{p}/stat").read().split()[2] != "Z"]
    assert pids_mentioning(c.dir) == []
    assert procs.touching(c.dir) == set()
    for port in ports:
        assert not (registry.REGISTRY / "ports" / str(port)).exists()
    state = json.loads((c.dir / "run" / "sandbox.json").read_text())
    assert state["down"] is True and state["daemons"] == []
    # down is idempotent.
    c.sb.down()


def test_failed_start_cleans_up_and_names_the_log(sandbox_dir, default_machine):
    d = sandbox_dir("failstart")
    sb = Sandbox(d, SandboxOptions(nodes=1, machine=default_machine,
                                   slurm_conf={"SelectType": "select/nonexistent"}, timeout=10))
    with pytest.raises(SlurmGpuError) as e:
        sb.up()
    msg = e.value.line()
    assert msg.startswith("slurm-gpu: sandbox: ")
    assert "slurmctld" in msg
    assert pids_mentioning(d) == []
    assert not [p for p in recorded(sb) if procs.alive(p)]


def test_two_sandboxes_at_once_do_not_collide(make_sandbox):
    a = make_sandbox(nodes=1)
    b = make_sandbox(nodes=1)
    assert a.sb.state["cluster"] != b.sb.state["cluster"]
    assert not set(a.sb.state["reservations"]["ports"]) & set(b.sb.state["reservations"]["ports"])
    for c in (a, b):
        res = c.srun("--gres=gpu:1", "sh", "-c", "echo $SLURM_CLUSTER_NAME")
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == c.sb.state["cluster"]


def test_netns_nodes_have_own_hostname_and_address(make_sandbox):
    c = make_sandbox(nodes=2, netns=True)
    nets = c.sb.state["netns"]
    assert [n["node"] for n in nets] == ["n1", "n2"]
    res = c.srun("-N2", "--gres=gpu:1", "sh", "-c", "echo $(hostname) $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES")
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["n1 n1 0", "n2 n2 0"]
    assert c.node("n2")["NodeAddr"] == nets[1]["node_addr"]
    names = [n["netns"] for n in nets]
    veths = [n["veth_host"] for n in nets]
    assert all(os.path.exists(f"/run/netns/{n}") for n in names)

    c.sb.down()

    assert not any(os.path.exists(f"/run/netns/{n}") for n in names)
    assert not any(os.path.exists(f"/sys/class/net/{v}") for v in veths)
    assert pids_mentioning(c.dir) == []


def test_cli_up_status_down(cli, sandbox_dir, default_machine):
    d = sandbox_dir("cli")
    try:
        up = cli("sandbox", "up", "--dir", str(d), "--nodes", "2", "--machine", default_machine,
                 "--no-prolog", "--no-health", "--no-spank", "--set", "health.kernel_log=/nonexistent",
                 "--slurm-conf", "MaxJobCount=5000")
        assert up.returncode == 0, up.stderr
        assert up.stdout == f"export SLURM_CONF={d}/etc/slurm.conf\n"
        host = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True).stdout.split()[-1]
        assert up.stderr.startswith(f"slurm-gpu: sandbox up: Slurm {host}, 2 node(s)")  # the host's Slurm by default
        assert "MaxJobCount=5000" in (d / "etc" / "slurm.conf").read_text()
        assert 'kernel_log = "/nonexistent"' in (d / "etc" / "slurm-gpu.toml").read_text()
        st = cli("sandbox", "status", "--dir", str(d), "--json")
        assert st.returncode == 0, st.stderr
        info = json.loads(st.stdout)
        assert info["nodes"] == {"n1": "idle", "n2": "idle"}
        pids = [x["pid"] for x in info["daemons"]]
        down = cli("sandbox", "down", "--dir", str(d))
        assert down.returncode == 0, down.stderr
        assert down.stderr.startswith("slurm-gpu: sandbox down: stopped 4 daemon(s)")
        assert not [p for p in pids if os.path.exists(f"/proc/{p}")
                    and open(f"/proc/{p}/stat").read().split()[2] != "Z"]
        st = cli("sandbox", "status", "--dir", str(d))
        assert st.returncode == 1
        assert "stopped" in st.stdout
    finally:
        cli("sandbox", "down", "--dir", str(d))


def test_cli_refuses_without_root(cli, job_users, tmp_path):
    res = cli("sandbox", "up", "--dir", "/tmp/slurm-gpu-tests/never", user="sgtest1")
    assert res.returncode == 1
    assert res.stderr.startswith("slurm-gpu: sandbox needs root (")
    assert len(res.stderr.strip().splitlines()) == 1
    assert not Path("/tmp/slurm-gpu-tests/never").exists()


def test_cli_unknown_machine_is_one_line(cli):
    res = cli("sandbox", "up", "--dir", "/tmp/slurm-gpu-tests/never", "--machine", "no-such-box")
    assert res.returncode == 1
    assert res.stderr.startswith("slurm-gpu: unknown machine 'no-such-box' (looked in ")
    assert len(res.stderr.strip().splitlines()) == 1


def test_down_sweeps_job_steps_when_slurmctld_is_gone(make_sandbox):
    """With no controller to cancel jobs, slurmstepd and its tasks must still go."""
    import signal
    import subprocess

    c = make_sandbox(nodes=1)
    # srun forks a helper; its own session lets the test kill both.
    srun = subprocess.Popen(["srun", "--gres=gpu:1", "sleep", "300"], env=c.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        daemons = recorded(c.sb)
        deadline = time.monotonic() + 10
        steps: set[int] = set()
        while time.monotonic() < deadline:
            steps = procs.touching(c.dir) - {d.pid for d in daemons}
            if steps and procs.descendants(steps):
                break
            time.sleep(0.05)
        tasks = procs.descendants(steps)
        assert steps and tasks, "the step did not start"
        ctld = next(d for d in daemons if d.name == "slurmctld")
        os.kill(ctld.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while procs.alive(ctld) and time.monotonic() < deadline:
            c.sb._reap()  # it is this process's child: collect the zombie
            time.sleep(0.02)

        rep = c.sb.down()

        assert set(rep["swept"]) & (steps | tasks)  # the sweep, not slurmctld, ended them
        left = [p for p in steps | tasks if os.path.exists(f"/proc/{p}")
                and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
        assert left == []
        assert procs.touching(c.dir) == set()
    finally:
        os.killpg(srun.pid, signal.SIGKILL)
        srun.wait()


def test_cgroup_mode_isolates_gpus_and_cleans_its_cgroups(make_sandbox):
    import random
    import string

    # Slurm names cgroups after the node (slurm_<node>), whatever the cluster:
    # a random prefix keeps concurrent test runs apart.
    prefix = "c" + "".join(random.choices(string.ascii_lowercase, k=5))
    c = make_sandbox(nodes=1, cgroup=True, node_prefix=prefix)
    node = f"{prefix}1"
    probe = ("import errno\n"
             "for i in range(4):\n"
             "    try: open(f'{d}/nvidia{i}', 'rb')\n"
             "    except OSError as e: print(i, errno.errorcode[e.errno])\n").replace("{d}", str(c.dir / "dev"))
    res = c.srun("--gres=gpu:2", "/opt/slurm-gpu/venv/bin/python", "-c", probe)
    assert res.returncode == 0, res.stderr
    # Held GPUs reach the (absent) driver; the others are blocked by the device cgroup.
    assert res.stdout.split("\n")[:4] == ["0 ENXIO", "1 ENXIO", "2 EPERM", "3 EPERM"]
    assert list(Path("/sys/fs/cgroup").glob(f"*/slurm_{node}"))

    # A second cgroup sandbox may not reuse the node name.
    with pytest.raises(SlurmGpuError, match=f"node name {node} is in use"):
        make_sandbox(nodes=1, cgroup=True, node_prefix=prefix)

    c.sb.down()
    assert list(Path("/sys/fs/cgroup").glob(f"*/slurm_{node}")) == []
    assert not (registry.REGISTRY / "cgroup" / node).exists()


def test_up_again_over_a_crashed_sandbox(sandbox_dir, default_machine):
    """Daemons killed hard, namespaces left: a new `up` in the same directory cleans and starts."""
    import signal

    d = sandbox_dir("crash")
    first = Sandbox(d, SandboxOptions(nodes=1, machine=default_machine, netns=True)).up()
    old_ns = first.state["netns"][0]["netns"]
    for p in recorded(first):
        os.kill(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(procs.alive(p) for p in recorded(first)) and time.monotonic() < deadline:
        time.sleep(0.02)
    second = Sandbox(d, SandboxOptions(nodes=1, machine=default_machine))
    try:
        second.up()
        assert not os.path.exists(f"/run/netns/{old_ns}")
        assert second.status()["nodes"] == {"n1": "idle"}
    finally:
        second.down()
    assert pids_mentioning(d) == []
