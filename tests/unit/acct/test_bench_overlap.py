"""The oversubscription benchmark's counter (bench/overlap.py) flags what it must, and only that."""
from __future__ import annotations

import sys

from slurm_gpu.acct.attribution import holders
from slurm_gpu.hw.gpustats import DeviceStats, ProcUse
from paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from overlap import device_users, overlaps, slurm_gave_all, slurm_indices  # noqa: E402

JOB_OF = {100: "1", 101: "1", 200: "2", 300: "3", 400: "4"}


def gpu(index: int, *procs: ProcUse, gi: int | None = None) -> DeviceStats:
    return DeviceStats(index=index, gi=gi, uuid=f"GPU-{index}", sm=0.0, mem_used=0, mem_total=1,
                       power_mw=None, energy_mj=None, procs=procs)


def count(stats: list[DeviceStats], regs: dict[str, list[str]], sharing: set[str] = frozenset()):
    return overlaps(device_users(stats, JOB_OF.get), holders(regs), sharing)


def test_two_plain_jobs_on_one_gpu_are_an_overlap() -> None:
    # Planted: job 2's process on GPU 0, which job 1 holds (and uses).
    stats = [gpu(0, ProcUse(100, 0), ProcUse(200, 0)), gpu(1)]
    assert count(stats, {"1": ["0"], "2": ["1"]}) == [("0", ("1", "2"))]


def test_each_job_on_its_own_gpu_and_one_job_with_two_processes_is_none() -> None:
    stats = [gpu(0, ProcUse(100, 0), ProcUse(101, 0)), gpu(1, ProcUse(200, 0))]
    assert count(stats, {"1": ["0"], "2": ["1"]}) == []


def test_shard_jobs_share_only_what_slurm_gave_them_both() -> None:
    stats = [gpu(0, ProcUse(200, 0), ProcUse(300, 0))]
    assert count(stats, {"2": ["0"], "3": ["0"]}, {"2", "3"}) == []
    # A sharing job on a GPU it does not hold, or beside a job holding it whole.
    assert count(stats, {"2": ["0"], "3": ["1"]}, {"2", "3"}) == [("0", ("2", "3"))]
    assert count(stats, {"2": ["0"], "3": ["0"]}, {"3"}) == [("0", ("2", "3"))]


def test_mig_instances_are_separate_but_the_whole_gpu_covers_them() -> None:
    a, b = ProcUse(200, 0, gi=7, ci=0), ProcUse(300, 0, gi=8, ci=0)
    stats = [gpu(2, a, b), gpu(2, a, gi=7), gpu(2, b, gi=8)]
    assert count(stats, {"2": ["2/gi7"], "3": ["2/gi8"]}) == []
    whole = ProcUse(400, 0)          # a job that took the whole GPU, outside every instance
    stats = [gpu(2, a, b, whole), gpu(2, a, gi=7), gpu(2, b, gi=8)]
    assert count(stats, {"2": ["2/gi7"], "3": ["2/gi8"], "4": ["2"]}) == [
        ("2/gi7", ("2", "4")), ("2/gi8", ("3", "4"))]


def test_a_process_in_no_job_is_nobodys() -> None:
    stats = [gpu(0, ProcUse(100, 0), ProcUse(999, 0))]      # 999: root's MPS server, say
    assert count(stats, {"1": ["0"]}) == []


def test_slurm_indices_read_every_version_s_gres_field() -> None:
    # As scontrol -d show job printed them in the sandbox: 22.05.8, then 24.11.5 and 26.05.5.
    assert slurm_indices("JOB_GRES=gpu:nvidia_h100_80gb_hbm3:7 GRES=gpu:nvidia_h100_80gb_hbm3:7(IDX:0-6)") \
        == set(range(7))
    assert slurm_indices("GRES=shard:1(IDX:7) TresPerNode=gres:shard:1") == {7}
    assert slurm_indices("GRES=gpu:a:2(IDX:0,3)") == {0, 3}
    assert slurm_indices("GRES=shard:1(0/4,0/4,0/4,0/4,0/4,0/4,0/4,1/4)") == {7}
    assert slurm_indices("GRES=mps:25(0/100,25/100)") == {1}
    assert slurm_indices("JOB_GRES=gpu:1") == set()          # pending: no GRES= yet


def test_an_overlap_is_slurm_s_only_where_slurm_gave_the_gpu_to_each_job() -> None:
    # Slurm 22.05's bug 19110: a whole GPU 4 to job 8 while shard job 6 runs on it.
    given = {"6": slurm_indices("GRES=shard:1(IDX:4)"), "8": slurm_indices("GRES=gpu:t:1(IDX:4)")}
    ident = {i: i for i in range(8)}
    assert slurm_gave_all("4", ("6", "8"), given, ident)
    # A process on a GPU Slurm did not give its job: the product's leak, not Slurm's.
    assert not slurm_gave_all("5", ("6", "8"), given, ident)
    # MIG: Slurm's index 3 is a slice of GPU 2; device keys name the instance.
    assert slurm_gave_all("2/gi7", ("1", "2"), {"1": {3}, "2": {2}}, {0: 0, 1: 1, 2: 2, 3: 2})
    assert not slurm_gave_all("2/gi7", ("1", "3"), {"1": {3}}, {0: 0, 1: 1, 2: 2, 3: 2})
