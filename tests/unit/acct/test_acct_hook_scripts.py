"""The accounting hook scripts start Python the way the jobs hooks do: ``-I -c``, no distutils shim."""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from machinedata import ROOT


@pytest.mark.parametrize("script,step", [("prolog.d/40-slurm-gpu-acct", "prolog"),
                                         ("epilog.d/60-slurm-gpu-acct", "epilog")])
def test_acct_hook_runs_main_with_c_not_m(tmp_path: Path, script: str, step: str) -> None:
    conf = tmp_path / "slurm-gpu.toml"
    conf.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\n[acct]\nenabled = true\n')
    seen = tmp_path / "seen"
    stub = tmp_path / "python"      # stands for the venv's interpreter: records how it was started
    stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$SETUPTOOLS_USE_DISTUTILS" "$@" > {shlex.quote(str(seen))}\nexit 3\n')
    stub.chmod(0o755)
    env = {"SLURM_GPU_CONFIG": str(conf), "SLURM_GPU_PYTHON": str(stub), "SLURM_JOB_ID": "42",
           "SLURM_JOB_GPUS": "0", "SLURMD_NODENAME": "n1"}
    r = subprocess.run(["/bin/sh", str(ROOT / script)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr          # accounting never fails a job, whatever Python says
    assert seen.read_text().splitlines() == [
        "stdlib", "-I", "-c", "import sys; from slurm_gpu.acct.__main__ import main; sys.exit(main())", step]


def test_acct_main_reads_its_step_from_argv_after_c(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_gpu.acct import __main__ as acct_main
    seen: list[str] = []
    monkeypatch.setattr("slurm_gpu.acct.hooks.main", lambda step: seen.append(step) or 0)
    umask = os.umask(0o022)         # main() sets the hooks' umask: give the test's back
    try:
        monkeypatch.setattr("sys.argv", ["-c", "epilog"])
        assert acct_main.main() == 0 and seen == ["epilog"]
        monkeypatch.setattr("sys.argv", ["-c", "bogus"])
        assert acct_main.main() == 2
    finally:
        os.umask(umask)
