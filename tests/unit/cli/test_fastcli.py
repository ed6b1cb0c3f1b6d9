"""``health`` and ``inventory`` without click (slurm_gpu.fastcli): same bytes, same exit codes as click.

A plain argv runs without importing click; anything unusual goes to click,
so its messages stay exactly click's.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpu import fastcli
from paths import ROOT

SNAP = str(ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json")

_ENTRY = ("import sys; from slurm_gpu.entry import run\n"
          "try:\n    run()\nfinally:\n    print('CLICK' if 'click' in sys.modules else 'NOCLICK', file=sys.stderr)")
_CLICK = "import sys; from slurm_gpu.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    klog = tmp_path / "kern.log"
    klog.write_text("[  12.5] NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=a.out, Graphics SM Warp Exception\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\n[health]\nkernel_log = "{klog}"\n')
    e = {k: v for k, v in os.environ.items() if k != "SLURM_GPU_DEBUG"}
    return dict(e, SLURM_GPU_CONFIG=str(cfg), SLURMD_NODENAME="fast1", PYTHONPATH=str(ROOT))


def _as_click_does(env: dict[str, str], argv: list[str], path: str) -> subprocess.CompletedProcess:
    """Runs *argv* through the entry point and through click: the entry point took
    *path* (``CLICK`` or ``NOCLICK``) and printed the same bytes with the same exit code."""
    fast = subprocess.run([sys.executable, "-c", _ENTRY, *argv], capture_output=True, text=True,
                          cwd=str(ROOT), env=env, timeout=120)
    slow = subprocess.run([sys.executable, "-c", _CLICK, *argv], capture_output=True, text=True,
                          cwd=str(ROOT), env=env, timeout=120)
    assert fast.stderr.splitlines()[-1] == path, fast.stderr
    assert (fast.returncode, fast.stdout, fast.stderr.rsplit(path, 1)[0]) == \
        (slow.returncode, slow.stdout, slow.stderr)
    return fast


@pytest.mark.parametrize("argv", [
    ["health", "--snapshot", SNAP, "--no-drain"],
    ["health", "--no-drain", "--json", "--snapshot", SNAP, "--only", "gpu.xid,gpu.ecc"],
    ["health", "--snapshot", SNAP, "--no-drain", "--node", "a\033[31mred\033[0m", "--isolate-bad-gpu"],
    ["health", "--snapshot", "/nonexistent/snap.json", "--no-drain"],
    ["health", "--snapshot", SNAP, "--no-drain", "--only", "no.such.check"],
    ["inventory", "--snapshot", SNAP, "--json"],
    ["inventory", "--snapshot", SNAP],
    ["inventory", "--snapshot", SNAP, "--hwloc-xml", "x.xml"],
    ["inventory", "--overlay", "x.json"],
])
def test_plain_argv_runs_without_click_and_prints_what_click_prints(env, argv) -> None:
    fast = _as_click_does(env, argv, "NOCLICK")
    assert "\033" not in fast.stdout   # not a terminal: escapes stripped, as click.echo does


@pytest.mark.parametrize("argv", [
    ["health", "--help"],
    ["health", f"--snapshot={SNAP}", "--no-drain"],
    ["health", "--snapshot", SNAP, "--snapshot", SNAP, "--no-drain"],
    ["health", "--snapshot"],
    ["health", "--snapshot", "/", "--no-drain"],          # a directory: click.Path's message
    ["health", "--no-drain", "--bogus"],
    ["health", "--no-drain", "extra"],
    ["health", "--node", "--json", "--snapshot", SNAP, "--no-drain"],   # click: "--json" is the node name
    ["inventory", "--snapshot", ""],
])
def test_anything_unusual_goes_to_click(env, argv) -> None:
    _as_click_does(env, argv, "CLICK")


def test_debug_goes_to_click(env) -> None:
    r = subprocess.run([sys.executable, "-c", _ENTRY, "inventory", "--snapshot", "/nonexistent"],
                       capture_output=True, text=True, cwd=str(ROOT), env=dict(env, SLURM_GPU_DEBUG="1"), timeout=120)
    assert r.returncode == 1 and "Traceback" in r.stderr and r.stderr.splitlines()[-1] == "CLICK"


def test_parse() -> None:
    def health(argv: list[str]) -> dict | None:
        return fastcli.plain_args(["health", *argv])

    assert health(["--slurm"]) == {"slurm_mode": True}
    assert health(["--only", "gpu.xid", "--json"]) == {"only": "gpu.xid", "as_json": True}
    assert health([]) == {}
    assert fastcli.plain_args(["inventory", "--json"]) == {"as_json": True}
    for other in ([], ["gres"], ["--json"], ["report", "usage"]):      # commands for click
        assert fastcli.plain_args(other) is None, other
    for bad in (["--json", "--json"], ["--only"], ["--only", "-x"], ["--only", ""], ["--only=x"], ["-h"],
                ["--"], ["x"], ["--debug"]):
        assert health(bad) is None, bad
