"""A real systemd + cgroup v2 node, in a VM (`sandbox up --vm`), on 22.05, 24.11 and 26.05.

The build host has cgroup v1 and no systemd; every GPU node people run today
boots systemd on the unified hierarchy.  Each Slurm boots one VM (QEMU: KVM
when it works, else TCG) from its Debian suite's packages, with slurm-gpu
from the project's .deb, and every check below runs in that one VM, as a job
or a command on the node, through the guest's agent (`sandbox run`).

SLURM_GPU_VM_VERSIONS="22.05" limits the versions (default: all three).
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Iterator

import pytest

from sandboxlib import vm_sandbox

VERSIONS = os.environ.get("SLURM_GPU_VM_VERSIONS", "22.05 24.11 26.05").split()
# 22.05/24.11: system.slice/<node>_slurmstepd.scope/job_<id>/step_<n>/user/task_<i>;
# 26.05 names the job's directory by its SLUID unless CgroupJobIdPaths=yes.
JOB_CGROUP = re.compile(r"^0::/system\.slice/(?P<scope>[^/]*slurmstepd\.scope)/(?P<job>[^/]+)/"
                        r"step_(?P<step>[^/]+)/user/task_\d+$")


class Node:
    """The VM's sandbox, with helpers that run there."""

    def __init__(self, sb: Any) -> None:
        self.sb = sb

    def sh(self, script: str, user: str | None = None, timeout: float = 120) -> Any:
        return self.sb.run_client(["sh", "-c", script], user, timeout)

    def ok(self, script: str, user: str | None = None, timeout: float = 120) -> str:
        r = self.sh(script, user, timeout)
        assert r.returncode == 0, (script, r.returncode, r.stdout, r.stderr)
        return r.stdout

    def wait(self, script: str, timeout: float = 60.0) -> str:
        """Poll *script* until it exits 0; its output."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.sh(script)
            if r.returncode == 0 or time.monotonic() > deadline:
                assert r.returncode == 0, (script, r.stdout, r.stderr)
                return r.stdout
            time.sleep(0.5)

    def job_state(self, jobid: str) -> str:
        out = self.ok(f"scontrol show job -o {jobid}")
        return re.search(r"JobState=(\S+)", out).group(1)


@pytest.fixture(scope="module", params=VERSIONS)
def node(request: pytest.FixtureRequest, job_users: Any) -> Iterator[Node]:
    with vm_sandbox(f"vm{request.param.replace('.', '')}", slurm=request.param, prolog=None, health=True,
                    health_interval=5, spank=None, simulate=None) as sb:
        yield Node(sb)


def test_a_vm_that_does_not_boot_in_time_is_one_line_and_leaves_nothing(sandbox_dir, cli) -> None:
    d = sandbox_dir("vmboot")
    r = cli("sandbox", "up", "--vm", "--dir", str(d), "--slurm", VERSIONS[0], "--boot-timeout", "2",
            timeout=600)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm-gpu: the VM did not boot within 2 s: "), r.stderr
    assert str(d / "log" / "console.log") in lines[0]
    st = cli("sandbox", "status", "--dir", str(d), "--json")
    assert st.returncode == 1 and not json.loads(st.stdout)["running"]
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(int(p), str(d))]


def _cmdline_has(pid: int, text: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return text.encode() in f.read() and open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except OSError:
        return False


def test_a_second_up_on_a_running_vm_is_refused(node: Node, cli) -> None:
    r = cli("sandbox", "up", "--vm", "--dir", str(node.sb.dir), "--slurm", node.sb.options.slurm)
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert "already running here" in r.stderr
    assert node.ok("sinfo -h -o %T").strip() == "idle"


def test_a_systemd_cgroup_v2_node_runs_debians_units_and_our_deb(node: Node) -> None:
    out = node.ok("stat -fc %T /sys/fs/cgroup; ps -o comm= -p 1; "
                  "systemctl is-active munge slurmctld slurmd; "
                  "systemctl show -p Delegate --value slurmd; "
                  "dpkg-query -W -f='${Status}\\n' slurm-gpu; "
                  "ls -d /sys/fs/cgroup/system.slice/*slurmstepd.scope >/dev/null && echo v2-plugin")
    assert out.split("\n")[:8] == ["cgroup2fs", "systemd", "active", "active", "active", "yes",
                                   "install ok installed", "v2-plugin"], out


def test_a_one_gpu_job_is_in_a_v2_job_cgroup_and_sees_exactly_its_gpu(node: Node) -> None:
    probe = ("import errno, glob, os\n"
             "print(open('/proc/self/cgroup').read().strip())\n"
             "for d in sorted(glob.glob('/dev/nvidia[0-9]*')):\n"
             "    try: open(d, 'rb')\n"
             "    except OSError as e: print(d, errno.errorcode[e.errno])\n"
             "print('CUDA', os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('SLURM_JOB_ID'))\n")
    out = node.ok(f"srun --gres=gpu:1 python3 -I -c \"{probe}\"", user="sgtest1")
    lines = out.strip().splitlines()
    m = JOB_CGROUP.match(lines[0])
    assert m, lines[0]
    cuda, jobid = lines[-1].split()[1:]
    if node.sb.slurm_version.startswith("26.05"):
        assert m["job"] != f"job_{jobid}"          # 26.05: the SLUID names it
    else:
        assert m["job"] == f"job_{jobid}"
    devices = dict(l.split() for l in lines[1:-1])
    # The driver is absent: the one GPU the job holds opens as far as the
    # driver (ENXIO); the device cgroup refuses every other one (EPERM).
    assert devices == {f"/dev/nvidia{i}": ("ENXIO" if str(i) == cuda else "EPERM")
                       for i in range(len(devices))}, devices
    assert len(devices) == 2 and cuda in ("0", "1")


def test_gpu_numa_bind_inside_the_jobs_cpuset(node: Node) -> None:
    probe = ("import os\n"
             "cg = open('/proc/self/cgroup').read().strip().split('::')[1]\n"
             "job = '/sys/fs/cgroup' + cg.split('/step_')[0]\n"
             "print(sorted(os.sched_getaffinity(0)), open(job + '/cpuset.cpus.effective').read().strip(),"
             " os.environ['CUDA_VISIBLE_DEVICES'])\n")
    out = node.ok(f"srun --gres=gpu:1 -c1 --gres-flags=enforce-binding --gpu-numa-bind=strict python3 -I -c \"{probe}\"",
                  user="sgtest1")
    cpus, cpuset, cuda = out.strip().rsplit(" ", 2)
    assert cpus == f"[{cuda}]", out            # its GPU's NUMA node's CPU ...
    assert cpuset == cuda, out                 # ... which is the job's cpuset


def test_mps_daemon_lives_below_the_jobs_cgroup_and_goes_with_the_epilog(node: Node) -> None:
    jobid = node.ok("sbatch --parsable --gres=gpu:1 --gpu-mps=default -o /dev/null --wrap 'sleep 120'",
                    user="sgtest1").strip().split(";")[0]
    try:
        node.wait(f"scontrol show job -o {jobid} | grep -q JobState=RUNNING")
        # The prolog starts the control daemon before Slurm makes the job's
        # cgroup; the job's first step (the batch step) moves it in
        # (docs/mps-mig.md).  Its clients (the prolog's own queries) are
        # short-lived processes of the same name.
        daemon = ("for p in $(pgrep -x nvidia-cuda-mps); do "
                  "tr '\\0' ' ' </proc/$p/cmdline | grep -q -- ' -d' || continue; "
                  "c=$(cat /proc/$p/cgroup) || continue; echo \"$p $c\"; "
                  "case $c in */slurm_gpu_mps) exit 0;; esac; done; exit 1")
        r = None
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            r = node.sh(daemon)
            if r.returncode == 0:
                break
            time.sleep(0.5)
        assert r is not None and r.returncode == 0, (
            r and r.stdout, node.ok("pgrep -a nvidia-cuda; tail -n 5 /var/log/slurm/slurmd-n1.log; "
                                    f"scontrol show job -o {jobid} | tr ' ' '\\n' | grep -E 'State|Reason'"))
        pid, cg = r.stdout.strip().splitlines()[-1].split(" ", 1)
        job_dir = cg.split("::")[1].rsplit("/", 1)[0]
        # The job's limits hold it: its memory limit and device program are the job's.
        node.ok(f"test \"$(cat /sys/fs/cgroup{job_dir}/memory.max)\" != max")
    finally:
        node.ok(f"scancel {jobid}")
    node.wait(f"scontrol show job -o {jobid} | grep -Eq 'JobState=(CANCELLED|COMPLETED)' && "
              f"! pgrep -x nvidia-cuda-mps", 60)
    assert node.sh("ls -d /sys/fs/cgroup/system.slice/*slurmstepd.scope/*/slurm_gpu_mps").returncode != 0


def test_doctor_is_clean_on_the_node(node: Node) -> None:
    r = node.sh("slurm-gpu doctor")
    findings = [l for l in r.stdout.splitlines() if l.strip() and not l.startswith("OK ")]
    # The one thing a simulated GPU cannot have: NVIDIA's persistence daemon
    # (it needs the driver).  Everything else doctor checks is right.
    assert [l.split(":")[0] for l in findings] in ([], ["WARNING nvidia.persistenced"]), r.stdout


def test_health_check_drains_on_a_fault_and_resumes_when_cleared(node: Node) -> None:
    r = node.sb.fault("n1", "xid-79", 0)
    assert "gpu.count" in r, r
    node.wait("sinfo -h -n n1 -o %T | grep -q drain", 60)
    reason = node.ok("sinfo -h -n n1 -o %E")
    assert reason.startswith("slurm-gpu: gpu.count:"), reason
    node.sb.fault("n1", None, 0)
    node.wait("sinfo -h -n n1 -o %T | grep -qx idle", 90)
