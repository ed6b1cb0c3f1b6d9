"""The MPS daemon's cgroup under the job's: finding Slurm's layout, joining before exec, ending it.

A fake cgroup tree (plain directories and a mountinfo naming them) stands in
for /sys/fs/cgroup: the code only reads and writes ``cgroup.procs`` files
and lists directories, so the same calls run on the real tree in the
``--cgroup`` sandbox test (tests/integration/test_mps_cgroup.py).
"""
from __future__ import annotations

import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest

from slurm_gpu import runner
from slurm_gpu.jobs import jobcgroup

V1 = ("36 25 0:31 / {root}/memory rw,nosuid - cgroup cgroup rw,memory\n"
      "37 25 0:32 / {root}/freezer rw,nosuid - cgroup cgroup rw,freezer\n"
      "38 25 0:33 / {root}/systemd rw - cgroup cgroup rw,xattr,name=systemd\n"
      "39 25 0:34 / {root}/unified rw - cgroup2 cgroup2 rw\n")
V2 = "30 25 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def _tree(tmp: Path, text: str, dirs: list[str]) -> str:
    for d in dirs:
        (tmp / d).mkdir(parents=True, exist_ok=True)
        (tmp / d / "cgroup.procs").write_text("")
    mi = tmp / "mountinfo"
    mi.write_text(text.format(root=tmp))
    return str(mi)


def test_v1_layout_of_slurm_2205(tmp_path: Path) -> None:
    # What the --cgroup sandbox shows: <ctrl>/slurm_<node>/uid_<uid>/job_<id>/step_*
    mi = _tree(tmp_path, V1, ["memory/slurm_n1/uid_1001/job_7/step_extern",
                              "freezer/slurm_n1/uid_1001/job_7/step_batch",
                              "memory/slurm_n1/uid_1001/job_77"])
    assert jobcgroup.job_dirs("7", 1001, mountinfo=mi) == [
        f"{tmp_path}/memory/slurm_n1/uid_1001/job_7", f"{tmp_path}/freezer/slurm_n1/uid_1001/job_7"]
    assert jobcgroup.job_dirs("7", 1002, mountinfo=mi) == []          # another user's job 7? no
    assert jobcgroup.job_dirs("8", 1001, mountinfo=mi) == []


def test_another_slurmds_job_with_the_same_id_is_never_taken(tmp_path: Path) -> None:
    # Two slurmd on one host (the sandbox, multiple-slurmd builds): slurm_<node> each.
    mi = _tree(tmp_path, V1, ["memory/slurm_n1/uid_1001/job_7", "memory/slurm_n2/uid_1001/job_7"])
    assert jobcgroup.job_dirs("7", 1001, node="n2", mountinfo=mi) == \
        [f"{tmp_path}/memory/slurm_n2/uid_1001/job_7"]
    assert jobcgroup.job_dirs("7", 1001, mountinfo=mi) == []          # ambiguous: none
    assert jobcgroup.job_dirs("7", 1001, node="n3", mountinfo=mi) == []
    assert jobcgroup.job_dirs("7", 1001, node="../n1", mountinfo=mi) == []


def test_v2_layout_job_id_and_sluid(tmp_path: Path) -> None:
    mi = _tree(tmp_path, V2, ["system.slice/n1_slurmstepd.scope/job_7/step_extern/user/task_special",
                              "system.slice/n1_slurmstepd.scope/a1b2c3d4e5f60789"])
    scope = f"{tmp_path}/system.slice/n1_slurmstepd.scope"
    assert jobcgroup.job_dirs("7", 1001, mountinfo=mi) == [f"{scope}/job_7"]
    # 26.05 names the job's cgroup by SLUID unless CgroupJobIdPaths is set
    assert jobcgroup.job_dirs("9", 1001, "a1b2c3d4e5f60789", mountinfo=mi) == \
        [f"{scope}/a1b2c3d4e5f60789"]
    assert jobcgroup.job_dirs("9", 1001, "../../etc", mountinfo=mi) == []   # not a SLUID


def test_no_job_cgroup_with_proctrack_linuxproc(tmp_path: Path) -> None:
    mi = _tree(tmp_path, V1, ["memory/system.slice"])
    assert jobcgroup.job_dirs("7", 1001, mountinfo=mi) == []


