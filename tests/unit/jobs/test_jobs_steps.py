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


# -- what mutmut changed unnoticed (docs/development.md, mutation testing) --

def test_run_node_fault_whose_undo_fails_logs_no_policy_twice(tmp_path: Path) -> None:
    """The first line names the policy already: the cleanup line adds it only after a user error."""
    logs: list[str] = []
    job, pol, cancelled = _job(tmp_path, logs, "drain")
    ss = [Recorder("a", [], undo_error=HardwareError("GPU held", "GPU 1")),
          Recorder("b", [], HardwareError("NVML broke", "GPU 0"))]
    assert steps.run(ss, job, pol) == 1
    assert logs == ["slurm-gpu: NVML broke (GPU 0) [job 5: node fault, on_internal_error=drain]",
                    "slurm-gpu: prolog cleanup incomplete, the epilog retries: GPU held (GPU 1)"]
    st = js.load(job.ctx.state_dir, "5")           # kept for the epilog, though the node drains
    assert (st.phase, st.error, st.consequence) == ("failed", "NVML broke (GPU 0)", "node")
    assert cancelled == []


def test_fail_records_a_line_as_it_is(tmp_path: Path) -> None:
    job, _, _ = _job(tmp_path, [])
    steps.fail(job, "prolog watchdog: NVML gave no answer", Consequence.NODE)
    st = js.load(job.ctx.state_dir, "5")
    assert (st.phase, st.error, st.consequence) == ("failed", "prolog watchdog: NVML gave no answer",
                                                    "node")


def test_cancel_says_only_when_scancel_cannot_run(tmp_path: Path) -> None:
    """A scancel that runs and fails (the job ended meanwhile) is no news; one that cannot run is."""
    logs: list[str] = []
    job, _, _ = _job(tmp_path, logs)
    job.ctx.jobs.scancel = "/bin/false"
    steps.cancel(job.ctx, "5")
    assert logs == []
    job.ctx.jobs.scancel = str(tmp_path / "no-scancel")
    steps.cancel(job.ctx, "5")
    assert logs == [f"slurm-gpu: could not cancel job 5: command not found: {tmp_path}/no-scancel"]


@pytest.mark.parametrize("value", ["0", "101", "-5", "x"])
def test_a_bad_mps_value_is_one_usage_line(value: str) -> None:
    with pytest.raises(UsageError) as e:
        steps.parse_mps(value)
    assert e.value.line() == (f"slurm-gpu: bad --gpu-mps value {value!r}: expected a percentage "
                              "1-100 or 'default' (--gpu-mps)")
    assert [steps.parse_mps(v) for v in ("default", "1", "100", "50%")] == [None, 1, 100, 50]


def test_mps_on_mig_is_started_on_the_jobs_mig_devices(node: Env) -> None:
    """One MPS server per MIG device: the daemon gets the job's instances, not its GPU,
    and the job's SLUID (26.05's cgroup name) is recorded for its first step."""
    ctx = node.ctx(SLURM_JOB_GPUS="3", SPANK_SLURM_GPU_MIG="3g.40gb,2g.20gb",
                   SPANK_SLURM_GPU_MPS="default", SLURM_JOB_SLUID="s100abc")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    mig = st.mig_uuids()
    assert len(mig) == 2 and all(u.startswith("MIG-") for u in mig)
    assert st.mps["devices"] == ",".join(mig)
    assert st.mps["sluid"] == "s100abc"
    assert st.mps["pipe_dir"] == os.path.join(node.mps.base_dir, "100", "pipe")
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert node.leftovers() == []


@pytest.mark.parametrize("exclusive,opts", [
    (True, {"SPANK_SLURM_GPU_MIG": "3g.40gb"}),         # no MPS daemon: nothing to keep out
    (False, {"SPANK_SLURM_GPU_MPS": "default"}),        # [mps] exclusive_process off
])
def test_compute_mode_is_left_alone_unless_mps_asks_for_it(node: Env, exclusive: bool, opts) -> None:
    node.mps.exclusive_process = exclusive
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="3", **opts)) == 0, node.logs
    assert node.api().compute_mode(3) == 0
    assert js.load(node.state_dir, "100").compute_mode_saved == {}
    assert lifecycle.epilog(node.ctx()) == 0, node.logs


