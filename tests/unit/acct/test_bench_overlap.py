"""The oversubscription benchmark's counter (bench/overlap.py) flags what it must, and only that."""
from __future__ import annotations

import sys

from slurm_gpu.acct.attribution import holders
from slurm_gpu.hw.gpustats import DeviceStats, ProcUse
from paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from overlap import device_users, overlaps  # noqa: E402

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
