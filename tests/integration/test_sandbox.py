"""Real jobs on a 3-node sandbox modelled on the default 8-GPU machine."""
from __future__ import annotations

import os
import stat
import tomllib

import pytest

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def cluster(make_sandbox):
    return make_sandbox(nodes=3, extra_config={"sandboxtest": {"marker": "kept"}})


def gpu_type(cluster) -> str:
    # The Gres= value slurmctld reports, e.g. gpu:nvidia_h100_80gb_hbm3:8(S:0-1)
    gres = cluster.node("n1")["Gres"]
    return gres.split(",")[0].split(":")[1]


def ngpus(cluster) -> int:
    return len(cluster.sb.model.gpus)


def test_srun_one_node_gets_its_gpus(cluster):
    res = cluster.srun("-N1", "--gres=gpu:2", "sh", "-c",
                       "echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES $SLURM_STEP_GPUS")
    assert res.returncode == 0, res.stderr
    node, cvd, step = res.stdout.split()
    assert node in cluster.nodes
    assert cvd == "0,1"
    assert step == "0,1"


def test_srun_three_nodes(cluster):
    res = cluster.srun("-N3", "--ntasks-per-node=1", "--gres=gpu:3", "sh", "-c",
                       "echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES")
    assert res.returncode == 0, res.stderr
    lines = sorted(res.stdout.split("\n"))
    got = dict(l.split() for l in lines if l.strip())
    assert sorted(got) == ["n1", "n2", "n3"]
    assert set(got.values()) == {"0,1,2"}


def test_more_gpus_than_a_node_has_is_refused(cluster):
    res = cluster.srun("-N1", f"--gres=gpu:{ngpus(cluster) + 1}", "true", timeout=30)
    assert res.returncode != 0
    assert "Requested node configuration is not available" in res.stderr


def test_sbatch_typed_gres_sets_job_gpus(cluster):
    out = cluster.dir / "sbatch-%j.out"
    jobid = cluster.sbatch("-N1", f"--gres=gpu:{gpu_type(cluster)}:3", "-o", str(out),
                           "--wrap", "echo JOB_GPUS=$SLURM_JOB_GPUS; srun --gres=gpu:1 "
                           "sh -c 'echo STEP=$CUDA_VISIBLE_DEVICES'")
    info = cluster.wait_job(jobid)
    assert info["JobState"] == "COMPLETED", info
    text = (cluster.dir / f"sbatch-{jobid}.out").read_text()
    assert "JOB_GPUS=0,1,2" in text
    assert "STEP=0" in text


def test_sbatch_on_three_nodes(cluster):
    jobid = cluster.sbatch("-N3", "--gres=gpu:1", "-o", str(cluster.dir / "three-%j.out"),
                           "--wrap", "srun sh -c 'echo $SLURMD_NODENAME=$CUDA_VISIBLE_DEVICES'")
    info = cluster.wait_job(jobid)
    assert info["JobState"] == "COMPLETED", info
    lines = (cluster.dir / f"three-{jobid}.out").read_text().split()
    assert sorted(lines) == ["n1=0", "n2=0", "n3=0"]


def test_job_user_runs_as_itself(cluster, job_users):
    res = cluster.srun("-N1", "--gres=gpu:1", "sh", "-c", "id -un; echo $CUDA_VISIBLE_DEVICES",
                       user="sgtest1")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["sgtest1", "0"]


def test_job_user_batch_job(cluster, job_users):
    d = cluster.user_dir("sgtest2")
    jobid = cluster.sbatch("--gres=gpu:2", "-o", str(d / "out-%j"), "--wrap",
                           "echo $(id -un) $SLURM_JOB_GPUS", user="sgtest2", cwd=str(d))
    info = cluster.wait_job(jobid)
    assert info["JobState"] == "COMPLETED", info
    assert info["UserId"].startswith("sgtest2(")
    assert (d / f"out-{jobid}").read_text().split() == ["sgtest2", "0,1"]


def test_node_line_matches_model(cluster):
    from slurm_gpu.confgen import socket_layout

    model = cluster.sb.model
    lay = socket_layout(model)
    for name in cluster.nodes:
        n = cluster.node(name)
        assert int(n["CPUTot"]) == model.cpu_count
        assert int(n["Sockets"]) == lay.sockets
        assert int(n["CoresPerSocket"]) * lay.sockets == len(model.cores)
        assert int(n["ThreadsPerCore"]) == model.threads_per_core
        assert int(n["RealMemory"]) == model.memory_bytes // MIB
        gres = n["Gres"].split("(")[0]
        assert gres.startswith("gpu:") and gres.endswith(f":{len(model.gpus)}"), gres


def test_fake_gpus_are_nvidia_char_devices(cluster):
    dev = cluster.dir / "dev"
    for g in cluster.sb.model.gpus:
        st = os.stat(dev / f"nvidia{g.minor}")
        assert stat.S_ISCHR(st.st_mode)
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, g.minor)
    st = os.stat(dev / "nvidiactl")
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, 255)
    gres = (cluster.dir / "etc" / "gres.conf").read_text()
    assert f"File={dev}/nvidia" in gres
    # Opening a fake GPU reaches the (absent) driver: ENXIO, not ENOENT.
    with pytest.raises(OSError) as e:
        open(dev / "nvidia0", "rb")
    assert e.value.errno == 6


def test_node_config_file(cluster):
    cfg = tomllib.loads((cluster.dir / "etc" / "slurm-gpu.toml").read_text())
    assert cfg["node"]["state_dir"] == f"{cluster.dir}/var/%n"
    if cluster.sb.machine and cluster.sb.machine.snapshot:
        assert cfg["node"]["snapshot"] == str(cluster.sb.machine.snapshot)
    assert cfg["sandboxtest"] == {"marker": "kept"}
    for name in cluster.nodes:
        assert (cluster.dir / "var" / name).is_dir()


def test_status_reports_daemons_and_nodes(cluster):
    for name in cluster.nodes:  # a finished job's node may still be completing
        cluster.wait_node_state(name, "idle")
    st = cluster.sb.status()
    assert st["running"]
    assert {d["name"] for d in st["daemons"]} == {"munged", "slurmctld", "slurmd:n1", "slurmd:n2",
                                                  "slurmd:n3"}
    assert all(d["alive"] for d in st["daemons"])
    assert st["nodes"] == {"n1": "idle", "n2": "idle", "n3": "idle"}
