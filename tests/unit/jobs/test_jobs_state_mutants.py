"""jobs/state.py, each behaviour asserted whole: the mutants mutmut made of it
survived test_jobs_state.py (docs/development.md, mutation testing).

Pure: no root, no NVML, a temporary state directory.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from slurm_gpu.errors import InputError
from slurm_gpu.jobs import state as js
from slurm_gpu.jobs.state import JobFailed, JobRecord, task_env

GOOD = {"version": 2, "jobid": "5", "uid": 1000, "gid": 1000, "user": "u", "phase": "ready", "gpus": [],
        "whole_gpus": True, "options": None, "mps": None, "mig": None,
        "compute_mode_saved": {}, "error": None, "consequence": None}


@pytest.mark.parametrize("data,why", [
    ([], "not an object"),
    ({**GOOD, "version": 0}, "unknown format"),
    ({**GOOD, "version": 3}, "unknown format"),
    ({**GOOD, "version": True}, "unknown format"),
    ({**GOOD, "jobid": "6"}, "names another job"),
    ({**GOOD, "uid": -1}, "uid is not an id"),
    ({**GOOD, "uid": 1 << 32}, "uid is not an id"),
    ({**GOOD, "gid": 1 << 32}, "gid is not an id"),
    ({**GOOD, "gid": "1000"}, "gid is not an id"),
    ({**GOOD, "gid": False}, "gid is not an id"),
    ({**GOOD, "user": 5}, "user or phase of the wrong type"),
    ({**GOOD, "phase": 5}, "user or phase of the wrong type"),
    ({**GOOD, "error": 3}, "error is not text"),
    ({**GOOD, "phase": "running"}, "unknown phase"),
    ({**GOOD, "consequence": "maybe"}, "unknown consequence"),
    ({**GOOD, "whole_gpus": 1}, "whole_gpus is not a boolean"),
    ({**GOOD, "gpus": [1]}, "gpus is not a list of records"),
    ({**GOOD, "mps": []}, "mps is not a record"),
    ({**GOOD, "mig": "x"}, "mig is not a record"),
    ({**GOOD, "options": "x"}, "options is not a record"),
    ({**GOOD, "compute_mode_saved": []}, "compute_mode_saved is not a record"),
    ({**GOOD, "mig": {"gpus": {}}}, "mig.gpus is not a list of records"),
    ({**GOOD, "mig": {"gpus": [1]}}, "mig.gpus is not a list of records"),
    ({**GOOD, "mig": {"gpus": [{"instances": {}}]}}, "mig.gpus is not a list of records"),
    ({**GOOD, "mig": {"gpus": [{"instances": [1]}]}}, "mig.gpus is not a list of records"),
])
def test_malformed_says_why(data, why: str) -> None:
    assert js.malformed(data, "5") == why


@pytest.mark.parametrize("data", [
    GOOD, {**GOOD, "uid": 0, "gid": 0}, {**GOOD, "uid": (1 << 32) - 1},
    {**GOOD, "mig": {"gpus": [{"index": 0}]}}, {**GOOD, "mig": {"gpus": [{"instances": [{}]}]}},
    {**GOOD, "mig": {}},
    # version 1: any phase text, no consequence or whole_gpus checks
    {**GOOD, "version": 1, "phase": "running", "consequence": "maybe", "whole_gpus": 1},
])
def test_malformed_accepts_what_a_prolog_writes(data) -> None:
    assert js.malformed(data, "5") is None


@pytest.mark.parametrize("bad", ["", "1" * 13])
def test_job_id_length_bounds(bad: str) -> None:
    with pytest.raises(InputError) as e:
        js.check_jobid(bad)
    assert e.value.line() == f"slurm-gpu: bad job id {bad!r} (SLURM_JOB_ID)"
    assert js.check_jobid("1" * 12) == "1" * 12 and js.check_jobid(7) == "7"


def test_record_round_trip_keeps_every_field(tmp_path: Path) -> None:
    st = js.new("5", uid=1000, gid=1001, user="u")
    st.gpus = [{"index": 0, "uuid": "GPU-0", "minor": 0, "cpus": [0, 1]}]
    st.whole_gpus = False
    st.options = {"mps": "50", "mig": None}
    st.mps = {"pipe_dir": "/p", "log_dir": "/l", "ready": True}
    st.mig = {"layout": "1g.10gb", "ready": True, "gpus": []}
    st.compute_mode_saved = {"GPU-0": {"mode": 0, "minor": 0}}
    st.fail("slurm-gpu: no (x)", "node")
    js.save(tmp_path, st)
    data = json.loads((tmp_path / "jobs" / "5.json").read_text())
    assert data == {"version": 2, "jobid": "5", "uid": 1000, "gid": 1001, "user": "u",
                    "phase": "failed", "gpus": st.gpus, "whole_gpus": False, "options": st.options,
                    "mps": st.mps, "mig": st.mig, "compute_mode_saved": st.compute_mode_saved,
                    "error": "no (x)", "consequence": "node"}
    assert (tmp_path / "jobs" / "5.json.copy").read_text() == (tmp_path / "jobs" / "5.json").read_text()
    for name in ("5.json", "5.json.copy"):
        assert stat.S_IMODE((tmp_path / "jobs" / name).stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "jobs").stat().st_mode) == 0o755
    back = js.load(tmp_path, "5")
    assert back == st and back.consequence == "node" and back.compute_mode_saved == st.compute_mode_saved
    assert js.exists(tmp_path, "5") and not js.exists(tmp_path, "6")


@pytest.mark.parametrize("phase,error,want", [
    ("ready", None, "ready"), ("prolog", None, "prolog"), ("failed", "slurm-gpu: x", "failed"),
    ("running", None, "prolog"), ("running", "slurm-gpu: x", "failed"),
])
def test_version_1_phase_and_error(phase: str, error: str | None, want: str) -> None:
    v1 = {**GOOD, "version": 1, "phase": phase, "error": error, "consequence": "user"}
    st = JobRecord.from_dict(v1)
    assert (st.phase, st.error, st.consequence, st.version) == (want, error and "x", None, 2)
    v2 = JobRecord.from_dict({**GOOD, "phase": "failed", "error": "slurm-gpu: y", "consequence": "user"})
    assert (v2.error, v2.consequence) == ("slurm-gpu: y", "user")     # version 2 is taken as it is


def test_fail_and_stand_in() -> None:
    st = js.new("5", uid=1, gid=1, user="u")
    st.fail("plain", "input")
    assert (st.phase, st.error, st.consequence) == ("failed", "plain", "input")
    s = JobRecord.stand_in("9")
    assert (s.jobid, s.uid, s.gid, s.user, s.phase, s.gpus, s.mps, s.mig, s.error) == \
        ("9", None, None, "", "prolog", [], None, None, None)
    with pytest.raises(InputError):
        JobRecord.stand_in("../9")


def test_a_stand_in_is_never_saved(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        js.save(tmp_path, JobRecord.stand_in("9"))
    assert e.value.line() == "slurm-gpu: a stand-in job record is never saved (job 9)"
    assert not (tmp_path / "jobs").exists()


def test_task_env_mig_devices_and_mig_without_instances() -> None:
    st = js.new("9", uid=1, gid=1, user="u")
    st.phase = js.Phase.READY
    st.mig = {"layout": "x", "ready": True, "gpus": [{"index": 0}, {"index": 1, "instances": [
        {"uuid": "MIG-a"}, {"uuid": None}, {"uuid": "MIG-b"}]}]}
    assert st.mig_uuids() == ["MIG-a", "MIG-b"]
    assert task_env(st, 0, 1) == {"CUDA_VISIBLE_DEVICES": "MIG-a,MIG-b",
                                  "SLURM_GPU_MIG_DEVICES": "MIG-a,MIG-b"}
    assert js.new("9", uid=1, gid=1, user="u").mig_uuids() == []
    st.fail("nope (x)", "user")
    with pytest.raises(JobFailed) as e:
        task_env(st, 0, 1)
    assert e.value.line() == "slurm-gpu: nope (x)"


def test_gpus_held_counts_an_unreadable_record_and_reads_the_others(tmp_path: Path) -> None:
    for jobid, uuid in (("3", "GPU-3"), ("5", "GPU-5")):
        st = js.new(jobid, uid=1, gid=1, user="u")
        st.gpus = [{"index": int(jobid), "uuid": uuid}]
        js.save(tmp_path, st)
    (tmp_path / "jobs" / "4.json").write_text("{}")
    os.chmod(tmp_path / "jobs" / "4.json", 0o666)          # untrusted: load raises
    assert js.gpus_held(str(tmp_path)) == {"GPU-3": "3", "index:3": "3", "job:4": "4",
                                           "GPU-5": "5", "index:5": "5"}
    assert js.gpus_held(None) == {} and js.gpus_held(str(tmp_path / "none")) == {}


def test_load_warnings_whole(tmp_path: Path, capsys) -> None:
    st = js.new("5", uid=1, gid=1, user="u")
    js.save(tmp_path, st)
    p = tmp_path / "jobs" / "5.json"
    p.write_text("[]")
    assert js.load(tmp_path, "5") == st                      # no warn given: stderr
    err = capsys.readouterr().err.splitlines()
    assert err == [f"slurm-gpu: warning: dropped a corrupt job state file (not an object; moved to "
                   f"5.json.corrupt) ({p})",
                   f"slurm-gpu: warning: job 5: using the copy of its state file ({p}.copy)"]
    # the copy alone, broken; no record: the copy is set aside, nothing is used
    (tmp_path / "jobs" / "5.json.copy").write_text("{broken")
    said: list[str] = []
    assert js.load(tmp_path, "5", warn=said.append) is None
    assert said == [f"slurm-gpu: warning: dropped a corrupt job state file (not JSON or too big; "
                    f"moved to 5.json.copy.corrupt) ({p}.copy)"]
    assert capsys.readouterr().err == ""
    # a record that is sound while its copy is broken: the record, no warning
    js.save(tmp_path, st)
    (tmp_path / "jobs" / "5.json.copy").write_text("{broken")
    assert js.load(tmp_path, "5", warn=said.append) == st and len(said) == 1


def test_record_size_limit(tmp_path: Path) -> None:
    st = js.new("5", uid=1, gid=1, user="u")
    d = st.to_dict()
    text = json.dumps(d)
    pad = js.MAX_STATE_BYTES - len(text) - len(', "x": ""')
    exact = text[:-1] + ', "x": "' + "a" * pad + '"}'
    assert len(exact.encode()) == js.MAX_STATE_BYTES
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "5.json").write_text(exact)
    assert js.load(tmp_path, "5") == st                       # exactly the limit: read
    (tmp_path / "jobs" / "5.json").write_text(exact[:-1] + ' }')
    said: list[str] = []
    assert js.load(tmp_path, "5", warn=said.append) is None   # one byte over: set aside
    assert "(not JSON or too big;" in said[0]


def test_unreadable_state_errors_whole(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    os.mkfifo(tmp_path / "jobs" / "5.json")                   # opened without blocking, refused
    with pytest.raises(InputError) as e:
        js.load(tmp_path, "5")
    assert e.value.line() == ("slurm-gpu: job state file must be a regular file owned by root and "
                              f"not writable by others ({tmp_path}/jobs/5.json)")
    (tmp_path / "jobs" / "5.json").unlink()
    (tmp_path / "jobs" / "5.json").mkdir()                    # a directory where the file goes
    with pytest.raises(InputError) as e:
        js.load(tmp_path, "5")
    assert e.value.line() == f"slurm-gpu: cannot read job state: Is a directory ({tmp_path}/jobs/5.json)"
    (tmp_path / "jobs" / "5.json").rmdir()
    (tmp_path / "jobs" / "5.json").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InputError) as e:
        js.load(tmp_path, "5")
    assert e.value.line() == ("slurm-gpu: cannot read job state: Too many levels of symbolic links "
                              f"({tmp_path}/jobs/5.json)")


def test_untrusted_directory_error_whole(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir(mode=0o777)
    os.chmod(tmp_path / "jobs", 0o777)
    with pytest.raises(InputError) as e:
        js.load(tmp_path, "5")
    assert e.value.line() == ("slurm-gpu: job state directory must be a directory owned by root "
                              f"and not writable by others ({tmp_path}/jobs)")


def test_list_jobs_only_job_files(tmp_path: Path) -> None:
    for jobid in ("10", "9"):
        js.save(tmp_path, js.new(jobid, uid=1, gid=1, user="u"))
    for junk in ("x.json", "9.json.corrupt", ".json", "1234567890123.json", "8.txt"):
        (tmp_path / "jobs" / junk).write_text("")
    assert js.list_jobs(tmp_path) == ["9", "10"]


def test_task_share_bounds() -> None:
    assert js.task_share(2, 0, 0) == [] and js.task_share(0, 0, 2) == []
    with pytest.raises(InputError) as e:
        js.task_share(4, 2, 2)
    assert e.value.line() == "slurm-gpu: task id 2 out of range 0..1"
    with pytest.raises(InputError):
        js.task_share(4, -1, 2)


def test_gpus_held_skips_a_record_set_aside(tmp_path: Path) -> None:
    js.save(tmp_path, js.new("3", uid=1, gid=1, user="u"))
    (tmp_path / "jobs" / "6.json").write_text("[]")           # corrupt: set aside, no record
    assert js.gpus_held(str(tmp_path)) == {}


def _corrupt_record_warns(tmp_path: Path, raw: bytes) -> list[str]:
    """What loading job 5's record *raw* from *tmp_path* warns; it loads as no record."""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "5.json").write_bytes(raw)
    said: list[str] = []
    assert js.load(tmp_path, "5", warn=said.append) is None
    return said


