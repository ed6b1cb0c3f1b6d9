"""jobs/lifecycle.py: what the prolog records when it fails outside its steps,
the watchdog's mark, and the sweep's teardown, each asserted whole: the
mutants mutmut made of these survived the lifecycle tests (docs/development.md,
mutation testing).  Runs as root against the simulated node of test_jobs_lifecycle.
"""
from __future__ import annotations

import os
import subprocess

import pytest
from test_jobs_lifecycle import Env, _uid, health_ctx, processes_asked

from slurm_gpu.errors import InputError
from slurm_gpu.jobs import lifecycle
from slurm_gpu.jobs import state as js
from slurm_gpu.jobs import sweep

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="prolog/epilog run as root")


from test_jobs_policy import _scancel, node  # noqa: E402,F401 - the same simulated node and scancel stand-in


def _process_on_the_gpu(monkeypatch, user: str = "sgtest2", cgroup: str | None = None) -> subprocess.Popen:
    """A process of *user* (sgtest2: a job that leaked onto the GPU), in *cgroup* if given, that NVML
    lists on every GPU asked; the caller kills it."""
    from slurm_gpu.hw import nvml_health
    other = subprocess.Popen(["/bin/sleep", "60"], user=_uid(user))
    try:
        if cgroup is not None:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(other.pid))
    except BaseException:
        other.kill()
        other.wait()
        raise
    monkeypatch.setattr(nvml_health, "read_processes", lambda gpus, indices: nvml_health.NvmlHealth(
        available=True, gpus=[nvml_health.GpuHealth(index=i, bus_id="00000000:01:00.0",
                                                     processes=((other.pid, None),)) for i in indices]))
    return other


def _bug(monkeypatch) -> None:
    """A bug outside the steps (here in the sweep that runs first): escapes _prolog."""
    def broken(*a, **k):
        raise KeyError("gpus")
    monkeypatch.setattr(sweep, "sweep", broken)


def test_a_bug_outside_the_steps_under_pass_is_recorded_for_the_tasks(node: Env, monkeypatch) -> None:
    node.jobs.on_internal_error = "pass"
    cancelled = _scancel(node)
    _bug(monkeypatch)
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")) == 0
    assert node.logs == ["slurm-gpu: internal error: KeyError: 'gpus' "
                         "[prolog: node fault, on_internal_error=pass]"]
    st = js.load(node.state_dir, "100")
    assert (st.jobid, st.uid, st.gid, st.user) == ("100", _uid("sgtest1"), int(node.ctx().env["SLURM_JOB_GID"]),
                                                   "sgtest1")
    assert (st.phase, st.error, st.consequence) == ("failed", "internal error: KeyError: 'gpus'", "node")
    assert not cancelled.exists()                   # recorded: the tasks fail, no scancel needed


def test_a_bug_under_pass_fails_the_earlier_record_without_replacing_it(node: Env, monkeypatch) -> None:
    """What an earlier run recorded (a MIG layout to undo) stays listed for the epilog."""
    node.jobs.on_internal_error = "pass"
    old = js.new("100", uid=_uid("sgtest1"), gid=1, user="sgtest1")
    old.mig = {"layout": "3g.40gb", "ready": False, "gpus": []}
    js.save(node.state_dir, old)
    _bug(monkeypatch)
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")) == 0
    st = js.load(node.state_dir, "100")
    assert st.mig == {"layout": "3g.40gb", "ready": False, "gpus": []} and st.gid == 1
    assert (st.phase, st.error, st.consequence) == ("failed", "internal error: KeyError: 'gpus'", "node")


def test_a_bug_under_drain_records_nothing(node: Env, monkeypatch) -> None:
    _bug(monkeypatch)
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")) == 1
    assert js.list_jobs(node.state_dir) == []