def test_compute_mode_never_set_on_a_gpu_found_by_a_stale_minor(node: Env) -> None:
    """The node model says GPU 2 is minor 3 (a stale cache): the UUID and the minor
    disagree, so no GPU is touched: the one at that minor is another job's."""
    node.mps.exclusive_process = True
    real = node.node

    def swapped():
        n = real()
        a, b = n.gpus[2], n.gpus[3]
        a.minor, b.minor = b.minor, a.minor
        return n
    node.node = swapped
    modes = [node.api().compute_mode(i) for i in range(4)]
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="2", SPANK_SLURM_GPU_MPS="default")) == 1
    assert [node.api().compute_mode(i) for i in range(4)] == modes
    uuid = next(g.uuid for g in real().gpus if g.minor == 2)
    assert node.logs == [f"slurm-gpu: GPU {uuid} is /dev/nvidia2, not /dev/nvidia3 as recorded ({uuid}) "
                         "[job 100: node fault, on_internal_error=drain]"]


def test_a_gpu_refusing_exclusive_process_is_a_node_fault_named_whole(node: Env) -> None:
    from slurm_gpu.hw.gpudata import GpuError
    node.mps.exclusive_process = True
    real_api = node.api

    def api():
        a = real_api()

        def refuse(index, mode):
            raise GpuError("Insufficient Permissions", 4, "NO_PERMISSION", "nvmlDeviceSetComputeMode")
        a.set_compute_mode = refuse
        return a
    node.api = api
    uuid = next(g.uuid for g in node.node().gpus if g.minor == 2)
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="2", SPANK_SLURM_GPU_MPS="default")) == 1
    assert node.logs[0] == (f"slurm-gpu: cannot set EXCLUSIVE_PROCESS compute mode: Insufficient "
                            f"Permissions ({uuid}) [job 100: node fault, on_internal_error=drain]")


def test_a_job_without_gpus_fails_with_the_whole_line(node: Env) -> None:
    assert lifecycle.prolog(node.ctx(SPANK_SLURM_GPU_MPS="default")) == 0
    st = js.load(node.state_dir, "100")
    assert (st.phase, st.consequence) == ("failed", "user")
    assert st.error == "--gpu-mps/--gpu-mig need GPUs: ask for them with --gpus or --gres=gpu (job 100)"


@pytest.mark.parametrize("saved", [{"2": {"mode": 0, "minor": 2}}, {"GPU-x": 0}])
def test_a_compute_mode_saved_for_an_unidentified_gpu_is_left_for_the_admin(node: Env, saved) -> None:
    """Written by a version that keyed GPUs by NVML index (or with no record per GPU):
    which GPU that was is not knowable, so nothing is touched and the admin is told."""
    st = js.new("100", uid=_uid_of_sgtest1(), gid=1, user="sgtest1")
    st.compute_mode_saved = dict(saved)
    js.save(node.state_dir, st)
    modes = [node.api().compute_mode(i) for i in range(4)]
    assert lifecycle.epilog(node.ctx()) == 1
    key = next(iter(saved))
    assert node.logs == [f"slurm-gpu: compute mode recorded for an unidentified GPU {key!r}; restore it by "
                         "hand, then run slurm-gpu job cleanup (state) "
                         "[epilog job 100: cleanup incomplete, on_internal_error=drain]"]
    assert [node.api().compute_mode(i) for i in range(4)] == modes
    assert js.load(node.state_dir, "100").compute_mode_saved == saved


def _uid_of_sgtest1() -> int:
    import pwd
    return pwd.getpwnam("sgtest1").pw_uid
