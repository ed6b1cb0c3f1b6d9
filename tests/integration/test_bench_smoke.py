"""Every benchmark of bench/ runs as a quick smoke: small sizes, one repeat,
correctness only (no timing is judged here; bench/run_all.py judges it).

Each must exit 0 and print its rows of issue 15's table (bench/benchrow.py):
the path, what was measured, its floor measured in the same run, the goal.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


from sandboxlib import REPO

BENCH = REPO / "bench"
VENV = Path(os.environ.get("SLURM_GPU_VENV") or "/opt/slurm-gpu/venv")


def _smoke(script: str, timeout: float = 600) -> list[list[str]]:
    py = VENV / "bin" / "python"
    r = subprocess.run([str(py if py.exists() else sys.executable), str(BENCH / script), "--smoke"],
                       capture_output=True, text=True, timeout=timeout, cwd=str(REPO))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [line.split("\t")[1:] for line in r.stdout.splitlines() if line.startswith("ROW\t")]
    for path, measured, floor, goal, verdict in rows:
        assert measured and floor and goal.startswith("<=") and verdict == "smoke", rows
    return rows


def _paths(rows: list[list[str]]) -> list[str]:
    return [r[0] for r in rows]


def test_health_and_xid() -> None:
    rows = _smoke("bench_health.py")
    assert _paths(rows) == ["health, full check, 8-GPU snapshot",
                            "health --only gpu.xid, 1 MB kernel log"]
    assert "python -I -c pass" in rows[0][2] and "grep -c" in rows[1][2]


def test_health_fabric_paired_with_main() -> None:
    rows = _smoke("bench_health_fabric.py")
    assert _paths(rows) == ["health with the fabric checks, paired with main"] and "main" in rows[0][2]


def test_inventory() -> None:
    rows = _smoke("bench_inventory.py")
    assert _paths(rows) == ["inventory --snapshot --json"] and "python start" in rows[0][2]


def test_confgen_sizes_side_by_side() -> None:
    rows = _smoke("bench_confgen.py")
    assert _paths(rows) == ["gres + tree + block, 36 nodes", "gres + tree + block, 360 nodes"]
    assert all("reading" in r[2] for r in rows)


def test_prolog_with_the_real_mps_daemon() -> None:
    from mpsbinary import real_mps_control
    real_mps_control()
    rows = _smoke("bench_prolog.py")
    assert _paths(rows) == ["job without GPU options, prolog+epilog",
                            "--gpu-mps job, prolog+epilog, real daemon"]
    # judged against what a plain-stdlib hook pair must pay, the bare floor beside it
    assert "daemon alone" in rows[1][2] and "with the hooks' stdlib" in rows[1][2]
    assert "one cgroup join" in rows[1][2] and "the bare floor" in rows[1][2]


def test_spank_bound_step_beside_a_plain_step() -> None:
    rows = _smoke("bench_spank.py", timeout=900)
    assert [p.split(" (")[-1] for p in _paths(rows)] == [
        "plugin, no option)", "plugin, 1 GPU --gpu-numa-bind=prefer)"]
    assert all("plain step" in r[2] for r in rows)


def test_discovery_on_every_machine_beside_hwloc_alone() -> None:
    rows = _smoke("bench_discovery.py")
    assert len(rows) == 1 and rows[0][0].startswith("discovery: node model from NVML (simulated) + hwloc")
    assert "hwloc-ls alone" in rows[0][2]
