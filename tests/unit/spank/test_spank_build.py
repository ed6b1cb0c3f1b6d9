"""Building and installing the plugin: exported symbols, plugstack line."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_gpu.cli import main

pytestmark = pytest.mark.skipif(
    not Path("/usr/include/slurm/spank.h").exists() or not shutil.which("gcc"),
    reason="needs libslurm-dev and gcc")


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("spank") / "slurm_gpu_spank.so"
    assert main(["spank", "build", "-o", str(out)]) == 0
    return out


def _dynamic_symbols(so: Path) -> list[str]:
    res = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True,
                         text=True, check=True)
    return [line.split()[-1] for line in res.stdout.splitlines() if line.strip()]


def test_exports_only_spank_and_plugin_symbols(plugin):
    assert _dynamic_symbols(plugin.with_name("slurm_gpu_spank_py.so")) == [
        "sg_inner_hook", "sg_inner_option", "sg_inner_start"]
    syms = _dynamic_symbols(plugin)
    assert syms, "nm saw no symbols"
    assert all(re.match(r"^(slurm_spank_|plugin_|spank_plugin_version$)", s) for s in syms), syms
    assert {"plugin_name", "plugin_type", "plugin_version", "spank_plugin_version",
            "slurm_spank_init", "slurm_spank_init_post_opt", "slurm_spank_user_init",
            "slurm_spank_task_init_privileged", "slurm_spank_task_init"} == set(syms)
    # each job_prolog/job_epilog would cost an extra slurmstepd per job
    assert not any("prolog" in s or "epilog" in s or "slurmd_exit" in s for s in syms)


def _ldd(so: Path) -> str:
    return subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout


def test_only_the_inner_half_links_libpython(plugin):
    inner = plugin.with_name("slurm_gpu_spank_py.so")
    # slurmd and option-less steps load the outer half only: no libpython there
    assert "libpython" not in _ldd(plugin)
    assert "libpython3" in _ldd(inner)
    data = inner.read_bytes()
    assert sys.executable.encode() in data
    site = next(p for p in sys.path if p.endswith("site-packages") and sys.prefix in p)
    assert site.encode() in data          # sys.path pinned to this venv


def test_install_writes_plugstack_line(plugin, tmp_path):
    ps = tmp_path / "plugstack.conf"
    ps.write_text("optional /other/plugin.so\nrequired /old/slurm_gpu_spank.so\n")
    rc = main(["spank", "install", "--plugin", str(plugin), "--plugin-dir", str(tmp_path / "lib"),
               "--plugstack", str(ps), "config=/etc/slurm-gpu/slurm-gpu.toml", "numa_bind=prefer"])
    assert rc == 0
    so = tmp_path / "lib" / "slurm_gpu_spank.so"
    assert so.read_bytes() == plugin.read_bytes()
    inner = plugin.with_name("slurm_gpu_spank_py.so")
    assert (tmp_path / "lib" / inner.name).read_bytes() == inner.read_bytes()
    assert ps.read_text() == ("optional /other/plugin.so\n"
                              f"required {so} config=/etc/slurm-gpu/slurm-gpu.toml "
                              "numa_bind=prefer\n")


def test_install_writes_an_absolute_path_never_slurm_s_plugin_dir(plugin, tmp_path, monkeypatch):
    """plugstack.conf names the plugin by an absolute path: Slurm's PluginDir
    (Debian's multiarch slurm-wlm, EL's /usr/lib64/slurm, a prefix) never matters."""
    monkeypatch.chdir(tmp_path)
    ps = tmp_path / "plugstack.conf"
    assert main(["spank", "install", "--plugin", str(plugin), "--plugin-dir", "lib",
                 "--plugstack", str(ps)]) == 0
    assert ps.read_text() == f"required {tmp_path.resolve()}/lib/slurm_gpu_spank.so\n"


@pytest.mark.parametrize("arg", ["bogus=1", "numa_bind=always", "config=relative.toml"])
def test_install_rejects_bad_arguments_and_writes_nothing(plugin, tmp_path, capsys, arg):
    ps = tmp_path / "plugstack.conf"
    rc = main(["spank", "install", "--plugin", str(plugin), "--plugin-dir", str(tmp_path / "lib"),
               "--plugstack", str(ps), arg])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("slurm-gpu: ")
    assert not ps.exists() and not (tmp_path / "lib").exists()


def test_build_without_header_is_one_line(tmp_path, capsys):
    rc = main(["spank", "build", "-o", str(tmp_path / "x.so"), "--include-dir", str(tmp_path)])
    assert rc == 1
    assert capsys.readouterr().err.startswith("slurm-gpu: slurm/spank.h not found")


def _package_layout(tmp_path: Path, monkeypatch) -> Path:
    """/opt/slurm-gpu as the packages make it: venv -> venv-STAMP, running from the tree."""
    tree = tmp_path / "venv-20260101T000000.1-1"
    tree.mkdir()
    (tmp_path / "venv").symlink_to(tree.name)
    monkeypatch.setattr(sys, "prefix", str(tree))
    return tree


def test_install_names_the_venv_link_not_a_tree_an_upgrade_removes(plugin, tmp_path, monkeypatch):
    tree = _package_layout(tmp_path, monkeypatch)
    ps = tmp_path / "plugstack.conf"
    rc = main(["spank", "install", "--plugin", str(plugin), "--plugstack", str(ps), "numa_bind=prefer"])
    assert rc == 0
    assert (tree / "lib" / "slurm-gpu" / "slurm_gpu_spank.so").read_bytes() == plugin.read_bytes()
    assert (tree / "lib" / "slurm-gpu" / "slurm_gpu_spank_py.so").is_file()
    assert ps.read_text() == f"required {tmp_path}/venv/lib/slurm-gpu/slurm_gpu_spank.so numa_bind=prefer\n"


def test_venv_link_only_when_it_names_this_tree(tmp_path):
    from slurm_gpu.paths import venv_link
    (tmp_path / "venv-A").mkdir()
    (tmp_path / "venv-B").mkdir()
    assert venv_link(str(tmp_path / "venv-A")) == str(tmp_path / "venv-A")      # no link: the tree
    (tmp_path / "venv").symlink_to("venv-B")
    assert venv_link(str(tmp_path / "venv-A")) == str(tmp_path / "venv-A")      # names another tree
    assert venv_link(str(tmp_path / "venv-B")) == str(tmp_path / "venv")


@pytest.mark.parametrize("include,where", [
    ("", "plugstack.conf"),                                           # EL: no include
    ("include {d}/plugstack.conf.d/*.conf\n", "plugstack.conf.d/slurm-gpu.conf"),   # Debian's
    ("include plugstack.conf.d/*\n", "plugstack.conf.d/slurm-gpu.conf"),
    ("include /elsewhere/*.conf\n", "plugstack.conf"),
])
def test_install_writes_where_slurm_reads(plugin, tmp_path, monkeypatch, include, where):
    _package_layout(tmp_path, monkeypatch)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text(f"ClusterName=c\nPlugStackConfig={etc}/plugstack.conf\n")
    (etc / "plugstack.conf").write_text(include.format(d=etc) + "optional /x/other.so\n")
    monkeypatch.setenv("SLURM_CONF", str(etc / "slurm.conf"))
    assert main(["spank", "install", "--plugin", str(plugin)]) == 0
    written = (etc / where).read_text().splitlines()
    assert written[-1] == f"required {tmp_path}/venv/lib/slurm-gpu/slurm_gpu_spank.so"
    if where == "plugstack.conf":
        assert written[:-1] == [l for l in (include.format(d=etc) + "optional /x/other.so").splitlines()]
        assert not (etc / "plugstack.conf.d").exists()


def test_inner_half_records_its_interpreter_and_version(plugin):
    from slurm_gpu import __version__, doctor
    assert doctor.plugin_runs(str(plugin)) == (sys.executable, __version__)


def test_install_replaces_our_line_where_it_already_is(plugin, tmp_path, monkeypatch):
    _package_layout(tmp_path, monkeypatch)
    etc = tmp_path / "etc"
    (etc / "plugstack.conf.d").mkdir(parents=True)
    (etc / "slurm.conf").write_text(f"PlugStackConfig={etc}/plugstack.conf\n")
    # the admin wrote the line into plugstack.conf by hand, beside Debian's include
    (etc / "plugstack.conf").write_text(f"include {etc}/plugstack.conf.d/*.conf\n"
                                        "required /opt/slurm-gpu/venv-OLD/lib/slurm-gpu/slurm_gpu_spank.so\n")
    monkeypatch.setenv("SLURM_CONF", str(etc / "slurm.conf"))
    assert main(["spank", "install", "--plugin", str(plugin), "numa_bind=off"]) == 0
    assert (etc / "plugstack.conf").read_text() == (
        f"include {etc}/plugstack.conf.d/*.conf\n"
        f"required {tmp_path}/venv/lib/slurm-gpu/slurm_gpu_spank.so numa_bind=off\n")
    assert not list((etc / "plugstack.conf.d").iterdir())
