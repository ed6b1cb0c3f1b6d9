"""Where the project's non-Python files live, in a source tree or installed.

In a checkout they sit beside the package (``templates/``, ``prolog.d/``...);
after ``pip install .`` setup.cfg's data_files puts them under
``<prefix>/share/slurm-gpu/``.
"""
from __future__ import annotations

import os
import sys
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

_PACKAGE_DIR = os.path.dirname(os.path.realpath(__file__))


def __getattr__(name: str) -> Any:
    # PACKAGE_DIR and SOURCE_ROOT are Paths made on first use: pathlib (with
    # urllib.parse and ipaddress, ~2.5 ms) is no part of a health-check run,
    # which reads its catalogs through data_path.
    if name in ("PACKAGE_DIR", "SOURCE_ROOT"):
        from pathlib import Path
        pkg = Path(_PACKAGE_DIR)
        return pkg if name == "PACKAGE_DIR" else pkg.parent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@lru_cache(maxsize=None)
def resource_dir(name: str) -> Path:
    """The directory *name* (``templates``, ``prolog.d``, ``spank``...)."""
    from pathlib import Path
    for base in (Path(_PACKAGE_DIR).parent, Path(sys.prefix) / "share" / "slurm-gpu"):
        cand = base / name
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"slurm-gpu resource directory {name!r} not found")


def data_file(name: str) -> Path:
    """A data file shipped inside the package (``slurm_gpu/data/``)."""
    from pathlib import Path
    return Path(data_path(name))


def data_path(name: str) -> str:
    """:func:`data_file` as a string."""
    return os.path.join(_PACKAGE_DIR, "data", name)


def venv_link(prefix: str | None = None) -> str:
    """The name of the venv *prefix* (default: this one) that survives upgrades.

    The packages make ``/opt/slurm-gpu/venv`` a link to a versioned tree
    (``venv-STAMP``) and swap it on every upgrade, removing trees two
    upgrades old: a path inside the tree (``sys.prefix``) goes stale, the link
    does not.  Returns the link when it sits beside *prefix* and names it,
    else *prefix* itself (a plain venv, as ``make install`` makes).
    """
    prefix = prefix or sys.prefix
    link = os.path.join(os.path.dirname(prefix.rstrip("/")), "venv")
    try:
        if os.path.islink(link) and os.path.realpath(link) == os.path.realpath(prefix):
            return link
    except OSError:
        pass
    return prefix