def test_a_record_that_cannot_be_set_aside_says_so(tmp_path: Path, monkeypatch) -> None:
    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(os, "replace", refuse)
    assert _corrupt_record_warns(tmp_path, b"[]") == [
        "slurm-gpu: warning: dropped a corrupt job state file (not an object; left in "
        f"place: Permission denied) ({tmp_path}/jobs/5.json)"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_state_dir_under_a_user_directory_error_whole(tmp_path: Path) -> None:
    import pwd
    try:
        uid = pwd.getpwnam("sgtest1").pw_uid
    except KeyError:
        pytest.skip("user sgtest1 missing")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, uid, -1)
    with pytest.raises(InputError) as e:
        js.load(shared / "state", "12")
    assert e.value.line() == ("slurm-gpu: job state directory lies under a directory that users "
                              f"other than root can change ({shared}) ({shared}/state/jobs)")


def test_a_record_of_undecodable_bytes_is_set_aside(tmp_path: Path) -> None:
    assert _corrupt_record_warns(tmp_path, b'{"version": 2, "user": "\xff"}') == [
        "slurm-gpu: warning: dropped a corrupt job state file (not JSON or too big; "
        f"moved to 5.json.corrupt) ({tmp_path}/jobs/5.json)"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files away")
def test_a_record_owned_by_a_system_user_is_refused(tmp_path: Path) -> None:
    """Root's (or ours) only: uid 1 (daemon) is as untrusted as a job user."""
    js.save(tmp_path, js.new("5", uid=1000, gid=1000, user="u"))
    for name in ("5.json", "5.json.copy"):
        os.chown(tmp_path / "jobs" / name, 1, -1)
    with pytest.raises(InputError) as e:
        js.load(tmp_path, "5")
    assert e.value.line() == ("slurm-gpu: job state file must be a regular file owned by root and "
                              f"not writable by others ({tmp_path}/jobs/5.json)")


def test_save_under_an_open_umask_makes_a_directory_it_trusts(tmp_path: Path) -> None:
    """The jobs directory is made 0755 whatever the caller's umask (a 0777 one is refused)."""
    old = os.umask(0)
    try:
        js.save(tmp_path, js.new("5", uid=1000, gid=1000, user="u"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "jobs").st_mode) == 0o755
    assert js.load(tmp_path, "5").uid == 1000
