"""The MPS daemon lives inside the job: a real Slurm with proctrack/cgroup and task/cgroup.

Slurm 22.05 runs the prolog before it makes the job's cgroup (the extern
step is spawned after the prolog, even with ``PrologFlags=Contain``), so the
prolog starts the daemon and the SPANK plugin moves its tree into
``<job cgroup>/slurm_gpu_mps`` from the job's first step.  The proof is the
kernel's: ``/proc/<daemon>/cgroup`` names the job in every hierarchy Slurm
limits, and the epilog ends whatever is in that cgroup, including a process
that has no ``CUDA_MPS_PIPE_DIRECTORY`` in its environment.
"""
from __future__ import annotations

import os
import random
import string
import subprocess
import time
from pathlib import Path

import pytest

from sandboxlib import REPO, Cluster

MACHINE = REPO / "tests" / "data" / "machines" / "mini-2numa"


@pytest.fixture(scope="module")
def cluster(make_sandbox, job_users, node_files) -> Cluster:
    if not any(Path("/sys/fs/cgroup").glob("*/cgroup.procs")) and \
            not Path("/sys/fs/cgroup/cgroup.procs").exists():
        pytest.skip("no cgroup filesystem")
    # Slurm names cgroups after the node: a random prefix keeps concurrent runs apart.
    prefix = "m" + "".join(random.choices(string.ascii_lowercase, k=5))
    return make_sandbox(machine=str(MACHINE), spank=True, prolog=True, cgroup=True,
                        node_prefix=prefix, slurm_conf={"PrologFlags": "Alloc,Contain"},
                        extra_config={
                            "node": {"nvml": f"sim:{node_files['sim']}"},
                            "mps": {"control": str(node_files["ctl"]),
                                    "base_dir": str(node_files["mps"])}})


def _daemon(pipe: Path) -> list[int]:
    """The MPS control daemon's processes (the job's tasks have the pipe in their env too)."""
    from slurm_gpu.jobs.mps import daemon_pids
    out = []
    for p in daemon_pids(pipe):
        try:
            if b"nvidia-cuda-mps-control" in Path(f"/proc/{p}/cmdline").read_bytes():
                out.append(p)
        except OSError:
            pass
    return out


def _cgroups(pid: int) -> dict[str, str]:
    """{controllers: path} from /proc/<pid>/cgroup."""
    out = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _id, ctrls, path = line.split(":", 2)
        out[ctrls] = path
    return out


