"""``slurm-gpu spank build|install``: build the SPANK plugin on the node.

Slurm checks a plugin's version on major.minor, so the plugin is compiled
on each node against that node's ``slurm/spank.h`` and never shipped
prebuilt.  ``install`` builds it into the venv and writes the plugstack line
naming it through the venv link, which every upgrade moves to the new tree
(docs/install.md); a copy elsewhere (``--plugin-dir``) is the admin's to
rebuild after each upgrade, and ``doctor`` checks it.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import click

PLUGIN_FILE = "slurm_gpu_spank.so"         # outer half, named in plugstack.conf
INNER_FILE = "slurm_gpu_spank_py.so"       # inner half (Python), loaded from beside it
DROPIN = "plugstack.conf.d/slurm-gpu.conf"   # beside plugstack.conf, when it includes that


def default_output() -> Path:
    return Path(sys.prefix) / "lib" / "slurm-gpu" / PLUGIN_FILE


def linked_output() -> Path:
    """:func:`default_output` through the venv link: the name plugstack.conf gets."""
    from ..paths import venv_link
    return Path(venv_link()) / "lib" / "slurm-gpu" / PLUGIN_FILE


def plugstack_conf(slurm_conf: str | None = None) -> Path:
    """The plugstack.conf Slurm reads: slurm.conf's PlugStackConfig, else beside slurm.conf."""
    from ..slurmclient import conf_path, read_conf
    conf = Path(conf_path(slurm_conf))
    keys = read_conf(str(conf)) or {}
    return Path(keys.get("plugstackconfig") or conf.parent / "plugstack.conf")


def plugstack_target(plugstack: Path) -> Path:
    """Where our line goes: the file that has it already (one line, never two);
    else the drop-in when *plugstack* includes it (Debian's plugstack.conf
    includes ``plugstack.conf.d/*.conf``), else *plugstack* itself (EL ships
    no such include, and a drop-in nobody includes would leave the options
    silently missing)."""
    import fnmatch

    from ..doctor import plugstack_lines
    for src, line in plugstack_lines(plugstack):
        words = line.split()
        if len(words) >= 2 and words[1].endswith(PLUGIN_FILE):
            return Path(src)
    dropin = plugstack.parent / DROPIN
    try:
        text = plugstack.read_text()
    except OSError:
        return plugstack
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if len(words) == 2 and words[0] == "include":
            pattern = words[1] if words[1].startswith("/") else str(plugstack.parent / words[1])
            if fnmatch.fnmatchcase(str(dropin), pattern):
                return dropin
    return plugstack


def build_script():  # -> the spank/build_plugin.py module
    """Load ``spank/build_plugin.py`` (checkout or installed copy), writing no bytecode."""
    import importlib.util

    from ..paths import resource_dir
    script = resource_dir("spank") / "build_plugin.py"
    spec = importlib.util.spec_from_file_location("_slurm_gpu_build_plugin", script)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    # no __pycache__ beside the build script (setup.cfg ships spank/* as data)
    saved_flag, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = saved_flag
    return mod


def build_plugin(output: Path, *, include_dir: str | None = None, verbose: bool = False,
                 python: str | None = None) -> Path:
    """Compile the plugin with this venv's cffi; it starts *python* [this interpreter]."""
    from .. import exechelper
    from ..errors import SlurmGpuError
    exechelper.build()      # the runner's pre-exec helper: the same compiler, no Slurm header
    from ..slurminstall import DEV_PACKAGES, include_dir as installed_include
    if include_dir is None and not Path("/usr/include/slurm/spank.h").is_file():
        include_dir = installed_include()      # the installed Slurm's, e.g. /usr/local/include
    header = Path(include_dir or "/usr/include") / "slurm" / "spank.h"
    if not header.is_file():
        raise SlurmGpuError(f"slurm/spank.h not found: install {DEV_PACKAGES}", str(header))
    mod = build_script()
    import tempfile
    with tempfile.TemporaryDirectory(prefix="slurm-gpu-spank-") as tmp:
        try:
            if verbose:
                return mod.build(output, include_dir=include_dir, tmpdir=tmp, verbose=True, python=python)
            # the compiler's chatter goes to a log shown only on failure
            log = Path(tmp) / "build.log"
            with open(log, "w") as f:
                saved = os.dup(1), os.dup(2)
                os.dup2(f.fileno(), 1)
                os.dup2(f.fileno(), 2)
                try:
                    return mod.build(output, include_dir=include_dir, tmpdir=tmp, python=python)
                finally:
                    os.dup2(saved[0], 1)
                    os.dup2(saved[1], 2)
                    os.close(saved[0])
                    os.close(saved[1])
        except Exception as e:  # noqa: BLE001 - cffi/distutils raise many kinds
            detail = ""
            log = Path(tmp) / "build.log"
            if log.exists():
                errs = [l for l in log.read_text().splitlines() if "error" in l.lower()]
                detail = f": {errs[0].strip()}" if errs else ""
            if not detail and str(e).strip():
                # e.g. cffi on Python >= 3.12 without setuptools says so only here
                detail = f": {str(e).strip().splitlines()[0]}"
            raise SlurmGpuError(f"plugin build failed: {type(e).__name__}{detail}",
                                str(output)) from None


