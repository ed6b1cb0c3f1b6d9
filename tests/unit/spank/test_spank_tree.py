"""The plugin's two halves come from one venv tree, even when the venv link
is swapped (an upgrade) between Slurm's load of the outer half and the outer
half's load of the inner one (issue 24 §5).

tests/data/spank/outer_host.c loads the real outer half through a link, the
test swaps the link, then the host sets an option that needs Python.  The
inner halves here are stand-ins that only say which tree they are.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_gpu.cli import main
from paths import ROOT

HOST_C = ROOT / "tests" / "data" / "spank" / "outer_host.c"

pytestmark = pytest.mark.skipif(
    not Path("/usr/include/slurm/spank.h").exists() or not shutil.which("gcc"),
    reason="needs libslurm-dev and gcc")

TAGGED_INNER = r"""
#include <stdio.h>
int sg_inner_start(const char *where, const void *api)
{ (void) where; (void) api; printf("INNER %s\n", TAG); fflush(stdout); return -1; }
int sg_inner_hook(int h, void *sp) { (void) h; (void) sp; return 0; }
int sg_inner_option(int w, int r) { (void) w; (void) r; return 0; }
"""


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("trees")
    outer = base / "venv-A" / "lib" / "slurm-gpu" / "slurm_gpu_spank.so"
    assert main(["spank", "build", "-o", str(outer)]) == 0
    src = base / "inner.c"
    src.write_text(TAGGED_INNER)
    for tag in "AB":
        lib = base / f"venv-{tag}" / "lib" / "slurm-gpu"
        lib.mkdir(parents=True, exist_ok=True)
        if tag == "B":
            shutil.copyfile(outer, lib / outer.name)
        subprocess.run(["gcc", "-shared", "-fPIC", f'-DTAG="{tag}"', "-o", str(lib / "slurm_gpu_spank_py.so"),
                        str(src)], check=True, capture_output=True)
    subprocess.run(["gcc", "-O0", "-rdynamic", "-o", str(base / "outer_host"), str(HOST_C), "-ldl"],
                   check=True, capture_output=True)
    return base


def _swap(link: Path, target: str) -> None:
    tmp = link.with_name(".venv.link.test")
    os.symlink(target, tmp)
    os.replace(tmp, link)


def test_inner_half_comes_from_the_outer_halfs_tree(trees):
    link = trees / "venv"
    _swap(link, "venv-A")
    host = subprocess.Popen([str(trees / "outer_host"), str(link / "lib" / "slurm-gpu" / "slurm_gpu_spank.so"),
                             "gpu-profile", "not-canonical"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None and host.stdout.readline().strip() == "LOADED"
    _swap(link, "venv-B")                      # the upgrade's rename, after Slurm loaded A's outer half
    out, _ = host.communicate("go\n", timeout=60)
    assert "INNER A" in out.splitlines(), out  # not B's inner half (and B's Python)


def test_removed_tree_is_one_error_not_another_trees_half(trees):
    link = trees / "venv"
    shutil.copytree(trees / "venv-A", trees / "venv-C")
    _swap(link, "venv-C")
    host = subprocess.Popen([str(trees / "outer_host"), str(link / "lib" / "slurm-gpu" / "slurm_gpu_spank.so"),
                             "gpu-profile", "not-canonical"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None and host.stdout.readline().strip() == "LOADED"
    _swap(link, "venv-B")
    shutil.rmtree(trees / "venv-C")            # two upgrades later: the tree is gone
    out, _ = host.communicate("go\n", timeout=60)
    lines = out.splitlines()
    assert "INNER B" not in lines, out
    assert lines[0] == ("ERROR slurm-gpu: cannot locate the plugin's own file in option parsing: its file "
                        "was removed since it was loaded (venv tree replaced twice?)"), out
    assert lines[1] == "OPTION -1", out
