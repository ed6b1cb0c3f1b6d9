"""A real Slurm newer than the host's, run from a cached Debian root.

Debian 12 ships Slurm 22.05.  Newer releases come from a minbase root of a
later suite built once by ``scripts/debian-root.sh SUITE`` (cached under
/var/cache/slurm-gpu/SUITE-root): ``trixie`` has Slurm 24.11, ``sid``
26.05.  :func:`debian_root` builds or finds it; when it cannot (no network,
no debootstrap) it skips the calling test with the script's one-line reason,
or fails it under ``SLURM_GPU_REQUIRE_INTEGRATION=1`` (CI must not pass by
skipping the newer Slurm).

:class:`ChrootSlurm` runs munged, slurmctld and N slurmd (one per Slurm
node, all on this host with their own ports) from that root.  All daemons
live in ONE private PID and mount namespace (``unshare --root --pid --fork
--mount-proc``) under a small supervisor shell: stopping it ends every
process the cluster started, job steps included, and the namespace and its
/proc mount go with them.  Client commands (``scontrol``, ``sbatch``) run
chrooted through ``unshare --root --mount-proc`` and end with their call.
Everything lives in a fresh directory under ROOT/tmp, removed at the end
(kept with ``SLURM_GPU_KEEP_SANDBOX=1``).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

import pytest

from sandboxlib import REPO, parse_kv

SCRIPT = REPO / "scripts" / "debian-root.sh"


CACHE = Path(os.environ.get("SLURM_GPU_CACHE", "/var/cache/slurm-gpu"))   # scripts/debian-root.sh's


def unavailable(msg: str) -> None:
    """Skip the calling test, or fail it under SLURM_GPU_REQUIRE_INTEGRATION=1."""
    if os.environ.get("SLURM_GPU_REQUIRE_INTEGRATION") == "1":
        pytest.fail(f"SLURM_GPU_REQUIRE_INTEGRATION=1 but {msg}", pytrace=False)
    pytest.skip(msg)


def debian_root(suite: str, what: str) -> Path:
    """The cached root of *suite* (built on first use); skips with the reason when it
    cannot be had (fails instead under ``SLURM_GPU_REQUIRE_INTEGRATION=1``).

    *what* names what the caller needs it for, e.g. ``"Slurm 26.05"``.
    """
    if shutil.which("debootstrap") is None and not (
            CACHE / f"{suite}-root"
            / ".slurm-gpu-complete").exists():
        unavailable(f"debootstrap not installed: cannot build the {what} root ({suite})")
    res = subprocess.run(["bash", str(SCRIPT), suite], capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        why = (res.stderr.strip() or res.stdout.strip()).splitlines()
        unavailable(f"no {what} root: {why[-1] if why else f'debian-root.sh exited {res.returncode}'}")
    return Path(res.stdout.strip().splitlines()[-1])


def slurm_version(root: Path) -> str:
    """``"26.05.5"`` from the root's recorded ``slurmctld -V``."""
    return (root / ".slurm-version").read_text().split()[-1]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class ChrootSlurm:
    """munged + slurmctld + one slurmd per node, from *root*, in a fresh directory.

    *slurm_conf*: extra ``Key=Value`` lines (e.g. ``{"TopologyPlugin": "topology/block"}``);
    *etc_files*: files next to slurm.conf (``topology.conf``, ``topology.yaml``);
    *partitions*: ``PartitionName=`` lines (default: one ``debug`` partition with every node).
    """

    def __init__(self, root: Path, nodes: Sequence[str], *, name: str = "sgroot",
                 slurm_conf: Mapping[str, str] | None = None, etc_files: Mapping[str, str] | None = None,
                 partitions: Sequence[str] | None = None, cpus: int = 2) -> None:
        self.root = root
        self.nodes = list(nodes)
        (root / "tmp").mkdir(exist_ok=True)
        self.rel = "/" + str(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root / "tmp")).relative_to(root))
        from sandboxlib import CREATED_DIRS
        CREATED_DIRS.append(Path(self.rel))   # the leak check knows its processes by this path
        self.proc: subprocess.Popen[bytes] | None = None
        r = self.host(self.rel)
        for sub in ("etc", "state", "log", "run", "munge", *[f"spool/{n}" for n in self.nodes]):
            (r / sub).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        self.conf = f"{self.rel}/etc/slurm.conf"
        self.write_etc("slurm.conf", self._slurm_conf(name, slurm_conf or {}, partitions, cpus))
        self.write_etc("cgroup.conf", "CgroupPlugin=disabled\n")
        for fname, text in (etc_files or {}).items():
            self.write_etc(fname, text)

    def _slurm_conf(self, name: str, extra: Mapping[str, str], partitions: Sequence[str] | None,
                    cpus: int) -> str:
        host = socket.gethostname().split(".")[0]
        ports = free_ports(1 + len(self.nodes))
        rel = self.rel
        conf = {
            "ClusterName": name,
            "SlurmctldHost": f"{host}(127.0.0.1)",
            "SlurmUser": "root", "SlurmdUser": "root",
            "AuthType": "auth/munge", "CredType": "cred/munge",
            "AuthInfo": f"socket={rel}/munge/munge.sock",
            "SlurmctldPort": str(ports[0]),
            "StateSaveLocation": f"{rel}/state",
            "SlurmdSpoolDir": f"{rel}/spool/%n",
            "SlurmctldPidFile": f"{rel}/run/slurmctld.pid",
            "SlurmdPidFile": f"{rel}/run/slurmd-%n.pid",
            "SlurmctldLogFile": f"{rel}/log/slurmctld.log",
            "SlurmdLogFile": f"{rel}/log/slurmd-%n.log",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres", "SelectTypeParameters": "CR_Core",
            "SlurmdParameters": "config_overrides",
            "ReturnToService": "2",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "MpiDefault": "none",
            # Schedule a batch job at submission (default: up to 3 s later).
            "SchedulerParameters": "batch_sched_delay=0",
        }
        conf.update(extra)
        lines = [f"{k}={v}" for k, v in conf.items()]
        lines += [f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs={cpus} "
                  f"RealMemory=1000 State=UNKNOWN" for n, p in zip(self.nodes, ports[1:])]
        lines += list(partitions or ["PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"])
        return "\n".join(lines) + "\n"

    # -- paths ------------------------------------------------------------
    def host(self, rel: str) -> Path:
        """The host path of a path inside the root."""
        return self.root / rel.lstrip("/")

    def write_etc(self, fname: str, text: str) -> None:
        self.host(f"{self.rel}/etc/{fname}").write_text(text)

    def log(self, name: str) -> str:
        """A daemon log: ``slurmctld``, ``slurmd-<node>``, ``munged`` (or ``<name>.stderr``)."""
        p = self.host(f"{self.rel}/log/{name}" + ("" if "." in name else ".log"))
        return p.read_text(errors="replace") if p.exists() else ""

    # -- daemons ----------------------------------------------------------
    def _supervisor(self) -> str:
        """The shell script that is PID 1 of the cluster's namespace."""
        rel = self.rel
        q = shlex.quote
        daemons = [f"/usr/sbin/slurmctld -D -f {q(self.conf)} 2>{q(rel)}/log/slurmctld.stderr &",
                   "pids+=($!)"]
        for n in self.nodes:
            daemons += [f"/usr/sbin/slurmd -D -N {q(n)} -f {q(self.conf)} 2>{q(rel)}/log/slurmd-{q(n)}.stderr &",
                        "pids+=($!)"]
        return "\n".join([
            "#!/bin/bash",
            "# PID 1 of the cluster's namespace: when it exits, the kernel ends every process left.",
            "pids=()",
            "stop() { kill -TERM \"${pids[@]}\" 2>/dev/null; wait; exit 0; }",
            "trap stop TERM INT",
            f"/usr/sbin/munged -F --force --socket={q(rel)}/munge/munge.sock --key-file={q(rel)}/munge/munge.key "
            f"--pid-file={q(rel)}/run/munged.pid --log-file={q(rel)}/log/munged.log --seed-file={q(rel)}/munge/seed "
            f"2>{q(rel)}/log/munged.stderr &",
            "pids+=($!)",
            f"for i in $(seq 200); do [ -S {q(rel)}/munge/munge.sock ] && break; sleep 0.05; done",
            *daemons,
            "while :; do wait; done  # returns early only for the trapped signal",
            ""])

    def start(self, timeout: float = 60) -> None:
        """Start every daemon; return once all nodes are idle (AssertionError with the log otherwise)."""
        self.launch()
        try:
            self.wait_idle(self.nodes, timeout)
        except BaseException:
            self.stop()
            raise

    def launch(self) -> None:
        """Start every daemon and return at once (see :meth:`start`, :meth:`wait_log`)."""
        script = self.host(f"{self.rel}/run/supervise.sh")
        script.write_text(self._supervisor())
        script.chmod(0o755)
        # unshare forks: the Popen pid is unshare itself; its only child is PID 1 inside.
        self.proc = subprocess.Popen(
            ["unshare", f"--root={self.root}", "--pid", "--fork", "--kill-child", "--mount-proc",
             "/bin/bash", f"{self.rel}/run/supervise.sh"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd="/")

    def wait_log(self, name: str, pattern: str, timeout: float = 30) -> re.Match[str] | None:
        """Poll daemon log *name* for regex *pattern*; the match, or None after *timeout*."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.log(name))
            if m or time.monotonic() > deadline:
                return m
            time.sleep(0.1)

    def wait_idle(self, nodes: Sequence[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        out: list[str] = []
        while True:
            out = self.cmd("sinfo", "-h", "-N", "-t", "idle", "-o", "%N").stdout.split()
            if set(nodes) <= set(out):
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the cluster's supervisor exited ({self.proc.returncode})\n"
                                     f"{self.log('slurmctld')[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"nodes not idle after {timeout} s: {sorted(set(out))}\n"
                                     f"{self.log('slurmctld')[-3000:]}{self.log('slurmctld.stderr')[-2000:]}")
            time.sleep(0.2)

    def _init_pid(self) -> int | None:
        """PID (host view) of the namespace's PID 1: the only child of unshare."""
        assert self.proc is not None
        try:
            kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return None
        return int(kids[0]) if kids else None

    def stop(self) -> None:
        """End every process of the cluster (SIGTERM, then SIGKILL of the namespace), remove the directory."""
        if self.proc is not None and self.proc.poll() is None:
            init = self._init_pid()
            if init is not None:
                os.kill(init, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                # Killing PID 1 makes the kernel kill the whole namespace.
                init = self._init_pid()
                if init is not None:
                    os.kill(init, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if os.environ.get("SLURM_GPU_KEEP_SANDBOX") != "1":
            shutil.rmtree(self.host(self.rel), ignore_errors=True)

    # -- clients ----------------------------------------------------------
    def cmd(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client inside the root with this cluster's SLURM_CONF (never raises on rc)."""
        return subprocess.run(["unshare", f"--root={self.root}", "--mount-proc", "/usr/bin/env", "-i",
                               "PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"SLURM_CONF={self.conf}", *argv],
                              capture_output=True, text=True, timeout=timeout, cwd="/")

    def sbatch(self, *args: str) -> int:
        res = self.cmd("sbatch", "--parsable", "-o", "/dev/null", *args)
        assert res.returncode == 0, res.stderr
        return int(res.stdout.strip().split(";")[0])

    def job(self, jobid: int, want: str = "RUNNING", timeout: float = 30) -> dict[str, str]:
        """Poll ``scontrol show job`` until the job is in state *want*; returns its record."""
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = parse_kv(self.cmd("scontrol", "show", "job", "-o", str(jobid)).stdout)
            if info.get("JobState") == want:
                return info
            time.sleep(0.1)
        raise AssertionError(f"job {jobid} not {want}: {info.get('JobState')} {info.get('Reason')}")

    def cancel_all(self) -> None:
        """scancel every job and wait (briefly) until none is left."""
        self.cmd("scancel", "--full", "-u", "root")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if not self.cmd("squeue", "-h", "-o", "%i").stdout.strip():
                return
            time.sleep(0.1)