def test_daemon_joins_before_exec_then_drops_to_the_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to drop privileges")
    try:
        u = pwd.getpwnam("sgtest1")
    except KeyError:
        pytest.skip("user sgtest1 missing")
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    res = runner.run(["/bin/sh", "-c", "echo $$; id -u; id -g"], 10, join_cgroups=[str(procs)],
                     run_as=runner.RunAs(u.pw_uid, u.pw_gid))
    pid, uid, gid = res.stdout.split()
    assert procs.read_text() == pid                 # the child's own pid, written before exec
    assert (int(uid), int(gid)) == (u.pw_uid, u.pw_gid)


def test_join_failure_runs_nothing(tmp_path: Path) -> None:
    from slurm_gpu.errors import CommandError
    marker = tmp_path / "ran"
    with pytest.raises((CommandError, subprocess.SubprocessError, OSError)):
        runner.run(["/bin/touch", str(marker)], 10, join_cgroups=[str(tmp_path / "absent" / "x")])
    assert not marker.exists()


def test_kill_all_ends_every_member_even_without_the_pipe_variable(tmp_path: Path) -> None:
    d = tmp_path / "job_7" / jobcgroup.NAME
    d.mkdir(parents=True)
    p = subprocess.Popen(["/bin/sleep", "60"], env={})
    (d / "cgroup.procs").write_text(f"{p.pid}\n")
    left = jobcgroup.kill_all([str(d)], 2.0)
    assert p.wait(timeout=5) == -9
    # a fake cgroup keeps the dead pid listed; the kernel would drop it
    assert left in (set(), {p.pid})
    (d / "cgroup.procs").unlink()
    jobcgroup.remove([str(d)])
    assert not d.exists() and not d.parent.exists()


