"""An admin's whole lifecycle of the .deb on a real systemd node, from docs/install.md alone.

scripts/test-deb.sh walks the same lifecycle in chroots, where no init runs
and no daemon loads the plugin.  Here the node is the VM of ``sandbox up
--vm``: systemd as PID 1, cgroup v2, Debian's munge, slurmctld and slurmd
units.  It starts without slurm-gpu (the image's copy purged, its lines out
of Slurm's config), then, with the guide's own lines (its ``lifecycle:``
blocks, read from docs/install.md):

1. build the package as the guide says (``make deb``), and two newer
   versions of the same tree (only ``__version__`` bumped);
2. install it with the guide's install line; configure slurm.conf,
   plugstack.conf and ``/etc/slurm-gpu/slurm-gpu.toml`` (the fire drill's
   ``[node] snapshot``: this node has fake /dev/nvidiaN and no GPU), then
   ``scontrol reconfigure`` and ``systemctl enable --now
   slurm-gpu-xid-watch``;
3. upgrade to the second version; then to the third with Slurm's spank.h
   moved away (the plugin build fails: dpkg must fail loudly and the second
   version stay live), then ``dpkg --configure -a`` after the fix;
4. the guide's removal (plugstack line first; the hook lines forgotten, then
   taken out), then the purge.

After each step: a GPU job with our options works as the guide promises
(NUMA binding, ``--gpu-profile``, ``--gpu-mps``), ``doctor``'s verdict is
the truth, the systemd side is right (no unit file newer than systemd's
view, xid-watch running on the live tree, slurmd never restarted by the
package), and a job that started before the first upgrade finishes after
the last one.  After the purge the node's files, users, units, tmpfiles and
/run are as before the install.

One Slurm only (about seven minutes under TCG): 24.11, Debian 13's, the
newest Debian *release*, which an admin installs (26.05 is sid's, a rolling
suite nobody runs a cluster on; 22.05's bookworm lifecycle is the chroot
one of test_deb_package.py).  Runs when SLURM_GPU_VM_VERSIONS (test_vm.py's
list) includes 24.11, as it does by default; SLURM_GPU_VM_ADMIN=0 skips it.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from sandboxlib import REPO, vm_sandbox

SLURM = "24.11"
VERSIONS = os.environ.get("SLURM_GPU_VM_VERSIONS", "22.05 24.11 26.05").split()
pytestmark = pytest.mark.skipif(SLURM not in VERSIONS or os.environ.get("SLURM_GPU_VM_ADMIN") == "0",
                                reason=f"SLURM_GPU_VM_VERSIONS lacks {SLURM}, or SLURM_GPU_VM_ADMIN=0")

DRILL = "/var/tmp/drill/n1.json"     # the recorded machine this node stands in for
TOML = "/etc/slurm-gpu/slurm-gpu.toml"
LIVE = "/opt/slurm-gpu/venv"
# What a node's normal life changes, left out of the before/after comparison.
CHURN = ("./proc", "./sys", "./dev", "./run", "./tmp", "./var/cache", "./var/lib/apt", "./var/log",
         "./var/lib/dpkg", "./var/lib/slurm", "./var/lib/systemd", "./var/spool", "./etc/ld.so.cache",
         "./var/tmp")
FILE_LIST = ("cd / && find . -xdev \\( " + " -o ".join(f"-path {p}" for p in CHURN) + " \\) -prune -o "
             "\\( -type d -printf '%y %m %u:%g - %p\\n' -o -printf '%y %m %u:%g %s %p\\n' \\) | LC_ALL=C sort")
# Users, units, tmpfiles and /run: what a package may add outside its files.
SYSTEM_STATE = ("getent passwd | sha256sum; getent group | sha256sum; "
                "systemctl list-unit-files --no-legend | grep -v transient | sort | sha256sum; "
                "systemctl list-units --all --no-legend --plain 'slurm-gpu*'; "
                "systemd-tmpfiles --cat-config 2>/dev/null | grep -i slurm-gpu; "
                "ls -a /run | grep -i slurm-gpu; true")


def guide(name: str) -> list[str]:
    """The command lines of the guide's ``lifecycle: NAME`` block."""
    from slurm_gpu_devkit.sandbox.vm import guide_block
    return [l.split("#", 1)[0].strip() for l in guide_block(name, REPO).splitlines()
            if l.split("#", 1)[0].strip()]