def test_no_recordable_job_under_pass_is_cancelled_with_one_line(node: Env, monkeypatch) -> None:
    node.jobs.on_internal_error = "pass"
    cancelled = _scancel(node)
    ctx = node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")
    del ctx.env["SLURM_JOB_UID"]
    assert lifecycle.prolog(ctx) == 0
    assert node.logs == [
        "slurm-gpu: prolog environment lacks SLURM_JOB_UID (job 100) "
        "[prolog: node fault, on_internal_error=pass]",
        "slurm-gpu: cannot record the error for job 100 (no job user to record the error for); "
        "cancelling it"]
    assert cancelled.read_text().split() == ["100"]


def test_mark_failed_fails_only_a_job_not_ready(node: Env) -> None:
    ctx = node.ctx()
    lifecycle.mark_failed(ctx, "slurm-gpu: prolog stopped by its watchdog")
    assert js.list_jobs(node.state_dir) == []                          # no record: nothing made
    js.save(node.state_dir, js.new("100", uid=1000, gid=1000, user="u"))
    lifecycle.mark_failed(ctx, "slurm-gpu: prolog stopped by its watchdog")
    st = js.load(node.state_dir, "100")
    assert (st.phase, st.error, st.consequence) == ("failed", "prolog stopped by its watchdog", "node")
    st.phase, st.error, st.consequence = "ready", None, None
    js.save(node.state_dir, st)
    lifecycle.mark_failed(ctx, "slurm-gpu: prolog stopped by its watchdog")   # finished meanwhile
    st = js.load(node.state_dir, "100")
    assert (st.phase, st.error) == ("ready", None)


def test_the_sweeps_teardown_ends_only_the_recorded_users_processes(node: Env) -> None:
    """Without slurmd's environment the user comes from the record: the daemon is
    asked to quit as that user, and another user's process carrying the job's
    pipe directory is never killed."""
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    other = subprocess.Popen(["/bin/sleep", "60"], env={"CUDA_MPS_PIPE_DIRECTORY": st.mps["pipe_dir"]},
                             user=_uid("sgtest2"))
    try:
        notes = lifecycle.teardown(node.ctx(), st)
        assert other.poll() is None
        assert notes == []                      # asked to quit as its user: no straggler to kill
    finally:
        other.kill()
        other.wait()
    js.remove(node.state_dir, "100")
    assert node.leftovers() == []


def _plant_state(node: Env) -> str:
    """An MPS job whose state file the job user could have written: the epilog believes none of it."""
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    node.logs.clear()
    f = os.path.join(node.state_dir, "jobs", "100.json")
    os.chown(f, _uid("sgtest1"), -1)
    return f


def test_untrusted_state_the_daemon_quits_as_the_user_from_slurmds_environment(node: Env) -> None:
    """Asked to quit as the job user, the daemon ends by itself: nothing to kill."""
    f = _plant_state(node)
    assert lifecycle.epilog(node.ctx(SLURM_JOB_GPUS="0")) == 1
    assert node.logs == [
        "slurm-gpu: job state file must be a regular file owned by root and not writable by "
        f"others ({f}) [epilog job 100: state file ignored, on_internal_error=drain]"]
    assert not os.path.exists(os.path.join(node.mps.base_dir, "100"))


def test_untrusted_state_stragglers_are_killed_and_named(node: Env) -> None:
    _plant_state(node)
    node.mps.quit_timeout = 0.1             # the client below never quits: do not wait for it
    pipe = os.path.join(node.mps.base_dir, "100", "pipe")
    client = subprocess.Popen(["/bin/sleep", "60"], env={"CUDA_MPS_PIPE_DIRECTORY": pipe},
                              user=_uid("sgtest1"))
    try:
        assert lifecycle.epilog(node.ctx(SLURM_JOB_GPUS="0")) == 1
        client.wait(timeout=10)
    finally:
        client.kill()
        client.wait()
    assert len(node.logs) == 2, node.logs
    killed = node.logs[1].removeprefix("slurm-gpu: epilog job 100: MPS: killed stragglers ")
    assert str(client.pid) in killed.split(","), node.logs


