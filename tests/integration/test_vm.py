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
TWO_NODES = "26.05"     # the Slurm whose VM runs a second node (test_a_two_node_gpu_job_...)
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
    # 26.05's VM starts with two nodes in the one guest (Debian's
    # slurmd.service is n1, slurmd@n2 the second) for the two-node job, which
    # then retires n2; every other check runs on n1, where Slurm places a
    # one-node job first.  A health run costs about 5 s of a TCG vCPU, so
    # each node's run every 5 s is a vCPU: with two nodes, every 10 s.
    nodes = 2 if request.param == TWO_NODES else 1
    with vm_sandbox(f"vm{request.param.replace('.', '')}", slurm=request.param, nodes=nodes, prolog=None,
                    health=True, health_interval=5 * nodes, spank=None, simulate=None) as sb:
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


TWO_PROBE = ("import errno, glob, os\n"
             "n = os.environ['SLURMD_NODENAME']\n"
             "print('CG', n, open('/proc/self/cgroup').read().strip())\n"
             "for d in sorted(glob.glob('/dev/nvidia[0-9]*')):\n"
             "    try: open(d, 'rb')\n"
             "    except OSError as e: print('DEV', n, d, errno.errorcode[e.errno])\n")


def test_a_two_node_gpu_job_gets_each_nodes_own_cgroup_gpu_mps_daemon_and_epilog(node: Node) -> None:
    """`--nodes 2` in the VM: two slurmd in one guest, each its own node.
    With one of n1's GPUs held by another job, a two-node `--gpu-mps` job
    gets n1's other GPU and one of n2's: each node's task runs in its own
    node's v2 job cgroup (`<node>_slurmstepd.scope`) and opens exactly the
    GPU its node gave it; each node's prolog starts an MPS control daemon
    that lives below that node's job cgroup; each node's epilog stops it and
    removes the job's state.

    The nodes share the guest's kernel and /dev: n1's /dev/nvidia0 is n2's
    (docs/sandbox.md, "Several nodes in one VM"); what is each node's own is
    its slurmd, its job cgroups and device programs, its GPUs' NVML state
    and its slurm-gpu state."""
    if node.sb.options.nodes < 2:
        pytest.skip(f"only the {TWO_NODES} VM runs two nodes (one boot for both checks)")
    node.ok(f"cat >/tmp/sg-twoprobe.py <<'EOF'\n{TWO_PROBE}EOF\nchmod 644 /tmp/sg-twoprobe.py")
    hold = node.ok("sbatch --parsable -w n1 --gres=gpu:1 -o /dev/null --wrap 'exec sleep 300'",
                   user="sgtest1").strip()
    two = ""
    try:
        node.wait(f"scontrol show job -o {hold} | grep -q JobState=RUNNING", 120)
        held = re.search(r"gpu[^ ]*\(IDX:(\d)\)", node.ok(f"scontrol show job -d {hold}")).group(1)
        two = node.ok("sbatch --parsable -N2 --gres=gpu:1 --gpu-mps=default -o /tmp/sg-two-%j.out "
                      "--wrap 'srun python3 -I /tmp/sg-twoprobe.py; exec sleep 300'", user="sgtest1").strip()
        out = node.wait(f"[ \"$(grep -c '^CG ' /tmp/sg-two-{two}.out)\" = 2 ] && "
                        f"[ \"$(grep -c '^DEV ' /tmp/sg-two-{two}.out)\" = 4 ] && cat /tmp/sg-two-{two}.out", 180)
        lines = [l.split() for l in out.splitlines()]
        cgroups = {l[1]: JOB_CGROUP.match(l[2]) for l in lines if l[0] == "CG"}
        assert sorted(cgroups) == ["n1", "n2"] and all(cgroups.values()), out
        assert {n: m["scope"] for n, m in cgroups.items()} == {n: f"{n}_slurmstepd.scope" for n in cgroups}
        job_dir = {m["job"] for m in cgroups.values()}
        assert len(job_dir) == 1, out
        # Each node's task opens one GPU (ENXIO: no driver) and is refused the
        # other (EPERM: its device program); n1's is the one the other job left.
        seen = {(l[1], l[3]): l[2] for l in lines if l[0] == "DEV"}
        assert sorted(seen) == [("n1", "ENXIO"), ("n1", "EPERM"), ("n2", "ENXIO"), ("n2", "EPERM")], out
        assert seen[("n1", "ENXIO")] == f"/dev/nvidia{1 - int(held)}", (held, out)
        # Each node's MPS control daemon, below that node's job cgroup.
        daemons = node.wait("for p in $(pgrep -x nvidia-cuda-mps); do "
                            "tr '\\0' ' ' </proc/$p/cmdline | grep -q -- ' -d' || continue; "
                            "cat /proc/$p/cgroup; done | grep slurm_gpu_mps | sort | "
                            "{ out=$(cat); [ \"$(echo \"$out\" | grep -c .)\" = 2 ] && echo \"$out\"; }", 60)
        assert daemons.split() == [f"0::/system.slice/{n}_slurmstepd.scope/{next(iter(job_dir))}/slurm_gpu_mps"
                                   for n in ("n1", "n2")], daemons
        node.ok(f"ls /var/lib/slurm-gpu/n1/jobs/{two}.json /var/lib/slurm-gpu/n2/jobs/{two}.json")
        node.ok(f"scancel {two}")
        node.wait(f"[ -z \"$(squeue -h -j {two} -o %A)\" ]", 120)
        # Both epilogs ran: no daemon, no MPS directory, no job state on either node; neither drained.
        node.ok(f"! pgrep -x nvidia-cuda-mps && for n in n1 n2; do [ ! -e /run/slurm-gpu/mps/$n/{two} ] && "
                f"[ ! -e /var/lib/slurm-gpu/$n/jobs/{two}.json ] || exit 1; done")
        assert node.ok("sinfo -h -N -o '%N %E'").split("\n")[:2] == ["n1 none", "n2 none"]
    finally:
        node.sh(f"scancel {hold} {two}")
    node.wait("[ -z \"$(squeue -h -o %A)\" ]", 90)
    # n2 is done: its slurmd and health check would only slow the one-node
    # checks below (two health runs every 10 s keep the guest's 2 TCG vCPUs
    # busy); n1 goes back to the 5 s of the one-node VMs.
    node.ok("systemctl stop slurmd@n2 && scontrol update nodename=n2 state=down reason=two-node-check-done && "
            "sed -i 's/^HealthCheckInterval=.*/HealthCheckInterval=5/' /etc/slurm/slurm.conf && "
            "scontrol reconfigure")
    node.wait("sinfo -h -n n1 -o %T | grep -qx idle", 60)


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


