"""Per-job MPS and MIG on a real Slurm (sandbox), through the SPANK plugin's options.

The sandbox models ``mini-2numa`` (2 x H100 NVL, one per NUMA node, mapped on
this host's two CPUs).  NVML is the project's simulator (``[node] nvml =
"sim:..."``) with MIG mode on for GPU 1, and the MPS binary is NVIDIA's own
control daemon (``[mps] control``, scripts/fetch-mps.sh), which runs without a GPU.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from sandboxlib import REPO, Cluster

MACHINE = REPO / "tests" / "data" / "machines" / "mini-2numa"


@pytest.fixture(scope="module")
def cluster(make_sandbox, job_users, node_files) -> Cluster:
    return make_sandbox(machine=str(MACHINE), spank=True, prolog=True, extra_config={
        "node": {"nvml": f"sim:{node_files['sim']}"},
        "mps": {"control": str(node_files["ctl"]), "base_dir": str(node_files["mps"])},
        "spank": {"numa_node_map": {"1": 0}}})


def _mps_pids(pipe: str) -> list[int]:
    from slurm_gpu.jobs.mps import daemon_pids
    return daemon_pids(Path(pipe))


def test_job_sees_own_pipe_and_other_user_cannot_connect(cluster: Cluster, node_files) -> None:
    ctl = node_files["ctl"]
    out = cluster.user_dir("sgtest1") / "mps.out"
    script = cluster.user_dir("sgtest1") / "mps.sh"
    script.write_text("#!/bin/sh\n"
                      "echo PIPE=$CUDA_MPS_PIPE_DIRECTORY LOG=$CUDA_MPS_LOG_DIRECTORY\n"
                      f"echo get_server_list | {ctl} && echo OWN_OK\n"
                      "sleep 30\n")
    script.chmod(0o755)
    jobid = cluster.sbatch("--gres=gpu:1", "--gpu-mps=50", "-o", str(out), str(script),
                           user="sgtest1", cwd=str(out.parent))
    cluster.wait_job(jobid, states={"RUNNING"})
    deadline = time.monotonic() + 20
    while "OWN_OK" not in (out.read_text() if out.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.1)
    text = out.read_text()
    m = re.search(r"PIPE=(\S+) LOG=(\S+)", text)
    assert m, text
    pipe = m.group(1)
    assert pipe == f"{node_files['mps']}/{jobid}/pipe" and "OWN_OK" in text
    st = os.stat(pipe)
    assert (st.st_uid, st.st_mode & 0o777) == (job_users_uid("sgtest1"), 0o700)
    pids = _mps_pids(pipe)
    assert pids and all(os.stat(f"/proc/{p}").st_uid == job_users_uid("sgtest1") for p in pids)
    # sgtest2, in its own job on the same node, cannot reach the daemon
    other = cluster.srun("--gres=gpu:1", "/bin/sh", "-c",
                         f"echo get_server_list | CUDA_MPS_PIPE_DIRECTORY={pipe} {ctl}; "
                         "echo rc=$?", user="sgtest2")
    assert "rc=1" in other.stdout, other.stdout + other.stderr
    assert "Cannot find MPS control daemon" in other.stderr
    cluster.run(["scancel", str(jobid)])
    cluster.wait_job(jobid)
    deadline = time.monotonic() + 20
    while (Path(pipe).exists() or _mps_pids(pipe)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(pipe).parent.exists() and _mps_pids(pipe) == []


def job_users_uid(name: str) -> int:
    import pwd
    return pwd.getpwnam(name).pw_uid


def test_mig_distinct_uuids_per_task(cluster: Cluster, node_files) -> None:
    from slurm_gpu.hw import backend
    res = cluster.srun("-O", "-n3", "--gres=gpu:2", "--gpu-mig=3g.47gb;3x2g.24gb", "/bin/sh", "-c",
                       "echo TASK $SLURM_LOCALID $CUDA_VISIBLE_DEVICES", user="sgtest1")
    assert res.returncode == 0, res.stderr
    lines = sorted(l for l in res.stdout.splitlines() if l.startswith("TASK"))
    uuids = [l.split()[2] for l in lines]
    # 4 MIG devices over 3 tasks: blocks of 1, 1 and 2, none shared
    flat = [u for us in uuids for u in us.split(",")]
    assert len(lines) == 3 and len(flat) == 4 and len(set(flat)) == 4
    assert all(u.startswith("MIG-") for u in flat)
    gpus = backend.open_gpus(backend.GpuSource("sim", str(node_files["sim"])))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_mig_count(gpus, i) for i in (0, 1)):
        time.sleep(0.1)
    assert [_mig_count(gpus, i) for i in (0, 1)] == [0, 0]


def _mig_count(gpus, index: int) -> int:
    from slurm_gpu.mig import instances
    return len(instances.list_instances(gpus, index))


@pytest.mark.parametrize("layout,why", [("4g.47gb,4g.47gb", "at most 1"),
                                        ("8x1g.12gb", "at most 7"),
                                        ("3g.40gb", "not a MIG profile")])
def test_bad_layout_one_clear_line_node_up(cluster: Cluster, node_files, layout: str,
                                           why: str) -> None:
    res = cluster.srun("--gres=gpu:1", "-w", cluster.nodes[0], f"--gpu-mig={layout}", "true",
                       user="sgtest1")
    assert res.returncode != 0
    lines = [l for l in res.stderr.splitlines() if "slurm-gpu:" in l]
    assert lines and why in lines[0], res.stderr
    assert len(set(lines)) == 1                      # one clear line (per failed task)
    # the node is not drained: it goes back to idle once the epilog ran
    cluster.wait_node_state(cluster.nodes[0], re.compile("idle|mixed"), timeout=20)
    from slurm_gpu.mig import instances
    from slurm_gpu.hw import backend
    gpus = backend.open_gpus(backend.GpuSource("sim", str(node_files["sim"])))
    assert [len(instances.list_instances(gpus, i)) for i in (0, 1)] == [0, 0]


def test_step_fails_when_the_prolog_did_not_finish(cluster: Cluster, node_files) -> None:
    """A record left in phase prolog without an error (a prolog killed after its
    first save): a step of the job fails with one line through the installed
    plugin, the node stays up, and the epilog still takes the daemon down."""
    from slurm_gpu.jobs import state as jobstate
    name = cluster.nodes[0]
    state_dir = cluster.dir / "var" / name
    d = cluster.user_dir("sgtest1")
    script = d / "wait.sh"
    started = d / "started"
    started.unlink(missing_ok=True)
    script.write_text(f"#!/bin/sh\ntouch {started}\nsleep 60\n")
    script.chmod(0o755)
    jobid = cluster.sbatch("--gres=gpu:1", "--gpu-mps", "-w", name, "-o", "/dev/null",
                           str(script), user="sgtest1", cwd=str(d))
    cluster.wait_job(jobid, states={"RUNNING"})
    # The batch step must be running before the record is changed: its own
    # step checks the record too, and would fail the whole job ("Job/step
    # already completing" for the srun below; seen under load).
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started.exists(), "the batch step never started"
    rec = jobstate.load(state_dir, str(jobid))
    assert rec is not None and rec.phase == jobstate.Phase.READY and rec.mps, rec
    pipe = rec.mps["pipe_dir"]
    rec.phase = jobstate.Phase.PROLOG           # as the killed prolog left it
    jobstate.save(state_dir, rec)
    res = cluster.srun("--jobid", str(jobid), "--overlap", "-w", name, "--gpu-mps",
                       "/bin/sh", "-c", "echo RAN $CUDA_MPS_PIPE_DIRECTORY", user="sgtest1")
    assert res.returncode != 0 and "RAN" not in res.stdout, res.stdout + res.stderr
    lines = {l[l.index("slurm-gpu:"):] for l in res.stderr.splitlines() if "slurm-gpu:" in l}
    assert lines == {f"slurm-gpu: the prolog of job {jobid} did not finish setting up MPS/MIG "
                     "on this node (phase prolog)"}, res.stderr
    cluster.run(["scancel", str(jobid)])
    cluster.wait_job(jobid)
    cluster.wait_node_state(name, re.compile("idle|mixed"), timeout=20)   # not drained
    deadline = time.monotonic() + 20
    while (Path(pipe).exists() or _mps_pids(pipe)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(pipe).parent.exists() and _mps_pids(pipe) == []