def test_untrusted_state_an_mps_stop_that_fails_is_logged(node: Env, monkeypatch) -> None:
    from slurm_gpu.errors import HardwareError
    from slurm_gpu.jobs import mps
    _plant_state(node)
    real_stop = mps.stop

    def stuck(*a, **k):
        real_stop(*a, **k)
        raise HardwareError("MPS processes 4242 survive SIGKILL for 1 s", "pipe")
    monkeypatch.setattr(mps, "stop", stuck)
    node.jobs.on_internal_error = "pass"
    assert lifecycle.epilog(node.ctx(SLURM_JOB_GPUS="0")) == 0
    assert node.logs[1:] == ["slurm-gpu: epilog job 100: MPS cleanup incomplete: "
                             "MPS processes 4242 survive SIGKILL for 1 s (pipe)"]


@pytest.mark.parametrize("mps", [False, True], ids=["plain", "mps"])
def test_a_jobs_epilog_leaves_another_users_process_alone(node: Env, monkeypatch, mps: bool) -> None:
    """The job user's processes are leftovers; another user's on the same GPU (a job
    that leaked onto it) are not: no drain, no line, a plain job's or an MPS job's."""
    if mps:
        assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")) == 0, node.logs
    other = _process_on_the_gpu(monkeypatch)
    try:
        assert lifecycle.epilog(health_ctx(node, SLURM_JOB_GPUS="1")) == 0
    finally:
        other.kill()
        other.wait()
    assert node.logs == [] and not os.path.exists(node.base / "health") and node.leftovers() == []


def test_a_plain_job_whose_gpus_are_unknown_is_not_looked_at(node: Env) -> None:
    assert lifecycle.epilog(health_ctx(node, SLURM_JOB_GPUS="9")) == 0
    assert node.logs == ["slurm-gpu: epilog job 100: leftovers not checked: Slurm GPU index 9 names "
                         "no GPU of this node (gres.conf and NVML disagree) (gres.conf)"]


def test_an_mps_jobs_own_gpus_are_looked_at_only_with_a_health_state_dir(node: Env, monkeypatch) -> None:
    """Its own record does not make its GPUs "another job's"; without [health] nothing is read."""
    seen = processes_asked(monkeypatch)
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")) == 0, node.logs
    assert lifecycle.epilog(node.ctx(SLURM_JOB_GPUS="1")) == 0, node.logs
    assert seen == []
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")) == 0, node.logs
    assert lifecycle.epilog(health_ctx(node, SLURM_JOB_GPUS="1")) == 0, node.logs
    assert len(seen) == 1 and len(seen[0]) == 1


def test_a_gpu_another_jobs_record_lists_is_not_this_jobs_leftover(node: Env, monkeypatch) -> None:
    seen = processes_asked(monkeypatch)
    assert lifecycle.prolog(node.ctx(SLURM_JOB_ID="101", SLURM_JOB_GPUS="1",
                                     SPANK_SLURM_GPU_MPS="default")) == 0, node.logs
    assert lifecycle.epilog(health_ctx(node, SLURM_JOB_GPUS="1")) == 0, node.logs   # plain job 100
    assert seen == []
    assert lifecycle.epilog(health_ctx(node, SLURM_JOB_ID="101", SLURM_JOB_GPUS="1")) == 0
    assert len(seen) == 1 and node.leftovers("101") == []


def test_leftovers_read_through_nvml_on_the_gpu_the_record_names(node: Env) -> None:
    """The simulator's NVML answers (no process left): nothing to say."""
    assert lifecycle.epilog(health_ctx(node, SLURM_JOB_GPUS="2")) == 0
    assert node.logs == []


