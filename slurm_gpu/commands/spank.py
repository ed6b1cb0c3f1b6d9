"""``slurm-gpu spank build|install``: build the SPANK plugin on the node.

Slurm checks a plugin's version on major.minor, so the plugin is compiled
on each node against that node's ``slurm/spank.h`` and never shipped
prebuilt.  ``install`` copies it in place and writes the plugstack line.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import click

PLUGIN_FILE = "slurm_gpu_spank.so"         # outer half, named in plugstack.conf
INNER_FILE = "slurm_gpu_spank_py.so"       # inner half (Python), loaded from beside it
DEFAULT_PLUGIN_DIR = "/usr/lib/x86_64-linux-gnu/slurm-wlm"
DEFAULT_PLUGSTACK = "/etc/slurm/plugstack.conf.d/slurm-gpu.conf"


def default_output() -> Path:
    return Path(sys.prefix) / "lib" / "slurm-gpu" / PLUGIN_FILE


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


def build_plugin(output: Path, *, include_dir: str | None = None, verbose: bool = False) -> Path:
    """Compile the plugin with this venv's cffi and interpreter."""
    from ..errors import SlurmGpuError
    header = Path(include_dir or "/usr/include") / "slurm" / "spank.h"
    if not header.is_file():
        raise SlurmGpuError("slurm/spank.h not found: install libslurm-dev", str(header))
    mod = build_script()
    import tempfile
    with tempfile.TemporaryDirectory(prefix="slurm-gpu-spank-") as tmp:
        try:
            if verbose:
                return mod.build(output, include_dir=include_dir, tmpdir=tmp, verbose=True)
            # the compiler's chatter goes to a log shown only on failure
            log = Path(tmp) / "build.log"
            with open(log, "w") as f:
                saved = os.dup(1), os.dup(2)
                os.dup2(f.fileno(), 1)
                os.dup2(f.fileno(), 2)
                try:
                    return mod.build(output, include_dir=include_dir, tmpdir=tmp)
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
@click.option("--include-dir", default=None, help="Directory holding slurm/spank.h [/usr/include].")
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
@click.option("--plugin-dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path(DEFAULT_PLUGIN_DIR), show_default=True,
              help="Where the plugin is installed.")
@click.option("--plugstack", type=click.Path(dir_okay=False, path_type=Path),
              default=Path(DEFAULT_PLUGSTACK), show_default=True,
              help="plugstack.conf (or a file in plugstack.conf.d) to write our line to.")
def install(keyvals: tuple[str, ...], plugin: Path | None, plugin_dir: Path,
            plugstack: Path) -> None:
    """Install the plugin and write `required <so> KEY=VALUE...` to plugstack.

    Keys: config=PATH (slurm-gpu config file), numa_bind=strict|prefer|off
    (default for --gpu-numa-bind).  Unknown keys are an error.
    """
    from ..errors import SlurmGpuError
    dest = plugin_dir.resolve() / PLUGIN_FILE
    line = plugstack_line(dest, keyvals)     # check arguments before touching anything
    if plugin is not None and not (plugin.parent / INNER_FILE).is_file():
        raise SlurmGpuError(f"{INNER_FILE} missing beside the plugin", str(plugin.parent))
    plugin_dir.mkdir(parents=True, exist_ok=True)
    if plugin is None:
        build_plugin(dest)                   # renames both halves into place
    else:
        for name, src in ((INNER_FILE, plugin.parent / INNER_FILE), (PLUGIN_FILE, plugin)):
            tmp = plugin_dir.resolve() / f".{name}.tmp"
            shutil.copyfile(src, tmp)
            os.chmod(tmp, 0o755)
            os.replace(tmp, plugin_dir.resolve() / name)   # running steps keep their mapping
    write_plugstack(plugstack, line)
    click.echo(f"slurm-gpu: installed {dest}; {plugstack}: {line}")
