"""Where the project's non-Python files live, in a source tree or installed.

In a checkout they sit beside the package (``templates/``, ``prolog.d/``...);
after ``pip install .`` setup.cfg's data_files puts them under
``<prefix>/share/slurm-gpu/``.
"""
from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = PACKAGE_DIR.parent


@lru_cache(maxsize=None)
def resource_dir(name: str) -> Path:
    """The directory *name* (``templates``, ``prolog.d``, ``spank``...)."""
    for base in (SOURCE_ROOT, Path(sys.prefix) / "share" / "slurm-gpu"):
        cand = base / name
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"slurm-gpu resource directory {name!r} not found")


def data_file(name: str) -> Path:
    """A data file shipped inside the package (``slurm_gpu/data/``)."""
    return PACKAGE_DIR / "data" / name
