"""jobs/steps.py: each step records before it acts, and the one failure policy (issue 25)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_jobs_lifecycle import Env, Killed

from slurm_gpu.errors import Consequence, HardwareError, UsageError
from slurm_gpu.jobs import lifecycle, steps
from slurm_gpu.jobs import state as js
from slurm_gpu.jobs.settings import JobsSettings, MigSettings, MpsSettings
from slurm_gpu.jobs.state import JobFailed

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="prolog/epilog run as root")


@pytest.fixture()
def node():
    n = Env()
    yield n
    n.close()


@pytest.mark.parametrize("when", ["after", "instead of"])
def test_killed_between_any_record_and_its_act_the_epilog_undoes_it(node: Env, monkeypatch,
                                                                    when: str) -> None:
    """Every step (MIG layout, compute mode, MPS daemon) saves the record before
    it acts: a prolog killed right after any save (before the act it announced),
    or in place of any save (a step that acted first would go unrecorded),
    leaves a record from which a fresh epilog puts the node back."""
    node.mps.exclusive_process = True
    node.mig.check_blockers = False
    before = node.layout(3)
    mode_before = node.api().compute_mode(3)
    real_save = js.save
    k = 0
    while True:
        k += 1
        saves = {"n": 0}

        def save_then_die(state_dir, record, k=k, saves=saves):
            saves["n"] += 1
            if saves["n"] == k and when == "instead of":
                raise Killed()          # not recorded: nothing may have changed yet
            real_save(state_dir, record)
            if saves["n"] == k:
                raise Killed()          # recorded; what it announced never happens

        monkeypatch.setattr(js, "save", save_then_die)
        ctx = node.ctx(SLURM_JOB_GPUS="3", SPANK_SLURM_GPU_MIG="4g.40gb,2g.20gb,1g.10gb",
                       SPANK_SLURM_GPU_MPS="default")
        try:
            rc = lifecycle.prolog(ctx)
        except Killed:
            rc = None
        monkeypatch.setattr(js, "save", real_save)
        if rc is not None:              # k passed the last save: the prolog finished
            assert rc == 0 and js.load(node.state_dir, "100").phase == "ready", node.logs
            assert node.api().compute_mode(3) == 3 and node.layout(3) != before   # all applied
            assert lifecycle.epilog(node.ctx()) == 0, node.logs
            break
        assert when == "instead of" or js.load(node.state_dir, "100") is not None, k
        assert lifecycle.epilog(node.ctx()) == 0, (k, node.logs)     # a fresh epilog
        assert lifecycle.epilog(node.ctx()) == 0, (k, node.logs)     # and again: idempotent
        assert node.layout(3) == before, k
        assert node.api().compute_mode(3) == mode_before, k
        assert node.leftovers() == [], k
    assert k > 6            # the baseline, each instance before and after, compute mode, MPS
    assert node.layout(3) == before and node.leftovers() == []


def test_a_record_of_the_previous_version_is_undone_by_this_epilog(node: Env) -> None:
    """The prolog of the package version before an upgrade wrote a version-1
    record (error with its prefix, no consequence); this version's epilog
    reads it and undoes what it lists."""
    before = node.layout(3)
    ctx = node.ctx(SLURM_JOB_GPUS="3", SPANK_SLURM_GPU_MIG="3g.40gb", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    assert node.layout(3) != before
    for name in ("100.json", "100.json.copy"):
        f = Path(node.state_dir) / "jobs" / name
        rec = json.loads(f.read_text())
        assert rec["version"] == 2
        del rec["consequence"]
        rec["version"] = 1
        f.write_text(json.dumps(rec))
    st = js.load(node.state_dir, "100")
    assert st is not None and st.mig and st.mps and st.phase == "ready"
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert node.layout(3) == before and node.leftovers() == []


# -- run(): the consequence is the error's data ---------------------------

class Recorder(steps.Step):
    def __init__(self, name: str, log: list[str], error: BaseException | None = None,
                 undo_error: BaseException | None = None) -> None:
        self.name, self.log, self.error, self.undo_error = name, log, error, undo_error

    def apply(self, job: steps.Job) -> None:
        self.log.append(f"apply {self.name}")
        job.save()
        if self.error:
            raise self.error

    def undo(self, job: steps.Job) -> list[str]:
        self.log.append(f"undo {self.name}")
        if self.undo_error:
            raise self.undo_error
        return []


class UserMistakeInHardware(HardwareError):
    consequence = Consequence.USER


class NodeFaultInUsage(UsageError):
    consequence = Consequence.NODE


def _job(tmp_path: Path, logs: list[str], on_internal_error: str = "drain",
         user_error: str = "fail_tasks") -> tuple[steps.Job, steps.Policy, list[str]]:
    ctx = lifecycle.Context({"SLURM_JOB_ID": "5"}, JobsSettings(on_internal_error=on_internal_error,
                                                                user_error=user_error),
                            MpsSettings(), MigSettings(), str(tmp_path / "state"),
                            lambda: None, log=logs.append)
    cancelled: list[str] = []
    policy = steps.Policy(on_internal_error, user_error, cancelled.append)
    job = steps.Job(ctx, js.new("5", uid=1000, gid=1000, user="u"), None, lambda: None)
    job.save()
    return job, policy, cancelled


@pytest.mark.parametrize("error,kind,policy,rc,kept", [
    (JobFailed("no MIG here", "job 5"), "user", "drain", 0, True),
    (UsageError("bad --gpu-mps value", "--gpu-mps"), "input", "drain", 0, True),
    (UserMistakeInHardware("the user's own GPU process", "GPU 0"), "user", "drain", 0, True),
    (NodeFaultInUsage("a usage error class, a node's fault", "x"), "node", "drain", 1, False),
    (HardwareError("NVML broke", "GPU 0"), "node", "drain", 1, False),
    (HardwareError("NVML broke", "GPU 0"), "node", "pass", 0, True),
    (KeyError("bug"), "node", "pass", 0, True),
])
def test_run_classifies_by_the_errors_consequence(tmp_path: Path, error, kind, policy, rc, kept) -> None:
    logs: list[str] = []
    job, pol, cancelled = _job(tmp_path, logs, policy)
    calls: list[str] = []
    ss = [Recorder("a", calls), Recorder("b", calls, error), Recorder("c", calls)]
    assert steps.run(ss, job, pol) == rc
    assert calls == ["apply a", "apply b", "undo c", "undo b", "undo a"]   # every step, reversed
    st = js.load(job.ctx.state_dir, "5")
    if not kept:
        assert st is None                    # drained and requeued: nothing of it stays here
    else:
        assert st.phase == "failed" and st.consequence == kind
        assert st.error == (str(error) if kind != "node" or not isinstance(error, KeyError)
                            else "internal error: KeyError: 'bug'")
        assert not st.error.startswith("slurm-gpu:")
    assert len(logs) == 1 and logs[0].count("slurm-gpu:") == 1, logs
    assert ("user error, job fails, node stays up" in logs[0]) == (kind != "node")
    assert cancelled == []


def test_run_undo_failing_keeps_the_record_and_is_a_node_fault(tmp_path: Path) -> None:
    for policy, rc in (("drain", 1), ("pass", 0)):
        logs: list[str] = []
        job, pol, _ = _job(tmp_path / policy, logs, policy)
        calls: list[str] = []
        ss = [Recorder("a", calls, undo_error=HardwareError("GPU held", "GPU 1")),
              Recorder("b", calls, JobFailed("bad layout", "--gpu-mig"))]
        assert steps.run(ss, job, pol) == rc
        st = js.load(job.ctx.state_dir, "5")
        assert st.phase == "failed" and st.error == "bad layout (--gpu-mig)" and st.consequence == "user"
        assert logs[1] == ("slurm-gpu: prolog cleanup incomplete, the epilog retries: GPU held (GPU 1) "
                           f"[job 5: on_internal_error={policy}]"), logs


def test_run_user_error_cancel_and_success(tmp_path: Path) -> None:
    logs: list[str] = []
    job, pol, cancelled = _job(tmp_path, logs, "drain", "cancel")
    assert steps.run([Recorder("a", [], JobFailed("no", "x"))], job, pol) == 0
    assert cancelled == ["5"]
    job, pol, cancelled = _job(tmp_path / "ok", logs)
    calls: list[str] = []
    assert steps.run([Recorder("a", calls), Recorder("b", calls)], job, pol) == 0
    assert calls == ["apply a", "apply b"] and js.load(job.ctx.state_dir, "5").phase == "ready"


# -- profiles whose id NVIDIA does not publish (RTX PRO 6000 Blackwell) -----

def _ids_unpublished(monkeypatch) -> None:
    """Plan as for a model whose GI profile ids are not published: the driver
    tells the id when the instance is created (mig/instances.create_placement)."""
    import dataclasses

    from slurm_gpu.jobs import migjob
    real = migjob.plan_gpu
    monkeypatch.setattr(migjob, "plan_gpu", lambda reqs, model: [
        dataclasses.replace(p, gi_profile_id=None) for p in real(reqs, model)])


def test_instances_of_unpublished_profile_ids_are_undone(node: Env, monkeypatch) -> None:
    """The epilog destroys what the job made even when the record could not
    name the profile id (it failed with a TypeError, so the node stayed drained)."""
    _ids_unpublished(monkeypatch)
    before = node.layout(3)
    ctx = node.ctx(SLURM_JOB_GPUS="3", SPANK_SLURM_GPU_MIG="4g.40gb,2g.20gb,1g.10gb")
    assert lifecycle.prolog(ctx) == 0, node.logs
    assert node.layout(3) != before
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert node.layout(3) == before and node.leftovers() == []


def test_pending_instance_of_an_unpublished_profile_id_is_undone(node: Env, monkeypatch) -> None:
    """Killed after an instance was created but before its ids were recorded:
    found by its placement, without a profile id to compare."""
    from test_jobs_lifecycle import die_after_creating
    _ids_unpublished(monkeypatch)
    before = node.layout(3)
    die_after_creating(monkeypatch, 2)
    with pytest.raises(Killed):
        lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="3", SPANK_SLURM_GPU_MIG="4g.40gb,2g.20gb,1g.10gb"))
    assert node.layout(3) != before
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert node.layout(3) == before and node.leftovers() == []
