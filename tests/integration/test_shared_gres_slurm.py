"""A GPU given whole while a gres/shard job still runs on it: Slurm's, before 23.11.5.

slurmctld keeps gres/gpu off a GPU whose shards are in use through one bit
per GPU in the shard gres's node state (``gres_bit_alloc``; the select
plugin's filter, cons_tres/gres_sched.c, skips a GPU whose bit is set).
Before 23.11.5, ``_job_dealloc()`` (src/slurmctld/gres_ctld.c) cleared that
bit when *any* sharing job on the GPU ended, though others still held
shards of it; from then on the GPU looked free to gres/gpu.  SchedMD fixed it
in commit 30eacbe571 ("Fix bad deallocation of shared gres. This was
allowing gpus to be used both as shards and whole gpus", bug 19110; NEWS of
23.11.5), so 24.11 and 26.05 have it, Debian 12's 22.05.8 does not.

The sequence, on h100-sxm-8x (one gres.conf line per GPU, as we generate it
there, so no ``File=`` range is involved): a job takes 7 GPUs whole, two
``--gres=shard:1`` jobs share the 8th, one of them ends, then the 7-GPU
job, then a job asks for all 8 GPUs.  Slurm must keep it pending while the
second shard job runs.  This is what bench/bench_oversub.py counted on
22.05 (docs/development.md, "The outcome rows"); gres render and doctor say
so on such a Slurm (docs/slurm-versions.md).
"""
from __future__ import annotations

import json
import time

import pytest

from debianroot import unavailable
from sandboxlib import Cluster

MACHINE = "h100-sxm-8x"


def settled(c: Cluster, jid: int, timeout: float = 60) -> dict[str, str]:
    """The job once Slurm has decided about it: RUNNING, or PENDING with a reason."""
    deadline = time.monotonic() + timeout
    info: dict[str, str] = {}
    while time.monotonic() < deadline:
        info = c.run(["scontrol", "-d", "show", "job", "-o", str(jid)], timeout=10).stdout
        words = dict(w.split("=", 1) for w in info.split() if "=" in w)
        if words.get("JobState") == "RUNNING" or (words.get("JobState") == "PENDING"
                                                   and words.get("Reason") not in (None, "None")):
            return words
        time.sleep(0.1)
    raise AssertionError(f"job {jid} undecided after {timeout} s: {info}")


def gone(c: Cluster, jid: int, timeout: float = 60) -> None:
    """Until squeue lists the job no more (completing included): its resources are back."""
    deadline = time.monotonic() + timeout
    while c.run(["squeue", "-h", "-j", str(jid)], timeout=10).stdout.strip():
        assert time.monotonic() < deadline, f"job {jid} still listed after {timeout} s"
        time.sleep(0.1)


@pytest.mark.parametrize("version", ["22.05", "26.05"])
def test_gpu_freed_by_one_shard_job_while_another_runs(make_sandbox, job_users, cli, version):
    try:
        c = make_sandbox(nodes=1, machine=MACHINE, slurm=version, gres_options={"shards": 4},
                         node_prefix=f"sh{version.replace('.', '')}n")
    except Exception as e:  # noqa: BLE001
        if "no Slurm" in str(e) and "root" in str(e):
            unavailable(str(e))
        raise
    long = ["--wrap", "sleep 300"]
    seven = c.sbatch("--gres=gpu:7", *long)
    assert settled(c, seven)["JobState"] == "RUNNING"
    first, second = c.sbatch("--gres=shard:1", *long), c.sbatch("--gres=shard:1", *long)
    assert settled(c, first)["JobState"] == settled(c, second)["JobState"] == "RUNNING"
    for jid in (first, seven):
        assert c.run(["scancel", str(jid)]).returncode == 0
        gone(c, jid)
    whole = settled(c, c.sbatch("--gres=gpu:8", *long))
    assert c.job(second)["JobState"] == "RUNNING"
    if version == "22.05":
        # Slurm's bug, as Debian 12 ships it: all 8 GPUs, the second shard job's among them.
        assert whole["JobState"] == "RUNNING", whole
        assert whole["JOB_GRES"] == "gpu:nvidia_h100_80gb_hbm3:8", whole
        # doctor, where this slurmd runs (the host's), reads GresTypes from this slurm.conf and says so.
        res = cli("doctor", "--json", "--no-gres", "--slurm-conf", str(c.sb.conf))
        found = [x for x in json.loads(res.stdout)["findings"] if x["check"] == "slurm.shared_gres"]
        assert [x["status"] for x in found] == ["WARNING"], res.stdout + res.stderr
        assert found[0]["message"].startswith(f"Slurm {c.slurm_version} can give a GPU whole"), found
    else:
        assert (whole["JobState"], whole["Reason"]) == ("PENDING", "Resources"), whole
