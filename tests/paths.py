"""Where the checkout and its test data are, for every test at any depth.

Tests name files by these, never by ``Path(__file__).parents[N]``, so a test
file can move between directories without its paths changing meaning.
``UNIT_LAYERS`` is the one list of ``tests/unit/`` subdirectories: one per
layer of the product (docs/architecture.md), documented in
docs/development.md, and enforced by ``tests/unit/common/test_layout.py``.
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
DATA = TESTS / "data"
UNIT = TESTS / "unit"

# layer -> what its tests exercise (docs/development.md, "Where unit tests go")
UNIT_LAYERS: dict[str, str] = {
    "hw": "slurm_gpu/hw: NVML, hwloc, kernel log, snapshots, the node model, node facts, inventory",
    "confgen": "slurm_gpu/confgen: gres.conf and topology.conf, hostlists, ibnetdiscover",
    "mig": "slurm_gpu/mig: the MIG planner, GPU model tables, MIG on the simulator",
    "spank": "slurm_gpu/spank and binding.py: the SPANK plugin, its options and CPU binding",
    "jobs": "slurm_gpu/jobs: prolog/epilog, MPS, job state and cgroups, hook scripts",
    "health": "slurm_gpu/health: checks, XID/SXID, drain and resume, events, repair",
    "acct": "slurm_gpu/acct: GPU usage accounting, its hooks and reports",
    "imex": "slurm_gpu/imex: IMEX domains, addresses and per-job daemons",
    "cluster": "slurm_gpu/cluster: the cluster model, its store and placement",
    "cli": "front ends and shipping: the CLI, doctor, packaging, install script, plugins",
    "common": "what every layer uses: config, runner, fsutil, procfs, Slurm client, code shape",
    "devkit": "devkit/: the simulator's drills, the sandbox, its VMs and Debian roots",
}
