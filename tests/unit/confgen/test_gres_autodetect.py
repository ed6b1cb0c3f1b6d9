"""What gres.conf says about AutoDetect per Slurm version (gres.conf(5) of 24.11 and 26.05)."""
from __future__ import annotations


from slurm_gpu.confgen import GresOptions, render_gres_conf
from slurm_gpu_devkit.sandbox.machine import load, resolve
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"


def node(name: str):
    return load(resolve(str(MACHINES / name)))


def test_explicit_lines_say_why():
    text = render_gres_conf({"n1": node("dgx-h100")})
    assert "ship no gpu_nvml.so, and AutoDetect=nvidia (24.11+) finds neither MIG nor NVLinks" in text
    text = render_gres_conf({"n1": node("dgx-h100")}, options=GresOptions(autodetect="nvml"))
    assert "ship no gpu_nvml.so" not in text
    assert "# NOTE: AutoDetect=nvml needs a Slurm built with gpu_nvml.so" in text


def test_autodetect_nvidia_names_what_it_misses():
    mig = node("h100-mig")
    assert any(g.mig_instances for g in mig.gpus)
    text = render_gres_conf({"n1": mig}, options=GresOptions(autodetect="nvidia"))
    assert "AutoDetect=nvidia\n" in text
    assert "does not detect MIG instances" in text
    links = node("dgx-h100")
    assert any(g.nvlinks for g in links.gpus)
    text = render_gres_conf({"n1": links}, options=GresOptions(autodetect="nvidia"))
    assert "does not detect NVLinks" in text and "MIG instances" not in text


def test_autodetect_full_needs_26_05():
    text = render_gres_conf({"n1": node("dgx-h100")}, options=GresOptions(autodetect="full"))
    assert "AutoDetect=full\n" in text and "needs Slurm >= 26.05" in text


def test_shared_gpus_name_the_slurm_that_keeps_them_apart():
    """Slurm before 23.11.5 clears a GPU's "shared gres in use" bit when one of two gres/shard
    (or gres/mps) jobs on it ends, and then gives the GPU whole while the other runs on it
    (SchedMD commit 30eacbe571, bug 19110; tests/integration/test_shared_gres_slurm.py)."""
    for opts in (GresOptions(shards=4), GresOptions(mps_count=100)):
        text = render_gres_conf({"n1": node("h100-sxm-8x")}, options=opts)
        assert "# NOTE: Slurm before 23.11.5 can give a GPU whole (gres/gpu) while a gres/" in text
        assert "SchedMD bug 19110" in text
    assert "23.11.5" not in render_gres_conf({"n1": node("h100-sxm-8x")})
