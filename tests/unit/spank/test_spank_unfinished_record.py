"""A step of a job whose prolog left its record unfinished fails with one line.

A ``--gpu-mps``/``--gpu-mig`` prolog saves the job's record (phase
``prolog``) before it makes anything, and sets phase ``ready`` last.  A
prolog killed in between (slurmd's ``PrologEpilogTimeout``, the OOM killer)
leaves the record in phase ``prolog`` without an error: a step of that job
must fail, not run without the MPS daemon or MIG instances it asked for.
Driven through the dispatcher with real records on disk (slurm_gpu.jobs.state).
"""
from __future__ import annotations

import os

import pytest

from slurm_gpu import joboptions as options
from slurm_gpu import nodefacts
from slurm_gpu.jobs import state as jobstate
from slurm_gpu.spank import dispatch
from test_spank_dispatch import FakeSpank

STEP_OPTION = {"mps": {options.MPS: "default"}, "mig": {options.MIG: "2x1g.12gb"}}


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A config whose state_dir is under *tmp_path*; returns (plugstack args, state_dir)."""
    monkeypatch.setattr(nodefacts, "CACHE_DIR", str(tmp_path / "cache"))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[node]\nstate_dir = "{tmp_path}/var"\n')
    return [f"config={cfg}"], tmp_path / "var"


def _first_save(opt: str) -> jobstate.JobRecord:
    """The record as the prolog's first save writes it (lifecycle._prolog), before any step."""
    rec = jobstate.new("7", uid=os.getuid(), gid=os.getgid(), user="u")
    rec.options = {"mps": "default" if opt == "mps" else None,
                   "mig": "2x1g.12gb" if opt == "mig" else None}
    return rec


def _step(args: list[str], opt: str) -> FakeSpank:
    sp = FakeSpank("remote", STEP_OPTION[opt], args=args, task=0, ntasks=1)
    dispatch.run_hook(sp, "init_post_opt")
    return sp


@pytest.mark.parametrize("opt", ["mps", "mig"])
def test_step_fails_when_the_prolog_left_its_record_in_phase_prolog(node, opt) -> None:
    args, state_dir = node
    jobstate.save(state_dir, _first_save(opt))
    sp = _step(args, opt)
    assert dispatch.run_hook(sp, "task_init") == -1
    assert sp.errors == ["slurm-gpu: the prolog of job 7 did not finish setting up MPS/MIG "
                         "on this node (phase prolog)"]
    assert not {"CUDA_MPS_PIPE_DIRECTORY", "CUDA_VISIBLE_DEVICES"} & set(sp.env)


def test_mps_step_gets_its_daemon_once_the_prolog_finished(node) -> None:
    args, state_dir = node
    rec = _first_save("mps")
    rec.mps = {"pipe_dir": "/run/x/7/pipe", "log_dir": "/run/x/7/log", "ready": True,
               "cgroup": ["/sys/fs/cgroup/job_7/slurm_gpu_mps"]}   # adopted: nothing to move
    rec.phase = jobstate.Phase.READY
    jobstate.save(state_dir, rec)
    sp = _step(args, "mps")
    assert dispatch.run_hook(sp, "task_init") == 0, sp.errors
    assert (sp.env["CUDA_MPS_PIPE_DIRECTORY"], sp.env["CUDA_MPS_LOG_DIRECTORY"]) == \
        ("/run/x/7/pipe", "/run/x/7/log")


def test_recorded_error_still_wins(node) -> None:
    args, state_dir = node
    rec = _first_save("mig")
    rec.fail("slurm-gpu: MIG layout 8x1g.12gb fits at most 7 (--gpu-mig)", "user")
    jobstate.save(state_dir, rec)
    sp = _step(args, "mig")
    assert dispatch.run_hook(sp, "task_init") == -1
    assert sp.errors == ["slurm-gpu: MIG layout 8x1g.12gb fits at most 7 (--gpu-mig)"]