def test_descendants_follow_the_process_tree() -> None:
    p = subprocess.Popen(["/bin/sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 5
        while len(jobcgroup.descendants([p.pid])) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(jobcgroup.descendants([p.pid])) == 3
    finally:
        for q in jobcgroup.descendants([p.pid]):
            try:
                os.kill(q, 9)
            except ProcessLookupError:
                pass
        p.wait()


def test_adopt_takes_the_sluid_the_prolog_recorded_never_the_steps_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's SLURM_JOB_SLUID is the user's to set: naming another job's SLUID there
    must not put the daemon in (and let this job's epilog end) that job's cgroup."""
    from slurm_gpu.jobs import mps
    from slurm_gpu.jobs import state as js
    cg = tmp_path / "cg"
    scope = cg / "system.slice" / "n1_slurmstepd.scope"
    for d in ("s7sluid", "s9victim"):                      # 26.05: cgroups named by SLUID
        (scope / d).mkdir(parents=True)
        (scope / d / "cgroup.procs").write_text("")
    monkeypatch.setattr(jobcgroup, "mounts", lambda mountinfo="": [(str(cg), 2, ())])
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    sd = tmp_path / "state"
    st = js.new("7", uid=os.getuid() or 1001, gid=os.getgid() or 1001, user="u")
    st.mps = {"pipe_dir": str(tmp_path / "mps" / "7" / "pipe"), "sluid": "s7sluid"}
    js.save(sd, st)
    assert mps.adopt(str(sd), "7", "s9victim") == [str(scope / "s7sluid" / jobcgroup.NAME)]
    assert not (scope / "s9victim" / jobcgroup.NAME).exists()
    assert js.load(sd, "7").mps["cgroup"] == [str(scope / "s7sluid" / jobcgroup.NAME)]


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a process as a job user")
def test_adopt_moves_the_recorded_daemon_even_without_the_pipe_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon is the process the prolog started (PID and start time in the state
    file, issue 24 §1), not only what names the pipe directory in its environment:
    one that scrubbed it is still moved into the job's cgroup."""
    import pwd
    import subprocess
    from slurm_gpu.jobs import mps
    from slurm_gpu.jobs import state as js
    from slurm_gpu.procfs import start_time
    try:
        u = pwd.getpwnam("sgtest1")
    except KeyError:
        pytest.skip("user sgtest1 missing")
    cg = tmp_path / "cg"
    scope = cg / "system.slice" / "n1_slurmstepd.scope"
    (scope / "job_7").mkdir(parents=True)
    (scope / "job_7" / "cgroup.procs").write_text("")
    monkeypatch.setattr(jobcgroup, "mounts", lambda mountinfo="": [(str(cg), 2, ())])
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    daemon = subprocess.Popen(["/bin/sleep", "60"], user="sgtest1", env={})
    try:
        sd = tmp_path / "state"
        st = js.new("7", uid=u.pw_uid, gid=u.pw_gid, user="sgtest1")
        st.mps = {"pipe_dir": str(tmp_path / "mps" / "7" / "pipe"),
                     "daemon": [[daemon.pid, start_time(daemon.pid)]]}
        js.save(sd, st)
        got = mps.adopt(str(sd), "7")
        assert got == [str(scope / "job_7" / jobcgroup.NAME)]
        assert (scope / "job_7" / jobcgroup.NAME / "cgroup.procs").read_text().split() == \
            [str(daemon.pid)]
    finally:
        daemon.kill()
        daemon.wait()


def test_hold_is_in_one_v1_hierarchy_or_the_v2_one_never_cpuset(tmp_path: Path) -> None:
    """Without RunInJob the daemon waits in <mount>/slurm_gpu_mps_hold/<node>/job_<id>:
    freezer first on v1 (where Slurm's proctrack makes the job's cgroup), v2's root
    where only v2 is mounted; nothing for a job id or node name that is no path part."""
    mi = tmp_path / "mi"
    mi.write_text(V1.format(root=tmp_path) +
                  f"40 25 0:35 / {tmp_path}/cpuset rw - cgroup cgroup rw,cpuset\n")
    assert jobcgroup.hold_dirs("7", "n1", mountinfo=str(mi)) == [
        f"{tmp_path}/freezer/{jobcgroup.HOLD}/n1/job_7"]
    # v1 devices mounted: the hold is there too, for the job's GPU limit (review round 3, H4)
    mi.write_text(V1.format(root=tmp_path) +
                  f"41 25 0:36 / {tmp_path}/devices rw - cgroup cgroup rw,devices\n")
    assert jobcgroup.hold_dirs("7", "n1", mountinfo=str(mi)) == [
        f"{tmp_path}/freezer/{jobcgroup.HOLD}/n1/job_7", f"{tmp_path}/devices/{jobcgroup.HOLD}/n1/job_7"]
    mi.write_text(f"41 25 0:36 / {tmp_path}/fd rw - cgroup cgroup rw,freezer,devices\n")
    assert jobcgroup.hold_dirs("7", "n1", mountinfo=str(mi)) == [f"{tmp_path}/fd/{jobcgroup.HOLD}/n1/job_7"]
    mi.write_text(f"40 25 0:35 / {tmp_path}/cpuset rw - cgroup cgroup rw,cpuset\n"
                  f"41 25 0:36 / {tmp_path}/memory rw - cgroup cgroup rw,memory\n")
    assert jobcgroup.hold_dirs("7", "n1", mountinfo=str(mi)) == [
        f"{tmp_path}/memory/{jobcgroup.HOLD}/n1/job_7"]
    mi.write_text(V2.format(root=tmp_path))
    assert jobcgroup.hold_dirs("7", "n1", mountinfo=str(mi)) == [
        f"{tmp_path}/{jobcgroup.HOLD}/n1/job_7"]
    for jobid, node in (("7", "../n1"), ("7", ".."), ("7", ""), ("7/..", "n1"), ("", "n1")):
        assert jobcgroup.hold_dirs(jobid, node, mountinfo=str(mi)) == []
    mi.write_text("")
    assert jobcgroup.hold_dirs("7", "n1", mountinfo=str(mi)) == []


def test_a_recorded_hold_is_believed_only_in_its_own_shape(tmp_path: Path) -> None:
    """The epilog ends everything in the recorded hold: a state file's path must be
    the job's own hold under a cgroup mount, never another job's or another place."""
    pts = [f"{tmp_path}/freezer"]
    good = f"{tmp_path}/freezer/{jobcgroup.HOLD}/n1/job_7"
    assert jobcgroup.is_hold(good, "7", pts)
    for bad in (f"{tmp_path}/freezer/{jobcgroup.HOLD}/n1/job_8",
                f"{tmp_path}/memory/{jobcgroup.HOLD}/n1/job_7",
                f"{tmp_path}/freezer/other/n1/job_7",
                f"{tmp_path}/freezer/{jobcgroup.HOLD}/../job_7",
                f"{tmp_path}/freezer/x/../{jobcgroup.HOLD}/n1/job_7",
                f"{tmp_path}/freezer/slurm_n1/uid_1001/job_7"):
        assert not jobcgroup.is_hold(bad, "7", pts), bad
