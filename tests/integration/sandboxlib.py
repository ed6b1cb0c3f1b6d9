"""Helpers for the integration tests: sandboxes, job users, Slurm commands.

Test modules import these from here (``from sandboxlib import Cluster``),
never from ``conftest``: pytest loads every conftest.py under that one
module name, so such imports pick up whichever was loaded last."""
from __future__ import annotations

import contextlib
import os
import pwd
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import pytest

from paths import ROOT
from slurm_gpu.runner import SAFE_PATH, Completed, RunAs, run


HERE = Path(__file__).resolve().parent
REPO = ROOT
BASE = Path(os.environ.get("SLURM_GPU_TEST_BASE", "/tmp/slurm-gpu-tests"))
JOB_USERS = ("sgtest1", "sgtest2")
# The Slurm every make_sandbox() runs unless a test names one: "24.11" or
# "26.05" run the whole suite on a Debian root's Slurm (scripts/test.sh).
TEST_SLURM = os.environ.get("SLURM_GPU_TEST_SLURM") or None
VERSIONS = ("22.05", "24.11", "26.05")

# The default machine of every integration test (a recorded 8-GPU server);
# SLURM_GPU_TEST_MACHINE overrides it (name or path).  Until the recorded
# H100 box is in the tree, the real DGX-2 hwloc XML stands in.
DEFAULT_MACHINE = os.environ.get("SLURM_GPU_TEST_MACHINE") or (
    "h100-sxm-8x" if (REPO / "tests" / "data" / "machines" / "h100-sxm-8x").is_dir() else "dgx2")

REQUIRED = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/srun",
            "/usr/bin/sbatch", "/usr/bin/scontrol", "/usr/bin/sinfo", "/usr/bin/squeue")

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}

def _missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return "integration tests need root (they start Slurm's daemons)"
    missing = [p for p in REQUIRED if not os.access(p, os.X_OK)]
    if missing:
        return f"Slurm/munge not installed ({missing[0]} missing; run scripts/install.sh)"
    return None