FAILS = "/usr/lib/slurm-gpu/epilog.d/51-sg-test-fails"   # runs before ours (reverse name order)


def test_mps_daemon_lives_below_the_jobs_cgroup_and_a_failed_epilogs_leftover_is_cleaned_up(node: Node) -> None:
    """The job's MPS control daemon runs below the job's v2 cgroup; when the
    epilog fails before ours (a site's script: Slurm runs no more of it and
    drains the node), the daemon, its cgroup and the job's directory Slurm
    could not remove are cleaned up by the health check's sweep or the admin's
    `job cleanup --stale`, and `job cleanup JOBID` finds nothing of the job.
    (The epilog does the same teardown, `lifecycle.teardown`; the host's
    sandbox tests its own path.)"""
    jobid = node.ok("sbatch --parsable --gres=gpu:1 --gpu-mps=default -o /dev/null --wrap 'sleep 120'",
                    user="sgtest1").strip().split(";")[0]
    try:
        node.wait(f"scontrol show job -o {jobid} | grep -q JobState=RUNNING", 120)
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
        job_dir = "/sys/fs/cgroup" + cg.split("::")[1].rsplit("/", 1)[0]
        # Until then it waited in a hold that reached the job's GPU alone: a
        # BPF device program this kernel took (review round 3, H4).
        shown = node.ok(f"slurm-gpu job show {jobid}")
        assert re.search(r"MPS hold until the first step: /sys/fs/cgroup/slurm_gpu_mps_hold/n1/"
                         rf"job_{jobid}  GPU limit: the job's GPUs only \(/dev/nvidia\d+\)\n", shown), shown
        # The job's limits hold it: its memory limit and device program are the job's.
        node.ok(f"test \"$(cat {job_dir}/memory.max)\" != max")
        node.ok(f"printf '#!/bin/sh\\nexit 1\\n' >{FAILS} && chmod 755 {FAILS} && scancel {jobid}")
        node.wait(f"scontrol show job -o {jobid} | grep -Eq 'JobState=(CANCELLED|COMPLETED)' && "
                  "sinfo -h -n n1 -o %E | grep -qx 'Epilog error'", 90)
        left = {"daemon": f"! kill -0 {pid} 2>/dev/null", "cgroup": f"[ ! -e {job_dir} ]",
                "pipe": f"[ ! -e /run/slurm-gpu/mps/n1/{jobid} ]",
                "state": f"[ ! -e /var/lib/slurm-gpu/n1/jobs/{jobid}.json ]"}
        node.wait("slurm-gpu job cleanup --stale >/dev/null; " + " && ".join(left.values()), 60)
        assert node.ok(f"slurm-gpu job cleanup {jobid}") == \
            f"slurm-gpu: job {jobid}: nothing of slurm-gpu's left on this node\n"
    finally:
        node.sh(f"rm -f {FAILS}; scancel {jobid}")
    node.wait("[ -z \"$(squeue -h -o %A)\" ] && scontrol update nodename=n1 state=resume; "
              "sinfo -h -n n1 -o %T | grep -qx idle", 60)
    assert node.sh("pgrep -x nvidia-cuda-mps").returncode != 0


