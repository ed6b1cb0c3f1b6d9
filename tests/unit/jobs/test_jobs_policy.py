"""``on_internal_error = "pass"`` on every prolog path, and deadlines on NVML in slurmstepd."""
from __future__ import annotations

import time

import pytest

from slurm_gpu.errors import HardwareError
from slurm_gpu.jobs import lifecycle, steps
from slurm_gpu.jobs import state as js
from slurm_gpu.mig import instances

from test_jobs_lifecycle import Env  # noqa: E402 - the same simulated node


@pytest.fixture()
def node():
    n = Env()
    yield n
    n.close()


def _scancel(node: Env):
    """A stand-in scancel that logs the job ids it was asked to cancel."""
    d = node.base / "bin"
    d.mkdir(exist_ok=True)
    log = d / "cancelled"
    (d / "scancel").write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    (d / "scancel").chmod(0o755)
    node.jobs.scancel = str(d / "scancel")
    return log


@pytest.mark.parametrize("policy,rc", [("pass", 0), ("drain", 1)])
def test_undo_failing_after_a_user_error_follows_the_policy(node: Env, monkeypatch, policy, rc) -> None:
    node.jobs.on_internal_error = policy
    node.mig.check_blockers = False

    def stuck(api, dev, gid, where):
        raise instances.MigError("cannot destroy GPU instance: In use by another client", where, 19)
    # The layout is fine for GPU 3 but the job asks MPS with a bad value after
    # MIG was set up: a user error whose undo then fails on the GPU.
    ctx = node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MIG="3g.40gb", SPANK_SLURM_GPU_MPS="0")
    real_parse = steps.parse_mps
    monkeypatch.setattr(steps, "parse_mps", lambda v: 50)
    monkeypatch.setattr(steps.MpsDaemon, "apply", lambda *a: real_parse("0"))
    monkeypatch.setattr(instances, "destroy_gi", stuck)
    assert lifecycle.prolog(ctx) == rc, node.logs
    st = js.load(node.state_dir, "100")
    assert st.phase == "failed" and "--gpu-mps" in st.error    # the tasks fail with it
    assert any("cleanup incomplete" in line for line in node.logs)


@pytest.mark.parametrize("policy,rc", [("pass", 0), ("drain", 1)])
def test_missing_job_uid_follows_the_policy(node: Env, policy, rc) -> None:
    node.jobs.on_internal_error = policy
    cancelled = _scancel(node)
    ctx = node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")
    del ctx.env["SLURM_JOB_UID"]
    assert lifecycle.prolog(ctx) == rc
    # under pass the job must not run without its MPS daemon: no user to record it for, so cancel
    assert (cancelled.read_text().split() if cancelled.exists() else []) == (["100"] if rc == 0 else [])


def test_full_disk_under_pass_cancels_the_job(node: Env, monkeypatch) -> None:
    node.jobs.on_internal_error = "pass"
    cancelled = _scancel(node)

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(js, "save", full)
    ctx = node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0
    assert cancelled.read_text().split() == ["100"]
    assert node.leftovers() == []


def test_untrusted_old_record_under_pass_fails_the_job_not_the_node(node: Env, monkeypatch) -> None:
    node.jobs.on_internal_error = "pass"
    cancelled = _scancel(node)
    monkeypatch.setattr(js, "load", lambda *a: (_ for _ in ()).throw(
        js.InputError("job state file must be a regular file owned by root", "x")))
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")) == 0
    assert cancelled.read_text().split() == ["100"]


def test_node_cache_miss_in_slurmstepd_has_a_deadline(monkeypatch, tmp_path) -> None:
    from slurm_gpu.hw import deadline
    from slurm_gpu.spank import nodecache
    t0 = time.monotonic()
    with pytest.raises(HardwareError, match="gave no answer in 0.2 s"):
        deadline.bounded(lambda: time.sleep(5), 0.2, "NVML")
    assert time.monotonic() - t0 < 2
    assert deadline.bounded(lambda: 42, 1, "x") == 42
    with pytest.raises(HardwareError, match="ZeroDivisionError"):
        deadline.bounded(lambda: 1 / 0, 1, "x")
    # the SPANK slow path itself: a hung load_node() ends in one error, not a hung step
    import slurm_gpu.hw as hw
    monkeypatch.setattr(hw, "load_node", lambda: time.sleep(30))
    monkeypatch.setattr(nodecache, "NVML_DEADLINE", 0.3)
    t0 = time.monotonic()
    with pytest.raises(HardwareError, match="reading the node model"):
        nodecache.build(None, "n1", with_gpus=True)
    assert time.monotonic() - t0 < 5