def plugstack_line(plugin: Path, keyvals: tuple[str, ...]) -> str:
    """``required <so> key=value...``, after checking every key and value."""
    from .. import errors
    from .. import joboptions as options
    try:
        options.parse_plugstack_args(list(keyvals))
    except errors.UsageError as e:
        raise errors.UsageError(e.what, "slurm-gpu spank install") from None
    return " ".join(["required", str(plugin), *keyvals])


def write_plugstack(path: Path, line: str) -> None:
    """Replace our line in *path* (or add it), keeping everything else."""
    from ..fsutil import atomic_write
    keep: list[str] = []
    if path.exists():
        keep = [l for l in path.read_text().splitlines() if PLUGIN_FILE not in l]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, "\n".join(keep + [line]) + "\n", mode=0o644)


@click.group()
def spank() -> None:
    """Build and install the SPANK plugin."""


@spank.command()
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help=f"Where to write the plugin [{default_output()}].")
@click.option("--include-dir", default=None,
              help="Directory holding slurm/spank.h [/usr/include, else the installed Slurm's].")
@click.option("-v", "--verbose", is_flag=True, help="Show the compiler's output.")
def build(output: Path | None, include_dir: str | None, verbose: bool) -> None:
    """Compile the plugin against this node's slurm/spank.h.

    Writes two files: OUTPUT (the plugin plugstack.conf names) and
    slurm_gpu_spank_py.so beside it (the Python half it loads when needed).
    """
    out = build_plugin(output or default_output(), include_dir=include_dir, verbose=verbose)
    click.echo(str(out))


@spank.command()
@click.argument("keyvals", nargs=-1)
@click.option("--plugin", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="An already built plugin (default: build one now).")
@click.option("--plugin-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Put a copy of the plugin here instead (rebuild it after every upgrade) "
                   "[the venv, named through its link].")
@click.option("--plugstack", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File to write our line to [plugstack.conf.d/slurm-gpu.conf when slurm.conf's "
                   "plugstack.conf includes it, else that plugstack.conf].")
def install(keyvals: tuple[str, ...], plugin: Path | None, plugin_dir: Path | None,
            plugstack: Path | None) -> None:
    """Install the plugin and write `required <so> KEY=VALUE...` to plugstack.

    By default the plugin is built into this venv and the line names it
    through the venv link (/opt/slurm-gpu/venv/lib/slurm-gpu/...), which each
    upgrade moves to a tree with a freshly built plugin.  Keys:
    config=PATH (slurm-gpu config file), numa_bind=strict|prefer|off
    (default for --gpu-numa-bind).  Unknown keys are an error.
    """
    from ..errors import SlurmGpuError
    from ..paths import venv_link
    if plugin_dir is None:
        dest, named = default_output(), linked_output()
    else:
        dest = named = plugin_dir.resolve() / PLUGIN_FILE
    line = plugstack_line(named, keyvals)    # check arguments before touching anything
    if plugin is not None and not (plugin.parent / INNER_FILE).is_file():
        raise SlurmGpuError(f"{INNER_FILE} missing beside the plugin", str(plugin.parent))
    target = plugstack or plugstack_target(plugstack_conf())
    dest.parent.mkdir(parents=True, exist_ok=True)
    if plugin is None:
        # a copy starts Python through the link, so an upgrade's removal of
        # the tree that built it does not strand it (doctor compares versions)
        python = None if plugin_dir is None else str(Path(venv_link()) / "bin" / "python")
        build_plugin(dest, python=python)    # renames both halves into place
    elif plugin.resolve() != dest.resolve():
        for name, src in ((INNER_FILE, plugin.parent / INNER_FILE), (PLUGIN_FILE, plugin)):
            tmp = dest.parent / f".{name}.tmp"
            shutil.copyfile(src, tmp)
            os.chmod(tmp, 0o755)
            os.replace(tmp, dest.parent / name)   # running steps keep their mapping
    write_plugstack(target, line)
    click.echo(f"slurm-gpu: installed {dest}; {target}: {line}")
    if plugin_dir is not None:
        click.echo(f"slurm-gpu: {dest} is a copy: run this again after every slurm-gpu or Slurm "
                   "upgrade (slurm-gpu doctor says when)")
