"""``slurm-gpu --version`` answers without importing click; the rest is click's."""
from __future__ import annotations

import subprocess
import sys
from paths import ROOT



def _run(*args: str) -> subprocess.CompletedProcess:
    code = ("import sys; sys.argv[1:] = sys.argv[1:]; from slurm_gpu.entry import run\n"
            "try:\n    run()\nfinally:\n    print('CLICK' if 'click' in sys.modules else 'NOCLICK', file=sys.stderr)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=str(ROOT))


def test_version_without_click_same_text_as_click() -> None:
    from slurm_gpu.cli import main
    fast = _run("--version")
    assert fast.returncode == 0 and fast.stderr.strip() == "NOCLICK"
    slow = subprocess.run([sys.executable, "-c", "import sys; from slurm_gpu.cli import main; "
                           "sys.exit(main(['--version']))"], capture_output=True, text=True,
                          cwd=str(ROOT))
    assert slow.returncode == 0 and fast.stdout == slow.stdout
    assert main  # the click front end still answers it too


def test_other_commands_go_through_click() -> None:
    r = _run("--version", "--debug")            # click answers (and exits 0)
    assert r.returncode == 0 and r.stderr.splitlines()[-1] == "CLICK"
    r = _run("--bogus")
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == "CLICK"
    r = _run("--help")
    assert r.returncode == 0 and "Commands:" in r.stdout
