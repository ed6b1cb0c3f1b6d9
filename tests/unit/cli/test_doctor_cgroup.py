"""``doctor``'s cgroup checks over fixture trees of real nodes' files.

This machine has cgroup v1 controllers and no systemd, so each node is a
root path: its ``/proc/self/mountinfo`` and ``/proc/1/cgroup`` (as a
Debian 12 / EL9 systemd host shows them), Slurm's ``cgroup.conf``, the
slurmd unit Slurm ships (``etc/slurmd.service.in``: ``Delegate=yes``) and
drop-ins, the job directories slurmstepd makes
(``system.slice/[<node>_]slurmstepd.scope/{job_<id>|<SLUID>}``,
src/plugins/cgroup/v2/cgroup_v2.c) and ``bpftool -j cgroup show`` answers
(``attach_type`` ``cgroup_device``; bpftool before 7.0 says ``device``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import pytest

from slurm_gpu import doctor, doctor_cgroup as dc

V2_MOUNTS = ("22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
             "26 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
             "rw,nsdelegate,memory_recursiveprot\n")
V1_MOUNTS = ("25 22 0:22 / /sys/fs/cgroup tmpfs ro shared:8 - tmpfs tmpfs ro,mode=755\n"
             "26 25 0:23 / /sys/fs/cgroup/unified rw shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
             "30 25 0:27 / /sys/fs/cgroup/devices rw shared:13 - cgroup cgroup rw,devices\n"
             "31 25 0:28 / /sys/fs/cgroup/cpuset rw shared:14 - cgroup cgroup rw,cpuset\n")
# etc/slurmd.service.in (slurm-26-05-3-1), as Debian installs it
SLURMD_UNIT = """[Unit]
Description=Slurm node daemon
After=munge.service network-online.target remote-fs.target sssd.service

[Service]
Type=notify
EnvironmentFile=-/etc/default/slurmd
ExecStart=/usr/sbin/slurmd --systemd $SLURMD_OPTIONS
KillMode=process
LimitMEMLOCK=infinity
Delegate=yes