MIG_PROBE = ("import errno, glob, os\n"
             "print('CG', open('/proc/self/cgroup').read().strip())\n"
             "for d in sorted(glob.glob('/dev/nvidia[0-9]*')):\n"
             "    try: open(d, 'rb')\n"
             "    except OSError as e: print('DEV', d, errno.errorcode[e.errno])\n"
             "print('JOB', os.environ['SLURM_JOB_GPUS'], os.environ.get('CUDA_VISIBLE_DEVICES'))\n")
MIG_COUNT = ("import json, sys\n"
             "from slurm_gpu.hw import backend\n"
             "from slurm_gpu.mig import instances\n"
             "g = backend.open_gpus(backend.GpuSource('sim', sys.argv[1]))\n"
             "st = json.load(open(sys.argv[1]))\n"
             "print(json.dumps([[len(instances.list_instances(g, i)), x['mig']['mode']]\n"
             "                  for i, x in enumerate(st['facts']['gpus'])]))\n")


def test_gpu_mig_job_gets_its_instances_behind_the_v2_device_program(node: Node) -> None:
    """A `--gpu-mig` job on a systemd + cgroup v2 node with ConstrainDevices:
    the prolog makes its MIG instances on the GPU the job holds (the
    simulator's MIG-mode H100 NVL, `--mig-mode per-job`), its tasks get their
    MIG UUIDs and open only their own GPU, doctor reads the job cgroup's BPF
    device program (with bpftool in the image), and the epilog destroys the
    instances, leaving MIG mode on."""
    node.ok(f"cat >/tmp/sg-migprobe.py <<'EOF'\n{MIG_PROBE}EOF\ncat >/tmp/sg-migcount.py <<'EOF'\n{MIG_COUNT}EOF\n"
            "chmod 644 /tmp/sg-migprobe.py /tmp/sg-migcount.py")
    count = f"/opt/slurm-gpu/venv/bin/python -I /tmp/sg-migcount.py {SIM}"
    assert json.loads(node.ok(count)) == [[0, 1], [0, 1]]
    jobid = node.ok("sbatch --parsable --gres=gpu:1 --gpu-mig=3g.47gb,2g.24gb -o /tmp/sg-mig-%j.out "
                    "--wrap 'python3 -I /tmp/sg-migprobe.py; exec sleep 300'", user="sgtest1").strip()
    try:
        out = node.wait(f"grep -q '^JOB ' /tmp/sg-mig-{jobid}.out && cat /tmp/sg-mig-{jobid}.out", 120)
        lines = out.strip().splitlines()
        cg = next(l for l in lines if l.startswith("CG "))
        assert JOB_CGROUP.match(cg[3:]), cg
        held, cuda = next(l for l in lines if l.startswith("JOB ")).split()[1:]
        devices = dict(l.split()[1:] for l in lines if l.startswith("DEV "))
        assert devices == {f"/dev/nvidia{i}": ("ENXIO" if str(i) == held else "EPERM")
                           for i in range(2)}, devices
        uuids = cuda.split(",")
        assert len(uuids) == 2 and all(u.startswith("MIG-") for u in uuids), cuda
        made = json.loads(node.ok(count))
        assert made[int(held)] == [2, 1] and made[1 - int(held)] == [0, 1], made
        # doctor, while the job runs, reads its cgroup's device program.
        doctor = node.sh("slurm-gpu doctor").stdout
        devs = [l for l in doctor.splitlines() if l.split(":")[0].split()[-1:] == ["cgroup.devices"]]
        assert devs == ["OK cgroup.devices: BPF device program on 1 job cgroup(s)"], doctor
    finally:
        node.ok(f"scancel {jobid}")
    node.wait(f"[ -z \"$(squeue -h -o %A)\" ] && [ \"$({count})\" = '[[0, 1], [0, 1]]' ]", 90)


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