# -- job users ---------------------------------------------------------------
def ensure_user(name: str) -> pwd.struct_passwd:
    """The passwd entry of *name*, creating the user (with a home) if missing."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    for _ in range(50):
        res = run(["useradd", "--create-home", "--shell", "/bin/bash", name], timeout=30, check=False)
        if "cannot lock" not in res.stderr:   # /etc/passwd or /etc/group held by a concurrent useradd
            break
        time.sleep(0.2)
    if res.returncode not in (0, 9):  # 9: created concurrently by another test run
        pytest.fail(f"useradd {name} failed: {res.stderr.strip()}")
    return pwd.getpwnam(name)

# -- a running sandbox plus helpers ------------------------------------------
def parse_kv(text: str) -> dict[str, str]:
    """``scontrol show ... -o`` output -> dict (values may contain spaces? no: -o keeps one token)."""
    out: dict[str, str] = {}
    for tok in text.split():
        key, sep, val = tok.partition("=")
        if sep:
            out[key] = val
    return out

class Cluster:
    """A started sandbox and the commands tests run against it."""

    def __init__(self, sandbox: Any) -> None:
        self.sb = sandbox

    @property
    def dir(self) -> Path:
        return self.sb.dir

    @property
    def env(self) -> dict[str, str]:
        return self.sb.env

    @property
    def nodes(self) -> list[str]:
        return self.sb.node_names

    def run(self, argv: Sequence[str], *, user: str | None = None, timeout: float = 60,
            env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
            input: str | None = None) -> Completed:
        """Run *argv* with this sandbox's SLURM_CONF, as root or as job *user*.

        Never raises on a non-zero exit: tests assert on ``returncode``.
        """
        full = dict(self.env)
        run_as = None
        if user is not None:
            pw = ensure_user(user)
            run_as = RunAs(pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(user, pw.pw_gid)))
            full.update(HOME=pw.pw_dir, USER=user, LOGNAME=user)
            cwd = cwd or pw.pw_dir
        full.update(env or {})
        wd = str(cwd or self.dir)
        wrapped, run_as = self.sb.client_argv(argv, run_as, wd)
        if wrapped != list(argv):   # a Debian root's Slurm: the command runs inside the root
            full["PATH"] = SAFE_PATH
            wd = "/"
        return run(wrapped, timeout=timeout, env=full, check=False, run_as=run_as,
                   cwd=wd, input=input)

    @property
    def venv(self) -> Path:
        """The venv the sandbox's hooks run (inside the root for a Debian root's Slurm)."""
        return Path(self.sb.options.venv)

    @property
    def python(self) -> str:
        """The venv's interpreter, as jobs and hooks of this sandbox name it."""
        return str(self.venv / "bin" / "python")

    @property
    def slurm_version(self) -> str:
        return self.sb.slurm_version

    def srun(self, *args: str, user: str | None = None, timeout: float = 60) -> Completed:
        return self.run(["srun", *args], user=user, timeout=timeout)

    def sbatch(self, *args: str, user: str | None = None, cwd: str | None = None) -> int:
        """Submit with ``sbatch --parsable``; returns the job id."""
        res = self.run(["sbatch", "--parsable", *args], user=user, cwd=cwd, timeout=30)
        assert res.returncode == 0, f"sbatch failed: {res.stderr.strip()}"
        return int(res.stdout.strip().split(";")[0])

    def job(self, jobid: int) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (empty once the job is forgotten)."""
        res = self.run(["scontrol", "show", "job", "-o", str(jobid)], timeout=10)
        return parse_kv(res.stdout) if res.returncode == 0 else {}

    def wait_job(self, jobid: int, *, timeout: float = 60, states: set[str] = TERMINAL) -> dict[str, str]:
        """Poll until the job reaches one of *states*; returns its scontrol record."""
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(jobid)
            if info.get("JobState") in states:
                return info
            time.sleep(0.1)
        why = "; " + self.why_unavailable(*self.nodes) if "ReqNodeNotAvail" in info.get("Reason", "") else ""
        raise AssertionError(f"job {jobid} not in {sorted(states)} after {timeout} s: "
                             f"{info.get('JobState')} {info.get('Reason')}{why}")

    def why_unavailable(self, *names: str) -> str:
        """Each node's state and reason, and the last error lines of its slurmd
        log: what a failure that a drained node caused should print."""
        out = []
        for name in names:
            res = self.run(["scontrol", "show", "node", "-o", name], timeout=10)
            kv = parse_kv(res.stdout) if res.returncode == 0 else {}
            errors = [line for line in self.log(name).splitlines() if "error" in line.lower()][-5:]
            out.append(f"{name}: {kv.get('State')} reason={kv.get('Reason')!r} errors={errors}")
        return "; ".join(out)

    def node(self, name: str) -> dict[str, str]:
        res = self.run(["scontrol", "show", "node", "-o", name], timeout=10)
        assert res.returncode == 0, res.stderr
        return parse_kv(res.stdout)

    def node_states(self) -> dict[str, str]:
        res = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10)
        return dict(line.split() for line in res.stdout.splitlines() if line.strip())

    def wait_node_state(self, name: str, want: str | re.Pattern[str], timeout: float = 30) -> str:
        """Poll sinfo until node *name*'s long state matches *want*."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.node_states().get(name, "")
            if (want.fullmatch(state) if isinstance(want, re.Pattern) else state == want):
                return state
            time.sleep(0.1)
        raise AssertionError(f"node {name} not {want} after {timeout} s (state {state!r}; "
                             f"{self.why_unavailable(name)})")

    def log(self, name: str) -> str:
        """Text of a daemon log: ``slurmctld`` or a node name."""
        p = self.sb.layout.slurmctld_log if name == "slurmctld" else self.sb.layout.slurmd_log(name)
        return p.read_text(errors="replace") if p.exists() else ""

    def user_dir(self, user: str) -> Path:
        """A scratch directory under the sandbox owned by *user* (job output goes here)."""
        pw = ensure_user(user)
        d = self.dir / "users" / user
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir / "users", 0o755)
        os.chown(d, pw.pw_uid, pw.pw_gid)
        os.chmod(d, 0o700)
        return d

# Every directory a test run made for a cluster; the session's leak check
# looks for processes that still use one of them.
CREATED_DIRS: list[Path] = []
CANNOT_RUN = 77     # a build or script that cannot run on this machine says so with this exit status


def make_package(kind: str, out: Path, timeout: float) -> list[Path]:
    """``make <kind>`` (``deb``, ``rpm``) as docs/install.md says, with no development
    venv (SLURM_GPU_VENV and VENV name a directory that does not exist): the files
    it built, into *out*.  Skipped with the build's reason when it cannot run here
    (exit 77), unless SLURM_GPU_REQUIRE_INTEGRATION=1."""
    res = subprocess.run(["make", "-s", "-C", str(REPO), kind, "VENV=/nonexistent"], capture_output=True,
                         text=True, timeout=timeout, env={**os.environ, "SLURM_GPU_VENV": "/nonexistent",
                                                          "SLURM_GPU_DIST": str(out)})
    if res.returncode == CANNOT_RUN and os.environ.get("SLURM_GPU_REQUIRE_INTEGRATION") != "1":
        pytest.skip(res.stderr.strip().splitlines()[-1])
    assert res.returncode == 0, res.stderr[-3000:]
    paths = [Path(line) for line in res.stdout.strip().splitlines()]
    assert paths and all(p.parent == out for p in paths), paths
    return paths