def test_leftovers_never_guess_a_gpu_by_a_stale_minor(node: Env) -> None:
    """The node model says GPU 2 is minor 3: not checked, said so (never another GPU read)."""
    real = node.node

    def swapped():
        n = real()
        n.gpus[2].minor, n.gpus[3].minor = n.gpus[3].minor, n.gpus[2].minor
        return n
    node.node = swapped
    uuid = next(g.uuid for g in real().gpus if g.minor == 2)
    assert lifecycle.epilog(health_ctx(node, SLURM_JOB_GPUS="2")) == 0
    assert node.logs == [f"slurm-gpu: epilog job 100: leftovers not checked: GPU {uuid} is /dev/nvidia2, "
                         f"not /dev/nvidia3 as recorded ({uuid})"]


@pytest.mark.parametrize("job,drained", [("555", False), ("100", True)])
def test_the_users_process_in_a_jobs_cgroup_is_that_jobs(node: Env, monkeypatch, job: str,
                                                          drained: bool) -> None:
    """A process of the same user in job 555's cgroup (v1 freezer, as Slurm names it) is
    job 555's: no leftover of job 100.  In job 100's own cgroup it is: drained for it."""
    from slurm_gpu.health import userproblem
    freezer = "/sys/fs/cgroup/freezer"
    if not os.path.isfile(os.path.join(freezer, "cgroup.procs")):
        pytest.skip("no cgroup v1 freezer hierarchy here")
    cg = os.path.join(freezer, f"slurm_sgt{os.getpid()}", f"uid_{_uid('sgtest1')}", f"job_{job}")
    os.makedirs(cg)
    drains: list[tuple[str, str, float]] = []       # the epilog waits 10 s at most for slurmctld
    monkeypatch.setattr(userproblem, "drain", lambda n, reason, timeout: (drains.append((n, reason, timeout)),
                                                                          "drained")[1])
    other = _process_on_the_gpu(monkeypatch, "sgtest1", cg)
    try:
        assert lifecycle.epilog(health_ctx(node, SLURM_JOB_GPUS="1")) == 0
    finally:
        other.kill()
        other.wait()
        for d in (cg, os.path.dirname(cg), os.path.dirname(os.path.dirname(cg))):
            os.rmdir(d)
    reason = f"slurm-gpu: user-problem: job 100 left process {other.pid} on GPU 00000000:01:00.0"
    assert drains == ([("n1", reason, 10.0)] if drained else [])
    assert node.logs == ([f"{reason} [drained]"] if drained else [])
    marker = userproblem.load_marker(userproblem.marker_path(str(node.base / "health"), "n1"))
    assert marker == (userproblem.Marker(reason, "100", _uid("sgtest1"), ("00000000:01:00.0",))
                      if drained else None)


def test_a_leftover_of_a_job_without_a_known_user_is_drained_for_nobody(node: Env, monkeypatch) -> None:
    from slurm_gpu.health import userproblem as up
    from slurm_gpu.hw import nvml_health
    monkeypatch.setattr(up, "drain", lambda n, reason, timeout: "drained")
    proc = subprocess.Popen(["/bin/sleep", "60"], user=_uid("sgtest1"))
    ctx = health_ctx(node, SLURM_JOB_GPUS="1")
    del ctx.env["SLURM_JOB_UID"]
    try:
        monkeypatch.setattr(nvml_health, "read_processes", lambda gpus, indices: nvml_health.NvmlHealth(
            available=True, gpus=[nvml_health.GpuHealth(index=i, bus_id="00000000:01:00.0",
                                                         processes=((proc.pid, None),)) for i in indices]))
        assert lifecycle.epilog(ctx) == 0
    finally:
        proc.kill()
        proc.wait()
    reason = f"slurm-gpu: user-problem: job 100 left process {proc.pid} on GPU 00000000:01:00.0"
    assert node.logs == [f"{reason} [drained]"]
    assert up.load_marker(up.marker_path(str(node.base / "health"), "n1")) == \
        up.Marker(reason, "100", None, ("00000000:01:00.0",))


