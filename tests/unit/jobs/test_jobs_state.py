"""Job state file, per-task environment, `job show`, blockers, `mig apply`."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_gpu.cli import main
from slurm_gpu.errors import InputError
from slurm_gpu.jobs import state as js
from slurm_gpu.jobs.state import JobFailed, task_env, task_share
from slurm_gpu.mig import blockers


def test_save_load_remove_atomic(tmp_path: Path) -> None:
    st = js.new("12", uid=1001, gid=1001, user="sgtest1")
    js.save(tmp_path, st)
    assert js.load(tmp_path, "12") == st
    assert js.list_jobs(tmp_path) == ["12"]
    assert sorted(p.name for p in (tmp_path / "jobs").iterdir()) == ["12.json", "12.json.copy"]
    js.remove(tmp_path, "12")
    js.remove(tmp_path, "12")
    assert js.load(tmp_path, "12") is None


def test_records_compare_by_value_and_share_no_defaults() -> None:
    a, b = js.new("3", uid=1, gid=2, user="u"), js.new("3", uid=1, gid=2, user="u")
    assert a == b and repr(a) == repr(b) and repr(a).startswith("JobRecord(jobid='3', uid=1, ")
    a.gpus.append({"index": 0})
    a.compute_mode_saved["GPU-x"] = {"mode": 0, "minor": 0}
    assert a != b and b.gpus == [] and b.compute_mode_saved == {}
    assert a != a.to_dict() and js.JobRecord.from_dict(a.to_dict()) == a


@pytest.mark.parametrize("bad", ["../1", "1/2", "", "12a", "1" * 13, "12\n", "\u0661\u0662"])
def test_job_ids_cannot_escape(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InputError):
        js.path(tmp_path, bad)


GOOD = {"version": 2, "jobid": "5", "uid": 1000, "gid": 1000, "user": "u", "phase": "ready", "gpus": [],
        "whole_gpus": True, "options": {"mps": "50", "mig": None}, "mps": None, "mig": None,
        "compute_mode_saved": {}, "error": None, "consequence": None}
# What the prolog of the version before the JobRecord (issue 25) wrote.
GOOD_V1 = {"version": 1, "jobid": "5", "uid": 1000, "gid": 1000, "user": "u", "phase": "failed",
           "gpus": [{"index": 0, "uuid": "GPU-0", "minor": 0, "cpus": [0]}], "whole_gpus": True,
           "options": {"mps": "50", "mig": None},
           "mps": {"pipe_dir": "/run/x/5/pipe", "log_dir": "/run/x/5/log", "ready": False},
           "mig": None, "error": "slurm-gpu: --gpu-mps is disabled on this cluster ([mps] enabled)"}


@pytest.mark.parametrize("text", [
    "{not json", "[1]", "9" * 5000, "[" * 100000, json.dumps({**GOOD, "version": 3}),
    json.dumps({**GOOD, "version": True}), json.dumps({**GOOD, "phase": "running"}),
    json.dumps({**GOOD, "consequence": "maybe"}), json.dumps({**GOOD, "whole_gpus": "yes"}),
    json.dumps({**GOOD_V1, "phase": None}),
    json.dumps({**GOOD, "jobid": "6"}), json.dumps({**GOOD, "uid": -1}), json.dumps({**GOOD, "uid": True}),
    json.dumps({**GOOD, "gid": 1 << 40}), json.dumps({**GOOD, "gpus": [1, 2]}), json.dumps({**GOOD, "gpus": {}}),
    json.dumps({**GOOD, "mps": "x"}), json.dumps({**GOOD, "mig": {"gpus": [{"instances": "x"}]}}),
    json.dumps({**GOOD, "error": 3}), json.dumps({**GOOD, "phase": None}),
])
def test_corrupt_state_is_set_aside_with_one_warning(tmp_path: Path, text: str) -> None:
    # Issue 10 point 6: a torn or broken record must not fail the epilog (a
    # node drain) or every later prolog: it is dropped with one warning.
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "5.json").write_text(text)
    said: list[str] = []
    assert js.load(tmp_path, "5", warn=said.append) is None
    assert len(said) == 1 and said[0].startswith("slurm-gpu: warning: dropped a corrupt job state file")
    assert (tmp_path / "jobs" / "5.json.corrupt").exists() and js.list_jobs(tmp_path) == []
    assert js.load(tmp_path, "5", warn=said.append) is None and len(said) == 1


def test_a_good_state_loads(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "5.json").write_text(json.dumps(GOOD))
    st = js.load(tmp_path, "5")
    assert isinstance(st, js.JobRecord) and st.to_dict() == GOOD
    assert (st.jobid, st.uid, st.phase, st.whole_gpus) == ("5", 1000, js.Phase.READY, True)


def test_a_record_written_before_an_upgrade_still_works(tmp_path: Path) -> None:
    """A version-1 record (the prolog of the package before the upgrade wrote it)
    is read: its epilog undoes what it lists, its tasks fail with its error."""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "5.json").write_text(json.dumps(GOOD_V1))
    said: list[str] = []
    st = js.load(tmp_path, "5", warn=said.append)
    assert st is not None and said == []
    assert (st.phase, st.gpus, st.mps, st.options) == ("failed", GOOD_V1["gpus"], GOOD_V1["mps"],
                                                         GOOD_V1["options"])
    # the prefix is the edge's now: the record keeps the message, the task says it once
    assert st.error == "--gpu-mps is disabled on this cluster ([mps] enabled)"
    with pytest.raises(JobFailed) as ei:
        task_env(st, 0, 1)
    assert ei.value.line() == GOOD_V1["error"]
    # saved again (the epilog's undo does), it is a version-2 record with the same content
    js.save(tmp_path, st)
    again = json.loads((tmp_path / "jobs" / "5.json").read_text())
    assert again["version"] == js.VERSION == 2 and js.load(tmp_path, "5") == st
    # an old record without the keys added later (whole_gpus, options) reads as well
    old = {k: v for k, v in GOOD_V1.items() if k not in ("whole_gpus", "options")}
    (tmp_path / "jobs" / "5.json").write_text(json.dumps({**old, "phase": "prolog", "error": None}))
    st = js.load(tmp_path, "5")
    assert st is not None and (st.whole_gpus, st.options, st.phase, st.error) == (None, None, "prolog", None)
    assert js.gpus_held(str(tmp_path)) == {"GPU-0": "5", "index:0": "5"}


@pytest.mark.parametrize("n,ntasks,want", [
    (4, 2, [[0, 1], [2, 3]]), (3, 3, [[0], [1], [2]]), (4, 3, [[0], [1], [2, 3]]),
    (2, 4, [[0], [1], [0], [1]]), (1, 2, [[0], [0]]), (0, 2, [[], []])])
def test_task_share(n: int, ntasks: int, want: list[list[int]]) -> None:
    assert [task_share(n, t, ntasks) for t in range(ntasks)] == want


def _state_with(mig: bool = True, mps: bool = True, ready: bool = True) -> js.JobRecord:
    """A record whose prolog finished (phase ready); *ready* False: MPS and MIG not ready."""
    st = js.new("9", uid=1, gid=1, user="u")
    st.phase = js.Phase.READY
    if mps:
        st.mps = {"pipe_dir": "/run/x/9/pipe", "log_dir": "/run/x/9/log", "ready": ready}
    if mig:
        st.mig = {"ready": ready, "layout": "2x1g.10gb", "gpus": [
            {"index": 0, "instances": [{"uuid": "MIG-a"}, {"uuid": "MIG-b"}]},
            {"index": 1, "instances": [{"uuid": "MIG-c"}]}]}
    return st


def test_task_env_mps_and_mig() -> None:
    st = _state_with()
    e0, e1 = task_env(st, 0, 2), task_env(st, 1, 2)
    assert e0["CUDA_MPS_PIPE_DIRECTORY"] == "/run/x/9/pipe"
    assert e0["CUDA_MPS_LOG_DIRECTORY"] == "/run/x/9/log"
    assert (e0["CUDA_VISIBLE_DEVICES"], e1["CUDA_VISIBLE_DEVICES"]) == ("MIG-a", "MIG-b,MIG-c")
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in e0   # Slurm's gres/mps owns that one


def test_task_env_nothing_until_ready_and_error_fails() -> None:
    assert task_env(_state_with(ready=False), 0, 1) == {}
    assert task_env(None, 0, 1) == {}
    # a prolog that died before phase ready (no error recorded): the tasks
    # fail, rather than run without what the job asked for
    unfinished = _state_with()
    unfinished.phase = js.Phase.PROLOG
    with pytest.raises(JobFailed) as ei:
        task_env(unfinished, 0, 1)
    assert ei.value.line() == ("slurm-gpu: the prolog of job 9 did not finish setting up "
                               "MPS/MIG on this node (phase prolog)")
    assert ei.value.consequence == "user"      # the job fails; the node is not drained
    st = _state_with()
    st.fail("slurm-gpu: MIG layout 2x4g.40gb asks for 2 x 4g.40gb (--gpu-mig)", "user")
    assert st.error == "MIG layout 2x4g.40gb asks for 2 x 4g.40gb (--gpu-mig)"
    with pytest.raises(JobFailed) as ei:
        task_env(st, 0, 1)
    assert ei.value.line() == "slurm-gpu: " + st.error


def test_job_show(tmp_path: Path, monkeypatch, capsys) -> None:
    from slurm_gpu import config
    conf = tmp_path / "c.toml"
    conf.write_text(f'[node]\nstate_dir = "{tmp_path}/var"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(conf))
    config.clear_cache()
    st = _state_with()
    st.gpus = [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100 NVL", "cpus": [0, 1]}]
    st.mig["gpus"][0]["instances"] = [{"uuid": "MIG-a", "profile": "3g.47gb", "gi_id": 1,
                                       "ci_id": 0, "start": 4, "size": 4}]
    st.mps["cpus"] = "0,1"
    js.save(tmp_path / "var", st)
    assert main(["job", "show", "9"]) == 0
    out = capsys.readouterr().out
    assert "GPU 0  NVIDIA H100 NVL  GPU-0  local CPUs 0,1" in out
    assert "MPS: ready  pipe /run/x/9/pipe" in out and "pids none" in out
    assert "3g.47gb" in out and "GI 1" in out and "MIG-a" in out
    assert "MPS hold" not in out                    # none recorded: the job's cgroup from the start
    st.mps["hold"] = ["/sys/fs/cgroup/slurm_gpu_mps_hold/n1/job_9"]
    st.mps["hold_devices"] = "the job's GPUs only (/dev/nvidia0)"
    js.save(tmp_path / "var", st)
    assert main(["job", "show", "9"]) == 0
    assert ("  MPS hold until the first step: /sys/fs/cgroup/slurm_gpu_mps_hold/n1/job_9  GPU limit: "
            "the job's GPUs only (/dev/nvidia0)\n") in capsys.readouterr().out
    assert main(["job", "show", "9", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["jobid"] == "9"
    assert main(["job", "show", "10"]) == 1
    assert "job 10 has no GPU state on this node" in capsys.readouterr().err
    assert main(["job", "list"]) == 0 and capsys.readouterr().out.split() == ["9"]
    config.clear_cache()


def test_blockers_found_in_proc_and_slurm_conf(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, comm in ((11, "nv-hostengine"), (12, "bash"), (13, "nvidia-persiste")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text("# AcctGatherEnergyType=acct_gather_energy/gpu (comment)\n"
                    "AcctGatherEnergyType=acct_gather_energy/gpu\n"
                    "AccountingStorageTRES=gres/gpu,gres/gpumem,gres/gpuutil\n")
    found = blockers.find(proc=str(proc), slurm_conf=str(conf))
    names = [b.name for b in found]
    assert names == ["DCGM host engine (nv-hostengine)", "nvidia-persistenced",
                     "slurmd GPU energy accounting", "slurmstepd GPU accounting"]
    text = blockers.explain(found)
    assert "pid 11" in text and "acct_gather_energy/none" in text
    conf.write_text("AcctGatherEnergyType=acct_gather_energy/ipmi\n")
    assert blockers.find(proc=str(tmp_path / "none"), slurm_conf=str(conf)) == []
    assert "no known blocker" in blockers.explain([])


@pytest.mark.skipif(os.geteuid() != 0, reason="MIG changes need root (as NVML)")
def test_mig_apply_acts_only_on_drift(tmp_path: Path, sim_config: Path, capsys) -> None:
    sim = sim_config
    cfg = tmp_path / "mig.yaml"
    cfg.write_text("version: v1\nmig-configs:\n  balanced:\n    - devices: [1]\n"
                   "      mig-enabled: true\n      mig-devices:\n        \"3g.47gb\": 1\n"
                   "        \"2g.24gb\": 1\n        \"1g.12gb\": 2\n"
                   "  off:\n    - devices: all\n      mig-enabled: false\n")
    assert main(["mig", "apply", str(cfg), "-c", "balanced", "--check"]) == 1
    assert main(["mig", "apply", str(cfg), "-c", "balanced",
                 "--gres-conf", str(tmp_path / "gres.conf")]) == 0
    out = capsys.readouterr().out
    assert "changed GPU 1" in out and "wrote" in out
    gres = (tmp_path / "gres.conf").read_text()
    assert "3g.47gb" in gres and "1g.12gb" in gres
    before = sim.read_text()
    assert main(["mig", "apply", str(cfg), "-c", "balanced"]) == 0
    assert "nothing changed" in capsys.readouterr().out
    assert json.loads(sim.read_text())["facts"] == json.loads(before)["facts"]
    assert main(["mig", "apply", str(cfg), "-c", "balanced", "--check"]) == 0
    # a GPU a job uses is not touched
    from slurm_gpu.jobs import state as jobstate
    st = jobstate.new("77", uid=1, gid=1, user="u")
    st.gpus = [{"index": 1}]
    jobstate.save(tmp_path / "var", st)
    assert main(["mig", "apply", str(cfg), "-c", "off"]) == 1
    assert "in use by job 77" in capsys.readouterr().err


def test_mig_apply_bad_config(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "m.yaml"
    cfg.write_text("version: v1\nmig-configs:\n  a: []\n  b: []\n")
    assert main(["mig", "apply", str(cfg)]) == 2
    assert "choose one with --select" in capsys.readouterr().err
    assert main(["mig", "apply", str(tmp_path / "nope.yaml")]) == 1


def _other_uid() -> int:
    import pwd
    try:
        return pwd.getpwnam("sgtest1").pw_uid
    except KeyError:
        pytest.skip("user sgtest1 missing")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant other users' files")
@pytest.mark.parametrize("plant", ["user-owned", "group-writable", "symlink", "fifo", "dir-777"])
def test_state_anyone_but_root_could_write_is_refused(tmp_path: Path, plant: str) -> None:
    """The epilog acts on the state file as root: a planted one is never believed."""
    st = js.new("12", uid=1001, gid=1001, user="sgtest1")
    st.mps = {"job_dir": "/etc", "pids": [1]}
    js.save(tmp_path, st)
    f = tmp_path / "jobs" / "12.json"
    if plant == "user-owned":
        os.chown(f, _other_uid(), -1)
    elif plant == "group-writable":
        f.chmod(0o664)
    elif plant == "symlink":
        real = tmp_path / "elsewhere.json"
        f.rename(real)
        f.symlink_to(real)
    elif plant == "fifo":
        f.unlink()
        os.mkfifo(f)
    else:
        (tmp_path / "jobs").chmod(0o777)
    with pytest.raises(InputError, match="job state"):
        js.load(tmp_path, "12")
    if plant == "dir-777":
        with pytest.raises(InputError, match="not writable by others"):
            js.save(tmp_path, st)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant other users' files")
def test_state_dir_under_a_user_writable_directory_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, _other_uid(), -1)
    with pytest.raises(InputError, match="users other than root can change"):
        js.save(shared / "state", js.new("12", uid=1001, gid=1001, user="sgtest1"))
    with pytest.raises(InputError, match="users other than root can change"):
        js.load(shared / "state", "12")


def test_a_corrupt_record_falls_back_to_its_copy(tmp_path) -> None:
    """A damaged state file must not orphan what it listed: its copy still says it."""
    st = js.new("12", uid=1001, gid=1001, user="u")
    st.mig = {"layout": "3g.40gb", "ready": True, "gpus": [{"index": 0, "instances": []}]}
    js.save(tmp_path, st)
    main = tmp_path / "jobs" / "12.json"
    main.write_text('{"version": 1, "jobid": "12", "uid": "ro')      # torn
    warnings: list[str] = []
    assert js.load(tmp_path, "12", warn=warnings.append) == st
    assert any("using the copy" in w for w in warnings)
    assert (tmp_path / "jobs" / "12.json.corrupt").exists()
    # both broken: no record, both set aside, nothing fails
    js.save(tmp_path, st)
    main.write_text("garbage")
    (tmp_path / "jobs" / "12.json.copy").write_text("[]")
    assert js.load(tmp_path, "12", warn=warnings.append) is None
    assert js.list_jobs(tmp_path) == []
    js.save(tmp_path, st)
    js.remove(tmp_path, "12")
    assert sorted(p.name for p in (tmp_path / "jobs").iterdir() if ".corrupt" not in p.name) == []


def test_a_save_killed_between_mkstemp_and_rename_leaves_nothing_after_remove(tmp_path) -> None:
    # A real SIGKILL of the prolog inside atomic_write leaves ".<jobid>.json[.copy].<x>.tmp"
    # (the 500-lifecycle campaign hit it at lifecycle 207): the sweep must find
    # the job, and its teardown's remove() must take the file.
    d = Path(js.jobs_dir(str(tmp_path)))
    d.mkdir(parents=True)
    for n in (".900207.json.copy.15by0d_i.tmp", ".900207.json.k2j3.tmp", ".9.json.x.tmp", ".notajob.json.x.tmp"):
        (d / n).write_text("{")
    assert js.list_jobs(str(tmp_path)) == ["9", "900207"]
    js.remove(str(tmp_path), "900207")
    assert sorted(p.name for p in d.iterdir()) == [".9.json.x.tmp", ".notajob.json.x.tmp"]