def new_sandbox_dir(tag: str) -> Path:
    BASE.mkdir(parents=True, exist_ok=True)
    os.chmod(BASE, 0o755)
    d = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=BASE))
    os.chmod(d, 0o755)
    CREATED_DIRS.append(d)
    return d


@contextlib.contextmanager
def vm_sandbox(tag: str, **options: Any) -> Iterator[Any]:
    """A started ``sandbox up --vm`` (SandboxOptions *options*), stopped and
    its directory removed afterwards (kept with SLURM_GPU_KEEP_SANDBOX=1)."""
    import shutil

    from slurm_gpu_devkit.sandbox import Sandbox, SandboxOptions
    if shutil.which("qemu-system-x86_64") is None:
        pytest.fail("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86; "
                    "scripts/install.sh installs it)")
    d = new_sandbox_dir(tag)
    sb = Sandbox(d, SandboxOptions(vm=True, **options))
    try:
        sb.up()
        yield sb
    finally:
        sb.down()
        if os.environ.get("SLURM_GPU_KEEP_SANDBOX") != "1":
            shutil.rmtree(d, ignore_errors=True)


def _start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def process_ticks_now() -> int:
    """Clock ticks since boot, comparable with a process's start time."""
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK"))


def leftover_processes(since_ticks: int, dirs: Sequence[Path]) -> list[str]:
    """Processes started after *since_ticks* that still use one of *dirs*
    (cwd, command line or SLURM_CONF).

    Only this run's directories count, never "anything chrooted in the Debian
    roots": other test runs on the same machine share those roots, and their
    daemons are not ours to report or kill.  A process chrooted in a root names
    its directory by its path inside the root, which *dirs* hold too
    (debianroot.ChrootSlurm registers it), or shows the host path with the
    root's prefix, which contains it.
    """
    marks = [str(d) for d in dirs]
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        try:
            if _start_ticks(pid) < since_ticks:
                continue
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            where = [os.readlink(f"/proc/{pid}/cwd"), cmd]
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            where += [e.decode(errors="replace") for e in env if e.startswith(b"SLURM_CONF=")]
            root = os.readlink(f"/proc/{pid}/root")
        except (OSError, ValueError, IndexError):
            continue                    # gone meanwhile, or a kernel thread
        if any(m in w for m in marks for w in where):
            found.append(f"pid {pid} ({cmd.strip()[:80]}; root {root})")
    return found

def slurm_gpu_cli(*args: str, user: str | None = None, timeout: float = 120,
                  env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run this checkout's ``slurm-gpu`` with the venv's interpreter."""
    import sys
    full = {"PATH": SAFE_PATH, "PYTHONPATH": str(REPO)}
    full.update(env or {})
    argv = [sys.executable, "-m", "slurm_gpu", *args]
    kw: dict[str, Any] = {}
    if user is not None:
        pw = ensure_user(user)
        kw.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full,
                          cwd="/", **kw)


def mig_sim_state(machine: Path, sim: Path) -> Path:
    """*sim*: the NVML simulator's state for *machine*, MIG mode on for every GPU, no instances."""
    import json

    from slurm_gpu_devkit.sim.state import init_state_for_machine
    init_state_for_machine(str(machine), str(sim))
    st = json.loads(sim.read_text())
    for g in st["facts"]["gpus"]:
        g["mig"] = {"mode": 1, "pending": 1, "max_devices": 7, "instances": []}
    sim.write_text(json.dumps(st))
    return sim


def mps_mig_node_files(tag: str, machine: Path, venv: str | os.PathLike[str] | None = None) -> dict[str, Path]:
    """A node's simulator state (MIG on, no instances) and NVIDIA's real MPS control binary.

    The binary (``scripts/fetch-mps.sh``) is copied into the sandbox
    directory, so the same path works inside a Debian root; the test fails
    under ``SLURM_GPU_REQUIRE_INTEGRATION=1`` or is skipped without it.
    *venv* is kept for callers that name a root's venv.
    Remove ``result["dir"]`` when done.
    """
    from mpsbinary import install_real_mps_control
    d = new_sandbox_dir(tag)
    sim = mig_sim_state(machine, d / "sim.json")
    try:
        ctl = install_real_mps_control(d / "nvidia-cuda-mps-control")
    except BaseException:
        import shutil
        shutil.rmtree(d, ignore_errors=True)
        raise
    (d / "mps").mkdir(mode=0o755)
    return {"dir": d, "sim": sim, "ctl": ctl, "mps": d / "mps"}
