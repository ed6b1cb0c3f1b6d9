"""[cluster] publish_dir on a real Slurm: HealthCheckProgram publishes each node's model,
and rewrites only the node whose hardware changed."""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from slurm_gpu.cluster import store
from slurm_gpu.hw import snapshot as snap
from paths import ROOT

H100 = ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json"


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    from sandboxlib import new_sandbox_dir
    d = new_sandbox_dir("cluster-publish")
    (d / "machines").mkdir()
    (d / "published").mkdir()
    for n in ("n1", "n2", "n3"):
        (d / "machines" / f"{n}.json").symlink_to(H100)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _stat(p: Path) -> tuple[int, int]:
    st = p.stat()
    return st.st_ino, st.st_mtime_ns


def _wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_health_check_publishes_every_node_and_rewrites_only_the_changed_one(make_sandbox: Any,
                                                                            shared: Path) -> None:
    pub = shared / "published"
    cluster = make_sandbox(3, health=True, health_interval=1, extra_config={
        "node": {"snapshot": f"{shared}/machines/%n.json"},
        "health": {"kernel_log": "/dev/null",
                   "skip": ["os.thp", "os.swappiness", "os.governor", "os.memlock", "os.persistenced"]},
        "cluster": {"publish_dir": str(pub)}})
    files = {n: pub / f"{n}.json" for n in cluster.nodes}
    _wait(lambda: all(f.exists() for f in files.values()), 60, "every node's first publication")
    first = {n: _stat(f) for n, f in files.items()}
    states = {n: cluster.dir / "var" / n / f"health-state.{n}.json" for n in cluster.nodes}

    # n2 loses GPU 3: its machine file becomes a recording of that fault.
    data = snap.read_snapshot(str(H100))
    bus3 = next(g["pci_bus_id"] for g in data["node"]["gpus"] if g["minor"] == 3)
    lost = shared / "n2-lost.json"
    snap.write(str(lost), snap.rerecord(str(H100), hostname="n2", overlay={"gpus": {bus3: {"lost": True}}}))
    (shared / "machines" / "n2.json").unlink()
    (shared / "machines" / "n2.json").symlink_to(lost)
    changed_at = time.time_ns()

    _wait(lambda: _stat(files["n2"]) != first["n2"], 60, "n2's model to be republished")
    # Two more runs on the other nodes after the change: still not rewritten.
    _wait(lambda: all(states[n].stat().st_mtime_ns > changed_at + 2_000_000_000 for n in ("n1", "n3")), 60,
          "later health runs on n1 and n3")
    assert _stat(files["n1"]) == first["n1"] and _stat(files["n3"]) == first["n3"]
    col = store.load_dir(str(pub))
    assert not col.bad
    assert [len(col.nodes[n].gpus) for n in ("n1", "n2", "n3")] == [8, 7, 8]
