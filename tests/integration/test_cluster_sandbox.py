"""slurm-gpu cluster collect|check on a real Slurm of 32 nodes in network namespaces.

Every node is modelled on the recorded h100-sxm-8x through its own
``[node] snapshot = <dir>/%n.json``; n5's is a recording of that machine
with GPU 3 lost (a fault overlay), so Slurm, gres.conf and 31 nodes agree
and n5 drifts.  The collection runs the installed ``slurm-gpu snapshot
record`` on each node as a task of one srun.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from slurm_gpu.hw import snapshot as snap
from slurm_gpu_devkit.sandbox.layout import Layout
from paths import ROOT

H100 = ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json"
NODES = 32


@pytest.fixture(scope="module")
def machines() -> Iterator[Path]:
    from sandboxlib import new_sandbox_dir
    d = new_sandbox_dir("cluster-machines")
    data = snap.read_snapshot(str(H100))
    bus3 = next(g["pci_bus_id"] for g in data["node"]["gpus"] if g["minor"] == 3)
    for i in range(1, NODES + 1):
        (d / f"n{i}.json").symlink_to(H100)
    (d / "n5.json").unlink()
    snap.write(str(d / "n5.json"), snap.rerecord(str(H100), hostname="n5",
                                                 overlay={"gpus": {bus3: {"lost": True}}}))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(make_sandbox: Any, machines: Path) -> Any:
    return make_sandbox(NODES, netns=True, extra_config={"node": {"snapshot": f"{machines}/%n.json"}})


def _env(cluster: Any) -> dict[str, str]:
    return {**cluster.env, "SLURM_GPU_CONFIG": str(Layout.of(cluster.dir).config_toml),
            "PYTHONPATH": str(ROOT), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def _cli(cluster: Any, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurm_gpu", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(cluster), cwd="/")


def test_collect_gathers_every_node_and_check_finds_the_one_lacking_a_gpu(cluster: Any, tmp_path: Path) -> None:
    out = tmp_path / "col"
    res = _cli(cluster, "cluster", "collect", "-o", str(out), "--timeout", "120")
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(f"n{i}.json" for i in range(1, NODES + 1))
    progress = [ln for ln in res.stderr.splitlines() if ln.startswith("slurm-gpu: [")]
    assert len(progress) == NODES and progress[-1].startswith(f"slurm-gpu: [{NODES}/{NODES}]")
    assert "n5: collected: 7 GPU(s)" in res.stderr
    assert f"{NODES} collected, 0 failed, 0 skipped, of {NODES} node(s)" in res.stdout
    assert json.loads((out / "n9.json").read_text())["hostname"] == "n9"
    res = _cli(cluster, "cluster", "check", "--from", str(out), "--dev-dir", str(cluster.dir / "dev"))
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"slurm-gpu: cluster check: {NODES} node(s): {NODES - 1} match, 1 differ"
    assert "n5: GPU 3 missing (gres.conf has /dev/nvidia3, the node does not)" in lines
    assert all(ln.startswith("n5: ") for ln in lines[1:]), lines
    res = _cli(cluster, "cluster", "check", "--from", str(out), "--dev-dir", str(cluster.dir / "dev"),
               "--nodes", "n[1-4,6-32]", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["summary"]["match"] == NODES - 1


def test_drained_nodes_are_skipped_and_listed(cluster: Any, tmp_path: Path) -> None:
    assert cluster.run(["scontrol", "update", "nodename=n9", "state=drain", "reason=maint"]).returncode == 0
    try:
        res = _cli(cluster, "cluster", "collect", "-o", str(tmp_path), "--nodes", "n[8-10]", "--json")
        assert res.returncode == 1
        rep = json.loads(res.stdout)
        assert rep["nodes"]["n9"] == {"status": "skipped", "detail": "node drained: maint"}
        assert rep["summary"]["collected"] == 2 and not (tmp_path / "n9.json").exists()
    finally:
        cluster.run(["scontrol", "update", "nodename=n9", "state=resume"])
        cluster.wait_node_state("n9", "idle")


def test_a_node_whose_record_fails_is_reported_with_its_own_error(cluster: Any, machines: Path,
                                                                  tmp_path: Path) -> None:
    """n11's machine file is half-written: its task exits 1 and its one-line error is the reason."""
    good = machines / "n11.json"
    good.unlink()
    good.write_text(H100.read_text()[:20000])
    try:
        res = _cli(cluster, "cluster", "collect", "-o", str(tmp_path), "--nodes", "n[10-12]")
    finally:
        good.unlink()
        good.symlink_to(H100)
    assert res.returncode == 1
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("n11: failed: "))
    assert "slurm-gpu: bad snapshot JSON" in line, res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n10.json", "n12.json"]


def _netns_pids(cluster: Any, node: str) -> list[int]:
    res = cluster.run(["ip", "netns", "pids", f"sg{Layout.of(cluster.dir).key}-{node}"])
    return [int(p) for p in res.stdout.split()]


def test_a_node_killed_mid_collection_fails_and_the_rest_complete(cluster: Any, machines: Path,
                                                                  tmp_path: Path) -> None:
    """n7's machine file is a FIFO, so its task blocks until the node is killed (slurmd, stepd, task).

    Last in the module: n7 stays dead.
    """
    (machines / "n7.json").unlink()
    os.mkfifo(machines / "n7.json")
    out = tmp_path / "col"
    proc = subprocess.Popen([sys.executable, "-m", "slurm_gpu", "cluster", "collect", "-o", str(out),
                             "--timeout", "15"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(cluster), cwd="/")
    try:
        deadline = time.monotonic() + 60
        task = None
        while task is None and time.monotonic() < deadline:
            for pid in _netns_pids(cluster, "n7"):
                try:
                    if b"snapshot\0record" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        task = pid
                except OSError:
                    pass
            time.sleep(0.1)
        assert task is not None, "n7's collection task never started"
        for pid in _netns_pids(cluster, "n7"):
            os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, stdout + stderr
    assert "n7: failed: no answer within 15 s" in stdout
    assert f"{NODES - 1} collected, 1 failed, 0 skipped" in stdout
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(f"n{i}.json" for i in range(1, NODES + 1) if i != 7)   # no stage dir, no partial