# -- accounting attribution, leftovers ------------------------------------------
# Root's helpers in the guest (its venv has the devkit: the simulator behind
# the fake GPUs).  CUINIT gives a process a context on a GPU, what a CUDA
# program's cuInit does on a real one (NVML then lists it while it runs);
# SET edits the node's slurm-gpu.toml as an admin would.
GUEST_PY = {
    "cuinit": "import sys\n"
              "from slurm_gpu_devkit.sim import open_sim\n"
              "from slurm_gpu_devkit.sim.nvml import add_process\n"
              "sim = open_sim(sys.argv[1])\n"
              "for a in sys.argv[2:]:\n"
              "    g, p, m = map(int, a.split(':'))\n"
              "    add_process(sim, g, p, m)\n",
    "uncuinit": "import sys\n"
                "from slurm_gpu_devkit.sim import open_sim\n"
                "with open_sim(sys.argv[1]).edit() as st:\n"
                "    st['processes'] = []\n",
    "set": "import os, sys, tomllib\n"
           "from slurm_gpu_devkit.sandbox.toml import dumps\n"
           "p = '/etc/slurm-gpu/slurm-gpu.toml'\n"
           "with open(p, 'rb') as f:\n"
           "    d = tomllib.load(f)\n"
           "for a in sys.argv[1:]:\n"
           "    k, v = a.split('=', 1)\n"
           "    s, k = k.split('.')\n"
           "    d.setdefault(s, {})[k] = tomllib.loads('v = ' + v)['v']\n"
           "with open(p + '.new', 'w') as f:\n"
           "    f.write(dumps(d, 'slurm-gpu config of a sandbox VM (edited by test_vm)'))\n"
           "os.replace(p + '.new', p)\n",
}
SIM = "/var/lib/slurm-gpu-sandbox/var/n1/sim.json"
ACCT = "/var/lib/slurm-gpu/n1/acct"


def _guest_py(node: Node, name: str, *args: str) -> str:
    return node.ok(f"cat >/tmp/sg-{name}.py <<'EOF'\n{GUEST_PY[name]}EOF\n"
                   f"/opt/slurm-gpu/venv/bin/python -I /tmp/sg-{name}.py {' '.join(args)}")


def _aggregates(node: Node) -> dict[str, dict[str, bool]]:
    """job id -> {device: held} of the node's accounting aggregates, after one sample."""
    node.ok("slurm-gpu monitor --once")
    out = node.ok(f"for f in {ACCT}/agg/*.json; do [ -f \"$f\" ] && cat \"$f\" && echo; done; true")
    aggs = [json.loads(l) for l in out.splitlines() if l.strip()]
    return {a["jobid"]: {k: d["held"] for k, d in a["devices"].items()} for a in aggs}


def _started(node: Node, jobid: str, timeout: float = 120) -> dict[str, str]:
    """The job's output lines ``name value`` once its script printed ``main``."""
    node.wait(f"grep -q '^main ' /tmp/sg-acct-{jobid}.out", timeout)
    out = node.ok(f"cat /tmp/sg-acct-{jobid}.out")
    assert "not permitted" not in out, out
    return dict(l.split(" ", 1) for l in out.splitlines() if l.startswith(("main ", "child ")))


