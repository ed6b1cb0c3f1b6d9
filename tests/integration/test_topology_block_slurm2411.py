"""topology/block from NVLink cliques in a real Slurm 24.11 (Debian 13 root, chroot).

Debian 12's Slurm 22.05 has no topology/block, so this module builds (once,
cached under /var/cache/slurm-gpu) a Debian 13 root with
``scripts/trixie-root.sh`` and runs munged, slurmctld and eight slurmd from
it.  Without network (debootstrap cannot fetch) the module is skipped with
the reason.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from sandboxlib import REPO
from slurm_gpu.confgen import hostlist

SCRIPT = REPO / "scripts" / "trixie-root.sh"
GB200 = REPO / "tests" / "data" / "machines" / "gb200-nvl" / "snapshot.json"
NODES = [f"n{i}" for i in range(1, 9)]
CLIQUES = {"n1": 1, "n2": 1, "n3": 1, "n4": 1, "n5": 2, "n6": 2, "n7": 2, "n8": 2}


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def trixie_root() -> Path:
    if shutil.which("debootstrap") is None:
        pytest.skip("debootstrap not installed: cannot build the Slurm 24.11 root")
    res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        pytest.skip(f"no Slurm 24.11 root: {res.stderr.strip() or res.stdout.strip()}")
    return Path(res.stdout.strip().splitlines()[-1])


def snapshots(d: Path) -> None:
    """Eight GB200-style node snapshots in two NVLink cliques (the real gb200-nvl record, re-labelled)."""
    base = json.loads(GB200.read_text())
    for name, clique in CLIQUES.items():
        snap = dict(base, hostname=name)
        node = json.loads(json.dumps(base["node"]))
        node["hostname"] = name
        for g in node["gpus"]:
            g["fabric"]["clique_id"] = clique
        snap["node"] = node
        (d / f"{name}.json").write_text(json.dumps(snap))


class Slurm2411:
    def __init__(self, root: Path, topology_conf: str) -> None:
        self.root = root
        self.rel = Path(tempfile.mkdtemp(prefix="sgblock-", dir=root / "tmp")).relative_to(root)
        self.procs: list[subprocess.Popen[bytes]] = []
        r = self.host(self.rel)
        for sub in ("etc", "state", "log", "run", "munge", *[f"spool/{n}" for n in NODES]):
            (r / sub).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        host = socket.gethostname().split(".")[0]
        ports = free_ports(1 + len(NODES))
        rel = f"/{self.rel}"
        conf = f"""ClusterName=sgblock
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={rel}/munge/munge.sock
SlurmctldPort={ports[0]}
StateSaveLocation={rel}/state
SlurmdSpoolDir={rel}/spool/%n
SlurmctldPidFile={rel}/run/slurmctld.pid
SlurmdPidFile={rel}/run/slurmd-%n.pid
SlurmctldLogFile={rel}/log/slurmctld.log
SlurmdLogFile={rel}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
TopologyPlugin=topology/block
SlurmdParameters=config_overrides
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
"""
        for n, p in zip(NODES, ports[1:]):
            conf += (f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs=2 "
                     f"RealMemory=1000 State=UNKNOWN\n")
        conf += "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        (r / "etc" / "slurm.conf").write_text(conf)
        (r / "etc" / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
        (r / "etc" / "topology.conf").write_text(topology_conf)
        self.conf = f"{rel}/etc/slurm.conf"

    def host(self, rel: Path | str) -> Path:
        return self.root / str(rel).lstrip("/")

    def _chroot(self, *argv: str) -> list[str]:
        return ["unshare", f"--root={self.root}", "--mount-proc", *argv]

    def start(self) -> None:
        rel = f"/{self.rel}"
        self._spawn("/usr/sbin/munged", "-F", "--force", f"--socket={rel}/munge/munge.sock",
                    f"--key-file={rel}/munge/munge.key", f"--pid-file={rel}/run/munged.pid",
                    f"--log-file={rel}/log/munged.log", f"--seed-file={rel}/munge/seed")
        deadline = time.monotonic() + 10
        while not self.host(f"{rel}/munge/munge.sock").exists():
            assert time.monotonic() < deadline, "munged did not start"
            time.sleep(0.05)
        self._spawn("/usr/sbin/slurmctld", "-D", "-f", self.conf)
        for n in NODES:
            self._spawn("/usr/sbin/slurmd", "-D", "-N", n, "-f", self.conf)
        deadline = time.monotonic() + 60
        while True:
            out = self.cmd("sinfo", "-h", "-N", "-t", "idle", "-o", "%N").stdout.split()
            if sorted(set(out)) == sorted(NODES):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"nodes not idle: {out}\n{self.log('slurmctld')[-2000:]}")
            time.sleep(0.2)

    def _spawn(self, *argv: str) -> None:
        # unshare execs the daemon: the Popen pid is the daemon's, killed by pid at the end.
        self.procs.append(subprocess.Popen(self._chroot(*argv), stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True, cwd="/"))

    def cmd(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self._chroot("/usr/bin/env", f"SLURM_CONF={self.conf}", *argv),
                              capture_output=True, text=True, timeout=timeout, cwd="/")

    def log(self, name: str) -> str:
        p = self.host(f"/{self.rel}/log/{name}.log")
        return p.read_text(errors="replace") if p.exists() else ""

    def sbatch(self, *args: str) -> int:
        res = self.cmd("sbatch", "--parsable", "-o", "/dev/null", *args)
        assert res.returncode == 0, res.stderr
        return int(res.stdout.strip())

    def job(self, jobid: int, want: str = "RUNNING", timeout: float = 30) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            out = self.cmd("scontrol", "show", "job", "-o", str(jobid)).stdout
            info = dict(t.split("=", 1) for t in out.split() if "=" in t)
            if info.get("JobState") == want:
                return info
            time.sleep(0.1)
        raise AssertionError(f"job {jobid} not {want}: {info.get('JobState')} {info.get('Reason')}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        if os.environ.get("SLURM_GPU_KEEP_SANDBOX") != "1":
            shutil.rmtree(self.host(self.rel), ignore_errors=True)


@pytest.fixture(scope="module")
def topo_text(tmp_path_factory, cli) -> str:
    d = tmp_path_factory.mktemp("snaps")
    snapshots(d)
    res = cli("topology", "render", "--snapshot", str(d), "--block-sizes", "4,8")
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture(scope="module")
def slurm(trixie_root: Path, topo_text: str) -> Iterator[Slurm2411]:
    s = Slurm2411(trixie_root, topo_text)
    try:
        s.start()
        yield s
    finally:
        s.stop()


def blocks_shown(s: Slurm2411) -> dict[str, set[str]]:
    res = s.cmd("scontrol", "show", "topology")
    assert res.returncode == 0, res.stderr
    out = {}
    for line in res.stdout.splitlines():
        m = re.match(r"BlockName=(\S+) .*Nodes=(\S+)", line)
        if m:
            out[m.group(1)] = set(hostlist.expand(m.group(2)))
    return out


def test_block_topology_loads_in_slurm_24_11(slurm: Slurm2411, topo_text: str) -> None:
    assert "slurm-wlm 24.11" in (slurm.root / ".slurm-version").read_text()
    assert "BlockName=block001 Nodes=n[1-4]" in topo_text and "BlockSizes=4,8" in topo_text
    assert blocks_shown(slurm) == {"block001": {"n1", "n2", "n3", "n4"}, "block002": {"n5", "n6", "n7", "n8"}}


def test_segment_jobs_land_inside_one_block(slurm: Slurm2411) -> None:
    blocks = list(blocks_shown(slurm).values())
    hold = slurm.sbatch("-w", "n[1-3]", "--exclusive", "--wrap", "sleep 60")
    try:
        slurm.job(hold)
        # Lowest free pair would be n[4-5], across both blocks; --segment=2 must keep it in one.
        j = slurm.sbatch("-N2", "--segment=2", "--exclusive", "--wrap", "sleep 5")
        nodes = set(hostlist.expand(slurm.job(j)["NodeList"]))
        assert any(nodes <= b for b in blocks), nodes
        j2 = slurm.sbatch("-N2", "--segment=2", "--exclusive", "--wrap", "sleep 5")
        nodes2 = set(hostlist.expand(slurm.job(j2)["NodeList"]))
        assert any(nodes2 <= b for b in blocks) and not nodes & nodes2, nodes2
    finally:
        slurm.cmd("scancel", "--full", str(hold))