def test_mps_daemon_runs_in_the_jobs_cgroup_and_dies_with_it(cluster: Cluster, node_files) -> None:
    out = cluster.user_dir("sgtest1") / "cg.out"
    jobid = cluster.sbatch("--gres=gpu:1", "--gpu-mps=default", "-o", str(out), "--wrap",
                           "echo PIPE=$CUDA_MPS_PIPE_DIRECTORY; sleep 60",
                           user="sgtest1", cwd=str(out.parent))
    cluster.wait_job(jobid, states={"RUNNING"})
    pipe = node_files["mps"] / str(jobid) / "pipe"
    deadline = time.monotonic() + 20
    while not (out.exists() and "PIPE=" in out.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = _daemon(pipe)
    assert pids, out.read_text() if out.exists() else "no output"
    mine = f"/job_{jobid}/slurm_gpu_mps"
    for pid in pids:
        cg = _cgroups(pid)
        limited = {k: v for k, v in cg.items() if k in ("memory", "devices", "cpuset") or k == ""}
        assert limited and all(v.endswith(mine) for k, v in limited.items() if v != "/"), cg
    # The job's limits hold the daemon: its cgroup is a child of the job's.
    cg = _cgroups(pids[0])
    if "memory" in cg:
        mem = Path("/sys/fs/cgroup/memory" + cg["memory"])
        job = mem.parent
        assert int((job / "memory.limit_in_bytes").read_text()) < 1 << 60   # the job's limit
        assert (mem / "memory.use_hierarchy").read_text().strip() == "1"
    # ... and its device limits: a process started in the daemon's cgroup the
    # way the prolog starts the daemon (join, drop to the user, exec) reaches
    # the job's GPU (the absent driver answers ENXIO) and no other (EPERM).
    from slurm_gpu import runner
    from slurm_gpu.jobs import jobcgroup
    from slurm_gpu.jobs import state as js
    st = js.load(str(cluster.dir / "var" / cluster.nodes[0]), str(jobid))
    dirs = st.mps["cgroup"]
    assert dirs and all(d.endswith(mine) for d in dirs)
    probe = ("import errno\n"
             "for i in range(2):\n"
             "    try: open(f'{d}/nvidia{i}', 'rb')\n"
             "    except OSError as e: print(i, errno.errorcode[e.errno])\n"
             ).replace("{d}", str(cluster.dir / "dev"))
    held = st.gpus[0]["minor"]
    import pwd
    u = pwd.getpwnam("sgtest1")
    res = runner.run(["/usr/bin/python3", "-I", "-c", probe], 10,
                     run_as=runner.RunAs(u.pw_uid, u.pw_gid), join_cgroups=jobcgroup.procs_files(dirs))
    assert res.stdout.split("\n")[:2] == [f"{i} {'ENXIO' if i == held else 'EPERM'}" for i in range(2)]

    # A child of the daemon that dropped CUDA_MPS_PIPE_DIRECTORY: found by its cgroup alone.
    stray = subprocess.Popen(["/bin/sleep", "300"], env={}, user=u.pw_uid, group=u.pw_gid,
                             start_new_session=True)
    try:
        for ctrls, path in cg.items():
            if path.endswith(mine):
                d = "unified" if ctrls == "" else ctrls.split(",")[0].replace("name=", "")
                (Path("/sys/fs/cgroup") / d / path.lstrip("/") / "cgroup.procs").write_text(
                    str(stray.pid))
        cluster.run(["scancel", str(jobid)])
        cluster.wait_job(jobid)
        deadline = time.monotonic() + 20
        while stray.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stray.poll() is not None, "the epilog left a process of the daemon's cgroup"
        while _daemon(pipe) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _daemon(pipe) == []
        # ... and nothing of the job's cgroups is left (ours kept Slurm from removing them)
        deadline = time.monotonic() + 10
        while list(Path("/sys/fs/cgroup").glob(f"*/slurm_{cluster.nodes[0]}/*/job_{jobid}")) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert not list(Path("/sys/fs/cgroup").glob(f"*/slurm_{cluster.nodes[0]}/*/job_{jobid}"))
    finally:
        if stray.poll() is None:
            stray.kill()
        stray.wait()
    assert os.path.exists(node_files["mps"]) and not (node_files["mps"] / str(jobid)).exists()


def test_until_the_first_step_the_daemons_hold_reaches_the_jobs_gpu_alone(cluster: Cluster, node_files) -> None:
    """An allocation with no step yet (salloc --no-shell): the prolog's daemon waits in
    its hold, whose devices hierarchy refuses every GPU but the job's (review round 3,
    H4: a user who ptraced the daemon there reached every GPU).  The first step moves
    it into the job's cgroup, and the hold is gone."""
    import pwd
    import re

    from slurm_gpu import runner
    from slurm_gpu.jobs import jobcgroup
    from slurm_gpu.jobs import state as js
    res = cluster.run(["salloc", "--no-shell", "--gres=gpu:1", "--gpu-mps=default"], user="sgtest1",
                      timeout=60)
    m = re.search(r"Granted job allocation (\d+)", res.stderr)
    assert m, res.stderr
    jobid = m.group(1)
    try:
        sd = str(cluster.dir / "var" / cluster.nodes[0])
        deadline = time.monotonic() + 30
        st = js.load(sd, jobid)
        while not (st and st.mps and st.mps.get("ready")) and time.monotonic() < deadline:
            time.sleep(0.1)
            st = js.load(sd, jobid)
        assert st is not None and st.mps and st.mps.get("ready"), st
        hold = st.mps.get("hold") or []
        held = st.gpus[0]["minor"]
        assert st.mps.get("hold_devices") == f"the job's GPUs only (/dev/nvidia{held})", st.mps
        devices = [h for h in hold if os.path.exists(os.path.join(h, "devices.deny"))]
        assert len(devices) == 1, hold
        pids = _daemon(node_files["mps"] / jobid / "pipe")
        assert pids and all(_cgroups(p)["devices"].endswith(f"/job_{jobid}") for p in pids)
        probe = ("import errno\n"
                 "for i in range(2):\n"
                 "    try: open(f'{d}/nvidia{i}', 'rb')\n"
                 "    except OSError as e: print(i, errno.errorcode[e.errno])\n"
                 ).replace("{d}", str(cluster.dir / "dev"))
        u = pwd.getpwnam("sgtest1")
        res = runner.run(["/usr/bin/python3", "-I", "-c", probe], 10,
                         run_as=runner.RunAs(u.pw_uid, u.pw_gid), join_cgroups=jobcgroup.procs_files(hold))
        assert res.stdout.split("\n")[:2] == [f"{i} {'ENXIO' if i == held else 'EPERM'}" for i in range(2)]
        # The first step (its --gpu-mps as salloc's shell would pass it on): the daemon
        # is the job's in every hierarchy, the hold is gone.
        step = cluster.run(["srun", f"--jobid={jobid}", "--gpu-mps=default", "true"], user="sgtest1",
                           timeout=60)
        assert step.returncode == 0, step.stderr
        mine = f"/job_{jobid}/slurm_gpu_mps"
        assert all(_cgroups(p)["devices"].endswith(mine) for p in pids), [_cgroups(p) for p in pids]
        assert not any(os.path.exists(h) for h in hold)
    finally:
        cluster.run(["scancel", jobid])
        cluster.wait_job(int(jobid))


def test_mps_daemon_pinned_to_its_gpus_cores_from_the_one_node_cache(cluster: Cluster, node_files) -> None:
    """The prolog pins the daemon to the held GPU's local cores (the model's, by UUID), and
    writes the node's one fact-cache entry, which the job's step then shares: the step only
    adds its [spank] section, the GPUs in the entry are the prolog's read."""
    from slurm_gpu import nodefacts
    from slurm_gpu.hw import Snapshot, load_node
    from slurm_gpu.jobs import state as js
    model = load_node(Snapshot(str(MACHINE / "snapshot.json")))
    node = cluster.nodes[0]
    cfg = str(cluster.dir / "etc" / "slurm-gpu.toml")
    gres = str(cluster.dir / "etc" / "gres.conf")
    entry = Path(nodefacts.cache_file(cfg, node, gres))
    entry.unlink(missing_ok=True)
    out = cluster.user_dir("sgtest1") / "pin.out"
    jobid = cluster.sbatch("--gres=gpu:1", "--gpu-mps=default", "-o", str(out), "--wrap",
                           "echo PIPE=$CUDA_MPS_PIPE_DIRECTORY; sleep 30",
                           user="sgtest1", cwd=str(out.parent))
    try:
        cluster.wait_job(jobid, states={"RUNNING"})
        deadline = time.monotonic() + 20
        while not (out.exists() and "PIPE=" in out.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        st = js.load(str(cluster.dir / "var" / node), str(jobid))
        assert st and st.mps, st
        g = {x.uuid: x for x in model.gpus}[st.gpus[0]["uuid"]]
        want = list(model.pus_of_cores(g.cores))
        assert want and st.gpus[0]["cpus"] == want, (st.gpus, want)
        assert st.mps["cpus"] == ",".join(map(str, want))
        data = nodefacts.load(cfg, node, gres)
        assert data is not None, f"no valid node-fact entry at {entry}"
        assert entry.stat().st_uid == 0 and entry.stat().st_mode & 0o777 == 0o600
        assert "spank" in data["sections"], "the batch step did not use the prolog's entry"
        assert [x["uuid"] for x in data["gpus"] if x] == \
            [x.uuid for x in sorted(model.gpus, key=lambda x: x.index)]
    finally:
        cluster.run(["scancel", str(jobid)])
        cluster.wait_job(jobid)
