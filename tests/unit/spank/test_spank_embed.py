"""The embedded interpreter, loaded by a small C host instead of srun.

tests/data/spank/embed_host.c loads the plugin's inner half exactly as the
outer half does (dlopen RTLD_GLOBAL, sg_inner_start) and stubs the SPANK
functions, so these tests need gcc and libslurm-dev but no cluster.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpu.cli import main
from paths import ROOT

HOST_C = ROOT / "tests" / "data" / "spank" / "embed_host.c"
VENV_SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"

pytestmark = [
    pytest.mark.skipif(not Path("/usr/include/slurm/spank.h").exists() or not shutil.which("gcc"),
                       reason="needs libslurm-dev and gcc"),
    pytest.mark.skipif(not (VENV_SITE / "slurm_gpu" / "spank" / "dispatch.py").exists(),
                       reason="slurm-gpu is not installed in this interpreter's venv "
                              "(the plugin imports the installed copy)"),
]


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("embed")
    assert main(["spank", "build", "-o", str(d / "slurm_gpu_spank.so")]) == 0
    exe = d / "embed_host"
    subprocess.run(["gcc", "-O0", "-rdynamic", "-o", str(exe), str(HOST_C), "-ldl"],
                   check=True, capture_output=True)
    return exe, d / "slurm_gpu_spank_py.so"


def _run(host, values, code=None, env=None) -> list[str]:
    exe, inner = host
    argv = [str(exe), str(inner), *[v or "-" for v in values]] + ([code] if code else [])
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                         env=env if env is not None else {"PATH": "/usr/bin:/bin"})
    return res.stdout.splitlines() + [f"RC {res.returncode}"]


PROBE = ("import sys, slurm_gpu; print('PREFIX', sys.prefix); print('PATH', sys.path); "
         "print('ISOLATED', sys.flags.isolated, sys.flags.no_user_site); "
         "print('PKG', slurm_gpu.__file__); print('SITE', 'site' in sys.modules); sys.stdout.flush()")


def test_interpreter_is_the_venvs_and_isolated(host, tmp_path):
    evil = tmp_path / "evil"
    (evil / "slurm_gpu").mkdir(parents=True)
    (evil / "slurm_gpu" / "__init__.py").write_text("raise SystemExit('poisoned')\n")
    (evil / "encodings").mkdir()
    (evil / "encodings" / "__init__.py").write_text("raise SystemExit('poisoned')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(evil), "PYTHONHOME": str(evil),
           "PYTHONSTARTUP": str(evil / "x.py"), "PYTHONUSERBASE": str(evil)}
    out = _run(host, ["strict", None, None, None], PROBE, env=env)
    assert "OPTION 0 0" in out and "HOOK 0" in out, out
    assert "JOBCONTROL SLURM_GPU_NUMA_BIND=strict" in out
    assert f"PREFIX {sys.prefix}" in out
    path_line = next(l for l in out if l.startswith("PATH "))
    assert str(VENV_SITE) in path_line and str(evil) not in path_line
    assert "dist-packages" not in path_line            # not Debian's site, only the venv
    assert "ISOLATED 1 1" in out
    assert f"PKG {VENV_SITE}/slurm_gpu/__init__.py" in out
    assert "SITE False" in out                          # no .pth files run in srun


def test_each_bad_value_is_one_error_and_minus_one(host):
    out = _run(host, [None, "gaming", "0", None])
    assert "OPTION 1 -1" in out and "OPTION 2 -1" in out, out
    errors = [l for l in out if l.startswith("ERROR ")]
    assert errors == ["ERROR slurm-gpu: bad value 'gaming' for --gpu-profile: expected training, "
                      "inference or none",
                      "ERROR slurm-gpu: bad value '0' for --gpu-mps: expected an active-thread "
                      "percentage from 1 to 100, or no value"]


def test_python_that_cannot_start_returns_an_error(host, tmp_path):
    from slurm_gpu.commands.spank import build_script
    mod = build_script()
    so = mod.build(tmp_path / "slurm_gpu_spank.so", tmpdir=str(tmp_path / "t"),
                   sys_path=["/nonexistent"])
    out = _run((host[0], so.with_name("slurm_gpu_spank_py.so")), ["strict", None, None, None])
    assert "START -1" in out and "RC 3" in out, out
    assert any(l.startswith("ERROR slurm-gpu: cannot start Python") and "init_fs_encoding" in l
               for l in out), out


def test_system_calls_and_the_planner_are_the_plugins_c_side(host):
    """System calls go through the plugin's C functions (no ctypes in a bound task).
    One planner: the inner half carries spank/sg_bind.c and hands it to binding.py,
    so the embedded interpreter plans with it (no planner of its own, no separate module)."""
    code = ("import sys; from slurm_gpu.spank import effects; from slurm_gpu import binding; "
            "print('BACKEND', type(effects._c()).__name__); "
            "effects.set_mempolicy(effects.MPOL_BIND, (0,)); print('POLICY', effects.get_mempolicy()); "
            "effects.set_mempolicy(effects.MPOL_PREFERRED, (0,)); print('POLICY', effects.get_mempolicy()); "
            "effects.disable_thp(); print('CTYPES', 'ctypes' in sys.modules); "
            "print('LIB', hasattr(binding._planner[1], 'sg_plan')); "
            "loc = [{'index': 3, 'minor': 3, 'uuid': 'GPU-3', 'cpus': (4, 5), 'mems': (1,)}]; "
            "b = binding.plan_task(loc, {'SLURM_STEP_GPUS': '0'}, mode='strict', local_task=0, "
            "ntasks=1, allowed=range(8), numa_map={1: 2}); "
            "print('PLAN', b.env_value(), b.host_mems); "
            "print('MODULES', sorted(m for m in sys.modules if 'planner' in m)); sys.stdout.flush()")
    out = _run(host, ["prefer", None, None, None], code)
    assert "BACKEND _PluginCalls" in out, out
    assert "POLICY (2, (0,))" in out and "POLICY (1, (0,))" in out
    assert "CTYPES False" in out
    assert "LIB True" in out, out
    assert "PLAN strict;gpus=3;cpus=4-5;mems=1 (2,)" in out, out
    assert "MODULES []" in out, out


def test_python_reads_the_plugstack_arguments_the_c_half_parsed(host):
    """One parse (issue 25 §5): the hook gets no argv, Python reads the outer
    half's struct (here embed_host.c's, for numa_bind=prefer,verbose)."""
    code = ("import slurm_gpu_spank_py as m; from slurm_gpu.spank.api import Spank; "
            "a = Spank(m.ffi, m.lib).plugstack_args(); "
            "print('ARGS', a.config, a.numa_bind.mode, a.numa_bind.verbose); import sys; sys.stdout.flush()")
    out = _run(host, [None, None, None, None], code)
    assert "ARGS /etc/slurm-gpu/embed.toml prefer True" in out, out