def test_a_plain_job_without_a_user_in_its_environment_is_looked_at(node: Env) -> None:
    ctx = health_ctx(node, SLURM_JOB_GPUS="2")
    del ctx.env["SLURM_JOB_UID"]
    assert lifecycle.epilog(ctx) == 0
    assert node.logs == []


def test_undo_never_restores_a_compute_mode_by_a_stale_minor(node: Env) -> None:
    """Recorded for the GPU now at minor 2 as minor 3 (renumbered since): the GPU at
    minor 3 is another one, so nothing is set and the node is at fault."""
    api = node.api()
    by_minor = {g.minor: g for g in node.node().gpus}
    api.set_compute_mode(api.find(uuid=by_minor[3].uuid), 3)
    st = js.new("100", uid=_uid("sgtest1"), gid=1, user="sgtest1")
    st.compute_mode_saved = {by_minor[2].uuid: {"mode": 0, "minor": 3}}
    js.save(node.state_dir, st)
    assert lifecycle.epilog(node.ctx()) == 1
    assert node.api().compute_mode(node.api().find(uuid=by_minor[3].uuid)) == 3
    u = by_minor[2].uuid
    assert node.logs == [f"slurm-gpu: GPU {u} is /dev/nvidia2, not /dev/nvidia3 as recorded ({u}) "
                         "[epilog job 100: cleanup incomplete, on_internal_error=drain]"]


def test_on_26_05_the_users_process_in_its_own_sluid_cgroup_is_a_leftover(node: Env, monkeypatch) -> None:
    """26.05 names the job's cgroup by its SLUID (cgroup v2): a process there is this job's."""
    from slurm_gpu.health import userproblem
    unified = "/sys/fs/cgroup/unified"
    if not os.path.isfile(os.path.join(unified, "cgroup.procs")):
        pytest.skip("no cgroup v2 hierarchy here")
    sluid = "s0123456789ABC"
    top = os.path.join(unified, f"sgt{os.getpid()}.slice")
    cg = os.path.join(top, "n1_slurmstepd.scope", sluid)
    os.makedirs(cg)
    drains: list[str] = []
    monkeypatch.setattr(userproblem, "drain", lambda n, reason, timeout: (drains.append(reason), "drained")[1])
    other = _process_on_the_gpu(monkeypatch, "sgtest1", cg)
    try:
        assert lifecycle.epilog(health_ctx(node, SLURM_JOB_GPUS="1", SLURM_JOB_SLUID=sluid)) == 0
    finally:
        other.kill()
        other.wait()
        for d in (cg, os.path.dirname(cg), top):
            os.rmdir(d)
    assert drains == [f"slurm-gpu: user-problem: job 100 left process {other.pid} on GPU 00000000:01:00.0"]


def test_a_leftover_while_an_earlier_user_problem_drain_is_open_is_only_said(node: Env, monkeypatch) -> None:
    from slurm_gpu.health import userproblem as up
    from slurm_gpu.hw import nvml_health
    drains: list[str] = []
    monkeypatch.setattr(up, "drain", lambda n, reason, timeout: (drains.append(reason), "drained")[1])
    health = str(node.base / "health")
    earlier = up.Marker("slurm-gpu: user-problem: job 99 left process 1 on GPU x", "99", 1, ("x",))
    up.save_marker(up.marker_path(health, "n1"), earlier)
    mine = subprocess.Popen(["/bin/sleep", "60"], user=_uid("sgtest1"))
    try:
        monkeypatch.setattr(nvml_health, "read_processes", lambda gpus, indices: nvml_health.NvmlHealth(
            available=True, gpus=[nvml_health.GpuHealth(index=i, bus_id="00000000:01:00.0",
                                                         processes=((mine.pid, None),)) for i in indices]))
        assert lifecycle.epilog(health_ctx(node, SLURM_JOB_GPUS="1")) == 0
    finally:
        mine.kill()
        mine.wait()
    assert drains == []
    assert node.logs == [f"slurm-gpu: user-problem: job 100 left process {mine.pid} on GPU 00000000:01:00.0 "
                         "[not drained: an earlier user-problem drain is still open]"]
    assert up.load_marker(up.marker_path(health, "n1")) == earlier