def _held(node: Node, jobid: str) -> str:
    """The GPU (NVML index) the job's prolog registered for it.

    Waited for: once, under load, 24.11's guest ran the job's script before
    the registration could be read (not seen since; slurmd's log is shown
    when it never comes)."""
    path = f"{ACCT}/jobs/{jobid}.json"
    r = node.sh(f"for i in $(seq 120); do [ -f {path} ] && break; sleep 0.5; done; cat {path}", None, 90)
    assert r.returncode == 0, (path, node.sh("journalctl --no-pager -u slurmd | tail -40; squeue -a; "
                                             f"scontrol show job {jobid}", None, 60).stdout)
    reg = json.loads(r.stdout)
    assert len(reg["devices"]) == 1, reg
    return reg["devices"][0]


def _cgroup_conf(node: Node, *lines: str) -> None:
    """cgroup.conf as the guide's plus *lines* (a later key wins), then
    `scontrol reconfigure` (slurmd reads cgroup.conf again; the next job has it)."""
    node.ok("[ -f /etc/slurm/cgroup.conf.guide ] || cp /etc/slurm/cgroup.conf /etc/slurm/cgroup.conf.guide; "
            "{ grep -v -E '^(" + "|".join(l.split("=")[0] for l in lines) + ")=' "
            "/etc/slurm/cgroup.conf.guide || true; " + "".join(f"echo {l}; " for l in lines) +
            "} >/etc/slurm/cgroup.conf.new && mv /etc/slurm/cgroup.conf.new /etc/slurm/cgroup.conf && "
            "scontrol reconfigure")
    node.wait("sinfo -h -n n1 -o %T | grep -Eqx 'idle|mixed|allocated'", 60)


