"""Which job a PID belongs to: only Slurm's own cgroup hierarchy names a job.

Layouts, from Slurm's sources (src/plugins/cgroup/v1/xcgroup.c and
src/plugins/cgroup/v2/cgroup_v2.c, tags slurm-22-05-8-1, slurm-24-11-5-1,
slurm-26-05-3-1):

* v1: ``<controller>:/slurm[_<node>]/uid_<uid>/job_<id>/step_<s>/...``;
* v2: ``0::<base>/<slice>/[<node>_]slurmstepd.scope/<job_<id> | SLUID>/step_<s>/user/task_<t>``,
  <slice> ``system.slice`` (26.05: ``CgroupSlice``), <base> the parent of
  PID 1's cgroup from 24.11 (the root in 22.05), the SLUID directory in 26.05
  unless ``CgroupJobIdPaths=yes``.

A user can make directories with any name in a delegated subtree (systemd's
``user@<uid>.service``, or below a job's own task cgroup): such a name proves
nothing about which job a process belongs to.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu.acct.attribution import job_of_pid

SA = "sEKNKTV3WPV500"          # the SLUID in cgroup.conf(5)'s example
SB = "s0123456789ABC"


def proc(tmp: Path, lines: dict[int, str], pid1: str | None = None) -> str:
    for pid, text in lines.items():
        (tmp / str(pid)).mkdir()
        (tmp / str(pid) / "cgroup").write_text(text)
    if pid1 is not None:
        (tmp / "1").mkdir()
        (tmp / "1" / "cgroup").write_text(pid1)
    return str(tmp)


@pytest.mark.parametrize("text, job", [
    # Slurm's own layouts
    ("4:memory:/slurm/uid_1001/job_77/step_0/task_0\n", "77"),
    ("12:devices:/slurm_n1/uid_1001/job_77/step_batch\n9:name=systemd:/system.slice/slurmd.service\n", "77"),
    ("0::/system.slice/slurmstepd.scope/job_78/step_batch/user/task_0\n", "78"),
    ("0::/system.slice/n1_slurmstepd.scope/job_78/step_extern/slurm\n", "78"),
    ("0::/system.slice/slurmstepd.scope/job_78\n", "78"),
    (f"0::/system.slice/slurmstepd.scope/{SA}/step_0/user/task_0\n", "80"),
    ("0::/slurm.slice/slurmstepd.scope/job_79/step_0/user/task_0\n", "79"),          # CgroupSlice=slurm.slice
    # below a job's own task cgroup (delegated to it): that job's process, whatever names it made
    ("0::/system.slice/slurmstepd.scope/job_78/step_0/user/task_0/job_5/x\n", "78"),
    (f"0::/system.slice/slurmstepd.scope/{SA}/step_0/user/task_0/job_5\n", "80"),
    (f"0::/system.slice/slurmstepd.scope/job_78/step_0/user/task_0/{SB}\n", "78"),
    # a user's own directories elsewhere: no job
    ("0::/user.slice/user-1001.slice/user@1001.service/app.slice/job_5\n", None),
    ("0::/user.slice/user-1001.slice/user@1001.service/system.slice/slurmstepd.scope/job_5/step_0\n", None),
    ("9:name=systemd:/user.slice/user-1001.slice/user@1001.service/job_5\n4:memory:/user.slice\n", None),
    (f"0::/user.slice/user-1001.slice/user@1001.service/{SB}/step_0\n", None),
    ("4:memory:/user.slice/slurm/uid_1001/job_5/step_0\n", None),
    ("0::/system.slice/slurmstepd.scope/job_05/step_0\n", None),      # Slurm prints %u: never a leading zero
    ("0::/system.slice/slurmstepd.scope/sNOTREGISTERED0/step_0\n", None),
    ("0::/system.slice/slurmd.service\n", None),
])
def test_only_slurms_hierarchy_names_a_job(tmp_path, text, job):
    root = proc(tmp_path, {10: text})
    assert job_of_pid(root, 10, {SA: "80", SB: "81"}) == job


def test_base_is_the_parent_of_pid_1s_cgroup_as_slurm_2411_takes_it(tmp_path):
    """24.11+: ``<parent of PID 1's cgroup>/system.slice/slurmstepd.scope`` (a container
    whose PID 1 is not at the root); the root still counts (22.05's layout)."""
    root = proc(tmp_path, {10: "0::/docker/system.slice/slurmstepd.scope/job_7/step_0/user/task_0\n",
                           11: "0::/system.slice/slurmstepd.scope/job_8/step_0\n",
                           12: "0::/other/system.slice/slurmstepd.scope/job_9/step_0\n"},
                pid1="0::/docker/abc\n")
    assert job_of_pid(root, 10) == "7" and job_of_pid(root, 11) == "8" and job_of_pid(root, 12) is None


def test_unreadable_or_huge_cgroup_files_name_no_job(tmp_path):
    root = proc(tmp_path, {10: "0::/" + "a/" * 40000 + "\n", 11: "\x00\xff garbage"})
    assert job_of_pid(root, 10) is None and job_of_pid(root, 11) is None and job_of_pid(root, 12) is None


def test_every_sluid_of_a_requeued_job_names_it(tmp_path):
    """26.05 (cgroup_p_step_create, src/plugins/cgroup/v2/cgroup_v2.c, slurm-26-05-3-1):
    ``<scope>/<SLUID>/step_<id>/{slurm,user/task_<t>}``, or ``job_<id>`` with
    ``CgroupJobIdPaths=yes`` (26.05.2+); a requeue gives the job a new SLUID,
    so one job id owns the directories of each of its runs."""
    from slurm_gpu.acct.attribution import sluid_map
    regs = {"80": {"sluids": [SA, SB], "sluid": SB}, "81": {"sluid": "sEKNKTV3WPV5ZZ"}}
    m = sluid_map(regs)
    assert m == {SA: "80", SB: "80", "sEKNKTV3WPV5ZZ": "81"}
    root = proc(tmp_path, {10: f"0::/system.slice/slurmstepd.scope/{SA}/step_extern/slurm\n",
                           11: f"0::/system.slice/n1_slurmstepd.scope/{SB}/step_batch/user/task_0\n",
                           12: "0::/system.slice/slurmstepd.scope/job_80/step_0/user/task_3\n",
                           13: "0::/system.slice/slurmstepd.scope/sEKNKTV3WPV5ZZ/step_1+0/user/task_0\n"})
    assert [job_of_pid(root, p, m) for p in (10, 11, 12, 13)] == ["80", "80", "80", "81"]
    # a malformed or foreign entry in a registration maps nothing
    assert sluid_map({"9": {"sluids": ["../job_1", 5, SA.lower()], "sluid": None}}) == {}