def test_a_rerun_prolog_sweeps_other_jobs_only_and_says_it_cleans_its_own_first(node: Env) -> None:
    d = node.base / "bin"
    d.mkdir()
    (d / "squeue").write_text(f"#!/bin/sh\necho \"$@\" >> {d}/argv\n")       # knows no job: all gone
    (d / "squeue").chmod(0o755)
    node.jobs.scancel = str(d / "scancel")
    for jobid in ("99", "100"):                      # a stale job, and this job's earlier run
        js.save(node.state_dir, js.new(jobid, uid=_uid("sgtest1"), gid=1, user="sgtest1"))
    ctx = node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")
    ctx.node_name = "n1"
    assert lifecycle.prolog(ctx) == 0, node.logs
    assert (d / "argv").read_text() == "-h -t all -j 99 -o %A|%T|%N\n"
    assert node.logs[:2] == ["slurm-gpu: stale job 99: cleaned up",
                             "slurm-gpu: prolog job 100: cleaning up an earlier run's state first"]
    st = js.load(node.state_dir, "100")
    assert js.list_jobs(node.state_dir) == ["100"] and st.phase == "ready"
    assert st.options == {"mps": "default", "mig": None}
    assert lifecycle.epilog(node.ctx(SLURM_JOB_GPUS="1")) == 0 and node.leftovers() == []


def test_a_rerun_prolog_asks_the_earlier_daemon_to_quit_as_the_job_user(node: Env) -> None:
    ctx = node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    node.logs.clear()
    assert lifecycle.prolog(ctx) == 0, node.logs          # requeued here before its epilog ran
    assert node.logs == ["slurm-gpu: prolog job 100: cleaning up an earlier run's state first"]
    assert lifecycle.epilog(ctx) == 0 and node.leftovers() == []


def test_a_rerun_prolog_names_what_it_had_to_kill(node: Env) -> None:
    ctx = node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    node.logs.clear()
    node.mps.quit_timeout = 0.1             # the client below never quits: do not wait for it
    pipe = js.load(node.state_dir, "100").mps["pipe_dir"]
    client = subprocess.Popen(["/bin/sleep", "60"], env={"CUDA_MPS_PIPE_DIRECTORY": pipe},
                              user=_uid("sgtest1"))
    try:
        assert lifecycle.prolog(ctx) == 0, node.logs
        client.wait(timeout=10)
    finally:
        client.kill()
        client.wait()
    killed = node.logs[1].removeprefix("slurm-gpu: prolog job 100: MPS: killed stragglers ")
    assert str(client.pid) in killed.split(","), node.logs
    assert lifecycle.epilog(ctx) == 0 and node.leftovers() == []


def test_an_epilog_without_slurmds_user_takes_the_recorded_one(node: Env) -> None:
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")) == 0, node.logs
    ctx = node.ctx(SLURM_JOB_GPUS="1")
    del ctx.env["SLURM_JOB_UID"]
    assert lifecycle.epilog(ctx) == 0
    assert node.logs == [] and node.leftovers() == []       # asked to quit: nothing to kill


def test_the_job_id_is_also_read_from_slurm_jobid(node: Env) -> None:
    """SLURM_JOBID, the older name, when SLURM_JOB_ID is not set."""
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")) == 0, node.logs
    ctx = node.ctx(SLURM_JOB_GPUS="1", SLURM_JOBID="100")
    del ctx.env["SLURM_JOB_ID"]
    assert lifecycle.epilog(ctx) == 0
    assert node.leftovers() == []
    del ctx.env["SLURM_JOBID"]
    with pytest.raises(InputError) as e:            # neither: one line, naming the variable
        lifecycle.epilog(ctx)
    assert e.value.line() == "slurm-gpu: bad job id '' (SLURM_JOB_ID)"
