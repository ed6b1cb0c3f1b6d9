"""The GPU Slurm gives a job is the GPU the prolog sets up, on a node whose minors are 3-6.

``a100-sxm4-minors`` keeps the real minor numbers of its four A100s
(/dev/nvidia3../dev/nvidia6, NVML indices 0..3); ``dgx-a100-permuted``'s
minors are not in PCI order.  With task/cgroup the
job's device cgroup is Slurm's own statement of which GPU it holds: the
task can open that /dev/nvidiaN (the absent driver answers ENXIO) and no
other (EPERM).  The prolog's state must name that same minor, and the MIG
instances it made must sit on that GPU, whatever ``SLURM_JOB_GPUS`` says
(it is Slurm's index: 0..3 here, never a minor).
"""
from __future__ import annotations

import errno
import json
import random
import string
import time

import pytest

from sandboxlib import REPO, Cluster

MACHINES = REPO / "tests" / "data" / "machines"


@pytest.fixture(scope="module", params=["a100-sxm4-minors", "dgx-a100-permuted"])
def cluster(request, make_sandbox, job_users) -> Cluster:
    prefix = "g" + "".join(random.choices(string.ascii_lowercase, k=5))
    return make_sandbox(machine=str(MACHINES / request.param), spank=True, prolog=True,
                        cgroup=True, simulate=True, node_prefix=prefix)


def test_prolog_sets_up_the_gpu_slurm_gave_the_job(cluster: Cluster) -> None:
    from slurm_gpu.hw import backend
    from slurm_gpu.mig import instances
    from slurm_gpu_devkit.sim.mig import open_mig_sim
    d = cluster.user_dir("sgtest1")
    probe = ("import errno\n"
             "for i in range(8):\n"
             "    try: open(f'{dev}/nvidia{i}', 'rb')\n"
             "    except OSError as e: print('DEV', i, errno.errorcode[e.errno])\n"
             ).replace("{dev}", str(cluster.dir / "dev"))
    (d / "probe.py").write_text(probe)
    jobs = []
    # Two jobs: the second gets another GPU than Slurm index 0.
    big = "a100-sxm4" in str(cluster.sb.options.machine)      # 80 GB boards; the DGX has 40 GB
    for mig in ("", f"--gpu-mig=3g.{'40' if big else '20'}gb"):
        out = d / f"id{len(jobs)}.out"
        args = ["--gres=gpu:1", "-o", str(out)] + ([mig] if mig else [])
        jid = cluster.sbatch(*args, "--wrap",
                             f"echo JOB_GPUS=$SLURM_JOB_GPUS; /usr/bin/python3 {d}/probe.py; sleep 30",
                             user="sgtest1", cwd=str(d))
        cluster.wait_job(jid, states={"RUNNING"})
        jobs.append((jid, out, bool(mig)))
    state_dir = cluster.dir / "var" / cluster.nodes[0] / "jobs"
    for jid, out, mig in jobs:
        deadline = time.monotonic() + 20
        while "DEV 7" not in (out.read_text() if out.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.1)
        text = out.read_text()
        granted = [int(line.split()[1]) for line in text.splitlines()
                   if line.startswith("DEV") and line.split()[2] == errno.errorcode[errno.ENXIO]]
        assert len(granted) == 1, text                        # Slurm's device cgroup
        slurm_index = int(text.split("JOB_GPUS=")[1].split()[0])
        assert 0 <= slurm_index < 8
        if not mig:
            continue
        st = json.loads((state_dir / f"{jid}.json").read_text())
        assert st["error"] is None, st["error"]
        assert [g["minor"] for g in st["gpus"]] == granted
        sim = str(cluster.dir / "var" / cluster.nodes[0] / "sim.json")
        gpus = backend.open_gpus(backend.GpuSource("sim", sim))
        api = open_mig_sim(sim)
        n = api.nvmlDeviceGetCount()
        minor = {i: api.nvmlDeviceGetMinorNumber(api.nvmlDeviceGetHandleByIndex(i)) for i in range(n)}
        uuid = {minor[i]: api.nvmlDeviceGetUUID(api.nvmlDeviceGetHandleByIndex(i)) for i in range(n)}
        assert [g["uuid"] for g in st["gpus"]] == [uuid[granted[0]]]
        carved = [minor[i] for i in range(n) if instances.list_instances(gpus, i)]
        assert carved == granted                 # the MIG instances are on the job's GPU
    for jid, _, _ in jobs:
        cluster.run(["scancel", str(jid)])
        cluster.wait_job(jid)