def build_deb(tree: Path, out: Path) -> Path:
    """The package as the guide builds it (its build-deb block), from *tree*."""
    cmd = guide("build-deb")
    assert cmd == ["make deb"], cmd
    env = {**os.environ, "SLURM_GPU_DIST": str(out), "SLURM_GPU_VENV": "/nonexistent"}
    r = subprocess.run(["bash", "-ec", cmd[0] + " -s VENV=/nonexistent"], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return Path(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The checkout's package, then two newer ones of the same tree."""
    out = tmp_path_factory.mktemp("dist")
    made = [build_deb(REPO, out)]
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    base = re.search(r'^__version__ = "([^"]+)"$', (REPO / "slurm_gpu" / "__init__.py").read_text(), re.M)
    assert base
    for n in (1, 2):
        tree = tmp_path_factory.mktemp(f"tree{n}")
        for f in filter(None, files):
            src = REPO / f.decode()
            if src.is_file():
                (tree / f.decode()).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, tree / f.decode())
        init = tree / "slurm_gpu" / "__init__.py"
        init.write_text(init.read_text().replace(f'"{base[1]}"', f'"{base[1]}.post{n}"'))
        made.append(build_deb(tree, out))
    return made


class Node:
    """The VM, as root at its shell (the sandbox's agent)."""

    def __init__(self, sb: Any) -> None:
        self.sb = sb
        self.agent = sb.place.agent(sb)

    def sh(self, script: str, *, user: str | None = None, cwd: str | None = None,
           timeout: float = 300, stdin: bytes = b"") -> Any:
        return self.agent.run(["sh", "-c", script], user=user, cwd=cwd, timeout=timeout, stdin=stdin)

    def ok(self, script: str, **kw: Any) -> str:
        r = self.sh(script, **kw)
        assert r.returncode == 0, (script, r.returncode, r.stdout[-3000:], r.stderr[-3000:])
        return r.stdout

    def put(self, path: str, data: bytes) -> None:
        self.ok(f"mkdir -p {shlex.quote(os.path.dirname(path))} && cat >{shlex.quote(path)}", stdin=data)

    def value(self, script: str, **kw: Any) -> str:
        return self.ok(script, **kw).strip()


@pytest.fixture(scope="module")
def node(job_users: Any) -> Iterator[Node]:
    # Slurm's config without any of our lines: the node before slurm-gpu.
    with vm_sandbox("vmadmin", slurm=SLURM, machine="mini-2numa", prolog=False, health=False, spank=False,
                    simulate=False) as sb:
        yield Node(sb)


def gpu_job_with_our_options(node: Node, why: str) -> None:
    """What the guide promises for the options (docs/spank.md): the task on
    its GPU's NUMA node's CPU, THP off for --gpu-profile=inference, a
    per-job MPS daemon for --gpu-mps; the node stays idle."""
    probe = ("import os; s = open('/proc/self/status').read(); "
             "print(sorted(os.sched_getaffinity(0)), os.environ.get('SLURM_STEP_GPUS') or os.environ['SLURM_JOB_GPUS'], "
             "'THP_enabled:\\t0' in s, os.environ.get('CUDA_MPS_PIPE_DIRECTORY', '-'))")
    r = node.sh(f"srun --gres=gpu:1 -c1 --gres-flags=enforce-binding --gpu-numa-bind=strict "
                f"--gpu-profile=inference --gpu-mps=default python3 -I -c {shlex.quote(probe)}",
                user="sgtest1", timeout=180)
    assert r.returncode == 0, (why, r.stdout, r.stderr)
    # mini-2numa: GPU N sits on NUMA node N, whose one CPU is N (the GPU's
    # index on the node, not CUDA_VISIBLE_DEVICES: that counts the job's own).
    cpus, gpu, thp_off, pipe = r.stdout.splitlines()[-1].rsplit(" ", 3)
    assert (cpus, thp_off) == (f"[{gpu}]", "True"), (why, r.stdout)
    assert re.fullmatch(r"/run/slurm-gpu/mps/\d+/pipe", pipe), (why, r.stdout)
    assert_in_service(node, why)


def assert_in_service(node: Node, why: str) -> None:
    """Neither drained nor down (idle, mixed or allocated: other jobs may run)."""
    state = node.value("sinfo -h -n n1 -o '%T %E'")
    assert not re.search(r"drain|down|fail|not_responding", state, re.I), (why, state)


def doctor_findings(node: Node) -> list[str]:
    """doctor's lines that are not OK (a driverless node has no persistenced)."""
    r = node.sh("slurm-gpu doctor", timeout=120)
    assert r.returncode in (0, 1, 2, 3) and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    return [l for l in r.stdout.splitlines()
            if l.strip() and not l.startswith(("OK ", "WARNING nvidia.persistenced:"))]


def systemd_side(node: Node, why: str, xid_watch: bool) -> None:
    """Our units as systemd sees them: loaded from the files on disk (no
    daemon-reload owed), xid-watch running on the live tree when enabled."""
    need = node.value("systemctl show -p NeedDaemonReload --value slurm-gpu-xid-watch slurm-gpu-monitor")
    assert need.split() == ["no", "no"], (why, need)
    state = node.value("systemctl is-active slurm-gpu-xid-watch || true")
    if not xid_watch:
        assert state == "inactive", (why, state)
        return
    assert state == "active", (why, state, node.sh("journalctl -u slurm-gpu-xid-watch --no-pager | tail -5").stdout)
    pid = node.value("systemctl show -p MainPID --value slurm-gpu-xid-watch")
    live = node.value(f"readlink -f {LIVE}")
    # The venv's python is a link to the system's: which tree is in its argv.
    argv = node.value(f"tr '\\0' ' ' </proc/{pid}/cmdline")
    assert argv.startswith(live + "/bin/python"), (why, argv, live)


def install_line(deb: Path) -> str:
    """The guide's install line for *deb* (its example names the checkout's
    version), answered yes as an admin at the prompt would."""
    line = next(l for l in guide("install-deb") if l.startswith("apt-get install "))
    line, n = re.subn(r"\./dist/slurm-gpu_\S+_all\.deb", f"./dist/{deb.name}", line)
    assert n == 1, line
    return line + " -y"


def test_admin_lifecycle_on_a_systemd_node(node: Node, debs: list[Path]) -> None:
    v1, v2, v3 = debs
    for d in debs:
        node.put(f"/var/tmp/admin/dist/{d.name}", d.read_bytes())
    # -- the node before slurm-gpu ---------------------------------------------------
    # The recorded machine this VM's fake GPUs are (the fire drill's recording),
    # out of the way of the package; the image's slurm-gpu and its config gone.
    node.ok(f"mkdir -p /var/tmp/drill && cp /etc/slurm-gpu/machine/snapshot.json {DRILL} && "
            "rm -f /etc/slurm/plugstack.conf.d/slurm-gpu.conf && "
            "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q slurm-gpu >/dev/null && rm -rf /etc/slurm-gpu && "
            "cp -p /etc/slurm/slurm.conf /etc/slurm/plugstack.conf /var/tmp/admin/dist/")
    files_before = node.ok(FILE_LIST)
    system_before = node.ok(SYSTEM_STATE)

    # -- install and configure, as the guide says ---------------------------------------
    out = node.ok("DEBIAN_FRONTEND=noninteractive " + install_line(v1) + " 2>&1", cwd="/var/tmp/admin", timeout=900)
    assert "slurm-gpu: SPANK plugin built" in out, out[-2000:]
    for line in guide("install-deb")[1:]:
        node.sh(line)            # --version, doctor: what they say before the configuration
    systemd_side(node, "installed", xid_watch=False)
    conf = [l for l in guide("slurm.conf") if not l.startswith("NodeName=")]
    node.ok(f"printf '%s\\n' {' '.join(shlex.quote(l) for l in conf)} >>/etc/slurm/slurm.conf")
    (plug,) = guide("plugstack.conf")
    node.ok(f"echo {shlex.quote(plug)} >>/etc/slurm/plugstack.conf")
    # The conffile, as shipped: uncomment [node] snapshot (docs/install.md, fire drill).
    node.ok(f"grep -qx '# snapshot = \"\"' {TOML} && sed -i 's|^# snapshot = \"\"$|snapshot = \"{DRILL}\"|' {TOML}")
    node.ok("scontrol reconfigure && systemctl enable --now slurm-gpu-xid-watch")
    node.ok("for i in $(seq 60); do sinfo -h -n n1 -o %T | grep -qx idle && exit 0; sleep 1; done; exit 1")
    slurmd_pid = node.value("systemctl show -p MainPID --value slurmd")
    gpu_job_with_our_options(node, "installed")
    assert doctor_findings(node) == [], "installed"
    systemd_side(node, "configured", xid_watch=True)
    # A job that runs across both upgrades: started on the first tree, it ends
    # (its epilog, its task exit hooks) after that tree is gone.
    long_job = node.value("sbatch --parsable --gres=gpu:1 -c1 --gres-flags=enforce-binding --gpu-profile=inference "
                          "-o /tmp/long.out "
                          "--wrap 'while [ ! -e /tmp/go ]; do sleep 1; done; srun --gpu-profile=inference true'",
                          user="sgtest1")
    node.ok(f"for i in $(seq 60); do scontrol show job {long_job} | grep -q JobState=RUNNING && exit 0; "
            "sleep 1; done; exit 1")

    # -- the first upgrade ----------------------------------------------------------------
    first_tree = node.value(f"readlink {LIVE}")
    out = node.ok("DEBIAN_FRONTEND=noninteractive " + install_line(v2) + " 2>&1", cwd="/var/tmp/admin", timeout=900)
    assert ".post1" in node.value("slurm-gpu --version"), out[-2000:]
    assert node.value(f"grep '^snapshot' {TOML}") == f'snapshot = "{DRILL}"', "the admin's edit is gone"
    systemd_side(node, "first upgrade", xid_watch=True)
    gpu_job_with_our_options(node, "first upgrade")
    assert doctor_findings(node) == [], "first upgrade"

    # -- the second upgrade: the plugin build fails, then the fix ------------------------------
    second_tree = node.value(f"readlink {LIVE}")
    node.ok("mv /usr/include/slurm/spank.h /usr/include/slurm/spank.h.away")
    r = node.sh("DEBIAN_FRONTEND=noninteractive " + install_line(v3) + " 2>&1", cwd="/var/tmp/admin", timeout=900)
    assert r.returncode != 0, ("apt-get succeeded although the plugin could not be built", r.stdout[-2000:])
    said = r.stdout.replace("\r", "")         # apt runs dpkg on a pty
    assert re.search(r"^slurm-gpu: SPANK plugin not built \(slurm/spank\.h not found.*the new venv was NOT "
                     r"put live.*then run: dpkg --configure -a$", said, re.M), said[-2000:]
    assert node.value(f"readlink {LIVE}") == second_tree
    assert "half-configured" in node.value("dpkg-query -W -f='${Status}' slurm-gpu")
    gpu_job_with_our_options(node, "failed build")
    findings = doctor_findings(node)
    assert [f.split(":")[0] for f in findings] == ["CRITICAL package.setup"], findings
    systemd_side(node, "failed build", xid_watch=True)
    node.ok("mv /usr/include/slurm/spank.h.away /usr/include/slurm/spank.h && "
            "DEBIAN_FRONTEND=noninteractive dpkg --configure -a", timeout=900)
    assert ".post2" in node.value("slurm-gpu --version")
    assert node.value(f"ls -d /opt/slurm-gpu/{first_tree} 2>/dev/null || true") == "", "three trees kept"
    systemd_side(node, "second upgrade", xid_watch=True)
    gpu_job_with_our_options(node, "second upgrade")
    assert doctor_findings(node) == [], "second upgrade"
    # The package never restarts slurmd (its jobs and steps keep running).
    assert node.value("systemctl show -p MainPID --value slurmd") == slurmd_pid
    node.ok("touch /tmp/go")
    node.ok(f"for i in $(seq 90); do scontrol show job {long_job} | grep -Eq 'JobState=(COMPLETED|FAILED)' "
            "&& exit 0; sleep 1; done; exit 1")
    job = node.value(f"scontrol show job {long_job}")
    assert "JobState=COMPLETED" in job and "ExitCode=0:0" in job, (job, node.sh("cat /tmp/long.out").stdout)
    assert_in_service(node, "the long job ended")

    # -- removal, as the guide orders it (its step 2 forgotten at first) ------------------------
    node.ok("sed -i '/slurm_gpu_spank\\.so/d' /etc/slurm/plugstack.conf")
    (remove, purge) = guide("remove-deb")
    node.ok(f"DEBIAN_FRONTEND=noninteractive {remove} -y -q", timeout=600)
    systemd_side(node, "removed", xid_watch=False)
    node.ok("srun --gres=gpu:1 true", user="sgtest1", timeout=120)
    assert_in_service(node, "removed")
    # Step 2, late: the node's own config again, and slurmd still runs jobs.
    node.ok("cp -p /var/tmp/admin/dist/slurm.conf /var/tmp/admin/dist/plugstack.conf /etc/slurm/ && scontrol reconfigure")
    node.ok("for i in $(seq 60); do sinfo -h -n n1 -o %T | grep -qx idle && exit 0; sleep 1; done; exit 1")
    node.ok("srun --gres=gpu:1 true", user="sgtest1", timeout=120)
    node.ok(f"DEBIAN_FRONTEND=noninteractive {purge} -y -q", timeout=600)
    assert node.sh("dpkg-query -W slurm-gpu").returncode != 0
    assert node.ok(SYSTEM_STATE) == system_before
    files_after = node.ok(FILE_LIST)
    gone = sorted(set(files_before.splitlines()) - set(files_after.splitlines()))
    added = sorted(set(files_after.splitlines()) - set(files_before.splitlines()))
    assert (gone, added) == ([], []), "purge left the node changed"
