"""Generated gres.conf and NodeName lines accepted by a real Slurm 22.05 (the sandbox)."""
from __future__ import annotations

import re

import pytest

from sandboxlib import REPO
from slurm_gpu.confgen import GresOptions, render_gres_conf, socket_layout
from slurm_gpu.confgen.gres import node_gres_summary

MACHINES = REPO / "tests" / "data" / "machines"


def job_detail(cluster, jobid: int) -> dict[str, str]:
    """``scontrol show job -d``: the per-node line with CPU_IDs and GRES indices."""
    res = cluster.run(["scontrol", "show", "job", "-d", str(jobid)], timeout=10)
    m = re.search(r"Nodes=(\S+) CPU_IDs=(\S+) Mem=\S+ GRES=(\S+)", res.stdout)
    assert m, res.stdout
    return {"node": m.group(1), "cpus": m.group(2), "gres": m.group(3)}


def ids(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


@pytest.fixture(scope="module")
def mini(make_sandbox):
    return make_sandbox(nodes=2, machine="mini-2numa")


def test_nodes_idle_with_generated_gres(mini, cli) -> None:
    model = mini.sb.model
    want = node_gres_summary(model, GresOptions())
    for n in mini.nodes:
        info = mini.node(n)
        assert info["State"] == "IDLE", info
        assert info["Gres"].split("(")[0] == want  # e.g. gpu:nvidia_h100_nvl:2(S:0-1)
        assert (info["Sockets"], info["CoresPerSocket"]) == ("2", "1")
    # What the sandbox wrote is our render, and `gres check` agrees with it.
    conf = mini.dir / "etc" / "gres.conf"
    text = conf.read_text()
    assert text == render_gres_conf({n: model for n in mini.nodes}, dev_dir=str(mini.dir / "dev"),
                                    inputs=text.split("# input: ")[1].split("\n")[0:1])
    snap = MACHINES / "mini-2numa" / "snapshot.json"
    res = cli("gres", "check", "--config", str(conf), "--dev-dir", str(mini.dir / "dev"),
              *[a for n in mini.nodes for a in ("--snapshot", f"{n}={snap}")])
    assert res.returncode == 0, res.stdout + res.stderr


def test_enforce_binding_gives_cpus_of_the_gpus_cores(mini) -> None:
    model = mini.sb.model
    gpus = sorted(model.gpus, key=lambda g: g.pci_bus_id)
    jobs = [mini.sbatch("-w", "n1", "-n1", "--gres=gpu:1", "--gres-flags=enforce-binding",
                        "-o", "/dev/null", "--wrap", "sleep 20") for _ in gpus]
    try:
        seen = set()
        for j in jobs:
            mini.wait_job(j, states={"RUNNING"}, timeout=30)
            d = job_detail(mini, j)
            idx = int(re.search(r"IDX:(\d+)", d["gres"]).group(1))
            gpu = gpus[idx]
            allowed = set(model.pus_of_cores(gpu.cores))
            assert ids(d["cpus"]) <= allowed, (d, gpu.cores)
            seen.add(idx)
        assert seen == set(range(len(gpus)))
    finally:
        mini.run(["scancel", *map(str, jobs)])


@pytest.fixture(scope="module")
def epyc(make_sandbox):
    return make_sandbox(nodes=1, machine="epyc-a100-8numa")


def test_eight_numa_epyc_needs_and_gets_numa_sockets(epyc) -> None:
    model = epyc.sb.model
    lay = socket_layout(model)
    assert lay.slurmd_parameters == "numa_node_as_socket"
    info = epyc.node("n1")
    assert info["State"] == "IDLE", info
    assert (info["Sockets"], info["CoresPerSocket"]) == (str(lay.sockets), str(lay.cores_per_socket))
    assert info["Gres"].split("(")[0] == node_gres_summary(model, GresOptions())
    conf = (epyc.dir / "etc" / "slurm.conf").read_text()
    assert "numa_node_as_socket" in conf
    # Slurm binds a GPU job to that GPU's NUMA node, a quarter of a package.
    gpus = sorted(model.gpus, key=lambda g: g.pci_bus_id)
    j = epyc.sbatch("-n1", "--gres=gpu:1", "--gres-flags=enforce-binding", "-o", "/dev/null",
                    "--wrap", "sleep 20")
    try:
        epyc.wait_job(j, states={"RUNNING"}, timeout=30)
        d = job_detail(epyc, j)
        gpu = gpus[int(re.search(r"IDX:(\d+)", d["gres"]).group(1))]
        tpc = model.threads_per_core
        allowed = {c * tpc + t for c in gpu.cores for t in range(tpc)}  # Slurm's abstract CPU ids
        assert ids(d["cpus"]) <= allowed, (d, gpu.cores)
    finally:
        epyc.run(["scancel", str(j)])


@pytest.fixture(scope="module")
def mig(make_sandbox):
    return make_sandbox(nodes=1, machine="h100-mig")


def test_mig_lines_and_file_ranges_accepted_by_slurmd(mig) -> None:
    """MultipleFiles= MIG lines and File=/dev/nvidia[0-1] ranges, as slurmd parses them."""
    text = (mig.dir / "etc" / "gres.conf").read_text()
    assert "MultipleFiles=" in text and re.search(r"File=\S+/nvidia\[0-1\]", text)
    info = mig.node("n1")
    assert info["State"] == "IDLE", info
    got = {}
    for item in re.sub(r"\(S:[^)]*\)", "", info["Gres"]).split(","):
        _, gtype, count = item.split(":")
        got[gtype] = int(count)
    assert got == {"nvidia_h100_80gb_hbm3": 2, "nvidia_h100_80gb_hbm3_4g.40gb": 2,
                   "nvidia_h100_80gb_hbm3_1g.10gb": 6}
    res = mig.srun("--gres=gpu:nvidia_h100_80gb_hbm3_1g.10gb:2", "sh", "-c", "echo $SLURM_STEP_GPUS")
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.strip().split(",")) == 2, res.stdout