[Install]
WantedBy=multi-user.target
"""
GOOD_CONF = ("CgroupPlugin=autodetect\nConstrainCores=yes\nConstrainDevices=yes\n"
             "ConstrainRAMSpace=yes\n")
SLURM = {"taskplugin": "task/cgroup,task/affinity", "proctracktype": "proctrack/cgroup",
         "prolog": "/usr/lib/slurm-gpu/prolog.d/*"}
SLUID = "sEKNKTV3WPV500"
DEVICE_PROG = json.dumps([{"id": 41, "attach_type": "cgroup_device", "attach_flags": "multi",
                           "name": ""}])


def node(tmp: Path, *, mounts: str = V2_MOUNTS, conf: str | None = GOOD_CONF, systemd: bool = True,
         unit: str | None = SLURMD_UNIT, unit_dir: str = "lib/systemd/system",
         dropins: dict[str, str] | None = None, jobs: Sequence[str] = (), bpftool: bool = True) -> str:
    (tmp / "proc/self").mkdir(parents=True)
    (tmp / "proc/self/mountinfo").write_text(mounts)
    (tmp / "proc/1").mkdir()
    (tmp / "proc/1/cgroup").write_text("0::/init.scope\n")
    (tmp / "etc/slurm").mkdir(parents=True)
    if conf is not None:
        (tmp / "etc/slurm/cgroup.conf").write_text(conf)
    if systemd:
        (tmp / "run/systemd/system").mkdir(parents=True)
    if unit is not None:
        (tmp / unit_dir).mkdir(parents=True, exist_ok=True)
        (tmp / unit_dir / "slurmd.service").write_text(unit)
    for path, text in (dropins or {}).items():
        (tmp / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp / path).write_text(text)
    for j in jobs:
        (tmp / j).mkdir(parents=True)
    if bpftool:
        (tmp / "usr/sbin").mkdir(parents=True, exist_ok=True)
        (tmp / "usr/sbin/bpftool").write_text("#!/bin/sh\n")
        os.chmod(tmp / "usr/sbin/bpftool", 0o755)
    return str(tmp)


def bpf(answers: dict[str, str]):
    """A runner answering ``bpftool -j cgroup show DIR`` per job directory name."""
    calls: list[list[str]] = []

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        calls.append(list(argv))
        assert argv[1:4] == ["-j", "cgroup", "show"], argv
        return 0, answers[os.path.basename(argv[4])]
    run.calls = calls  # type: ignore[attr-defined]
    return run


def findings(root: str, slurmd: str = "26.05.5", slurm: dict[str, str] | None = None,
             run=None) -> dict[str, tuple[str, str]]:
    facts = dc.gather("/etc/slurm", root=root, run=run or bpf({}))
    f = doctor.Facts("/etc/slurm/slurm.conf", dict(SLURM if slurm is None else slurm), True, slurmd, [])
    f.cgroup = facts
    out: dict[str, tuple[str, str]] = {}
    for x in doctor.check_cgroup(f):
        if x.check not in out or x.status > doctor.__dict__[out[x.check][0]]:
            out[x.check] = (doctor.NAMES[x.status], x.message)
    return out


def status(found: dict[str, tuple[str, str]]) -> dict[str, str]:
    return {k: v[0] for k, v in found.items()}


SCOPE = "sys/fs/cgroup/system.slice/slurmstepd.scope"


def test_a_correct_systemd_v2_node_is_clean(tmp_path: Path) -> None:
    run = bpf({SLUID: DEVICE_PROG, "job_7": DEVICE_PROG})
    found = findings(node(tmp_path, jobs=[f"{SCOPE}/{SLUID}/step_0/user", f"{SCOPE}/job_7"]), run=run)
    assert status(found) == {"cgroup.mode": "OK", "cgroup.conf": "OK", "cgroup.systemd": "OK",
                             "cgroup.delegate": "OK", "cgroup.jobpaths": "OK", "cgroup.devices": "OK"}
    assert "Delegate=yes (/lib/systemd/system/slurmd.service)" in found["cgroup.delegate"][1]
    assert "on 2 job cgroup(s)" in found["cgroup.devices"][1]
    assert sorted(os.path.basename(c[4]) for c in run.calls) == sorted([SLUID, "job_7"])


def test_a_dropin_that_turns_delegation_off_is_critical(tmp_path: Path) -> None:
    root = node(tmp_path, dropins={"etc/systemd/system/slurmd.service.d/10-site.conf":
                                   "[Service]\nDelegate=no\n"})
    found = findings(root)
    assert found["cgroup.delegate"][0] == "CRITICAL"
    assert "Delegate=no" in found["cgroup.delegate"][1] and "10-site.conf" in found["cgroup.delegate"][1]
    assert "systemctl edit slurmd" in found["cgroup.delegate"][1]


def test_a_unit_without_delegate_and_an_etc_override_that_adds_it(tmp_path: Path) -> None:
    bare = SLURMD_UNIT.replace("Delegate=yes\n", "")
    assert findings(node(tmp_path / "a", unit=bare))["cgroup.delegate"][0] == "CRITICAL"
    fixed = node(tmp_path / "b", unit=bare, dropins={
        "usr/lib/systemd/system/slurmd.service.d/50-x.conf": "[Service]\nDelegate=no\n",
        "etc/systemd/system/slurmd.service.d/50-x.conf": "[Service]\nDelegate=yes\n"})
    assert findings(fixed)["cgroup.delegate"][0] == "OK"
    # an /etc unit file replaces the shipped one whole
    etc = node(tmp_path / "c", dropins={"etc/systemd/system/slurmd.service": bare})
    assert findings(etc)["cgroup.delegate"][0] == "CRITICAL"


def test_delegate_read_through_systemctl_on_the_live_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """On ``/`` with systemd running, ``systemctl show`` answers (drop-ins and
    all); its ``Delegate=`` is what counts."""
    monkeypatch.setattr(dc, "systemd_running", lambda root: root == "/")
    asked = []

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        asked.append(list(argv))
        return 0, "Delegate=no\nLoadState=loaded\n"
    facts = dc.gather("/nonexistent-slurm", root="/", run=run)
    assert asked[0] == ["systemctl", "show", "slurmd.service", "-p", "Delegate", "-p", "LoadState"]
    assert (facts.delegate, facts.delegate_from) == ("no", "systemctl show slurmd")
    assert not dc.delegated(facts.delegate) and dc.delegated("yes") and dc.delegated("cpu memory")


def test_ignore_systemd_with_and_without_systemd(tmp_path: Path) -> None:
    ign = GOOD_CONF + "IgnoreSystemd=yes\n"
    assert findings(node(tmp_path / "a", conf=ign))["cgroup.systemd"][0] == "WARNING"
    # a container: no systemd, slurmd must make the scope itself
    bare = findings(node(tmp_path / "b", systemd=False, unit=None))
    assert bare["cgroup.systemd"][0] == "CRITICAL" and "fatal" in bare["cgroup.systemd"][1]
    assert "cgroup.delegate" not in bare
    ok = findings(node(tmp_path / "c", systemd=False, unit=None,
                       conf=GOOD_CONF + "IgnoreSystemdOnFailure=yes\n"))
    assert ok["cgroup.systemd"][0] == "OK"


def test_constraints_and_plugins(tmp_path: Path) -> None:
    found = findings(node(tmp_path / "a", conf="ConstrainCores=yes\nConstrainRAMSpace=yes\n"))
    assert found["cgroup.conf"][0] == "WARNING" and "ConstrainDevices" in found["cgroup.conf"][1]
    assert "cgroup.devices" not in found               # nothing to look for
    found = findings(node(tmp_path / "b", conf="ConstrainDevices=yes\n"))
    assert "ConstrainCores, ConstrainRAMSpace not yes" in found["cgroup.conf"][1]
    found = findings(node(tmp_path / "c", conf=None))
    assert found["cgroup.conf"][0] == "CRITICAL" and "cgroup.conf not found" in found["cgroup.conf"][1]
    found = findings(node(tmp_path / "d"), slurm={"taskplugin": "task/affinity",
                                                  "proctracktype": "proctrack/linuxproc"})
    assert found["cgroup.conf"][0] == "WARNING"


@pytest.mark.parametrize("slurmd, conf, slurm, want", [
    ("26.05.5", GOOD_CONF + "CgroupJobIdPaths=yes\n", SLURM, ("OK", "job_<id>")),
    ("26.05.5", GOOD_CONF, SLURM, ("OK", "SLUID")),
    ("26.05.5", GOOD_CONF, {**SLURM, "prolog": ""}, ("WARNING", "SLURM_JOB_SLUID")),
    ("26.05.1", GOOD_CONF + "CgroupJobIdPaths=no\n", SLURM, ("CRITICAL", "26.05.2")),
    ("24.11.5", GOOD_CONF + "CgroupJobIdPaths=yes\n", SLURM, ("CRITICAL", "unknown key")),
    ("24.11.5", GOOD_CONF, SLURM, None),
])
def test_cgroup_job_id_paths_per_version(tmp_path: Path, slurmd: str, conf: str, slurm: dict[str, str],
                                         want: tuple[str, str] | None) -> None:
    found = findings(node(tmp_path, conf=conf), slurmd=slurmd, slurm=slurm)
    if want is None:
        assert "cgroup.jobpaths" not in found
    else:
        assert found["cgroup.jobpaths"][0] == want[0] and want[1] in found["cgroup.jobpaths"][1]


def test_a_job_cgroup_without_a_device_program_is_critical(tmp_path: Path) -> None:
    """bpftool lists no BPF_CGROUP_DEVICE program on one job: its tasks can open every GPU."""
    other = json.dumps([{"id": 9, "attach_type": "cgroup_inet_ingress", "attach_flags": "", "name": "x"}])
    old = json.dumps([{"id": 3, "attach_type": "device", "attach_flags": "override", "name": ""}])
    run = bpf({"job_7": old, "job_8": other})
    found = findings(node(tmp_path, jobs=[f"sys/fs/cgroup/system.slice/n1_slurmstepd.scope/{j}"
                                          for j in ("job_7", "job_8")]), run=run)
    assert found["cgroup.devices"][0] == "CRITICAL"
    assert "job_8 has no BPF device program" in found["cgroup.devices"][1]


def test_device_program_not_checked_says_why(tmp_path: Path) -> None:
    none = findings(node(tmp_path / "a"))
    assert none["cgroup.devices"] == ("OK", "no job cgroup on the node now: run doctor while a job "
                                      "runs to see its device limit")
    tool = findings(node(tmp_path / "b", bpftool=False, jobs=[f"{SCOPE}/job_7"]))
    assert tool["cgroup.devices"][0] == "OK" and "bpftool is not installed" in tool["cgroup.devices"][1]
    broken = findings(node(tmp_path / "c", jobs=[f"{SCOPE}/job_7"]), run=bpf({"job_7": "not json"}))
    assert broken["cgroup.devices"][0] == "UNKNOWN"


def test_user_made_directories_are_not_job_cgroups(tmp_path: Path) -> None:
    root = node(tmp_path, jobs=[f"{SCOPE}/system", f"{SCOPE}/job_07", f"{SCOPE}/sNOTASLUID0000",
                                "sys/fs/cgroup/user.slice/user-1000.slice/slurmstepd.scope/job_5"])
    assert dc.gather("/etc/slurm", root=root, run=bpf({})).jobs == []


def test_v1_node_reads_devices_list(tmp_path: Path) -> None:
    jobs = ["sys/fs/cgroup/devices/slurm/uid_1001/job_7", "sys/fs/cgroup/devices/slurm_n1/uid_1001/job_8"]
    root = node(tmp_path, mounts=V1_MOUNTS, jobs=jobs, systemd=False, unit=None)
    (tmp_path / jobs[0] / "devices.list").write_text("c 195:0 rwm\nc 195:255 rwm\n")
    (tmp_path / jobs[1] / "devices.list").write_text("a *:* rwm\n")
    found = findings(root, slurmd="22.05.8")
    assert found["cgroup.mode"] == ("OK", "cgroup v1 (hybrid)")
    assert found["cgroup.devices"][0] == "CRITICAL" and "job_8" in found["cgroup.devices"][1]
    assert "cgroup.delegate" not in found and "cgroup.systemd" not in found
    assert findings(root, slurmd="25.05.1")["cgroup.mode"][0] == "WARNING"     # deprecated there


def test_hybrid_with_the_v2_plugin_is_critical(tmp_path: Path) -> None:
    root = node(tmp_path, mounts=V1_MOUNTS, conf=GOOD_CONF.replace("autodetect", "cgroup/v2"))
    assert findings(root)["cgroup.mode"][0] == "CRITICAL"


def test_login_role_and_hand_built_facts_have_no_cgroup_findings() -> None:
    f = doctor.Facts("/etc/slurm/slurm.conf", {}, True, "26.05.5", [])
    assert doctor.check_cgroup(f) == []