def test_accounting_attributes_gpu_processes_by_their_v2_job_cgroup_and_never_an_escaped_one(node: Node) -> None:
    """Attribution by cgroup path on a real v2 node (26.05: the SLUID
    directory, and `CgroupJobIdPaths=yes`), for accounting and for the
    epilog's leftover check: a job's process on another job's GPU is its own
    job's (a leak), never the other job's leftover; a process that escaped its
    job is attributed to no job, whatever its cgroup is named, and drains as
    the user's problem at its job's end, resumed once it is gone.

    A job's process can reach a GPU it does not hold only where devices are
    not constrained, so the node runs `ConstrainDevices=no` for this test
    (each job checks that it can open every GPU)."""
    uid = node.ok("id -u sgtest1").strip()
    node.ok("cp /etc/slurm-gpu/slurm-gpu.toml /etc/slurm-gpu/slurm-gpu.toml.orig")
    a = b = ""
    try:
        _guest_py(node, "set", "acct.enabled=true", "repair.user_problem=true")
        _cgroup_conf(node, "ConstrainDevices=no")
        probe = "for d in /dev/nvidia[0-9]*; do (exec 3<\"$d\") 2>&1; done; "
        a = node.ok("sbatch --parsable --gres=gpu:1 -o /tmp/sg-acct-%j.out --wrap "
                    "'setsid sleep 600 </dev/null >/dev/null 2>&1 & echo child $!; "
                    + probe + "echo main $$; exec sleep 600'", user="sgtest1").strip()
        b = node.ok("sbatch --parsable --gres=gpu:1 -o /tmp/sg-acct-%j.out --wrap "
                    "'" + probe + "echo main $$; exec sleep 600'", user="sgtest1").strip()
        pa, pb = _started(node, a), _started(node, b)
        ga, gb = _held(node, a), _held(node, b)
        assert ga != gb
        # A's main process on its own GPU and on B's (a leak); A's child and B's process on their own.
        _guest_py(node, "cuinit", SIM, f"{ga}:{pa['main']}:100", f"{gb}:{pa['main']}:200",
                  f"{ga}:{pa['child']}:50", f"{gb}:{pb['main']}:300")
        assert _aggregates(node) == {a: {ga: True, gb: False}, b: {gb: True}}
        # A's child escapes its job (as into a login session: only root moves a
        # process out of Slurm's tree) into the user's own delegated subtree,
        # into directories named as B's job: a name anyone there can make.
        b_cg = node.ok(f"cut -d: -f3 /proc/{pb['main']}/cgroup").strip()
        fake = f"/sys/fs/cgroup/user.slice/user-{uid}.slice/user@{uid}.service/app.slice{b_cg}"
        node.ok(f"mkdir -p {fake} && chown -R {uid} /sys/fs/cgroup/user.slice/user-{uid}.slice/user@{uid}.service "
                f"&& echo {pa['child']} >{fake}/cgroup.procs")
        assert _aggregates(node)[b] == {gb: True}
        # B ends first: A's process on B's GPU is A's (A's cgroup), not B's leftover.
        node.ok(f"scancel {b}")
        node.wait(f"[ -z \"$(squeue -h -j {b} -o %A)\" ]", 90)
        assert node.ok("sinfo -h -n n1 -o %E").strip() == "none"
        assert _aggregates(node) == {a: {ga: True, gb: False}}
        b = ""
        node.ok(f"scancel {a}")
        node.wait(f"[ -z \"$(squeue -h -j {a} -o %A)\" ]", 90)
        assert node.sh(f"kill -0 {pa['child']}").returncode == 0, "the escaped process went with the job"
        # A's epilog finds the escaped process on A's GPU: the user's problem.
        reason = node.ok("sinfo -h -n n1 -o %E").strip()
        assert reason.startswith(f"slurm-gpu: user-problem: job {a} left process {pa['child']} on GPU"), reason
        # A ended: its escaped process is nobody's.
        assert _aggregates(node) == {}
        node.ok(f"kill -9 {pa['child']}")
        # The health check resumes the node on its first clean run.  (Slurm
        # 24.11 keeps the Reason text on a node resumed from DRAINING: the
        # state, not the reason, says it is back.)
        r = node.sh("i=0; while [ $i -lt 120 ] && sinfo -h -n n1 -o %T | grep -q drain; do "
                    "sleep 0.5; i=$((i+1)); done; sinfo -h -n n1 -o %T", timeout=120)
        assert "drain" not in r.stdout, (r.stdout, node.sh(
            f"ps -o pid,ppid,stat,comm -p {pa['child']}; grep -v '^$' /var/log/slurm/slurmd-n1.log | tail -n 8").stdout)
        assert node.ok(f"ls {ACCT}/jobs").strip() == ""
        if node.sb.slurm_version.startswith("26.05"):
            # The same with job-id directories (26.05.2+; the default names them by SLUID).
            _cgroup_conf(node, "ConstrainDevices=no", "CgroupJobIdPaths=yes")
            c = node.ok("sbatch --parsable --gres=gpu:1 -o /tmp/sg-acct-%j.out --wrap "
                        "'" + probe + "echo main $$; exec sleep 600'", user="sgtest1").strip()
            pc = _started(node, c)
            assert node.ok(f"cat /proc/{pc['main']}/cgroup").split("/")[3] == f"job_{c}"
            gc = _held(node, c)
            other = "1" if gc == "0" else "0"
            _guest_py(node, "cuinit", SIM, f"{other}:{pc['main']}:100")
            assert _aggregates(node) == {c: {gc: True, other: False}}
            node.ok(f"scancel {c}")
            node.wait(f"[ -z \"$(squeue -h -o %A)\" ] && [ -z \"$(ls {ACCT}/jobs)\" ]", 90)
    finally:
        node.sh(f"scancel {a} {b}; pkill -u sgtest1 -x sleep; pkill -u sgtest2 -x sleep; "
                "sinfo -h -n n1 -o %E | grep -q '^slurm-gpu: user-problem:' && "
                "scontrol update nodename=n1 state=resume")
        _guest_py(node, "uncuinit", SIM)
        node.ok("mv /etc/slurm-gpu/slurm-gpu.toml.orig /etc/slurm-gpu/slurm-gpu.toml")
        _cgroup_conf(node)
        node.wait("[ -z \"$(squeue -h -o %A)\" ] && sinfo -h -n n1 -o %T | grep -qx idle", 90)
